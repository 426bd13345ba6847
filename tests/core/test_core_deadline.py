"""A kind's deadline_seconds, end to end: past it the attempt is stopped through the identity-verified path and ends
failed / deadline_exceeded, never resubmitted -- in virtual time with the production tree, across a restart, and
with a real process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import trio
from core_helpers import kinds_file_with, wait_terminal  # type: ignore[import-not-found]

from supervisor import JobStatus, Supervisor
from supervisor.testing import SCENARIO_EPOCH, Scenario


async def test_an_attempt_past_its_deadline_is_stopped_and_fails(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(
        kinds={"slow": sc.script(run_for=30, deadline_s=2, max_attempts=3)}, sweep_interval_s=1, cancel_grace_s=5
    )
    job_id = await sc.enqueue("slow")
    await sc.advance(2)
    assert (await sc.job(job_id)).status == "running"  # at the deadline: not past it
    await sc.advance(2 + 1)  # the first sweep past it stops it: SIGTERM ends this one at once
    job = await sc.job(job_id)
    assert (job.status, job.error_reason, job.exit_code, job.attempts) == ("failed", "deadline_exceeded", -15, 1)
    assert job.ended_at is not None and job.ended_at <= SCENARIO_EPOCH.replace(second=2 + 5 + 1)
    assert "deadline_job_terminating" in [line["event"] for line in sc.log()]


async def test_a_deadline_outlives_a_crash_of_the_supervisor(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"hung": sc.script(deadline_s=60, ignore_sigterm=True)}, cancel_grace_s=5)
    job_id = await sc.enqueue("hung")
    await sc.advance(30)
    await sc.crash()
    await sc.advance(60)  # past its deadline while no supervisor runs
    await sc.restart()  # the startup sweep finds it past the deadline of its recorded start, and stops it
    await sc.advance(5 + 1)
    job = await sc.job(job_id)
    assert (job.status, job.error_reason, job.exit_code) == ("failed", "deadline_exceeded", -9)  # SIGKILL after grace


SLOW = """
[kinds.slow]
argv = ["sleep", "{seconds}"]
params = { seconds = "float" }
deadline_seconds = 2
"""


async def test_a_real_process_past_its_deadline_is_stopped(
    make_supervisor: Callable[..., Supervisor], tmp_path: Path
) -> None:
    kinds = kinds_file_with(tmp_path, SLOW)
    sup = make_supervisor(kinds_file=kinds, cancel_grace_s=2)
    job_id = (await sup.enqueue("slow", {"seconds": 30})).job.job_id
    with trio.fail_after(20):
        while (await sup.get(job_id)).status is not JobStatus.FAILED:
            await sup.sweeper.sweep()  # the sweeper's step, driven here (this test runs no sweeper task)
            await trio.sleep(0.5)
    job = await wait_terminal(sup, job_id)
    assert (job.error_reason, job.exit_code) == ("deadline_exceeded", -15)


# -- a stop cut off by the supervisor's death (INV-STOP-REASON-BEFORE-SIGNAL) -------------------------------------


async def test_INV_STOP_REASON_BEFORE_SIGNAL_a_deadline_stop_cut_off_by_a_crash_ends_deadline_exceeded(
    supervisor_scenario: Scenario,
) -> None:
    """A job that cleans up on SIGTERM (modelled: the signal changes nothing, it exits 143 at 6 s), past a deadline of
    2 s: the boot that began the stop dies in the grace, the job exits while no supervisor runs, and the next boot,
    which reads only an exit 143, ends it as the stop planned."""
    sc = supervisor_scenario
    tidy = sc.script(run_for=6, exit_code=143, ignore_sigterm=True, deadline_s=2, max_attempts=3)
    await sc.start(kinds={"tidy": tidy}, sweep_interval_s=1, cancel_grace_s=30)
    job_id = await sc.enqueue("tidy")
    await sc.advance(3.5)  # the sweep at 3 s, past the deadline, began the stop
    assert [line["event"] for line in sc.log()].count("deadline_job_terminating") == 1
    assert (await sc.job(job_id)).stop_reason == "deadline"  # on the row before the signal
    await sc.crash()
    await sc.advance(5)  # it exits 143 at 6 s, while no supervisor runs
    await sc.restart()
    await sc.advance(1)
    job = await sc.job(job_id)
    assert (job.status, job.error_reason, job.exit_code, job.attempts) == ("failed", "deadline_exceeded", 143, 1)
    assert job.history == ()  # never resubmitted


async def test_INV_STOP_REASON_BEFORE_SIGNAL_a_stall_stop_cut_off_by_a_crash_ends_as_a_stall(
    supervisor_scenario: Scenario,
) -> None:
    """The same cut-off stop for a stall under stall_action = terminate: the attempt ends stale / progress_stalled (its
    rule: resubmitted while attempts remain, as a stall), never recorded as the exit_code_143 the next boot reads."""
    sc = supervisor_scenario
    stuck = sc.script(run_for=8, exit_code=143, ignore_sigterm=True, max_attempts=2, retry_backoff_s=600)
    await sc.start(
        kinds={"stuck": stuck},
        sweep_interval_s=1,
        cancel_grace_s=30,
        progress_stale_after_s=2,
        stall_action="terminate",
    )
    job_id = await sc.enqueue("stuck")
    await sc.advance(4.5)  # no progress for more than 2 s: stopped
    assert "stalled_job_terminating" in [line["event"] for line in sc.log()]
    await sc.crash()
    await sc.advance(5)  # it exits 143 at 8 s, while no supervisor runs
    await sc.restart()
    await sc.advance(1)
    job = await sc.job(job_id)
    assert (job.status, job.attempts) == ("queued", 1)  # resubmitted under the stall's rule, after its backoff
    [attempt] = job.history
    assert (attempt.status, attempt.reason, attempt.exit_code) == ("stale", "progress_stalled", 143)
    assert job.stop_reason is None  # the next attempt begins with no stop


async def test_INV_STOP_REASON_BEFORE_SIGNAL_a_boot_that_adopts_a_job_being_stopped_carries_the_stop_on(
    supervisor_scenario: Scenario,
) -> None:
    """The next boot comes back while the job still runs (it ignores SIGTERM): it adopts the job and carries the
    recorded stall stop on at once -- SIGTERM, SIGKILL after its grace -- without judging the stall again."""
    sc = supervisor_scenario
    await sc.start(
        kinds={"stuck": sc.script(ignore_sigterm=True)},
        sweep_interval_s=1,
        cancel_grace_s=10,
        progress_stale_after_s=2,
        stall_action="terminate",
    )
    job_id = await sc.enqueue("stuck")
    await sc.advance(4.5)  # stalled at the sweep at 3 s: stopped, the SIGTERM ignored
    await sc.crash()
    await sc.advance(0.5)
    await sc.restart()  # at 5 s: the stop's grace begins anew here
    await sc.advance(10 + 1)
    job = await sc.job(job_id)
    assert (job.status, job.error_reason, job.exit_code, job.attempts) == ("stale", "progress_stalled", -9, 1)
    assert job.ended_at is not None and job.ended_at <= SCENARIO_EPOCH.replace(second=5 + 10 + 1)
    said = [line["event"] for line in sc.log()]
    assert said.count("stalled_job_terminating") == 1  # begun once, by the first boot; carried on by the second
