"""``MemoryRegistry``: the registry in a process's memory, for fast tests of the core (the fake beside the real
thing, never instead of it: it passes the same contract suite as SQLite).

Atomic by construction: an operation never awaits between its reads and its writes (its only checkpoint comes
first), so on one Trio loop no other task sees it half done, which is what the other registries' transactions give.
An operation that raises halfway is undone (``_atomic``: an undo log, as a transaction's rollback), and a promotion
made after another change is undone alone (a savepoint), so a failure leaves nothing half written either.
Nothing survives the process, and nothing here is shared with another one.
"""

from __future__ import annotations

import copy
import hmac
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import trio

from ..domain import (
    RESUBMITTED,
    Conflict,
    HostForgotten,
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
from ..domain._model import Attempt, hash_token, to_iso, utc_now
from ._health import RegistryFault
from ._protocol import (
    BACK_IN_QUEUE,
    CURSOR_PATTERN,
    MAX_LIST_LIMIT,
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
    OutboxEvent,
    Outcome,
    PauseState,
    PromoteRequest,
    Promotion,
    PrunedJob,
    PruneResult,
    WakeupFeed,
    check_prune,
    log_name,
)


@dataclass(frozen=True)
class _Row:
    job: Job
    coalesce_key: str | None


@dataclass
class _Undo:
    """What one atomic step changed, to put back if it fails: each row as it was before its first change (None: the
    row is new), and the counters and the outbox's length."""

    rows: dict[str, _Row | None] = field(default_factory=dict)
    seq: int = 0
    event_seq: int = 0
    events: int = 0


class _MemoryRows:
    """The rows, the events and the pause in memory, and the primitives every operation builds on (each leaves the
    state as it was when it raises: ``_atomic``)."""

    def __init__(
        self, *, boot_id: str | None = None, outbox: bool = True, clock: Callable[[], datetime] = utc_now
    ) -> None:
        self.boot_id = boot_id
        self.outbox = outbox
        self._clock = clock
        self._rows: dict[str, _Row] = {}  # insertion order is seq order
        self._seq = 0
        self._events: list[OutboxEvent] = []
        self._event_seq = 0
        self._pause = PauseState(False)
        self._hosts: dict[str, Host] = {}
        self._leader: Host | None = None
        self._forgotten: set[tuple[str, str]] = set()  # (host_id, boot_id) an operator forgot
        self._settings: dict[str, FleetSetting] = {}
        self._closed = False
        self._undo: list[_Undo] = []  # the atomic steps under way, innermost last

    def _now(self) -> datetime:
        """The clock's time in UTC, as every timestamp is kept (a naive time is refused, as SQLite's ``to_iso``
        refuses it)."""
        now = self._clock()
        if now.tzinfo is None:
            raise ValueError(f"the registry's clock gave a naive datetime: {now!r}")
        return now.astimezone(UTC)

    async def _enter(self) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise RegistryError("the registry is closed")

    def _get(self, job_id: str) -> Job:
        """The row as a caller may have it: its own copy (its params and argv are mutable, and a row handed out
        must not change the registry's, as no row read from a database could), with its queue position."""
        row = self._rows.get(job_id)
        if row is None:
            raise JobNotFound(job_id)
        job = row.job
        position = self._position(job) if job.status is JobStatus.QUEUED else None
        return replace(job, params=copy.deepcopy(job.params), argv=list(job.argv), queue_position=position)

    def _position(self, job: Job) -> int:
        return sum(1 for r in self._rows.values() if r.job.status is JobStatus.QUEUED and r.job.seq <= job.seq)

    def _put(self, job: Job, coalesce_key: str | None = None, *, new: bool = False) -> None:
        row = self._rows.get(job.job_id)
        if self._undo and job.job_id not in self._undo[-1].rows:
            self._undo[-1].rows[job.job_id] = row
        key = coalesce_key if new or row is None else row.coalesce_key
        self._rows[job.job_id] = _Row(replace(job, queue_position=None), key)

    @contextmanager
    def _atomic(self) -> Iterator[None]:
        """All of what the block writes, or none of it: an exception puts every row, counter and event back as
        they were (nested: a savepoint, undone alone)."""
        undo = _Undo(seq=self._seq, event_seq=self._event_seq, events=len(self._events))
        self._undo.append(undo)
        try:
            yield
        except BaseException:
            for job_id, row in undo.rows.items():
                if row is None:
                    del self._rows[job_id]
                else:
                    self._rows[job_id] = row
            self._seq, self._event_seq = undo.seq, undo.event_seq
            del self._events[undo.events :]
            raise
        finally:
            self._undo.pop()
        if self._undo:  # a savepoint released: its changes are the enclosing step's to undo
            for job_id, row in undo.rows.items():
                self._undo[-1].rows.setdefault(job_id, row)

    def _event(self, job_id: str, event: str, previous: str | None, reason: str | None) -> None:
        if not self.outbox:
            return
        self._event_seq += 1
        self._events.append(
            OutboxEvent(
                seq=self._event_seq,
                event_id=uuid.uuid4().hex,
                job_id=job_id,
                event=event,
                created_at=self._now(),
                previous_status=previous,
                reason=reason,
                boot_id=self.boot_id,
                job=self._rows[job_id].job.public(),
            )
        )

    def _set_status(self, job: Job, to_status: JobStatus, *, reason: str | None = None, **fields: object) -> Job:
        check_transition(job.job_id, job.status, to_status)
        if to_status.is_terminal or to_status is JobStatus.QUEUED:
            fields["token_hash"] = None
        after = replace(job, status=to_status, queue_position=None, **fields)  # type: ignore[arg-type]
        self._put(after)
        if reason is None:
            named = "promoted" if to_status is JobStatus.RUNNING else fields.get("error_reason")
            reason = named if isinstance(named, str) else None
        self._event(job.job_id, "job.transition", str(job.status), reason)
        return self._get(job.job_id)

    def _back_in_queue(self, job: Job, reason: str, **fields: object) -> Job:
        """What a row that goes back to the queue forgets: the attempt's process, token, progress and judgement."""
        return self._set_status(
            job,
            JobStatus.QUEUED,
            reason=reason,
            **{**BACK_IN_QUEUE, **fields},
        )

    def _enqueue(self, new: NewJob) -> EnqueueResult:
        if new.coalesce_key is not None:
            for row in self._rows.values():
                if row.job.status is JobStatus.QUEUED and row.coalesce_key == new.coalesce_key:
                    return EnqueueResult(self._get(row.job.job_id), coalesced=True)
        self._seq += 1
        job = Job(
            job_id=uuid.uuid4().hex,
            seq=self._seq,
            kind=new.kind,
            params=copy.deepcopy(dict(new.params)),
            argv=list(new.argv),
            status=JobStatus.QUEUED,
            error_reason=None,
            exit_code=None,
            created_at=self._now(),
            started_at=None,
            ended_at=None,
            attempts=0,
            cancel_requested=False,
            boot_id=None,
            identity=None,
            token_hash=None,
            completed_units=0,
            total_units=None,
            stage=None,
            last_heartbeat_at=None,
            last_progress_at=None,
            log_path=None,
            max_attempts=new.max_attempts,
            retry_of=new.retry_of,
        )
        self._put(job, new.coalesce_key, new=True)
        self._event(job.job_id, "job.transition", None, "enqueued")
        return EnqueueResult(self._get(job.job_id), coalesced=False)

    def _promote(self, request: PromoteRequest | None) -> Promotion:
        if request is None:
            return Promotion()
        if self._pause.paused:
            return Promotion(paused=True)
        # INV-PROMOTION-NEVER-OVERSHOOTS: counted and flipped with no await in between.
        running = [r.job for r in self._rows.values() if r.job.status is JobStatus.RUNNING]
        free = request.free_slots(len(running), sum(1 for j in running if j.host_id == request.host_id))
        now = self._now()
        # FIFO among the rows whose backoff has passed (a resubmitted row keeps its place).
        queued = [
            r.job
            for r in self._rows.values()
            if r.job.status is JobStatus.QUEUED and (r.job.next_attempt_at is None or r.job.next_attempt_at <= now)
        ][: max(0, free)]
        promoted = []
        for job, token_hash in zip(queued, request.token_hashes, strict=False):
            attempt = job.attempts + 1
            log_path = str(request.log_dir / log_name(job.job_id, attempt)) if request.log_dir is not None else None
            promoted.append(
                self._set_status(
                    job,
                    JobStatus.RUNNING,
                    started_at=now,
                    boot_id=request.boot_id,
                    token_hash=token_hash,
                    attempts=attempt,
                    log_path=log_path,
                    identity=None,
                    next_attempt_at=None,
                    host_id=request.host_id,
                )
            )
        waiting = [
            r.job.next_attempt_at
            for r in self._rows.values()
            if r.job.status is JobStatus.QUEUED and r.job.next_attempt_at is not None and r.job.next_attempt_at > now
        ]
        return Promotion(tuple(promoted), next_at=min(waiting, default=None))

    def _promote_after(self, request: PromoteRequest | None) -> Promotion:
        """A promotion made in another change's step, undone alone if it fails (``failed``): the change it follows
        must not fail for it."""
        try:
            with self._atomic():
                return self._promote(request)
        except Exception:
            return Promotion(failed=True)

    def _authenticated(self, job_id: str, token: str) -> Job:
        try:
            job = self._get(job_id)
        except JobNotFound:
            raise Unauthorized("the token is not this job's") from None
        if job.token_hash is None or not hmac.compare_digest(job.token_hash, hash_token(token)):
            raise Unauthorized("the token is not this job's")
        return job


class MemoryRegistry(_MemoryRows):
    """See the module docstring; the constructor takes what ``SqliteRegistry``'s does, but the path."""

    async def enqueue(self, job: NewJob, *, promote: PromoteRequest | None = None) -> tuple[EnqueueResult, Promotion]:
        await self._enter()
        with self._atomic():
            result = self._enqueue(job)
            return result, self._promote_after(promote)

    async def enqueue_many(self, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
        await self._enter()
        with self._atomic():
            return [replace(r, job=replace(r.job, queue_position=None)) for r in map(self._enqueue, jobs)]

    async def promote(self, request: PromoteRequest) -> Promotion:
        await self._enter()
        with self._atomic():
            return self._promote(request)

    async def record_identities(self, claims: Sequence[IdentityClaim]) -> list[Job]:
        await self._enter()
        out = []
        with self._atomic():
            for claim in claims:
                job = self._get(claim.job_id)
                if job.status is JobStatus.RUNNING:
                    self._put(replace(job, identity=claim.identity))
                out.append(self._get(claim.job_id))
        return out

    async def finalize(
        self, job_id: str, ending: Ending, *, expect: Expect | None = None, promote: PromoteRequest | None = None
    ) -> tuple[Change, Promotion]:
        await self._enter()
        job = self._get(job_id)
        if job.status.is_terminal or (expect is not None and job.identity != expect.identity):
            return Change(job, changed=False), Promotion()
        if expect is not None and expect.host_silent and job.host_id is not None:
            host = self._host(job.host_id, self._now())
            if host is not None and host.live:
                return Change(job, changed=False), Promotion()  # INV-SILENT-HOST-ENDS-BY-PROOF: it is back
        chosen = ending.chosen(job.cancel_requested)
        if job.status is not JobStatus.RUNNING:
            raise IllegalTransition(job_id, job.status, chosen.status)
        with self._atomic():
            ended_at = self._now()
            if ending.retry is not None and chosen is ending.outcome:
                # Resubmitted (ADR-150 D4): the attempt's outcome into the history, the row back to the queue.
                status, reason, code = chosen.status, chosen.reason, ending.exit_code
                attempt = Attempt(job.attempts, job.started_at, ended_at, status, reason, code)
                after = self._back_in_queue(
                    job,
                    RESUBMITTED + ending.retry.why,
                    next_attempt_at=ending.retry.not_before.astimezone(UTC),
                    history=(*job.history, attempt),
                )
            else:
                after = self._set_status(
                    job, chosen.status, error_reason=chosen.reason, exit_code=ending.exit_code, ended_at=ended_at
                )
                if ending.then is not None and chosen.status is JobStatus.SUCCEEDED:
                    follow_up = self._enqueue(ending.then)
                    change = Change(after, changed=True, previous=job.status, follow_up=follow_up)
                    return change, self._promote_after(promote)
            return Change(after, changed=True, previous=job.status), self._promote_after(promote)

    async def requeue(self, job_id: str, *, expect: Expect, reason: str) -> Change:
        await self._enter()
        job = self._get(job_id)
        if job.status is not JobStatus.RUNNING or job.identity != expect.identity:
            return Change(job, changed=False)
        with self._atomic():
            after = self._back_in_queue(job, reason, attempts=max(0, job.attempts - 1))
            return Change(after, changed=True, previous=job.status)

    async def request_cancel(self, job_id: str) -> Change:
        await self._enter()
        job = self._get(job_id)
        if job.status is JobStatus.QUEUED:
            # A job waiting out its backoff has run before: it is simply cancelled.
            outcome = Outcome(JobStatus.CANCELLED, "cancelled_before_start" if job.attempts == 0 else "cancelled")
            after = self._set_status(job, outcome.status, error_reason=outcome.reason, ended_at=self._now())
            return Change(after, changed=True, previous=job.status)
        if job.status is JobStatus.RUNNING and not job.cancel_requested:
            self._put(replace(job, cancel_requested=True))
            return Change(self._get(job_id), changed=True)
        return Change(job, changed=False)

    async def record_heartbeats(self, beats: Sequence[Beat]) -> list[Job | RequestError]:
        await self._enter()
        now = self._now()
        results: list[Job | RequestError] = []
        for beat in beats:
            try:
                job = self._authenticated(beat.job_id, beat.token)
                if job.status is not JobStatus.RUNNING:
                    raise Conflict(f"job {beat.job_id} is {job.status}, not running", field="job_id")
            except RequestError as exc:
                results.append(exc)
                continue
            # INV-PROGRESS-NOT-LIVENESS: every beat is liveness; only a higher watermark is progress.
            after = replace(
                job,
                last_heartbeat_at=now,
                completed_units=max(beat.completed_units, job.completed_units),
                total_units=job.total_units if beat.total_units is None else beat.total_units,
                stage=job.stage if beat.stage is None else beat.stage,
                last_progress_at=now if beat.completed_units > job.completed_units else job.last_progress_at,
            )
            self._put(after)
            results.append(self._get(beat.job_id))
        return results

    async def check_job_token(self, job_id: str, token: str) -> None:
        await self._enter()
        self._authenticated(job_id, token)

    async def set_absence(
        self, job_id: str, *, stalled: bool, silent: bool, events: Sequence[tuple[str, str]] = ()
    ) -> Change:
        await self._enter()
        job = self._get(job_id)
        if job.status is not JobStatus.RUNNING or (job.stalled, job.silent) == (stalled, silent):
            return Change(job, changed=False)
        since = job.stalled_since if job.stalled and stalled else (self._now() if stalled else None)
        after = replace(job, stalled=stalled, stalled_since=since, silent=silent)
        self._put(after)
        for event, reason in events:
            self._event(job_id, event, str(job.status), reason)
        return Change(self._get(job_id), changed=True)

    async def record_event(self, job_id: str, event: str, reason: str | None) -> Job:
        await self._enter()
        job = self._get(job_id)
        self._event(job_id, event, str(job.status), reason)
        return job

    async def outbox_pending(self, limit: int) -> list[OutboxEvent]:
        await self._enter()
        return [replace(e, job=copy.deepcopy(dict(e.job))) for e in self._events[:limit]]

    async def outbox_delete(self, seqs: Sequence[int]) -> None:
        await self._enter()
        gone = set(seqs)
        self._events = [e for e in self._events if e.seq not in gone]

    async def outbox_depth(self) -> int:
        await self._enter()
        return len(self._events)

    async def outbox_prune(self, *, max_events: int, max_age_s: float) -> PruneResult:
        await self._enter()
        cutoff = self._now() - timedelta(seconds=max_age_s)
        kept = [e for e in self._events if e.created_at >= cutoff]
        by_age = len(self._events) - len(kept)
        by_count = max(0, len(kept) - max_events)
        self._events = kept[by_count:]
        return PruneResult(by_age, by_count)

    async def set_paused(self, paused: bool, *, by: str) -> PauseState:
        await self._enter()
        if self._pause.paused != paused:
            self._pause = PauseState(True, by, self._now()) if paused else PauseState(False)
        return self._pause

    async def pause_state(self) -> PauseState:
        await self._enter()
        return self._pause

    async def get(self, job_id: str) -> Job:
        await self._enter()
        return self._get(job_id)

    async def running_jobs(self) -> list[Job]:
        await self._enter()
        return [self._get(r.job.job_id) for r in self._rows.values() if r.job.status is JobStatus.RUNNING]

    async def list_jobs(
        self, *, status: str | None = None, kind: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[Job], str | None]:
        await self._enter()
        if status is not None and status not in {s.value for s in JobStatus}:
            raise ValidationError(f"unknown status {status!r}", field="status")
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValidationError(f"limit must be between 1 and {MAX_LIST_LIMIT}", field="limit")
        before: int | None = None
        if cursor is not None:
            if not CURSOR_PATTERN.fullmatch(cursor):
                raise ValidationError("cursor is not one this server issued", field="cursor")
            before = int(cursor)
        rows = [
            r.job
            for r in reversed(self._rows.values())
            if (status is None or r.job.status == status)
            and (kind is None or r.job.kind == kind)
            and (before is None or r.job.seq < before)
        ]
        page = [self._get(job.job_id) for job in rows[:limit]]
        return page, (str(page[-1].seq) if len(rows) > limit else None)

    async def counts(self) -> dict[str, int]:
        await self._enter()
        out = {s.value: 0 for s in JobStatus}
        for row in self._rows.values():
            out[row.job.status.value] += 1
        return out

    async def retries_of(self, job_id: str) -> list[str]:
        await self._enter()
        return [r.job.job_id for r in self._rows.values() if r.job.retry_of == job_id]

    async def prune_jobs(
        self, *, ended_before: datetime | None, keep_latest: int | None, limit: int, dry_run: bool = False
    ) -> list[PrunedJob]:
        await self._enter()
        check_prune(keep_latest, limit)
        if ended_before is None and keep_latest is None:
            return []
        finished = sorted(
            (r.job for r in self._rows.values() if r.job.status.is_terminal and r.job.ended_at is not None),
            key=lambda job: (job.ended_at, job.seq),
        )
        # The oldest ones past the newest ``keep_latest``; and every one that ended before ``ended_before``.
        past = len(finished) - keep_latest if keep_latest is not None else 0
        pending = {event.job_id for event in self._events}
        gone = [
            job
            for index, job in enumerate(finished)
            if (index < past or (ended_before is not None and job.ended_at is not None and job.ended_at < ended_before))
            and job.job_id not in pending
        ][:limit]
        if not dry_run:
            for job in gone:
                del self._rows[job.job_id]
        return [
            PrunedJob(job.job_id, job.kind, job.status, job.ended_at, job.log_path, job.attempts)
            for job in gone
            if job.ended_at is not None
        ]

    # -- the fleet (ADR 0012): no await between the reads and the writes, as everywhere here -----------------

    async def renew_lease(self, host_id: str, boot_id: str, *, lease_s: float, lead: bool) -> Lease:
        await self._enter()
        if (host_id, boot_id) in self._forgotten:
            raise HostForgotten(host_id, boot_id)  # INV-FORGET-IS-FENCED
        now = self._now()
        expires = now + timedelta(seconds=lease_s)
        before = self._host(host_id, now)
        replaced = before if before is not None and before.boot_id != boot_id else None
        started = now if before is None or replaced is not None else before.started_at
        host = Host(host_id, boot_id, started, now, expires, as_of=now)
        self._hosts[host_id] = host
        current = self._leader_at(now)
        if current is not None and (current.host_id, current.boot_id) == (host_id, boot_id):
            self._leader = replace(current, last_seen_at=now, lease_expires_at=expires) if lead else None
        elif lead and (current is None or not current.live):
            self._leader = Host(host_id, boot_id, now, now, expires, as_of=now)
        return Lease(host, self._leader_at(now), replaced)

    async def release_lease(self, host_id: str, boot_id: str) -> None:
        await self._enter()
        now = self._now()
        host = self._hosts.get(host_id)
        if host is not None and host.boot_id == boot_id:
            self._hosts[host_id] = replace(host, lease_expires_at=now)
        if self._leader is not None and (self._leader.host_id, self._leader.boot_id) == (host_id, boot_id):
            self._leader = None

    async def hosts(self) -> list[Host]:
        await self._enter()
        now = self._now()
        return [replace(self._hosts[h], as_of=now) for h in sorted(self._hosts)]

    async def leader(self) -> Host | None:
        await self._enter()
        return self._leader_at(self._now())

    def _host(self, host_id: str, now: datetime) -> Host | None:
        """Host ``host_id`` as of ``now`` (INV-LEASE-ON-REGISTRY-CLOCK: this registry's clock judges its lease)."""
        host = self._hosts.get(host_id)
        return None if host is None else replace(host, as_of=now)

    def _leader_at(self, now: datetime) -> Host | None:
        return None if self._leader is None else replace(self._leader, as_of=now)

    async def forget_host(self, host_id: str) -> Host | None:
        await self._enter()
        # INV-FORGET-IS-FENCED: the check and the fence in one step (no await between them).
        host = self._host(host_id, self._now())
        if host is not None and host.live:
            raise Conflict(
                f"host {host_id} holds a live lease until {to_iso(host.lease_expires_at)}: its jobs may be running; "
                "stop its supervisor first"
            )
        if host is not None:
            self._forgotten.add((host.host_id, host.boot_id))
        if self._leader is not None and self._leader.host_id == host_id:
            self._leader = None
        self._hosts.pop(host_id, None)
        return host

    async def record_setting(self, name: str, value: str, host_id: str, *, replace: bool) -> FleetSetting:
        await self._enter()
        if replace or name not in self._settings:
            self._settings[name] = FleetSetting(name, value, host_id, self._now())
        return self._settings[name]

    def fault(self) -> RegistryFault | None:
        return None  # memory does not fail to write

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]:
        """Nothing to hear: one process owns this registry, and its own wakes (an enqueue, a job's end) suffice."""
        return nullcontext(None)

    async def aclose(self) -> None:
        self._closed = True
