"""The SQLite registry's transactions, and its SQL dialect: what runs between a ``Registry`` operation and sqlite3.

- ``SqliteBackend``: each write hops to a worker thread (``trio.to_thread.run_sync``, never blocking the event
  loop), at most as many at once as the file has connections; the writes that come by thousands (an enqueue, a
  job's start and end, a heartbeat) share their hops: the first with no hop in flight takes one with every write
  queued so far (``Coalescer``). A thread hop, not the SQL, was the largest single cost per job under load.
- ``SqliteFile``: one SQLite file's transactions. Every write is one ``BEGIN IMMEDIATE`` transaction, which takes
  SQLite's write lock up front: that lock is the cross-process lock that lets a CLI or a second process enqueue
  safely beside a running supervisor, and the lock under which a promotion counts and flips
  (INV-PROMOTION-NEVER-OVERSHOOTS). The writes of one hop commit together (group commit: one transaction, a
  savepoint each); each caller still gets its own result or error once the transaction that holds its change has
  committed (``synchronous = FULL`` in WAL mode): an acknowledged write is durable. Calls cannot hang forever:
  SQLite's busy timeout bounds every wait for the cross-process lock, and a call that runs out raises
  ``RegistryError``.
- ``SqliteStore``: the store port's one SQL text (``_sql.SqlStore``) on one connection, with SQLite's stored forms:
  timestamps as ISO 8601 text (``to_iso``, fixed width, so that text order is time order), booleans as 0/1, JSON
  as text. Its coroutines never suspend: a rule runs whole in the worker thread (``_registry.run_now``).

The pool and the file's checks at open are ``_file``'s; the schema is ``_schema``'s.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

import trio

from ...domain import RegistryError, RegistryUnavailable, from_iso, to_iso
from .._health import RegistryFault, WriteHealth
from .._registry import Independent, Step, run_now
from .._sql import Reader, SqlStore
from .._tables import BOOLEANS, JOBS, TIMESTAMPS, LocalStore, Read, Where
from .._vocabulary import WakeupFeed
from ._file import (
    BUSY_TIMEOUT_MS,
    DEFAULT_CONNECTIONS,
    ConnectionPool,
    check_existing_file,
    failure,
    file_identity,
    not_a_directory,
    process_writers,
)
from ._schema import migrate

T = TypeVar("T")

# At most this many concurrent changes share one group commit (bounds one transaction's length).
MAX_GROUP = 64

# One change of a group commit: run in the shared transaction on the writer connection.
ConnectionChange = Callable[[sqlite3.Connection], Any]


# -- the file's transactions ---------------------------------------------------------------------------------------


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back, best effort: a connection whose rollback fails stays in a transaction and the pool drops it."""
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


@dataclass(frozen=True)
class StandAlone:
    """A change for the group commit that needs no savepoint of its own: its writes each stand alone, so a failure
    partway leaves nothing to undo (``_registry.Independent``: a heartbeat). Any other change gets one."""

    run: ConnectionChange

    def __call__(self, conn: sqlite3.Connection) -> Any:
        return self.run(conn)


class SqliteFile:
    """One SQLite file (WAL mode): its pool of connections, its schema brought up to date at open, and the
    transactions every operation runs in. Safe to use from many threads and many processes."""

    def __init__(
        self, path: Path, *, max_connections: int = DEFAULT_CONNECTIONS, busy_timeout_ms: int = BUSY_TIMEOUT_MS
    ) -> None:
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RegistryError(
                f"cannot open registry {self.path}: its directory cannot be made ({exc.strerror or exc}: "
                f"{not_a_directory(self.path.parent) or exc.filename}); PODCAST_JOB_DATA_DIR must be a directory "
                "this user can write, or one it can make"
            ) from exc
        check_existing_file(self.path)  # a damaged file is refused untouched, never replaced by an empty one
        if not self.path.exists():
            try:
                sqlite3.connect(self.path).close()  # a first start: the file is made here, and only here
            except sqlite3.Error as exc:
                raise failure(exc, f"cannot open registry {self.path}") from exc
        self._pool = ConnectionPool(self.path, max_connections, busy_timeout_ms)
        # One writer of this process at a time on this file (``_FileWriters``, shared by every handle on it); readers
        # never wait here (WAL).
        self._writes = process_writers(self.path)
        with self._writes.lock, self._pool.borrow() as conn:
            try:
                self.schema_version = migrate(conn, self.path)
            except sqlite3.Error as exc:
                raise failure(exc, f"cannot open registry {self.path}") from exc
        try:
            self._pool.fill()
        except BaseException:
            self._pool.close()  # the connections opened so far are not left to the garbage collector
            raise
        self._file = file_identity(self.path)

    def check_file(self) -> None:
        """Refuse to write when the registry's file is no longer the one opened (removed, or replaced by another):
        SQLite would go on writing into the removed inode, and what it acknowledged would be lost at the next start."""
        if file_identity(self.path) != self._file:
            raise RegistryUnavailable(
                f"registry {self.path} was removed or replaced while the supervisor ran: no write is made into a "
                "file that nobody will read again; put it back, or restart the supervisor (which opens what is there)"
            )

    @property
    def max_connections(self) -> int:
        return self._pool.size

    @property
    def open_connections(self) -> int:
        """Connections open right now (idle or lent): never more than ``max_connections``."""
        return self._pool.open_connections

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction of its own, under this process's write lock (a test's or a script's raw write)."""
        with self._locked(), self.locked_tx() as conn:
            yield conn

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """This process's write lock of the file, bounded by the busy timeout."""
        if not self._writes.lock.acquire(timeout=self.busy_timeout_ms / 1000):
            raise RegistryUnavailable(
                f"registry lock not acquired within {self.busy_timeout_ms} ms (this process's writers)"
            )
        try:
            yield
        finally:
            self._writes.lock.release()

    @contextmanager
    def locked_tx(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on a pooled connection; the caller holds the write lock."""
        self.check_file()
        with self._pool.borrow() as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise failure(exc, "registry lock not acquired") from exc
            try:
                yield conn
            except sqlite3.Error as exc:
                _rollback(conn)
                raise failure(exc, "registry write failed") from exc
            except BaseException:
                _rollback(conn)
                raise
            else:
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    _rollback(conn)
                    raise failure(exc, "registry commit failed") from exc

    def write(self, change: Callable[[sqlite3.Connection], T]) -> T:
        """Run one change in a write transaction of its own (see ``write_group``)."""
        [(result, error)] = self.write_group([change])
        if error is not None:
            raise error
        return result

    def write_group(
        self, changes: Sequence[Callable[[sqlite3.Connection], Any]]
    ) -> list[tuple[Any, BaseException | None]]:
        """Run several changes in one ``BEGIN IMMEDIATE`` ... ``COMMIT`` (at most ``MAX_GROUP`` a transaction), each
        inside its own savepoint unless it stands alone: the changes that arrive together (``Coalescer``, one thread
        hop) pay one fsync instead of one each. Each change's (result, error), in order. For each change:
        - it sees the writes of the changes before it and commits with them: its checks (a promotion's count of
          running rows, a finalize's decision) run inside the transaction that commits it;
        - its outbox event is written by the change itself, so it commits or rolls back with its change;
        - an error rolls back that change alone (to its savepoint) and is its own result; the others commit;
        - this returns only once the transaction holding it has committed (``synchronous = FULL``): an acknowledged
          change is durable. A failed COMMIT fails every change of the group.
        """
        try:
            with self._locked():
                return [
                    out
                    for at in range(0, len(changes), MAX_GROUP)
                    for out in self._run_group(changes[at : at + MAX_GROUP])
                ]
        except RegistryUnavailable as exc:  # the lock not in time: nothing was written
            return [(None, RegistryUnavailable(str(exc))) for _ in changes]

    def _run_group(
        self, group: Sequence[Callable[[sqlite3.Connection], Any]]
    ) -> list[tuple[Any, BaseException | None]]:
        """Run ``group`` in one transaction; each change's outcome. The caller holds the write lock."""
        results: list[tuple[Any, BaseException | None]] = []
        try:
            with self.locked_tx() as conn:
                changes_before = conn.total_changes
                for change in group:
                    savepoint = not isinstance(change, StandAlone)
                    if savepoint:
                        conn.execute("SAVEPOINT change")
                    error: BaseException | None = None
                    try:
                        result = change(conn)
                    except sqlite3.Error as exc:
                        if isinstance(failure(exc, ""), RegistryUnavailable):
                            # The storage refused (full, read-only, I/O): the whole group fails, and the connection
                            # is replaced (one opened while the file was read-only stays read-only for good).
                            raise
                        result, error = None, failure(exc, "registry write failed")
                        error.__cause__ = exc
                    except Exception as exc:  # the change's own verdict (not found, conflict...): its caller's
                        result, error = None, exc
                    if savepoint:
                        if error is not None:
                            conn.execute("ROLLBACK TO change")
                        conn.execute("RELEASE change")
                    results.append((result, error))
                wrote = conn.total_changes != changes_before
        except Exception as exc:
            self._writes.failing = True
            why = str(exc) if isinstance(exc, RegistryError) else f"registry write failed: {exc!r}"
            kind = type(exc) if isinstance(exc, RegistryError) else RegistryError
            out: list[tuple[Any, BaseException | None]] = []
            for _ in group:  # each caller gets its own exception object (raised in its own task)
                error = kind(why)
                error.__cause__ = exc
                out.append((None, error))
            return out
        if wrote:
            self._writes.commits_that_wrote += 1  # under the write lock
            if self._writes.failing:
                # The fault is over: connections opened during it (read-only, say) are not kept, and the pool is
                # full again for the next fault (see ``ConnectionPool.fill``).
                self._writes.failing = False
                self._pool.drop_idle()
                try:
                    self._pool.fill()
                except RegistryError:
                    pass  # opened again on demand, as after any failed connection
        return results

    @property
    def commits_that_wrote(self) -> int:
        """How many commits of this process on this file wrote a row so far (see ``_FileWriters``)."""
        return self._writes.commits_that_wrote

    def read(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._pool.borrow() as conn:
            try:
                return conn.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise failure(exc, "registry read failed") from exc

    def close(self) -> None:
        self._pool.close()

    @contextmanager
    def read_tx(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot for reads that take more than one statement."""
        with self._pool.borrow() as conn:
            try:
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise failure(exc, "registry read failed") from exc


# -- concurrent writes share a thread hop -------------------------------------------------------------------------


I = TypeVar("I")  # noqa: E741 - the item a caller submits
O = TypeVar("O")  # noqa: E741 - what its caller gets back


@dataclass
class _Waiting(Generic[I, O]):
    item: I
    woken: trio.Event = field(default_factory=trio.Event)
    lead: bool = False  # woken to make the next call, not with a result
    result: O | BaseException | None = None


class Coalescer(Generic[I, O]):
    """Coalesce concurrent callers' items into one call of ``call`` per batch.

    No task of its own: the first item that finds no call in flight makes one (its caller *leads*) with every item
    queued so far; the items that arrive meanwhile queue, and when the call is done the leader hands the queue to the
    oldest of them, whose caller makes the next call. So a lone item goes at once (no timer, no added latency), an
    item waits at most for the call in flight, and under load each call holds every item that arrived during the
    previous one.

    ``call`` takes a batch and gives, per item in order, its result or the exception its caller is to raise (an
    exception from ``call`` itself is every item's). ``delivered`` (optional) sees each result in batch order,
    before any caller resumes. Shielded once queued: a queued item is someone's batch, and a leader that stopped
    halfway would strand every item behind it, so ``call`` must be bounded (a registry call is, by SQLite's busy
    timeout).
    """

    def __init__(
        self,
        call: Callable[[Sequence[I]], Awaitable[Sequence[O | BaseException]]],
        delivered: Callable[[O], None] | None = None,
    ) -> None:
        self._call = call
        self._delivered = delivered
        self._queue: list[_Waiting[I, O]] = []
        self._busy = False
        self.calls = 0  # made so far (for tests and the benchmark's curiosity)

    async def submit(self, item: I) -> O:
        """Have ``item`` in this caller's call or a later one; its result once that call is done."""
        me: _Waiting[I, O] = _Waiting(item)
        self._queue.append(me)
        with trio.CancelScope(shield=True):
            if self._busy:
                await me.woken.wait()
            else:
                self._busy = True
                me.lead = True
            if me.lead:
                await self._lead()
        result = me.result
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[return-value]  # set by the leader: never None once woken

    async def _lead(self) -> None:
        batch, self._queue = self._queue, []
        try:
            results: Sequence[O | BaseException] = await self._call([w.item for w in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} items was answered with {len(results)} results")
        except Exception as exc:  # the whole call failed (the registry is unavailable, say): each item says so
            results = [exc] * len(batch)
        finally:
            self.calls += 1
            # Whatever happened, the queue gets a new leader (or the coalescer goes idle): nothing is ever stranded.
            if self._queue:
                nxt = self._queue[0]
                nxt.lead = True
                nxt.woken.set()
            else:
                self._busy = False
        for waiting, result in zip(batch, results, strict=True):
            waiting.result = result
            if self._delivered is not None and not isinstance(result, BaseException):
                self._delivered(result)
            if not waiting.lead:
                waiting.woken.set()


# -- the store port as SQLite's SQL --------------------------------------------------------------------------------

# A time filter of the job list (its column, and the index that holds it in time order, migrations 7 and 14). The
# list is read newest first by seq, and SQLite keeps no statistics of a range: with the index in reach its planner
# reads a whole wide range and sorts it (a week: 600,000 rows), without it it walks seq from the newest row and tests
# the time, which reads the whole history when the range holds few rows or none. So the range is counted on its
# index first, stopping past ``NARROW_RANGE_ROWS``: a narrow one is read from the index and sorted, a wide one is
# kept out of the planner's choice (``+column``) and walked from the newest row, or from another filter's index.
TIME_INDEXES = {"created_at": "jobs_created", "ended_at": "jobs_ended"}
NARROW_RANGE_ROWS = 1000
# A wide range that ends before the newest row is walked from its own newest row, found on its index (covering: no
# row is read) when it holds at most this many rows; a wider one is walked from the newest row of all.
WALK_BOUND_ROWS = 200_000
_RANGE = ("<", "<=", ">", ">=")


def _timestamp(value: str | None) -> datetime | None:
    return None if value is None else from_iso(value)


def _time_bound(cond: object) -> bool:
    return isinstance(cond, tuple) and cond[0] in TIME_INDEXES and cond[1] in _RANGE and cond[2] is not None


class SqliteStore(LocalStore, SqlStore):
    """The store port on ``conn`` (see ``_tables.Store``)."""

    def __init__(self, conn: sqlite3.Connection, *, clock: Callable[[], datetime]) -> None:
        self.conn = conn
        self.clock = clock

    def mark(self, n: int) -> str:
        return "?"

    def encode(self, column: str, value: object) -> object:
        if isinstance(value, datetime):
            return to_iso(value)
        if isinstance(value, bool):
            return int(value)
        return super().encode(column, value)

    def reader(self, column: str) -> Reader | None:
        if column in TIMESTAMPS:
            return _timestamp
        if column in BOOLEANS:
            return bool
        return super().reader(column)

    async def narrowed(self, table: str, where: Where, read: Read) -> tuple[str, Where]:
        if table != JOBS or read.order != ("-seq",) or not any(_time_bound(c) for c in where):
            return table, where
        index = await self._narrow_time_index(where)
        if index is not None:
            return f"{table} INDEXED BY {index}", where
        walked = tuple(("+" + c[0], *c[1:]) if _time_bound(c) else c for c in where)
        return table, walked + await self._walk_from(where)

    async def _walk_from(self, where: Where) -> Where:
        """Where a walk down seq may begin: a range that ends before the newest row's creation begins at its own
        newest row (the largest seq its index holds: ``seq <=`` it is true of every row in the range), counted on
        the index up to ``WALK_BOUND_ROWS``; else (or past that) at the newest row."""
        until = tuple(c for c in where if _time_bound(c) and c[0] == "created_at")
        if not any(c[1] in ("<", "<=") for c in until):
            return ()
        rows = await self.fetch(f"SELECT created_at FROM {JOBS} ORDER BY seq DESC LIMIT 1", [])
        if not rows or all(self._holds(rows[0][0], c) for c in until):
            return ()
        args: list[object] = []
        inner = f"SELECT seq FROM {JOBS} INDEXED BY jobs_created WHERE {self.where(until, args)} LIMIT ?"
        [[count, last]] = await self.fetch(f"SELECT COUNT(*), MAX(seq) FROM ({inner})", [*args, WALK_BOUND_ROWS + 1])
        return (("seq", "<=", last),) if count <= WALK_BOUND_ROWS and last is not None else ()

    def _holds(self, stored: str, cond: tuple[str, str, Any]) -> bool:
        bound = self.encode(cond[0], cond[2])
        assert isinstance(bound, str)
        return {"<": stored < bound, "<=": stored <= bound, ">": stored > bound, ">=": stored >= bound}[cond[1]]

    async def _narrow_time_index(self, where: Where) -> str | None:
        """The time index whose range in ``where`` holds the fewest rows, when at most ``NARROW_RANGE_ROWS``."""
        best: tuple[int, str] | None = None
        for column, index in TIME_INDEXES.items():
            bounds = tuple(c for c in where if _time_bound(c) and c[0] == column)
            if not bounds:
                continue
            args: list[object] = []
            probe = f"SELECT 1 FROM {JOBS} INDEXED BY {index} WHERE {self.where(bounds, args)} LIMIT ?"
            [[count]] = await self.fetch(f"SELECT COUNT(*) FROM ({probe})", [*args, NARROW_RANGE_ROWS + 1])
            if count <= NARROW_RANGE_ROWS and (best is None or count < best[0]):
                best = (count, index)
        return best[1] if best is not None else None

    def json_equals(self, column: str, key: str, value: object, args: list[object]) -> str:
        # The side table of params (migration 14): its key answers a value, numbers compared as numbers.
        assert column == "params", column
        args += [key, int(value) if isinstance(value, bool) else value]
        return "seq IN (SELECT seq FROM job_params WHERE name = ? AND value = ?)"


# -- the rules' transactions, from the event loop ----------------------------------------------------------------


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
