"""History that does not grow forever: the sweeper removes finished jobs past the retention -- their rows,
each attempt's log and the shepherd's records beside it -- oldest first, a small batch at most once a minute; never a
queued job. On a virtual clock: a day of retention passes in no time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from supervisor import Config, JobStatus, Supervisor, load_kinds
from supervisor.domain import JobNotFound, RequestKey
from supervisor.execution.memory import MemoryExecutor
from supervisor.registry import Ending, MemoryRegistry, NewJob, Outcome, PromoteRequest, Retry, hash_token

EPOCH = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
FAILED = Ending(Outcome(JobStatus.FAILED, "exit_code_1"), exit_code=1)
DAY_S = 86400.0


def wall() -> datetime:
    """The wall clock as the virtual clock moves it."""
    return EPOCH + timedelta(seconds=trio.current_time())


async def finish(registry: MemoryRegistry, log_dir: Path, n: int, *, attempts: int = 1) -> tuple[str, list[Path]]:
    """A job that ran ``attempts`` times (each writing its log and records) and failed; its id and files."""
    await registry.enqueue(NewJob("k", {"n": n}, ["run"]))
    files: list[Path] = []
    job_id = ""
    for attempt in range(1, attempts + 1):
        [job] = (await registry.promote(PromoteRequest(1, "boot", [hash_token(f"{n}.{attempt}")], log_dir))).jobs
        job_id = job.job_id
        assert job.log_path is not None
        log = Path(job.log_path)
        for path in (log, log.with_suffix(".pid"), log.with_suffix(".exit")):
            await trio.to_thread.run_sync(path.write_text, "x")
            files.append(path)
        retry = Retry(wall(), "exit_code_1") if attempt < attempts else None
        await registry.finalize(job_id, Ending(FAILED.outcome, exit_code=1, retry=retry))
    return job_id, files


def exists(paths: list[Path]) -> list[bool]:
    return [path.exists() for path in paths]


@pytest.fixture
def supervisor(nursery: trio.Nursery, tmp_path: Path) -> Supervisor:
    config = Config(
        data_dir=tmp_path / "data", bind_port=0, retention_days=1.0, retention_max_jobs=None, sweep_interval_s=30.0
    )
    registry = MemoryRegistry(clock=wall, outbox=False)
    machine = MemoryExecutor({}, nursery)
    sup = Supervisor(config, load_kinds(None), registry, executor=machine, wall_clock=wall, standalone=True)
    sup.attach(nursery)
    sup.log_dir.mkdir(parents=True)
    return sup


async def test_the_sweeper_prunes_finished_jobs_past_the_retention_a_batch_a_minute_with_their_files(
    autojump_clock: trio.testing.MockClock, supervisor: Supervisor
) -> None:
    sup, registry = supervisor, supervisor.registry
    assert isinstance(registry, MemoryRegistry)
    sup.pruner.batch_jobs = 2
    jobs = []
    for n in range(4):
        jobs.append(await finish(registry, sup.log_dir, n))
        await trio.sleep(1)
    jobs.append(await finish(registry, sup.log_dir, 4, attempts=2))  # <id>.log and <id>.2.log, each with records
    assert [path.name for path in jobs[4][1]][3:] == [f"{jobs[4][0]}.2.{ext}" for ext in ("log", "pid", "exit")]
    await registry.set_paused(True, by="operator")  # the queued job stays queued
    queued = await registry.enqueue(NewJob("k", {"n": 99}, ["run"]))
    bystander = sup.log_dir / "not-a-job.log"
    await trio.to_thread.run_sync(bystander.write_text, "x")

    await sup.sweeper.sweep()  # within the retention: nothing goes
    assert (await registry.counts())["failed"] == 5
    await trio.sleep(DAY_S + 60)

    with capture_logs() as logs:
        await sup.sweeper.sweep()
    [pruned] = [e for e in logs if e["event"] == "jobs_pruned"]
    assert (pruned["jobs"], pruned["files_removed"]) == (2, 6)
    for job_id, files in jobs[:2]:  # the oldest first
        with pytest.raises(JobNotFound):
            await registry.get(job_id)
        assert exists(files) == [False] * 3
    assert all(all(exists(files)) for _, files in jobs[2:])

    await sup.sweeper.sweep()  # less than a minute later: no batch
    assert (await registry.counts())["failed"] == 3
    await trio.sleep(60)
    await sup.sweeper.sweep()
    assert (await registry.counts())["failed"] == 1
    await trio.sleep(60)
    await sup.sweeper.sweep()
    assert (await registry.counts())["failed"] == 0
    assert exists(jobs[4][1]) == [False] * 6  # every attempt's log and records
    assert (await registry.get(queued.job.job_id)).status is JobStatus.QUEUED  # never a queued job
    assert bystander.exists()  # only a pruned job's own files


async def test_retention_off_prunes_nothing(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    config = Config(data_dir=tmp_path / "data", bind_port=0, retention_days=None, retention_max_jobs=None)
    registry = MemoryRegistry(clock=wall, outbox=False)
    machine = MemoryExecutor({}, nursery)
    sup = Supervisor(config, load_kinds(None), registry, executor=machine, wall_clock=wall, standalone=True)
    sup.attach(nursery)
    sup.log_dir.mkdir(parents=True)
    job_id, files = await finish(registry, sup.log_dir, 0)
    await trio.sleep(365 * DAY_S)
    await sup.sweeper.sweep()
    assert await sup.prune(dry_run=False, limit=10) == []
    assert (await registry.get(job_id)).status is JobStatus.FAILED
    assert all(exists(files))


async def test_the_count_rule_keeps_the_newest_finished_jobs(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    config = Config(data_dir=tmp_path / "data", bind_port=0, retention_days=None, retention_max_jobs=2)
    registry = MemoryRegistry(clock=wall, outbox=False)
    machine = MemoryExecutor({}, nursery)
    sup = Supervisor(config, load_kinds(None), registry, executor=machine, wall_clock=wall, standalone=True)
    sup.attach(nursery)
    sup.log_dir.mkdir(parents=True)
    jobs = []
    for n in range(3):
        jobs.append(await finish(registry, sup.log_dir, n))
        await trio.sleep(1)
    would = await sup.prune(dry_run=True, limit=10)
    assert [job.job_id for job in would] == [jobs[0][0]]
    assert all(exists(jobs[0][1]))  # a dry run removes nothing
    await sup.sweeper.sweep()
    assert exists(jobs[0][1]) == [False] * 3
    assert [(await registry.get(job_id)).job_id for job_id, _ in jobs[1:]] == [jobs[1][0], jobs[2][0]]


async def test_the_sweeper_expires_idempotency_keys_and_a_keyed_job_outlives_the_retention_until_then(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A job a live key answered is kept past the retention until its key expires, so that a late retry
    still replays it; then the key goes, and the job after it."""
    config = Config(
        data_dir=tmp_path / "data",
        bind_port=0,
        retention_days=None,
        retention_max_jobs=1,
        idempotency_ttl_s=2 * DAY_S,
    )
    registry = MemoryRegistry(clock=wall, outbox=False)
    sup = Supervisor(config, load_kinds(None), registry, executor=MemoryExecutor({}, nursery), wall_clock=wall,
                     standalone=True)  # fmt: skip
    sup.attach(nursery)
    sup.log_dir.mkdir(parents=True)
    keyed = await sup.enqueue("pipeline", {"feed": "https://example.org/feed"}, idempotency_key=RequestKey("k-1"))
    await registry.request_cancel(keyed.job.job_id)  # finished (cancelled) at once
    for n in range(3):
        await finish(registry, sup.log_dir, n)
    await trio.sleep(DAY_S)
    with capture_logs() as logs:
        await sup.sweeper.sweep()
    assert [e for e in logs if e["event"] == "idempotency_keys_expired"] == []
    assert (await registry.get(keyed.job.job_id)).status is JobStatus.CANCELLED  # kept: its key is live
    assert (
        await sup.enqueue("pipeline", {"feed": "https://example.org/feed"}, idempotency_key=RequestKey("k-1"))
    ).replayed is not None
    await trio.sleep(DAY_S + 60)
    with capture_logs() as logs:
        await sup.sweeper.sweep()
    assert [e["rows"] for e in logs if e["event"] == "idempotency_keys_expired"] == [1]
    await trio.sleep(60)
    await sup.sweeper.sweep()
    with pytest.raises(JobNotFound):  # its key gone, retention takes it
        await registry.get(keyed.job.job_id)
    fresh = await sup.enqueue("pipeline", {"feed": "https://example.org/feed"}, idempotency_key=RequestKey("k-1"))
    assert fresh.replayed is None and fresh.job.job_id != keyed.job.job_id


async def test_keys_expire_with_retention_off(
    autojump_clock: trio.testing.MockClock, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Keys never pile up: they expire whatever the retention says of jobs."""
    config = Config(data_dir=tmp_path / "data", bind_port=0, retention_days=None, retention_max_jobs=None)
    registry = MemoryRegistry(clock=wall, outbox=False)
    sup = Supervisor(config, load_kinds(None), registry, executor=MemoryExecutor({}, nursery), wall_clock=wall,
                     standalone=True)  # fmt: skip
    sup.attach(nursery)
    first = await sup.enqueue("pipeline", {"feed": "https://example.org/feed"}, idempotency_key=RequestKey("k-1"))
    await trio.sleep(config.idempotency_ttl_s)
    with capture_logs() as logs:
        await sup.sweeper.sweep()
    assert [e["rows"] for e in logs if e["event"] == "idempotency_keys_expired"] == [1]
    assert (await registry.get(first.job.job_id)).idempotency_key == "k-1"  # the row keeps its key; it stays
