"""A schedule left without runs is noticed: once its last tick (a job made, or a tick skipped, coalesced or replayed)
is older than twice its period, a log line, a metric and one webhook say so -- once, until its timer fires again and
stops again (docs/operations.md, "Periodic runs")."""

from __future__ import annotations

from supervisor.domain import RequestKey, Schedule
from supervisor.registry import EnqueueResult as Enqueued
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


async def _tick(sc: Scenario, kind: str, schedule: Schedule) -> Enqueued:
    """One firing of the schedule's timer, as ``supervisor enqueue --schedule`` sends it: keyed by its tick."""
    assert sc.supervisor is not None
    key = RequestKey(schedule.key(schedule.tick(sc.now())))
    return await sc.supervisor.enqueue(kind, {}, idempotency_key=key, schedule=schedule)


def _missed(sc: Scenario) -> list[tuple[str, str]]:
    return [(hook["job"]["schedule"], hook["job"]["newest_job_id"]) for hook in sc.webhooks()
            if hook["event"] == "schedule.missed"]  # fmt: skip


async def test_INV_EVERY_TICK_COUNTS_ticks_skipped_while_a_long_job_runs_are_no_missed_run(
    supervisor_scenario: Scenario,
) -> None:
    sc = supervisor_scenario
    await sc.start(kinds={"long": sc.script(run_for=5 * 3600)}, sweep_interval_s=30)
    assert sc.supervisor is not None
    hourly = Schedule("backup", 3600.0, if_idle=True)
    first = (await _tick(sc, "long", hourly)).job.job_id
    for _ in range(4):  # every hour, while the 5-hour job runs: each tick skipped, none makes a job
        await sc.advance(3600)
        assert (await _tick(sc, "long", hourly)).skipped
        # A timer that fires twice within its period: the second is its key's replay, a tick all the same.
        assert (await _tick(sc, "long", hourly)).skipped
    await sc.advance(3600 - 1)  # 4 h 59 min 59 s: no job since the first, a tick every hour
    assert _missed(sc) == []
    assert [line for line in sc.log() if line["event"] == "schedule_missed"] == []
    assert 'podcast_schedule_missed{schedule="backup"} 0.0' in (await sc.supervisor.render_metrics()).decode()
    # The timer stops (its last tick at 4 h): missed once two periods have passed since that tick.
    await sc.advance(3600 + 30)
    assert _missed(sc) == []
    await sc.advance(60)
    assert _missed(sc) == [("backup", first)]
    assert 'podcast_schedule_missed{schedule="backup"} 1.0' in (await sc.supervisor.render_metrics()).decode()
    await sc.advance(5 * 3600)
    assert _missed(sc) == [("backup", first)]  # said once


async def test_INV_EVERY_TICK_COUNTS_ticks_that_coalesce_into_a_queued_job_are_no_missed_run(
    supervisor_scenario: Scenario,
) -> None:
    sc = supervisor_scenario
    # One at a time, the first run never ends: from the second tick on, a job waits in the queue, and each tick after
    # coalesces into it (the kind's `coalesce = true`, read from a kinds file as serve reads it).
    kinds = '[kinds.feed]\nargv = ["feed"]\ncoalesce = true\nmax_running = 1\n'
    await sc.start(kinds_toml=kinds, behave={"feed": sc.script(run_for=None)}, sweep_interval_s=30)
    sup = sc.supervisor
    assert sup is not None
    hourly = Schedule("feed-a", 3600.0)

    async def coalescing_tick() -> Enqueued:
        # What `supervisor enqueue feed --schedule feed-a --every 1h` asks: the tick's key, the schedule.
        key = RequestKey(hourly.key(hourly.tick(sc.now())))
        return await sup.enqueue("feed", {}, idempotency_key=key, schedule=hourly)

    await coalescing_tick()
    await sc.advance(3600)
    waiting = (await coalescing_tick()).job.job_id  # the first still runs: this one waits
    for _ in range(4):
        await sc.advance(3600)
        answered = await coalescing_tick()
        assert answered.coalesced and answered.job.job_id == waiting
    await sc.advance(3600 - 1)
    assert _missed(sc) == []
    assert 'podcast_schedule_missed{schedule="feed-a"} 0.0' in (await sup.render_metrics()).decode()
    await sc.advance(3600 + 90)  # the timer stopped at its last tick: two periods later, missed
    assert _missed(sc) == [("feed-a", waiting)]
