"""``AsyncRegistry``'s per-job writes share thread hops: the changes queued while one hop is in flight go together in
the next (``SqliteRegistry.write_group``), and each caller still gets exactly its own result or error.

A spy on ``write_group`` counts the hops and holds the first one until the test has queued the rest behind it, so a
shared hop is made deterministically (an event, never a sleep).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from supervisor import JobNotFound, JobStatus, SqliteRegistry
from supervisor._registry import NewJob, ProcessRecord, PromoteRequest, hash_token
from supervisor._store import AsyncRegistry

WAIT_S = 30.0  # a backstop for a broken test, never a timing assertion


class HeldHops:
    """Counts ``write_group`` calls (the hops) and their sizes; the first one waits until ``release``."""

    def __init__(self, registry: SqliteRegistry) -> None:
        self.sizes: list[int] = []
        self.first_entered = threading.Event()
        self.release = threading.Event()
        original = registry.write_group

        def write_group(changes: Any) -> Any:
            self.sizes.append(len(changes))
            if len(self.sizes) == 1:
                self.first_entered.set()
                assert self.release.wait(WAIT_S), "the test never released the first hop"
            return original(changes)

        registry.write_group = write_group  # type: ignore[method-assign]


@pytest.fixture
def reg(tmp_path: Path) -> Iterator[SqliteRegistry]:
    registry = SqliteRegistry(tmp_path / "jobs.sqlite3")
    yield registry
    registry.close()


async def _first_hop_in_flight(hops: HeldHops) -> None:
    await trio.to_thread.run_sync(hops.first_entered.wait, WAIT_S)


async def test_changes_queued_behind_a_hop_share_the_next_and_each_gets_its_own_result(reg: SqliteRegistry) -> None:
    areg = AsyncRegistry(reg)
    hops = HeldHops(reg)
    results: dict[int, Any] = {}

    async def enqueue(n: int) -> None:
        results[n] = await areg.enqueue("k", {"n": n}, [str(n)], coalesce_key=None)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(enqueue, 0)
        await _first_hop_in_flight(hops)
        for n in range(1, 20):
            nursery.start_soon(enqueue, n)
        await trio.testing.wait_all_tasks_blocked()
        hops.release.set()
    assert hops.sizes == [1, 19]  # 20 writes, 2 hops
    assert [results[n].job.params["n"] for n in range(20)] == list(range(20))
    assert len({r.job.job_id for r in results.values()}) == 20
    assert reg.counts()["queued"] == 20


async def test_an_error_reaches_only_the_caller_whose_change_earned_it(reg: SqliteRegistry) -> None:
    areg = AsyncRegistry(reg)
    [job] = [r.job for r in reg.enqueue_many([NewJob("k", {}, ["x"])])]
    [running] = reg.promote_queued(2, boot_id="b", token_hashes=[hash_token("t")], log_dir=None)
    hops = HeldHops(reg)
    outcomes: dict[str, Any] = {}

    async def call(name: str, fn: Any) -> None:
        try:
            outcomes[name] = await fn()
        except Exception as exc:
            outcomes[name] = exc

    record = ProcessRecord(running.job_id, pid=4242, pid_start_time=1, kernel_boot_id="boot")
    promote = PromoteRequest(2, "b", [hash_token("u")], None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "first", lambda: areg.enqueue("k", {}, ["y"], coalesce_key=None))
        await _first_hop_in_flight(hops)
        nursery.start_soon(call, "identity", lambda: areg.set_job_processes([record]))
        nursery.start_soon(
            call,
            "unknown",
            lambda: areg.finalize_then_promote(
                "no-such-job", lambda j: (JobStatus.SUCCEEDED, None), exit_code=0, promote=promote,
                unless_exists=Path("/nonexistent/pause"),
            ),
        )  # fmt: skip
        nursery.start_soon(call, "second", lambda: areg.enqueue("k", {}, ["z"], coalesce_key=None))
        await trio.testing.wait_all_tasks_blocked()
        hops.release.set()
    assert hops.sizes == [1, 3]
    assert isinstance(outcomes["unknown"], JobNotFound)
    [recorded] = outcomes["identity"]
    assert (recorded.job_id, recorded.pid) == (job.job_id, 4242)
    assert outcomes["first"].job.argv == ["y"] and outcomes["second"].job.argv == ["z"]
    assert reg.counts()["queued"] == 2


async def test_a_caller_cancelled_while_queued_still_has_its_change_committed_and_strands_nobody(
    reg: SqliteRegistry,
) -> None:
    areg = AsyncRegistry(reg)
    hops = HeldHops(reg)
    done: list[str] = []

    async def enqueue(tag: str) -> None:
        await areg.enqueue("k", {}, [tag], coalesce_key=None)
        done.append(tag)

    doomed = trio.CancelScope()

    async def victim() -> None:
        with doomed:
            await enqueue("cancelled")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(enqueue, "leader")
        await _first_hop_in_flight(hops)
        nursery.start_soon(victim)
        await trio.testing.wait_all_tasks_blocked()  # queued behind the held hop, waiting for its turn
        doomed.cancel()  # shielded once queued: it still writes, and takes its turn as the next hop's leader
        nursery.start_soon(enqueue, "after")
        await trio.testing.wait_all_tasks_blocked()
        hops.release.set()
    assert hops.sizes == [1, 2]
    assert sorted(done) == ["after", "cancelled", "leader"]
    assert sorted(j.argv[0] for j in reg.list_jobs(limit=10)[0]) == ["after", "cancelled", "leader"]
