"""The heartbeat path of the core: the token before the body, token hashes in memory, beats taken and written
behind (ADR 0018): a job's beats merged into one row change, written by the writer task or by the next read.

The supervisor tests use a real registry (rows inserted as a boot would leave them).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence

import pytest
import trio
import trio.testing
from core_helpers import insert_running, take_beat  # type: ignore[import-not-found]

from supervisor import Supervisor
from supervisor.core import FLUSH_INTERVAL_S, WRITE_RETRY_S, JobTokens, merged
from supervisor.domain import (
    Job,
    JobStatus,
    RegistryUnavailable,
    RequestError,
    Unauthorized,
    ValidationError,
    from_iso,
    hash_token,
)
from supervisor.observe import EventName, JobEvent
from supervisor.registry import Beat, Ending, Outcome


def _job(job_id: str, status: JobStatus = JobStatus.RUNNING, token_hash: str | None = None) -> Job:
    return Job(
        job_id=job_id, seq=1, kind="k", params={}, argv=[], status=status, error_reason=None, exit_code=None,
        created_at=from_iso("2026-01-01T00:00:00+00:00"), started_at=None, ended_at=None, attempts=1,
        cancel_requested=False, boot_id="b", identity=None, token_hash=token_hash,
        completed_units=0, total_units=None, stage=None, last_heartbeat_at=None, last_progress_at=None, log_path=None,
    )  # fmt: skip


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
            await take_beat(sup.heartbeats, job_id, token, read_body)
    assert reads == []
    # A job this boot did not promote (an adopted one's) is admitted by the registry, then from memory.
    assert not sup.heartbeats.tokens.admits(job.job_id, "t")
    await take_beat(sup.heartbeats, job.job_id, "t", read_body)
    assert (reads, (await sup.get(job.job_id)).completed_units) == (["read"], 3)  # a read writes what was taken
    assert sup.heartbeats.tokens.admits(job.job_id, "t")


async def test_a_refused_body_of_an_ended_job_admitted_from_memory_is_401(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(attach=False)
    job = await insert_running(sup, boot_id="an-earlier-boot", pid=None, spawned=False)

    async def good() -> object:
        return {"completed_units": 1}

    async def bad() -> object:
        return {"completed_units": -1}

    await take_beat(sup.heartbeats, job.job_id, "t", good)
    with pytest.raises(ValidationError):
        await take_beat(sup.heartbeats, job.job_id, "t", bad)  # running: a bad body is the body's own 422
    await sup.heartbeats.flush()
    # The row ends without this supervisor hearing of it (another process): memory still admits the token...
    await sup.registry.finalize(job.job_id, Ending(Outcome(JobStatus.FAILED, "elsewhere")))
    assert sup.heartbeats.tokens.admits(job.job_id, "t")
    with pytest.raises(Unauthorized):
        await take_beat(sup.heartbeats, job.job_id, "t", bad)  # ...but the answer is the 401 of a stale token
    # A good body is taken from memory (no registry call of its own); the write refuses it and forgets the token, so
    # the next beat is the 401, and the row is left as it ended.
    await take_beat(sup.heartbeats, job.job_id, "t", good)
    await sup.heartbeats.flush()
    assert not sup.heartbeats.tokens.admits(job.job_id, "t")
    with pytest.raises(Unauthorized):
        await take_beat(sup.heartbeats, job.job_id, "t", good)
    assert (await sup.get(job.job_id)).completed_units == 1


# -- written behind (ADR 0018) ------------------------------------------------------------------------------------


def test_a_jobs_beats_merge_to_the_highest_watermark_and_the_newest_total_and_stage() -> None:
    first = Beat("j", "t", 5, 10, "fetch")
    assert merged(None, first) == first
    assert merged(first, Beat("j", "t", 3)) == Beat("j", "t", 5, 10, "fetch")  # None keeps; a lower count too
    assert merged(first, Beat("j", "t", 7, 12, "write")) == Beat("j", "t", 7, 12, "write")


def _spy_writes(sup: Supervisor, monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, list[Beat]]]:
    """Each registry write of beats: when (virtual time), and which."""
    writes: list[tuple[float, list[Beat]]] = []
    original = sup.registry.record_heartbeats

    async def record(beats: Sequence[Beat]) -> list[Job | RequestError]:
        writes.append((trio.current_time(), list(beats)))
        return await original(beats)

    monkeypatch.setattr(sup.registry, "record_heartbeats", record)
    return writes


async def _until(condition: Callable[[], bool]) -> None:
    """Wait (virtual time, at most a minute of it) until ``condition`` holds."""
    with trio.fail_after(60):
        while True:
            if condition():
                return
            await trio.sleep(0.001)


def _units(n: int, stage: str | None = None) -> Callable[[], Awaitable[object]]:
    async def read_body() -> object:
        return {"completed_units": n} if stage is None else {"completed_units": n, "stage": stage}

    return read_body


async def test_beats_taken_within_an_interval_are_one_write_of_one_change_per_job(
    autojump_clock: trio.testing.MockClock,
    make_supervisor: Callable[..., Supervisor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sup = make_supervisor(attach=False)
    one = await insert_running(sup, boot_id="b", pid=None, spawned=False)
    two = await insert_running(sup, boot_id="b", pid=None, spawned=False)
    for job in (one, two):  # as this boot's promotion would have: no registry read before a beat is taken
        sup.heartbeats.tokens.remember(job.job_id, "t", sup.heartbeats.tokens.generation)
    writes = _spy_writes(sup, monkeypatch)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.heartbeats.run)
        start = trio.current_time()
        # Out of order: the watermark is the highest; the stage the newest beat's that has one (it was the first's).
        for n, stage in ((4, "fetch"), (9, "write"), (2, None)):
            await take_beat(sup.heartbeats, one.job_id, "t", _units(n, stage))
        await take_beat(sup.heartbeats, two.job_id, "t", _units(1))
        assert writes == []  # taken, not yet written: each 204 went out without a registry write
        await _until(lambda: bool(writes))
        assert writes[0][0] - start == pytest.approx(FLUSH_INTERVAL_S)
        assert writes[0][1] == [Beat(one.job_id, "t", 9, None, "write"), Beat(two.job_id, "t", 1)]
        nursery.cancel_scope.cancel()
    rows = {job.job_id: job for job in (await sup.registry.get(one.job_id), await sup.registry.get(two.job_id))}
    assert (rows[one.job_id].completed_units, rows[one.job_id].stage, rows[two.job_id].completed_units) == (
        9,
        "write",
        1,
    )
    assert len(writes) == 1 and sup.heartbeats.pending == 0


async def test_a_failed_write_keeps_its_beats_says_so_once_and_writes_them_merged_with_newer_ones(
    autojump_clock: trio.testing.MockClock,
    make_supervisor: Callable[..., Supervisor],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sup = make_supervisor(attach=False)
    job = await insert_running(sup, boot_id="b", pid=None, spawned=False)
    original = sup.registry.record_heartbeats
    failures = 3
    tries: list[float] = []

    async def record(beats: Sequence[Beat]) -> list[Job | RequestError]:
        nonlocal failures
        tries.append(trio.current_time())
        if failures:
            failures -= 1
            raise RegistryUnavailable("the disk is full")
        return await original(beats)

    monkeypatch.setattr(sup.registry, "record_heartbeats", record)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.heartbeats.run)
        await take_beat(sup.heartbeats, job.job_id, "t", _units(5, "fetch"))
        await _until(lambda: len(tries) >= 2)
        await take_beat(sup.heartbeats, job.job_id, "t", _units(3))  # taken while the registry fails
        await _until(lambda: not failures and not sup.heartbeats.pending)
        nursery.cancel_scope.cancel()
    assert [round(b - a, 6) for a, b in itertools.pairwise(tries)] == [WRITE_RETRY_S] * 3
    row = await sup.registry.get(job.job_id)
    assert (row.completed_units, row.stage) == (5, "fetch")
    out = capsys.readouterr().out
    assert out.count("heartbeats_write_failed") == 1 and out.count("heartbeats_write_recovered") == 1


async def test_a_writer_cancelled_at_shutdown_writes_what_it_took_first(
    autojump_clock: trio.testing.MockClock, make_supervisor: Callable[..., Supervisor]
) -> None:
    sup = make_supervisor(attach=False)
    job = await insert_running(sup, boot_id="b", pid=None, spawned=False)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.heartbeats.run)
        await take_beat(sup.heartbeats, job.job_id, "t", _units(7))
        nursery.cancel_scope.cancel()  # before its interval has passed
    assert (await sup.registry.get(job.job_id)).completed_units == 7
    assert sup.heartbeats.pending == 0


async def test_a_read_cancelled_while_it_writes_the_beats_keeps_them_for_the_next(
    make_supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = make_supervisor(attach=False)
    job = await insert_running(sup, boot_id="b", pid=None, spawned=False)
    original = sup.registry.record_heartbeats

    async def stuck(beats: Sequence[Beat]) -> list[Job | RequestError]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    monkeypatch.setattr(sup.registry, "record_heartbeats", stuck)
    await take_beat(sup.heartbeats, job.job_id, "t", _units(6))
    with trio.move_on_after(0.01):
        await sup.get(job.job_id)
    assert sup.heartbeats.pending == 1
    monkeypatch.setattr(sup.registry, "record_heartbeats", original)
    assert (await sup.get(job.job_id)).completed_units == 6


async def test_a_read_during_a_write_fault_answers_and_the_beat_waits(
    make_supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads keep answering while the registry cannot write (docs/operations.md): a read whose beats cannot be
    written first shows the row as it is, and the beat stays taken for the writer."""
    sup = make_supervisor(attach=False)
    job = await insert_running(sup, boot_id="b", pid=None, spawned=False)
    original = sup.registry.record_heartbeats

    async def full(beats: Sequence[Beat]) -> list[Job | RequestError]:
        raise RegistryUnavailable("the disk is full")

    monkeypatch.setattr(sup.registry, "record_heartbeats", full)
    await take_beat(sup.heartbeats, job.job_id, "t", _units(4))
    assert (await sup.get(job.job_id)).completed_units == 0
    [listed], _ = await sup.list_jobs()
    assert listed.completed_units == 0 and sup.heartbeats.pending == 1
    monkeypatch.setattr(sup.registry, "record_heartbeats", original)
    assert (await sup.get(job.job_id)).completed_units == 4
