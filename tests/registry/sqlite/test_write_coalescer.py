"""The SQLite registry's write coalescer: concurrent writes share a thread hop and a group commit.

Driven with a fake write that the test releases by events, so which items share a call is exact, not timed. The
items here are heartbeats, the writes that come by thousands."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import trio
import trio.testing

from supervisor import RegistryError, Unauthorized
from supervisor.registry import Beat
from supervisor.registry.sqlite import Coalescer


class _Row:
    """What a write answers for one beat here: the row of its job (only its id matters to these tests)."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id


class FakeWrite:
    """A batch write that waits at its gate until the test opens it, and answers each beat as ``answer`` says."""

    def __init__(self, answer: Callable[[Beat], _Row | BaseException]) -> None:
        self.answer = answer
        self.batches: list[list[str]] = []
        self.gates: list[trio.Event] = []
        self.fail: BaseException | None = None

    async def __call__(self, beats: Sequence[Beat]) -> list[_Row | BaseException]:
        gate = trio.Event()
        self.batches.append([b.job_id for b in beats])
        self.gates.append(gate)
        await gate.wait()
        if self.fail is not None:
            raise self.fail
        return [self.answer(b) for b in beats]

    async def open(self, batch: int) -> None:
        """Let batch number ``batch`` (from 0) finish, once every task has got as far as it can."""
        await trio.testing.wait_all_tasks_blocked()
        assert len(self.batches) == batch + 1, self.batches
        self.gates[batch].set()


def _answer(beat: Beat) -> _Row | BaseException:
    return Unauthorized("the token is not this job's") if beat.token == "bad" else _Row(beat.job_id)


async def test_beats_that_arrive_during_a_write_go_together_in_the_next_one() -> None:
    write = FakeWrite(_answer)
    recorded: list[str] = []
    batcher = Coalescer(write, lambda job: recorded.append(job.job_id))
    results: dict[str, object] = {}

    async def beat(job_id: str, token: str = "ok") -> None:
        try:
            results[job_id] = (await batcher.submit(Beat(job_id, token, 1))).job_id
        except Unauthorized as exc:
            results[job_id] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat, "first")
        await trio.testing.wait_all_tasks_blocked()  # the first beat leads: its write is in flight, alone
        for job_id in ("a", "b", "c"):
            nursery.start_soon(beat, job_id, "bad" if job_id == "b" else "ok")
        await write.open(0)
        await write.open(1)  # the queue's oldest beat led the next batch, holding every queued beat
    # (trio starts the tasks in any order)
    assert write.batches[0] == ["first"] and sorted(write.batches[1]) == ["a", "b", "c"]
    # One bad row costs the others nothing; each beat gets its own answer.
    assert results["first"] == "first" and results["a"] == "a" and results["c"] == "c"
    assert isinstance(results["b"], Unauthorized)
    # The absence tracker hears of each recorded beat, in commit order.
    assert recorded == ["first", *(j for j in write.batches[1] if j != "b")]
    assert batcher.calls == 2


async def test_a_failed_batch_fails_each_of_its_beats_and_the_next_beat_is_written() -> None:
    write = FakeWrite(_answer)
    batcher = Coalescer(write)
    failures: list[BaseException] = []

    async def beat(job_id: str) -> None:
        try:
            await batcher.submit(Beat(job_id, "ok", 1))
        except RegistryError as exc:
            failures.append(exc)

    write.fail = RegistryError("registry lock not acquired")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat, "x")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(beat, "y")
        await write.open(0)  # the first batch fails
        await write.open(1)  # so does the second (same failure)
    assert len(failures) == 2 and write.batches == [["x"], ["y"]]
    write.fail = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat, "z")
        await write.open(2)  # not stranded: the batcher went idle, and the next beat leads at once
    assert len(failures) == 2 and write.batches[2] == ["z"]


async def test_a_cancelled_caller_never_strands_the_beats_queued_behind_it() -> None:
    write = FakeWrite(_answer)
    batcher = Coalescer(write)
    done: list[str] = []
    scopes: dict[str, trio.CancelScope] = {}

    async def beat(job_id: str) -> None:
        with trio.CancelScope() as scopes[job_id]:
            await batcher.submit(Beat(job_id, "ok", 1))
            done.append(job_id)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat, "leader")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(beat, "queued")
        await trio.testing.wait_all_tasks_blocked()
        for scope in scopes.values():
            scope.cancel()  # both callers give up (a client gone, a shutdown)...
        await write.open(0)
        await write.open(1)  # ...yet the queued beat is still written: the leader handed the queue on
    assert write.batches == [["leader"], ["queued"]]
    assert done == ["leader", "queued"]  # shielded: a beat in a batch is answered once its batch is committed


