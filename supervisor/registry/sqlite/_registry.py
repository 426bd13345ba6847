"""``SqliteRegistry``: the embedded default registry, the rules over one SQLite file (WAL).

Every call runs its blocking work in a worker thread (``trio.to_thread.run_sync``), never on the event loop, at
most as many at once as the store has connections (a further caller waits on the event loop, not on the pool).
Calls cannot hang forever: SQLite's busy timeout bounds every wait for the cross-process lock, and a call that runs
out raises ``RegistryError``.

The rules' steps run whole in the worker thread (their store answers at once: ``_engine.run_now``). The writes that
come by thousands (an enqueue, a job's start and end, a heartbeat) share their thread hops: the first with no hop in
flight takes one with every write queued so far (``Coalescer``), and the store commits them together (group commit:
one transaction, a savepoint each). A thread hop, not the SQL, was the largest single cost
per job under load. Each caller still gets its own result or error, once the transaction that holds its change has
committed: an acknowledged write is durable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import trio

from ...domain import RegistryError, utc_now
from .._health import RegistryFault, WriteHealth
from .._registry import Independent, Registry, Step, run_now
from .._vocabulary import WakeupFeed
from ._coalesce import Coalescer
from ._file import BUSY_TIMEOUT_MS, DEFAULT_CONNECTIONS, SqliteFile, StandAlone
from ._schema import CONTRACT_LEVEL
from ._store import SqliteStore

T = TypeVar("T")


class SqliteBackend:
    """One SQLite file's transactions, for the rules: see the module docstring."""

    def __init__(
        self,
        path: Path,
        *,
        clock: Callable[[], datetime],
        max_connections: int,
        busy_timeout_ms: int,
    ) -> None:
        self.file = SqliteFile(path, max_connections=max_connections, busy_timeout_ms=busy_timeout_ms)
        self.path = self.file.path
        self.where = str(self.path)
        self.clock = clock
        self._health = WriteHealth(self.where, clock)
        self._limiter = trio.CapacityLimiter(self.file.max_connections)
        self._writes: Coalescer[Callable[[Any], Any], Any] = Coalescer(self._write_group)
        self.closed = False

    def _check_open(self) -> None:
        """A closed registry refuses every call, also one with nothing to do (the pool refuses the others anyway)."""
        if self.closed:
            raise RegistryError(f"registry {self.path} is closed")

    def _store(self, conn: Any) -> SqliteStore:
        return SqliteStore(conn, clock=self.clock)

    async def write(self, step: Step[T]) -> T:
        """One step, in a thread hop and a transaction shared with the steps queued meanwhile (group commit)."""
        self._check_open()

        def change(conn: Any) -> T:
            return run_now(step(self._store(conn)))

        result: T = await self._writes.submit(StandAlone(change) if isinstance(step, Independent) else change)
        return result

    async def _write_group(self, changes: Sequence[Callable[[Any], Any]]) -> list[Any]:
        wrote_before = self.file.commits_that_wrote
        outcomes = await trio.to_thread.run_sync(self.file.write_group, changes, limiter=self._limiter)
        failed = [error for _, error in outcomes if isinstance(error, RegistryError)]
        if failed:
            self._health.failed(failed[0])
        elif self.file.commits_that_wrote != wrote_before:
            # A commit that wrote a row proves the fault over; one that changed nothing (refused on its own merits:
            # not found...) would pass on a full disk too, and flap the fault's one ERROR into many.
            self._health.succeeded()
        return [error if error is not None else result for result, error in outcomes]

    async def read(self, step: Step[T]) -> T:
        """One step in one consistent snapshot, in a worker thread."""
        self._check_open()

        def read() -> T:
            with self.file.read_tx() as conn:
                return run_now(step(self._store(conn)))

        return await trio.to_thread.run_sync(read, limiter=self._limiter)

    def fault(self) -> RegistryFault | None:
        return self._health.fault

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]:
        """Nothing to hear: one process owns this registry, and its own wakes (an enqueue, a job's end) suffice."""
        return nullcontext(None)

    async def aclose(self) -> None:
        self.closed = True
        await trio.to_thread.run_sync(self.file.close)


class SqliteRegistry(Registry):
    """Job rows in one SQLite file; see the module docstring. ``boot_id``, ``outbox``: as ``Registry``'s; ``clock``:
    the wall clock of every timestamp (and of the leases: one machine's file)."""

    contract_level = CONTRACT_LEVEL

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
        self.sqlite = SqliteBackend(path, clock=clock, max_connections=max_connections, busy_timeout_ms=busy_timeout_ms)
        super().__init__(self.sqlite, boot_id=boot_id, outbox=outbox)
        self.file = self.sqlite.file
        self.path = self.sqlite.path

    @classmethod
    async def open(cls, path: Path, **kwargs: Any) -> SqliteRegistry:
        """Open (and migrate) in a worker thread: the blocking part of starting up. It waits up to the busy timeout
        for a lock another process holds; a cancel (a stop asked for meanwhile) does not wait with it: the thread is
        left to finish on its own, and closes what it opened (``_Handoff``)."""
        handoff = _Handoff()

        def open_and_hand_over() -> SqliteRegistry:
            return handoff.deliver(cls(path, **kwargs))

        try:
            return await trio.to_thread.run_sync(open_and_hand_over, abandon_on_cancel=True)
        except trio.Cancelled:
            late = handoff.abandon()
            if late is not None:  # opened just as the cancel came: nobody else will close it
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(late.close)
            raise

    def close(self) -> None:
        """Close from blocking code (a test's teardown, a script)."""
        self.sqlite.closed = True
        self.file.close()


class _Handoff:
    """A registry opened in a thread the caller may abandon: whichever of the two comes second (the thread's
    ``deliver``, the caller's ``abandon``) knows the other came first, so what was opened is closed exactly once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._delivered: SqliteRegistry | None = None

    def deliver(self, registry: SqliteRegistry) -> SqliteRegistry:
        with self._lock:
            if not self._abandoned:
                self._delivered = registry
                return registry
        registry.close()  # nobody is waiting for it any more
        return registry

    def abandon(self) -> SqliteRegistry | None:
        """The caller gives up; what the thread delivered before that (None: nothing yet), for the caller to close."""
        with self._lock:
            self._abandoned = True
            late, self._delivered = self._delivered, None
        return late
