"""The SQLite registry's schema: a file written by the previous version (3) is migrated to the current one with its
rows, identities and undelivered events intact; a file newer than the code is refused; a failed migration leaves
the file as it was; scripts are cut into statements by SQLite's tokenizer; the migrations ship with the package."""

from __future__ import annotations

import sqlite3
import tomllib
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
import trio
from registry_v3 import CONTAINER, MIGRATIONS, PROCESS, ROW, V3_EVENTS, at, build_v3, old_public, sql, ts

from supervisor.domain import (
    RELEASE,
    IdempotencyKey,
    Job,
    JobFilter,
    JobStatus,
    RegistryError,
    Schedule,
    SchemaNotHonoured,
)
from supervisor.registry import (
    Ending,
    Expect,
    IdentityRecord,
    NewJob,
    Outcome,
    PauseState,
    PromoteRequest,
    SqliteRegistry,
    hash_token,
)
from supervisor.registry.sqlite import SCHEMA_VERSION, migrate_file, migrations, statements

REPO = Path(__file__).resolve().parents[3]
SUCCEEDED = Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0)


def raw(path: Path, query: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def columns(path: Path, table: str) -> list[str]:
    return [r[1] for r in raw(path, f"PRAGMA table_info({table})")]


# -- from version 3 -----------------------------------------------------------------------------------------


def test_this_code_is_schema_version_18() -> None:
    """The migration tests below are from 3 to 17: a new migration needs its own test of the file before it (13 to
    15 are other branches' numbers, applied where they are missing)."""
    assert SCHEMA_VERSION == 18


# An existing file opens to the expands before the first contract still to apply (18: supervisor migrate's).
FIRST_CONTRACT = min(m.version for m in migrations() if m.phase == "contract")
OPENED = max(m.version for m in migrations() if m.version < FIRST_CONTRACT)


# What each migration from version 9 on added, undone: a file of the current version back to an earlier one's tables.
UNDO = {
    18: ("DROP TRIGGER jobs_enqueued_release_insert", "DROP TRIGGER jobs_enqueued_release_update"),
    17: ("DROP INDEX jobs_host", "DROP INDEX jobs_queued_seq", "ALTER TABLE jobs DROP COLUMN enqueued_release"),
    16: (
        "DROP TABLE host_drains",
        "ALTER TABLE hosts DROP COLUMN release_version",
        "ALTER TABLE hosts DROP COLUMN contract_level",
    ),
    14: (
        "DROP TRIGGER job_params_insert",
        "DROP TRIGGER job_params_update",
        "DROP TRIGGER job_params_delete",
        "DROP TABLE job_params",
        "DROP INDEX jobs_reason_seq",
        "DROP INDEX jobs_created",
    ),
    13: ("ALTER TABLE jobs DROP COLUMN stop_reason",),
    12: (
        "DROP INDEX jobs_schedule",
        "ALTER TABLE jobs DROP COLUMN schedule",
        "ALTER TABLE jobs DROP COLUMN schedule_every_s",
    ),
    11: ("ALTER TABLE jobs DROP COLUMN enqueued_by", "ALTER TABLE jobs DROP COLUMN cancelled_by"),
    10: ("DROP TABLE idempotency_keys", "ALTER TABLE jobs DROP COLUMN idempotency_key"),
    9: ("DROP TABLE forgotten_hosts",),
    8: ("DROP TABLE fleet_settings",),
}


def back_to(path: Path, version: int) -> None:
    """The file at ``path`` (of this code's version) as a file of ``version`` would be."""
    conn = sqlite3.connect(path)
    try:
        for undone in range(SCHEMA_VERSION, version, -1):
            for statement in UNDO.get(undone, ()):
                conn.execute(statement)
        conn.execute("UPDATE schema_version SET version = ?", (version,))
        conn.execute("DELETE FROM schema_migrations WHERE version > ?", (version,))
        conn.commit()
    finally:
        conn.close()


async def test_INV_STOP_REASON_BEFORE_SIGNAL_a_version_12_file_gets_stop_reasons_and_its_rows_have_none(
    path: Path,
) -> None:
    """Version 13: a row running before the migration records no stop; one may be recorded on it after."""
    reg = await SqliteRegistry.open(path)
    await reg.enqueue(NewJob("k", {}, ["true"]))
    [old] = (await reg.promote(PromoteRequest(1, "boot-old", [hash_token("a")]))).jobs
    await reg.aclose()
    back_to(path, 12)
    assert "stop_reason" not in columns(path, "jobs")
    reg = await SqliteRegistry.open(path)
    try:
        assert raw(path, "SELECT version FROM schema_version") == [(OPENED,)]
        assert (await reg.get(old.job_id)).stop_reason is None
        stopped = await reg.request_stop(old.job_id, "deadline", expect=Expect(None))
        assert stopped.changed and (await reg.get(old.job_id)).stop_reason == "deadline"
    finally:
        await reg.aclose()


async def test_a_version_16_file_gets_the_release_column_and_the_contract_waits_for_every_host(path: Path) -> None:
    """Release 1.1.0 on a 1.0.0 file (docs/fleet.md § Upgrading a fleet): opening applies the expand (17) only; the
    contract (18) waits for supervisor migrate, which refuses it while a host of 1.0.0 holds a live lease, naming it
    (INV-CONTRACT-AFTER-FLEET), and applies it once that host is gone; from then on a row without its release (what
    1.0.0 inserts) is refused, and the rows from before carry 'before-1.1.0'."""
    reg = await SqliteRegistry.open(path)
    await reg.aclose()
    back_to(path, 16)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO jobs (job_id, kind, params, argv, status, created_at) VALUES ('old', 'k', '{}', '[]', "
                 "'succeeded', '2026-12-07T00:00:00.000000Z')")  # fmt: skip
    conn.commit()
    conn.close()
    reg = await SqliteRegistry.open(path)
    try:
        assert raw(path, "SELECT version FROM schema_version") == [(17,)]
        new = await reg.enqueue(NewJob("k", {}, ["true"]))
        assert raw(path, f"SELECT enqueued_release FROM jobs WHERE job_id = '{new.job.job_id}'") == [(RELEASE,)]
        # A host of 1.0.0 (contract level 0) holds a live lease: the contract is refused, naming it.
        await reg.renew_lease("old-host", "boot-1", lease_s=60, lead=True)
        conn = sqlite3.connect(path)
        conn.execute("UPDATE hosts SET release_version = '1.0.0', contract_level = 0 WHERE host_id = 'old-host'")
        conn.commit()
        conn.close()
        with pytest.raises(RegistryError, match=r"contract migration 0018_.* held back by old-host \(release 1\.0\.0"):
            await trio.to_thread.run_sync(lambda: migrate_file(path, busy_timeout_ms=5000))
        assert raw(path, "SELECT version FROM schema_version") == [(17,)]
        await reg.release_lease("old-host", "boot-1")  # stopped: its lease ends at once
        assert await trio.to_thread.run_sync(lambda: migrate_file(path, busy_timeout_ms=5000)) == SCHEMA_VERSION
        assert raw(path, "SELECT enqueued_release FROM jobs WHERE job_id = 'old'") == [("before-1.1.0",)]
        conn = sqlite3.connect(path)
        with pytest.raises(sqlite3.IntegrityError, match=r"NOT NULL constraint failed: jobs\.enqueued_release"):
            conn.execute("INSERT INTO jobs (job_id, kind, params, argv, status, created_at) VALUES ('x', 'k', '{}', "
                         "'[]', 'queued', '2026-12-07T00:00:00.000000Z')")  # fmt: skip
        conn.close()
        assert (await reg.enqueue(NewJob("k", {}, ["true"]))).job.status is JobStatus.QUEUED
    finally:
        await reg.aclose()


async def test_a_version_13_files_rows_are_found_by_their_params_and_later_rows_too(path: Path) -> None:
    """Version 14: the param filter reads a side table; the migration fills it with the rows already there, the
    triggers keep it with every insert and delete after (numbers as numbers)."""
    reg = await SqliteRegistry.open(path)
    old = await reg.enqueue(NewJob("k", {"ratio": 1e-05, "feed": "a", "flag": True, "n": 2**63 - 1}, ["true"]))
    await reg.aclose()
    back_to(path, 13)
    reg = await SqliteRegistry.open(path)
    try:
        new = await reg.enqueue(NewJob("k", {"ratio": 0.00001, "n": 2}, ["true"]))
        both, only_old = [new.job.job_id, old.job.job_id], [old.job.job_id]
        assert await reg.select_ids(JobFilter(params=(("ratio", 1e-05),)), 10) == both
        assert await reg.select_ids(JobFilter(params=(("flag", True), ("feed", "a"))), 10) == only_old
        assert await reg.select_ids(JobFilter(params=(("n", 2**63 - 1),)), 10) == only_old
        assert await reg.select_ids(JobFilter(params=(("n", 2.0),)), 10) == [new.job.job_id]
        assert raw(path, "SELECT COUNT(*) FROM job_params") == [(6,)]
        with sqlite3.connect(path) as conn:
            conn.execute("DELETE FROM jobs WHERE job_id = ?", (old.job.job_id,))
        assert raw(path, "SELECT COUNT(*) FROM job_params") == [(2,)]  # a pruned row's params go with it
    finally:
        await reg.aclose()


async def test_a_version_15_file_gets_host_releases_and_drains(path: Path) -> None:
    """Version 16 (release 1.0.0): a host row from before records no release; a renewal records this one's."""
    reg = await SqliteRegistry.open(path)
    await reg.renew_lease("h", "boot-1", lease_s=60, lead=False)
    await reg.aclose()
    back_to(path, 15)
    reg = await SqliteRegistry.open(path)
    try:
        [before] = await reg.hosts()
        assert (before.release, before.contract_level) == (None, None)
        lease = await reg.renew_lease("h", "boot-1", lease_s=60, lead=False)
        assert (lease.host.release, lease.host.contract_level) == (RELEASE, reg.contract_level)
        assert await reg.set_drained("h", True) is True
    finally:
        await reg.aclose()


async def test_a_version_11_file_gets_schedules_and_its_rows_have_none(path: Path) -> None:
    """Version 12 (schedules): a row written before schedules has none; a scheduled one records its schedule."""
    reg = await SqliteRegistry.open(path)
    old = await reg.enqueue(NewJob("k", {}, ["true"]))
    await reg.aclose()
    back_to(path, 11)
    reg = await SqliteRegistry.open(path)
    try:
        assert raw(path, "SELECT version FROM schema_version") == [(OPENED,)]
        before = await reg.get(old.job.job_id)
        assert (before.schedule, before.schedule_every_s) == (None, None)
        new = await reg.enqueue(NewJob("k", {}, ["true"], schedule=Schedule("nightly", 86400.0)))
        assert (new.job.schedule, new.job.schedule_every_s) == ("nightly", 86400.0)
    finally:
        await reg.aclose()


async def test_a_version_10_file_gets_attribution_and_its_rows_name_no_one(path: Path) -> None:
    """Version 11 (ADR 0017): a row written before attribution names no one; a new one names who asked."""
    reg = await SqliteRegistry.open(path)
    old = await reg.enqueue(NewJob("k", {}, ["true"]))
    await reg.aclose()
    back_to(path, 10)
    reg = await SqliteRegistry.open(path)
    try:
        assert raw(path, "SELECT version FROM schema_version") == [(OPENED,)]
        before = await reg.get(old.job.job_id)
        assert (before.enqueued_by, before.cancelled_by) == (None, None)
        new = await reg.enqueue(NewJob("k", {}, ["true"], enqueued_by="ci-bot"))
        cancelled = await reg.request_cancel(new.job.job_id, by="ops")
        assert (cancelled.job.enqueued_by, cancelled.job.cancelled_by) == ("ci-bot", "ops")
    finally:
        await reg.aclose()


async def test_a_version_9_file_gets_idempotency_keys_and_its_rows_were_made_without_one(path: Path) -> None:
    """Version 10 (ADR 0016): a row written before keys existed has none; a keyed enqueue then answers once."""
    reg = await SqliteRegistry.open(path)
    old = await reg.enqueue(NewJob("k", {}, ["true"]))
    await reg.aclose()
    back_to(path, 9)
    reg = await SqliteRegistry.open(path)
    try:
        assert raw(path, "SELECT version FROM schema_version") == [(OPENED,)]
        assert (await reg.get(old.job.job_id)).idempotency_key is None
        key = IdempotencyKey("k-1", "request", ttl_s=3600)
        first = await reg.enqueue(NewJob("k", {}, ["true"]), key=key)
        again = await reg.enqueue(NewJob("k", {}, ["true"]), key=key)
        assert again.replayed is not None and again.job.job_id == first.job.job_id
        assert first.job.idempotency_key == "k-1"
    finally:
        await reg.aclose()


async def test_a_version_8_file_gets_the_forgotten_hosts_fence_with_its_hosts_intact(path: Path) -> None:
    """Version 9 (ADR 0012, INV-FORGET-IS-FENCED): no boot forgotten yet; its hosts renew as before."""
    reg = await SqliteRegistry.open(path)
    await reg.renew_lease("h", "boot-h", lease_s=15, lead=False)
    await reg.aclose()
    back_to(path, 8)
    reg = await SqliteRegistry.open(path)
    try:
        assert raw(path, "SELECT version FROM schema_version") == [(OPENED,)]
        assert raw(path, "SELECT COUNT(*) FROM forgotten_hosts") == [(0,)]
        lease = await reg.renew_lease("h", "boot-h", lease_s=15, lead=False)
        assert lease.host.boot_id == "boot-h" and lease.replaced is None
    finally:
        await reg.aclose()


async def test_a_version_7_file_gets_the_fleet_settings_table_with_nothing_recorded(path: Path) -> None:
    """Version 8 (ADR 0012): nothing recorded, so the first supervisor to start records its limit."""
    reg = await SqliteRegistry.open(path)
    await reg.aclose()
    back_to(path, 7)
    reg = await SqliteRegistry.open(path)
    try:
        setting = await reg.record_setting("max_concurrent", "3", "h", replace=False)
        assert (setting.value, setting.host_id) == ("3", "h")
        assert raw(path, "SELECT version FROM schema_version") == [(OPENED,)]
    finally:
        await reg.aclose()


async def test_a_version_6_file_gets_retry_links_and_its_history_can_be_pruned(path: Path) -> None:
    """Version 7: rows written before retries existed retry nothing; finished ones are pruned, and one
    with an event still in the outbox is kept."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        for name in sorted(entry.name for entry in MIGRATIONS.iterdir() if entry.name < "0007"):
            conn.executescript(sql(name))
        conn.executescript(
            "CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (6);"
        )
        for job_id in ("a", "b"):
            conn.execute(
                "INSERT INTO jobs (job_id, kind, params, argv, status, created_at, ended_at) VALUES "
                f"('{job_id}', 'k', '{{}}', '[]', 'failed', '2026-05-01T12:00:00.000000+00:00', "
                "'2026-05-01T12:00:01.000000+00:00')"
            )
        conn.execute(
            "INSERT INTO outbox (event_id, job_id, event, created_at, job) "
            "VALUES ('e', 'b', 'job.transition', '2026-05-01T12:00:01.000000+00:00', '{}')"
        )
        conn.commit()
    finally:
        conn.close()
    reg = await SqliteRegistry.open(path)
    try:
        assert (await reg.get("a")).retry_of is None
        assert await reg.retries_of("a") == []
        [gone] = await reg.prune_jobs(ended_before=None, keep_latest=0, limit=10)
        assert gone.job_id == "a"
        assert raw(path, "SELECT version FROM schema_version") == [(OPENED,)]
    finally:
        await reg.aclose()


async def test_a_version_5_file_gets_the_fleet_tables_and_its_running_rows_belong_to_no_host(path: Path) -> None:
    """Version 6 (ADR 0012): a row promoted before hosts were recorded names none (this host judges it, as then);
    no host is registered and nobody leads until a supervisor renews its lease."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        for name in (
            "0001_jobs.sql",
            "0002_absence.sql",
            "0003_outbox.sql",
            "0004_identity_pause_events.sql",
            "0005_attempts.sql",
        ):
            conn.executescript(sql(name))
        conn.executescript(
            "CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (5);"
        )
        conn.execute(
            "INSERT INTO jobs (job_id, kind, params, argv, status, created_at, started_at, boot_id) VALUES "
            "('r', 'k', '{}', '[]', 'running', '2026-05-01T12:00:00.000000+00:00', "
            "'2026-05-01T12:00:01.000000+00:00', 'old-boot')"
        )
        conn.commit()
    finally:
        conn.close()
    reg = await SqliteRegistry.open(path)
    try:
        job = await reg.get("r")
        assert (job.status, job.boot_id, job.host_id) == (JobStatus.RUNNING, "old-boot", None)
        assert await reg.hosts() == [] and await reg.leader() is None
        assert raw(path, "SELECT version FROM schema_version") == [(OPENED,)]
    finally:
        await reg.aclose()


async def test_a_version_4_file_gets_the_attempt_columns_with_nothing_to_retry(path: Path) -> None:
    """Version 5 (ADR 0009): rows written before resubmission existed may have one start, are due now, and have no
    earlier attempt."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        for name in ("0001_jobs.sql", "0002_absence.sql", "0003_outbox.sql", "0004_identity_pause_events.sql"):
            conn.executescript(sql(name))
        conn.executescript(
            "CREATE TABLE schema_version (version INTEGER NOT NULL); INSERT INTO schema_version VALUES (4);"
        )
        conn.execute(
            "INSERT INTO jobs (job_id, kind, params, argv, status, created_at) "
            "VALUES ('q', 'k', '{}', '[]', 'queued', '2026-05-01T12:00:00.000000+00:00')"
        )
        conn.commit()
    finally:
        conn.close()
    reg = await SqliteRegistry.open(path)
    try:
        job = await reg.get("q")
        assert (job.max_attempts, job.next_attempt_at, job.history, job.queue_position) == (1, None, (), 1)
        assert raw(path, "SELECT version FROM schema_version") == [(OPENED,)]
    finally:
        await reg.aclose()


async def test_a_version_3_file_is_migrated_with_its_rows_intact(path: Path) -> None:
    build_v3(path)
    reg = await SqliteRegistry.open(path)
    try:
        assert reg.file.schema_version == OPENED
        assert raw(path, "SELECT version FROM schema_version") == [(OPENED,)]
        proc = await reg.get("proc")
        assert proc == Job(
            job_id="proc", seq=2, kind="episodes", params={"n": 3}, argv=["run"], status=JobStatus.RUNNING,
            error_reason=None, exit_code=None, created_at=at(3), started_at=at(4), ended_at=None, attempts=2,
            cancel_requested=True, boot_id="boot-old", identity=PROCESS, token_hash=hash_token("proc-token"),
            completed_units=3, total_units=10, stage="episodes", last_heartbeat_at=at(9), last_progress_at=at(8),
            log_path="/logs/proc.log", queue_position=None, stalled=True, stalled_since=at(8), silent=True,
        )  # fmt: skip
        assert (await reg.get("box")).identity == CONTAINER
        assert (await reg.get("spawning")).identity is None  # promoted, never spawned: nothing recorded
        done = await reg.get("done")
        assert done.identity == IdentityRecord(
            "process", {"pid": 100, "pid_start_time": 5000, "kernel_boot_id": "kb-1"}
        )
        assert (done.status, done.ended_at, done.exit_code, done.token_hash) == (JobStatus.SUCCEEDED, at(2), 0, None)
        assert [(await reg.get(j)).queue_position for j in ("waiting", "later")] == [1, 2]
        assert await reg.counts() == {
            "queued": 2,
            "running": 3,
            "succeeded": 1,
            "failed": 0,
            "cancelled": 0,
            "stale": 0,
        }
        assert await reg.pause_state() == PauseState(False)  # the pause is new in version 4: not paused
        await reg.check_job_token("proc", "proc-token")  # its token still works
        # The identity columns are gone: the record is the only place the identity is.
        assert not {"pid", "pid_start_time", "kernel_boot_id", "container_id"} & set(columns(path, "jobs"))
        assert "identity" in columns(path, "jobs")
    finally:
        await reg.aclose()


async def test_a_version_3_files_undelivered_events_are_taken_apart_into_fields(path: Path) -> None:
    build_v3(path)
    reg = await SqliteRegistry.open(path)
    try:
        events = await reg.outbox_pending(10)
        assert [(e.event_id, e.job_id, e.event, e.previous_status, e.reason, e.boot_id) for e in events] == [
            ("e-proc-promoted", "proc", "job.transition", "queued", "promoted", "boot-old"),
            ("e-proc-stalled", "proc", "job.stalled", "running", "progress_stalled", "boot-old"),
            ("e-later-enqueued", "later", "job.transition", None, "enqueued", "boot-old"),
        ]
        assert [e.created_at for e in events] == [at(4), at(8), at(11)]
        # The row as of the change, exactly as the old body carried it (what its receiver would have got).
        assert [dict(e.job) for e in events] == [
            old_public(ROW["proc"]),
            old_public(ROW["proc"]),
            old_public(ROW["later"]),
        ]
        assert events[0].job["pid"] == 4242
        seqs = [e.seq for e in events]
        assert seqs == sorted(seqs)
        assert "body" not in columns(path, "outbox")
        # Delivered, they go as any other event does.
        await reg.outbox_delete(seqs[:2])
        assert [e.event_id for e in await reg.outbox_pending(10)] == ["e-later-enqueued"]
    finally:
        await reg.aclose()


async def test_a_migrated_file_keeps_its_queue_order_and_coalescing(path: Path) -> None:
    build_v3(path)
    reg = await SqliteRegistry.open(path)
    try:
        coalesced = await reg.enqueue(NewJob("enrichment", {"x": 1}, ["enrich", "x"], coalesce_key="K"))
        assert coalesced.coalesced and coalesced.job.job_id == "waiting"
        new = await reg.enqueue(NewJob("feeds", {}, ["fetch"]))
        assert new.job.seq > max(r.seq for r in (await reg.list_jobs())[0] if r.job_id != new.job.job_id)
        assert new.job.queue_position == 3
        await reg.finalize("proc", SUCCEEDED)
        await reg.finalize("box", SUCCEEDED)
        promotion = await reg.promote(PromoteRequest(3, "boot-new", [hash_token("a"), hash_token("b")]))
        assert [j.job_id for j in promotion.jobs] == ["waiting", "later"]  # the old rows first, in their order
    finally:
        await reg.aclose()


async def test_reopening_a_migrated_file_migrates_nothing_again(path: Path) -> None:
    build_v3(path)
    first = await SqliteRegistry.open(path)
    rows = (await first.list_jobs())[0]
    events = await first.outbox_pending(10)
    await first.aclose()
    again = await SqliteRegistry.open(path)
    try:
        assert again.file.schema_version == OPENED
        assert (await again.list_jobs())[0] == rows
        assert await again.outbox_pending(10) == events
    finally:
        await again.aclose()


# -- refusals and failures ----------------------------------------------------------------------------------


def newer_release_applied(path: Path, phase: str) -> None:
    """A newer release's migration recorded as applied to the file (its own script: a table this code never reads)."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE from_the_future (x INTEGER)")
    conn.execute(
        "INSERT INTO schema_migrations VALUES (?, 'from_the_future.sql', ?, '2030-01-01T00:00:00Z')",
        (SCHEMA_VERSION + 1, phase),
    )
    conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()


async def test_a_file_a_newer_release_contracted_is_refused_and_left_alone(path: Path) -> None:
    """INV-CONTRACT-AFTER-FLEET: a contract this release does not know was applied: it cannot run on the file."""
    await (await SqliteRegistry.open(path)).aclose()
    newer_release_applied(path, "contract")
    with pytest.raises(SchemaNotHonoured, match=f"contracted by a newer release .migration {SCHEMA_VERSION + 1}"):
        await SqliteRegistry.open(path)
    assert raw(path, "SELECT MAX(version) FROM schema_migrations") == [(SCHEMA_VERSION + 1,)]


async def test_a_file_a_newer_release_only_expanded_is_used_as_it_is(path: Path) -> None:
    """The previous release runs on what the next one's expand migrations made (docs/fleet.md § Upgrading a fleet)."""
    await (await SqliteRegistry.open(path)).aclose()
    newer_release_applied(path, "expand")
    reg = await SqliteRegistry.open(path)
    try:
        added = await reg.enqueue(NewJob("k", {}, ["true"]))
        assert (await reg.get(added.job.job_id)).status is JobStatus.QUEUED
    finally:
        await reg.aclose()
    assert raw(path, "SELECT version FROM schema_version") == [(SCHEMA_VERSION + 1,)]


async def test_a_failed_migration_leaves_the_file_at_its_previous_version(path: Path) -> None:
    # An event whose body is not JSON: migration 4 cannot take it apart.
    broken = ("e-broken", "later", "job.transition", ts(12), "{not json")
    build_v3(path, events=[*V3_EVENTS, broken])
    before = {table: raw(path, f"SELECT * FROM {table} ORDER BY seq") for table in ("jobs", "outbox")}
    with pytest.raises(RegistryError, match="0004"):
        await SqliteRegistry.open(path)
    assert raw(path, "SELECT version FROM schema_version") == [(3,)]
    assert "pid" in columns(path, "jobs") and "identity" not in columns(path, "jobs")
    assert "body" in columns(path, "outbox")
    assert raw(path, "SELECT name FROM sqlite_master WHERE name = 'queue_state'") == []
    assert {table: raw(path, f"SELECT * FROM {table} ORDER BY seq") for table in ("jobs", "outbox")} == before
    # Once the operator removes what it could not read, the same file migrates.
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM outbox WHERE event_id = 'e-broken'")
    conn.commit()
    conn.close()
    reg = await SqliteRegistry.open(path)
    try:
        assert (await reg.get("proc")).identity == PROCESS
    finally:
        await reg.aclose()


async def test_a_new_file_is_at_the_current_version_in_wal_mode(path: Path) -> None:
    reg = await SqliteRegistry.open(path)
    await reg.aclose()
    assert raw(path, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
    assert raw(path, "PRAGMA journal_mode") == [("wal",)]


# -- statements() ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("SELECT 1; SELECT 2;", ["SELECT 1;", "SELECT 2;"]),
        ("INSERT INTO t VALUES ('a;b'); SELECT 2;", ["INSERT INTO t VALUES ('a;b');", "SELECT 2;"]),
        ('SELECT "odd;name" FROM t;', ['SELECT "odd;name" FROM t;']),
        ("SELECT 'it''s; here';", ["SELECT 'it''s; here';"]),
        ("SELECT '-- not a comment;'; SELECT '/*';", ["SELECT '-- not a comment;';", "SELECT '/*';"]),
        (
            "-- a comment; with a semicolon\nCREATE TABLE t (x);",
            ["-- a comment; with a semicolon\nCREATE TABLE t (x);"],
        ),
        ("CREATE TABLE t (x /* a; b */);", ["CREATE TABLE t (x /* a; b */);"]),
        (
            "CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = 1; DELETE FROM t; END;",
            ["CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = 1; DELETE FROM t; END;"],
        ),
        ("CREATE TABLE t (x);\n-- the end; really", ["CREATE TABLE t (x);"]),
        ("CREATE TABLE t (x);\n/* the end; really */\n", ["CREATE TABLE t (x);"]),
        ("CREATE TABLE t (x); /* trailing */", ["CREATE TABLE t (x);"]),
        ("SELECT 1;;\n;  ", ["SELECT 1;"]),
        ("-- only a comment\n;\n/* another */;", []),
        ("", []),
    ],
)
def test_statements_split_only_where_sqlite_says_a_statement_ends(script: str, expected: list[str]) -> None:
    got = list(statements(script))
    assert [s.strip() for s in got] == expected
    for statement in got:
        assert sqlite3.complete_statement(statement)


def test_a_script_that_ends_inside_a_statement_is_refused() -> None:
    with pytest.raises(RegistryError, match="incomplete"):
        list(statements("CREATE TABLE t (x);\nSELECT 'unfinished"))
    with pytest.raises(RegistryError, match="incomplete"):
        list(statements("CREATE TABLE t (x);\nSELECT 1"))


def test_every_shipped_migration_runs_statement_by_statement(tmp_path: Path) -> None:
    """What migrate() does, on an empty file: each statement of each migration is one SQLite accepts."""
    conn = sqlite3.connect(tmp_path / "scratch.sqlite3")
    try:
        for name in sorted(p.name for p in MIGRATIONS.iterdir() if p.name.endswith(".sql")):
            for statement in statements(sql(name)):
                conn.execute(statement)
        assert "identity" in [r[1] for r in conn.execute("PRAGMA table_info(jobs)")]
    finally:
        conn.close()


def test_the_migrations_ship_with_the_package() -> None:
    """A wheel (the Docker image installs one) holds only the package data pyproject declares: without the SQL
    files no registry opens."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"].get("supervisor.registry.sqlite", [])
    shipped = [p.name for p in MIGRATIONS.iterdir() if p.name.endswith(".sql")]
    assert len(shipped) == len(migrations()) and f"{SCHEMA_VERSION:04d}" in {name[:4] for name in shipped}
    assert all(any(fnmatch(f"migrations/{name}", pattern) for pattern in patterns) for name in shipped)


async def test_running_rows_are_read_through_the_status_index(path: Path) -> None:
    """A sweep reads the running rows: O(running rows), not O(history), by the (status, seq) index."""
    reg = await SqliteRegistry.open(path)
    try:
        plan = reg.file.read("EXPLAIN QUERY PLAN SELECT * FROM jobs WHERE status = 'running' ORDER BY seq")
        assert "jobs_status_seq" in " ".join(str(row[3]) for row in plan)
    finally:
        await reg.aclose()
