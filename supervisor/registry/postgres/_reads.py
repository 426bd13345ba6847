"""The PostgreSQL registry's reads, and the outbox's reads and deletes: coroutines of a connection (asyncio code, on
trio-asyncio's loop), each run by ``_registry`` in a transaction of its own."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ...domain import Job, JobStatus, ValidationError
from .._protocol import CURSOR_PATTERN, MAX_LIST_LIMIT, Host, OutboxEvent, PauseState, PruneResult
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


def _host(row: Any, started: str) -> Host:
    return Host(
        row["host_id"],
        row["boot_id"],
        row[started].astimezone(UTC),
        row["last_seen_at"].astimezone(UTC),
        row["lease_expires_at"].astimezone(UTC),
    )


async def host_in(conn: Any, host_id: str) -> Host | None:
    row = await conn.fetchrow(
        "SELECT host_id, boot_id, started_at, last_seen_at, lease_expires_at FROM hosts WHERE host_id = $1", host_id
    )
    return None if row is None else _host(row, "started_at")


async def hosts_in(conn: Any) -> list[Host]:
    rows = await conn.fetch(
        "SELECT host_id, boot_id, started_at, last_seen_at, lease_expires_at FROM hosts ORDER BY host_id"
    )
    return [_host(row, "started_at") for row in rows]


async def leader_in(conn: Any) -> Host | None:
    """The lead's holder (``started_at``: since when it leads)."""
    row = await conn.fetchrow("SELECT host_id, boot_id, since, last_seen_at, lease_expires_at FROM leader")
    return None if row is None else _host(row, "since")
