"""The SQLite registry's rows: their text forms, and the primitives every operation builds on (read a row, change
its status through the one table of transitions, write an event in the change's own transaction). Blocking code, in
worker threads only.

The row's text forms live here and nowhere else: timestamps as ISO 8601 text (``to_iso``), params, argv and the
identity record as JSON.
"""

from __future__ import annotations

import hmac
import json
import sqlite3
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from ...domain import Job, JobNotFound, JobStatus, RegistryError, Unauthorized, check_transition
from ...domain._model import Attempt, IdentityRecord, from_iso, hash_token, to_iso

COLUMNS = (
    "job_id, seq, kind, params, argv, status, error_reason, exit_code, created_at, started_at, ended_at, "
    "attempts, cancel_requested, boot_id, identity, token_hash, completed_units, total_units, stage, "
    "last_heartbeat_at, last_progress_at, log_path, stalled, stalled_since, silent, max_attempts, not_before, history, "
    "host_id, retry_of"
)
_OUTBOX_COLUMNS = "seq, event_id, job_id, event, created_at, previous_status, reason, boot_id, job"


def _ts(text: str | None) -> datetime | None:
    return from_iso(text) if text is not None else None


def _text(ts: datetime | None) -> str | None:
    return to_iso(ts) if ts is not None else None


def row_to_job(row: sqlite3.Row, queue_position: int | None = None) -> Job:
    identity = row["identity"]
    return Job(
        job_id=row["job_id"],
        seq=row["seq"],
        kind=row["kind"],
        params=json.loads(row["params"]),
        argv=json.loads(row["argv"]),
        status=JobStatus(row["status"]),
        error_reason=row["error_reason"],
        exit_code=row["exit_code"],
        created_at=from_iso(row["created_at"]),
        started_at=_ts(row["started_at"]),
        ended_at=_ts(row["ended_at"]),
        attempts=row["attempts"],
        cancel_requested=bool(row["cancel_requested"]),
        boot_id=row["boot_id"],
        identity=IdentityRecord.from_json(json.loads(identity)) if identity is not None else None,
        token_hash=row["token_hash"],
        completed_units=row["completed_units"],
        total_units=row["total_units"],
        stage=row["stage"],
        last_heartbeat_at=_ts(row["last_heartbeat_at"]),
        last_progress_at=_ts(row["last_progress_at"]),
        log_path=row["log_path"],
        queue_position=queue_position,
        stalled=bool(row["stalled"]),
        stalled_since=_ts(row["stalled_since"]),
        silent=bool(row["silent"]),
        max_attempts=row["max_attempts"],
        next_attempt_at=_ts(row["not_before"]),
        history=tuple(Attempt.from_json(a) for a in json.loads(row["history"])),
        host_id=row["host_id"],
        retry_of=row["retry_of"],
    )


def _identity_text(identity: IdentityRecord | None) -> str | None:
    return json.dumps(identity.to_json(), sort_keys=True) if identity is not None else None


class Rows:
    """The row-level primitives of every operation. ``boot_id``: who makes the changes (goes into each event);
    ``outbox``: write events at all (a supervisor without a webhook turns it off); ``clock``: the wall clock of every
    timestamp."""

    def __init__(self, *, clock: Callable[[], datetime], boot_id: str | None, outbox: bool) -> None:
        self.clock = clock
        self.boot_id = boot_id
        self.outbox = outbox

    def now(self) -> datetime:
        """The clock's time in UTC: what a row stores, and so what a write answers (the same instant as a later read
        of the row, in the same form)."""
        now = self.clock()
        if now.tzinfo is None:
            raise ValueError(f"the registry's clock gave a naive datetime: {now!r}")
        return now.astimezone(UTC)

    # -- rows ---------------------------------------------------------------------------------------------

    def get_in(self, conn: sqlite3.Connection, job_id: str) -> Job:
        row = conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(job_id)
        position = None
        if row["status"] == JobStatus.QUEUED:
            position = conn.execute(
                "SELECT COUNT(*) FROM jobs WHERE status = 'queued' AND seq <= ?", (row["seq"],)
            ).fetchone()[0]
        return row_to_job(row, position)

    def record_event_in(
        self, conn: sqlite3.Connection, job_id: str, event: str, previous_status: str | None, reason: str | None
    ) -> None:
        """Write one outbox event, inside the caller's transaction: it commits (or rolls back) with the change."""
        if not self.outbox:
            return
        row = conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        job = row_to_job(row)  # the row as of this change (no queue position: it would cost a count)
        conn.execute(
            "INSERT INTO outbox (event_id, job_id, event, created_at, previous_status, reason, boot_id, job) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                uuid.uuid4().hex,
                job_id,
                event,
                to_iso(self.now()),
                previous_status,
                reason,
                self.boot_id,
                json.dumps(job.public(), sort_keys=True, separators=(",", ":")),
            ),
        )

    def set_status(
        self, conn: sqlite3.Connection, job: Job, to_status: JobStatus, *, reason: str | None = None, **fields: Any
    ) -> None:
        """The one place a row's status changes; an illegal transition raises. The change's outbox event is
        written here too, in the same transaction, with ``reason`` (by default: ``promoted``, or the row's new
        ``error_reason``). ``fields`` are column values in their stored form."""
        check_transition(job.job_id, job.status, to_status)
        if to_status.is_terminal or to_status is JobStatus.QUEUED:
            # A job's token works only while the job runs: with its hash gone, a late (or stolen) token matches
            # nothing, and the heartbeat answers 401 exactly as for a job that never existed.
            fields = {**fields, "token_hash": None}
        assignments = ", ".join(f"{name} = ?" for name in ("status", *fields))
        cur = conn.execute(
            f"UPDATE jobs SET {assignments} WHERE job_id = ? AND status = ?",
            (str(to_status), *fields.values(), job.job_id, str(job.status)),
        )
        if cur.rowcount != 1:  # the read above and this write are in one transaction: cannot happen
            raise RegistryError(f"job {job.job_id}: status changed under the registry lock")
        if reason is None:
            reason = "promoted" if to_status is JobStatus.RUNNING else fields.get("error_reason")
        self.record_event_in(conn, job.job_id, "job.transition", str(job.status), reason)

    def authenticated(self, conn: sqlite3.Connection, job_id: str, token: str) -> Job:
        try:
            job = self.get_in(conn, job_id)
        except JobNotFound:
            raise Unauthorized("the token is not this job's") from None
        # Constant-time compare of the hashes; a missing hash never matches.
        if job.token_hash is None or not hmac.compare_digest(job.token_hash, hash_token(token)):
            raise Unauthorized("the token is not this job's")
        return job
