"""The registry's operations, each with the invariant it upholds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from supervisor import (
    IllegalTransition,
    JobNotFound,
    JobStatus,
    SqliteRegistry,
    Unauthorized,
    ValidationError,
)
from supervisor._registry import SCHEMA_VERSION, hash_token


def _enqueue(reg: SqliteRegistry, n: int = 1, kind: str = "k", key: str | None = None) -> list[str]:
    return [reg.enqueue(kind, {"i": i}, ["true"], coalesce_key=key).job.job_id for i in range(n)]


def _promote(reg: SqliteRegistry, max_concurrent: int = 1, boot: str = "boot-a"):
    return reg.promote_queued_if_slot(max_concurrent, boot_id=boot, token_hash=hash_token("t"))


def test_enqueue_creates_a_queued_row_with_position(registry: SqliteRegistry) -> None:
    a, b = _enqueue(registry, 2)
    job = registry.get(b)
    assert job.status is JobStatus.QUEUED
    assert job.queue_position == 2
    assert registry.get(a).queue_position == 1
    assert job.created_at.endswith("+00:00")


def test_promotion_is_fifo(registry: SqliteRegistry) -> None:
    ids = _enqueue(registry, 3)
    promoted = []
    for _ in ids:
        job = _promote(registry)
        assert job is not None
        promoted.append(job.job_id)
        registry.finalize(job.job_id, JobStatus.SUCCEEDED)
    assert promoted == ids


def test_promotion_never_overshoots_max_concurrent_INV_PROMOTION_NEVER_OVERSHOOTS(registry: SqliteRegistry) -> None:
    _enqueue(registry, 5)
    got = [_promote(registry, max_concurrent=2) for _ in range(5)]
    assert sum(j is not None for j in got) == 2
    assert registry.counts()["running"] == 2


def test_promotion_records_boot_and_start_in_the_same_step_INV_RUNNING_MEANS_SPAWNED_OR_SPAWNING(
    registry: SqliteRegistry,
) -> None:
    _enqueue(registry)
    job = _promote(registry, boot="boot-x")
    assert job is not None
    assert job.status is JobStatus.RUNNING
    assert job.boot_id == "boot-x"
    assert job.started_at is not None
    assert job.attempts == 1
    assert not job.spawned


def test_coalescing_returns_the_queued_row(registry: SqliteRegistry) -> None:
    first = registry.enqueue("enrichment", {}, ["x"], coalesce_key="K")
    second = registry.enqueue("enrichment", {}, ["x"], coalesce_key="K")
    assert not first.coalesced
    assert second.coalesced
    assert second.job.job_id == first.job.job_id
    other = registry.enqueue("enrichment", {"p": 1}, ["x"], coalesce_key="K2")
    assert other.job.job_id != first.job.job_id


def test_a_running_row_never_absorbs_a_new_one(registry: SqliteRegistry) -> None:
    first = registry.enqueue("enrichment", {}, ["x"], coalesce_key="K").job
    assert _promote(registry) is not None
    second = registry.enqueue("enrichment", {}, ["x"], coalesce_key="K")
    assert not second.coalesced
    assert second.job.job_id != first.job_id
    assert second.job.status is JobStatus.QUEUED


def test_finalize_is_a_noop_on_a_terminal_row(registry: SqliteRegistry) -> None:
    _enqueue(registry)
    job = _promote(registry)
    assert job is not None
    first = registry.finalize(job.job_id, JobStatus.FAILED, reason="exit_code_3", exit_code=3)
    assert first.changed
    assert first.job.ended_at is not None
    again = registry.finalize(job.job_id, JobStatus.SUCCEEDED, exit_code=0)
    assert not again.changed
    assert again.job.status is JobStatus.FAILED
    assert again.job.error_reason == "exit_code_3"


def test_finalize_with_expect_pid_leaves_a_respawned_row_alone(registry: SqliteRegistry) -> None:
    _enqueue(registry)
    job = _promote(registry)
    assert job is not None
    registry.set_job_process(job.job_id, pid=111, pid_start_time=5, kernel_boot_id="k")
    result = registry.finalize(job.job_id, JobStatus.FAILED, reason="x", expect_pid=222)
    assert not result.changed
    assert result.job.status is JobStatus.RUNNING


def test_illegal_transition_raises(registry: SqliteRegistry) -> None:
    (job_id,) = _enqueue(registry)
    with registry._tx() as conn:
        job = registry._get_in(conn, job_id)
        with pytest.raises(IllegalTransition):
            registry._set_status(conn, job, JobStatus.SUCCEEDED)


def test_cancel_queued_row_ends_it_before_start(registry: SqliteRegistry) -> None:
    (job_id,) = _enqueue(registry)
    result = registry.request_cancel(job_id)
    assert result.changed
    assert result.job.status is JobStatus.CANCELLED
    assert result.job.error_reason == "cancelled_before_start"
    assert not registry.request_cancel(job_id).changed


def test_cancel_running_row_only_marks_the_request(registry: SqliteRegistry) -> None:
    _enqueue(registry)
    job = _promote(registry)
    assert job is not None
    result = registry.request_cancel(job.job_id)
    assert result.job.status is JobStatus.RUNNING
    assert result.job.cancel_requested


def test_unknown_job_is_not_found(registry: SqliteRegistry) -> None:
    with pytest.raises(JobNotFound):
        registry.get("nope")
    with pytest.raises(JobNotFound):
        registry.request_cancel("nope")


def test_heartbeat_watermark_moves_progress_only_when_it_grows_INV_PROGRESS_NOT_LIVENESS(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    reg = SqliteRegistry(tmp_path / "r.sqlite3", clock=lambda: now[0])
    reg.enqueue("k", {}, ["x"])
    job = reg.promote_queued_if_slot(1, boot_id="b", token_hash=hash_token("secret"))
    assert job is not None
    now[0] += timedelta(seconds=10)
    beat = reg.record_heartbeat(job.job_id, "secret", completed_units=2, total_units=5, stage="episodes")
    assert beat.completed_units == 2
    assert beat.last_progress_at == beat.last_heartbeat_at
    progress_at = beat.last_progress_at
    now[0] += timedelta(seconds=10)
    beat = reg.record_heartbeat(job.job_id, "secret", completed_units=1)  # a lower value never lowers it
    assert beat.completed_units == 2
    assert beat.last_progress_at == progress_at
    assert beat.last_heartbeat_at != progress_at
    assert beat.total_units == 5
    reg.close()


def test_heartbeat_refuses_another_token_and_a_finished_job(registry: SqliteRegistry) -> None:
    registry.enqueue("k", {}, ["x"])
    job = registry.promote_queued_if_slot(1, boot_id="b", token_hash=hash_token("mine"))
    assert job is not None
    with pytest.raises(Unauthorized):
        registry.record_heartbeat(job.job_id, "theirs", completed_units=1)
    ended = registry.finalize(job.job_id, JobStatus.SUCCEEDED).job
    assert ended.token_hash is None  # the token ends with the job
    with pytest.raises(Unauthorized):
        registry.record_heartbeat(job.job_id, "mine", completed_units=1)


def test_list_paging_is_stable_while_rows_are_added(registry: SqliteRegistry) -> None:
    ids = _enqueue(registry, 5)
    page1, cursor = registry.list_jobs(limit=2)
    assert [j.job_id for j in page1] == ids[::-1][:2]
    _enqueue(registry, 3)  # newer rows go on top and never shift the pages being read
    page2, cursor2 = registry.list_jobs(limit=2, cursor=cursor)
    page3, cursor3 = registry.list_jobs(limit=2, cursor=cursor2)
    assert [j.job_id for j in page2 + page3] == ids[::-1][2:]
    assert cursor3 is None
    assert [j.queue_position for j in page2 + page3] == [3, 2, 1]


def test_list_filters_and_rejects_bad_values(registry: SqliteRegistry) -> None:
    _enqueue(registry, 2, kind="a")
    _enqueue(registry, 1, kind="b")
    jobs, _ = registry.list_jobs(kind="b")
    assert [j.kind for j in jobs] == ["b"]
    jobs, _ = registry.list_jobs(status="queued")
    assert len(jobs) == 3
    for kwargs, field in (({"status": "bogus"}, "status"), ({"limit": 0}, "limit"), ({"cursor": "x"}, "cursor")):
        with pytest.raises(ValidationError) as err:
            registry.list_jobs(**kwargs)  # type: ignore[arg-type]
        assert err.value.field == field


def test_counts_cover_every_status(registry: SqliteRegistry) -> None:
    _enqueue(registry, 2)
    counts = registry.counts()
    assert counts["queued"] == 2
    assert set(counts) == {s.value for s in JobStatus}


def test_schema_is_versioned_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    SqliteRegistry(path).close()
    reg = SqliteRegistry(path)  # reopening runs no migration twice
    assert reg.schema_version() == SCHEMA_VERSION
    reg.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_a_sweep_reads_running_rows_through_the_status_index(registry: SqliteRegistry) -> None:
    with registry._pool.borrow() as conn:
        plan = conn.execute("EXPLAIN QUERY PLAN SELECT * FROM jobs WHERE status = 'running' ORDER BY seq").fetchall()
    detail = " ".join(row[3] for row in plan)
    assert "jobs_status_seq" in detail


def test_storage_errors_surface_as_registry_errors(tmp_path: Path) -> None:
    from supervisor import RegistryError

    reg = SqliteRegistry(tmp_path / "r.sqlite3")
    with reg._pool.borrow() as conn:
        conn.execute("DROP TABLE jobs")  # storage that no longer holds what the registry expects
    with pytest.raises(RegistryError):
        reg.get("x")
    with pytest.raises(RegistryError):
        reg.enqueue("k", {}, ["x"])
    with pytest.raises(RegistryError):
        reg.list_jobs()
    reg.close()


def test_a_batch_of_heartbeats_records_the_good_rows_whatever_the_bad_ones(registry: SqliteRegistry) -> None:
    from supervisor._registry import Beat

    jobs = []
    for token in ("a", "b", "c"):
        registry.enqueue("k", {}, ["x"])
        job = registry.promote_queued_if_slot(10, boot_id="b", token_hash=hash_token(token))
        assert job is not None
        jobs.append(job)
    ended = registry.finalize(jobs[2].job_id, JobStatus.SUCCEEDED).job
    results = registry.record_heartbeats(
        [
            Beat(jobs[0].job_id, "a", 5, total_units=9, stage="one"),
            Beat(jobs[1].job_id, "wrong", 7),  # another token
            Beat("no-such-job", "a", 1),  # no such job
            Beat(ended.job_id, "c", 1),  # ended: its token is gone
            Beat(jobs[1].job_id, "b", 3),
            Beat(jobs[0].job_id, "a", 4),  # the same job again, in order: a lower count moves no watermark
        ]
    )
    assert [type(r).__name__ for r in results] == ["Job", "Unauthorized", "Unauthorized", "Unauthorized", "Job", "Job"]
    first, second = registry.get(jobs[0].job_id), registry.get(jobs[1].job_id)
    assert (first.completed_units, first.total_units, first.stage) == (5, 9, "one")
    assert first.last_progress_at is not None and first.last_heartbeat_at is not None
    assert (second.completed_units, second.stage) == (3, None)
    # Each result is the row as stored after its beat.
    assert results[5] == first and results[4] == second
    assert registry.get(ended.job_id).last_heartbeat_at is None
