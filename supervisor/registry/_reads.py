"""The registry's plain reads of the jobs table, written once over the store port: the list and its filters, the
running rows, the counts, the schedules' newest jobs, the retries of a job. (The reads a rule makes live beside
that rule: ``_jobs``, ``_fleet``, ``_upkeep``.)
"""

from __future__ import annotations

from datetime import datetime

from ..domain import FIRST_PAGE, Job, JobFilter, JobStatus, PageRequest
from . import _tables as tables
from ._tables import Read, Store, Where, job_of
from ._upkeep import keyed


async def running_jobs(store: Store) -> list[Job]:
    """Every RUNNING row, oldest first: O(running rows), whatever the history (the status index)."""
    rows = await store.select(tables.JOBS, (("status", "=", tables.RUNNING),), Read(order=("seq",)))
    return [job_of(row) for row in rows]


async def list_jobs(store: Store, page: PageRequest = FIRST_PAGE) -> tuple[list[Job], str | None]:
    """A page of rows, newest first, and the cursor of the next (None at the end): rows added meanwhile never
    shift a page."""
    where = (*await matching(store, page.filter), *((("seq", "<", page.before),) if page.before is not None else ()))
    rows = await store.select(tables.JOBS, where, Read(order=("-seq",), limit=page.limit + 1))
    found = rows[: page.limit]
    positions: dict[int, int] = {}
    queued = [row["seq"] for row in found if row["status"] == tables.QUEUED]
    if queued:
        ahead = (("status", "=", tables.QUEUED), ("seq", "<=", max(queued)))
        seqs = await store.select(tables.JOBS, ahead, Read(columns=("seq",), order=("seq",)))
        positions = {row["seq"]: at for at, row in enumerate(seqs, start=1)}
    cursor = str(found[-1]["seq"]) if len(rows) > page.limit else None
    return [job_of(row, positions.get(row["seq"])) for row in found], cursor


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


async def select_ids(store: Store, wanted: JobFilter, limit: int) -> list[str]:
    """The ids of up to ``limit`` rows under ``wanted``, newest first (a bulk action's selection)."""
    read = Read(columns=("job_id",), order=("-seq",), limit=limit)
    rows = await store.select(tables.JOBS, await matching(store, wanted), read)
    return [row["job_id"] for row in rows]


async def counts(store: Store) -> dict[str, int]:
    """Rows per status (every status present)."""
    return {**{status.value: 0 for status in JobStatus}, **await store.tally(tables.JOBS, "status")}


async def kind_counts(store: Store) -> dict[str, tuple[int, int]]:
    """Each kind with rows running or queued, fleet-wide: (running, queued)."""
    running = await store.tally(tables.JOBS, "kind", (("status", "=", tables.RUNNING),))
    queued = await store.tally(tables.JOBS, "kind", (("status", "=", tables.QUEUED),))
    return {kind: (running.get(kind, 0), queued.get(kind, 0)) for kind in sorted({*running, *queued})}


async def newest_of_schedules(store: Store) -> dict[str, tuple[datetime, float, str]]:
    """Each schedule's newest job: its creation, the schedule's period and its id (read from the newest 1,000
    scheduled rows: the partial index on ``schedule``)."""
    read = Read(columns=("schedule", "schedule_every_s", "created_at", "job_id"), order=("-seq",), limit=1000)
    newest: dict[str, tuple[datetime, float, str]] = {}
    for row in await store.select(tables.JOBS, (("schedule", "!=", None),), read):
        newest.setdefault(row["schedule"], (row["created_at"], row["schedule_every_s"], row["job_id"]))
    return newest


async def retries_of(store: Store, job_id: str) -> list[str]:
    """The ids of the rows enqueued as explicit retries of ``job_id`` (``NewJob.retry_of``), oldest first; empty
    when there is none (an unknown job too: a retry may outlive the row it retried)."""
    rows = await store.select(tables.JOBS, (("retry_of", "=", job_id),), Read(columns=("job_id",), order=("seq",)))
    return [row["job_id"] for row in rows]
