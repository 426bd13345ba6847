"""``MemoryRegistry``: the SQLite registry over an in-memory database, for fast tests of the core and the scenario kit
(the fake beside the real thing, never instead of it: the very rules, store and SQL the SQLite registry runs, on the
schema its migrations make, and it passes the same contract suite).

One connection to one ``:memory:`` database per registry (shared by the boots that ``reopened`` opens on it, as a
restarted process opens the same file); its schema is the SQLite migrations' (``sqlite.migrate``), applied once per
process and copied into each new database (SQLite's backup: a tenth of a millisecond, against the migrations' eight).

Each step runs inline, on the calling task's thread (``_registry.run_now``), in a transaction of its own: one that
raises is rolled back and leaves nothing (a step whose writes each stand alone, ``_registry.Independent``, a beat's,
needs none, as the SQLite group commit gives it no savepoint). That is no blocking call on the event loop: a blocking
call is one that waits (for a disk, a socket, another process's lock), and an in-memory database does no I/O and,
with one connection used by one step at a time, never waits for a lock. A step is CPU work bounded by its rows, as
the match over dicts it replaced was, and a worker thread would only add a hop. Never suspending within a step, it is
atomic on the loop: no other task sees it half done. Its clock is the given one (the scenario kit's virtual clock:
virtual time works unchanged). Nothing survives the process. A write passes four modules, as on a file: ``_registry``,
this one, the rule's and ``_sql`` (whose store runs the statement on the connection), then sqlite3.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import datetime
from pathlib import Path

import trio

from ..domain import RegistryError, utc_now
from ._health import RegistryFault
from ._registry import Independent, Registry, Step, T, run_now
from ._vocabulary import WakeupFeed
from .sqlite import SqliteStore, migrate

WHERE = "memory"


class _Schema:
    """This process's one migrated database, which each new one is copied from (made at the first need)."""

    _made: sqlite3.Connection | None = None
    _guard = threading.Lock()

    @classmethod
    def copied_into(cls, conn: sqlite3.Connection) -> None:
        with cls._guard:
            if cls._made is None:
                made = _connect()
                migrate(made, Path(WHERE))
                cls._made = made
            cls._made.backup(conn)


def _connect() -> sqlite3.Connection:
    # Autocommit (``isolation_level=None``): each step says where its transaction begins and ends. Not bound to its
    # thread: a test may make the registry before the loop that uses it; one step at a time uses it all the same.
    return sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)


class MemoryBackend:
    """Steps run at once on the caller's thread, after one checkpoint, each in its own transaction: see the module
    docstring."""

    where = WHERE

    def __init__(self, *, clock: Callable[[], datetime]) -> None:
        self.clock = clock
        self.conn = _connect()
        _Schema.copied_into(self.conn)
        self.closed = False

    async def write(self, step: Step[T]) -> T:
        await self._enter()
        if isinstance(step, Independent):  # its writes each stand alone (a beat's): nothing to undo, no transaction
            return self._run(step, "write")
        self.conn.execute("BEGIN")
        try:
            result = self._run(step, "write")
        except BaseException:
            if self.conn.in_transaction:  # (an error SQLite rolled back itself left none)
                self.conn.execute("ROLLBACK")  # a step that raises leaves nothing
            raise
        self.conn.execute("COMMIT")
        return result

    async def read(self, step: Step[T]) -> T:
        await self._enter()
        return self._run(step, "read")

    def _run(self, step: Step[T], what: str) -> T:
        try:
            return run_now(step(SqliteStore(self.conn, clock=self.clock)))
        except sqlite3.Error as exc:  # the rules' SQL refused (a bug, not a storage fault: there is no storage)
            raise RegistryError(f"registry {what} failed: {exc}") from exc

    async def _enter(self) -> None:
        await trio.lowlevel.checkpoint()
        if self.closed:
            raise RegistryError("the registry is closed")

    def fault(self) -> RegistryFault | None:
        return None  # memory does not fail to write

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]:
        """Nothing to hear: one process owns this registry, and its own wakes (an enqueue, a job's end) suffice."""
        return nullcontext(None)

    async def aclose(self) -> None:
        self.closed = True
        self.conn.close()


class MemoryRegistry(Registry):
    """The SQLite registry in memory; the constructor takes what ``SqliteRegistry``'s does, but the path."""

    def __init__(
        self, *, boot_id: str | None = None, outbox: bool = True, clock: Callable[[], datetime] = utc_now
    ) -> None:
        super().__init__(MemoryBackend(clock=clock), boot_id=boot_id, outbox=outbox)

    def reopened(self, *, boot_id: str | None) -> MemoryRegistry:
        """The same rows opened by another boot, as a restarted process opens the same file: its changes are that
        boot's (each event names it)."""
        again = MemoryRegistry.__new__(MemoryRegistry)
        Registry.__init__(again, self.backend, boot_id=boot_id, outbox=self.author.outbox)
        return again
