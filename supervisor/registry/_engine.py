"""The registry's rules, written once: every change a registry makes is decided here, over a ``Store``.

A ``Store`` is one transaction's view of a backend: it reads rows (locking them where its backend locks), counts,
selects the next ready rows, inserts, applies a change to a row, writes an event, sends a wake-up -- in domain
types, never deciding anything. Each backend's store is only its SQL (``sqlite/_rows.py``: SQLite in its worker
thread, inside the group commit of ``sqlite/_store.py``; ``postgres/_rows.py``: asyncpg through trio-asyncio) or
its dicts (``memory.py``). The ``Rules`` decide: enqueue and coalescing, promotion into free slots under the
fleet-wide and per-host limits, identity records, the end of a job and its resubmission, requeue, cancel, heartbeats
and progress, absence flags, the pause, leases and the lead, forget, retention, the outbox's events.

The rules are coroutines, and a store's methods may suspend (PostgreSQL) or complete at once (SQLite, memory):
``run_now`` drives one to its end without an event loop, which is how the SQLite store runs the rules inside its
group commit, in a worker thread, with no thread hop per statement. (The same rules, one text: procrastinate's
``JobManager`` over its connectors, River's core over its drivers.)
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

from ..domain import (
    RESUBMITTED,
    TERMINAL,
    Conflict,
    HostForgotten,
    IdempotencyKey,
    IdempotencyKeyReused,
    IllegalTransition,
    Job,
    JobNotFound,
    JobStatus,
    RequestError,
    Unauthorized,
    ValidationError,
    check_transition,
    key_problem,
)
from ..domain._model import Attempt, hash_token, to_iso
from ._protocol import (
    BACK_IN_QUEUE,
    CURSOR_PATTERN,
    MAX_LIST_LIMIT,
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
    OutboxEvent,
    Outcome,
    PauseState,
    PromoteRequest,
    Promotion,
    PrunedJob,
    PruneResult,
    Receipt,
    Wakeup,
    check_prune,
    log_name,
)

T = TypeVar("T")


def run_now(step: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the rules over a store that answers at once) to its end, here."""
    try:
        step.send(None)
    except StopIteration as done:
        return done.value
    step.close()
    raise RuntimeError("a store that answers at once suspended")


@dataclass(frozen=True)
class Page:
    """A validated page request of ``list_jobs``: rows before ``before`` (their ``seq``), newest first."""

    status: str | None
    kind: str | None
    limit: int
    before: int | None
    idempotency_key: str | None = None  # only the jobs a live key answered

    @classmethod
    def of(
        cls, status: str | None, kind: str | None, limit: int, cursor: str | None, idempotency_key: str | None = None
    ) -> Page:
        """A bad status, limit, cursor or key is a ``ValidationError`` naming it."""
        if status is not None and status not in {s.value for s in JobStatus}:
            raise ValidationError(f"unknown status {status!r}", field="status")
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValidationError(f"limit must be between 1 and {MAX_LIST_LIMIT}", field="limit")
        # A cursor is a row sequence number this server issued: ASCII digits that fit a 64-bit integer (int() also
        # takes '1_0', '-3' and other scripts' digits).
        if cursor is not None and not CURSOR_PATTERN.fullmatch(cursor):
            raise ValidationError("cursor is not one this server issued", field="cursor")
        problem = key_problem(idempotency_key) if idempotency_key is not None else None
        if problem is not None:
            raise ValidationError(f"idempotency_key {problem}", field="idempotency_key")
        return cls(status, kind, limit, int(cursor) if cursor is not None else None, idempotency_key)


class Store(Protocol):
    """One transaction's view of a backend's rows, in domain types; it decides nothing (``Rules`` do).

    ``lock`` (``job``, ``promotable``, ``pause``, ``prunable``): hold the rows until the transaction ends where the
    backend locks rows (PostgreSQL's ``FOR UPDATE``; SQLite's write transaction and memory's single step hold
    everything already).
    ``update``'s fields are ``Job`` field names with domain values; ``status``: only while the row has that status
    (the number of rows changed is returned).
    ``receipts``: a key's fingerprint and its receipts in answer order, if it is live at ``now``; ``put_receipts``
    replaces whatever expired rows the key still has. ``prunable`` never offers a row a live key answered."""

    def now(self) -> datetime: ...
    async def lease_now(self) -> datetime: ...
    async def job(self, job_id: str, *, lock: bool = False, position: bool = False) -> Job | None: ...
    async def jobs(self, job_ids: Sequence[str]) -> list[Job]: ...
    async def running(self) -> list[Job]: ...
    async def lock_promotion(self) -> None: ...
    async def running_counts(self, host_id: str | None) -> tuple[int, int]: ...
    async def promotable(self, now: datetime, limit: int, *, lock: bool = False) -> list[Job]: ...
    async def next_backoff_end(self, now: datetime) -> datetime | None: ...
    async def queued_with_key(self, key: str) -> str | None: ...
    async def insert(self, job: NewJob, now: datetime) -> str: ...
    # idempotency keys: one row per job a keyed request answered (its ``position`` in the answer)
    async def lock_key(self, key: str) -> None: ...
    async def receipts(self, key: str, now: datetime) -> tuple[str, list[Receipt]] | None: ...
    async def put_receipts(
        self, key: str, fingerprint: str, receipts: Sequence[Receipt], now: datetime, expires_at: datetime
    ) -> None: ...
    async def drop_expired_keys(self, now: datetime, limit: int) -> int: ...
    async def update(self, job_id: str, fields: Mapping[str, object], *, status: JobStatus | None = None) -> int: ...
    async def add_event(
        self, job_id: str, body: Mapping[str, Any], event: str, previous: str | None, reason: str | None
    ) -> None: ...
    async def notify(self, wake: Wakeup) -> None: ...
    def savepoint(self) -> AbstractAsyncContextManager[None]: ...
    async def pause(self, *, lock: bool = False) -> PauseState: ...
    async def set_pause(self, state: PauseState) -> None: ...
    # the fleet's rows (one lock for the leases where the backend locks: ``lock_leases``)
    async def lock_leases(self) -> None: ...
    async def hosts(self, now: datetime) -> list[Host]: ...
    async def leader(self, now: datetime) -> Host | None: ...
    async def put_host(self, host: Host, *, new: bool) -> None: ...
    async def put_leader(self, host: Host | None, *, only: tuple[str, str] | None = None) -> None: ...
    async def fenced(self, host_id: str, boot_id: str) -> bool: ...
    async def fence(self, host: Host, now: datetime) -> None: ...
    async def drop_host(self, host_id: str) -> None: ...
    async def setting(self, name: str) -> FleetSetting | None: ...
    async def put_setting(self, setting: FleetSetting) -> None: ...
    # retention and the outbox
    async def finished_edge(self, keep_latest: int) -> tuple[datetime, int] | None: ...
    async def prunable(
        self, ended_before: datetime | None, edge: tuple[datetime, int] | None, limit: int, *, lock: bool
    ) -> list[PrunedJob]: ...
    async def delete_finished(self, job_ids: Sequence[str]) -> set[str]: ...
    async def outbox_stats(self) -> tuple[int, datetime | None]: ...
    async def outbox_drop(self, older_than: datetime, max_events: int) -> PruneResult: ...
    async def outbox_pending(self, limit: int) -> list[OutboxEvent]: ...
    async def outbox_delete(self, seqs: Sequence[int]) -> None: ...
    # reads
    async def list_page(self, page: Page) -> tuple[list[Job], str | None]: ...
    async def counts(self) -> dict[str, int]: ...
    async def retries_of(self, job_id: str) -> list[str]: ...


Step = Callable[[Store], Coroutine[Any, Any, T]]


class Independent(Generic[T]):
    """A step whose writes each stand on their own (a heartbeat's one update per beat, after the checks that may
    refuse it): one that fails partway leaves nothing that needs undoing. A store that runs several callers' steps
    in one transaction (SQLite's group commit) can then skip the savepoint it would wrap the step in: two
    statements of a beat's four."""

    def __init__(self, step: Step[T]) -> None:
        self.step = step

    def __call__(self, store: Store) -> Coroutine[Any, Any, T]:
        return self.step(store)


class LocalStore:
    """What the stores of one machine's rows share (SQLite, memory): one clock, for the rows and the leases alike
    (INV-LEASE-ON-REGISTRY-CLOCK: one machine's); no lock beyond the transaction, which holds every row already; and
    nobody else to wake (one process owns the rows)."""

    clock: Callable[[], datetime]

    def now(self) -> datetime:
        """The clock's time in UTC (a naive one is refused): what a row stores, and so what a write answers."""
        now = self.clock()
        if now.tzinfo is None:
            raise ValueError(f"the registry's clock gave a naive datetime: {now!r}")
        return now.astimezone(UTC)

    async def lease_now(self) -> datetime:
        return self.now()

    async def lock_promotion(self) -> None:
        """The transaction holds the write lock (SQLite's; a memory step is atomic by itself)."""

    async def lock_leases(self) -> None:
        """As ``lock_promotion``."""

    async def lock_key(self, key: str) -> None:
        """As ``lock_promotion``: a keyed request's check and its insert are one transaction under the write lock."""

    async def notify(self, wake: Wakeup) -> None:
        """Nobody else hears this registry."""


class Rules:
    """The registry's rules over a store. ``boot_id``: who makes the changes (written into each event); ``outbox``:
    write events at all (a supervisor with no webhook turns it off: nothing would send them)."""

    def __init__(self, *, boot_id: str | None, outbox: bool) -> None:
        self.boot_id = boot_id
        self.outbox = outbox

    # -- rows --------------------------------------------------------------------------------------------

    @staticmethod
    async def get(store: Store, job_id: str, *, lock: bool = False) -> Job:
        """A row with its queue position (``JobNotFound``)."""
        job = await store.job(job_id, lock=lock, position=True)
        if job is None:
            raise JobNotFound(job_id)
        return job

    async def event(self, store: Store, job_id: str, event: str, previous: str | None, reason: str | None) -> None:
        """One outbox event, with the row as of the change, in the change's own transaction (the transactional
        outbox: a committed change always has its event, a rolled-back one never)."""
        if self.outbox:
            job = await store.job(job_id)
            assert job is not None
            await store.add_event(job.job_id, job.public(), event, previous, reason)

    async def set_status(
        self, store: Store, job: Job, to_status: JobStatus, fields: Mapping[str, object], *, reason: str | None = None
    ) -> None:
        """The one place a row's status changes, with ``fields``; an illegal transition raises. Its event is written
        here too, with ``reason`` (by default ``promoted``, or the row's new ``error_reason``)."""
        check_transition(job.job_id, job.status, to_status)
        if to_status.is_terminal or to_status is JobStatus.QUEUED:
            # A job's token works only while the job runs: with its hash gone, a late (or stolen) token matches
            # nothing, and the heartbeat answers 401 exactly as for a job that never existed.
            fields = {**fields, "token_hash": None}
        if await store.update(job.job_id, {"status": to_status, **fields}, status=job.status) != 1:
            raise IllegalTransition(job.job_id, job.status, to_status)  # read in this transaction: cannot happen
        if reason is None:
            named = "promoted" if to_status is JobStatus.RUNNING else fields.get("error_reason")
            reason = named if isinstance(named, str) else None
        await self.event(store, job.job_id, "job.transition", str(job.status), reason)

    async def authenticated(self, store: Store, job_id: str, token: str, *, lock: bool = False) -> Job:
        job = await store.job(job_id, lock=lock)
        # Constant-time compare of the hashes; a missing hash (a job that does not run, or none) never matches.
        if job is None or job.token_hash is None or not hmac.compare_digest(job.token_hash, hash_token(token)):
            raise Unauthorized("the token is not this job's")
        return job

    # -- enqueue and promotion ---------------------------------------------------------------------------

    async def add(self, store: Store, new: NewJob) -> tuple[str, bool]:
        """Insert a queued row, or find the queued row it coalesces into (ADR-152 §8: only a queued row absorbs an
        identical one); whether it coalesced."""
        if new.coalesce_key is not None:
            found = await store.queued_with_key(new.coalesce_key)
            if found is not None:
                return found, True
        job_id = await store.insert(new, store.now())
        await self.event(store, job_id, "job.transition", None, "enqueued")
        return job_id, False

    async def enqueue(
        self, store: Store, new: NewJob, promote: PromoteRequest | None, key: IdempotencyKey | None = None
    ) -> tuple[EnqueueResult, Promotion]:
        if key is not None:
            replayed = await replay(store, key)
            if replayed is not None:
                return replayed[0], Promotion()  # INV-KEY-ONCE: a key's request never makes a second row
            new = replace(new, idempotency_key=key.key)
        job_id, coalesced = await self.add(store, new)
        if not coalesced:
            await store.notify(Wakeup(WAKE_QUEUED))
        result = EnqueueResult(await self.get(store, job_id), coalesced=coalesced)
        await keep(store, key, [result])
        return result, await self.promote_after(store, promote)

    async def enqueue_many(
        self, store: Store, jobs: Sequence[NewJob], key: IdempotencyKey | None = None
    ) -> list[EnqueueResult]:
        if key is not None:
            replayed = await replay(store, key)
            if replayed is not None:
                return replayed  # INV-KEY-ONCE
            jobs = [replace(new, idempotency_key=key.key) for new in jobs]
        added = [await self.add(store, new) for new in jobs]
        if not added:
            return []
        if not all(coalesced for _, coalesced in added):
            await store.notify(Wakeup(WAKE_QUEUED))  # one for the batch, however large
        rows = {job.job_id: job for job in await store.jobs([job_id for job_id, _ in added])}
        results = [EnqueueResult(rows[job_id], coalesced) for job_id, coalesced in added]
        await keep(store, key, results)
        return results

    async def promote_rows(self, store: Store, request: PromoteRequest) -> list[Job]:
        """INV-PROMOTION-NEVER-OVERSHOOTS: the count and the flips in one transaction under the promotion's lock
        (SQLite's write lock; PostgreSQL's advisory lock, then READ COMMITTED counts every promotion committed
        before), so concurrent promotions in any process take turns. Each row gets this boot's id and
        ``started_at`` in the same step (INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING)."""
        await store.lock_promotion()
        running, here = await store.running_counts(request.host_id)
        free = request.free_slots(running, here)
        if free <= 0:
            return []
        now = store.now()
        promoted: list[Job] = []
        # FIFO among the rows whose backoff has passed (a resubmitted row keeps its place: its insertion order).
        for job, token_hash in zip(await store.promotable(now, free, lock=True), request.token_hashes, strict=False):
            attempt = job.attempts + 1
            log_path = str(request.log_dir / log_name(job.job_id, attempt)) if request.log_dir is not None else None
            fields: dict[str, object] = {
                "started_at": now,
                "boot_id": request.boot_id,
                "token_hash": token_hash,
                "attempts": attempt,
                "log_path": log_path,
                "identity": None,
                "next_attempt_at": None,
                "host_id": request.host_id,
            }
            await self.set_status(store, job, JobStatus.RUNNING, fields)
            promoted.append(replace(job, status=JobStatus.RUNNING, queue_position=None, **fields))  # type: ignore[arg-type]
        return promoted

    async def promote(self, store: Store, request: PromoteRequest) -> Promotion:
        if (await store.pause()).paused:
            return Promotion(paused=True)
        jobs = tuple(await self.promote_rows(store, request))
        return Promotion(jobs, next_at=await store.next_backoff_end(store.now()))

    async def promote_after(self, store: Store, request: PromoteRequest | None) -> Promotion:
        """A promotion made in another change's transaction, in a savepoint of its own: if it fails, it alone is
        rolled back (``failed``): the change it follows must not fail for it."""
        if request is None:
            return Promotion()
        try:
            async with store.savepoint():
                return await self.promote(store, request)
        except Exception:
            return Promotion(failed=True)

    async def record_identities(self, store: Store, claims: Sequence[IdentityClaim]) -> list[Job]:
        out = []
        for claim in claims:
            await store.update(claim.job_id, {"identity": claim.identity}, status=JobStatus.RUNNING)
            out.append(await self.get(store, claim.job_id))
        return out

    # -- ends --------------------------------------------------------------------------------------------

    async def finalize(
        self, store: Store, job_id: str, ending: Ending, expect: Expect | None, promote: PromoteRequest | None
    ) -> tuple[Change, Promotion]:
        change = await self._finalize(store, job_id, ending, expect)
        return change, await self.promote_after(store, promote if change.changed else None)

    async def _finalize(self, store: Store, job_id: str, ending: Ending, expect: Expect | None) -> Change:
        job = await self.get(store, job_id, lock=True)
        if job.status.is_terminal:
            return Change(job, changed=False)
        if expect is not None and job.identity != expect.identity:
            return Change(job, changed=False)  # the evidence was about another process than the row records now
        if expect is not None and expect.host_silent and job.host_id is not None:
            await store.lock_leases()  # no renewal commits between this check and the end
            host = await _host(store, job.host_id, await store.lease_now())
            if host is not None and host.live:
                return Change(job, changed=False)  # INV-SILENT-HOST-ENDS-BY-PROOF: it is back, its rows its own
        chosen = ending.chosen(job.cancel_requested)
        if job.status is not JobStatus.RUNNING:
            raise IllegalTransition(job_id, job.status, chosen.status)  # only a running job ends this way
        assert chosen.status in TERMINAL
        ended_at = store.now()
        if ending.retry is not None and chosen is ending.outcome:
            # Resubmitted (ADR-150 D4): the attempt's outcome into the history and the row back to the queue, in
            # this one transaction, so a crash between them can neither lose the job nor make it twice.
            attempt = Attempt(job.attempts, job.started_at, ended_at, chosen.status, chosen.reason, ending.exit_code)
            fields = {
                **BACK_IN_QUEUE,
                "next_attempt_at": ending.retry.not_before.astimezone(UTC),
                "history": (*job.history, attempt),
            }
            await self.set_status(store, job, JobStatus.QUEUED, fields, reason=RESUBMITTED + ending.retry.why)
            await store.notify(Wakeup(WAKE_QUEUED))  # any host may run it once its backoff has passed
            return Change(await self.get(store, job_id), changed=True, previous=job.status)
        # A plain end notifies nobody: the host that ran the job (only it finalizes its jobs, INV-OWNER-JUDGES) wakes
        # its own drainer for the slot it freed (ADR 0012).
        await self.set_status(
            store,
            job,
            chosen.status,
            {"error_reason": chosen.reason, "exit_code": ending.exit_code, "ended_at": ended_at},
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
            follow_up, _ = await self.enqueue(store, ending.then, None, ending.then_key)
        return Change(after, changed=True, previous=job.status, follow_up=follow_up)

    async def requeue(self, store: Store, job_id: str, expect: Expect, reason: str) -> Change:
        job = await self.get(store, job_id, lock=True)
        if job.status is not JobStatus.RUNNING or job.identity != expect.identity:
            return Change(job, changed=False)
        # Its start never happened: it does not count, and it keeps its place (the head of the queue: every row
        # still queued was enqueued after it, or it would have been promoted first).
        fields = {**BACK_IN_QUEUE, "attempts": max(0, job.attempts - 1)}
        await self.set_status(store, job, JobStatus.QUEUED, fields, reason=reason)
        await store.notify(Wakeup(WAKE_QUEUED))
        return Change(await self.get(store, job_id), changed=True, previous=job.status)

    async def request_cancel(self, store: Store, job_id: str, by: str | None = None) -> Change:
        job = await self.get(store, job_id, lock=True)
        if job.status is JobStatus.QUEUED:
            # A job waiting out its backoff has run before: it is simply cancelled.
            outcome = Outcome(JobStatus.CANCELLED, "cancelled_before_start" if job.attempts == 0 else "cancelled")
            ended = {"error_reason": outcome.reason, "ended_at": store.now(), "cancelled_by": by}
            await self.set_status(store, job, outcome.status, ended)
            return Change(await self.get(store, job_id), changed=True, previous=job.status)
        if job.status is JobStatus.RUNNING and not job.cancel_requested:
            await store.update(job_id, {"cancel_requested": True, "cancelled_by": by})
            # The host that runs it carries it out now (woken), or at its next sweep (INV-OWNER-JUDGES).
            await store.notify(Wakeup(WAKE_CANCEL, job_id=job_id, host_id=job.host_id))
            return Change(await self.get(store, job_id), changed=True)
        return Change(job, changed=False)

    # -- what a running job says, and what the sweeper judges ------------------------------------------------

    async def record_heartbeats(self, store: Store, beats: Sequence[Beat]) -> list[Job | RequestError]:
        results: list[Job | RequestError] = []
        now = store.now()
        for beat in beats:
            try:
                job = await self.authenticated(store, beat.job_id, beat.token, lock=True)
                if job.status is not JobStatus.RUNNING:
                    raise Conflict(f"job {beat.job_id} is {job.status}, not running", field="job_id")
            except RequestError as exc:
                results.append(exc)
                continue
            # INV-PROGRESS-NOT-LIVENESS: every beat is liveness; only a higher watermark is progress.
            fields = {
                "last_heartbeat_at": now,
                "completed_units": max(beat.completed_units, job.completed_units),
                "total_units": job.total_units if beat.total_units is None else beat.total_units,
                "stage": job.stage if beat.stage is None else beat.stage,
                "last_progress_at": now if beat.completed_units > job.completed_units else job.last_progress_at,
            }
            await store.update(beat.job_id, fields)
            results.append(replace(job, **fields))  # type: ignore[arg-type]
        return results

    async def set_absence(
        self, store: Store, job_id: str, stalled: bool, silent: bool, events: Sequence[tuple[str, str]]
    ) -> Change:
        job = await self.get(store, job_id, lock=True)
        if job.status is not JobStatus.RUNNING or (job.stalled, job.silent) == (stalled, silent):
            return Change(job, changed=False)
        since = job.stalled_since if job.stalled and stalled else (store.now() if stalled else None)
        fields = {"stalled": stalled, "stalled_since": since, "silent": silent}
        await store.update(job_id, fields, status=JobStatus.RUNNING)
        for event, reason in events:
            await self.event(store, job_id, event, str(job.status), reason)
        return Change(replace(job, **fields), changed=True)  # type: ignore[arg-type]

    async def record_event(self, store: Store, job_id: str, event: str, reason: str | None) -> Job:
        job = await self.get(store, job_id, lock=True)
        await self.event(store, job_id, event, str(job.status), reason)
        return job

    async def queue_event(
        self, store: Store, event: str, job_id: str, details: Mapping[str, Any], reason: str, announced: FleetSetting
    ) -> None:
        """The queue's watch says a stuck queue began or ended (issue 40): its event into the outbox, and what was
        announced recorded (``announced``: a boot after a restart does not say a condition that still holds twice),
        in one step."""
        if self.outbox:
            await store.add_event(job_id, details, event, None, reason)
        await store.put_setting(announced)

    # -- the pause ----------------------------------------------------------------------------------------

    @staticmethod
    async def set_paused(store: Store, paused: bool, by: str) -> PauseState:
        current = await store.pause(lock=True)
        if current.paused == paused:
            return current
        await store.set_pause(PauseState(True, by, store.now()) if paused else PauseState(False))
        await store.notify(Wakeup(WAKE_PAUSE))
        return await store.pause()

    # -- the fleet (ADR 0012) -----------------------------------------------------------------------------

    @staticmethod
    async def renew_lease(
        store: Store, host_id: str, boot_id: str, lease_s: float, lead: bool, succeeds: str | None = None
    ) -> Lease:
        # One step for the host row and the lead, under the leases' lock: two hosts asking at once take turns and
        # never both lead (INV-ONE-LEADER). ``succeeds``: a boot of this host proved gone (its data dir's lock): its
        # lead passes at once, as if its lease had expired; any other holder's only once its lease has.
        await store.lock_leases()
        now = await store.lease_now()  # INV-LEASE-ON-REGISTRY-CLOCK: read once the lock is held
        expires = now + timedelta(seconds=lease_s)
        if await store.fenced(host_id, boot_id):
            raise HostForgotten(host_id, boot_id)  # INV-FORGET-IS-FENCED: never a lease again
        before = await _host(store, host_id, now)
        replaced = before if before is not None and before.boot_id != boot_id else None
        new = before is None or replaced is not None
        started = now if new or before is None else before.started_at
        await store.put_host(Host(host_id, boot_id, started, now, expires, as_of=now), new=new)
        current = await store.leader(now)
        if current is not None and (current.host_id, current.boot_id) == (host_id, boot_id):
            await store.put_leader(replace(current, last_seen_at=now, lease_expires_at=expires) if lead else None)
        elif lead and (
            current is None or not current.live or (current.host_id, current.boot_id) == (host_id, succeeds)
        ):
            # One row, replaced only once its holder's lease has expired or its holder is proved gone (this host's own
            # previous boot, by its data dir's lock): two hosts never both lead.
            await store.put_leader(Host(host_id, boot_id, now, now, expires, as_of=now))
        host = await _host(store, host_id, now)
        assert host is not None
        return Lease(host, await store.leader(now), replaced)

    @staticmethod
    async def release_lease(store: Store, host_id: str, boot_id: str) -> None:
        now = await store.lease_now()
        host = await _host(store, host_id, now)
        if host is not None and host.boot_id == boot_id:
            await store.put_host(replace(host, lease_expires_at=now), new=False)
        await store.put_leader(None, only=(host_id, boot_id))

    @staticmethod
    async def forget_host(store: Store, host_id: str) -> Host | None:
        await store.lock_leases()  # INV-FORGET-IS-FENCED: no renewal lands between the check and the fence
        now = await store.lease_now()  # INV-LEASE-ON-REGISTRY-CLOCK
        host = await _host(store, host_id, now)
        if host is not None and host.live:
            raise Conflict(
                f"host {host_id} holds a live lease until {to_iso(host.lease_expires_at)}: its jobs may be running; "
                "stop its supervisor first"
            )
        if host is not None:
            await store.fence(host, now)
        await store.drop_host(host_id)
        # Its running rows are ended by the caller (ADR 0012): their slots are free for any host.
        await store.notify(Wakeup(WAKE_FREED, host_id=host_id))
        return host

    @staticmethod
    async def record_setting(store: Store, name: str, value: str, host_id: str, replace: bool) -> FleetSetting:
        current = await store.setting(name)
        if replace or current is None:
            current = FleetSetting(name, value, host_id, store.now())
            await store.put_setting(current)
        return current

    # -- retention and the outbox -------------------------------------------------------------------------

    @staticmethod
    async def prune_jobs(
        store: Store, ended_before: datetime | None, keep_latest: int | None, limit: int, *, remove: bool
    ) -> list[PrunedJob]:
        """The finished rows a prune takes (``Registry.prune_jobs``): each that ended before ``ended_before``, and
        each older than the newest ``keep_latest`` finished ones; never one with an event still in the outbox."""
        check_prune(keep_latest, limit)
        edge = await store.finished_edge(keep_latest) if keep_latest is not None else None
        if ended_before is None and edge is None:
            return []
        # Locked when removed: two supervisors pruning at once take different rows (where the backend locks rows).
        gone = await store.prunable(ended_before, edge, limit, lock=remove)
        if remove and gone:
            # A row whose event was written since it was chosen is kept (its event's row stays whole).
            deleted = await store.delete_finished([job.job_id for job in gone])
            gone = [job for job in gone if job.job_id in deleted]
        return gone

    @staticmethod
    async def expire_keys(store: Store, limit: int) -> int:
        """Remove up to ``limit`` expired idempotency keys' rows (the jobs they answered may be pruned after)."""
        return await store.drop_expired_keys(store.now(), limit)

    @staticmethod
    async def outbox_over(store: Store, max_events: int, max_age_s: float) -> bool:
        """Whether ``outbox_prune`` would drop anything (so that a prune with nothing to do writes nothing)."""
        count, oldest = await store.outbox_stats()
        return count > max_events or (oldest is not None and oldest < store.now() - timedelta(seconds=max_age_s))

    @staticmethod
    async def outbox_prune(store: Store, max_events: int, max_age_s: float) -> PruneResult:
        return await store.outbox_drop(store.now() - timedelta(seconds=max_age_s), max_events)


# -- idempotency keys (ADR 0016) -------------------------------------------------------------------------


async def replay(store: Store, key: IdempotencyKey) -> list[EnqueueResult] | None:
    """What ``key`` answered while it is live (None: it answered nothing yet), the rows as they are now; another
    request under it is ``IdempotencyKeyReused``. Under the key's lock, held to the end of the transaction: a
    retry that arrives while the first request is in its transaction waits for it, then replays it."""
    await store.lock_key(key.key)
    found = await store.receipts(key.key, store.now())
    if found is None:
        return None
    fingerprint, receipts = found
    if fingerprint != key.fingerprint:
        raise IdempotencyKeyReused(key.key)
    rows = {job.job_id: job for job in await store.jobs([r.job_id for r in receipts])}
    return [EnqueueResult(rows[r.job_id], r.coalesced, replayed=r) for r in receipts]


async def keep(store: Store, key: IdempotencyKey | None, results: Sequence[EnqueueResult]) -> None:
    """Record what ``key``'s request answered, in the transaction that made it (a rollback leaves the key free)."""
    if key is not None:
        now = store.now()
        receipts = [result.receipt for result in results]
        await store.put_receipts(key.key, key.fingerprint, receipts, now, now + timedelta(seconds=key.ttl_s))


async def _host(store: Store, host_id: str, now: datetime) -> Host | None:
    """Host ``host_id`` as of ``now`` (a fleet has a few hosts: all are read)."""
    return next((host for host in await store.hosts(now) if host.host_id == host_id), None)
