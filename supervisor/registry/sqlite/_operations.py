"""The registry's operations in SQL: each one a change of a connection, run by the transaction layer
(``_store.SqliteStore``) inside its transaction. Blocking code, in worker threads only.

The row's text forms live here and nowhere else: timestamps as ISO 8601 text (``to_iso``), params, argv and the
identity record as JSON.
"""

from __future__ import annotations

import hmac
import json
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from ...domain import (
    TERMINAL,
    Conflict,
    IllegalTransition,
    Job,
    JobNotFound,
    JobStatus,
    RegistryError,
    RequestError,
    Unauthorized,
    ValidationError,
    check_transition,
)
from ...domain._model import IdentityRecord, from_iso, hash_token, to_iso
from .._protocol import (
    CURSOR_PATTERN,
    MAX_LIST_LIMIT,
    Beat,
    Change,
    Ending,
    EnqueueResult,
    Expect,
    IdentityClaim,
    NewJob,
    OutboxEvent,
    Outcome,
    PauseState,
    PromoteRequest,
    Promotion,
    PruneResult,
)

COLUMNS = (
    "job_id, seq, kind, params, argv, status, error_reason, exit_code, created_at, started_at, ended_at, "
    "attempts, cancel_requested, boot_id, identity, token_hash, completed_units, total_units, stage, "
    "last_heartbeat_at, last_progress_at, log_path, stalled, stalled_since, silent"
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
    )


def _identity_text(identity: IdentityRecord | None) -> str | None:
    return json.dumps(identity.to_json(), sort_keys=True) if identity is not None else None


class Operations:
    """The SQL of every operation. ``boot_id``: who makes the changes (goes into each event); ``outbox``: write
    events at all (a supervisor without a webhook turns it off); ``clock``: the wall clock of every timestamp."""

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

    def set_status(self, conn: sqlite3.Connection, job: Job, to_status: JobStatus, **fields: Any) -> None:
        """The one place a row's status changes; an illegal transition raises. The change's outbox event is
        written here too, in the same transaction. ``fields`` are column values in their stored form."""
        check_transition(job.job_id, job.status, to_status)
        if to_status.is_terminal:
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
        reason = "promoted" if to_status is JobStatus.RUNNING else fields.get("error_reason")
        self.record_event_in(conn, job.job_id, "job.transition", str(job.status), reason)

    # -- enqueue and promotion ------------------------------------------------------------------------------

    def enqueue_in(self, conn: sqlite3.Connection, job: NewJob) -> tuple[str, bool]:
        if job.coalesce_key is not None:
            row = conn.execute(
                "SELECT job_id FROM jobs WHERE status = 'queued' AND coalesce_key = ? ORDER BY seq LIMIT 1",
                (job.coalesce_key,),
            ).fetchone()
            if row is not None:
                return row["job_id"], True
        job_id = uuid.uuid4().hex
        conn.execute(
            "INSERT INTO jobs (job_id, kind, params, argv, status, created_at, coalesce_key) "
            "VALUES (?, ?, ?, ?, 'queued', ?, ?)",
            (
                job_id,
                job.kind,
                json.dumps(dict(job.params), sort_keys=True),
                json.dumps(list(job.argv)),
                to_iso(self.now()),
                job.coalesce_key,
            ),
        )
        self.record_event_in(conn, job_id, "job.transition", None, "enqueued")
        return job_id, False

    def enqueue(
        self, job: NewJob, promote: PromoteRequest | None
    ) -> Callable[[sqlite3.Connection], tuple[EnqueueResult, Promotion]]:
        def change(conn: sqlite3.Connection) -> tuple[EnqueueResult, Promotion]:
            job_id, coalesced = self.enqueue_in(conn, job)
            result = EnqueueResult(self.get_in(conn, job_id), coalesced=coalesced)
            return result, self.promote_after(conn, promote)

        return change

    def enqueue_many(self, jobs: Sequence[NewJob]) -> Callable[[sqlite3.Connection], list[EnqueueResult]]:
        def change(conn: sqlite3.Connection) -> list[EnqueueResult]:
            added = [self.enqueue_in(conn, job) for job in jobs]
            if not added:
                return []
            rows = {
                r["job_id"]: r
                for r in conn.execute(
                    f"SELECT {COLUMNS} FROM jobs WHERE job_id IN ({','.join('?' * len(added))})",
                    [job_id for job_id, _ in added],
                )
            }
            return [EnqueueResult(row_to_job(rows[job_id]), coalesced) for job_id, coalesced in added]

        return change

    def promote_in(self, conn: sqlite3.Connection, request: PromoteRequest) -> list[Job]:
        """INV-PROMOTION-NEVER-OVERSHOOTS: the count and the flips run in the caller's transaction, under the write
        lock, so a concurrent promotion (in this or another process) counts these rows at once. Each row gets this
        boot's ``boot_id`` and ``started_at`` in the same transaction, so a row promoted but not yet spawned is never
        mistaken for a prior boot's orphan (INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING)."""
        running = conn.execute("SELECT COUNT(*) FROM jobs WHERE status = 'running'").fetchone()[0]
        free = min(request.max_concurrent - running, len(request.token_hashes))
        if free <= 0:
            return []
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM jobs WHERE status = 'queued' ORDER BY seq LIMIT ?", (free,)
        ).fetchall()
        now = self.now()
        promoted: list[Job] = []
        for row, token_hash in zip(rows, request.token_hashes, strict=False):
            job = row_to_job(row)
            log_path = str(request.log_dir / f"{job.job_id}.log") if request.log_dir is not None else None
            self.set_status(
                conn,
                job,
                JobStatus.RUNNING,
                started_at=to_iso(now),
                boot_id=request.boot_id,
                token_hash=token_hash,
                attempts=job.attempts + 1,
                log_path=log_path,
                identity=None,
            )
            promoted.append(
                replace(
                    job,
                    status=JobStatus.RUNNING,
                    started_at=now,
                    boot_id=request.boot_id,
                    token_hash=token_hash,
                    attempts=job.attempts + 1,
                    log_path=log_path,
                    identity=None,
                )
            )
        return promoted

    def paused_in(self, conn: sqlite3.Connection) -> bool:
        return bool(conn.execute("SELECT paused FROM queue_state").fetchone()[0])

    def promote(self, request: PromoteRequest) -> Callable[[sqlite3.Connection], Promotion]:
        def change(conn: sqlite3.Connection) -> Promotion:
            if self.paused_in(conn):
                return Promotion(paused=True)
            return Promotion(tuple(self.promote_in(conn, request)))

        return change

    def promote_after(self, conn: sqlite3.Connection, request: PromoteRequest | None) -> Promotion:
        """A promotion made in another change's transaction, in a savepoint of its own: if it fails, it alone is
        rolled back (``failed``): the change it follows must not fail for it."""
        if request is None:
            return Promotion()
        conn.execute("SAVEPOINT promote")
        try:
            if self.paused_in(conn):
                promotion = Promotion(paused=True)
            else:
                promotion = Promotion(tuple(self.promote_in(conn, request)))
        except Exception:
            conn.execute("ROLLBACK TO promote")
            promotion = Promotion(failed=True)
        conn.execute("RELEASE promote")
        return promotion

    def record_identities(self, claims: Sequence[IdentityClaim]) -> Callable[[sqlite3.Connection], list[Job]]:
        def change(conn: sqlite3.Connection) -> list[Job]:
            out: list[Job] = []
            for claim in claims:
                conn.execute(
                    "UPDATE jobs SET identity = ? WHERE job_id = ? AND status = 'running'",
                    (_identity_text(claim.identity), claim.job_id),
                )
                out.append(self.get_in(conn, claim.job_id))
            return out

        return change

    # -- ends ---------------------------------------------------------------------------------------------

    def finalize_in(self, conn: sqlite3.Connection, job_id: str, ending: Ending, expect: Expect | None) -> Change:
        job = self.get_in(conn, job_id)
        if job.status.is_terminal:
            return Change(job, changed=False)
        if expect is not None and job.identity != expect.identity:
            return Change(job, changed=False)  # the evidence was about another process than the row records now
        chosen = ending.chosen(job.cancel_requested)
        if job.status is not JobStatus.RUNNING:
            raise IllegalTransition(job_id, job.status, chosen.status)  # only a running job ends this way
        assert chosen.status in TERMINAL
        ended_at = self.now()
        self.set_status(
            conn,
            job,
            chosen.status,
            error_reason=chosen.reason,
            exit_code=ending.exit_code,
            ended_at=to_iso(ended_at),
        )
        after = replace(
            job,
            status=chosen.status,
            error_reason=chosen.reason,
            exit_code=ending.exit_code,
            ended_at=ended_at,
            token_hash=None,
            queue_position=None,
        )
        return Change(after, changed=True, previous=job.status)

    def finalize(
        self, job_id: str, ending: Ending, expect: Expect | None, promote: PromoteRequest | None
    ) -> Callable[[sqlite3.Connection], tuple[Change, Promotion]]:
        def change(conn: sqlite3.Connection) -> tuple[Change, Promotion]:
            result = self.finalize_in(conn, job_id, ending, expect)
            return result, self.promote_after(conn, promote if result.changed else None)

        return change

    def request_cancel(self, job_id: str) -> Callable[[sqlite3.Connection], Change]:
        def change(conn: sqlite3.Connection) -> Change:
            job = self.get_in(conn, job_id)
            if job.status is JobStatus.QUEUED:
                outcome = Outcome(JobStatus.CANCELLED, "cancelled_before_start")
                self.set_status(
                    conn, job, outcome.status, error_reason=outcome.reason, ended_at=to_iso(self.now())
                )
                return Change(self.get_in(conn, job_id), changed=True, previous=job.status)
            if job.status is JobStatus.RUNNING and not job.cancel_requested:
                conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE job_id = ?", (job_id,))
                return Change(self.get_in(conn, job_id), changed=True)
            return Change(job, changed=False)

        return change

    # -- heartbeats, tokens, absence, events --------------------------------------------------------------

    def authenticated(self, conn: sqlite3.Connection, job_id: str, token: str) -> Job:
        try:
            job = self.get_in(conn, job_id)
        except JobNotFound:
            raise Unauthorized("the token is not this job's") from None
        # Constant-time compare of the hashes; a missing hash never matches.
        if job.token_hash is None or not hmac.compare_digest(job.token_hash, hash_token(token)):
            raise Unauthorized("the token is not this job's")
        return job

    def record_heartbeats(self, beats: Sequence[Beat]) -> Callable[[sqlite3.Connection], list[Job | RequestError]]:
        def change(conn: sqlite3.Connection) -> list[Job | RequestError]:
            results: list[Job | RequestError] = []
            now = self.now()
            for beat in beats:
                try:
                    job = self.authenticated(conn, beat.job_id, beat.token)
                    if job.status is not JobStatus.RUNNING:
                        raise Conflict(f"job {beat.job_id} is {job.status}, not running", field="job_id")
                except RequestError as exc:
                    results.append(exc)
                    continue
                # INV-PROGRESS-NOT-LIVENESS: every beat is liveness; only a higher watermark is progress.
                progressed = beat.completed_units > job.completed_units
                after = replace(
                    job,
                    last_heartbeat_at=now,
                    completed_units=max(beat.completed_units, job.completed_units),
                    total_units=job.total_units if beat.total_units is None else beat.total_units,
                    stage=job.stage if beat.stage is None else beat.stage,
                    last_progress_at=now if progressed else job.last_progress_at,
                )
                conn.execute(
                    "UPDATE jobs SET last_heartbeat_at = ?, completed_units = ?, total_units = ?, stage = ?, "
                    "last_progress_at = ? WHERE job_id = ?",
                    (
                        _text(after.last_heartbeat_at),
                        after.completed_units,
                        after.total_units,
                        after.stage,
                        _text(after.last_progress_at),
                        beat.job_id,
                    ),
                )
                results.append(after)
            return results

        return change

    def set_absence(
        self, job_id: str, stalled: bool, silent: bool, events: Sequence[tuple[str, str]]
    ) -> Callable[[sqlite3.Connection], Change]:
        def change(conn: sqlite3.Connection) -> Change:
            job = self.get_in(conn, job_id)
            if job.status is not JobStatus.RUNNING or (job.stalled, job.silent) == (stalled, silent):
                return Change(job, changed=False)
            since = job.stalled_since if job.stalled and stalled else (self.now() if stalled else None)
            conn.execute(
                "UPDATE jobs SET stalled = ?, stalled_since = ?, silent = ? WHERE job_id = ? AND status = 'running'",
                (int(stalled), _text(since), int(silent), job_id),
            )
            for event, reason in events:
                self.record_event_in(conn, job_id, event, str(job.status), reason)
            return Change(replace(job, stalled=stalled, stalled_since=since, silent=silent), changed=True)

        return change

    def record_event(self, job_id: str, event: str, reason: str | None) -> Callable[[sqlite3.Connection], Job]:
        def change(conn: sqlite3.Connection) -> Job:
            job = self.get_in(conn, job_id)
            self.record_event_in(conn, job_id, event, str(job.status), reason)
            return job

        return change

    # -- the outbox ---------------------------------------------------------------------------------------

    @staticmethod
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

    @staticmethod
    def outbox_delete(seqs: Sequence[int]) -> Callable[[sqlite3.Connection], None]:
        def change(conn: sqlite3.Connection) -> None:
            conn.execute(f"DELETE FROM outbox WHERE seq IN ({','.join('?' * len(seqs))})", list(seqs))

        return change

    def prune_cutoff(self, max_age_s: float) -> str:
        return to_iso(self.now() - timedelta(seconds=max_age_s))

    @staticmethod
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

    # -- the pause ----------------------------------------------------------------------------------------

    @staticmethod
    def pause_state_in(conn: sqlite3.Connection) -> PauseState:
        row = conn.execute("SELECT paused, paused_by, paused_at FROM queue_state").fetchone()
        if not row["paused"]:
            return PauseState(False)
        return PauseState(True, row["paused_by"], _ts(row["paused_at"]))

    def set_paused(self, paused: bool, by: str) -> Callable[[sqlite3.Connection], PauseState]:
        def change(conn: sqlite3.Connection) -> PauseState:
            current = self.pause_state_in(conn)
            if current.paused == paused:
                return current
            at = _text(self.now()) if paused else None
            conn.execute(
                "UPDATE queue_state SET paused = ?, paused_by = ?, paused_at = ?",
                (int(paused), by if paused else None, at),
            )
            return self.pause_state_in(conn)

        return change

    # -- reads --------------------------------------------------------------------------------------------

    @staticmethod
    def running_in(conn: sqlite3.Connection) -> list[Job]:
        """Every RUNNING row (the status index: O(running rows))."""
        rows = conn.execute(f"SELECT {COLUMNS} FROM jobs WHERE status = 'running' ORDER BY seq")
        return [row_to_job(r) for r in rows]

    @staticmethod
    def counts_in(conn: sqlite3.Connection) -> dict[str, int]:
        out = {s.value: 0 for s in JobStatus}
        for row in conn.execute("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status"):
            out[row["status"]] = row["n"]
        return out

    @staticmethod
    def list_query(
        status: str | None, kind: str | None, limit: int, cursor: str | None
    ) -> tuple[str, list[object]]:
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

    @staticmethod
    def list_page(
        conn: sqlite3.Connection, where: str, args: list[object], limit: int
    ) -> tuple[list[Job], str | None]:
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
