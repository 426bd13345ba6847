"""``Registry``: the single source of truth for every job row, the one interface the core speaks to.

Each operation is declared here once, as the one rule it runs and the transaction it runs in: ``enqueue =
write_by(_jobs.enqueue)`` says that an enqueue is the rule ``_jobs.enqueue``, in one write transaction of the
registry's backend, its events written by this registry's author; ``get = read(_jobs.get)``, a read in one snapshot.
The rule's docstring is the operation's. The few operations that are more than one step (``prune_jobs``'s read
before its write, ``outbox_prune``'s, ``outbox_delete`` of nothing, ``renew_lease`` with this release) are small
methods. The rules are plain functions over a store (``_tables.Store``), by topic: ``_jobs`` (a job's row: enqueue,
keys, promotion, ends, the sweeper's judgements: every rule that writes a job's event), ``_beats`` (heartbeats, the
job's token), ``_fleet`` (leases, the lead, drains, settings, the pause, forget), ``_upkeep`` (retention, keys, the
outbox), ``_reads`` (the list and the counts).

A ``Backend`` is where the rows are kept and how a transaction is made there: SQLite (``sqlite``, the embedded
default), PostgreSQL (``postgres``, a fleet's) and a process's memory (``memory``, for fast tests); each of
``SqliteRegistry``, ``PostgresRegistry`` and ``MemoryRegistry`` is this class over its own. A write passes four
modules: this one (which rule, which transaction), the backend's (the transaction, and the SQL dialect), the rule's,
and ``_sql`` (the one SQL text of the query description), then the driver (``tests/registry/test_write_path.py``).
One contract suite (``tests/registry/``) runs over every backend.

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

import inspect
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar

from ..domain import RELEASE
from . import _beats, _fleet, _jobs, _reads, _upkeep
from ._health import RegistryFault
from ._tables import Author, Store
from ._vocabulary import Lease, PrunedJob, PruneResult, WakeupFeed

T = TypeVar("T")
P = ParamSpec("P")

Step = Callable[[Store], Coroutine[Any, Any, T]]


def run_now(step: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the rules over a store that answers at once) to its end, here: how the
    SQLite backend runs a rule inside its group commit, in a worker thread, with no thread hop per statement."""
    try:
        step.send(None)
    except StopIteration as done:
        return done.value
    step.close()
    raise RuntimeError("a store that answers at once suspended")


class Independent(Generic[T]):
    """A step whose writes each stand on their own (a heartbeat's one update per beat, after the checks that may
    refuse it): one that fails partway leaves nothing that needs undoing. A store that runs several callers' steps
    in one transaction (SQLite's group commit) can then skip the savepoint it would wrap the step in: two
    statements of a beat's four."""

    def __init__(self, step: Step[T]) -> None:
        self.step = step

    def __call__(self, store: Store) -> Coroutine[Any, Any, T]:
        return self.step(store)


class Backend(Protocol):
    """Where the rows are kept: each step (a rule, or a read) runs in one transaction of its own there."""

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


Operation = Callable[Concatenate["Registry", P], Coroutine[Any, Any, T]]


def write(
    rule: Callable[Concatenate[Store, P], Coroutine[Any, Any, T]], *, independent: bool = False
) -> Operation[P, T]:
    """The operation that runs ``rule`` in one write transaction of the registry's backend (``independent``: a
    step whose writes each stand alone, ``Independent``)."""

    async def operation(self: Registry, /, *args: P.args, **kwargs: P.kwargs) -> T:
        def step(store: Store) -> Coroutine[Any, Any, T]:
            return rule(store, *args, **kwargs)

        return await self.backend.write(Independent(step) if independent else step)

    return _named(operation, rule)


def write_by(rule: Callable[Concatenate[Store, Author, P], Coroutine[Any, Any, T]]) -> Operation[P, T]:
    """The operation that runs ``rule`` in one write transaction, as the registry's author (the boot its events
    name, and whether they are written)."""

    async def operation(self: Registry, /, *args: P.args, **kwargs: P.kwargs) -> T:
        author = self.author

        def step(store: Store) -> Coroutine[Any, Any, T]:
            return rule(store, author, *args, **kwargs)

        return await self.backend.write(step)

    return _named(operation, rule, author=True)


def read(rule: Callable[Concatenate[Store, P], Coroutine[Any, Any, T]]) -> Operation[P, T]:
    """The operation that runs ``rule`` in one consistent snapshot of the registry's backend."""

    async def operation(self: Registry, /, *args: P.args, **kwargs: P.kwargs) -> T:
        def step(store: Store) -> Coroutine[Any, Any, T]:
            return rule(store, *args, **kwargs)

        return await self.backend.read(step)

    return _named(operation, rule)


def _named(operation: Operation[P, T], rule: Callable[..., Any], *, author: bool = False) -> Operation[P, T]:
    """The operation under its rule's name, docstring and signature but the store (and the ``author``), so that
    ``help(Registry.enqueue)`` and ``inspect.signature`` read the operation's own."""
    signature = inspect.signature(rule, eval_str=True)
    params = list(signature.parameters.values())[2 if author else 1 :]
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    operation.__name__ = rule.__name__
    operation.__qualname__ = f"Registry.{rule.__name__}"
    operation.__doc__ = rule.__doc__
    operation.__signature__ = signature.replace(parameters=[this, *params])  # type: ignore[attr-defined]
    operation.__annotations__ = {p.name: p.annotation for p in params} | {"return": signature.return_annotation}
    return operation


class Registry:
    """The registry's rules over ``backend``. ``boot_id``: the boot whose changes these are (written into each event;
    None for a process that is no supervisor); ``outbox``: write events with the changes (a supervisor with no
    webhook turns it off). Every operation may raise ``RegistryError`` (storage unavailable, lock not in time)."""

    # What this release honours of the schema (how many contract migrations it knows: each backend's own count),
    # recorded with each host's lease (INV-CONTRACT-AFTER-FLEET).
    contract_level = 0

    def __init__(self, backend: Backend, *, boot_id: str | None = None, outbox: bool = True) -> None:
        self.backend = backend
        self.author = Author(boot_id, outbox)

    @property
    def where(self) -> str:
        return self.backend.where

    # -- a job's row: enqueue, keys, promotion, its end, the sweeper's judgements (``_jobs``) --------------------------

    enqueue = write_by(_jobs.enqueue)
    enqueue_many = write_by(_jobs.enqueue_many)
    answer_of = read(_jobs.answer_of)
    promote = write_by(_jobs.promote)
    record_identities = write(_jobs.record_identities)
    finalize = write_by(_jobs.finalize)
    requeue = write_by(_jobs.requeue)
    request_cancel = write_by(_jobs.request_cancel)
    request_stop = write(_jobs.request_stop)
    get = read(_jobs.get)
    oldest_waiting = read(_jobs.oldest_waiting)
    set_absence = write_by(_jobs.set_absence)
    record_event = write_by(_jobs.record_event)
    record_queue_event = write_by(_jobs.record_queue_event)

    # -- what a running job says (``_beats``) --------------------------------------------------------------------------

    record_heartbeats = write(_beats.record_heartbeats, independent=True)
    check_job_token = read(_beats.check_job_token)

    # -- reads (``_reads``) --------------------------------------------------------------------------------------------

    running_jobs = read(_reads.running_jobs)
    list_jobs = read(_reads.list_jobs)
    select_ids = read(_reads.select_ids)
    counts = read(_reads.counts)
    kind_counts = read(_reads.kind_counts)
    newest_of_schedules = read(_reads.newest_of_schedules)
    retries_of = read(_reads.retries_of)

    # -- retention, keys, the outbox (``_upkeep``) ---------------------------------------------------------------------

    expire_keys = write(_upkeep.expire_keys)
    outbox_pending = read(_upkeep.outbox_pending)
    outbox_depth = read(_upkeep.outbox_depth)

    async def outbox_delete(self, seqs: Sequence[int]) -> None:
        """Forget delivered events."""
        if seqs:
            await self.backend.write(lambda store: _upkeep.outbox_delete(store, seqs))
        else:
            await self.outbox_depth()  # a closed registry still refuses

    async def outbox_prune(self, *, max_events: int, max_age_s: float) -> PruneResult:
        """Drop events older than ``max_age_s`` (one exactly that old is kept) and, past ``max_events``, the oldest
        (both limits at least 0)."""
        # Read first: a prune with nothing to drop takes no write lock.
        if not await self.backend.read(lambda store: _upkeep.outbox_over(store, max_events, max_age_s)):
            return PruneResult(0, 0)
        return await self.backend.write(lambda store: _upkeep.outbox_prune(store, max_events, max_age_s))

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
            lambda store: _upkeep.prune_jobs(store, ended_before, keep_latest, limit, remove=False)
        )
        if dry_run or not found:
            return found
        # Chosen again in the write: a row's events written since the read keep it.
        return await self.backend.write(
            lambda store: _upkeep.prune_jobs(store, ended_before, keep_latest, limit, remove=True)
        )

    # -- the fleet (ADR 0012; ``_fleet``) ------------------------------------------------------------------------------

    async def renew_lease(
        self, host_id: str, boot_id: str, *, lease_s: float, lead: bool, succeeds: str | None = None
    ) -> Lease:
        """``_fleet.renew_lease``, recording this code's release and contract level with the host's row."""
        release = (RELEASE, self.contract_level)
        return await self.backend.write(
            lambda store: _fleet.renew_lease(
                store, host_id, boot_id, lease_s=lease_s, lead=lead, succeeds=succeeds, release=release
            )
        )

    release_lease = write(_fleet.release_lease)
    set_drained = write(_fleet.set_drained)
    drained = read(_fleet.drained)
    hosts = read(_fleet.hosts)
    leader = read(_fleet.leader)
    forget_host = write(_fleet.forget_host)
    record_setting = write(_fleet.record_setting)
    setting = read(_fleet.setting)
    drop_settings = write(_fleet.drop_settings)
    set_paused = write(_fleet.set_paused)
    pause_state = read(_fleet.pause_state)

    # -- the backend's own ---------------------------------------------------------------------------------------------

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
