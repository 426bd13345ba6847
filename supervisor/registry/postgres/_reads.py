"""The PostgreSQL registry's reads, and the outbox's reads and deletes: coroutines of a connection (asyncio code, on
trio-asyncio's loop), each run by ``_registry`` in a transaction of its own."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ...domain import TERMINAL, Job, JobStatus, ValidationError
from .._protocol import CURSOR_PATTERN, MAX_LIST_LIMIT, Host, OutboxEvent, PauseState, PrunedJob, PruneResult
from ._rows import COLUMNS, OUTBOX_COLUMNS, row_to_job


async def pause_state_in(conn: Any, *, lock: bool = False) -> PauseState:
    row = await conn.fetchrow(f"SELECT paused, paused_by, paused_at FROM queue_state{' FOR UPDATE' if lock else ''}")
    if not row["paused"]:
        return PauseState(False)
    at = row["paused_at"]
    return PauseState(True, row["paused_by"], at.astimezone(UTC) if at is not None else None)


async def running_in(conn: Any) -> list[Job]:
    """Every RUNNING row (the status index: O(running rows))."""
    rows = await conn.fetch(f"SELECT {COLUMNS} FROM jobs WHERE status = 'running' ORDER BY seq")
    return [row_to_job(r) for r in rows]


async def counts_in(conn: Any) -> dict[str, int]:
    out = {s.value: 0 for s in JobStatus}
    for row in await conn.fetch("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status"):
        out[row["status"]] = row["n"]
    return out


def list_query(status: str | None, kind: str | None, limit: int, cursor: str | None) -> tuple[str, list[object]]:
    """The page's WHERE clause and arguments; a bad status, limit or cursor is a ``ValidationError``."""
    if status is not None and status not in {s.value for s in JobStatus}:
        raise ValidationError(f"unknown status {status!r}", field="status")
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise ValidationError(f"limit must be between 1 and {MAX_LIST_LIMIT}", field="limit")
    clauses: list[str] = []
    args: list[object] = []
    if cursor is not None:
        # A cursor is a row sequence number this server issued: ASCII digits that fit a bigint.
        if not CURSOR_PATTERN.fullmatch(cursor):
            raise ValidationError("cursor is not one this server issued", field="cursor")
        args.append(int(cursor))
        clauses.append(f"seq < ${len(args)}")
    if status is not None:
        args.append(status)
        clauses.append(f"status = ${len(args)}")
    if kind is not None:
        args.append(kind)
        clauses.append(f"kind = ${len(args)}")
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), args


async def list_page(conn: Any, where: str, args: list[object], limit: int) -> tuple[list[Job], str | None]:
    query = f"SELECT {COLUMNS} FROM jobs {where} ORDER BY seq DESC LIMIT ${len(args) + 1}"
    rows = await conn.fetch(query, *args, limit + 1)
    page = rows[:limit]
    positions: dict[int, int] = {}
    queued_seqs = [r["seq"] for r in page if r["status"] == JobStatus.QUEUED]
    if queued_seqs:
        for r in await conn.fetch(
            "SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) AS pos FROM jobs WHERE status = 'queued' AND seq <= $1",
            max(queued_seqs),
        ):
            positions[r["seq"]] = r["pos"]
    jobs = [row_to_job(r, positions.get(r["seq"])) for r in page]
    return jobs, (str(page[-1]["seq"]) if len(rows) > limit else None)


async def retries_of_in(conn: Any, job_id: str) -> list[str]:
    rows = await conn.fetch("SELECT job_id FROM jobs WHERE retry_of = $1 ORDER BY seq", job_id)
    return [str(row["job_id"]) for row in rows]


# -- retention ----------------------------------------------------------------------------------------

_FINISHED = f"ended_at IS NOT NULL AND status IN ({', '.join(repr(str(s)) for s in sorted(TERMINAL))})"


async def prune_candidates(
    conn: Any, ended_before: datetime | None, keep_latest: int | None, limit: int, *, lock: bool = False
) -> list[PrunedJob]:
    """The finished rows a prune takes now, oldest first (see ``Registry.prune_jobs``). ``lock``: lock them for
    this transaction, skipping any a concurrent prune holds (two supervisors pruning at once take different rows)."""
    rules: list[str] = []
    args: list[object] = []
    if ended_before is not None:
        args.append(ended_before)
        rules.append(f"ended_at < ${len(args)}")
    if keep_latest is not None:
        # The newest finished row past the kept ones: it and every older one go (none: all are kept).
        edge = await conn.fetchrow(
            f"SELECT ended_at, seq FROM jobs WHERE {_FINISHED} ORDER BY ended_at DESC, seq DESC LIMIT 1 OFFSET $1",
            keep_latest,
        )
        if edge is not None:
            args.extend((edge["ended_at"], edge["seq"]))
            rules.append(f"(ended_at, seq) <= (${len(args) - 1}, ${len(args)})")
    if not rules:
        return []
    args.append(limit)
    rows = await conn.fetch(
        f"SELECT job_id, kind, status, ended_at, log_path, attempts FROM jobs AS j WHERE {_FINISHED} "
        f"AND ({' OR '.join(rules)}) AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id) "
        f"ORDER BY ended_at, seq LIMIT ${len(args)}{' FOR UPDATE SKIP LOCKED' if lock else ''}",
        *args,
    )
    return [
        PrunedJob(
            row["job_id"],
            row["kind"],
            JobStatus(row["status"]),
            row["ended_at"].astimezone(UTC),
            row["log_path"],
            row["attempts"],
        )
        for row in rows
    ]


async def prune_jobs(
    conn: Any, ended_before: datetime | None, keep_latest: int | None, limit: int
) -> list[PrunedJob]:
    gone = await prune_candidates(conn, ended_before, keep_latest, limit, lock=True)
    if gone:
        # An event written for a row since the read (READ COMMITTED: this statement sees it) keeps the row.
        kept = await conn.fetch(
            "DELETE FROM jobs AS j WHERE job_id = ANY($1::text[]) "
            "AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id) RETURNING job_id",
            [job.job_id for job in gone],
        )
        deleted = {row["job_id"] for row in kept}
        gone = [job for job in gone if job.job_id in deleted]
    return gone


# -- the outbox ---------------------------------------------------------------------------------------


async def outbox_pending(conn: Any, limit: int) -> list[OutboxEvent]:
    rows = await conn.fetch(f"SELECT {OUTBOX_COLUMNS} FROM outbox ORDER BY seq LIMIT $1", limit)
    return [
        OutboxEvent(
            seq=row["seq"],
            event_id=row["event_id"],
            job_id=row["job_id"],
            event=row["event"],
            created_at=row["created_at"].astimezone(UTC),
            previous_status=row["previous_status"],
            reason=row["reason"],
            boot_id=row["boot_id"],
            job=json.loads(row["job"]),
        )
        for row in rows
    ]


async def outbox_delete(conn: Any, seqs: Sequence[int]) -> None:
    await conn.execute("DELETE FROM outbox WHERE seq = ANY($1::bigint[])", list(seqs))


async def outbox_over(conn: Any, cutoff: datetime, max_events: int) -> bool:
    """Whether a prune would drop anything (read first: a prune with nothing to drop writes nothing)."""
    row = await conn.fetchrow("SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM outbox")
    return bool(row["n"] > max_events or (row["oldest"] is not None and row["oldest"] < cutoff))


async def outbox_prune(conn: Any, cutoff: datetime, max_events: int) -> PruneResult:
    by_age = _count(await conn.execute("DELETE FROM outbox WHERE created_at < $1", cutoff))
    excess = await conn.fetchval("SELECT COUNT(*) FROM outbox") - max_events
    by_count = 0
    if excess > 0:
        by_count = _count(
            await conn.execute(
                "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT $1)", excess
            )
        )
    return PruneResult(by_age, by_count)


def _count(status: str) -> int:
    """The row count of a command's status (``DELETE 3``)."""
    return int(status.rsplit(" ", 1)[-1])


# -- the fleet (ADR 0012) -----------------------------------------------------------------------------


def _host(row: Any, started: str, now: datetime) -> Host:
    return Host(
        row["host_id"],
        row["boot_id"],
        row[started].astimezone(UTC),
        row["last_seen_at"].astimezone(UTC),
        row["lease_expires_at"].astimezone(UTC),
        as_of=now,
    )


# ``now``: the leases' clock, the database server's (``Rows.lease_now``, INV-LEASE-ON-REGISTRY-CLOCK).


async def host_in(conn: Any, host_id: str, now: datetime) -> Host | None:
    row = await conn.fetchrow(
        "SELECT host_id, boot_id, started_at, last_seen_at, lease_expires_at FROM hosts WHERE host_id = $1", host_id
    )
    return None if row is None else _host(row, "started_at", now)


async def hosts_in(conn: Any, now: datetime) -> list[Host]:
    rows = await conn.fetch(
        "SELECT host_id, boot_id, started_at, last_seen_at, lease_expires_at FROM hosts ORDER BY host_id"
    )
    return [_host(row, "started_at", now) for row in rows]


async def leader_in(conn: Any, now: datetime) -> Host | None:
    """The lead's holder (``started_at``: since when it leads)."""
    row = await conn.fetchrow("SELECT host_id, boot_id, since, last_seen_at, lease_expires_at FROM leader")
    return None if row is None else _host(row, "since", now)
