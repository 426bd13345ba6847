"""A schedule left without runs is noticed (Periodic runs): once its newest job is older than twice its period, a log
line, a metric and one webhook say so -- once, until a new run comes and stops coming again."""

from __future__ import annotations

from supervisor.domain import Schedule
from supervisor.testing import Scenario


async def test_a_schedule_without_runs_for_two_periods_is_said_once(supervisor_scenario: Scenario) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"feed": sc.script(run_for=60)}, sweep_interval_s=30)
    assert sc.supervisor is not None
    hourly = Schedule("feed-a", 3600.0)
    first = (await sc.supervisor.enqueue("feed", {}, schedule=hourly)).job.job_id
    await sc.advance(2 * 3600)  # exactly two periods: not yet missed
    missed = [hook for hook in sc.webhooks() if hook["event"] == "schedule.missed"]
    assert missed == []
    await sc.advance(60)
    await sc.advance(5 * 3600)  # and hours more: still one announcement
    missed = [hook for hook in sc.webhooks() if hook["event"] == "schedule.missed"]
    assert [(hook["job"]["schedule"], hook["job"]["newest_job_id"]) for hook in missed] == [("feed-a", first)]
    assert [line["schedule"] for line in sc.log() if line["event"] == "schedule_missed"] == ["feed-a"]
    assert 'podcast_schedule_missed{schedule="feed-a"} 1.0' in (await sc.supervisor.render_metrics()).decode()
    await sc.supervisor.enqueue("feed", {}, schedule=hourly)  # the timer is back
    await sc.advance(60)
    assert 'podcast_schedule_missed{schedule="feed-a"} 0.0' in (await sc.supervisor.render_metrics()).decode()
