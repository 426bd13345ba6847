"""A retry never makes a second writer (ADR 0001 §6): a row the operator's reconcile marked stale while its process
ran ended on a word, not on proof; its retry is refused while that process may run, and allowed once it is gone."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest
from core_helpers import age_started, pid_of, poll, wait_running, wait_terminal  # type: ignore[import-not-found]

from supervisor import JobStatus, Supervisor
from supervisor.domain import Conflict
from supervisor.registry import EnqueueResult as Enqueued
from supervisor.testing import Scenario


async def test_a_live_stale_jobs_retry_is_refused_until_its_process_is_gone(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"work": sc.script(run_for=20)}, stale_after_s=2)
    job_id = await sc.enqueue("work")
    await sc.advance(3)
    assert sc.supervisor is not None
    report = await sc.supervisor.operator_reconcile()
    [detail] = report.details
    assert (detail.action, detail.liveness, detail.still_running) == ("stale", "alive", True)
    assert "job_marked_stale_while_running" in [line["event"] for line in sc.log()]
    with pytest.raises(Conflict, match="still running") as refused:
        await sc.supervisor.retry(job_id)
    assert "memory-" in str(refused.value)  # names the process (its recorded identity)
    await sc.advance(5)
    assert sc.executor.started == [job_id]  # nothing else started
    await sc.advance(20)  # the first process ends on its own
    retried = await sc.supervisor.retry(job_id)
    await sc.advance(21)
    assert (await sc.job(retried.job.job_id)).status == "succeeded"


async def test_a_stale_jobs_retry_is_refused_while_its_real_process_lives(
    make_supervisor: Callable[..., Supervisor],
) -> None:
    sup = make_supervisor(stale_after_s=1.0)
    job = await wait_running(sup, (await sup.enqueue("sleep", {"seconds": 60})).job.job_id)
    age_started(sup, job.job_id, 5)  # past the operator's window, without waiting for it
    report = await sup.operator_reconcile()
    assert [(d.action, d.still_running) for d in report.details] == [("stale", True)]
    with pytest.raises(Conflict, match=r"pid \d+.* is still running"):
        await sup.retry(job.job_id)
    assert (await sup.get(job.job_id)).status is JobStatus.STALE
    # The process is stopped (here: by the test, as the operator would), and the retry goes through once the
    # evidence says it is gone (the shepherd reaps it a moment after the kill).
    pid = pid_of(job)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    async def accepted() -> Enqueued | None:
        try:
            return await sup.retry(job.job_id)
        except Conflict:
            return None

    retried = await poll(accepted, timeout_s=10)
    assert (await wait_running(sup, retried.job.job_id)).status is JobStatus.RUNNING
    await sup.cancel(retried.job.job_id)
    await wait_terminal(sup, retried.job.job_id)
