"""The SQLite registry's reads, and the outbox's reads and deletes: functions of a connection, in worker threads."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime

from ...domain import TERMINAL, Job, JobStatus, ValidationError
from ...domain._model import from_iso
from .._protocol import CURSOR_PATTERN, MAX_LIST_LIMIT, Host, OutboxEvent, PauseState, PrunedJob, PruneResult
from ._rows import _OUTBOX_COLUMNS, COLUMNS, _ts, row_to_job


def paused_in(conn: sqlite3.Connection) -> bool:
    return bool(conn.execute("SELECT paused FROM queue_state").fetchone()[0])


def pause_state_in(conn: sqlite3.Connection) -> PauseState:
    row = conn.execute("SELECT paused, paused_by, paused_at FROM queue_state").fetchone()
    if not row["paused"]:
        return PauseState(False)
    return PauseState(True, row["paused_by"], _ts(row["paused_at"]))


# -- reads --------------------------------------------------------------------------------------------


def running_in(conn: sqlite3.Connection) -> list[Job]:
    """Every RUNNING row (the status index: O(running rows))."""
    rows = conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE status = 'running' ORDER BY seq")
    return [row_to_job(r) for r in rows]


def counts_in(conn: sqlite3.Connection) -> dict[str, int]:
    out = {s.value: 0 for s in JobStatus}
    for row in conn.execute("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status"):
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
        # A cursor is a row sequence number this server issued: ASCII digits that fit SQLite's INTEGER
        # (a larger number overflows inside sqlite3; int() also takes '1_0', '-3' and non-ASCII digits).
        if not CURSOR_PATTERN.fullmatch(cursor):
            raise ValidationError("cursor is not one this server issued", field="cursor")
        clauses.append("seq < ?")
        args.append(int(cursor))
    if status is not None:
        clauses.append("status = ?")
        args.append(status)
    if kind is not None:
        clauses.append("kind = ?")
        args.append(kind)
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), args


def list_page(conn: sqlite3.Connection, where: str, args: list[object], limit: int) -> tuple[list[Job], str | None]:
    query = f"SELECT {COLUMNS} FROM jobs {where} ORDER BY seq DESC LIMIT ?"
    rows = conn.execute(query, (*args, limit + 1)).fetchall()
    page = rows[:limit]
    positions: dict[int, int] = {}
    queued_seqs = [r["seq"] for r in page if r["status"] == JobStatus.QUEUED]
    if queued_seqs:
        for r in conn.execute(
            "SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) AS pos FROM jobs WHERE status = 'queued' AND seq <= ?",
            (max(queued_seqs),),
        ):
            positions[r["seq"]] = r["pos"]
    jobs = [row_to_job(r, positions.get(r["seq"])) for r in page]
    return jobs, (str(page[-1]["seq"]) if len(rows) > limit else None)


def retries_of_in(conn: sqlite3.Connection, job_id: str) -> list[str]:
    rows = conn.execute("SELECT job_id FROM jobs WHERE retry_of = ? ORDER BY seq", (job_id,))
    return [row["job_id"] for row in rows]


# -- retention ----------------------------------------------------------------------------------------

_FINISHED = f"ended_at IS NOT NULL AND status IN ({', '.join(repr(str(s)) for s in sorted(TERMINAL))})"


def prune_candidates(
    conn: sqlite3.Connection, ended_before: str | None, keep_latest: int | None, limit: int
) -> list[PrunedJob]:
    """The finished rows a prune takes now, oldest first (see ``Registry.prune_jobs``)."""
    rules: list[str] = []
    args: list[object] = []
    if ended_before is not None:
        rules.append("ended_at < ?")
        args.append(ended_before)
    if keep_latest is not None:
        # The newest finished row past the kept ones: it and every older one go (none: all are kept).
        edge = conn.execute(
            f"SELECT ended_at, seq FROM jobs WHERE {_FINISHED} ORDER BY ended_at DESC, seq DESC LIMIT 1 OFFSET ?",
            (keep_latest,),
        ).fetchone()
        if edge is not None:
            rules.append("(ended_at, seq) <= (?, ?)")
            args.extend((edge["ended_at"], edge["seq"]))
    if not rules:
        return []
    rows = conn.execute(
        f"SELECT job_id, kind, status, ended_at, log_path, attempts FROM jobs AS j WHERE {_FINISHED} "
        f"AND ({' OR '.join(rules)}) AND NOT EXISTS (SELECT 1 FROM outbox AS o WHERE o.job_id = j.job_id) "
        "ORDER BY ended_at, seq LIMIT ?",
        (*args, limit),
    ).fetchall()
    return [
        PrunedJob(
            row["job_id"],
            row["kind"],
            JobStatus(row["status"]),
            from_iso(row["ended_at"]),
            row["log_path"],
            row["attempts"],
        )
        for row in rows
    ]


def prune_jobs(
    ended_before: str | None, keep_latest: int | None, limit: int
) -> Callable[[sqlite3.Connection], list[PrunedJob]]:
    def change(conn: sqlite3.Connection) -> list[PrunedJob]:
        # Chosen again under the write lock: a row's events written since the read keep it.
        gone = prune_candidates(conn, ended_before, keep_latest, limit)
        if gone:
            conn.execute(
                f"DELETE FROM jobs WHERE job_id IN ({','.join('?' * len(gone))})", [job.job_id for job in gone]
            )
        return gone

    return change


# -- the outbox ---------------------------------------------------------------------------------------


def outbox_pending(conn: sqlite3.Connection, limit: int) -> list[OutboxEvent]:
    rows = conn.execute(f"SELECT {_OUTBOX_COLUMNS} FROM outbox ORDER BY seq LIMIT ?", (limit,)).fetchall()
    return [
        OutboxEvent(
            seq=row["seq"],
            event_id=row["event_id"],
            job_id=row["job_id"],
            event=row["event"],
            created_at=from_iso(row["created_at"]),
            previous_status=row["previous_status"],
            reason=row["reason"],
            boot_id=row["boot_id"],
            job=json.loads(row["job"]),
        )
        for row in rows
    ]


def outbox_delete(seqs: Sequence[int]) -> Callable[[sqlite3.Connection], None]:
    def change(conn: sqlite3.Connection) -> None:
        conn.execute(f"DELETE FROM outbox WHERE seq IN ({','.join('?' * len(seqs))})", list(seqs))

    return change


def outbox_prune(cutoff: str, max_events: int) -> Callable[[sqlite3.Connection], PruneResult]:
    def change(conn: sqlite3.Connection) -> PruneResult:
        by_age = conn.execute("DELETE FROM outbox WHERE created_at < ?", (cutoff,)).rowcount
        excess = conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] - max_events
        by_count = 0
        if excess > 0:
            by_count = conn.execute(
                "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT ?)", (excess,)
            ).rowcount
        return PruneResult(by_age, by_count)

    return change


# -- the fleet (ADR 0012) -----------------------------------------------------------------------------


def _host(row: sqlite3.Row, started: str, now: datetime) -> Host:
    return Host(
        row["host_id"],
        row["boot_id"],
        from_iso(row[started]),
        from_iso(row["last_seen_at"]),
        from_iso(row["lease_expires_at"]),
        as_of=now,
    )


# ``now``: the registry's clock (INV-LEASE-ON-REGISTRY-CLOCK); one machine's file, so its host's clock.


def host_in(conn: sqlite3.Connection, host_id: str, now: datetime) -> Host | None:
    row = conn.execute(
        "SELECT host_id, boot_id, started_at, last_seen_at, lease_expires_at FROM hosts WHERE host_id = ?", (host_id,)
    ).fetchone()
    return None if row is None else _host(row, "started_at", now)


def hosts_in(conn: sqlite3.Connection, now: datetime) -> list[Host]:
    rows = conn.execute(
        "SELECT host_id, boot_id, started_at, last_seen_at, lease_expires_at FROM hosts ORDER BY host_id"
    )
    return [_host(row, "started_at", now) for row in rows]


def leader_in(conn: sqlite3.Connection, now: datetime) -> Host | None:
    """The lead's holder (``started_at``: since when it leads)."""
    row = conn.execute("SELECT host_id, boot_id, since, last_seen_at, lease_expires_at FROM leader").fetchone()
    return None if row is None else _host(row, "since", now)
