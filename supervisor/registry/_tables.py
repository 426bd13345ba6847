"""The registry's tables as the rules see them: the narrow port every backend implements (``Store``), the rows read
into domain types and back, and the reads every backend answers alike, written once over the port.

A store is asked only in these terms: a table, a ``Where`` (conditions over its columns, in domain values), the
columns, an order, a limit; it answers rows as dicts of domain values (aware datetimes, booleans, decoded JSON).
It decides nothing and knows no job (procrastinate's connectors, River's drivers): SQLite and PostgreSQL turn the
terms into one SQL text (``_sql.SqlStore``); memory is SQLite's store on an in-memory database (``memory.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from ..domain import TERMINAL, Attempt, IdentityRecord, Job, JobFilter, JobStatus, PageRequest
from ._vocabulary import (
    FleetSetting,
    Host,
    OutboxEvent,
    PauseState,
    PrunedJob,
    Receipt,
    Wakeup,
)

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
    """One transaction's view of a backend's tables; it decides nothing (``_engine.Rules`` do).

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


def _is(column: str, value: object) -> Cond:
    return (column, "=", value)


# -- the reads ----------------------------------------------------------------------------------------------


async def job(store: Store, job_id: str, *, lock: bool = False, position: bool = False) -> Job | None:
    rows = await store.select(JOBS, (_is("job_id", job_id),), Read(lock=lock))
    if not rows:
        return None
    row, at = rows[0], None
    if position and row["status"] == QUEUED:
        at = await store.count(JOBS, (_is("status", QUEUED), ("seq", "<=", row["seq"])))
    return job_of(row, at)


async def jobs(store: Store, job_ids: Sequence[str]) -> list[Job]:
    """These rows, in this order (each must be there)."""
    rows = {row["job_id"]: row for row in await store.select(JOBS, (("job_id", "in", tuple(job_ids)),))}
    return [job_of(rows[job_id]) for job_id in job_ids]


async def running(store: Store) -> list[Job]:
    """Every RUNNING row, oldest first (the status index: O(running rows))."""
    return [job_of(row) for row in await store.select(JOBS, (_is("status", RUNNING),), Read(order=("seq",)))]


async def promotable(
    store: Store,
    now: datetime,
    limit: int,
    *,
    lock: bool = False,
    skip_kinds: tuple[str, ...] = (),
    after: int | None = None,
) -> list[Job]:
    """The oldest queued rows whose backoff has passed (of no kind in ``skip_kinds``; past the row ``after``, by
    ``seq``). Locked (a promotion's): a row a concurrent cancel is ending is waited for, then skipped if no longer
    queued; a plain read (the queue's watch) locks nothing."""
    ready = Either(((_is("not_before", None),), (("not_before", "<=", now),)))
    where: Where = (_is("status", QUEUED), ready)
    if skip_kinds:
        where += (("kind", "not in", skip_kinds),)
    if after is not None:
        where += (("seq", ">", after),)
    rows = await store.select(JOBS, where, Read(order=("seq",), limit=limit, lock=lock))
    return [job_of(row) for row in rows]


async def next_to_run(store: Store, now: datetime, limits: Mapping[str, int]) -> Job | None:
    """The queued row a promotion would take next: the oldest ready one whose kind is below its ``limits`` (each
    kind's max_running, counted from the running rows as a promotion counts them)."""
    running = await store.tally(JOBS, "kind", (_is("status", RUNNING),)) if limits else {}
    full = tuple(sorted(kind for kind, limit in limits.items() if running.get(kind, 0) >= limit))
    rows = await promotable(store, now, 1, skip_kinds=full)
    return rows[0] if rows else None


async def kind_counts(store: Store) -> dict[str, tuple[int, int]]:
    """Each kind with rows running or queued: (running, queued)."""
    running = await store.tally(JOBS, "kind", (_is("status", RUNNING),))
    queued = await store.tally(JOBS, "kind", (_is("status", QUEUED),))
    return {kind: (running.get(kind, 0), queued.get(kind, 0)) for kind in sorted({*running, *queued})}


async def next_backoff_end(store: Store, now: datetime) -> datetime | None:
    waiting = (_is("status", QUEUED), ("not_before", ">", now))
    rows = await store.select(JOBS, waiting, Read(columns=("not_before",), order=("not_before",), limit=1))
    return rows[0]["not_before"] if rows else None


async def retries_of(store: Store, job_id: str) -> list[str]:
    rows = await store.select(JOBS, (_is("retry_of", job_id),), Read(columns=("job_id",), order=("seq",)))
    return [row["job_id"] for row in rows]


async def counts(store: Store) -> dict[str, int]:
    return {**{status.value: 0 for status in JobStatus}, **await store.tally(JOBS, "status")}


async def pause(store: Store, *, lock: bool = False) -> PauseState:
    [row] = await store.select(QUEUE, (), Read(lock=lock))
    return PauseState(True, row["paused_by"], row["paused_at"]) if row["paused"] else PauseState(False)


async def hosts(store: Store, now: datetime) -> list[Host]:
    return [host_of(row, now) for row in await store.select(HOSTS, (), Read(order=("host_id",)))]


async def host(store: Store, host_id: str, now: datetime) -> Host | None:
    rows = await store.select(HOSTS, (_is("host_id", host_id),))
    return host_of(rows[0], now) if rows else None


async def drained(store: Store) -> dict[str, datetime]:
    """The hosts an operator drained, and since when."""
    return {row["host_id"]: row["drained_at"] for row in await store.select(DRAINS)}


async def leader(store: Store, now: datetime) -> Host | None:
    """The lead's holder (its ``started_at``: since when it leads)."""
    rows = await store.select(LEADER)
    return host_of(rows[0], now) if rows else None


async def setting(store: Store, name: str) -> FleetSetting | None:
    rows = await store.select(SETTINGS, (_is("name", name),))
    return FleetSetting(**rows[0]) if rows else None


async def receipts(store: Store, key: str, now: datetime) -> tuple[str, list[Receipt]] | None:
    """A key's fingerprint and its receipts in answer order, while it is live at ``now``."""
    rows = await store.select(
        KEYS, (_is("idempotency_key", key), ("expires_at", ">", now)), Read(order=("answer_index",))
    )
    if not rows:
        return None
    answer = [Receipt(r["job_id"], JobStatus(r["status"]), r["queue_position"], r["coalesced"]) for r in rows]
    return rows[0]["fingerprint"], answer


async def keyed(store: Store, job_ids: Sequence[str] | None = None, key: str | None = None) -> set[str]:
    """The jobs live keys answered (among ``job_ids``; ``key``: that key's alone)."""
    where: Where = (("expires_at", ">", store.now()),)
    where += (("job_id", "in", tuple(job_ids)),) if job_ids is not None else ()
    where += (_is("idempotency_key", key),) if key is not None else ()
    return {row["job_id"] for row in await store.select(KEYS, where, Read(columns=("job_id",)))}


async def outbox_pending(store: Store, limit: int) -> list[OutboxEvent]:
    return [OutboxEvent(**row) for row in await store.select(OUTBOX, (), Read(order=("seq",), limit=limit))]


async def outbox_stats(store: Store) -> tuple[int, datetime | None]:
    """How many events wait, and when the oldest was written."""
    oldest = await store.select(OUTBOX, (), Read(columns=("created_at",), order=("created_at",), limit=1))
    return await store.count(OUTBOX), oldest[0]["created_at"] if oldest else None


async def finished_edge(store: Store, keep_latest: int) -> tuple[datetime, int] | None:
    """The newest finished row past the ``keep_latest`` newest ones: (its ``ended_at``, its ``seq``)."""
    order = ("-ended_at", "-seq")
    rows = await store.select(
        JOBS, FINISHED, Read(columns=("ended_at", "seq"), order=order, limit=1, offset=keep_latest)
    )
    return (rows[0]["ended_at"], rows[0]["seq"]) if rows else None


async def prunable(
    store: Store, ended_before: datetime | None, edge: tuple[datetime, int] | None, limit: int, *, lock: bool
) -> list[PrunedJob]:
    """The oldest finished rows (by ``ended_at``, then insertion) that ended before ``ended_before`` or are at most
    ``edge``, none with an event in the outbox or a live key's answer, at most ``limit``. ``lock``: each is held
    (another prune skips it) before it is checked, so no event is written for it after the check (every change
    locks its row before it writes its event)."""
    rules: list[Where] = []
    if ended_before is not None:
        rules.append((("ended_at", "<", ended_before),))
    if edge is not None:
        rules += [(("ended_at", "<", edge[0]),), (_is("ended_at", edge[0]), ("seq", "<=", edge[1]))]
    found: list[PrunedJob] = []
    after: Where = ()
    columns = ("job_id", "kind", "status", "ended_at", "log_path", "attempts", "seq")
    while len(found) < limit:
        where = (*FINISHED, Either(tuple(rules)), *after)
        rows = await store.select(
            JOBS, where, Read(columns=columns, order=("ended_at", "seq"), limit=limit, lock=lock, skip_locked=lock)
        )
        ids = tuple(row["job_id"] for row in rows)
        events = await store.select(OUTBOX, (("job_id", "in", ids),), Read(columns=("job_id",))) if ids else []
        kept = {row["job_id"] for row in events} | (await keyed(store, ids) if ids else set())
        found += [PrunedJob(r["job_id"], r["kind"], JobStatus(r["status"]), r["ended_at"], r["log_path"], r["attempts"])
                  for r in rows if r["job_id"] not in kept]  # fmt: skip
        if len(rows) < limit:
            break
        end, seq = rows[-1]["ended_at"], rows[-1]["seq"]  # the next page: the rows after the last one read
        after = (Either(((("ended_at", ">", end),), (_is("ended_at", end), ("seq", ">", seq)))),)
    return found[:limit]


async def matching(store: Store, wanted: JobFilter) -> Where:
    """The conditions of ``wanted`` on the jobs table (a live key's jobs read first)."""
    filters = (
        ("status", "=", wanted.status.value if wanted.status is not None else None),
        ("kind", "=", wanted.kind),
        ("error_reason", "=", wanted.reason),
        ("created_at", ">=", wanted.created_since),
        ("created_at", "<", wanted.created_until),
        ("ended_at", ">=", wanted.ended_since),
        ("host_id", "=", wanted.host),
    )
    where: Where = tuple(cond for cond in filters if cond[2] is not None)
    where += tuple(("params", "json=", (name, value)) for name, value in wanted.params)
    if wanted.idempotency_key is not None:
        where += (("job_id", "in", tuple(await keyed(store, key=wanted.idempotency_key))),)
    return where


async def schedule_busy(store: Store, name: str) -> Job | None:
    """The newest job of schedule ``name`` that is queued or running, if any."""
    where = (_is("schedule", name), ("status", "in", (QUEUED, RUNNING)))
    rows = await store.select(JOBS, where, Read(order=("-seq",), limit=1))
    return job_of(rows[0]) if rows else None


async def newest_of_schedules(store: Store, limit: int) -> dict[str, tuple[datetime, float, str]]:
    """Each schedule's newest job (its creation, the period, its id), read from the newest ``limit`` scheduled rows
    (the partial index on ``schedule``)."""
    read = Read(columns=("schedule", "schedule_every_s", "created_at", "job_id"), order=("-seq",), limit=limit)
    newest: dict[str, tuple[datetime, float, str]] = {}
    for row in await store.select(JOBS, (("schedule", "!=", None),), read):
        newest.setdefault(row["schedule"], (row["created_at"], row["schedule_every_s"], row["job_id"]))
    return newest


async def select_ids(store: Store, wanted: JobFilter, limit: int) -> list[str]:
    """The ids of up to ``limit`` rows under ``wanted``, newest first (a bulk action's selection)."""
    read = Read(columns=("job_id",), order=("-seq",), limit=limit)
    rows = await store.select(JOBS, await matching(store, wanted), read)
    return [row["job_id"] for row in rows]


async def list_page(store: Store, page: PageRequest) -> tuple[list[Job], str | None]:
    """A page of rows, newest first, and the cursor of the next (None: the last page)."""
    where = (*await matching(store, page.filter), *((("seq", "<", page.before),) if page.before is not None else ()))
    rows = await store.select(JOBS, where, Read(order=("-seq",), limit=page.limit + 1))
    found = rows[: page.limit]
    positions: dict[int, int] = {}
    queued = [row["seq"] for row in found if row["status"] == QUEUED]
    if queued:
        ahead = (_is("status", QUEUED), ("seq", "<=", max(queued)))
        seqs = await store.select(JOBS, ahead, Read(columns=("seq",), order=("seq",)))
        positions = {row["seq"]: at for at, row in enumerate(seqs, start=1)}
    cursor = str(found[-1]["seq"]) if len(rows) > page.limit else None
    return [job_of(row, positions.get(row["seq"])) for row in found], cursor


async def outbox_over(store: Store, max_events: int, max_age_s: float) -> bool:
    """Whether ``Rules.outbox_prune`` would drop anything (so that a prune with nothing to do writes nothing)."""
    count, oldest = await outbox_stats(store)
    return count > max_events or (oldest is not None and oldest < store.now() - timedelta(seconds=max_age_s))
