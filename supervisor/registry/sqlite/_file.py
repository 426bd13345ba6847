"""The SQLite registry's transaction layer: a bounded connection pool, one writer at a time per process, and group
commit. Blocking code, called from worker threads (``_registry.SqliteRegistry`` hops there); it knows nothing of
jobs: the rules' steps (``_registry.SqliteBackend``) are changes handed to it.

Every write is one ``BEGIN IMMEDIATE`` transaction, which takes SQLite's write lock up front: that lock is the
cross-process lock that lets a CLI or a second process enqueue safely beside a running supervisor, and the lock
under which a promotion counts and flips (INV-PROMOTION-NEVER-OVERSHOOTS). ``synchronous = FULL`` in WAL mode: a
write is durable when its caller returns.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ...domain import RegistryDamaged, RegistryError, RegistryLocked, RegistryUnavailable
from ._schema import migrate

BUSY_TIMEOUT_MS = 10_000
# How long an empty registry file may stay empty before it is judged damaged (see ``check_existing_file``).
EMPTY_FILE_GRACE_S = 2.0
# WAL lets readers run beside the one writer; a few connections serve every thread that calls the registry.
DEFAULT_CONNECTIONS = 4
# At most this many concurrent changes share one group commit (bounds one transaction's length).
MAX_GROUP = 64

T = TypeVar("T")

# One change of a group commit: run in the shared transaction on the writer connection.
ConnectionChange = Callable[[sqlite3.Connection], Any]


# The SQLite result codes that say "not now" rather than "never": the file system is full or read-only, the file
# locked by another process past the busy timeout, an I/O error, the file cannot be opened (its directory gone).
_UNAVAILABLE_CODES = frozenset(
    {
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PERM,
    }
)
_DAMAGED_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def failure(exc: sqlite3.Error, what: str) -> RegistryError:
    """The registry's error for a failed SQLite call: ``RegistryUnavailable`` when the same call may succeed later
    (the caller retries, or answers 503), else ``RegistryError``. The cause is chained by the caller's ``from``."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None  # extended codes (SQLITE_IOERR_WRITE...) keep the primary
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return RegistryLocked(f"{what}: {exc} (another process holds it: a backup, a sqlite3 shell?)")
    if primary in _UNAVAILABLE_CODES:
        return RegistryUnavailable(f"{what}: {exc}")
    return RegistryError(f"{what}: {exc}")


def check_existing_file(path: Path) -> None:
    """Refuse a registry file that is not a readable database, before anything opens it for writing.

    Read-only (``mode=ro``): the file is never modified, and never replaced by a fresh empty database -- which is what
    SQLite makes of an empty file, so an existing empty file is refused too. ``quick_check`` reads every page: a
    truncated file is found here, at startup, not at the first query that reaches its missing pages.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return  # a first start: the registry is made
    except OSError as exc:
        raise RegistryError(f"cannot open registry {path}: {exc.strerror or exc}") from exc
    side_files = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    existed = {side: side.exists() for side in side_files}
    deadline = time.monotonic() + EMPTY_FILE_GRACE_S
    while size == 0 and time.monotonic() < deadline:
        # Another process may be making this registry right now (SQLite creates the file, then writes its first
        # page): empty for a moment is a birth, empty for good is a file that lost its content.
        time.sleep(0.01)
        size = path.stat().st_size if path.exists() else 0
    if size == 0:
        raise RegistryDamaged(_damaged(path, "the file is empty"))
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            verdict = [row[0] for row in conn.execute("PRAGMA quick_check(10)").fetchall()]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int) and code & 0xFF in _DAMAGED_CODES:
            _remove_made(existed)
            raise RegistryDamaged(_damaged(path, str(exc))) from exc
        raise failure(exc, f"cannot open registry {path}") from exc
    if verdict != ["ok"]:
        _remove_made(existed)
        raise RegistryDamaged(_damaged(path, "; ".join(verdict)[:500]))


def _damaged(path: Path, why: str) -> str:
    return (
        f"registry {path} is damaged ({why}): it was not opened for writing and has not been changed. Restore it "
        f"from a backup, or move it aside to start with an empty registry (every job it held is then forgotten)"
    )


def _remove_made(existed: dict[Path, bool]) -> None:
    """The side files a read-only look at a damaged file made (an empty -wal, -shm): the directory as it was."""
    for side, was_there in existed.items():
        if not was_there:
            try:
                side.unlink()
            except OSError:
                pass


def _not_a_directory(path: Path) -> str | None:
    """The first of ``path`` and its parents that is there and is no directory (a file where a directory goes)."""
    for at in (path, *path.parents):
        if at.exists() and not at.is_dir():
            return f"{at} is a file"
    return None


def _file_identity(path: Path) -> tuple[int, int] | None:
    """The file system's name for the file at ``path`` (device, inode); None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back, best effort: a connection whose rollback fails stays in a transaction and the pool drops it."""
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


class _ConnectionPool:
    """At most ``size`` SQLite connections, owned by the registry, lent to one thread at a time.

    Connections belong to the pool, never to a thread: the Trio thread cache retires idle worker threads after
    about 10 s, and a connection per thread (what this replaced) opened a new connection and WAL descriptor at
    nearly every sweep and never closed the old ones. A connection that failed is closed and replaced, so an I/O
    error cannot leave a broken connection in circulation.
    """

    def __init__(self, path: Path, size: int, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        if size < 1:
            raise ValueError("a connection pool needs at least one connection")
        self._path = path
        self._busy_timeout_ms = busy_timeout_ms
        self.size = size
        self._cond = threading.Condition()
        self._idle: list[sqlite3.Connection] = []
        self._open = 0  # idle + lent
        self._closed = False

    @property
    def open_connections(self) -> int:
        with self._cond:
            return self._open

    def fill(self) -> None:
        """Open every connection now, at the registry's open: one first needed later -- while the file is removed,
        say -- could not reach the file the others hold, and reads would stop answering."""
        with self._cond:
            while self._open < self.size:
                self._idle.append(self._connect())
                self._open += 1

    def _connect(self) -> sqlite3.Connection:
        # mode=rw: a file that is gone (removed under a running registry) is an error, never a fresh empty database
        # made in its place; the first start makes the file itself (``SqliteFile``).
        uri = Path(os.path.abspath(self._path)).as_uri() + "?mode=rw"
        try:
            conn = sqlite3.connect(
                uri, uri=True, isolation_level=None, timeout=self._busy_timeout_ms / 1000, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise failure(exc, f"cannot open registry {self._path}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            # FULL: an acknowledged enqueue or transition survives a power loss or kernel crash, not only
            # a process crash (NORMAL in WAL mode may drop the last commits). Jobs are few; fsyncs are cheap.
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            conn.close()
            raise failure(exc, f"cannot open registry {self._path}") from exc
        conn.row_factory = sqlite3.Row
        return conn

    @contextmanager
    def borrow(self) -> Iterator[sqlite3.Connection]:
        """Lend one connection to the calling thread; wait (bounded) when all are lent."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: self._closed or self._idle or self._open < self.size, timeout=self._busy_timeout_ms / 1000
            ):
                raise RegistryUnavailable(f"no registry connection free within {self._busy_timeout_ms} ms")
            if self._closed:
                raise RegistryError(f"registry {self._path} is closed")
            conn = self._idle.pop() if self._idle else None
            self._open += conn is None  # reserve the slot before connecting outside the lock
        if conn is None:
            try:
                conn = self._connect()
            except BaseException:
                self._release(None)
                raise
        healthy = False
        try:
            yield conn
            healthy = not conn.in_transaction
        except BaseException as exc:
            # A storage error may have left the connection unusable (I/O error, corrupt page): replace it.
            # A caller's own error (not found, unauthorized) leaves it as good as it was.
            failed = isinstance(exc, sqlite3.Error) or isinstance(exc.__cause__, sqlite3.Error)
            healthy = not failed and not conn.in_transaction
            raise
        finally:
            if not healthy:
                self._discard(conn)
            self._release(conn if healthy else None)

    @staticmethod
    def _discard(conn: sqlite3.Connection) -> None:
        try:
            conn.close()
        except sqlite3.Error:
            pass

    def _release(self, conn: sqlite3.Connection | None) -> None:
        with self._cond:
            if conn is None or self._closed:
                self._open -= 1
                if conn is not None:
                    self._discard(conn)
            else:
                self._idle.append(conn)
            self._cond.notify()

    def drop_idle(self) -> None:
        """Close every idle connection; the next borrows open fresh ones."""
        with self._cond:
            for conn in self._idle:
                self._discard(conn)
            self._open -= len(self._idle)
            self._idle.clear()
            self._cond.notify_all()

    def close(self) -> None:
        """Close every idle connection now, and each lent one as it comes back."""
        with self._cond:
            self._closed = True
            for conn in self._idle:
                self._discard(conn)
            self._open -= len(self._idle)
            self._idle.clear()
            self._cond.notify_all()


@dataclass(frozen=True)
class StandAlone:
    """A change for the group commit that needs no savepoint of its own: its writes each stand alone, so a failure
    partway leaves nothing to undo (``_engine.Independent``: a heartbeat). Any other change gets one."""

    run: ConnectionChange

    def __call__(self, conn: sqlite3.Connection) -> Any:
        return self.run(conn)


class _FileWriters:
    """This process's writers of one registry file: one at a time (``lock``: a second handle on the same file, as
    the CLI and tests open, waits here and is woken at once, not in SQLite's busy handler, which sleeps and polls:
    1, 2, 5, 10 ms...), and what their commits proved."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Commits that wrote at least one row: proof that the file takes writes. A commit of changes that changed
        # nothing touches no page, and succeeds on a full disk or a read-only file as well.
        self.commits_that_wrote = 0
        self.failing = False  # the last group failed on the storage (see ``SqliteFile._run_group``)


_WRITERS: dict[str, _FileWriters] = {}
_WRITERS_GUARD = threading.Lock()


def _process_writers(path: Path) -> _FileWriters:
    """The one ``_FileWriters`` of this process for the registry file at ``path``, shared by every handle on it."""
    key = str(path.resolve())
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(key, _FileWriters())


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
                f"{_not_a_directory(self.path.parent) or exc.filename}); PODCAST_JOB_DATA_DIR must be a directory "
                "this user can write, or one it can make"
            ) from exc
        check_existing_file(self.path)  # a damaged file is refused untouched, never replaced by an empty one
        if not self.path.exists():
            try:
                sqlite3.connect(self.path).close()  # a first start: the file is made here, and only here
            except sqlite3.Error as exc:
                raise failure(exc, f"cannot open registry {self.path}") from exc
        self._pool = _ConnectionPool(self.path, max_connections, busy_timeout_ms)
        # One writer of this process at a time on this file (``_FileWriters``, shared by every handle on it); readers
        # never wait here (WAL).
        self._writes = _process_writers(self.path)
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
        self._file = _file_identity(self.path)

    def check_file(self) -> None:
        """Refuse to write when the registry's file is no longer the one opened (removed, or replaced by another):
        SQLite would go on writing into the removed inode, and what it acknowledged would be lost at the next start."""
        if _file_identity(self.path) != self._file:
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
                # full again for the next fault (see ``_ConnectionPool.fill``).
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
