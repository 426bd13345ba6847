"""Drain, monitors and outcomes with real subprocesses (subprocess exec mode)."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from core_helpers import poll, wait_idle, wait_running, wait_terminal  # type: ignore[import-not-found]

from supervisor import JobStatus
from supervisor._core import Supervisor
from supervisor.domain._model import Job


async def test_three_jobs_with_max_one_run_strictly_one_after_another_in_fifo_order(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(max_concurrent=1)
    ids = [(await sup.enqueue("sleep", {"seconds": 0.2})).job.job_id for _ in range(3)]
    jobs = [await wait_terminal(sup, job_id) for job_id in ids]
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 3
    for earlier, later in itertools.pairwise(jobs):
        assert earlier.ended_at is not None and later.started_at is not None
        assert earlier.ended_at <= later.started_at  # never overlapping
        assert earlier.started_at is not None and earlier.started_at < later.started_at


async def test_drain_returns_while_its_job_still_runs(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor()
    argv = sup.kinds.get("sleep").render_argv({"seconds": 30.0})
    # Enqueued through the registry, as another process would: the row waits for a drain.
    queued = await sup.registry.enqueue("sleep", {"seconds": 30.0}, argv, coalesce_key=None)
    with trio.fail_after(5):
        started = await sup.drain()
    assert [j.job_id for j in started] == [queued.job.job_id]
    job = started[0]
    # The drain contract: spawned and identity recorded when drain returns, and nobody waited for the job.
    assert job.status is JobStatus.RUNNING
    assert job.pid is not None and job.pid_start_time is not None and job.kernel_boot_id is not None
    await sup.cancel(job.job_id)
    ended = await wait_terminal(sup, job.job_id)
    assert (ended.status, ended.error_reason) == (JobStatus.CANCELLED, "cancelled")


async def test_exit_codes_become_outcomes(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(max_concurrent=4)
    ok = (await sup.enqueue("exit", {"code": 0})).job.job_id
    bad = (await sup.enqueue("exit", {"code": 3})).job.job_id
    budget = (await sup.enqueue("budget", {})).job.job_id
    named = (await sup.enqueue("nothing_to_do", {})).job
    assert (await wait_terminal(sup, ok)).status is JobStatus.SUCCEEDED
    failed = await wait_terminal(sup, bad)
    assert (failed.status, failed.error_reason, failed.exit_code) == (JobStatus.FAILED, "exit_code_3", 3)
    planned = await wait_terminal(sup, budget)
    # INV-BUDGET-IS-AN-OUTCOME: a budget stop is recorded with its reason, not as a crash.
    assert (planned.status, planned.error_reason, planned.exit_code) == (JobStatus.SUCCEEDED, "budget_exhausted", 10)
    failed_named = await wait_terminal(sup, named.job_id)
    assert (failed_named.status, failed_named.error_reason) == (JobStatus.FAILED, "all_feeds_failed")


async def test_spawn_failure_fails_the_row_and_drains_on(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    sup = make_supervisor(max_concurrent=1)
    missing = await sup.registry.enqueue("sleep", {}, [str(tmp_path / "no-such-binary")], coalesce_key=None)
    good = await sup.registry.enqueue(
        "exit", {"code": 0}, sup.kinds.get("exit").render_argv({"code": 0}), coalesce_key=None
    )
    await sup.drain()
    failed = await wait_terminal(sup, missing.job.job_id)
    assert failed.status is JobStatus.FAILED
    assert failed.error_reason is not None and failed.error_reason.startswith("spawn_failed: FileNotFoundError")
    assert (await wait_terminal(sup, good.job.job_id)).status is JobStatus.SUCCEEDED


async def test_job_gets_its_environment_and_log(make_supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    sup = make_supervisor()
    sup.heartbeat_base_url = "http://127.0.0.1:9"
    job = (await sup.enqueue("exit", {"code": 0})).job
    done = await wait_terminal(sup, job.job_id)
    assert done.log_path == str((sup.config.jobs_log_dir / f"{job.job_id}.log").resolve())
    assert (await sup.read_log(job.job_id)) == b"bye\n"
    assert (await sup.read_log(job.job_id, tail_bytes=2)) == b"e\n"


async def test_job_log_is_capped(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(log_max_bytes=4096)
    job = (await sup.enqueue("chatty", {"n": 100_000})).job
    done = await wait_terminal(sup, job.job_id)
    assert done.status is JobStatus.SUCCEEDED  # the child never blocked or died on its output
    text = await sup.read_log(job.job_id)
    assert text.startswith(b"x" * 4096)
    assert b"log capped at 4096 bytes" in text
    assert len(text) < 4096 + 200


async def test_success_enqueues_the_follow_up_kind_and_failure_does_not(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor()
    failing = (await sup.enqueue("first", {"code": 1})).job
    assert (await wait_terminal(sup, failing.job_id)).status is JobStatus.FAILED
    await wait_idle(sup)  # the monitor has finished everything it does after finalizing
    assert (await sup.list_jobs(kind="done"))[0] == []
    ok = (await sup.enqueue("first", {"code": 0})).job
    assert (await wait_terminal(sup, ok.job_id)).status is JobStatus.SUCCEEDED

    async def follow_up_enqueued() -> list[Job] | None:  # the monitor enqueues it just after finalizing
        return (await sup.list_jobs(kind="done"))[0] or None

    follow_ups = await poll(follow_up_enqueued)
    assert len(follow_ups) == 1
    assert (await wait_terminal(sup, follow_ups[0].job_id)).status is JobStatus.SUCCEEDED


async def test_pause_holds_promotion(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor()
    await sup.pause()
    job = (await sup.enqueue("exit", {"code": 0})).job
    assert (await sup.get(job.job_id)).status is JobStatus.QUEUED
    assert (await sup.queue_state()).paused
    await sup.resume()
    assert (await wait_terminal(sup, job.job_id)).status is JobStatus.SUCCEEDED


async def test_every_transition_is_one_log_line_with_its_fields(make_supervisor: Callable[..., Supervisor]) -> None:
    from structlog.testing import capture_logs

    sup = make_supervisor()
    with capture_logs() as logs:
        job = (await sup.enqueue("exit", {"code": 0})).job
        await wait_terminal(sup, job.job_id)
        await wait_idle(sup)  # the monitor logs the transition after the row is committed
    transitions = [(e["from"], e["to"]) for e in logs if e["event"] == "job_transition"]
    assert transitions == [("-", "queued"), ("queued", "running"), ("running", "succeeded")]
    last = [e for e in logs if e["event"] == "job_transition"][-1]
    assert {"job_id", "kind", "reason", "boot_id", "pid"} <= set(last)
    assert last["boot_id"] == sup.boot_id


async def test_any_spawn_failure_finalizes_the_row_and_the_queue_moves_on_INV_SPAWN_FAILURE_FREES_SLOT(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """Issue 9 #1: a defect inside one spawn (here an argv the OS cannot encode, enqueued by another process
    that bypassed validation) once raised out of drain and left the row RUNNING with no process, holding the
    only slot for ever."""
    sup = make_supervisor(max_concurrent=1)
    registry = sup.registry.sync
    bad = registry.enqueue("exit", {"code": 0}, [sys.executable, "-c", "pass", "\ud800"]).job
    good = registry.enqueue("exit", {"code": 0}, sup.kinds.get("exit").render_argv({"code": 0})).job
    with trio.fail_after(10):
        await sup.drain()
    failed = await sup.get(bad.job_id)
    assert failed.status is JobStatus.FAILED
    assert failed.error_reason is not None and failed.error_reason.startswith("spawn_failed: UnicodeEncodeError")
    assert (await wait_terminal(sup, good.job_id)).status is JobStatus.SUCCEEDED


async def test_a_job_environment_never_holds_the_operator_token(make_supervisor: Callable[..., Supervisor]) -> None:
    sup = make_supervisor(
        base_env={"PATH": "/usr/bin", "PODCAST_JOB_API_TOKEN": "operator-secret", "PODCAST_JOB_API_TOKEN_FILE": "/x"}
    )
    job = (await sup.enqueue("show_env", {})).job
    assert (await wait_terminal(sup, job.job_id)).status is JobStatus.SUCCEEDED
    names = (await sup.read_log(job.job_id)).decode()
    assert "PODCAST_JOB_TOKEN" in names and "PODCAST_JOB_ID" in names  # its own identity and token: yes
    assert "PODCAST_JOB_API_TOKEN" not in names  # the operator's (or where to read it): never


async def test_the_drainer_never_overshoots_under_20_concurrent_enqueuers_INV_PROMOTION_NEVER_OVERSHOOTS(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(max_concurrent=3)
    ids: list[str] = []

    async def enqueuer() -> None:
        for _ in range(3):
            ids.append((await sup.enqueue("sleep", {"seconds": 0.05})).job.job_id)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(enqueuer)
        jobs = [await wait_terminal(sup, job_id) for job_id in ids]
    assert len(jobs) == 60 and all(j.status is JobStatus.SUCCEEDED and j.attempts == 1 for j in jobs)
    # Every row's [started_at, ended_at] is its slot's tenure: at no instant do more than 3 overlap.
    edges = sorted(
        [(j.started_at, 1) for j in jobs if j.started_at] + [(j.ended_at, -1) for j in jobs if j.ended_at],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    held = peak = 0
    for _, delta in edges:
        held += delta
        peak = max(peak, held)
    assert peak == 3


async def test_batch_enqueue_is_validated_all_or_nothing_naming_the_element(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    from supervisor import ValidationError

    sup = make_supervisor()
    await sup.pause()
    good = {"kind": "exit", "params": {"code": 0}}
    for bad_batch, field in [
        ([good, good, good, {"kind": "sleep", "params": {"seconds": "soon"}}], "jobs[3].params.seconds"),
        ([good, {"kind": "nope"}], "jobs[1].kind"),
        ([good, {"params": {}}], "jobs[1].kind"),
        ([good, {"kind": "exit", "params": {"code": 0}, "priority": 1}], "jobs[1].priority"),
        ([good, "exit"], "jobs[1]"),
        ([], "jobs"),
        ([good] * 1001, "jobs"),
    ]:
        with pytest.raises(ValidationError) as err:
            await sup.enqueue_many(bad_batch)
        assert err.value.field == field, bad_batch[-1]
    assert sum((await sup.registry.counts()).values()) == 0  # nothing stored

    batch = [good, {"kind": "done"}, {"kind": "done"}, {"kind": "sleep", "params": {"seconds": 1}}]
    results = await sup.enqueue_many(batch)
    assert [r.coalesced for r in results] == [False, False, True, False]  # the second 'done' joined the first
    assert results[1].job.job_id == results[2].job.job_id
    assert [r.job.kind for r in results] == ["exit", "done", "done", "sleep"]
    jobs, _ = await sup.list_jobs()
    assert [j.kind for j in reversed(jobs)] == ["exit", "done", "sleep"]  # stored in order


async def test_the_shepherd_holds_none_of_the_supervisors_environment(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    os.environ["PODCAST_JOB_API_TOKEN"] = "operator-secret-in-env"
    try:
        sup = make_supervisor()
        job = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 30})).job.job_id)
    finally:
        del os.environ["PODCAST_JOB_API_TOKEN"]
    shepherd_pid = sup.executor.shepherd.pid  # type: ignore[attr-defined]
    assert shepherd_pid is not None
    environ = await trio.to_thread.run_sync(Path(f"/proc/{shepherd_pid}/environ").read_bytes)
    assert b"operator-secret" not in environ and b"PODCAST_JOB" not in environ
    await sup.cancel(job.job_id)
    await wait_terminal(sup, job.job_id)


async def test_a_job_enqueued_while_a_slot_is_free_is_promoted_in_its_enqueue_transaction(
    make_supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10 (one POST per job): the row and its promotion are one transaction; the drainer only starts it."""
    sup = make_supervisor(max_concurrent=1)

    async def no_promote_round(*args: object, **kwargs: object) -> list[Job]:
        raise AssertionError("the drainer's promote round ran: the enqueue did not promote")

    monkeypatch.setattr(sup.registry, "promote_queued", no_promote_round)
    first = (await sup.enqueue("sleep", {"seconds": 30})).job
    assert first.status is JobStatus.QUEUED  # the answer: the row as stored, before its promotion in the same commit
    assert (await sup.get(first.job_id)).status is JobStatus.RUNNING
    # INV-PROMOTION-NEVER-OVERSHOOTS: the one slot is taken (counted in the next enqueue's transaction).
    second = (await sup.enqueue("exit", {"code": 0})).job
    assert (await sup.get(second.job_id)).status is JobStatus.QUEUED
    running = await wait_running(sup, first.job_id)  # started by the drainer, handed over by the enqueue
    assert running.pid is not None and running.attempts == 1
    assert (await sup.get(second.job_id)).status is JobStatus.QUEUED
    await sup.cancel(first.job_id)
    assert (await wait_terminal(sup, first.job_id)).status is JobStatus.CANCELLED
    # The end of the first promotes the second in its own finalize: still no promote round.
    assert (await wait_terminal(sup, second.job_id)).status is JobStatus.SUCCEEDED


async def test_an_enqueue_that_fills_its_two_slots_leaves_the_other_free_ones_to_a_full_drain(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """A promotion in the enqueue's transaction fills at most two slots (its tokens); with more free, the drainer's
    full round fills the rest at once, not at the next job's end."""
    sup = make_supervisor(max_concurrent=4)
    await sup.pause()
    waiting = [(await sup.enqueue("sleep", {"seconds": 30})).job.job_id for _ in range(3)]
    await trio.to_thread.run_sync(sup.config.pause_flag_path.unlink)  # resumed behind the supervisor's back
    last = (await sup.enqueue("sleep", {"seconds": 30})).job.job_id
    for job_id in [*waiting, last]:
        await wait_running(sup, job_id)
    for job_id in [*waiting, last]:
        await sup.cancel(job_id)


async def test_a_job_enqueued_while_paused_stays_queued_and_wakes_nothing(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(max_concurrent=2)
    await sup.pause()
    job = (await sup.enqueue("exit", {"code": 0})).job
    assert (await sup.get(job.job_id)).status is JobStatus.QUEUED  # the flag is looked at inside the transaction
    assert not sup._handed_off
    await sup.resume()
    assert (await wait_terminal(sup, job.job_id)).status is JobStatus.SUCCEEDED
