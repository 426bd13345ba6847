"""The heartbeat path of the core: the token before the body, token hashes in memory, beats written in batches.

The supervisor tests use a real registry (rows inserted as a boot would leave them). Which beats share a write is
the registry's business (its write coalescer: ``tests/registry/sqlite/test_write_coalescer.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from core_helpers import insert_running  # type: ignore[import-not-found]

from supervisor import Supervisor
from supervisor.core import JobTokens
from supervisor.domain import Job, JobStatus, Unauthorized, ValidationError, from_iso, hash_token
from supervisor.observe import EventName, JobEvent
from supervisor.registry import Ending, Outcome


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
            await sup.heartbeat(job_id, token, read_body)
    assert reads == []
    # A job this boot did not promote (an adopted one's) is admitted by the registry, then from memory.
    assert not sup.heartbeats.tokens.admits(job.job_id, "t")
    after = await sup.heartbeat(job.job_id, "t", read_body)
    assert (reads, after.completed_units) == (["read"], 3)
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

    await sup.heartbeat(job.job_id, "t", good)
    with pytest.raises(ValidationError):
        await sup.heartbeat(job.job_id, "t", bad)  # running: a bad body is the body's own 422
    # The row ends without this supervisor hearing of it (another process): memory still admits the token...
    await sup.registry.finalize(job.job_id, Ending(Outcome(JobStatus.FAILED, "elsewhere")))
    assert sup.heartbeats.tokens.admits(job.job_id, "t")
    with pytest.raises(Unauthorized):
        await sup.heartbeat(job.job_id, "t", bad)  # ...but the answer is the 401 of a token that no longer works
    with pytest.raises(Unauthorized):
        await sup.heartbeat(job.job_id, "t", good)  # and the write refuses it, which also forgets it
    assert not sup.heartbeats.tokens.admits(job.job_id, "t")
