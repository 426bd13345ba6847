"""The PostgreSQL registry's rows: their stored forms, and the primitives every operation builds on (read a row,
change its status through the one table of transitions, write an event in the change's own transaction).

asyncio code on an asyncpg connection, always inside the transaction ``_registry`` opened (READ COMMITTED: each
statement sees what committed before it began, which the promotion relies on: see ``_operations.promote_in``).
Timestamps are ``timestamptz`` (aware ``datetime``s both ways); params, argv, the identity record and the history
are JSON text, as in the SQLite registry.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from ...domain import Job, JobNotFound, JobStatus, RegistryError, Unauthorized, check_transition
from ...domain._model import Attempt, IdentityRecord, hash_token
from .._protocol import WAKE_KINDS, Wakeup

COLUMNS = (
    "job_id, seq, kind, params, argv, status, error_reason, exit_code, created_at, started_at, ended_at, "
    "attempts, cancel_requested, boot_id, identity, token_hash, completed_units, total_units, stage, "
    "last_heartbeat_at, last_progress_at, log_path, stalled, stalled_since, silent, max_attempts, not_before, history, "
    "host_id, retry_of"
)
OUTBOX_COLUMNS = "seq, event_id, job_id, event, created_at, previous_status, reason, boot_id, job"


def _utc(ts: datetime | None) -> datetime | None:
    return ts.astimezone(UTC) if ts is not None else None


def row_to_job(row: Mapping[str, Any], queue_position: int | None = None) -> Job:
    identity = row["identity"]
    created_at = _utc(row["created_at"])
    assert created_at is not None
    return Job(
        job_id=row["job_id"],
        seq=row["seq"],
        kind=row["kind"],
        params=json.loads(row["params"]),
        argv=json.loads(row["argv"]),
        status=JobStatus(row["status"]),
        error_reason=row["error_reason"],
        exit_code=row["exit_code"],
        created_at=created_at,
        started_at=_utc(row["started_at"]),
        ended_at=_utc(row["ended_at"]),
        attempts=row["attempts"],
        cancel_requested=row["cancel_requested"],
        boot_id=row["boot_id"],
        identity=IdentityRecord.from_json(json.loads(identity)) if identity is not None else None,
        token_hash=row["token_hash"],
        completed_units=row["completed_units"],
        total_units=row["total_units"],
        stage=row["stage"],
        last_heartbeat_at=_utc(row["last_heartbeat_at"]),
        last_progress_at=_utc(row["last_progress_at"]),
        log_path=row["log_path"],
        queue_position=queue_position,
        stalled=row["stalled"],
        stalled_since=_utc(row["stalled_since"]),
        silent=row["silent"],
        max_attempts=row["max_attempts"],
        next_attempt_at=_utc(row["not_before"]),
        history=tuple(Attempt.from_json(a) for a in json.loads(row["history"])),
        host_id=row["host_id"],
        retry_of=row["retry_of"],
    )


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


def identity_text(identity: IdentityRecord | None) -> str | None:
    return json.dumps(identity.to_json(), sort_keys=True) if identity is not None else None


class Rows:
    """The row-level primitives of every operation. ``boot_id``: who makes the changes (goes into each event);
    ``outbox``: write events at all; ``clock``: the wall clock of every timestamp but the leases'; ``lease_clock``:
    the leases' (None: the database server's, ``lease_now``); ``keys``: this schema's advisory lock keys."""

    def __init__(
        self,
        *,
        clock: Callable[[], datetime],
        boot_id: str | None,
        outbox: bool,
        lease_clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.clock = clock
        self.lease_clock = lease_clock
        self.boot_id = boot_id
        self.outbox = outbox
        self.schema_key = 0  # set once the registry knows its schema (``_registry.PostgresRegistry.open``)
        self.channel: str | None = None  # this schema's wake-up channel (``wakeup_channel``), set with the key

    def now(self) -> datetime:
        """The clock's time in UTC (a naive time is refused, as the other registries refuse it)."""
        now = self.clock()
        if now.tzinfo is None:
            raise ValueError(f"the registry's clock gave a naive datetime: {now!r}")
        return now.astimezone(UTC)

    async def lease_now(self, conn: Any) -> datetime:
        """The time every lease is written and judged by: the database server's clock, one for every host of the
        fleet (INV-LEASE-ON-REGISTRY-CLOCK): hosts whose own clocks disagree still agree on whose lease holds. Read
        at the moment of the call (``clock_timestamp()``, not the transaction's start: a renewal may have waited for
        the leases' lock). A test's ``lease_clock`` stands in for it."""
        if self.lease_clock is not None:
            now = self.lease_clock()
            if now.tzinfo is None:
                raise ValueError(f"the registry's lease clock gave a naive datetime: {now!r}")
            return now.astimezone(UTC)
        now = await conn.fetchval("SELECT clock_timestamp()")
        assert isinstance(now, datetime)
        return now.astimezone(UTC)

    async def get_in(self, conn: Any, job_id: str, *, lock: bool = False) -> Job:
        """One row with its queue position. ``lock``: lock it for this transaction (``FOR UPDATE``) -- every write
        that reads a row to decide its change does, so a concurrent change waits for this one, never interleaves."""
        row = await conn.fetchrow(
            f"SELECT {COLUMNS} FROM jobs WHERE job_id = $1{' FOR UPDATE' if lock else ''}", job_id
        )
        if row is None:
            raise JobNotFound(job_id)
        position = None
        if row["status"] == JobStatus.QUEUED:
            position = await conn.fetchval(
                "SELECT COUNT(*) FROM jobs WHERE status = 'queued' AND seq <= $1", row["seq"]
            )
        return row_to_job(row, position)

    async def record_event_in(
        self, conn: Any, job_id: str, event: str, previous_status: str | None, reason: str | None
    ) -> None:
        """Write one outbox event, inside the caller's transaction: it commits (or rolls back) with the change.
        Events of one job are in the order written: every change of a row holds its row lock until it commits."""
        if not self.outbox:
            return
        row = await conn.fetchrow(f"SELECT {COLUMNS} FROM jobs WHERE job_id = $1", job_id)
        job = row_to_job(row)  # the row as of this change (no queue position: it would cost a count)
        await conn.execute(
            "INSERT INTO outbox (event_id, job_id, event, created_at, previous_status, reason, boot_id, job) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            uuid.uuid4().hex,
            job_id,
            event,
            self.now(),
            previous_status,
            reason,
            self.boot_id,
            json.dumps(job.public(), sort_keys=True, separators=(",", ":")),
        )

    async def notify_in(self, conn: Any, wake: Wakeup) -> None:
        """Send a wake-up on this schema's channel, inside the caller's transaction: PostgreSQL delivers it when
        the transaction commits, and never when it rolls back. The same wake-up sent twice in one transaction is
        delivered once (the server folds identical payloads)."""
        if self.channel is not None:
            await conn.execute("SELECT pg_notify($1, $2)", self.channel, encode_wakeup(wake))

    async def set_status(
        self, conn: Any, job: Job, to_status: JobStatus, *, reason: str | None = None, **fields: Any
    ) -> None:
        """The one place a row's status changes; an illegal transition raises. The change's outbox event is written
        here too, in the same transaction. ``fields`` are column values in their stored form."""
        check_transition(job.job_id, job.status, to_status)
        if to_status.is_terminal or to_status is JobStatus.QUEUED:
            # A job's token works only while the job runs (a late or stolen token then matches nothing).
            fields = {**fields, "token_hash": None}
        names = ("status", *fields)
        assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(names, start=1))
        n = len(names)
        done = await conn.execute(
            f"UPDATE jobs SET {assignments} WHERE job_id = ${n + 1} AND status = ${n + 2}",
            str(to_status),
            *fields.values(),
            job.job_id,
            str(job.status),
        )
        if done != "UPDATE 1":  # the caller read the row FOR UPDATE in this transaction: cannot happen
            raise RegistryError(f"job {job.job_id}: status changed under the row lock")
        if reason is None:
            reason = "promoted" if to_status is JobStatus.RUNNING else fields.get("error_reason")
        await self.record_event_in(conn, job.job_id, "job.transition", str(job.status), reason)

    async def authenticated(self, conn: Any, job_id: str, token: str, *, lock: bool = False) -> Job:
        try:
            job = await self.get_in(conn, job_id, lock=lock)
        except JobNotFound:
            raise Unauthorized("the token is not this job's") from None
        # Constant-time compare of the hashes; a missing hash never matches.
        if job.token_hash is None or not hmac.compare_digest(job.token_hash, hash_token(token)):
            raise Unauthorized("the token is not this job's")
        return job
