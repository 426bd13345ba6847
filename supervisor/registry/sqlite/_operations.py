"""The registry's operations in SQL: each one a change of a connection, run by the transaction layer
(``_store.SqliteStore``) inside its transaction (group committed with the changes queued beside it). Blocking code,
in worker threads only.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from ...domain import (
    RESUBMITTED,
    TERMINAL,
    Conflict,
    HostForgotten,
    IllegalTransition,
    Job,
    JobStatus,
    RequestError,
)
from ...domain._model import Attempt, from_iso, to_iso
from .._protocol import (
    BACK_IN_QUEUE,
    Beat,
    Change,
    Ending,
    EnqueueResult,
    Expect,
    FleetSetting,
    Host,
    IdentityClaim,
    Lease,
    NewJob,
    Outcome,
    PauseState,
    PromoteRequest,
    Promotion,
    log_name,
)
from ._reads import host_in, leader_in, pause_state_in, paused_in
from ._rows import COLUMNS, Rows, _identity_text, _text, row_to_job


class Operations(Rows):
    """The SQL of every write, each a change (a function of a connection) for the store's group commit."""

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
            "INSERT INTO jobs (job_id, kind, params, argv, status, created_at, coalesce_key, max_attempts, retry_of) "
            "VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?)",
            (
                job_id,
                job.kind,
                json.dumps(dict(job.params), sort_keys=True),
                json.dumps(list(job.argv)),
                to_iso(self.now()),
                job.coalesce_key,
                job.max_attempts,
                job.retry_of,
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
        running, here = conn.execute(
            "SELECT COUNT(*), COUNT(*) FILTER (WHERE host_id IS ?) FROM jobs WHERE status = 'running'",
            (request.host_id,),
        ).fetchone()
        free = request.free_slots(running, here)
        if free <= 0:
            return []
        now = self.now()
        # FIFO among the rows whose backoff has passed (a resubmitted row keeps its place: its insertion order).
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM jobs WHERE status = 'queued' AND (not_before IS NULL OR not_before <= ?) "
            "ORDER BY seq LIMIT ?",
            (to_iso(now), free),
        ).fetchall()
        promoted: list[Job] = []
        for row, token_hash in zip(rows, request.token_hashes, strict=False):
            job = row_to_job(row)
            attempt = job.attempts + 1
            log_path = str(request.log_dir / log_name(job.job_id, attempt)) if request.log_dir is not None else None
            self.set_status(
                conn,
                job,
                JobStatus.RUNNING,
                started_at=to_iso(now),
                boot_id=request.boot_id,
                token_hash=token_hash,
                attempts=attempt,
                log_path=log_path,
                identity=None,
                not_before=None,
                host_id=request.host_id,
            )
            promoted.append(
                replace(
                    job,
                    status=JobStatus.RUNNING,
                    started_at=now,
                    boot_id=request.boot_id,
                    token_hash=token_hash,
                    attempts=attempt,
                    log_path=log_path,
                    identity=None,
                    next_attempt_at=None,
                    queue_position=None,
                    host_id=request.host_id,
                )
            )
        return promoted

    def next_at_in(self, conn: sqlite3.Connection) -> datetime | None:
        """The earliest moment a queued row still waiting out its backoff may run."""
        row = conn.execute(
            "SELECT MIN(not_before) FROM jobs WHERE status = 'queued' AND not_before > ?", (to_iso(self.now()),)
        ).fetchone()
        return from_iso(row[0]) if row[0] is not None else None

    def promote(self, request: PromoteRequest) -> Callable[[sqlite3.Connection], Promotion]:
        def change(conn: sqlite3.Connection) -> Promotion:
            if paused_in(conn):
                return Promotion(paused=True)
            return Promotion(tuple(self.promote_in(conn, request)), next_at=self.next_at_in(conn))

        return change

    def promote_after(self, conn: sqlite3.Connection, request: PromoteRequest | None) -> Promotion:
        """A promotion made in another change's transaction, in a savepoint of its own: if it fails, it alone is
        rolled back (``failed``): the change it follows must not fail for it."""
        if request is None:
            return Promotion()
        conn.execute("SAVEPOINT promote")
        try:
            paused = paused_in(conn)
            promotion = (
                Promotion(paused=True)
                if paused
                else Promotion(tuple(self.promote_in(conn, request)), next_at=self.next_at_in(conn))
            )
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
        if expect is not None and expect.host_silent and job.host_id is not None:
            host = host_in(conn, job.host_id, self.now())
            if host is not None and host.live:
                return Change(job, changed=False)  # INV-SILENT-HOST-ENDS-BY-PROOF: it is back, its rows its own
        chosen = ending.chosen(job.cancel_requested)
        if job.status is not JobStatus.RUNNING:
            raise IllegalTransition(job_id, job.status, chosen.status)  # only a running job ends this way
        assert chosen.status in TERMINAL
        ended_at = self.now()
        if ending.retry is not None and chosen is ending.outcome:
            # Resubmitted (ADR-150 D4): the attempt's outcome goes into the history and the row back to the queue,
            # in this one transaction, so a crash between them can neither lose the job nor make it twice.
            attempt = Attempt(job.attempts, job.started_at, ended_at, chosen.status, chosen.reason, ending.exit_code)
            history = (*job.history, attempt)
            self.set_status(
                conn,
                job,
                JobStatus.QUEUED,
                reason=RESUBMITTED + ending.retry.why,
                not_before=to_iso(ending.retry.not_before),
                history=json.dumps([a.to_json() for a in history]),
                **BACK_IN_QUEUE,
            )
            return Change(self.get_in(conn, job_id), changed=True, previous=job.status)
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
        follow_up = None
        if ending.then is not None and chosen.status is JobStatus.SUCCEEDED:
            follow_id, coalesced = self.enqueue_in(conn, ending.then)
            follow_up = EnqueueResult(self.get_in(conn, follow_id), coalesced=coalesced)
        return Change(after, changed=True, previous=job.status, follow_up=follow_up)

    def finalize(
        self, job_id: str, ending: Ending, expect: Expect | None, promote: PromoteRequest | None
    ) -> Callable[[sqlite3.Connection], tuple[Change, Promotion]]:
        def change(conn: sqlite3.Connection) -> tuple[Change, Promotion]:
            result = self.finalize_in(conn, job_id, ending, expect)
            return result, self.promote_after(conn, promote if result.changed else None)

        return change

    def requeue(self, job_id: str, expect: Expect, reason: str) -> Callable[[sqlite3.Connection], Change]:
        def change(conn: sqlite3.Connection) -> Change:
            job = self.get_in(conn, job_id)
            if job.status is not JobStatus.RUNNING or job.identity != expect.identity:
                return Change(job, changed=False)
            # Its start never happened: it does not count, and it keeps its place (the head of the queue: every row
            # still queued was enqueued after it, or it would have been promoted first).
            self.set_status(
                conn, job, JobStatus.QUEUED, reason=reason, attempts=max(0, job.attempts - 1), **BACK_IN_QUEUE
            )
            return Change(self.get_in(conn, job_id), changed=True, previous=job.status)

        return change

    def request_cancel(self, job_id: str) -> Callable[[sqlite3.Connection], Change]:
        def change(conn: sqlite3.Connection) -> Change:
            job = self.get_in(conn, job_id)
            if job.status is JobStatus.QUEUED:
                # A job waiting out its backoff has run before: it is simply cancelled.
                why = "cancelled_before_start" if job.attempts == 0 else "cancelled"
                outcome = Outcome(JobStatus.CANCELLED, why)
                self.set_status(conn, job, outcome.status, error_reason=outcome.reason, ended_at=to_iso(self.now()))
                return Change(self.get_in(conn, job_id), changed=True, previous=job.status)
            if job.status is JobStatus.RUNNING and not job.cancel_requested:
                conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE job_id = ?", (job_id,))
                return Change(self.get_in(conn, job_id), changed=True)
            return Change(job, changed=False)

        return change

    # -- heartbeats, tokens, absence, events --------------------------------------------------------------

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

    # -- the outbox and the pause -------------------------------------------------------------------------

    def prune_cutoff(self, max_age_s: float) -> str:
        return to_iso(self.now() - timedelta(seconds=max_age_s))

    def set_paused(self, paused: bool, by: str) -> Callable[[sqlite3.Connection], PauseState]:
        def change(conn: sqlite3.Connection) -> PauseState:
            current = pause_state_in(conn)
            if current.paused == paused:
                return current
            at = _text(self.now()) if paused else None
            conn.execute(
                "UPDATE queue_state SET paused = ?, paused_by = ?, paused_at = ?",
                (int(paused), by if paused else None, at),
            )
            return pause_state_in(conn)

        return change

    # -- the fleet (ADR 0012) -------------------------------------------------------------------------------

    def renew_lease(
        self, host_id: str, boot_id: str, lease_s: float, lead: bool
    ) -> Callable[[sqlite3.Connection], Lease]:
        def change(conn: sqlite3.Connection) -> Lease:
            # INV-FORGET-IS-FENCED: a boot an operator forgot never holds a lease again.
            fenced = conn.execute(
                "SELECT 1 FROM forgotten_hosts WHERE host_id = ? AND boot_id = ?", (host_id, boot_id)
            ).fetchone()
            if fenced is not None:
                raise HostForgotten(host_id, boot_id)
            now = self.now()
            expires = _text(now + timedelta(seconds=lease_s))
            before = host_in(conn, host_id, now)
            replaced = before if before is not None and before.boot_id != boot_id else None
            if before is None or replaced is not None:
                conn.execute(
                    "INSERT INTO hosts (host_id, boot_id, started_at, last_seen_at, lease_expires_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (host_id) DO UPDATE SET boot_id = excluded.boot_id, "
                    "started_at = excluded.started_at, last_seen_at = excluded.last_seen_at, "
                    "lease_expires_at = excluded.lease_expires_at",
                    (host_id, boot_id, _text(now), _text(now), expires),
                )
            else:
                conn.execute(
                    "UPDATE hosts SET last_seen_at = ?, lease_expires_at = ? WHERE host_id = ?",
                    (_text(now), expires, host_id),
                )
            current = leader_in(conn, now)
            if current is not None and (current.host_id, current.boot_id) == (host_id, boot_id):
                if lead:
                    conn.execute("UPDATE leader SET last_seen_at = ?, lease_expires_at = ?", (_text(now), expires))
                else:
                    conn.execute("DELETE FROM leader")
            elif lead and (current is None or not current.live):
                # One row, replaced only once its holder's lease has expired: two hosts never both lead.
                conn.execute(
                    "INSERT INTO leader (one, host_id, boot_id, since, last_seen_at, lease_expires_at) "
                    "VALUES (1, ?, ?, ?, ?, ?) ON CONFLICT (one) DO UPDATE SET host_id = excluded.host_id, "
                    "boot_id = excluded.boot_id, since = excluded.since, last_seen_at = excluded.last_seen_at, "
                    "lease_expires_at = excluded.lease_expires_at",
                    (host_id, boot_id, _text(now), _text(now), expires),
                )
            host = host_in(conn, host_id, now)
            assert host is not None
            return Lease(host, leader_in(conn, now), replaced)

        return change

    def release_lease(self, host_id: str, boot_id: str) -> Callable[[sqlite3.Connection], None]:
        def change(conn: sqlite3.Connection) -> None:
            now = _text(self.now())
            conn.execute(
                "UPDATE hosts SET lease_expires_at = ? WHERE host_id = ? AND boot_id = ?", (now, host_id, boot_id)
            )
            conn.execute("DELETE FROM leader WHERE host_id = ? AND boot_id = ?", (host_id, boot_id))

        return change

    def record_setting(
        self, name: str, value: str, host_id: str, replace: bool
    ) -> Callable[[sqlite3.Connection], FleetSetting]:
        def change(conn: sqlite3.Connection) -> FleetSetting:
            conflict = (
                "DO UPDATE SET value = excluded.value, host_id = excluded.host_id, recorded_at = excluded.recorded_at"
                if replace
                else "DO NOTHING"
            )
            conn.execute(
                f"INSERT INTO fleet_settings (name, value, host_id, recorded_at) VALUES (?, ?, ?, ?) "
                f"ON CONFLICT (name) {conflict}",
                (name, value, host_id, _text(self.now())),
            )
            row = conn.execute(
                "SELECT name, value, host_id, recorded_at FROM fleet_settings WHERE name = ?", (name,)
            ).fetchone()
            return FleetSetting(row["name"], row["value"], row["host_id"], from_iso(row["recorded_at"]))

        return change

    def forget_host(self, host_id: str) -> Callable[[sqlite3.Connection], Host | None]:
        def change(conn: sqlite3.Connection) -> Host | None:
            # INV-FORGET-IS-FENCED: the check and the fence in one write transaction.
            now = self.now()
            host = host_in(conn, host_id, now)
            if host is not None and host.live:
                raise Conflict(
                    f"host {host_id} holds a live lease until {to_iso(host.lease_expires_at)}: its jobs may be "
                    "running; stop its supervisor first"
                )
            if host is not None:
                conn.execute(
                    "INSERT INTO forgotten_hosts (host_id, boot_id, forgotten_at) VALUES (?, ?, ?) "
                    "ON CONFLICT DO NOTHING",
                    (host.host_id, host.boot_id, _text(now)),
                )
            conn.execute("DELETE FROM hosts WHERE host_id = ?", (host_id,))
            conn.execute("DELETE FROM leader WHERE host_id = ?", (host_id,))
            return host

        return change
