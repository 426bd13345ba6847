"""The PostgreSQL registry's rows: the rules' ``Store`` (``_engine.Store``) as SQL on one asyncpg connection, inside
the transaction ``_registry`` opened (READ COMMITTED for a write: each statement sees what committed before it began,
which the promotion relies on; one REPEATABLE READ snapshot for a read). asyncio code, on trio-asyncio's loop.

Concurrency, with no registry-wide write lock (several supervisors may share the database): a write that reads a row
to decide its change locks it first (``FOR UPDATE``); promotions take turns under a transaction-scoped advisory lock,
so do enqueues of one coalescing key or one idempotency key, and the leases and the lead (ADR 0012). The changes
other hosts of a fleet may act on also send a wake-up (``notify``: ``pg_notify`` in the change's transaction, so it
is delivered on commit and never for a rolled-back change); INV-NOTIFY-IS-A-HINT: whoever hears one re-reads what it
acts on.

Timestamps are ``timestamptz`` (aware ``datetime``s both ways); params, argv, the identity record and the history
are JSON text, as in the SQLite registry.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from ...domain import Job, JobStatus
from .._engine import Page
from .._protocol import (
    WAKE_KINDS,
    FleetSetting,
    Host,
    NewJob,
    OutboxEvent,
    PauseState,
    PrunedJob,
    PruneResult,
    Receipt,
    Wakeup,
)
from .._sql import COLUMNS, FINISHED, HOST_COLUMNS, KEY_COLUMNS, OUTBOX_COLUMNS, column, json_value
from .._sql import receipts as read_receipts
from .._sql import row_to_job as job_from_row
from ._schema import COALESCE_LOCK, KEY_LOCK, LEADER_LOCK, PROMOTE_LOCK


def _utc(ts: datetime | None) -> datetime | None:
    return ts.astimezone(UTC) if ts is not None else None


def row_to_job(row: Mapping[str, Any], queue_position: int | None = None) -> Job:
    return job_from_row(row, _utc, queue_position)


# A channel name is an identifier: at most 63 bytes (NAMEDATALEN - 1); pg_notify refuses a longer one.
_CHANNEL_PREFIX = "podcast_jobs."
_MAX_CHANNEL_BYTES = 63


def wakeup_channel(schema: str) -> str:
    """The wake-up channel of the registry in ``schema``: one per schema (registries in different schemas of one
    database never wake each other), named after it when the name fits, else after a hash of it."""
    name = _CHANNEL_PREFIX + schema
    if len(name.encode()) <= _MAX_CHANNEL_BYTES:
        return name
    return f"{_CHANNEL_PREFIX}{hashlib.sha256(schema.encode()).hexdigest()[:32]}"


def encode_wakeup(wake: Wakeup) -> str:
    """A wake-up's payload: small JSON (its kind and ids only, never a row), far under the server's 8,000 bytes."""
    fields = {"kind": wake.kind, "job_id": wake.job_id, "host_id": wake.host_id}
    return json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":"))


def decode_wakeup(payload: str) -> Wakeup | None:
    """A wake-up from its payload; None for one this version does not know (a newer host's: ignored, polling covers
    it)."""
    try:
        fields = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(fields, dict) or fields.get("kind") not in WAKE_KINDS:
        return None
    job_id, host_id = fields.get("job_id"), fields.get("host_id")
    if not isinstance(job_id, str | None) or not isinstance(host_id, str | None):
        return None
    return Wakeup(fields["kind"], job_id=job_id, host_id=host_id)


def _host(row: Any, now: datetime) -> Host:
    return Host(row[0], row[1], row[2].astimezone(UTC), row[3].astimezone(UTC), row[4].astimezone(UTC), as_of=now)


def _count(status: str) -> int:
    """The row count of a command's status (``DELETE 3``)."""
    return int(status.rsplit(" ", 1)[-1])




class PostgresRows:
    """The rules' store on ``conn`` (see ``_engine.Store``). ``clock``: the rows' wall clock; ``lease_clock``: the
    leases' (None: the database server's); ``schema_key``: this schema's advisory lock key; ``channel``: its wake-up
    channel; ``boot_id``: written into each event."""

    def __init__(
        self,
        conn: Any,
        *,
        clock: Callable[[], datetime],
        lease_clock: Callable[[], datetime] | None,
        schema_key: int,
        channel: str | None,
        boot_id: str | None,
    ) -> None:
        self.conn = conn
        self.clock = clock
        self.lease_clock = lease_clock
        self.schema_key = schema_key
        self.channel = channel
        self.boot_id = boot_id

    def now(self) -> datetime:
        """The clock's time in UTC (a naive time is refused, as the other registries refuse it)."""
        return _utc_of(self.clock(), "clock")

    async def lease_now(self) -> datetime:
        """The time every lease is written and judged by: the database server's clock, one for every host of the
        fleet (INV-LEASE-ON-REGISTRY-CLOCK): hosts whose own clocks disagree still agree on whose lease holds. Read
        at the moment of the call (``clock_timestamp()``, not the transaction's start: a renewal may have waited for
        the leases' lock). A test's ``lease_clock`` stands in for it."""
        if self.lease_clock is not None:
            return _utc_of(self.lease_clock(), "lease clock")
        now = await self.conn.fetchval("SELECT clock_timestamp()")
        assert isinstance(now, datetime)
        return now.astimezone(UTC)

    async def _lock(self, key: int, name: str | None = None) -> None:
        """A transaction-scoped advisory lock of this schema's (released at commit or rollback)."""
        if name is None:
            await self.conn.execute("SELECT pg_advisory_xact_lock($1, $2)", key, self.schema_key)
        else:
            await self.conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", key, f"{self.schema_key}/{name}")

    # -- jobs ---------------------------------------------------------------------------------------------

    async def job(self, job_id: str, *, lock: bool = False, position: bool = False) -> Job | None:
        row = await self.conn.fetchrow(
            f"SELECT {COLUMNS} FROM jobs WHERE job_id = $1{' FOR UPDATE' if lock else ''}", job_id
        )
        if row is None:
            return None
        at = None
        if position and row["status"] == JobStatus.QUEUED:
            at = await self.conn.fetchval("SELECT COUNT(*) FROM jobs WHERE status = 'queued' AND seq <= $1", row["seq"])
        return row_to_job(row, at)

    async def jobs(self, job_ids: Sequence[str]) -> list[Job]:
        rows = await self.conn.fetch(f"SELECT {COLUMNS} FROM jobs WHERE job_id = ANY($1::text[])", list(job_ids))
        found = {r["job_id"]: r for r in rows}
        return [row_to_job(found[job_id]) for job_id in job_ids]

    async def running(self) -> list[Job]:
        """Every RUNNING row (the status index: O(running rows))."""
        return [
            row_to_job(r)
            for r in await self.conn.fetch(f"SELECT {COLUMNS} FROM jobs WHERE status = 'running' ORDER BY seq")
        ]

    async def lock_promotion(self) -> None:
        """INV-PROMOTION-NEVER-OVERSHOOTS: promotions from any host take turns; only a promotion makes a row RUNNING,
        and the count is a statement begun after the lock is held, so under READ COMMITTED it sees every promotion
        committed before (a row leaving RUNNING concurrently only makes it too high: fewer promoted, never more)."""
        await self._lock(PROMOTE_LOCK)

    async def running_counts(self, host_id: str | None) -> tuple[int, int]:
        row = await self.conn.fetchrow(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE host_id IS NOT DISTINCT FROM $1) FROM jobs "
            "WHERE status = 'running'",
            host_id,
        )
        return row[0], row[1]

    async def promotable(self, now: datetime, limit: int, *, lock: bool = False) -> list[Job]:
        # FOR UPDATE (a promotion's): a row a concurrent cancel is ending is waited for, then skipped if it is no
        # longer queued. A plain read (the queue's watch) locks nothing: a read-only snapshot refuses FOR UPDATE.
        rows = await self.conn.fetch(
            f"SELECT {COLUMNS} FROM jobs WHERE status = 'queued' AND (not_before IS NULL OR not_before <= $1) "
            f"ORDER BY seq LIMIT $2{' FOR UPDATE' if lock else ''}",
            now,
            limit,
        )
        return [row_to_job(r) for r in rows]

    async def next_backoff_end(self, now: datetime) -> datetime | None:
        value = await self.conn.fetchval(
            "SELECT MIN(not_before) FROM jobs WHERE status = 'queued' AND not_before > $1", now
        )
        return value.astimezone(UTC) if value is not None else None

    async def queued_with_key(self, key: str) -> str | None:
        # Two enqueues of one key take turns, or both would find no queued row and both insert (READ COMMITTED sees no
        # uncommitted insert).
        await self._lock(COALESCE_LOCK, key)
        sql = "SELECT job_id FROM jobs WHERE status = 'queued' AND coalesce_key = $1 ORDER BY seq LIMIT 1"
        found = await self.conn.fetchval(sql, key)
        return None if found is None else str(found)

    async def insert(self, job: NewJob, now: datetime) -> str:
        job_id = uuid.uuid4().hex
        await self.conn.execute(
            "INSERT INTO jobs (job_id, kind, params, argv, status, created_at, coalesce_key, max_attempts, retry_of, "
            "idempotency_key, enqueued_by) VALUES ($1, $2, $3, $4, 'queued', $5, $6, $7, $8, $9, $10)",
            job_id, job.kind, json.dumps(dict(job.params), sort_keys=True), json.dumps(list(job.argv)), now,
            job.coalesce_key, job.max_attempts, job.retry_of, job.idempotency_key, job.enqueued_by,
        )  # fmt: skip
        return job_id

    async def lock_key(self, key: str) -> None:
        # Two requests of one key, on any host, take turns: the second reads what the first committed (READ
        # COMMITTED) and replays it. The primary key of idempotency_keys stands behind the lock.
        await self._lock(KEY_LOCK, key)

    async def receipts(self, key: str, now: datetime) -> tuple[str, list[Receipt]] | None:
        sql = (
            f"SELECT {KEY_COLUMNS} FROM idempotency_keys WHERE idempotency_key = $1 AND expires_at > $2 "
            "ORDER BY answer_index"
        )
        return read_receipts(await self.conn.fetch(sql, key, now))

    async def put_receipts(
        self, key: str, fingerprint: str, receipts: Sequence[Receipt], now: datetime, expires_at: datetime
    ) -> None:
        await self.conn.execute("DELETE FROM idempotency_keys WHERE idempotency_key = $1", key)  # only expired rows
        await self.conn.executemany(
            f"INSERT INTO idempotency_keys (idempotency_key, answer_index, {KEY_COLUMNS}, created_at, expires_at) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            [(key, i, fingerprint, r.job_id, str(r.status), r.queue_position, r.coalesced, now, expires_at)
             for i, r in enumerate(receipts)],
        )  # fmt: skip

    async def drop_expired_keys(self, now: datetime, limit: int) -> int:
        sql = (
            "DELETE FROM idempotency_keys WHERE idempotency_key IN (SELECT idempotency_key FROM idempotency_keys "
            "WHERE expires_at <= $1 LIMIT $2)"
        )
        return _count(await self.conn.execute(sql, now, limit))

    async def update(self, job_id: str, fields: Mapping[str, object], *, status: JobStatus | None = None) -> int:
        names = [column(name) for name in fields]
        args = [json_value(value) for value in fields.values()] + [job_id]
        columns = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=1))
        guard = ""
        if status is not None:
            args.append(str(status))
            guard = f" AND status = ${len(args)}"
        return _count(
            await self.conn.execute(f"UPDATE jobs SET {columns} WHERE job_id = ${len(names) + 1}{guard}", *args)
        )

    async def add_event(
        self, job_id: str, body: Mapping[str, Any], event: str, previous: str | None, reason: str | None
    ) -> None:
        # Events of one job are in the order written: every change of a row holds its row lock until it commits.
        await self.conn.execute(
            "INSERT INTO outbox (event_id, job_id, event, created_at, previous_status, reason, boot_id, job) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            uuid.uuid4().hex, job_id, event, self.now(), previous, reason, self.boot_id,
            json.dumps(body, sort_keys=True, separators=(",", ":")),
        )  # fmt: skip

    async def notify(self, wake: Wakeup) -> None:
        """A wake-up on this schema's channel, in the caller's transaction: delivered when it commits, never when it
        rolls back (the same one sent twice in one transaction is delivered once: the server folds them)."""
        if self.channel is not None:
            await self.conn.execute("SELECT pg_notify($1, $2)", self.channel, encode_wakeup(wake))

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        savepoint = self.conn.transaction()  # nested in the registry's transaction: a savepoint
        await savepoint.start()
        try:
            yield
        except BaseException:
            await savepoint.rollback()
            raise
        await savepoint.commit()

    # -- the pause ----------------------------------------------------------------------------------------

    async def pause(self, *, lock: bool = False) -> PauseState:
        row = await self.conn.fetchrow(
            f"SELECT paused, paused_by, paused_at FROM queue_state{' FOR UPDATE' if lock else ''}"
        )
        if not row["paused"]:
            return PauseState(False)
        return PauseState(True, row["paused_by"], row["paused_at"].astimezone(UTC) if row["paused_at"] else None)

    async def set_pause(self, state: PauseState) -> None:
        sql = "UPDATE queue_state SET paused = $1, paused_by = $2, paused_at = $3"
        await self.conn.execute(sql, state.paused, state.by, state.since)

    # -- the fleet ----------------------------------------------------------------------------------------

    async def lock_leases(self) -> None:
        await self._lock(LEADER_LOCK)

    async def hosts(self, now: datetime) -> list[Host]:
        return [_host(r, now) for r in await self.conn.fetch(f"SELECT {HOST_COLUMNS} FROM hosts ORDER BY host_id")]

    async def leader(self, now: datetime) -> Host | None:
        """The lead's holder (its ``started_at``: since when it leads)."""
        row = await self.conn.fetchrow("SELECT host_id, boot_id, since, last_seen_at, lease_expires_at FROM leader")
        return None if row is None else _host(row, now)

    async def put_host(self, host: Host, *, new: bool) -> None:
        if new:
            await self.conn.execute(
                f"INSERT INTO hosts ({HOST_COLUMNS}) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (host_id) DO UPDATE SET "
                "boot_id = excluded.boot_id, started_at = excluded.started_at, last_seen_at = excluded.last_seen_at, "
                "lease_expires_at = excluded.lease_expires_at",
                host.host_id, host.boot_id, host.started_at, host.last_seen_at, host.lease_expires_at,
            )  # fmt: skip
        else:
            sql = "UPDATE hosts SET last_seen_at = $1, lease_expires_at = $2 WHERE host_id = $3"
            await self.conn.execute(sql, host.last_seen_at, host.lease_expires_at, host.host_id)

    async def put_leader(self, host: Host | None, *, only: tuple[str, str] | None = None) -> None:
        if host is None:
            if only is None:
                await self.conn.execute("DELETE FROM leader")
            else:
                await self.conn.execute("DELETE FROM leader WHERE host_id = $1 AND boot_id = $2", *only)
            return
        await self.conn.execute(
            "INSERT INTO leader (one, host_id, boot_id, since, last_seen_at, lease_expires_at) VALUES (1, $1, $2, $3, "
            "$4, $5) ON CONFLICT (one) DO UPDATE SET host_id = excluded.host_id, boot_id = excluded.boot_id, "
            "since = excluded.since, last_seen_at = excluded.last_seen_at, "
            "lease_expires_at = excluded.lease_expires_at",
            host.host_id, host.boot_id, host.started_at, host.last_seen_at, host.lease_expires_at,
        )  # fmt: skip

    async def fenced(self, host_id: str, boot_id: str) -> bool:
        sql = "SELECT 1 FROM forgotten_hosts WHERE host_id = $1 AND boot_id = $2"
        return await self.conn.fetchval(sql, host_id, boot_id) is not None

    async def fence(self, host: Host, now: datetime) -> None:
        sql = "INSERT INTO forgotten_hosts (host_id, boot_id, forgotten_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"
        await self.conn.execute(sql, host.host_id, host.boot_id, now)

    async def drop_host(self, host_id: str) -> None:
        await self.conn.execute("DELETE FROM hosts WHERE host_id = $1", host_id)
        await self.conn.execute("DELETE FROM leader WHERE host_id = $1", host_id)

    async def setting(self, name: str) -> FleetSetting | None:
        row = await self.conn.fetchrow(
            "SELECT name, value, host_id, recorded_at FROM fleet_settings WHERE name = $1", name
        )
        return None if row is None else FleetSetting(row[0], row[1], row[2], row[3].astimezone(UTC))

    async def put_setting(self, setting: FleetSetting) -> None:
        await self.conn.execute(
            "INSERT INTO fleet_settings (name, value, host_id, recorded_at) VALUES ($1, $2, $3, $4) ON CONFLICT (name) "
            "DO UPDATE SET value = excluded.value, host_id = excluded.host_id, recorded_at = excluded.recorded_at",
            setting.name, setting.value, setting.host_id, setting.recorded_at,
        )  # fmt: skip

    # -- retention and the outbox -------------------------------------------------------------------------

    async def finished_edge(self, keep_latest: int) -> tuple[datetime, int] | None:
        sql = f"SELECT ended_at, seq FROM jobs WHERE {FINISHED} ORDER BY ended_at DESC, seq DESC LIMIT 1 OFFSET $1"
        row = await self.conn.fetchrow(sql, keep_latest)
        return None if row is None else (row[0].astimezone(UTC), row[1])

    async def prunable(
        self, ended_before: datetime | None, edge: tuple[datetime, int] | None, limit: int, *, lock: bool
    ) -> list[PrunedJob]:
        rules: list[str] = []
        args: list[object] = []
        if ended_before is not None:
            args.append(ended_before)
            rules.append(f"ended_at < ${len(args)}")
        if edge is not None:
            args += edge
            rules.append(f"(ended_at, seq) <= (${len(args) - 1}, ${len(args)})")
        args += [self.now(), limit]
        # Locked, skipping what a concurrent prune holds: two supervisors pruning at once take different rows.
        rows = await self.conn.fetch(
            f"SELECT job_id, kind, status, ended_at, log_path, attempts FROM jobs AS j WHERE {FINISHED} "
            f"AND ({' OR '.join(rules)}) AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id) "
            "AND NOT EXISTS (SELECT 1 FROM idempotency_keys AS k WHERE k.job_id = j.job_id AND k.expires_at > "
            f"${len(args) - 1}) ORDER BY ended_at, seq LIMIT ${len(args)}{' FOR UPDATE SKIP LOCKED' if lock else ''}",
            *args,
        )
        return [PrunedJob(r[0], r[1], JobStatus(r[2]), r[3].astimezone(UTC), r[4], r[5]) for r in rows]

    async def delete_finished(self, job_ids: Sequence[str]) -> set[str]:
        # An event written for a row since it was chosen (READ COMMITTED: this statement sees it) keeps the row.
        kept = await self.conn.fetch(
            "DELETE FROM jobs AS j WHERE job_id = ANY($1::text[]) "
            "AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id) RETURNING job_id",
            list(job_ids),
        )
        return {row[0] for row in kept}

    async def outbox_stats(self) -> tuple[int, datetime | None]:
        row = await self.conn.fetchrow("SELECT COUNT(*), MIN(created_at) FROM outbox")
        return row[0], row[1].astimezone(UTC) if row[1] is not None else None

    async def outbox_drop(self, older_than: datetime, max_events: int) -> PruneResult:
        by_age = _count(await self.conn.execute("DELETE FROM outbox WHERE created_at < $1", older_than))
        excess = await self.conn.fetchval("SELECT COUNT(*) FROM outbox") - max_events
        by_count = 0
        if excess > 0:
            sql = "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT $1)"
            by_count = _count(await self.conn.execute(sql, excess))
        return PruneResult(by_age, by_count)

    async def outbox_pending(self, limit: int) -> list[OutboxEvent]:
        rows = await self.conn.fetch(f"SELECT {OUTBOX_COLUMNS} FROM outbox ORDER BY seq LIMIT $1", limit)
        return [
            OutboxEvent(r[0], r[1], r[2], r[3], r[4].astimezone(UTC), r[5], r[6], r[7], json.loads(r[8])) for r in rows
        ]

    async def outbox_delete(self, seqs: Sequence[int]) -> None:
        await self.conn.execute("DELETE FROM outbox WHERE seq = ANY($1::bigint[])", list(seqs))

    # -- reads --------------------------------------------------------------------------------------------

    async def list_page(self, page: Page) -> tuple[list[Job], str | None]:
        clauses: list[str] = []
        args: list[object] = []
        for clause, value in (("seq <", page.before), ("status =", page.status), ("kind =", page.kind)):
            if value is not None:
                args.append(value)
                clauses.append(f"{clause} ${len(args)}")
        if page.idempotency_key is not None:
            args += [page.idempotency_key, self.now()]
            clauses.append(
                f"job_id IN (SELECT job_id FROM idempotency_keys WHERE idempotency_key = ${len(args) - 1} "
                f"AND expires_at > ${len(args)})"
            )
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = await self.conn.fetch(
            f"SELECT {COLUMNS} FROM jobs {where} ORDER BY seq DESC LIMIT ${len(args) + 1}", *args, page.limit + 1
        )
        found = rows[: page.limit]
        positions: dict[int, int] = {}
        queued = [r["seq"] for r in found if r["status"] == JobStatus.QUEUED]
        if queued:
            sql = "SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) FROM jobs WHERE status = 'queued' AND seq <= $1"
            positions = {r[0]: r[1] for r in await self.conn.fetch(sql, max(queued))}
        jobs = [row_to_job(r, positions.get(r["seq"])) for r in found]
        return jobs, (str(found[-1]["seq"]) if len(rows) > page.limit else None)

    async def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in JobStatus}
        out.update({r[0]: r[1] for r in await self.conn.fetch("SELECT status, COUNT(*) FROM jobs GROUP BY status")})
        return out

    async def retries_of(self, job_id: str) -> list[str]:
        rows = await self.conn.fetch("SELECT job_id FROM jobs WHERE retry_of = $1 ORDER BY seq", job_id)
        return [str(row[0]) for row in rows]


def _utc_of(now: datetime, which: str) -> datetime:
    if now.tzinfo is None:
        raise ValueError(f"the registry's {which} gave a naive datetime: {now!r}")
    return now.astimezone(UTC)
