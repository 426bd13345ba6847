"""What ``/metrics`` says while the registry cannot keep up (docs/alerting.md): a scrape never waits on the registry
past its budget, and a job's progress is what the supervisor knows -- the beats it took and could not write yet
included. On a virtual clock: the lock's minutes pass in no time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio
import trio.testing

from supervisor import Config, RegistryUnavailable, Supervisor, load_kinds
from supervisor.core import SCRAPE_BUDGET_S
from supervisor.domain import Progress, hash_token
from supervisor.execution.memory import MemoryExecutor
from supervisor.registry import MemoryRegistry, NewJob, PromoteRequest, RegistryFault

EPOCH = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)


def wall() -> datetime:
    return EPOCH + timedelta(seconds=trio.current_time())


def gauge(text: str, name: str, job_id: str) -> float:
    [line] = [line for line in text.splitlines() if line.startswith(f"{name}{{job_id=\"{job_id}\"")]
    return float(line.rsplit(" ", 1)[1])


def sample(text: str, name: str) -> float | None:
    """The value of the unlabelled series ``name`` (None: absent)."""
    found = [line for line in text.splitlines() if line.startswith(f"{name} ")]
    return float(found[0].rsplit(" ", 1)[1]) if found else None


async def running_job(sup: Supervisor, token: str) -> str:
    """A running row with ``token`` as its job token (promoted through the registry, as the drainer does)."""
    queued = await sup.registry.enqueue(NewJob("sleep", {"seconds": 60.0}, ["true"]))
    await sup.registry.promote(PromoteRequest(10, sup.boot_id, [hash_token(token)], sup.log_dir))
    return queued.job.job_id


def boot(nursery: trio.Nursery, tmp_path: Path, registry: MemoryRegistry) -> Supervisor:
    config = Config(data_dir=tmp_path / "data", bind_port=0, max_concurrent=10)
    sup = Supervisor(config, load_kinds(None), registry, executor=MemoryExecutor({}, nursery), wall_clock=wall,
                     standalone=True)  # fmt: skip
    sup.attach(nursery)
    return sup


async def test_INV_PROGRESS_NOT_LIVENESS_a_progressing_job_shows_its_progress_while_the_registry_cannot_write_its_beats(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = MemoryRegistry(clock=wall, outbox=False)
    sup = boot(nursery, tmp_path, registry)
    job_id = await running_job(sup, "t1")
    started = gauge((await sup.render_metrics()).decode(), "podcast_job_last_progress_timestamp_seconds", job_id)
    assert started == wall().timestamp()

    async def locked(*args: object, **kwargs: object) -> None:
        raise RegistryUnavailable("database is locked")

    monkeypatch.setattr(registry, "record_heartbeats", locked)  # another process holds the write lock
    for units in range(1, 11):  # a beat every 10 s for 100 s, the watermark rising each time; none written
        await trio.sleep(10)
        sup.heartbeats.take(await sup.heartbeats.admit(job_id, "t1"), Progress(units, None, None))
        text = (await sup.render_metrics()).decode()
        assert gauge(text, "podcast_job_last_progress_timestamp_seconds", job_id) == wall().timestamp()
        assert gauge(text, "podcast_job_completed_units", job_id) == units
    assert (await registry.get(job_id)).completed_units == 0  # the row never had them
    # Beats without progress: the heartbeat moves, the progress does not.
    rose = wall().timestamp()
    await trio.sleep(30)
    sup.heartbeats.take(await sup.heartbeats.admit(job_id, "t1"), Progress(10, None, None))
    text = (await sup.render_metrics()).decode()
    assert gauge(text, "podcast_job_last_progress_timestamp_seconds", job_id) == rose
    assert gauge(text, "podcast_job_last_heartbeat_timestamp_seconds", job_id) == wall().timestamp()


async def test_a_scrape_never_waits_on_a_registry_that_does_not_answer_past_its_budget(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = MemoryRegistry(clock=wall, outbox=False)
    sup = boot(nursery, tmp_path, registry)
    job_id = await running_job(sup, "t1")
    text = (await sup.render_metrics()).decode()
    assert sample(text, "podcast_metrics_registry_age_seconds") == 0
    gate = trio.Event()
    real = registry.counts

    async def hangs() -> dict[str, int]:
        await gate.wait()  # a read stuck behind the registry (a database cut off)
        return await real()

    monkeypatch.setattr(registry, "counts", hangs)
    await trio.sleep(5)
    for _ in range(3):
        before = trio.current_time()
        with trio.fail_after(2 * SCRAPE_BUDGET_S):
            text = (await sup.render_metrics()).decode()
        assert trio.current_time() - before == pytest.approx(SCRAPE_BUDGET_S)
        # The last read, and its age (it began at 0); the job's series as that read found them.
        assert sample(text, "podcast_metrics_registry_age_seconds") == pytest.approx(trio.current_time())
        assert gauge(text, "podcast_job_running", job_id) == 1
        await trio.sleep(10)
    gate.set()  # the registry answers again: the next scrape is fresh
    await trio.sleep(1)
    text = (await sup.render_metrics()).decode()
    assert sample(text, "podcast_metrics_registry_age_seconds") == 0


async def test_a_registry_fault_is_shown_with_its_start(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry that cannot write pages even with no job waiting (the outbox lives in it): its gauge and its start,
    from the registry's own fault (no read)."""
    registry = MemoryRegistry(clock=wall, outbox=False)
    sup = boot(nursery, tmp_path, registry)
    text = (await sup.render_metrics()).decode()
    assert sample(text, "podcast_registry_writes_failing") == 0
    assert sample(text, "podcast_registry_writes_failing_since_timestamp_seconds") is None
    since = wall() + timedelta(seconds=42)
    monkeypatch.setattr(registry, "fault", lambda: RegistryFault(since, "database is locked", 3))
    text = (await sup.render_metrics()).decode()
    assert sample(text, "podcast_registry_writes_failing") == 1
    assert sample(text, "podcast_registry_writes_failing_since_timestamp_seconds") == since.timestamp()
