"""The registry's rules, written once: every change a registry makes is decided here, over a ``Store``
(``_tables``: the narrow port -- select, count, insert, put, update, delete, lock, notify -- that each backend is
only the SQL or the dicts of). The ``Rules`` decide: enqueue and coalescing, promotion into free slots under the
fleet-wide and per-host limits, identity records, the end of a job and its resubmission, requeue, cancel, heartbeats
and progress, absence flags, the pause, leases and the lead, forget, retention, the outbox's events.

The rules are coroutines, and a store's methods may suspend (PostgreSQL) or complete at once (SQLite, memory):
``run_now`` drives one to its end without an event loop, which is how the SQLite store runs the rules inside its
group commit, in a worker thread, with no thread hop per statement. (The same rules, one text: procrastinate's
``JobManager`` over its connectors, River's core over its drivers.)
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from ..domain import (
    RELEASE,
    RESUBMITTED,
    SCHEDULE_PREFIX,
    TERMINAL,
    Attempt,
    Conflict,
    HostForgotten,
    HostNotFound,
    IdempotencyKey,
    IdempotencyKeyReused,
    IllegalTransition,
    Job,
    JobNotFound,
    JobStatus,
    RequestError,
    Unauthorized,
    check_transition,
    hash_token,
    to_iso,
)
from . import _tables as tables
from ._tables import JOBS, OUTBOX, QUEUED, Read, Store, Where, stored
from ._vocabulary import (
    BACK_IN_QUEUE,
    PAUSED_BY_OPERATOR,
    SCHEDULE_TICK,
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
    PrunedJob,
    PruneResult,
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

    async def lock(self, name: str, key: str | None = None) -> None:
        """The transaction holds the write lock (SQLite's; a memory step is atomic by itself): a promotion's count
        and flips, a keyed request's check and its insert, a renewal's read and write are one step under it."""

    async def notify(self, wake: Wakeup) -> None:
        """Nobody else hears this registry."""


class FleetRules:
    """The fleet's rules (ADR 0012): leases, the lead, forget, the fleet's settings. Part of ``Rules``."""


    @staticmethod
    async def renew_lease(
        store: Store,
        host_id: str,
        boot_id: str,
        lease_s: float,
        lead: bool,
        succeeds: str | None = None,
        release: tuple[str, int] | None = None,
    ) -> Lease:
        # One step for the host row and the lead, under the leases' lock: two hosts asking at once take turns and
        # never both lead (INV-ONE-LEADER). ``succeeds``: a boot of this host proved gone (its data dir's lock): its
        # lead passes at once, as if its lease had expired; any other holder's only once its lease has.
        await store.lock(tables.LEASES)
        now = await store.lease_now()  # INV-LEASE-ON-REGISTRY-CLOCK: read once the lock is held
        expires = now + timedelta(seconds=lease_s)
        fence = (("host_id", "=", host_id), ("boot_id", "=", boot_id))
        if await store.count(tables.FORGOTTEN, fence):
            raise HostForgotten(host_id, boot_id)  # INV-FORGET-IS-FENCED: never a lease again
        before = await tables.host(store, host_id, now)
        replaced = before if before is not None and before.boot_id != boot_id else None
        started = now if before is None or replaced is not None else before.started_at
        version, level = release if release is not None else (None, None)
        row = Host(host_id, boot_id, started, now, expires, now, release=version, contract_level=level)
        await store.put(tables.HOSTS, tables.host_row(row), ("host_id",))
        # INV-DRAINED-HANDS-OVER: a drained host neither takes nor keeps the lead; another takes it at its renewal.
        drained = host_id in await tables.drained(store)
        lead = lead and not drained
        current = await tables.leader(store, now)
        succeeded = current is not None and (current.host_id, current.boot_id) == (host_id, succeeds)
        if current is not None and (current.host_id, current.boot_id) == (host_id, boot_id):
            await put_leader(store, replace(current, last_seen_at=now, lease_expires_at=expires) if lead else None)
        elif lead and (current is None or not current.live or succeeded):
            # One row, replaced only once its holder's lease has expired or its holder is proved gone (this host's own
            # previous boot, by its data dir's lock): two hosts never both lead.
            await put_leader(store, Host(host_id, boot_id, now, now, expires, as_of=now))
        host = await tables.host(store, host_id, now)
        assert host is not None
        return Lease(host, await tables.leader(store, now), replaced, drained=drained)


    @staticmethod
    async def release_lease(store: Store, host_id: str, boot_id: str) -> None:
        now = await store.lease_now()
        mine = (("host_id", "=", host_id), ("boot_id", "=", boot_id))
        await store.update(tables.HOSTS, mine, {"lease_expires_at": now})
        await store.delete(tables.LEADER, mine)


    @staticmethod
    async def forget_host(store: Store, host_id: str) -> Host | None:
        await store.lock(tables.LEASES)  # INV-FORGET-IS-FENCED: no renewal lands between the check and the fence
        now = await store.lease_now()  # INV-LEASE-ON-REGISTRY-CLOCK
        host = await tables.host(store, host_id, now)
        if host is not None and host.live:
            raise Conflict(
                f"host {host_id} holds a live lease until {to_iso(host.lease_expires_at)}: its jobs may be running; "
                "stop its supervisor first"
            )
        if host is not None:
            fenced = {"host_id": host_id, "boot_id": host.boot_id, "forgotten_at": now}
            await store.put(tables.FORGOTTEN, fenced, ("host_id", "boot_id"))
        for table in (tables.HOSTS, tables.LEADER, tables.DRAINS):
            await store.delete(table, (("host_id", "=", host_id),))
        # Its running rows are ended by the caller (ADR 0012): their slots are free for any host.
        await store.notify(Wakeup(WAKE_FREED, host_id=host_id))
        return host


    @staticmethod
    async def set_drained(store: Store, host_id: str, drained: bool, by: str | None) -> bool:
        """Drain or undrain ``host_id``; whether anything changed. A host never registered (a typo) is refused."""
        # INV-DRAIN-STOPS-PROMOTION: under the promotion's lock, so a promotion of that host's either committed
        # before this step or reads the drain after it: none starts on it once the drain is answered.
        await store.lock(tables.PROMOTION)
        here = (("host_id", "=", host_id),)
        known = await store.count(tables.HOSTS, here)
        is_drained = await store.count(tables.DRAINS, here) > 0
        if not known and not is_drained:
            raise HostNotFound(host_id)
        if drained == is_drained:
            return False
        if drained:
            await store.insert(tables.DRAINS, [{"host_id": host_id, "drained_at": store.now(), "drained_by": by}])
        else:
            await store.delete(tables.DRAINS, here)
            await store.notify(Wakeup(WAKE_QUEUED))  # its drainer (wherever the undrain came through) looks again
        return True

    @staticmethod
    async def record_setting(store: Store, name: str, value: str, host_id: str, replace: bool) -> FleetSetting:
        current = await tables.setting(store, name)
        if replace or current is None:
            current = FleetSetting(name, value, host_id, store.now())
            await put_setting(store, current)
        return current


class Housekeeping:
    """What keeps the registry bounded: retention, expired keys, the outbox's bound. Part of ``Rules``."""

    @staticmethod
    async def drop_settings(store: Store, prefix: str, recorded_before: datetime) -> int:
        # Names from ``prefix`` up to the next prefix (its last character + 1): a range, no pattern match needed.
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        span = (("name", ">=", prefix), ("name", "<", end), ("recorded_at", "<", recorded_before))
        return await store.delete(tables.SETTINGS, span)


    @staticmethod
    async def prune_jobs(
        store: Store, ended_before: datetime | None, keep_latest: int | None, limit: int, *, remove: bool
    ) -> list[PrunedJob]:
        """The finished rows a prune takes (``Registry.prune_jobs``): each that ended before ``ended_before``, and
        each older than the newest ``keep_latest`` finished ones; never one with an event still in the outbox."""
        check_prune(keep_latest, limit)
        edge = await tables.finished_edge(store, keep_latest) if keep_latest is not None else None
        if ended_before is None and edge is None:
            return []
        # Locked when removed: two supervisors pruning at once take different rows (where the backend locks rows).
        gone = await tables.prunable(store, ended_before, edge, limit, lock=remove)
        if remove and gone:
            await store.delete(JOBS, (("job_id", "in", tuple(job.job_id for job in gone)),))
        return gone


    @staticmethod
    async def expire_keys(store: Store, limit: int) -> int:
        """Remove up to ``limit`` expired idempotency keys' rows (the jobs they answered may be pruned after)."""
        expired = await store.select(
            tables.KEYS, (("expires_at", "<=", store.now()),), Read(columns=("idempotency_key",), limit=limit)
        )
        keys = tuple({row["idempotency_key"] for row in expired})
        return await store.delete(tables.KEYS, (("idempotency_key", "in", keys),)) if keys else 0


    @staticmethod
    async def outbox_prune(store: Store, max_events: int, max_age_s: float) -> PruneResult:
        by_age = await store.delete(OUTBOX, (("created_at", "<", store.now() - timedelta(seconds=max_age_s)),))
        excess = await store.count(OUTBOX) - max_events
        by_count = 0
        if excess > 0:  # the oldest go: every event up to the one at ``excess``
            [last] = await store.select(OUTBOX, (), Read(columns=("seq",), order=("seq",), limit=1, offset=excess - 1))
            by_count = await store.delete(OUTBOX, (("seq", "<=", last["seq"]),))
        return PruneResult(by_age, by_count)


class Rules(FleetRules, Housekeeping):
    """The registry's rules over a store: the jobs' here, the fleet's and the housekeeping inherited, so that every
    change the registry makes is a method of this one class. ``boot_id``: who makes the changes (written into each
    event); ``outbox``: write events at all (a supervisor with no webhook turns it off: nothing would send them)."""

    def __init__(self, *, boot_id: str | None, outbox: bool) -> None:
        self.boot_id = boot_id
        self.outbox = outbox

    # -- rows --------------------------------------------------------------------------------------------

    @staticmethod
    async def get(store: Store, job_id: str, *, lock: bool = False) -> Job:
        """A row with its queue position (``JobNotFound``)."""
        job = await tables.job(store, job_id, lock=lock, position=True)
        if job is None:
            raise JobNotFound(job_id)
        return job

    async def event(self, store: Store, job_id: str, event: str, previous: str | None, reason: str | None) -> None:
        """One outbox event, with the row as of the change, in the change's own transaction (the transactional
        outbox: a committed change always has its event, a rolled-back one never)."""
        if self.outbox:
            job = await tables.job(store, job_id)
            assert job is not None
            await self.add_event(store, job.job_id, job.public(), event, previous, reason)

    async def add_event(
        self, store: Store, job_id: str, body: Mapping[str, Any], event: str, previous: str | None, reason: str | None
    ) -> None:
        row = {"event_id": uuid.uuid4().hex, "job_id": job_id, "event": event, "created_at": store.now(),
               "previous_status": previous, "reason": reason, "boot_id": self.boot_id, "job": body}  # fmt: skip
        await store.insert(OUTBOX, [row])

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
        if await update_job(store, job.job_id, {"status": to_status, **fields}, status=job.status) != 1:
            raise IllegalTransition(job.job_id, job.status, to_status)  # read in this transaction: cannot happen
        if reason is None:
            named = "promoted" if to_status is JobStatus.RUNNING else fields.get("error_reason")
            reason = named if isinstance(named, str) else None
        await self.event(store, job.job_id, "job.transition", str(job.status), reason)

    async def authenticated(self, store: Store, job_id: str, token: str, *, lock: bool = False) -> Job:
        job = await tables.job(store, job_id, lock=lock)
        # Constant-time compare of the hashes; a missing hash (a job that does not run, or none) never matches.
        if job is None or job.token_hash is None or not hmac.compare_digest(job.token_hash, hash_token(token)):
            raise Unauthorized("the token is not this job's")
        return job

    # -- enqueue and promotion ---------------------------------------------------------------------------

    async def add(self, store: Store, new: NewJob) -> tuple[str, bool]:
        """Insert a queued row, or find the queued row it coalesces into (ADR-152 §8: only a queued row absorbs an
        identical one); whether it coalesced."""
        if new.coalesce_key is not None:
            # Two enqueues of one key take turns, or both would find no queued row and both insert (PostgreSQL's READ
            # COMMITTED sees no uncommitted insert).
            await store.lock(tables.COALESCE_LOCK, new.coalesce_key)
            where = (("status", "=", QUEUED), ("coalesce_key", "=", new.coalesce_key))
            found = await store.select(JOBS, where, Read(columns=("job_id",), order=("seq",), limit=1))
            if found:
                return found[0]["job_id"], True
        job_id = uuid.uuid4().hex
        row = {**BACK_IN_QUEUE, "job_id": job_id, "kind": new.kind, "params": dict(new.params), "argv": list(new.argv),
               "status": QUEUED, "created_at": store.now(), "coalesce_key": new.coalesce_key, "attempts": 0,
               "token_hash": None, "log_path": None, "max_attempts": new.max_attempts, "next_attempt_at": None,
               "history": (), "retry_of": new.retry_of, "idempotency_key": new.idempotency_key,
               "enqueued_by": new.enqueued_by, "schedule": new.schedule.name if new.schedule else None,
               "schedule_every_s": new.schedule.every_s if new.schedule else None,
               "enqueued_release": RELEASE}  # fmt: skip
        await store.insert(JOBS, [stored(row)])
        await self.event(store, job_id, "job.transition", None, "enqueued")
        return job_id, False

    async def enqueue(self, store: Store, new: NewJob, key: IdempotencyKey | None = None) -> EnqueueResult:
        if new.schedule is not None:
            # INV-EVERY-TICK-COUNTS: every tick the timer made is recorded, whatever it makes below (a job, a skip, a
            # coalesce, a replay of its key): the missed-run judge counts ticks, not jobs.
            tick = FleetSetting(f"{SCHEDULE_TICK}{new.schedule.name}", key.key if key else "", "", store.now())
            await put_setting(store, tick)
        if key is not None:
            replayed = await replay(store, key)
            if replayed is not None:
                return replayed[0]  # INV-KEY-ONCE: a key's request never makes a second row
            new = replace(new, idempotency_key=key.key)
        if new.schedule is not None and new.schedule.if_idle:
            # Ticks of one schedule take turns: two at once would both find it idle, and both enqueue.
            await store.lock(tables.COALESCE_LOCK, f"{SCHEDULE_PREFIX}{new.schedule.name}")
            busy = await tables.schedule_busy(store, new.schedule.name)
            if busy is not None:
                # Skipped, and kept under no key: the same tick asked again is judged again.
                why = f"schedule {new.schedule.name}: job {busy.job_id} is {busy.status}"
                await self.event(store, busy.job_id, "schedule.skipped", str(busy.status), why)
                return EnqueueResult(busy, coalesced=False, skipped=True)
        job_id, coalesced = await self.add(store, new)
        if not coalesced:
            await store.notify(Wakeup(WAKE_QUEUED))
        result = EnqueueResult(await self.get(store, job_id), coalesced=coalesced)
        await keep(store, key, [result])
        return result

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
        rows = {job.job_id: job for job in await tables.jobs(store, [job_id for job_id, _ in added])}
        results = [EnqueueResult(rows[job_id], coalesced) for job_id, coalesced in added]
        await keep(store, key, results)
        return results

    async def promote_rows(self, store: Store, request: PromoteRequest) -> tuple[list[Job], bool]:
        """INV-PROMOTION-NEVER-OVERSHOOTS: the count and the flips in one transaction under the promotion's lock
        (SQLite's write lock; PostgreSQL's advisory lock, then READ COMMITTED counts every promotion committed
        before), so concurrent promotions in any process take turns. Each row gets this boot's id and
        ``started_at`` in the same step (INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING). The rows promoted, and whether a slot
        it could have filled is left free (too few rows ready)."""
        await store.lock(tables.PROMOTION)
        if request.host_id is not None and await store.count(tables.DRAINS, (("host_id", "=", request.host_id),)):
            return [], False  # INV-DRAIN-STOPS-PROMOTION: a drained host starts nothing new
        running = await store.select(JOBS, (("status", "=", tables.RUNNING),), Read(columns=("host_id", "kind")))
        hosts = [row["host_id"] for row in running]
        free = request.free_slots(len(hosts), hosts.count(request.host_id))
        if free <= 0:
            return [], False
        now = store.now()
        promoted: list[Job] = []
        # FIFO among the rows whose backoff has passed (a resubmitted row keeps its place: its insertion order), but
        # the rows of a kind at its max_running, counted here from the running rows (INV-KIND-LIMIT-IS-A-COUNT).
        chosen = await self._fill(store, now, free, request.kind_limits, [row["kind"] for row in running])
        for job, token_hash in zip(chosen, request.token_hashes, strict=False):
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
        return promoted, len(promoted) < free

    @staticmethod
    async def _fill(
        store: Store, now: datetime, free: int, limits: Mapping[str, int], running_kinds: Sequence[str]
    ) -> list[Job]:
        """Up to ``free`` of the oldest ready rows whose kind has room. A kind that fills up within a batch is left
        out of the next read, so a full kind never holds up the rows of other kinds, and nothing past them is read."""
        room = {kind: limit - running_kinds.count(kind) for kind, limit in limits.items()}
        chosen: list[Job] = []
        after: int | None = None
        while len(chosen) < free:
            full = tuple(sorted(kind for kind, left in room.items() if left <= 0))
            batch = await tables.promotable(store, now, free - len(chosen), lock=True, skip_kinds=full, after=after)
            if not batch:
                break
            for job in batch:
                left = room.get(job.kind)
                if left is not None:
                    if left <= 0:
                        continue  # its kind filled up within this batch
                    room[job.kind] = left - 1
                chosen.append(job)
            after = batch[-1].seq
        return chosen

    async def promote(self, store: Store, request: PromoteRequest) -> Promotion:
        if (await tables.pause(store)).paused:
            return Promotion(paused=True)
        jobs, slot_left = await self.promote_rows(store, request)
        # The backoff scan reads every queued row: only a promotion that left a slot it could fill needs to say when
        # a waiting row may take it. One that filled them all leaves that to the round the next end wakes.
        next_at = await tables.next_backoff_end(store, store.now()) if slot_left else None
        return Promotion(tuple(jobs), next_at=next_at)

    async def record_identities(self, store: Store, claims: Sequence[IdentityClaim]) -> list[Job]:
        out = []
        for claim in claims:
            await update_job(store, claim.job_id, {"identity": claim.identity}, status=JobStatus.RUNNING)
            out.append(await self.get(store, claim.job_id))
        return out

    # -- ends --------------------------------------------------------------------------------------------

    async def finalize(self, store: Store, job_id: str, ending: Ending, expect: Expect | None) -> Change:
        job = await self.get(store, job_id, lock=True)
        if job.status.is_terminal:
            return Change(job, changed=False)
        if expect is not None and job.identity != expect.identity:
            return Change(job, changed=False)  # the evidence was about another process than the row records now
        if expect is not None and expect.host_silent and job.host_id is not None:
            await store.lock(tables.LEASES)  # no renewal commits between this check and the end
            host = await tables.host(store, job.host_id, await store.lease_now())
            if host is not None and host.live:
                return Change(job, changed=False)  # INV-SILENT-HOST-ENDS-BY-PROOF: it is back, its rows its own
        # INV-STOP-REASON-BEFORE-SIGNAL: a stop the supervisor began is on the row; it ends as planned, whoever ends it.
        ending = ending.for_stop(job.stop_reason)
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
            follow_up = await self.enqueue(store, ending.then, ending.then_key)
        return Change(after, changed=True, previous=job.status, follow_up=follow_up)

    async def requeue(self, store: Store, job_id: str, expect: Expect, reason: str) -> Change:
        job = await self.get(store, job_id, lock=True)
        if job.status is not JobStatus.RUNNING or job.identity != expect.identity:
            return Change(job, changed=False)
        # Its start never happened: it does not count, and it keeps its place (the head of the queue: every row
        # still queued was enqueued after it, or it would have been promoted first).
        attempts = max(0, job.attempts - 1)
        if job.cancel_requested:
            # A cancel asked while its start was under way is carried out here, as for a queued row: a requeue never
            # drops an operator's cancel, whoever held the start in memory (the start never happened: nothing runs).
            ended = {"error_reason": "cancelled_before_start" if attempts == 0 else "cancelled",
                     "ended_at": store.now(), "attempts": attempts}  # fmt: skip
            await self.set_status(store, job, JobStatus.CANCELLED, ended)
            return Change(await self.get(store, job_id), changed=True, previous=job.status)
        fields = {**BACK_IN_QUEUE, "attempts": attempts}
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
            await update_job(store, job_id, {"cancel_requested": True, "cancelled_by": by})
            # The host that runs it carries it out now (woken), or at its next sweep (INV-OWNER-JUDGES).
            await store.notify(Wakeup(WAKE_CANCEL, job_id=job_id, host_id=job.host_id))
            return Change(await self.get(store, job_id), changed=True)
        return Change(job, changed=False)

    async def request_stop(self, store: Store, job_id: str, why: str, expect: Expect) -> Change:
        job = await self.get(store, job_id, lock=True)
        if job.status is not JobStatus.RUNNING or job.identity != expect.identity:
            return Change(job, changed=False)
        if job.stop_reason is not None:
            return Change(job, changed=False)  # the first stop's reason stands
        await update_job(store, job_id, {"stop_reason": why}, status=JobStatus.RUNNING)
        return Change(replace(job, stop_reason=why), changed=True)

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
            await update_job(store, beat.job_id, fields)
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
        await update_job(store, job_id, fields, status=JobStatus.RUNNING)
        for event, reason in events:
            await self.event(store, job_id, event, str(job.status), reason)
        return Change(replace(job, **fields), changed=True)  # type: ignore[arg-type]

    async def record_event(self, store: Store, job_id: str, event: str, reason: str | None) -> Job:
        job = await self.get(store, job_id, lock=True)
        if not job.status.is_terminal:
            # A finished row's last event is its end: nothing said about its process (an adoption) comes after it.
            await self.event(store, job_id, event, str(job.status), reason)
        return job

    async def queue_event(
        self, store: Store, event: str, job_id: str, details: Mapping[str, Any], reason: str, announced: FleetSetting
    ) -> None:
        """The queue's watch says a stuck queue began or ended (docs/operations.md § The queue's watch): its event into
        the outbox, and what was announced recorded (``announced``: a boot after a restart does not say a condition that
        still holds twice), in one step."""
        if self.outbox:
            await self.add_event(store, job_id, details, event, None, reason)
        await put_setting(store, announced)

    # -- the pause ----------------------------------------------------------------------------------------


    @staticmethod
    async def set_paused(store: Store, paused: bool, by: str) -> PauseState:
        current = await tables.pause(store, lock=True)
        # The operator's pause outranks a file's: paused already by a file, an operator's pause takes it over (since
        # when kept), so that only a resume ends it, never the file's removal (docs/operations.md, "Pausing").
        takes_over = paused and current.paused and by == PAUSED_BY_OPERATOR and current.by != PAUSED_BY_OPERATOR
        if current.paused == paused and not takes_over:
            return current
        if takes_over:
            state = PauseState(True, by, current.since)
        else:
            state = PauseState(True, by, store.now()) if paused else PauseState(False)
        await store.update(tables.QUEUE, (), {"paused": state.paused, "paused_by": state.by, "paused_at": state.since})
        await store.notify(Wakeup(WAKE_PAUSE))
        return state


# -- idempotency keys (ADR 0016) -------------------------------------------------------------------------


async def replay(store: Store, key: IdempotencyKey) -> list[EnqueueResult] | None:
    """What ``key`` answered while it is live (None: it answered nothing yet), the rows as they are now; another
    request under it is ``IdempotencyKeyReused``. Under the key's lock, held to the end of the transaction: a
    retry that arrives while the first request is in its transaction waits for it, then replays it."""
    # Two requests of one key, on any host, take turns: the second reads what the first committed and replays it.
    await store.lock(tables.KEY_LOCK, key.key)
    return await answer_of(store, key)


async def answer_of(store: Store, key: IdempotencyKey) -> list[EnqueueResult] | None:
    """``replay``'s read, without the key's lock (a read: a request of the key still in its transaction is not
    seen; its own ``replay`` waits for it)."""
    found = await tables.receipts(store, key.key, store.now())
    if found is None:
        return None
    fingerprint, receipts = found
    if fingerprint != key.fingerprint:
        raise IdempotencyKeyReused(key.key)
    rows = {job.job_id: job for job in await tables.jobs(store, [r.job_id for r in receipts])}
    return [EnqueueResult(rows[r.job_id], r.coalesced, replayed=r) for r in receipts]


async def keep(store: Store, key: IdempotencyKey | None, results: Sequence[EnqueueResult]) -> None:
    """Record what ``key``'s request answered, in the transaction that made it (a rollback leaves the key free)."""
    if key is not None:
        now = store.now()
        receipts = [result.receipt for result in results]
        expires_at = now + timedelta(seconds=key.ttl_s)
        await store.delete(tables.KEYS, (("idempotency_key", "=", key.key),))  # only expired rows can be left
        await store.insert(tables.KEYS, [
            {"idempotency_key": key.key, "answer_index": i, "fingerprint": key.fingerprint, "job_id": r.job_id,
             "status": r.status.value, "queue_position": r.queue_position, "coalesced": r.coalesced,
             "created_at": now, "expires_at": expires_at}
            for i, r in enumerate(receipts)
        ])  # fmt: skip


async def update_job(
    store: Store, job_id: str, fields: Mapping[str, object], *, status: JobStatus | None = None
) -> int:
    """Change ``fields`` of a row (``status``: only while it has that status); how many rows changed."""
    where: Where = (("job_id", "=", job_id),) + ((("status", "=", status.value),) if status is not None else ())
    return await store.update(JOBS, where, stored(fields))


async def put_setting(store: Store, setting: FleetSetting) -> None:
    await store.put(tables.SETTINGS, asdict(setting), ("name",))  # a setting's fields are its row's columns


async def put_leader(store: Store, host: Host | None) -> None:
    """The lead to ``host`` (None: to nobody)."""
    if host is None:
        await store.delete(tables.LEADER, ())
        return
    row = {**tables.host_row(host), "one": 1}
    row["since"] = row.pop("started_at")
    del row["release_version"], row["contract_level"]  # the hosts row keeps them
    await store.put(tables.LEADER, row, ("one",))
