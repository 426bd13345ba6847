"""The PostgreSQL registry's writes: each one a coroutine of a connection, run by ``_registry`` inside one
transaction (READ COMMITTED). asyncio code, on trio-asyncio's loop.

Concurrency, with no registry-wide write lock (several supervisors may share the database):
- a write that reads a row to decide its change locks it first (``FOR UPDATE``): a concurrent change of the same
  row waits until this one commits, then reads what it left;
- promotions are serialized by a transaction-scoped advisory lock (``promote_in``);
- enqueues with the same coalescing key are serialized by an advisory lock on that key (``enqueue_in``).

The writes other hosts of a fleet may act on at once also send a wake-up (``Rows.notify_in``: ``pg_notify`` in the
change's transaction, so it is delivered on commit and never for a rolled-back change): something queued (an
enqueue, a requeue, a resubmission, a follow-up), a cancel requested on a running row (naming the job and the host
that runs it), the pause set or cleared, a forgotten host's slots freed. A plain end sends none: the host that ran
the job wakes its own drainer for the slot it freed (see ``finalize``). INV-NOTIFY-IS-A-HINT: whoever hears one
re-reads what it acts on; the sweep is the guarantee.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

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
from ...domain._model import Attempt, to_iso
from .._protocol import (
    BACK_IN_QUEUE,
    WAKE_CANCEL,
    WAKE_FREED,
    WAKE_PAUSE,
    WAKE_QUEUED,
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
    Wakeup,
    log_name,
)
from ._reads import host_in, leader_in, pause_state_in
from ._rows import COLUMNS, Rows, identity_text, row_to_job
from ._schema import COALESCE_LOCK, LEADER_LOCK, PROMOTE_LOCK


class Operations(Rows):
    """The SQL of every write."""

    # -- enqueue and promotion ------------------------------------------------------------------------------

    async def enqueue_in(self, conn: Any, job: NewJob) -> tuple[str, bool]:
        if job.coalesce_key is not None:
            # Only a queued row absorbs an identical one: two enqueues of one key take turns, or both would find no
            # queued row and both insert (READ COMMITTED sees no uncommitted insert).
            await conn.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))", COALESCE_LOCK, f"{self.schema_key}/{job.coalesce_key}"
            )
            found = await conn.fetchval(
                "SELECT job_id FROM jobs WHERE status = 'queued' AND coalesce_key = $1 ORDER BY seq LIMIT 1",
                job.coalesce_key,
            )
            if found is not None:
                return str(found), True
        job_id = uuid.uuid4().hex
        await conn.execute(
            "INSERT INTO jobs (job_id, kind, params, argv, status, created_at, coalesce_key, max_attempts, retry_of) "
            "VALUES ($1, $2, $3, $4, 'queued', $5, $6, $7, $8)",
            job_id,
            job.kind,
            json.dumps(dict(job.params), sort_keys=True),
            json.dumps(list(job.argv)),
            self.now(),
            job.coalesce_key,
            job.max_attempts,
            job.retry_of,
        )
        await self.record_event_in(conn, job_id, "job.transition", None, "enqueued")
        return job_id, False

    async def enqueue(self, conn: Any, job: NewJob, promote: PromoteRequest | None) -> tuple[EnqueueResult, Promotion]:
        job_id, coalesced = await self.enqueue_in(conn, job)
        if not coalesced:
            await self.notify_in(conn, Wakeup(WAKE_QUEUED))
        result = EnqueueResult(await self.get_in(conn, job_id), coalesced=coalesced)
        return result, await self.promote_after(conn, promote)

    async def enqueue_many(self, conn: Any, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
        added = [await self.enqueue_in(conn, job) for job in jobs]
        if not added:
            return []
        if not all(coalesced for _, coalesced in added):
            await self.notify_in(conn, Wakeup(WAKE_QUEUED))  # one for the batch, however large
        rows = {
            r["job_id"]: r
            for r in await conn.fetch(
                f"SELECT {COLUMNS} FROM jobs WHERE job_id = ANY($1::text[])", [job_id for job_id, _ in added]
            )
        }
        return [EnqueueResult(row_to_job(rows[job_id]), coalesced) for job_id, coalesced in added]

    async def promote_in(self, conn: Any, request: PromoteRequest) -> list[Job]:
        """INV-PROMOTION-NEVER-OVERSHOOTS: the count and the flips happen in one transaction that holds this
        schema's promotion lock (``pg_advisory_xact_lock``, released at its commit or rollback), so promotions --
        from this process or any other supervisor on the database -- take turns. Only a promotion makes a row
        RUNNING, and the count is a statement that begins after the lock is held: under READ COMMITTED it sees every
        promotion committed before, so it is never too low (a row leaving RUNNING concurrently can only make it too
        high, which promotes fewer, never more). Each row gets this boot's id and ``started_at`` in the same
        transaction (INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING)."""
        await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", PROMOTE_LOCK, self.schema_key)
        counted = await conn.fetchrow(
            "SELECT COUNT(*) AS running, COUNT(*) FILTER (WHERE host_id IS NOT DISTINCT FROM $1) AS here "
            "FROM jobs WHERE status = 'running'",
            request.host_id,
        )
        free = request.free_slots(counted["running"], counted["here"])
        if free <= 0:
            return []
        now = self.now()
        # FIFO among the rows whose backoff has passed (a resubmitted row keeps its place: its insertion order).
        # FOR UPDATE: a row a concurrent cancel is ending is waited for, then skipped if it is no longer queued.
        rows = await conn.fetch(
            f"SELECT {COLUMNS} FROM jobs WHERE status = 'queued' AND (not_before IS NULL OR not_before <= $1) "
            "ORDER BY seq LIMIT $2 FOR UPDATE",
            now,
            free,
        )
        promoted: list[Job] = []
        for row, token_hash in zip(rows, request.token_hashes, strict=False):
            job = row_to_job(row)
            attempt = job.attempts + 1
            log_path = str(request.log_dir / log_name(job.job_id, attempt)) if request.log_dir is not None else None
            await self.set_status(
                conn,
                job,
                JobStatus.RUNNING,
                started_at=now,
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

    async def next_at_in(self, conn: Any) -> datetime | None:
        """The earliest moment a queued row still waiting out its backoff may run."""
        value: datetime | None = await conn.fetchval(
            "SELECT MIN(not_before) FROM jobs WHERE status = 'queued' AND not_before > $1", self.now()
        )
        return value.astimezone(UTC) if value is not None else None

    async def _promotion(self, conn: Any, request: PromoteRequest) -> Promotion:
        paused = await conn.fetchval("SELECT paused FROM queue_state")
        if paused:
            return Promotion(paused=True)
        return Promotion(tuple(await self.promote_in(conn, request)), next_at=await self.next_at_in(conn))

    async def promote(self, conn: Any, request: PromoteRequest) -> Promotion:
        return await self._promotion(conn, request)

    async def promote_after(self, conn: Any, request: PromoteRequest | None) -> Promotion:
        """A promotion made in another change's transaction, in a savepoint of its own: if it fails, it alone is
        rolled back (``failed``): the change it follows must not fail for it."""
        if request is None:
            return Promotion()
        savepoint = conn.transaction()  # nested in the registry's transaction: a savepoint
        await savepoint.start()
        try:
            promotion = await self._promotion(conn, request)
        except Exception:
            await savepoint.rollback()
            return Promotion(failed=True)
        await savepoint.commit()
        return promotion

    async def record_identities(self, conn: Any, claims: Sequence[IdentityClaim]) -> list[Job]:
        out: list[Job] = []
        for claim in claims:
            await conn.execute(
                "UPDATE jobs SET identity = $1 WHERE job_id = $2 AND status = 'running'",
                identity_text(claim.identity),
                claim.job_id,
            )
            out.append(await self.get_in(conn, claim.job_id))
        return out

    # -- ends ---------------------------------------------------------------------------------------------

    async def finalize_in(self, conn: Any, job_id: str, ending: Ending, expect: Expect | None) -> Change:
        job = await self.get_in(conn, job_id, lock=True)
        if job.status.is_terminal:
            return Change(job, changed=False)
        if expect is not None and job.identity != expect.identity:
            return Change(job, changed=False)  # the evidence was about another process than the row records now
        if expect is not None and expect.host_silent and job.host_id is not None:
            # Under the leases' lock: no renewal commits between this check and the end.
            await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", LEADER_LOCK, self.schema_key)
            host = await host_in(conn, job.host_id, await self.lease_now(conn))
            if host is not None and host.live:
                return Change(job, changed=False)  # INV-SILENT-HOST-ENDS-BY-PROOF: it is back, its rows its own
        chosen = ending.chosen(job.cancel_requested)
        if job.status is not JobStatus.RUNNING:
            raise IllegalTransition(job_id, job.status, chosen.status)  # only a running job ends this way
        assert chosen.status in TERMINAL
        ended_at = self.now()
        if ending.retry is not None and chosen is ending.outcome:
            # Resubmitted (ADR-150 D4): the attempt's outcome into the history and the row back to the queue, in
            # this one transaction, so a crash between them can neither lose the job nor make it twice.
            attempt = Attempt(job.attempts, job.started_at, ended_at, chosen.status, chosen.reason, ending.exit_code)
            history = (*job.history, attempt)
            await self.set_status(
                conn,
                job,
                JobStatus.QUEUED,
                reason=RESUBMITTED + ending.retry.why,
                not_before=ending.retry.not_before,
                history=json.dumps([a.to_json() for a in history]),
                **BACK_IN_QUEUE,
            )
            await self.notify_in(conn, Wakeup(WAKE_QUEUED))  # any host may run it once its backoff has passed
            return Change(await self.get_in(conn, job_id), changed=True, previous=job.status)
        # A plain end notifies nobody: the host that ran the job (only it finalizes its jobs, INV-OWNER-JUDGES) wakes
        # its own drainer for the slot it freed, and it has room under its own cap since the slot was its own. Other
        # hosts woken at every end would only contend for the promotion lock (ADR 0012).
        await self.set_status(
            conn, job, chosen.status, error_reason=chosen.reason, exit_code=ending.exit_code, ended_at=ended_at
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
            follow_id, coalesced = await self.enqueue_in(conn, ending.then)
            follow_up = EnqueueResult(await self.get_in(conn, follow_id), coalesced=coalesced)
            if not coalesced:
                await self.notify_in(conn, Wakeup(WAKE_QUEUED))
        return Change(after, changed=True, previous=job.status, follow_up=follow_up)

    async def finalize(
        self, conn: Any, job_id: str, ending: Ending, expect: Expect | None, promote: PromoteRequest | None
    ) -> tuple[Change, Promotion]:
        result = await self.finalize_in(conn, job_id, ending, expect)
        return result, await self.promote_after(conn, promote if result.changed else None)

    async def requeue(self, conn: Any, job_id: str, expect: Expect, reason: str) -> Change:
        job = await self.get_in(conn, job_id, lock=True)
        if job.status is not JobStatus.RUNNING or job.identity != expect.identity:
            return Change(job, changed=False)
        # Its start never happened: it does not count, and it keeps its place (its insertion order).
        await self.set_status(
            conn, job, JobStatus.QUEUED, reason=reason, attempts=max(0, job.attempts - 1), **BACK_IN_QUEUE
        )
        await self.notify_in(conn, Wakeup(WAKE_QUEUED))
        return Change(await self.get_in(conn, job_id), changed=True, previous=job.status)

    async def request_cancel(self, conn: Any, job_id: str) -> Change:
        job = await self.get_in(conn, job_id, lock=True)
        if job.status is JobStatus.QUEUED:
            # A job waiting out its backoff has run before: it is simply cancelled.
            why = "cancelled_before_start" if job.attempts == 0 else "cancelled"
            outcome = Outcome(JobStatus.CANCELLED, why)
            await self.set_status(conn, job, outcome.status, error_reason=outcome.reason, ended_at=self.now())
            return Change(await self.get_in(conn, job_id), changed=True, previous=job.status)
        if job.status is JobStatus.RUNNING and not job.cancel_requested:
            await conn.execute("UPDATE jobs SET cancel_requested = true WHERE job_id = $1", job_id)
            # The host that runs it carries it out now (woken), or at its next sweep (INV-OWNER-JUDGES).
            await self.notify_in(conn, Wakeup(WAKE_CANCEL, job_id=job_id, host_id=job.host_id))
            return Change(await self.get_in(conn, job_id), changed=True)
        return Change(job, changed=False)

    # -- heartbeats, tokens, absence, events --------------------------------------------------------------

    async def record_heartbeats(self, conn: Any, beats: Sequence[Beat]) -> list[Job | RequestError]:
        results: list[Job | RequestError] = []
        now = self.now()
        for beat in beats:
            try:
                job = await self.authenticated(conn, beat.job_id, beat.token, lock=True)
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
            await conn.execute(
                "UPDATE jobs SET last_heartbeat_at = $1, completed_units = $2, total_units = $3, stage = $4, "
                "last_progress_at = $5 WHERE job_id = $6",
                after.last_heartbeat_at,
                after.completed_units,
                after.total_units,
                after.stage,
                after.last_progress_at,
                beat.job_id,
            )
            results.append(after)
        return results

    async def set_absence(
        self, conn: Any, job_id: str, stalled: bool, silent: bool, events: Sequence[tuple[str, str]]
    ) -> Change:
        job = await self.get_in(conn, job_id, lock=True)
        if job.status is not JobStatus.RUNNING or (job.stalled, job.silent) == (stalled, silent):
            return Change(job, changed=False)
        since = job.stalled_since if job.stalled and stalled else (self.now() if stalled else None)
        await conn.execute(
            "UPDATE jobs SET stalled = $1, stalled_since = $2, silent = $3 WHERE job_id = $4 AND status = 'running'",
            stalled,
            since,
            silent,
            job_id,
        )
        for event, reason in events:
            await self.record_event_in(conn, job_id, event, str(job.status), reason)
        return Change(replace(job, stalled=stalled, stalled_since=since, silent=silent), changed=True)

    async def record_event(self, conn: Any, job_id: str, event: str, reason: str | None) -> Job:
        job = await self.get_in(conn, job_id, lock=True)
        await self.record_event_in(conn, job_id, event, str(job.status), reason)
        return job

    # -- the pause ----------------------------------------------------------------------------------------

    async def set_paused(self, conn: Any, paused: bool, by: str) -> PauseState:
        current = await pause_state_in(conn, lock=True)
        if current.paused == paused:
            return current
        await conn.execute(
            "UPDATE queue_state SET paused = $1, paused_by = $2, paused_at = $3",
            paused,
            by if paused else None,
            self.now() if paused else None,
        )
        await self.notify_in(conn, Wakeup(WAKE_PAUSE))
        return await pause_state_in(conn)

    # -- the fleet (ADR 0012) -------------------------------------------------------------------------------

    async def renew_lease(self, conn: Any, host_id: str, boot_id: str, lease_s: float, lead: bool) -> Lease:
        # One transaction for the host row and the lead: the leader row is locked (or, when none exists, the insert
        # conflicts on its one key), so two hosts asking at once take turns and never both lead (INV-ONE-LEADER).
        await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", LEADER_LOCK, self.schema_key)
        # INV-LEASE-ON-REGISTRY-CLOCK: counted from the server's clock, read once the lock is held.
        now = await self.lease_now(conn)
        expires = now + timedelta(seconds=lease_s)
        # INV-FORGET-IS-FENCED: a boot an operator forgot never holds a lease again.
        if await conn.fetchval(
            "SELECT 1 FROM forgotten_hosts WHERE host_id = $1 AND boot_id = $2", host_id, boot_id
        ):
            raise HostForgotten(host_id, boot_id)
        before = await host_in(conn, host_id, now)
        replaced = before if before is not None and before.boot_id != boot_id else None
        if before is None or replaced is not None:
            await conn.execute(
                "INSERT INTO hosts (host_id, boot_id, started_at, last_seen_at, lease_expires_at) "
                "VALUES ($1, $2, $3, $3, $4) ON CONFLICT (host_id) DO UPDATE SET boot_id = excluded.boot_id, "
                "started_at = excluded.started_at, last_seen_at = excluded.last_seen_at, "
                "lease_expires_at = excluded.lease_expires_at",
                host_id,
                boot_id,
                now,
                expires,
            )
        else:
            await conn.execute(
                "UPDATE hosts SET last_seen_at = $1, lease_expires_at = $2 WHERE host_id = $3", now, expires, host_id
            )
        current = await leader_in(conn, now)
        if current is not None and (current.host_id, current.boot_id) == (host_id, boot_id):
            if lead:
                await conn.execute("UPDATE leader SET last_seen_at = $1, lease_expires_at = $2", now, expires)
            else:
                await conn.execute("DELETE FROM leader")
        elif lead and (current is None or not current.live):
            await conn.execute(
                "INSERT INTO leader (one, host_id, boot_id, since, last_seen_at, lease_expires_at) "
                "VALUES (1, $1, $2, $3, $3, $4) ON CONFLICT (one) DO UPDATE SET host_id = excluded.host_id, "
                "boot_id = excluded.boot_id, since = excluded.since, last_seen_at = excluded.last_seen_at, "
                "lease_expires_at = excluded.lease_expires_at",
                host_id,
                boot_id,
                now,
                expires,
            )
        host = await host_in(conn, host_id, now)
        assert host is not None
        return Lease(host, await leader_in(conn, now), replaced)

    async def release_lease(self, conn: Any, host_id: str, boot_id: str) -> None:
        now = await self.lease_now(conn)
        await conn.execute(
            "UPDATE hosts SET lease_expires_at = $1 WHERE host_id = $2 AND boot_id = $3", now, host_id, boot_id
        )
        await conn.execute("DELETE FROM leader WHERE host_id = $1 AND boot_id = $2", host_id, boot_id)

    async def record_setting(self, conn: Any, name: str, value: str, host_id: str, replace: bool) -> FleetSetting:
        conflict = (
            "DO UPDATE SET value = excluded.value, host_id = excluded.host_id, recorded_at = excluded.recorded_at"
            if replace
            else "DO NOTHING"
        )
        await conn.execute(
            f"INSERT INTO fleet_settings (name, value, host_id, recorded_at) VALUES ($1, $2, $3, $4) "
            f"ON CONFLICT (name) {conflict}",
            name,
            value,
            host_id,
            self.now(),
        )
        row = await conn.fetchrow(
            "SELECT name, value, host_id, recorded_at FROM fleet_settings WHERE name = $1", name
        )
        return FleetSetting(row["name"], row["value"], row["host_id"], row["recorded_at"].astimezone(UTC))

    async def forget_host(self, conn: Any, host_id: str) -> Host | None:
        # INV-FORGET-IS-FENCED: under the leases' lock, so that no renewal lands between the check and the fence.
        await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", LEADER_LOCK, self.schema_key)
        now = await self.lease_now(conn)  # INV-LEASE-ON-REGISTRY-CLOCK
        host = await host_in(conn, host_id, now)
        if host is not None and host.live:
            raise Conflict(
                f"host {host_id} holds a live lease until {to_iso(host.lease_expires_at)}: its jobs may be running; "
                "stop its supervisor first"
            )
        if host is not None:
            await conn.execute(
                "INSERT INTO forgotten_hosts (host_id, boot_id, forgotten_at) VALUES ($1, $2, $3) "
                "ON CONFLICT DO NOTHING",
                host.host_id,
                host.boot_id,
                now,
            )
        await conn.execute("DELETE FROM hosts WHERE host_id = $1", host_id)
        await conn.execute("DELETE FROM leader WHERE host_id = $1", host_id)
        # Its running rows were ended by the caller (ADR 0012): their slots are free for any host.
        await self.notify_in(conn, Wakeup(WAKE_FREED, host_id=host_id))
        return host
