"""The PostgreSQL registry's rows: the store port's one SQL text (``_sql.SqlStore``) on one asyncpg connection, inside
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
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from .._sql import SqlStore
from .._tables import COALESCE_LOCK, KEY_LOCK, LEASES, PROMOTION
from .._vocabulary import WAKE_KINDS, Wakeup
from ._schema import COALESCE_LOCK as COALESCE_ADVISORY_LOCK
from ._schema import KEY_LOCK as KEY_ADVISORY_LOCK
from ._schema import LEADER_LOCK, PROMOTE_LOCK

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


def _count(status: str) -> int:
    """The row count of a command's status (``DELETE 3``)."""
    return int(status.rsplit(" ", 1)[-1])


# Each named lock of the store port (``_tables``) as a transaction-scoped advisory lock of this schema's.
_LOCKS = {
    PROMOTION: PROMOTE_LOCK,
    LEASES: LEADER_LOCK,
    KEY_LOCK: KEY_ADVISORY_LOCK,
    COALESCE_LOCK: COALESCE_ADVISORY_LOCK,
}


class PostgresStore(SqlStore):
    """The store port on ``conn`` (see ``_tables.Store``). ``clock``: the rows' wall clock; ``lease_clock``: the
    leases' (None: the database server's); ``schema_key``: this schema's advisory lock key; ``channel``: its wake-up
    channel."""

    def __init__(
        self,
        conn: Any,
        *,
        clock: Callable[[], datetime],
        lease_clock: Callable[[], datetime] | None,
        schema_key: int,
        channel: str | None,
    ) -> None:
        self.conn = conn
        self.clock = clock
        self.lease_clock = lease_clock
        self.schema_key = schema_key
        self.channel = channel

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

    async def lock(self, name: str, key: str | None = None) -> None:
        """A transaction-scoped advisory lock of this schema's (released at commit or rollback). Promotions take
        turns under one (INV-PROMOTION-NEVER-OVERSHOOTS: the count that follows is a statement begun after the lock
        is held, so under READ COMMITTED it sees every promotion committed before), so do the leases and the lead,
        and the enqueues of one coalescing key or one idempotency key (``key``)."""
        if key is None:
            await self.conn.execute("SELECT pg_advisory_xact_lock($1, $2)", _LOCKS[name], self.schema_key)
        else:
            sql = "SELECT pg_advisory_xact_lock($1, hashtext($2))"
            await self.conn.execute(sql, _LOCKS[name], f"{self.schema_key}/{key}")

    def mark(self, n: int) -> str:
        return f"${n}"

    def decode(self, column: str, value: Any) -> Any:
        if isinstance(value, datetime):
            return value.astimezone(UTC)
        return super().decode(column, value)

    def json_equals(self, column: str, key: str, value: object, args: list[object]) -> str:
        # Containment compares as jsonb does: a number as a number (1e-05 is 0.00001, 2 is 2.0, whatever spelling
        # the server stored), a string or a bool as itself; the GIN index on the params' jsonb answers it.
        args.append(json.dumps({key: value}))
        return f"({column})::jsonb @> {self.mark(len(args))}::jsonb"

    def locking(self, skip_locked: bool) -> str:
        return " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE"

    async def fetch(self, sql: str, args: Sequence[object]) -> Sequence[Sequence[Any]]:
        rows: Sequence[Sequence[Any]] = await self.conn.fetch(sql, *args)
        return rows

    async def execute(self, sql: str, args: Sequence[object]) -> int:
        return _count(await self.conn.execute(sql, *args))

    async def execute_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        await self.conn.executemany(sql, rows)

    async def notify(self, wake: Wakeup) -> None:
        """A wake-up on this schema's channel, in the caller's transaction: delivered when it commits, never when it
        rolls back (the same one sent twice in one transaction is delivered once: the server folds them)."""
        if self.channel is not None:
            await self.conn.execute("SELECT pg_notify($1, $2)", self.channel, encode_wakeup(wake))


def _utc_of(now: datetime, which: str) -> datetime:
    if now.tzinfo is None:
        raise ValueError(f"the registry's {which} gave a naive datetime: {now!r}")
    return now.astimezone(UTC)
