"""``Registry``: the single source of truth for every job row, the one interface the core speaks to.

It is the registry's rules (``_engine.Rules``) over a ``Backend``: where the rows are kept and how a transaction is made
there. Every method is one of two shapes: a change (or a check that decides, a token's) is a ``Rules`` method in a
write, and a plain read is a function of ``_tables`` in a read -- so "where is this decided?" has one answer. SQLite
(``sqlite``, the embedded default), PostgreSQL (``postgres``, a fleet's) and a process's memory (``memory``, for fast
tests) are backends; each of ``SqliteRegistry``, ``PostgresRegistry`` and ``MemoryRegistry`` is this class over its own.
One contract suite (``tests/registry/``) runs over every one of them.

The rules every backend keeps, because they are written once (named in the decision records; the suite tests each):

- INV-PROMOTION-NEVER-OVERSHOOTS: a promotion counts the RUNNING rows and flips queued rows to RUNNING in one atomic
  step: concurrent promotions, in any process, never make more rows RUNNING than ``max_concurrent``.
- One place changes a status (``TRANSITIONS``); a terminal row never changes again, and a change that finds the row
  already terminal reports ``changed=False``.
- FIFO: the oldest queued row (by insertion) is promoted first; only a *queued* row absorbs an identical one.
- Each change's events are written with the change, atomically (the transactional outbox).
- A job's token is checked against the hash the row holds while the job runs; a terminal row holds none.
- An acknowledged write is durable when its call returns; every call is bounded (``RegistryError``, never a hang).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from ..domain import FIRST_PAGE, RELEASE, IdempotencyKey, Job, JobFilter, PageRequest, RequestError
from . import _tables as tables
from ._engine import Independent, Rules, Step, answer_of
from ._health import RegistryFault
from ._tables import OUTBOX, Store
from ._vocabulary import (
    QUEUE_ANNOUNCED,
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
    PauseState,
    PromoteRequest,
    Promotion,
    PrunedJob,
    PruneResult,
    WakeupFeed,
)

T = TypeVar("T")


class Backend(Protocol):
    """Where the rows are kept: each step (the rules, or a read) runs in one transaction of its own there."""

    where: str

    async def write(self, step: Step[T]) -> T:
        """``step`` in one write transaction, committed (durably) before this returns; a step that raises is
        rolled back."""
        ...

    async def read(self, step: Step[T]) -> T:
        """``step`` in one consistent snapshot."""
        ...

    def fault(self) -> RegistryFault | None: ...

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]: ...

    async def aclose(self) -> None: ...


class Registry:
    """The registry's rules over ``backend``. ``boot_id``: the boot whose changes these are (written into each event;
    None for a process that is no supervisor); ``outbox``: write events with the changes (a supervisor with no
    webhook turns it off). Every method may raise ``RegistryError`` (storage unavailable, lock not in time)."""

    # What this release honours of the schema (how many contract migrations it knows: each backend's own count),
    # recorded with each host's lease (INV-CONTRACT-AFTER-FLEET).
    contract_level = 0

    def __init__(self, backend: Backend, *, boot_id: str | None = None, outbox: bool = True) -> None:
        self.backend = backend
        self.rules = Rules(boot_id=boot_id, outbox=outbox)

    @property
    def where(self) -> str:
        return self.backend.where

    # -- enqueue and promotion (claim before run) ----------------------------------------------------------

    async def enqueue(self, job: NewJob, *, key: IdempotencyKey | None = None) -> EnqueueResult:
        """Add a queued row (or, with a coalescing key, return the identical queued one): ``EnqueueResult.job`` is
        the row as enqueued (queued, with its position). Promotion is a step of its own (``promote``: the drainer's
        alone). With ``key``: a key that already answered this request answers it again (``EnqueueResult.replayed``)
        and nothing is written; one that answered another request raises ``IdempotencyKeyReused``; else the answer
        is kept under the key, in the same step."""
        return await self.backend.write(lambda store: self.rules.enqueue(store, job, key))

    async def answer_of(self, key: IdempotencyKey) -> list[EnqueueResult] | None:
        """What ``key`` answered while it is live, the rows as they are now (``EnqueueResult.replayed``); None: it
        answered nothing yet. Another request under it is ``IdempotencyKeyReused``. Read only: a caller that checks
        anything before its keyed write asks this first, so a repeat answers as the first time (INV-KEY-ONCE)."""
        return await self.backend.read(lambda store: answer_of(store, key))

    async def enqueue_many(self, jobs: Sequence[NewJob], *, key: IdempotencyKey | None = None) -> list[EnqueueResult]:
        """Add several rows at once, all or nothing, in order (answers carry no queue position); ``key`` covers the
        batch, as ``enqueue``'s covers one job."""
        return await self.backend.write(lambda store: self.rules.enqueue_many(store, jobs, key))

    async def expire_keys(self, *, limit: int = 1000) -> int:
        """Remove up to ``limit`` rows of expired idempotency keys (the retention sweep's); how many went."""
        return await self.backend.write(lambda store: self.rules.expire_keys(store, limit))

    async def promote(self, request: PromoteRequest) -> Promotion:
        """Flip the oldest queued rows whose backoff has passed to RUNNING, as many as slots are free
        (INV-PROMOTION-NEVER-OVERSHOOTS), each with this boot's id, ``started_at``, a token hash, ``attempts + 1`` and
        its log path; none while paused. ``Promotion.next_at``: when a row still waiting out its backoff may run, if
        this promotion left a slot free that it could have filled (None when it filled every one)."""
        return await self.backend.write(lambda store: self.rules.promote(store, request))

    async def record_identities(self, claims: Sequence[IdentityClaim]) -> list[Job]:
        """Record started jobs' identities (a row no longer RUNNING is left alone); the rows after it, in order."""
        return await self.backend.write(lambda store: self.rules.record_identities(store, claims))

    # -- ends --------------------------------------------------------------------------------------------

    async def finalize(self, job_id: str, ending: Ending, *, expect: Expect | None = None) -> Change:
        """End a RUNNING row as ``ending`` says (a terminal row is left alone: ``changed=False``; so is a row whose
        identity is not ``expect``'s, and, with ``expect.host_silent``, a row whose host's lease is live at the
        registry's clock). Ending a queued row raises ``IllegalTransition``."""
        return await self.backend.write(lambda store: self.rules.finalize(store, job_id, ending, expect))

    async def requeue(self, job_id: str, *, expect: Expect, reason: str) -> Change:
        """A RUNNING row whose start provably never happened goes back to the head of the queue: ``queued`` again
        with its job id and its place, the start not counted in ``attempts``. Only if the row still records
        ``expect``'s identity (changed=False otherwise, or when it is not running). A row whose cancel was requested
        ends ``cancelled`` instead (``cancelled_before_start`` if it never ran), the start still not counted."""
        return await self.backend.write(lambda store: self.rules.requeue(store, job_id, expect, reason))

    async def request_cancel(self, job_id: str, by: str | None = None) -> Change:
        """A queued row ends ``cancelled/cancelled_before_start`` at once; a running row is marked
        ``cancel_requested`` (its process is stopped by whoever watches it); a terminal row is left alone. ``by``:
        who asked (``cancelled_by``, kept from the first request that changed the row)."""
        return await self.backend.write(lambda store: self.rules.request_cancel(store, job_id, by))

    async def request_stop(self, job_id: str, why: str, *, expect: Expect) -> Change:
        """Record on a RUNNING row that the supervisor begins to stop it, and ``why`` (``Job.stop_reason``): from then
        on ``finalize`` ends it as ``Ending.if_stopped[why]`` says, whichever boot records its end. Only if the row
        still records ``expect``'s identity; a row that records a stop already keeps its first reason. The row after
        it (``changed=False`` when nothing was written: the caller reads the row to see whether a stop is on it)."""
        return await self.backend.write(lambda store: self.rules.request_stop(store, job_id, why, expect))

    # -- what a running job says, and what the sweeper judges -----------------------------------------------

    async def record_heartbeats(self, beats: Sequence[Beat]) -> list[Job | RequestError]:
        """Record beats (per beat: the row after it, or the ``Unauthorized``/``Conflict`` it earned; a refused beat
        writes nothing; a row holds a token hash only while it runs, so a beat for a row that does not run earns
        ``Unauthorized``, as one for an unknown job). ``completed_units`` is a watermark (INV-PROGRESS-NOT-LIVENESS):
        every beat moves ``last_heartbeat_at``, only a higher count moves ``last_progress_at``."""
        return await self.backend.write(Independent(lambda store: self.rules.record_heartbeats(store, beats)))

    async def check_job_token(self, job_id: str, token: str) -> None:
        """Raise ``Unauthorized`` unless ``token`` is the running job's own (a missing job looks the same)."""
        await self.backend.read(lambda store: self.rules.authenticated(store, job_id, token))

    async def set_absence(
        self, job_id: str, *, stalled: bool, silent: bool, events: Sequence[tuple[str, str]] = ()
    ) -> Change:
        """Record the sweeper's absence flags on a RUNNING row with ``events`` ((name, reason) pairs);
        ``stalled_since`` is set when ``stalled`` turns on. A judgement that changes nothing writes nothing."""
        return await self.backend.write(lambda store: self.rules.set_absence(store, job_id, stalled, silent, events))

    async def record_event(self, job_id: str, event: str, reason: str | None) -> Job:
        """Write an event about a change the row does not show (this boot adopted the job); none for a finished row
        (its end is its last event). The row as it is."""
        return await self.backend.write(lambda store: self.rules.record_event(store, job_id, event, reason))

    async def record_queue_event(
        self,
        event: str,
        *,
        host_id: str,
        job_id: str,
        details: Mapping[str, Any],
        reason: str,
        announced: str,
        setting: str | None = None,
    ) -> None:
        """The queue's watch (docs/operations.md § The queue's watch): ``event`` (``queue.stuck``, ``queue.moving``)
        about this host's queue, its ``details`` the body receivers get, into the outbox (when events are written), and
        ``announced`` recorded as this host's announced state (``queue_stuck/<host>``: the stuck queue announced, empty
        once it moved), in one step. ``setting``: where else the announcement is recorded (a missed schedule's
        ``schedule_missed/<name>``)."""
        name = setting if setting is not None else f"{QUEUE_ANNOUNCED}{host_id}"
        await self.backend.write(
            lambda store: self.rules.queue_event(
                store, event, job_id, details, reason, FleetSetting(name, announced, host_id, store.now())
            )
        )

    async def setting(self, name: str) -> FleetSetting | None:
        """The recorded value of ``name`` (None: none), read only."""
        return await self.backend.read(lambda store: tables.setting(store, name))

    # -- the outbox ---------------------------------------------------------------------------------------

    async def outbox_pending(self, limit: int) -> list[OutboxEvent]:
        """The oldest undelivered events, in the order they were written (``limit``: at least 1)."""
        return await self.backend.read(lambda store: tables.outbox_pending(store, limit))

    async def outbox_delete(self, seqs: Sequence[int]) -> None:
        """Forget delivered events."""
        if seqs:
            await self.backend.write(lambda store: store.delete(OUTBOX, (("seq", "in", tuple(seqs)),)))
        else:
            await self.outbox_depth()  # a closed registry still refuses

    async def outbox_depth(self) -> int:
        return await self.backend.read(lambda store: store.count(OUTBOX))

    async def outbox_prune(self, *, max_events: int, max_age_s: float) -> PruneResult:
        """Drop events older than ``max_age_s`` (one exactly that old is kept) and, past ``max_events``, the oldest
        (both limits at least 0)."""
        # Read first: a prune with nothing to drop takes no write lock.
        if not await self.backend.read(lambda store: tables.outbox_over(store, max_events, max_age_s)):
            return PruneResult(0, 0)
        return await self.backend.write(lambda store: self.rules.outbox_prune(store, max_events, max_age_s))

    # -- the queue's pause ----------------------------------------------------------------------------------

    async def set_paused(self, paused: bool, *, by: str) -> PauseState:
        """Pause or resume promotion (``by``: who asked); the state after it."""
        return await self.backend.write(lambda store: self.rules.set_paused(store, paused, by))

    async def pause_state(self) -> PauseState:
        return await self.backend.read(lambda store: tables.pause(store))

    # -- reads --------------------------------------------------------------------------------------------

    async def get(self, job_id: str) -> Job:
        """One row (``JobNotFound``); a queued row carries its queue position."""
        return await self.backend.read(lambda store: self.rules.get(store, job_id))

    async def running_jobs(self) -> list[Job]:
        """Every RUNNING row, oldest first: O(running rows), whatever the history."""
        return await self.backend.read(tables.running)

    async def list_jobs(self, page: PageRequest = FIRST_PAGE) -> tuple[list[Job], str | None]:
        """A page of rows, newest first, and the cursor of the next (None at the end): rows added meanwhile never
        shift a page."""
        return await self.backend.read(lambda store: tables.list_page(store, page))

    async def oldest_waiting(self, kind_limits: Mapping[str, int] = MappingProxyType({})) -> Job | None:
        """The queued row that runs next (FIFO among those whose backoff has passed and whose kind is below its
        ``kind_limits``), or None: how long the queue has made a job wait (docs/operations.md § The queue's watch).
        Rows of a full kind are not waiting on the queue but on their kind."""
        return await self.backend.read(lambda store: tables.next_to_run(store, store.now(), kind_limits))

    async def newest_of_schedules(self) -> dict[str, tuple[datetime, float, str]]:
        """Each schedule's newest job: its creation, the schedule's period and its id."""
        return await self.backend.read(lambda store: tables.newest_of_schedules(store, 1000))

    async def select_ids(self, wanted: JobFilter, limit: int) -> list[str]:
        """The ids of up to ``limit`` rows under ``wanted``, newest first."""
        return await self.backend.read(lambda store: tables.select_ids(store, wanted, limit))

    async def drop_settings(self, prefix: str, recorded_before: datetime) -> int:
        """Remove the fleet settings named ``prefix...`` recorded before then (an expired bulk selection); how many."""
        return await self.backend.write(lambda store: self.rules.drop_settings(store, prefix, recorded_before))

    async def kind_counts(self) -> dict[str, tuple[int, int]]:
        """Each kind with rows running or queued, fleet-wide: (running, queued)."""
        return await self.backend.read(tables.kind_counts)

    async def counts(self) -> dict[str, int]:
        """Rows per status (every status present)."""
        return await self.backend.read(tables.counts)

    async def retries_of(self, job_id: str) -> list[str]:
        """The ids of the rows enqueued as explicit retries of ``job_id`` (``NewJob.retry_of``), oldest first; empty
        when there is none (an unknown job too: a retry may outlive the row it retried)."""
        return await self.backend.read(lambda store: tables.retries_of(store, job_id))

    # -- retention ----------------------------------------------------------------------------------------

    async def prune_jobs(
        self, *, ended_before: datetime | None, keep_latest: int | None, limit: int, dry_run: bool = False
    ) -> list[PrunedJob]:
        """Remove finished rows, oldest first (by ``ended_at``, then insertion order), at most ``limit`` (at least
        1): each one that ended before ``ended_before``, and each one older than the newest ``keep_latest`` finished
        rows (None: that rule is off; both None: nothing goes). Never a queued or running row, and never a row with
        an event still in the outbox. ``dry_run``: what would go now, nothing removed. The row's files are the
        caller's to remove."""
        # Read first: a prune with nothing to remove (most sweeps) takes no write lock.
        found = await self.backend.read(
            lambda store: self.rules.prune_jobs(store, ended_before, keep_latest, limit, remove=False)
        )
        if dry_run or not found:
            return found
        # Chosen again in the write: a row's events written since the read keep it.
        return await self.backend.write(
            lambda store: self.rules.prune_jobs(store, ended_before, keep_latest, limit, remove=True)
        )

    # -- the fleet (ADR 0012) ---------------------------------------------------------------------------------

    async def renew_lease(
        self, host_id: str, boot_id: str, *, lease_s: float, lead: bool, succeeds: str | None = None
    ) -> Lease:
        """Register or renew host ``host_id`` as run by boot ``boot_id`` until now + ``lease_s`` at the registry's
        clock (a new boot of the same host id replaces the old one's row); with ``lead``, also take the fleet's lead
        when nobody holds it or its holder's lease expired, or keep it when this boot holds it. One atomic step: two
        hosts never both lead. A boot an operator forgot is refused: ``HostForgotten`` (INV-FORGET-IS-FENCED).
        ``succeeds``: a boot of this host id that is proved gone (``core._succession``): its lead is taken at once.
        The row records this code's release and contract level. A drained host neither takes nor keeps the lead
        (``Lease.drained``)."""
        release = (RELEASE, self.contract_level)
        return await self.backend.write(
            lambda store: self.rules.renew_lease(store, host_id, boot_id, lease_s, lead, succeeds, release)
        )

    async def set_drained(self, host_id: str, drained: bool, *, by: str | None = None) -> bool:
        """Drain ``host_id`` (it promotes nothing from this step's commit on, and hands the lead over at its next
        renewal) or undrain it; whether anything changed. ``HostNotFound`` for a host that never registered."""
        return await self.backend.write(lambda store: self.rules.set_drained(store, host_id, drained, by))

    async def drained(self) -> dict[str, datetime]:
        """The drained hosts, and since when."""
        return await self.backend.read(tables.drained)

    async def release_lease(self, host_id: str, boot_id: str) -> None:
        """A clean shutdown: this boot's host lease and lead (if it holds them) end now."""
        await self.backend.write(lambda store: self.rules.release_lease(store, host_id, boot_id))

    async def hosts(self) -> list[Host]:
        """Every registered host, by host id, each with ``as_of`` the registry's clock at this read."""
        return await self.backend.read(lambda store: _at_lease_now(store, tables.hosts))

    async def leader(self) -> Host | None:
        """The host that holds the lead now (its lease may have expired: ``Host.live`` says, as of this read)."""
        return await self.backend.read(lambda store: _at_lease_now(store, tables.leader))

    async def forget_host(self, host_id: str) -> Host | None:
        """The operator says host ``host_id`` will never come back. One atomic step (INV-FORGET-IS-FENCED): refused
        (``Conflict``) while its lease is live at the registry's clock; else its boot is fenced (a renewal by it is
        refused from now on), its row and its lead go. Its running rows are the caller's to end after this step
        (each guarded by its identity). The row removed, or None when there was none (nothing is fenced)."""
        return await self.backend.write(lambda store: self.rules.forget_host(store, host_id))

    async def record_setting(self, name: str, value: str, host_id: str, *, replace: bool) -> FleetSetting:
        """The fleet's value of setting ``name``: the one recorded first (``value``, by ``host_id``, when none was);
        with ``replace``, this one whatever was recorded (a host that starts alone)."""
        return await self.backend.write(lambda store: self.rules.record_setting(store, name, value, host_id, replace))

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]:
        """A session that hears other processes' changes (``Wakeup``), open while the context is: entering connects
        (bounded; ``RegistryUnavailable`` when it cannot), leaving closes. None: this registry has nothing to hear
        (one process owns it: SQLite, memory), its own wakes suffice (INV-NOTIFY-IS-A-HINT)."""
        return self.backend.listen()

    def fault(self) -> RegistryFault | None:
        """Whether writes are failing now (a full disk, a read-only or removed file, a lock held by another process):
        since when, and why. None while writes succeed. Cheap and non-blocking: the health route asks it."""
        return self.backend.fault()

    async def aclose(self) -> None:
        """Release what the registry holds (connections); later calls raise ``RegistryError``."""
        await self.backend.aclose()


async def _at_lease_now(store: Store, read: Callable[[Store, datetime], Awaitable[T]]) -> T:
    """``read(store, now)`` at the registry's lease clock, read first in the same snapshot: each lease judged as of
    the moment the rows are as of (INV-LEASE-ON-REGISTRY-CLOCK)."""
    return await read(store, await store.lease_now())


