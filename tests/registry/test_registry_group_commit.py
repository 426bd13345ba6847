"""The registry's write path within one process: the write queue and the group commit.

Several changes queued while another writer is in a transaction are run by the next leader in one transaction,
each in its own savepoint. These tests take the writer's place themselves to make a group deterministically: they
leave it only once the changes they started are queued (a condition they wait on, never a sleep).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from supervisor._registry import PromoteRequest, _PendingWrite, hash_token

from supervisor import JobNotFound, JobStatus, RegistryError, SqliteRegistry
from supervisor.domain import Job

WAIT_S = 30.0  # a backstop for a broken test, never a timing assertion


class _WatchedQueue(list[_PendingWrite]):
    """The registry's queue of pending changes, telling the test each time a change is queued."""

    def __init__(self) -> None:
        super().__init__()
        self.cond = threading.Condition()

    def append(self, item: _PendingWrite) -> None:
        with self.cond:
            super().append(item)
            self.cond.notify_all()

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self) >= n, timeout=WAIT_S), f"{n} changes never queued"


class _Call:
    """One registry call in its own thread; ``result`` or ``error`` once joined."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,))
        self.thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "a registry call never returned"


class _Held:
    """The registry's write lock taken by the test, and its queue of pending changes watched."""

    def __init__(self, registry: SqliteRegistry) -> None:
        self.registry = registry
        self.queue = _WatchedQueue()

    def hold(self) -> None:
        self.registry._writes.pending = self.queue
        assert self.registry._writes.lock.acquire(timeout=WAIT_S)

    def wait_for(self, n: int) -> None:
        self.queue.wait_for(n)

    def release(self) -> None:
        """Let go of the lock and lead, as every writer does: every queued change, in order, in one transaction."""
        self.registry._writes.lock.release()
        self.registry._lead()


@pytest.fixture
def held(registry: SqliteRegistry) -> Iterator[_Held]:
    h = _Held(registry)
    yield h
    if registry._writes.lock.locked():
        registry._writes.lock.release()


def _running(reg: SqliteRegistry, n: int) -> list[Job]:
    for i in range(n):
        reg.enqueue("k", {"i": i}, ["true"])
    return reg.promote_queued(n, boot_id="b", token_hashes=[hash_token(f"t{i}") for i in range(n)])


def _committed_status(path: Path, job_id: str) -> str:
    """The row as another connection sees it: only what is committed (WAL)."""
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("SELECT status FROM jobs WHERE job_id = ?", (job_id,)).fetchone()[0])
    finally:
        conn.close()


def _events(path: Path, job_id: str) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT body FROM outbox WHERE job_id = ? ORDER BY seq", (job_id,))]
    finally:
        conn.close()


def test_two_finalizes_share_one_transaction_and_one_failing_does_not_fail_the_other(
    registry: SqliteRegistry, held: _Held
) -> None:
    ok, bad = _running(registry, 2)
    events_before = len(_events(registry.path, bad.job_id))
    seen_while_deciding: dict[str, str] = {}
    held.hold()

    def decide_ok(job: Job) -> tuple[JobStatus, str | None]:
        return JobStatus.SUCCEEDED, None

    def decide_bad(job: Job) -> tuple[JobStatus, str | None]:
        # Runs after the first finalize in the same transaction: that change is made but not yet committed.
        seen_while_deciding[ok.job_id] = _committed_status(registry.path, ok.job_id)
        raise ValueError("this job's own defect")

    first = _Call(lambda: registry.finalize(ok.job_id, decide_ok, exit_code=0))
    held.wait_for(1)
    second = _Call(lambda: registry.finalize(bad.job_id, decide_bad, exit_code=0))
    held.wait_for(2)
    held.release()
    first.join()
    second.join()

    assert seen_while_deciding == {ok.job_id: "running"}  # one transaction: nothing committed before the group
    assert first.error is None and first.result.changed and first.result.job.status is JobStatus.SUCCEEDED
    assert isinstance(second.error, ValueError) and str(second.error) == "this job's own defect"
    assert registry.get(ok.job_id).status is JobStatus.SUCCEEDED
    assert registry.get(bad.job_id).status is JobStatus.RUNNING  # rolled back to its savepoint only
    # Each change's outbox event commits with it: the failed one left none.
    assert '"previous_status":"running"' in _events(registry.path, ok.job_id)[-1]
    assert len(_events(registry.path, bad.job_id)) == events_before


def test_a_not_found_in_a_group_reaches_its_caller_only(registry: SqliteRegistry, held: _Held) -> None:
    [job] = _running(registry, 1)
    held.hold()
    missing = _Call(lambda: registry.finalize("no-such-job", JobStatus.SUCCEEDED))
    held.wait_for(1)
    present = _Call(lambda: registry.finalize(job.job_id, JobStatus.FAILED, reason="exit_code_3", exit_code=3))
    held.wait_for(2)
    held.release()
    missing.join()
    present.join()
    assert isinstance(missing.error, JobNotFound)
    assert present.error is None
    row = registry.get(job.job_id)
    assert (row.status, row.error_reason, row.exit_code) == (JobStatus.FAILED, "exit_code_3", 3)


def test_a_promotion_grouped_after_a_finalize_counts_the_freed_slot_and_never_overshoots_INV_PROMOTION_NEVER_OVERSHOOTS(
    registry: SqliteRegistry, held: _Held
) -> None:
    [job] = _running(registry, 1)
    waiting = [registry.enqueue("k", {"w": i}, ["true"]).job.job_id for i in range(3)]
    held.hold()

    def promote() -> list[Job]:
        return registry.promote_queued(1, boot_id="b", token_hashes=[hash_token("x"), hash_token("y")])

    early = _Call(promote)  # queued before the finalize: the slot is still taken
    held.wait_for(1)
    finish = _Call(lambda: registry.finalize(job.job_id, JobStatus.SUCCEEDED))
    held.wait_for(2)
    late = _Call(promote)  # queued after it: one slot free, one row promoted
    held.wait_for(3)
    held.release()
    for call in (early, finish, late):
        call.join()
        assert call.error is None
    assert early.result == []
    assert [j.job_id for j in late.result] == waiting[:1]
    assert registry.counts()["running"] == 1


def test_a_failed_commit_fails_every_change_of_the_group(
    registry: SqliteRegistry, held: _Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No caller is told its change is durable unless the transaction holding it committed."""
    a, b = _running(registry, 2)

    def broken_locked_tx() -> Any:
        raise RegistryError("registry commit failed: disk I/O error")

    monkeypatch.setattr(registry, "_locked_tx", broken_locked_tx)
    held.hold()
    first = _Call(lambda: registry.finalize(a.job_id, JobStatus.SUCCEEDED))
    held.wait_for(1)
    second = _Call(lambda: registry.finalize(b.job_id, JobStatus.SUCCEEDED))
    held.wait_for(2)
    held.release()
    first.join()
    second.join()
    monkeypatch.undo()
    assert isinstance(first.error, RegistryError) and isinstance(second.error, RegistryError)
    assert first.error is not second.error  # each raised in its own thread
    assert {registry.get(a.job_id).status, registry.get(b.job_id).status} == {JobStatus.RUNNING}


def test_concurrent_writers_from_many_threads_all_commit(tmp_path: Path) -> None:
    """Writers of one process queue on its write lock (two handles on one file share it): every change commits."""
    path = tmp_path / "jobs.sqlite3"
    handles = [SqliteRegistry(path), SqliteRegistry(path)]
    start = threading.Barrier(16)

    def writer(reg: SqliteRegistry, n: int) -> list[str]:
        start.wait(WAIT_S)
        ids = []
        for i in range(n):
            job = reg.enqueue("k", {"w": i}, ["true"]).job
            ids.append(job.job_id)
            if i % 5 == 0:
                reg.request_cancel(job.job_id)
        return ids

    try:
        calls = [_Call(lambda reg=handles[i % 2]: writer(reg, 25)) for i in range(16)]
        for call in calls:
            call.join()
        assert [c.error for c in calls] == [None] * 16
        ids = [job_id for c in calls for job_id in c.result]
        assert len(set(ids)) == 16 * 25
        counts = handles[0].counts()
        assert (counts["queued"], counts["cancelled"]) == (16 * 20, 16 * 5)
    finally:
        for reg in handles:
            reg.close()


def test_finalize_then_promote_fills_the_freed_slot_in_one_transaction_INV_PROMOTION_NEVER_OVERSHOOTS(
    registry: SqliteRegistry,
) -> None:
    a, b = _running(registry, 2)
    waiting = [registry.enqueue("k", {"q": i}, ["true"]).job.job_id for i in range(3)]
    request = PromoteRequest(2, "b", [hash_token("x"), hash_token("y")])
    result, promoted = registry.finalize_then_promote(a.job_id, JobStatus.SUCCEEDED, exit_code=0, promote=request)
    assert result.changed and result.job.status is JobStatus.SUCCEEDED
    assert promoted is not None and [j.job_id for j in promoted] == waiting[:1]  # one slot freed, one promoted
    assert registry.counts()["running"] == 2
    # Paused (no request): the finalize alone.
    result, promoted = registry.finalize_then_promote(b.job_id, JobStatus.SUCCEEDED, exit_code=0, promote=None)
    assert result.changed and promoted == []
    assert registry.counts()["running"] == 1


def test_a_failed_promotion_in_a_finalize_leaves_the_finalize_standing(
    registry: SqliteRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    [job] = _running(registry, 1)
    queued = registry.enqueue("k", {"q": 1}, ["true"]).job.job_id

    def broken(*args: object) -> list[Job]:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(registry, "_promote_in", broken)
    request = PromoteRequest(1, "b", [hash_token("x")])
    result, promoted = registry.finalize_then_promote(job.job_id, JobStatus.FAILED, exit_code=3, promote=request)
    assert result.changed and promoted is None
    assert registry.get(job.job_id).status is JobStatus.FAILED
    assert registry.get(queued).status is JobStatus.QUEUED


def test_a_writer_that_never_gets_its_turn_gives_up_and_writes_nothing(
    registry: SqliteRegistry, held: _Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded like SQLite's busy timeout: the change is taken back out of the queue, so no later leader runs it."""
    [job] = _running(registry, 1)
    monkeypatch.setattr("supervisor._registry.BUSY_TIMEOUT_MS", 20)
    held.hold()
    with pytest.raises(RegistryError, match="not acquired"):
        registry.finalize(job.job_id, JobStatus.SUCCEEDED)
    assert list(held.queue) == []
    held.release()
    assert registry.get(job.job_id).status is JobStatus.RUNNING


def test_changes_of_two_handles_on_one_file_share_a_group(tmp_path: Path) -> None:
    """Handles on the same file share this process's write queue: one leader commits both handles' changes."""
    path = tmp_path / "jobs.sqlite3"
    one, two = SqliteRegistry(path), SqliteRegistry(path)
    try:
        assert one._writes is two._writes
        h = _Held(one)
        h.hold()
        first = _Call(lambda: one.enqueue("k", {"a": 1}, ["true"]))
        h.wait_for(1)
        second = _Call(lambda: two.enqueue("k", {"b": 2}, ["true"]))
        h.wait_for(2)
        h.release()
        first.join()
        second.join()
        assert first.error is None and second.error is None
        assert one.counts()["queued"] == 2
    finally:
        one.close()
        two.close()
