"""Drain, monitors and outcomes with real subprocesses (subprocess exec mode)."""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.testing
from core_helpers import (  # type: ignore[import-not-found]
    count_promote_rounds,
    enqueue_raw,
    pid_of,
    poll,
    wait_idle,
    wait_running,
    wait_terminal,
)

from supervisor import JobStatus, RegistryUnavailable, Supervisor
from supervisor.api import parse_batch
from supervisor.domain import Job, PageRequest


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
    queued = await enqueue_raw(sup, "sleep", {"seconds": 30.0}, argv)
    with trio.fail_after(5):
        started = await sup.drainer.drain()
    assert [j.job_id for j in started] == [queued.job_id]
    job = started[0]
    # The drain contract: spawned and identity recorded when drain returns, and nobody waited for the job.
    assert job.status is JobStatus.RUNNING
    assert job.identity is not None and job.identity.kind == "process"
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
    missing = await enqueue_raw(sup, "sleep", {}, [str(tmp_path / "no-such-binary")])
    good = await enqueue_raw(sup, "exit", {"code": 0}, sup.kinds.get("exit").render_argv({"code": 0}))
    await sup.drainer.drain()
    failed = await wait_terminal(sup, missing.job_id)
    assert failed.status is JobStatus.FAILED
    assert failed.error_reason is not None and failed.error_reason.startswith("spawn_failed: FileNotFoundError")
    assert (await wait_terminal(sup, good.job_id)).status is JobStatus.SUCCEEDED


async def test_job_gets_its_environment_and_log(make_supervisor: Callable[..., Supervisor], tmp_path: Path) -> None:
    sup = make_supervisor(heartbeat_base_url="http://127.0.0.1:9")
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
    assert (await sup.list_jobs(PageRequest.parse(kind="done")))[0] == []
    ok = (await sup.enqueue("first", {"code": 0}, by="ci-bot")).job
    assert (await wait_terminal(sup, ok.job_id)).status is JobStatus.SUCCEEDED

    async def follow_up_enqueued() -> list[Job] | None:  # the monitor enqueues it just after finalizing
        return (await sup.list_jobs(PageRequest.parse(kind="done")))[0] or None

    follow_ups = await poll(follow_up_enqueued)
    assert len(follow_ups) == 1
    # Whoever asked for the parent, the follow-up is the supervisor's own doing (ADR 0017).
    assert (ok.enqueued_by, follow_ups[0].enqueued_by) == ("ci-bot", "supervisor")
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
    """A defect inside one spawn (here an argv the OS cannot encode, enqueued by another process
    that bypassed validation) once raised out of drain and left the row RUNNING with no process, holding the
    only slot for ever."""
    sup = make_supervisor(max_concurrent=1)
    bad = await enqueue_raw(sup, "exit", {"code": 0}, [sys.executable, "-c", "pass", "\ud800"])
    good = await enqueue_raw(sup, "exit", {"code": 0}, sup.kinds.get("exit").render_argv({"code": 0}))
    with trio.fail_after(10):
        await sup.drainer.drain()
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
        # The envelope is read at the edge (parse_batch), each job's kind and params in the core: one field named.
        with pytest.raises(ValidationError) as err:
            await sup.enqueue_many(parse_batch({"jobs": bad_batch}))
        assert err.value.field == field, bad_batch[-1]
    assert sum((await sup.registry.counts()).values()) == 0  # nothing stored

    batch = [good, {"kind": "done"}, {"kind": "done"}, {"kind": "sleep", "params": {"seconds": 1}}]
    results = await sup.enqueue_many(parse_batch({"jobs": batch}))
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


async def test_every_promotion_is_the_drainers_one_round_for_every_trigger(
    make_supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One promotion path: an enqueue, a job's end and a resume only wake the drainer; its round asks the executor,
    then promotes (INV-PROMOTION-NEVER-OVERSHOOTS: counted and flipped in one registry step) and starts."""
    sup = make_supervisor(max_concurrent=1)
    rounds = count_promote_rounds(sup, monkeypatch)
    first = (await sup.enqueue("sleep", {"seconds": 30})).job
    assert first.status is JobStatus.QUEUED  # the enqueue's answer: the row as stored; the drainer starts it
    second = (await sup.enqueue("exit", {"code": 0})).job
    running = await wait_running(sup, first.job_id)
    assert pid_of(running) is not None and running.attempts == 1
    assert (await sup.get(second.job_id)).status is JobStatus.QUEUED  # the one slot is taken
    assert sum(rounds) == 1
    await sup.cancel(first.job_id)
    assert (await wait_terminal(sup, first.job_id)).status is JobStatus.CANCELLED
    # The first job's end woke the drainer, whose round promoted the second.
    assert (await wait_terminal(sup, second.job_id)).status is JobStatus.SUCCEEDED
    assert sum(rounds) == 2


async def test_a_drain_fills_every_free_slot_in_one_round(
    make_supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = make_supervisor(max_concurrent=4)
    await sup.pause()
    waiting = [(await sup.enqueue("sleep", {"seconds": 30})).job.job_id for _ in range(5)]
    rounds = count_promote_rounds(sup, monkeypatch)
    await sup.resume()
    for job_id in waiting[:4]:
        await wait_running(sup, job_id)
    assert [n for n in rounds if n] == [4]  # one round filled the four free slots (rounds while paused promote 0)
    assert (await sup.get(waiting[4])).status is JobStatus.QUEUED
    for job_id in waiting:
        await sup.cancel(job_id)


async def test_a_job_enqueued_while_paused_stays_queued(
    make_supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    sup = make_supervisor(max_concurrent=2)
    await sup.pause()
    rounds = count_promote_rounds(sup, monkeypatch)
    job = (await sup.enqueue("exit", {"code": 0})).job
    assert await sup.drainer.drain() == []  # the pause is read inside the promotion's own registry step
    assert (await sup.get(job.job_id)).status is JobStatus.QUEUED
    # The enqueue's own wake of the drainer may make a round too, before or after this drain's: each promotes none.
    assert rounds and set(rounds) == {0}
    await sup.resume()
    assert (await wait_terminal(sup, job.job_id)).status is JobStatus.SUCCEEDED


async def test_the_pause_file_holds_promotion_and_its_removal_resumes(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """ADR 0001 §7: the operator's switch, mirrored into the registry's pause by the drainer and the sweeper."""
    sup = make_supervisor(max_concurrent=2)
    flag = sup.config.pause_flag_path
    await trio.to_thread.run_sync(lambda: flag.parent.mkdir(parents=True, exist_ok=True))
    await trio.to_thread.run_sync(flag.touch)
    job = (await sup.enqueue("exit", {"code": 0})).job  # wakes the drainer: its round looks at the file first
    assert await sup.drainer.drain() == []
    assert (await sup.get(job.job_id)).status is JobStatus.QUEUED
    state = await sup.registry.pause_state()
    assert (state.paused, state.by) == (True, f"pause_file:{sup.config.host_id}")  # whose file: ADR 0012
    assert (await sup.queue_state()).paused
    await trio.to_thread.run_sync(flag.unlink)
    await sup.sweeper.sweep()  # the sweeper mirrors too (and drains)
    assert not (await sup.registry.pause_state()).paused
    assert (await wait_terminal(sup, job.job_id)).status is JobStatus.SUCCEEDED


async def test_the_pause_file_holds_every_promotion_that_begins_after_it_exists(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    """ADR-152 §7: a corpus repair can ``touch`` the file and start at once. Jobs are enqueued and drained
    in a loop, with slots to spare, and the file appears partway: no job enqueued after the touch is promoted, by
    this loop's drains or by the drainer's own rounds. (A look at most once a second let them through.)"""
    sup = make_supervisor(max_concurrent=50)
    flag = sup.config.pause_flag_path
    await trio.to_thread.run_sync(lambda: flag.parent.mkdir(parents=True, exist_ok=True))
    before, after = [], []
    for n in range(20):
        if n == 10:
            await trio.to_thread.run_sync(flag.touch)
        job = (await sup.enqueue("sleep", {"seconds": 30})).job
        (after if n >= 10 else before).append(job.job_id)
        promoted = await sup.drainer.drain()
        assert n < 10 or promoted == [], f"round {n}: promoted after the file appeared"
    assert {(await sup.get(job_id)).status for job_id in before} == {JobStatus.RUNNING}
    assert {(await sup.get(job_id)).status for job_id in after} == {JobStatus.QUEUED}
    await trio.to_thread.run_sync(flag.unlink)
    await sup.sweeper.sweep()  # the file gone: the pause it made ends, and the queue moves
    assert {(await sup.get(job_id)).status for job_id in after} == {JobStatus.RUNNING}


async def test_removing_the_pause_file_never_ends_a_pause_made_through_the_api(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor()
    await sup.pause()
    flag = sup.config.pause_flag_path
    await trio.to_thread.run_sync(lambda: flag.parent.mkdir(parents=True, exist_ok=True))
    await trio.to_thread.run_sync(flag.touch)
    await sup.sweeper.sweep()
    await trio.to_thread.run_sync(flag.unlink)
    await sup.sweeper.sweep()
    state = await sup.registry.pause_state()
    assert (state.paused, state.by) == (True, "operator")


async def test_a_job_whose_identity_the_registry_could_not_record_is_ended_by_its_monitor_with_its_true_outcome(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry unavailable just as a start is recorded: the job runs, watched by its monitor, its row without an
    identity. The sweeps leave that row to the monitor (the identity they would find and record under it would make
    the end's guard refuse it, and the job would end an orphan once its records were dropped); the monitor records
    its true end."""
    sup = make_supervisor()
    real = sup.registry.record_identities
    failed = trio.Event()

    async def unavailable_once(claims: Any) -> Any:
        if not failed.is_set():
            failed.set()
            raise RegistryUnavailable("the registry's disk is full")
        return await real(claims)

    monkeypatch.setattr(sup.registry, "record_identities", unavailable_once)
    gate = tmp_path / "gate"
    job = (await sup.enqueue("gated", {"gate": str(gate), "code": 0})).job
    with trio.fail_after(10):
        await failed.wait()
        while (entry := sup.boot.ledger.entry(job.job_id)) is None or entry.handle is None:  # noqa: ASYNC110
            await trio.sleep(0.01)  # its monitor starts just after the failed write
    for _ in range(2):
        report = await sup.reconciler.reconcile(stale_marks_live_processes=False)
        assert [(d.action, d.reason) for d in report.details if d.job_id == job.job_id] == [
            ("untouched", "watched_unrecorded")
        ]
    pid = sup.boot.ledger.entry(job.job_id).handle.log_fields()["pid"]  # type: ignore[union-attr]
    await trio.to_thread.run_sync(gate.write_text, "open")

    async def ended() -> Job | None:
        await sup.sweeper.sweep()
        row = await sup.get(job.job_id)
        return row if row.status.is_terminal else None

    with structlog.testing.capture_logs() as logs:
        final = await poll(ended)
    assert (final.status, final.error_reason, final.exit_code, final.identity) == (JobStatus.SUCCEEDED, None, 0, None)
    # The row never recorded the process; the line of its end names it anyway, as the monitor's handle does.
    [end] = [e for e in logs if e["event"] == "job_transition" and e["job_id"] == job.job_id]
    assert (end["from"], end["to"], end.get("pid")) == ("running", "succeeded", pid)


async def test_a_round_waited_for_when_the_drainer_task_ends_returns(
    autojump_clock: trio.testing.MockClock,
    make_supervisor: Callable[..., Supervisor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request waiting for a drainer round (a resume, the operator's reconcile) while the drainer task ends (the
    shutdown cancels it mid-round) is let go: nothing is left waiting for a round that will never come. Before,
    it waited on an Event that only the ended task would have set (the pattern ADR 0019's Doorbell ends)."""
    sup = make_supervisor(attach=False)
    in_round = trio.Event()

    async def endless(start: Any) -> list[Job]:
        in_round.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    monkeypatch.setattr(sup.drainer, "_drain", endless)
    async with trio.open_nursery() as nursery:
        drainer = trio.CancelScope()

        async def run_drainer(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            with drainer:
                await sup.drainer.run(task_status=task_status)

        await nursery.start(run_drainer)
        returned = trio.Event()

        async def wait_for_a_round() -> None:
            await sup.drainer.round()
            returned.set()

        nursery.start_soon(wait_for_a_round)
        await in_round.wait()
        drainer.cancel()
        with trio.fail_after(60):
            await returned.wait()
    assert trio.current_time() < 60
