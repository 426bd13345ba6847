"""The SQLite registry's file: what is checked before it is opened (a damaged file is refused untouched), how a
failed SQLite call is told (``failure``), the bounded pool of connections it lends (WAL, ``synchronous = FULL``)
and this process's one writer at a time. Blocking code, called from worker threads. The transactions run on these
connections are ``_backend``'s (``SqliteFile``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ...domain import RegistryDamaged, RegistryError, RegistryLocked, RegistryUnavailable

BUSY_TIMEOUT_MS = 10_000
# How long an empty registry file may stay empty before it is judged damaged (see ``check_existing_file``).
EMPTY_FILE_GRACE_S = 2.0
# WAL lets readers run beside the one writer; a few connections serve every thread that calls the registry.
DEFAULT_CONNECTIONS = 4

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


def not_a_directory(path: Path) -> str | None:
    """The first of ``path`` and its parents that is there and is no directory (a file where a directory goes)."""
    for at in (path, *path.parents):
        if at.exists() and not at.is_dir():
            return f"{at} is a file"
    return None


def file_identity(path: Path) -> tuple[int, int] | None:
    """The file system's name for the file at ``path`` (device, inode); None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class ConnectionPool:
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


def process_writers(path: Path) -> _FileWriters:
    """The one ``_FileWriters`` of this process for the registry file at ``path``, shared by every handle on it."""
    key = str(path.resolve())
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(key, _FileWriters())
