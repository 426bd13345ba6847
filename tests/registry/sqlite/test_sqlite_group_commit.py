"""The SQLite registry's write path in one process: group commit and shared thread hops.

``SqliteFile.write_group`` runs the changes queued together in one transaction, each in its own savepoint: an
error rolls back its own change only and reaches its own caller only; a failed COMMIT fails every change of the
group. ``SqliteRegistry`` hands the changes its tasks queue while a hop is in flight to the store together in the
next hop, and each caller still gets exactly its own result or error.

A spy on the store's ``write_group`` counts the hops and holds the first until the test has queued the rest behind
it, so a shared hop is made deterministically (an event, never a sleep).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from registry_helpers import new_job, request

from supervisor.domain import JobNotFound, JobStatus, RegistryError
from supervisor.registry import (
    Ending,
    IdentityClaim,
    IdentityRecord,
    Outcome,
    SqliteRegistry,
)
from supervisor.registry.sqlite import SqliteFile, StandAlone

WAIT_S = 30.0  # a backstop for a broken test, never a timing assertion
SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)


# -- the store: one transaction, a savepoint per change ----------------------------------------------------


@pytest.fixture
def store(path: Path) -> Iterator[SqliteFile]:
    store = SqliteFile(path, max_connections=1)
    store.write(lambda conn: conn.execute("CREATE TABLE probe (name TEXT PRIMARY KEY)"))
    yield store
    store.close()


def _committed(path: Path) -> list[str]:
    """The probe's rows as another connection sees them: only what is committed (WAL)."""
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM probe ORDER BY name")]
    finally:
        conn.close()


def _insert(name: str) -> Callable[[sqlite3.Connection], str]:
    def change(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO probe (name) VALUES (?)", (name,))
        return f"inserted {name}"

    return change


def test_a_group_is_one_transaction_and_an_error_rolls_back_its_own_change_only(path: Path, store: SqliteFile) -> None:
    seen_while_in_the_group: list[list[str]] = []

    def fails(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO probe (name) VALUES ('b')")
        seen_while_in_the_group.append(_committed(path))  # the change before it is made but not yet committed
        raise ValueError("this change's own defect")

    outcomes = store.write_group([_insert("a"), fails, _insert("a"), _insert("c")])
    assert seen_while_in_the_group == [[]]
    (a, a_error), (_, fails_error), (_, duplicate_error), (c, c_error) = outcomes
    assert (a, a_error, c, c_error) == ("inserted a", None, "inserted c", None)
    assert isinstance(fails_error, ValueError) and str(fails_error) == "this change's own defect"
    # A storage error (here a constraint) is the registry's kind of error, for its caller only.
    assert isinstance(duplicate_error, RegistryError) and isinstance(duplicate_error.__cause__, sqlite3.IntegrityError)
    assert _committed(path) == ["a", "c"]


def test_write_raises_its_own_changes_error(store: SqliteFile) -> None:
    assert store.write(_insert("a")) == "inserted a"
    with pytest.raises(RegistryError, match="UNIQUE"):
        store.write(_insert("a"))
    assert store.write(_insert("b")) == "inserted b"


def test_a_failed_commit_fails_every_change_of_the_group(path: Path, store: SqliteFile) -> None:
    """No caller is told its change is durable unless the transaction holding it committed. (A deferred foreign key
    makes the COMMIT itself fail: the changes all went well.)"""
    store.write(
        lambda conn: conn.execute(
            "CREATE TABLE child (parent TEXT REFERENCES probe (name) DEFERRABLE INITIALLY DEFERRED)"
        )
    )
    store.read("PRAGMA foreign_keys = ON")  # on the pool's one connection

    def orphan(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO child (parent) VALUES ('nobody')")  # checked only at COMMIT
        return "inserted an orphan"

    outcomes = store.write_group([_insert("x"), orphan])
    errors = [error for _, error in outcomes]
    assert all(isinstance(e, RegistryError) and "commit failed" in str(e) for e in errors)
    assert errors[0] is not errors[1]  # each raised in its own caller's thread
    assert _committed(path) == []
    assert store.write(_insert("y")) == "inserted y"  # the store goes on (on a new connection)
    assert _committed(path) == ["y"]


def test_a_change_whose_writes_stand_alone_gets_no_savepoint_and_the_others_keep_theirs(
    path: Path, store: SqliteFile
) -> None:
    """A heartbeat's step (``_registry.Independent``) needs no savepoint: two statements of its four. Its error still
    reaches its own caller only, and what it wrote before failing stays: its writes each stand alone."""
    statements: list[str] = []

    def traced(conn: sqlite3.Connection) -> str:
        conn.set_trace_callback(statements.append)
        return _insert("a")(conn)

    def fails_after_one_write(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO probe (name) VALUES ('b')")
        raise ValueError("refused after one write")

    def untraced(conn: sqlite3.Connection) -> None:
        conn.set_trace_callback(None)

    outcomes = store.write_group([StandAlone(traced), StandAlone(fails_after_one_write), _insert("c")])
    store.write(untraced)  # the pool's one connection
    assert [error is None for _, error in outcomes] == [True, False, True]
    assert isinstance(outcomes[1][1], ValueError)
    assert _committed(path) == ["a", "b", "c"]
    group = statements[: statements.index("COMMIT") + 1]  # (the trace goes on into the next write's first steps)
    assert [s.split(" ")[0] for s in group] == ["INSERT", "INSERT", "SAVEPOINT", "INSERT", "RELEASE", "COMMIT"]


# -- the registry: changes queued behind a hop share the next one --------------------------------------------


class HeldHops:
    """Counts the store's ``write_group`` calls (the hops) and their sizes; the first one waits until ``release``."""

    def __init__(self, registry: SqliteRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        self.first_entered = threading.Event()
        self.release = threading.Event()
        original = registry.file.write_group

        def write_group(changes: Any) -> Any:
            self.sizes.append(len(changes))
            if len(self.sizes) == 1:
                self.first_entered.set()
                assert self.release.wait(WAIT_S), "the test never released the first hop"
            return original(changes)

        monkeypatch.setattr(registry.file, "write_group", write_group)

    async def first_in_flight(self) -> None:
        assert await trio.to_thread.run_sync(self.first_entered.wait, WAIT_S)


async def _collect(outcomes: dict[str, Any], name: str, call: Callable[[], Awaitable[Any]]) -> None:
    try:
        outcomes[name] = await call()
    except Exception as exc:
        outcomes[name] = exc


async def test_changes_queued_behind_a_hop_share_the_next_and_each_gets_its_own_result(
    sqlite_registry: SqliteRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = HeldHops(sqlite_registry, monkeypatch)
    results: dict[str, Any] = {}
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_collect, results, "0", lambda: sqlite_registry.enqueue(new_job(0)))
            await hops.first_in_flight()
            for n in range(1, 20):
                nursery.start_soon(_collect, results, str(n), lambda n=n: sqlite_registry.enqueue(new_job(n)))
            await trio.testing.wait_all_tasks_blocked()
            hops.release.set()
    assert hops.sizes == [1, 19]  # 20 writes, 2 hops
    assert [results[str(n)].job.params["n"] for n in range(20)] == list(range(20))
    assert len({r.job.job_id for r in results.values()}) == 20
    assert (await sqlite_registry.counts())["queued"] == 20


async def test_an_error_in_a_shared_hop_reaches_only_the_caller_whose_change_earned_it(
    sqlite_registry: SqliteRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    await sqlite_registry.enqueue(new_job(0))
    [running] = (await sqlite_registry.promote(request(2, "t"))).jobs
    hops = HeldHops(sqlite_registry, monkeypatch)
    outcomes: dict[str, Any] = {}
    identity = IdentityRecord("process", {"pid": 4242})
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_collect, outcomes, "first", lambda: sqlite_registry.enqueue(new_job(1)))
            await hops.first_in_flight()
            calls: dict[str, Callable[[], Awaitable[Any]]] = {
                "identity": lambda: sqlite_registry.record_identities([IdentityClaim(running.job_id, identity)]),
                "unknown": lambda: sqlite_registry.finalize("no-such-job", SUCCEEDED),
                "second": lambda: sqlite_registry.enqueue(new_job(2)),
            }
            for name, call in calls.items():
                nursery.start_soon(_collect, outcomes, name, call)
                await trio.testing.wait_all_tasks_blocked()  # queued in this order
            hops.release.set()
    assert hops.sizes == [1, 3]
    assert isinstance(outcomes["unknown"], JobNotFound)
    [recorded] = outcomes["identity"]
    assert (recorded.job_id, recorded.identity) == (running.job_id, identity)
    assert outcomes["first"].job.params == {"n": 1} and outcomes["second"].job.params == {"n": 2}
    assert (await sqlite_registry.counts())["queued"] == 2  # the failed finalize's promotion went with it


async def test_a_promotion_grouped_after_a_finalize_counts_the_freed_slot_INV_PROMOTION_NEVER_OVERSHOOTS(
    sqlite_registry: SqliteRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    await sqlite_registry.enqueue(new_job(0))
    [job] = (await sqlite_registry.promote(request(1))).jobs
    waiting = [(await sqlite_registry.enqueue(new_job(n))).job.job_id for n in range(1, 4)]
    hops = HeldHops(sqlite_registry, monkeypatch)
    outcomes: dict[str, Any] = {}
    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_collect, outcomes, "hop", lambda: sqlite_registry.enqueue(new_job(9)))
            await hops.first_in_flight()
            calls: dict[str, Callable[[], Awaitable[Any]]] = {
                "early": lambda: sqlite_registry.promote(request(1, "x", "y")),  # before the finalize: no slot
                "finish": lambda: sqlite_registry.finalize(job.job_id, SUCCEEDED),
                "late": lambda: sqlite_registry.promote(request(1, "x", "y")),  # after it: the freed slot
            }
            for name, call in calls.items():
                nursery.start_soon(_collect, outcomes, name, call)
                await trio.testing.wait_all_tasks_blocked()
            hops.release.set()
    assert hops.sizes == [1, 3]
    assert outcomes["early"].jobs == ()
    assert outcomes["finish"].changed
    assert [j.job_id for j in outcomes["late"].jobs] == waiting[:1]
    assert (await sqlite_registry.counts())["running"] == 1


async def test_a_caller_cancelled_while_queued_still_has_its_change_committed_and_strands_nobody(
    sqlite_registry: SqliteRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops = HeldHops(sqlite_registry, monkeypatch)
    done: list[str] = []

    async def enqueue(tag: str) -> None:
        await sqlite_registry.enqueue(new_job(kind=tag))
        done.append(tag)

    doomed = trio.CancelScope()

    async def victim() -> None:
        with doomed:
            await enqueue("cancelled")

    with trio.fail_after(WAIT_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(enqueue, "leader")
            await hops.first_in_flight()
            nursery.start_soon(victim)
            await trio.testing.wait_all_tasks_blocked()  # queued behind the held hop, waiting for its turn
            doomed.cancel()  # shielded once queued: it still writes, and leads the next hop
            nursery.start_soon(enqueue, "after")
            await trio.testing.wait_all_tasks_blocked()
            hops.release.set()
    assert hops.sizes == [1, 2]
    assert sorted(done) == ["after", "cancelled", "leader"]
    assert sorted(j.kind for j in (await sqlite_registry.list_jobs())[0]) == ["after", "cancelled", "leader"]


# -- two handles on one file ---------------------------------------------------------------------------------


async def test_writers_on_two_handles_of_one_file_all_commit(path: Path) -> None:
    """Handles on one file share this process's write queue (no busy-waiting on each other): every change of
    every task commits."""
    one, two = await SqliteRegistry.open(path), await SqliteRegistry.open(path)
    ids: list[str] = []

    async def writer(reg: SqliteRegistry, worker: int) -> None:
        for i in range(10):
            result = await reg.enqueue(new_job(worker * 100 + i))
            ids.append(result.job.job_id)
            if i % 5 == 0:
                await reg.request_cancel(result.job.job_id)

    try:
        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as nursery:
                for worker in range(12):
                    nursery.start_soon(writer, (one, two)[worker % 2], worker)
        assert len(set(ids)) == 120
        assert (await one.counts())["queued"] == 12 * 8
        assert (await two.counts())["cancelled"] == 12 * 2
    finally:
        await one.aclose()
        await two.aclose()


async def test_promotions_through_two_handles_never_overshoot_INV_PROMOTION_NEVER_OVERSHOOTS(path: Path) -> None:
    one, two = await SqliteRegistry.open(path), await SqliteRegistry.open(path)
    try:
        ids = [(await one.enqueue(new_job(n))).job.job_id for n in range(12)]
        promoted: list[str] = []

        async def promote(reg: SqliteRegistry, i: int) -> None:
            promoted.extend(j.job_id for j in (await reg.promote(request(3, f"{i}-a", f"{i}-b"))).jobs)

        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(promote, (one, two)[i % 2], i)
        assert sorted(promoted) == sorted(ids[:3])
        assert [j.job_id for j in await two.running_jobs()] == ids[:3]
    finally:
        await one.aclose()
        await two.aclose()
