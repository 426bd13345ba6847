"""``SqliteRegistry``: the embedded default registry, one SQLite file (WAL), behind the ``Registry`` interface.

Every call runs its blocking work in a worker thread (``trio.to_thread.run_sync``), never on the event loop, at
most as many at once as the store has connections (a further caller waits on the event loop, not on the pool).
Calls cannot hang forever: SQLite's busy timeout bounds every wait for the cross-process lock, and a call that runs
out raises ``RegistryError``.

The writes that come by thousands (an enqueue, a job's start and end, a heartbeat) share their thread hops: the
first with no hop in flight takes one with every write queued so far (``Coalescer``), and the store commits them
together (group commit: one transaction, a savepoint each). A thread hop, not the SQL, was the largest single cost
per job under load. Each caller still gets its own result or error, once the transaction that holds its change has
committed: an acknowledged write is durable.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import trio

from ...domain import Job, RegistryError, RequestError
from ...domain._model import to_iso, utc_now
from .._health import RegistryFault, WriteHealth
from .._protocol import (
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
    check_prune,
)
from . import _reads as reads
from ._coalesce import Coalescer
from ._operations import Operations
from ._store import BUSY_TIMEOUT_MS, DEFAULT_CONNECTIONS, SqliteStore

T = TypeVar("T")


class SqliteRegistry:
    """Job rows in one SQLite file; see the module docstring. ``boot_id``: the boot whose changes these are (written
    into each event; None for a process that is no supervisor). ``outbox``: write events with the changes (a
    supervisor with no webhook turns it off: nothing would send them)."""

    def __init__(
        self,
        path: Path,
        *,
        boot_id: str | None = None,
        outbox: bool = True,
        clock: Callable[[], datetime] = utc_now,
        max_connections: int = DEFAULT_CONNECTIONS,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> None:
        self.store = SqliteStore(path, max_connections=max_connections, busy_timeout_ms=busy_timeout_ms)
        self.path = self.store.path
        self.ops = Operations(clock=clock, boot_id=boot_id, outbox=outbox)
        self._health = WriteHealth(str(self.path), clock)
        self._limiter = trio.CapacityLimiter(self.store.max_connections)
        self._writes: Coalescer[Callable[[Any], Any], Any] = Coalescer(self._write_group)
        self._closed = False

    @classmethod
    async def open(cls, path: Path, **kwargs: Any) -> SqliteRegistry:
        """Open (and migrate) in a worker thread: the blocking part of starting up."""
        return await trio.to_thread.run_sync(functools.partial(cls, path, **kwargs))

    # -- the two ways to the store ----------------------------------------------------------------------

    def _check_open(self) -> None:
        """A closed registry refuses every call, also one with nothing to do (the pool refuses the others anyway)."""
        if self._closed:
            raise RegistryError(f"registry {self.path} is closed")

    async def _run(self, fn: Callable[[], T]) -> T:
        self._check_open()
        return await trio.to_thread.run_sync(fn, limiter=self._limiter)

    async def _write(self, change: Callable[[Any], T]) -> T:
        """One change, in a thread hop and a transaction shared with the changes queued meanwhile."""
        self._check_open()
        result: T = await self._writes.submit(change)
        return result

    async def _write_group(self, changes: Sequence[Callable[[Any], Any]]) -> list[Any]:
        wrote_before = self.store.commits_that_wrote
        outcomes = await trio.to_thread.run_sync(self.store.write_group, changes, limiter=self._limiter)
        failed = [error for _, error in outcomes if isinstance(error, RegistryError)]
        if failed:
            self._health.failed(failed[0])
        elif self.store.commits_that_wrote != wrote_before:
            # A commit that wrote a row proves the fault over; one that changed nothing (refused on its own merits:
            # not found...) would pass on a full disk too, and flap the fault's one ERROR into many.
            self._health.succeeded()
        return [error if error is not None else result for result, error in outcomes]

    def fault(self) -> RegistryFault | None:
        return self._health.fault

    async def _read(self, fn: Callable[[Any], T]) -> T:
        """A read in one consistent snapshot."""

        def read() -> T:
            with self.store.read_tx() as conn:
                return fn(conn)

        return await self._run(read)

    # -- the interface ----------------------------------------------------------------------------------

    async def enqueue(self, job: NewJob, *, promote: PromoteRequest | None = None) -> tuple[EnqueueResult, Promotion]:
        return await self._write(self.ops.enqueue(job, promote))

    async def enqueue_many(self, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
        return await self._write(self.ops.enqueue_many(jobs))

    async def promote(self, request: PromoteRequest) -> Promotion:
        return await self._write(self.ops.promote(request))

    async def record_identities(self, claims: Sequence[IdentityClaim]) -> list[Job]:
        return await self._write(self.ops.record_identities(claims))

    async def finalize(
        self, job_id: str, ending: Ending, *, expect: Expect | None = None, promote: PromoteRequest | None = None
    ) -> tuple[Change, Promotion]:
        return await self._write(self.ops.finalize(job_id, ending, expect, promote))

    async def requeue(self, job_id: str, *, expect: Expect, reason: str) -> Change:
        return await self._write(self.ops.requeue(job_id, expect, reason))

    async def request_cancel(self, job_id: str) -> Change:
        return await self._write(self.ops.request_cancel(job_id))

    async def record_heartbeats(self, beats: Sequence[Beat]) -> list[Job | RequestError]:
        return await self._write(self.ops.record_heartbeats(beats))

    async def check_job_token(self, job_id: str, token: str) -> None:
        await self._read(lambda conn: self.ops.authenticated(conn, job_id, token))

    async def set_absence(
        self, job_id: str, *, stalled: bool, silent: bool, events: Sequence[tuple[str, str]] = ()
    ) -> Change:
        return await self._write(self.ops.set_absence(job_id, stalled, silent, events))

    async def record_event(self, job_id: str, event: str, reason: str | None) -> Job:
        return await self._write(self.ops.record_event(job_id, event, reason))

    async def outbox_pending(self, limit: int) -> list[OutboxEvent]:
        return await self._read(lambda conn: reads.outbox_pending(conn, limit))

    async def outbox_delete(self, seqs: Sequence[int]) -> None:
        self._check_open()
        if seqs:
            await self._write(reads.outbox_delete(seqs))

    async def outbox_depth(self) -> int:
        return await self._read(lambda conn: int(conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]))

    async def outbox_prune(self, *, max_events: int, max_age_s: float) -> PruneResult:
        cutoff = self.ops.prune_cutoff(max_age_s)

        def over(conn: Any) -> bool:
            count, oldest = conn.execute("SELECT COUNT(*), MIN(created_at) FROM outbox").fetchone()
            return bool(count > max_events or (oldest is not None and oldest < cutoff))

        # Read first: a prune with nothing to drop takes no write lock.
        if not await self._read(over):
            return PruneResult(0, 0)
        return await self._write(reads.outbox_prune(cutoff, max_events))

    async def set_paused(self, paused: bool, *, by: str) -> PauseState:
        return await self._write(self.ops.set_paused(paused, by))

    async def pause_state(self) -> PauseState:
        return await self._read(reads.pause_state_in)

    async def get(self, job_id: str) -> Job:
        return await self._read(lambda conn: self.ops.get_in(conn, job_id))

    async def running_jobs(self) -> list[Job]:
        return await self._read(reads.running_in)

    async def list_jobs(
        self, *, status: str | None = None, kind: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[Job], str | None]:
        where, args = reads.list_query(status, kind, limit, cursor)
        return await self._read(lambda conn: reads.list_page(conn, where, args, limit))

    async def counts(self) -> dict[str, int]:
        return await self._read(reads.counts_in)

    async def retries_of(self, job_id: str) -> list[str]:
        return await self._read(lambda conn: reads.retries_of_in(conn, job_id))

    async def prune_jobs(
        self, *, ended_before: datetime | None, keep_latest: int | None, limit: int, dry_run: bool = False
    ) -> list[PrunedJob]:
        check_prune(keep_latest, limit)
        cutoff = to_iso(ended_before) if ended_before is not None else None
        # Read first: a prune with nothing to remove (most sweeps) takes no write lock.
        found = await self._read(lambda conn: reads.prune_candidates(conn, cutoff, keep_latest, limit))
        if dry_run or not found:
            return found
        return await self._write(reads.prune_jobs(cutoff, keep_latest, limit))

    async def renew_lease(self, host_id: str, boot_id: str, *, lease_s: float, lead: bool) -> Lease:
        return await self._write(self.ops.renew_lease(host_id, boot_id, lease_s, lead))

    async def release_lease(self, host_id: str, boot_id: str) -> None:
        await self._write(self.ops.release_lease(host_id, boot_id))

    async def hosts(self) -> list[Host]:
        return await self._read(lambda conn: reads.hosts_in(conn, self.ops.now()))

    async def leader(self) -> Host | None:
        return await self._read(lambda conn: reads.leader_in(conn, self.ops.now()))

    async def record_setting(self, name: str, value: str, host_id: str, *, replace: bool) -> FleetSetting:
        return await self._write(self.ops.record_setting(name, value, host_id, replace))

    async def forget_host(self, host_id: str) -> Host | None:
        return await self._write(self.ops.forget_host(host_id))

    async def aclose(self) -> None:
        self._closed = True
        await trio.to_thread.run_sync(self.store.close)

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]:
        """Nothing to hear: one process owns this registry, and its own wakes (an enqueue, a job's end) suffice."""
        return nullcontext(None)

    def close(self) -> None:
        """Close from blocking code (a test's teardown, a script)."""
        self._closed = True
        self.store.close()
