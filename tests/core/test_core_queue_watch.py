"""The queue's own watch: the stuck rule, said once when it starts and once when it ends; never for a
queue that is only busy. The rule is pure (its observations carry their own times); the supervisor's side runs on a
virtual clock: hours of waiting pass in no time."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from supervisor import Config, RegistryUnavailable, Supervisor, load_kinds
from supervisor.core import HOLD_REASONS, NOT_PROMOTED, ROOT_CAUSE_ORDER, QueueRule
from supervisor.execution.memory import MemoryExecutor
from supervisor.observe import render_event
from supervisor.registry import MemoryRegistry, OutboxEvent

EPOCH = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
STUCK_S, PAUSE_S = 900.0, 21600.0


def look(rule: QueueRule, at_s: float, *, held: set[str] = set(), waiting: bool = True, free: int = 1) -> object:  # noqa: B006
    return rule.observe(
        now_s=at_s,
        now=EPOCH + timedelta(seconds=at_s),
        held=held,
        oldest_job_id="j1" if waiting else None,
        oldest_age_s=at_s,
        free_slots=free,
    )


def test_a_busy_queue_is_never_stuck() -> None:
    rule = QueueRule(STUCK_S, PAUSE_S)
    for at in range(0, 10 * int(STUCK_S), 30):  # every slot running, jobs waiting, for ten thresholds
        assert look(rule, at, free=0) is None
    assert rule.stuck is None


def test_a_hold_is_stuck_past_the_threshold_said_once_and_moving_once_when_it_clears() -> None:
    rule = QueueRule(STUCK_S, PAUSE_S)
    assert look(rule, 0, held={"engine_unreachable"}) is None
    assert look(rule, STUCK_S, held={"engine_unreachable"}) is None  # longer than, not as long as
    what, stuck = look(rule, STUCK_S + 30, held={"engine_unreachable"})  # type: ignore[misc]
    assert (what, stuck.reason, stuck.since, stuck.oldest_job_id) == ("stuck", "engine_unreachable", EPOCH, "j1")
    assert rule.held_since() == {"engine_unreachable": EPOCH}
    for at in range(int(STUCK_S) + 60, 3 * int(STUCK_S), 30):
        assert look(rule, at, held={"engine_unreachable"}) is None  # never repeated at every sweep
    what, ended = look(rule, 3 * STUCK_S, held=set(), free=0)  # type: ignore[misc]
    assert (what, ended.reason) == ("moving", "engine_unreachable")
    assert look(rule, 3 * STUCK_S + 30, free=0) is None and rule.held_since() == {}


def test_jobs_waiting_behind_a_pause_are_stuck_only_past_the_pause_threshold() -> None:
    rule = QueueRule(STUCK_S, PAUSE_S)
    assert all(look(rule, at, held={"pause_file"}, free=0) is None for at in range(0, int(PAUSE_S) + 1, 600))
    what, stuck = look(rule, PAUSE_S + 600, held={"pause_file"}, free=0)  # type: ignore[misc]
    assert (what, stuck.reason) == ("stuck", "pause_file")
    # A hold that is not a pause names itself, not the pause, while both hold.
    assert look(rule, PAUSE_S + 630, held={"pause_file", "lease_not_fresh"}) is None
    assert rule.stuck is not None and rule.stuck.reason == "lease_not_fresh"


def test_one_registry_fault_names_its_root_cause_once_not_the_lease_it_starves() -> None:
    """A lock held elsewhere: the registry's writes fail, then the lease (a write) goes stale; the registry writes
    again a moment before the lease is renewed. One stuck queue, one reason: the registry (it paged twice, first the
    registry then the lease, when the alphabetically first reason won)."""
    assert sorted(ROOT_CAUSE_ORDER) == sorted(HOLD_REASONS)
    rule = QueueRule(STUCK_S, PAUSE_S)
    look(rule, 0, held={"registry_unwritable"})
    what, stuck = look(rule, STUCK_S + 30, held={"registry_unwritable"})  # type: ignore[misc]
    assert (what, stuck.reason) == ("stuck", "registry_unwritable")
    assert look(rule, STUCK_S + 60, held={"registry_unwritable", "lease_not_fresh"}) is None
    assert rule.stuck is not None and rule.stuck.reason == "registry_unwritable"
    assert look(rule, STUCK_S + 90, held={"lease_not_fresh"}) is None  # its echo, until the next renewal
    assert rule.stuck is not None and rule.stuck.reason == "registry_unwritable"
    what, ended = look(rule, STUCK_S + 120, held=set(), free=0)  # type: ignore[misc]
    assert (what, ended.reason) == ("moving", "registry_unwritable")
    # Every hold at once: the root cause is named, whatever the names' order.
    both = QueueRule(STUCK_S, PAUSE_S)
    everything = {"lease_not_fresh", "engine_unreachable", "registry_unwritable", "pause_file"}
    look(both, 0, held=everything)
    what, stuck = look(both, STUCK_S + 30, held=everything)  # type: ignore[misc]
    assert stuck.reason == "registry_unwritable"
    # The lease alone is a cause of its own (a host cut off from its database before any write failed).
    lease = QueueRule(STUCK_S, PAUSE_S)
    look(lease, 0, held={"lease_not_fresh", "engine_unreachable"})
    what, stuck = look(lease, STUCK_S + 30, held={"lease_not_fresh", "engine_unreachable"})  # type: ignore[misc]
    assert stuck.reason == "lease_not_fresh"


def test_a_break_starts_the_count_again_and_an_empty_queue_is_never_stuck() -> None:
    rule = QueueRule(STUCK_S, PAUSE_S)
    look(rule, 0, held={"registry_unwritable"})
    look(rule, STUCK_S - 10, held={"registry_unwritable"}, waiting=False)  # nothing waits: a break
    assert look(rule, STUCK_S + 30, held={"registry_unwritable"}) is None  # counted from 900 s again
    assert all(look(rule, at, held={"registry_unwritable"}, waiting=False) is None for at in range(0, 99999, 900))
    # Slots free, nothing holding, jobs waiting: the drainer should have promoted them.
    fresh = QueueRule(STUCK_S, PAUSE_S)
    look(fresh, 0)
    what, stuck = look(fresh, STUCK_S + 1)  # type: ignore[misc]
    assert (what, stuck.reason) == ("stuck", NOT_PROMOTED)


def wall() -> datetime:
    return EPOCH + timedelta(seconds=trio.current_time())


def boot(nursery: trio.Nursery, config: Config, registry: MemoryRegistry) -> Supervisor:
    """A supervisor on the memory machine and a virtual clock's wall time, driven by hand (its sweeps)."""
    sup = Supervisor(config, load_kinds(None), registry, executor=MemoryExecutor({}, nursery), wall_clock=wall,
                     standalone=True)  # fmt: skip
    sup.attach(nursery)
    return sup


async def test_a_queue_paused_too_long_is_said_stuck_in_the_log_metrics_health_and_queue_state(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    config = Config(data_dir=tmp_path / "data", bind_port=0, pause_warn_s=3600.0, queue_stuck_s=60.0)
    registry = MemoryRegistry(clock=wall, outbox=False)
    sup = boot(nursery, config, registry)
    await sup.pause()
    job = (await sup.enqueue("pipeline", {"feed": "https://example.org/feed"})).job
    with capture_logs() as logs:
        for _ in range(3):
            await sup.sweeper.sweep()
            await trio.sleep(1800)  # sweeps every half hour: an hour and a half behind the pause
        await sup.sweeper.sweep()
    stuck = [e for e in logs if e["event"] == "queue_stuck"]
    assert [(e["reason"], e["oldest_job_id"]) for e in stuck] == [("pause_operator", job.job_id)]
    assert (await sup.health()).degraded["queue"].endswith("pause_operator")
    state = await sup.queue_state()
    assert state.stuck is not None and state.stuck["reason"] == "pause_operator"
    assert set(state.held) == {"pause_operator"} and state.oldest_queued_age_s == 3 * 1800
    metrics = (await sup.render_metrics()).decode()
    assert 'podcast_queue_stuck{reason="pause_operator"} 1.0' in metrics
    assert 'podcast_queue_held{reason="pause_operator"} 1.0' in metrics
    assert 'podcast_queue_held{reason="engine_unreachable"} 0.0' in metrics
    with capture_logs() as logs:
        await sup.resume()  # the job is promoted: the queue moves
        await sup.sweeper.sweep()
        await sup.sweeper.sweep()
    assert [e["reason"] for e in logs if e["event"] == "queue_moving"] == ["pause_operator"]
    assert "queue" not in (await sup.health()).degraded


async def test_queue_stuck_and_moving_go_through_the_outbox_once_each_and_a_restart_does_not_say_stuck_twice(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The webhooks: one ``queue.stuck`` with the reason, the oldest job and its age, the free slots and
    the host; none at the sweeps after; a new boot on the same registry, the queue still stuck, announces nothing
    again; one ``queue.moving`` when it moves, rendered for a receiver with the queue's details in place of a row."""
    config = Config(data_dir=tmp_path / "data", bind_port=0, pause_warn_s=3600.0, host_id="h1")
    registry = MemoryRegistry(clock=wall, outbox=True)

    async def queue_events() -> list[OutboxEvent]:
        return [e for e in await registry.outbox_pending(1000) if e.event.startswith("queue.")]

    first = boot(nursery, config, registry)
    await first.pause()
    job = (await first.enqueue("pipeline", {"feed": "https://example.org/feed"})).job
    for _ in range(4):
        await first.sweeper.sweep()
        await trio.sleep(1800)
    [stuck] = await queue_events()
    assert (stuck.event, stuck.job_id, stuck.reason) == ("queue.stuck", job.job_id, "pause_operator")
    assert stuck.job["host_id"] == "h1" and stuck.job["oldest_job_id"] == job.job_id
    assert stuck.job["oldest_age_s"] > 3600 and stuck.job["free_slots"] == 1
    body = json.loads(render_event(stuck))
    assert body["queue"] == stuck.job and "job" not in body and body["event"] == "queue.stuck"

    # A restart: the pause still holds, the stuck queue was announced by the boot before.
    second = boot(nursery, config, registry)
    for _ in range(3):
        await second.sweeper.sweep()
        await trio.sleep(1800)
    assert [e.event for e in await queue_events()] == ["queue.stuck"]  # not twice
    assert (await second.health()).degraded["queue"].endswith("pause_operator")
    await second.resume()
    await second.sweeper.sweep()
    await second.sweeper.sweep()
    assert [e.event for e in await queue_events()] == ["queue.stuck", "queue.moving"]


async def test_a_webhook_the_registry_cannot_take_now_is_written_at_a_later_sweep_and_the_signals_stand(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk: the stuck queue is said in the log, the metric and the health at once; its webhook, which the
    registry cannot take yet, is written at the first sweep that can, once."""
    config = Config(data_dir=tmp_path / "data", bind_port=0, pause_warn_s=60.0, host_id="h1")
    registry = MemoryRegistry(clock=wall, outbox=True)
    sup = boot(nursery, config, registry)
    await sup.pause()
    await sup.enqueue("pipeline", {"feed": "https://example.org/feed"})
    await sup.sweeper.sweep()
    await trio.sleep(120)
    real = registry.record_queue_event

    async def full(*args: object, **kwargs: object) -> None:
        raise RegistryUnavailable("disk full")

    monkeypatch.setattr(registry, "record_queue_event", full)
    with capture_logs() as logs:
        await sup.sweeper.sweep()  # the step fails as a condition: the sweep goes on
        await sup.sweeper.sweep()
    assert [e["event"] for e in logs if e["event"] == "queue_stuck"] == ["queue_stuck"]  # said once, at once
    assert (await sup.queue_state()).stuck is not None
    assert "pause_operator" in (await sup.health()).degraded["queue"]
    assert [e for e in await registry.outbox_pending(100) if e.event.startswith("queue.")] == []
    monkeypatch.setattr(registry, "record_queue_event", real)
    await sup.sweeper.sweep()
    await sup.sweeper.sweep()
    assert [e.event for e in await registry.outbox_pending(100) if e.event.startswith("queue.")] == ["queue.stuck"]


async def test_a_host_cut_off_from_its_registry_still_says_its_stale_lease_holds_a_waiting_queue(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host partitioned from PostgreSQL can read nothing: its lease goes stale (the fleet's gate) and nothing is
    promoted here. The watch judges on what needs no read -- the stale lease -- and the queue as last read (a job
    waiting), so the log and the health say the queue stuck past the threshold; the webhook waits for the registry."""
    config = Config(data_dir=tmp_path / "data", bind_port=0, queue_stuck_s=60.0, host_id="h1")
    registry = MemoryRegistry(clock=wall, outbox=True)
    sup = boot(nursery, config, registry)
    await sup.pause()
    waiting = (await sup.enqueue("pipeline", {"feed": "https://example.org/feed"})).job
    # Read once: a job waits (behind a pause: a reason held on purpose, with its own threshold).
    await sup.sweeper.sweep()

    async def unreachable(*args: object, **kwargs: object) -> None:
        raise RegistryUnavailable("no connection to the database")

    for name in ("pause_state", "oldest_waiting", "running_jobs", "record_queue_event"):
        monkeypatch.setattr(registry, name, unreachable)
    monkeypatch.setattr(sup.boot.standing, "standalone", False)  # a fleet host whose lease went stale: no promotion
    with capture_logs() as logs:
        for _ in range(4):
            await sup.sweeper.sweep()
            await trio.sleep(30)
    stuck = [e for e in logs if e["event"] == "queue_stuck"]
    assert [(e["reason"], e["oldest_job_id"]) for e in stuck] == [("lease_not_fresh", waiting.job_id)]
    assert (await sup.health()).degraded["queue"].endswith("lease_not_fresh")
