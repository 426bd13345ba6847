"""The scenario kit's surface, as a user of it sees it: every name used here comes from ``supervisor.testing``."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from supervisor.testing import SCENARIO_EPOCH, WEBHOOK_URL, Scenario, ScenarioError, Script, open_scenario


async def test_a_job_runs_its_script_in_virtual_time(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"work": sc.script(run_for=60, exit_code=3)})
    job_id = await sc.enqueue("work")
    await sc.advance(59)
    assert (await sc.job(job_id)).status == "running"
    await sc.advance(1)
    job = await sc.job(job_id)
    assert (job.status, job.exit_code, job.error_reason) == ("failed", 3, "exit_code_3")
    assert trio.current_time() == 60 and job.ended_at == sc.now() == SCENARIO_EPOCH.replace(minute=1)
    assert sc.executor.jobs[job_id].output == b"scripted job exits 3\n"


async def test_the_settings_are_the_configs_and_hold_the_queue(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"work": sc.script(run_for=100)}, max_concurrent=2)
    ids = [await sc.enqueue("work") for _ in range(5)]
    await sc.advance(1)
    assert [(await sc.job(i)).status for i in ids] == ["running"] * 2 + ["queued"] * 3
    await sc.advance(100)
    assert [(await sc.job(i)).status for i in ids] == ["succeeded"] * 2 + ["running"] * 2 + ["queued"]


async def test_webhooks_are_the_outboxs_deliveries_in_order(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"work": sc.script(run_for=5)})
    job_id = await sc.enqueue("work")
    await sc.advance(10)
    assert [(hook["event"], hook["job"]["status"]) for hook in sc.webhooks()] == [
        ("job.transition", "queued"),
        ("job.transition", "running"),
        ("job.transition", "succeeded"),
    ]
    assert {hook["job"]["job_id"] for hook in sc.webhooks()} == {job_id}
    assert {hook["boot_id"] for hook in sc.webhooks()} == {"boot-1"}
    assert WEBHOOK_URL.startswith("http://") and ".invalid/" in WEBHOOK_URL  # nothing reaches a network
    assert "job_spawned" in [line["event"] for line in sc.log()]


async def test_a_kill_from_outside_is_recorded_as_that_kill(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"work": sc.script()})
    job_id = await sc.enqueue("work")
    await sc.advance(1)
    sc.kill(job_id, "SIGTERM")
    await sc.advance(1)
    job = await sc.job(job_id)
    assert (job.status, job.error_reason, job.exit_code) == ("failed", "killed_by_SIGTERM", -15)


async def test_a_crash_loses_the_boot_not_its_jobs_and_the_restart_adopts_them(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"work": sc.script(run_for=600)})
    job_id = await sc.enqueue("work")
    await sc.advance(10)
    await sc.crash()
    assert sc.supervisor is None
    with pytest.raises(ScenarioError, match="no boot is running"):
        await sc.enqueue("work")
    await sc.advance(60)
    assert (await sc.job(job_id)).status == "running"  # the row, read while no supervisor runs
    await sc.restart()
    await sc.advance(600)
    job = await sc.job(job_id)
    assert (job.status, job.attempts) == ("succeeded", 1)  # adopted, never started twice
    assert sc.executor.started == [job_id]
    assert {hook["boot_id"] for hook in sc.webhooks()} == {"boot-1", "boot-2"}


async def test_heartbeats_reach_the_row_through_the_supervisors_own_calls(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"work": sc.script(run_for=3600, progress_every=60)})
    job_id = await sc.enqueue("work")
    await sc.advance(600)
    job = await sc.job(job_id)
    assert job.completed_units == 10 and job.last_heartbeat_at == sc.now()


async def test_misuse_is_a_clear_error_naming_what_is_wrong(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    with pytest.raises(ScenarioError, match="not started"):
        await sc.job("nope")
    with pytest.raises(TypeError, match="'sweep_s'"):
        await sc.start(kinds={"work": sc.script()}, sweep_s=5)
    with pytest.raises(Exception, match="max_concurrent") as bad:
        await sc.start(kinds={"work": sc.script()}, max_concurrent=0)
    assert type(bad.value).__name__ == "ConfigError"
    with pytest.raises(ValueError, match="beats_every"):
        sc.script(beats_every=0)
    with pytest.raises(ValueError, match="exit_code"):
        Script(exit_code=300)
    await sc.start(kinds={"work": sc.script()})
    with pytest.raises(ScenarioError, match="started already"):
        await sc.start(kinds={"work": sc.script()})
    with pytest.raises(ScenarioError, match="a boot is running"):
        await sc.restart()
    with pytest.raises(ScenarioError, match="no process"):
        sc.kill("not-a-job")
    with pytest.raises(Exception, match="unknown kind"):
        await sc.enqueue("other")


async def test_a_scenario_outside_virtual_time_says_so(tmp_path: object) -> None:
    # Not the fixture (which brings virtual time): open_scenario on the real clock is refused before anything runs.
    real = trio.lowlevel.current_clock()
    if isinstance(real, trio.testing.MockClock):
        pytest.skip("this test runs on a mock clock")
    with pytest.raises(ScenarioError, match="virtual time"):
        async with open_scenario(tmp_path):  # type: ignore[arg-type]
            pass
