"""Scenarios a kind's author writes, with only the names docs/testing.md documents: copied outside the project and
run with plain pytest by ``test_runbook_scenarios.py`` (as the page's own examples are)."""

from __future__ import annotations

import itertools

from supervisor.testing import Scenario

HOUR = 3600.0

KINDS = """
[kinds.scrape]
argv = ["scrape", "{feed}"]
params = { feed = "str", mode = { type = "str", default = "ok", choices = ["ok", "hang", "oom"] } }
max_attempts = 3
retry_backoff_seconds = 100
retry_backoff_max_seconds = 150
retry_on_exit_codes = [137]
heartbeats = true

[kinds.index]
argv = ["index"]
max_running = 1
deadline_seconds = 600
"""


def scrape(params: dict[str, object]) -> object:
    """How a scrape behaves, chosen from its params."""
    if params["mode"] == "hang":
        return Scenario.script(beats_every=5, progress_every=60, progress_until=600, ignore_sigterm=True)
    if params["mode"] == "oom":
        return Scenario.script(run_for=30, exit_code=137, beats_every=5)
    return Scenario.script(run_for=300, progress_every=10)


async def test_a_stalled_job_under_terminate_is_resubmitted_then_ends_stale(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(
        kinds_toml=KINDS.replace("[137]", "[137, 143]"),
        behave={"scrape": scrape},
        progress_stale_after_s=1800,
        stall_action="terminate",
        cancel_grace_s=30,
    )
    job_id = await sc.enqueue("scrape", feed="https://example.org/feed", mode="hang")
    job = await sc.advance_until_ended(job_id, within=6 * HOUR)
    assert (job.status, job.error_reason, job.attempts) == ("stale", "progress_stalled", 3)
    statuses = [t.status for t in sc.transitions(job_id)]
    assert statuses == ["queued", "running", "queued", "running", "queued", "running", "stale"]


async def test_exit_137_is_resubmitted_with_the_doubling_backoff_up_to_its_cap(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds_toml=KINDS, behave={"scrape": scrape})
    job_id = await sc.enqueue("scrape", feed="https://example.org/feed", mode="oom")
    job = await sc.advance_until_ended(job_id, within=HOUR)
    assert (job.status, job.exit_code, job.attempts) == ("failed", 137, 3)
    starts = [t.at for t in sc.transitions(job_id) if t.status == "running"]
    waits = [later - earlier - 30 for earlier, later in itertools.pairwise(starts)]
    assert 90 <= waits[0] <= 110 and 135 <= waits[1] <= 165  # 100 s, then 200 s capped at 150 s (jitter 0.9-1.1)


async def test_max_running_1_is_never_exceeded(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds_toml=KINDS, behave={"index": sc.script(run_for=60)}, max_concurrent=4)
    ids = [await sc.enqueue("index") for _ in range(4)]
    for job_id in ids:
        await sc.advance_until_ended(job_id, within=HOUR)
    running, peak = 0, 0
    for change in sc.transitions():
        running += {"running": 1}.get(change.status, 0) - (change.status in ("succeeded", "failed"))
        peak = max(peak, running)
    assert peak == 1
    assert (await sc.counts())["succeeded"] == 4


async def test_a_deadline_ends_a_job_deadline_exceeded(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds_toml=KINDS, behave={"index": sc.script(beats_every=5, progress_every=5)})
    job_id = await sc.enqueue("index")
    job = await sc.advance_until_ended(job_id, within=HOUR)
    assert (job.status, job.error_reason) == ("failed", "deadline_exceeded")
    assert job.ended_at is not None and job.started_at is not None
    assert 600 <= (job.ended_at - job.started_at).total_seconds() <= 600 + 60  # found at the sweep past it


async def test_a_crash_and_restart_adopts_the_running_job(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds_toml=KINDS, behave={"scrape": scrape})
    job_id = await sc.enqueue("scrape", feed="https://example.org/feed")
    await sc.advance(100)
    await sc.crash()
    await sc.advance(60)
    await sc.restart()
    job = await sc.advance_until_ended(job_id, within=HOUR)
    assert (job.status, job.attempts, job.completed_units) == ("succeeded", 1, 30)
    assert {t.boot_id for t in sc.transitions(job_id)} == {"boot-1", "boot-2"}


async def test_a_cancel_of_a_job_that_ignores_sigterm_kills_it_after_the_grace(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds_toml=KINDS, behave={"scrape": scrape}, cancel_grace_s=20)
    job_id = await sc.enqueue("scrape", feed="https://example.org/feed", mode="hang")
    await sc.advance(60)
    await sc.cancel(job_id)
    await sc.advance(19)
    assert (await sc.job(job_id)).status == "running"  # SIGTERM did nothing
    job = await sc.advance_until_ended(job_id, within=2)
    assert (job.status, job.exit_code) == ("cancelled", -9)


async def test_pause_holds_the_queue_and_resume_lets_it_go(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds_toml=KINDS, behave={"index": sc.script(run_for=10)})
    await sc.pause()
    job_id = await sc.enqueue("index")
    await sc.advance(HOUR)
    assert (await sc.job(job_id)).status == "queued"
    await sc.resume()
    assert (await sc.advance_until_ended(job_id, within=60)).status == "succeeded"
    sc.pause_file()  # the operator's `touch`: seen at the next sweep
    held = await sc.enqueue("index")
    await sc.advance(HOUR)
    assert (await sc.job(held)).status == "queued"
    sc.pause_file(present=False)
    assert (await sc.advance_until_ended(held, within=120)).status == "succeeded"
