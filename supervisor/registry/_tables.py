"""The registry's tables as the rules see them: the query description (tables, columns, ``Where``, ``Read``), the
narrow port every backend implements (``Store``), and the rows read into domain types and back. Nothing here runs a
statement: the rules (``_jobs``, ``_beats``, ``_fleet``, ``_upkeep``, ``_reads``) ask a store in these terms.

A store is asked only in these terms: a table, a ``Where`` (conditions over its columns, in domain values), the
columns, an order, a limit; it answers rows as dicts of domain values (aware datetimes, booleans, decoded JSON).
It decides nothing and knows no job (procrastinate's connectors, River's drivers): SQLite and PostgreSQL turn the
terms into one SQL text (``_sql.SqlStore``); memory is SQLite's store on an in-memory database (``memory.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from ..domain import TERMINAL, Attempt, IdentityRecord, Job, JobStatus
from ._vocabulary import Host, PauseState, Wakeup

JOBS, OUTBOX, KEYS, QUEUE = "jobs", "outbox", "idempotency_keys", "queue_state"
HOSTS, LEADER, SETTINGS, FORGOTTEN = "hosts", "leader", "fleet_settings", "forgotten_hosts"
DRAINS = "host_drains"

# Every column a select reads by table. A job's ``coalesce_key`` is written at insert and matched by an enqueue, never
# read back; ``queue_state`` is one row (its key, ``singleton``, is the migration's).
COLUMNS: Mapping[str, tuple[str, ...]] = {
    JOBS: (
        "job_id", "seq", "kind", "params", "argv", "status", "error_reason", "exit_code", "created_at", "started_at",
        "ended_at", "attempts", "cancel_requested", "boot_id", "identity", "token_hash", "completed_units",
        "total_units", "stage", "last_heartbeat_at", "last_progress_at", "log_path", "stalled", "stalled_since",
        "silent", "max_attempts", "not_before", "history", "host_id", "retry_of", "idempotency_key", "enqueued_by",
        "cancelled_by", "schedule", "schedule_every_s", "stop_reason",
    ),
    OUTBOX: ("seq", "event_id", "job_id", "event", "created_at", "previous_status", "reason", "boot_id", "job"),
    KEYS: ("idempotency_key", "answer_index", "fingerprint", "job_id", "status", "queue_position", "coalesced",
           "created_at", "expires_at"),
    QUEUE: ("paused", "paused_by", "paused_at"),
    HOSTS: ("host_id", "boot_id", "started_at", "last_seen_at", "lease_expires_at", "release_version",
            "contract_level"),
    LEADER: ("one", "host_id", "boot_id", "since", "last_seen_at", "lease_expires_at"),
    SETTINGS: ("name", "value", "host_id", "recorded_at"),
    FORGOTTEN: ("host_id", "boot_id", "forgotten_at"),
    DRAINS: ("host_id", "drained_at", "drained_by"),
}  # fmt: skip
AUTO_SEQ = frozenset({JOBS, OUTBOX})  # the store numbers these rows' ``seq`` at insert, in insertion order
# How a column keeps its value, by name (a name means one thing in every table); each store has its own form of each.
TIMESTAMPS = frozenset(
    {"created_at", "started_at", "ended_at", "last_heartbeat_at", "last_progress_at", "stalled_since", "not_before",
     "paused_at", "since", "last_seen_at", "lease_expires_at", "recorded_at", "forgotten_at", "expires_at",
     "drained_at"}
)  # fmt: skip
BOOLEANS = frozenset({"cancel_requested", "stalled", "silent", "paused", "coalesced"})
JSON_COLUMNS = frozenset({"params", "argv", "identity", "history", "job"})

# The locks a backend that locks rows takes, until the transaction ends (``Store.lock``).
PROMOTION, LEASES, KEY_LOCK, COALESCE_LOCK = "promotion", "leases", "key", "coalesce"

Cond = tuple[str, str, Any]  # (column, operator, value): = != < <= > >= in; "= None" is IS NULL, "!= None" IS NOT
Where = tuple[Any, ...]  # conditions (``Cond`` or ``Either``) that all hold


@dataclass(frozen=True)
class Either:
    """One of several wheres holds (SQL's OR)."""

    options: tuple[Where, ...]


@dataclass(frozen=True)
class Read:
    """How a select reads: which columns (None: all of ``COLUMNS``), in what order (column names, ``-name``
    descending), how many from where; ``lock``: hold the rows until the transaction ends where the backend locks
    rows (PostgreSQL's ``FOR UPDATE``; ``skip_locked``: pass over a row another transaction holds)."""

    columns: Sequence[str] | None = None
    order: Sequence[str] = ()
    limit: int | None = None
    offset: int = 0
    lock: bool = False
    skip_locked: bool = False


EVERY = Read()
QUEUED, RUNNING = JobStatus.QUEUED.value, JobStatus.RUNNING.value
FINISHED: Where = (("ended_at", "!=", None), ("status", "in", tuple(sorted(s.value for s in TERMINAL))))


class Store(Protocol):
    """One transaction's view of a backend's tables; it decides nothing (the rules do).

    ``select`` reads as its ``Read`` says; ``lock(name, key)`` takes the named lock where the backend has one
    (SQLite's write transaction and memory's single step hold everything already). ``update`` and ``delete`` answer
    how many rows they changed; ``put`` inserts a row or replaces the one with the same ``key`` columns."""

    def now(self) -> datetime: ...
    async def lease_now(self) -> datetime: ...
    async def lock(self, name: str, key: str | None = None) -> None: ...
    async def select(self, table: str, where: Where = (), read: Read = EVERY) -> list[dict[str, Any]]: ...
    async def count(self, table: str, where: Where = ()) -> int: ...
    async def tally(self, table: str, column: str, where: Where = ()) -> dict[Any, int]: ...
    async def insert(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None: ...
    async def put(self, table: str, row: Mapping[str, Any], key: Sequence[str]) -> None: ...
    async def update(self, table: str, where: Where, values: Mapping[str, Any]) -> int: ...
    async def delete(self, table: str, where: Where) -> int: ...
    async def notify(self, wake: Wakeup) -> None: ...


# -- rows and domain types ------------------------------------------------------------------------------


def job_of(row: Mapping[str, Any], position: int | None = None) -> Job:
    """A jobs row as a ``Job`` (a queued one with its ``position``)."""
    fields = {column: row[column] for column in COLUMNS[JOBS]}
    fields["next_attempt_at"] = fields.pop("not_before")
    fields["status"] = JobStatus(fields["status"])
    if fields["identity"] is not None:
        fields["identity"] = IdentityRecord.from_json(fields["identity"])
    fields["history"] = tuple(Attempt.from_json(a) for a in fields["history"])
    return Job(**fields, queue_position=position)


def stored(fields: Mapping[str, object]) -> dict[str, object]:
    """``Job`` fields as the jobs row keeps them (a resubmitted row's ``next_attempt_at`` is ``not_before``)."""
    out: dict[str, object] = {}
    for name, value in fields.items():
        if isinstance(value, IdentityRecord):
            value = value.to_json()
        elif name == "history":
            value = [attempt.to_json() for attempt in value]  # type: ignore[attr-defined]
        elif isinstance(value, JobStatus):
            value = value.value
        out["not_before" if name == "next_attempt_at" else name] = value
    return out


def pause_of(rows: Sequence[Mapping[str, Any]]) -> PauseState:
    """The queue's one row as the pause of promotion (read by a promotion, and by the pause's own rules)."""
    [row] = rows
    return PauseState(True, row["paused_by"], row["paused_at"]) if row["paused"] else PauseState(False)


def host_of(row: Mapping[str, Any], now: datetime) -> Host:
    """A hosts row (or the leader's, whose ``since`` is when it took the lead) as of ``now``."""
    started = row["since"] if "since" in row else row["started_at"]
    return Host(
        row["host_id"], row["boot_id"], started, row["last_seen_at"], row["lease_expires_at"], as_of=now,
        release=row.get("release_version"), contract_level=row.get("contract_level"),
    )  # fmt: skip


def host_row(host: Host) -> dict[str, Any]:
    return {"host_id": host.host_id, "boot_id": host.boot_id, "started_at": host.started_at,
            "last_seen_at": host.last_seen_at, "lease_expires_at": host.lease_expires_at,
            "release_version": host.release, "contract_level": host.contract_level}  # fmt: skip


@dataclass(frozen=True)
class Author:
    """Who makes a registry's changes: ``boot_id``, the boot named in each event (None for a process that is no
    supervisor); ``outbox``: write events at all (a supervisor with no webhook turns it off: nothing would send
    them)."""

    boot_id: str | None
    outbox: bool


class LocalStore:
    """What the stores of one machine's rows share (SQLite, memory): one clock, for the rows and the leases alike
    (INV-LEASE-ON-REGISTRY-CLOCK: one machine's); no lock beyond the transaction, which holds every row already; and
    nobody else to wake (one process owns the rows)."""

    clock: Callable[[], datetime]

    def now(self) -> datetime:
        """The clock's time in UTC (a naive one is refused): what a row stores, and so what a write answers."""
        now = self.clock()
        if now.tzinfo is None:
            raise ValueError(f"the registry's clock gave a naive datetime: {now!r}")
        return now.astimezone(UTC)

    async def lease_now(self) -> datetime:
        return self.now()

    async def lock(self, name: str, key: str | None = None) -> None:
        """The transaction holds the write lock (SQLite's; a memory step is atomic by itself): a promotion's count
        and flips, a keyed request's check and its insert, a renewal's read and write are one step under it."""

    async def notify(self, wake: Wakeup) -> None:
        """Nobody else hears this registry."""
