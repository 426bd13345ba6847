"""The heartbeat path of the core: the token before the body, token hashes in memory, beats written in batches.

``BeatBatcher`` is driven with a fake write that the test releases by events, so which beats share a transaction is
exact, not timed. The supervisor tests use a real registry (rows inserted as a boot would leave them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import trio
from core_helpers import insert_running  # type: ignore[import-not-found]

from supervisor._beats import BeatBatcher, JobTokens
from supervisor._core import Supervisor
from supervisor._registry import Beat, hash_token
from supervisor.domain._errors import RegistryError, Unauthorized, ValidationError
from supervisor.domain._model import Job, JobStatus
from supervisor.observe._events import EventName, JobEvent


def _job(job_id: str, status: JobStatus = JobStatus.RUNNING, token_hash: str | None = None) -> Job:
    return Job(
        job_id=job_id, seq=1, kind="k", params={}, argv=[], status=status, error_reason=None, exit_code=None,
        created_at="2026-01-01T00:00:00+00:00", started_at=None, ended_at=None, attempts=1, cancel_requested=False,
        boot_id="b", pid=None, pid_start_time=None, kernel_boot_id=None, container_id=None, token_hash=token_hash,
        completed_units=0, total_units=None, stage=None, last_heartbeat_at=None, last_progress_at=None, log_path=None,
    )  # fmt: skip


class FakeWrite:
    """A batch write that waits at its gate until the test opens it, and answers each beat as ``answer`` says."""

    def __init__(self, answer: Callable[[Beat], Job | BaseException]) -> None:
        self.answer = answer
        self.batches: list[list[str]] = []
        self.gates: list[trio.Event] = []
        self.fail: BaseException | None = None

    async def __call__(self, beats: Sequence[Beat]) -> list[Job | BaseException]:
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


def _answer(beat: Beat) -> Job | BaseException:
    return Unauthorized("the token is not this job's") if beat.token == "bad" else _job(beat.job_id)


async def test_beats_that_arrive_during_a_write_go_together_in_the_next_one() -> None:
    write = FakeWrite(_answer)
    recorded: list[str] = []
    batcher = BeatBatcher(write, lambda job: recorded.append(job.job_id))
    results: dict[str, object] = {}

    async def beat(job_id: str, token: str = "ok") -> None:
        try:
            results[job_id] = (await batcher.record(Beat(job_id, token, 1))).job_id
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
    assert batcher.batches == 2


async def test_a_failed_batch_fails_each_of_its_beats_and_the_next_beat_is_written() -> None:
    write = FakeWrite(_answer)
    batcher = BeatBatcher(write, lambda job: None)
    failures: list[BaseException] = []

    async def beat(job_id: str) -> None:
        try:
            await batcher.record(Beat(job_id, "ok", 1))
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
    batcher = BeatBatcher(write, lambda job: None)
    done: list[str] = []
    scopes: dict[str, trio.CancelScope] = {}

    async def beat(job_id: str) -> None:
        with trio.CancelScope() as scopes[job_id]:
            await batcher.record(Beat(job_id, "ok", 1))
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


def test_job_tokens_learn_at_promotion_forget_at_the_end_and_never_readmit_a_raced_lookup() -> None:
    tokens = JobTokens()
    assert not tokens.admits("j", "t")
    running = _job("j", token_hash=hash_token("t"))
    tokens.on_event(JobEvent(EventName.TRANSITION, running, "queued", "promoted", "b"))
    assert tokens.admits("j", "t") and not tokens.admits("j", "u") and not tokens.admits("k", "t")
    tokens.on_event(JobEvent(EventName.TRANSITION, _job("j", JobStatus.SUCCEEDED), "running", None, "b"))
    assert not tokens.admits("j", "t") and len(tokens) == 0
    # A registry lookup that raced with a job's end is not remembered.
    generation = tokens.generation
    tokens.forget("other")
    tokens.remember("j", "t", generation)
    assert not tokens.admits("j", "t")
    tokens.remember("j", "t", tokens.generation)
    assert tokens.admits("j", "t")


async def test_the_token_is_checked_before_the_body_is_read(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(attach=False)
    job = await insert_running(sup, boot_id="an-earlier-boot", pid=None, spawned=False)  # token "t"
    reads: list[str] = []

    async def read_body() -> object:
        reads.append("read")
        return {"completed_units": 3}

    for job_id, token in ((job.job_id, "wrong"), ("no-such-job", "t")):
        with pytest.raises(Unauthorized):
            await sup.heartbeat(job_id, token, read_body)
    assert reads == []
    # A job this boot did not promote (an adopted one's) is admitted by the registry, then from memory.
    assert not sup._tokens.admits(job.job_id, "t")
    after = await sup.heartbeat(job.job_id, "t", read_body)
    assert (reads, after.completed_units) == (["read"], 3)
    assert sup._tokens.admits(job.job_id, "t")


async def test_a_refused_body_of_an_ended_job_admitted_from_memory_is_401(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(attach=False)
    job = await insert_running(sup, boot_id="an-earlier-boot", pid=None, spawned=False)

    async def good() -> object:
        return {"completed_units": 1}

    async def bad() -> object:
        return {"completed_units": -1}

    await sup.heartbeat(job.job_id, "t", good)
    with pytest.raises(ValidationError):
        await sup.heartbeat(job.job_id, "t", bad)  # running: a bad body is the body's own 422
    # The row ends without this supervisor hearing of it (another process): memory still admits the token...
    sup.registry.sync.finalize(job.job_id, JobStatus.FAILED, reason="elsewhere")
    assert sup._tokens.admits(job.job_id, "t")
    with pytest.raises(Unauthorized):
        await sup.heartbeat(job.job_id, "t", bad)  # ...but the answer is the 401 of a token that no longer works
    with pytest.raises(Unauthorized):
        await sup.heartbeat(job.job_id, "t", good)  # and the write refuses it, which also forgets it
    assert not sup._tokens.admits(job.job_id, "t")
