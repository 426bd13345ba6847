"""The job registry on SQLite: the single source of truth for every job row.

It is plain blocking code that knows nothing of HTTP or Trio tasks; the supervisor calls it through
``trio.to_thread.run_sync`` (see ``_store.py``). Every mutation is one transaction opened with
``BEGIN IMMEDIATE``, which takes SQLite's write lock up front: that lock is the cross-process lock that lets a
CLI or the pipeline container enqueue safely beside a running supervisor.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from .domain._errors import Conflict, JobNotFound, RegistryError, RequestError, Unauthorized, ValidationError
from .domain._model import TERMINAL, Job, JobStatus, check_transition

SCHEMA_VERSION = 3
BUSY_TIMEOUT_MS = 10_000
MAX_LIST_LIMIT = 1000
CURSOR_PATTERN = re.compile(r"[0-9]{1,18}")  # what next_cursor ever holds; the OpenAPI document says the same
# WAL lets readers run beside the one writer; a few connections serve every thread that calls the registry.
DEFAULT_CONNECTIONS = 4
# At most this many concurrent changes share one group commit (bounds one transaction's length).
MAX_GROUP = 64

T = TypeVar("T")

# Migrations, in order; MIGRATIONS[n] takes the schema from version n to n + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL,
        params TEXT NOT NULL,
        argv TEXT NOT NULL,
        status TEXT NOT NULL,
        error_reason TEXT,
        exit_code INTEGER,
        created_at TEXT NOT NULL,
        started_at TEXT,
        ended_at TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        boot_id TEXT,
        pid INTEGER,
        pid_start_time INTEGER,
        kernel_boot_id TEXT,
        container_id TEXT,
        token_hash TEXT,
        completed_units INTEGER NOT NULL DEFAULT 0,
        total_units INTEGER,
        stage TEXT,
        last_heartbeat_at TEXT,
        last_progress_at TEXT,
        log_path TEXT,
        coalesce_key TEXT
    );
    -- A sweep reads only running rows and a drain only queued ones: O(active rows), not O(history).
    CREATE INDEX jobs_status_seq ON jobs (status, seq);
    CREATE INDEX jobs_kind_seq ON jobs (kind, seq);
    CREATE INDEX jobs_queued_coalesce ON jobs (coalesce_key) WHERE status = 'queued';
    """,
    # 1 -> 2: the sweeper's absence judgement (ADR 0002 D9), kept on the row so a restart neither repeats nor loses it.
    """
    ALTER TABLE jobs ADD COLUMN stalled INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE jobs ADD COLUMN stalled_since TEXT;
    ALTER TABLE jobs ADD COLUMN silent INTEGER NOT NULL DEFAULT 0;
    """,
    # 2 -> 3: the transactional outbox. Each event is written in the same transaction as the change it reports,
    # and deleted once delivered; ``body`` is the exact JSON a receiver gets (signed as sent).
    """
    CREATE TABLE outbox (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id TEXT NOT NULL UNIQUE,
        job_id TEXT NOT NULL,
        event TEXT NOT NULL,
        created_at TEXT NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX outbox_created ON outbox (created_at);
    """,
]

_COLUMNS = (
    "job_id, seq, kind, params, argv, status, error_reason, exit_code, created_at, started_at, ended_at, "
    "attempts, cancel_requested, boot_id, pid, pid_start_time, kernel_boot_id, container_id, token_hash, "
    "completed_units, total_units, stage, last_heartbeat_at, last_progress_at, log_path, stalled, stalled_since, silent"
)


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat(timespec="microseconds")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back, best effort: a connection whose rollback fails stays in a transaction and the pool drops it."""
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


@dataclass(frozen=True)
class EnqueueResult:
    job: Job
    coalesced: bool


@dataclass(frozen=True)
class FinalizeResult:
    job: Job
    changed: bool  # False when the row was already terminal: events fire only on real changes
    previous: JobStatus | None = None  # the status it left, when changed


@dataclass(frozen=True)
class OutboxEvent:
    """One undelivered event: ``body`` is the JSON to POST, exactly as written in the change's transaction."""

    seq: int
    event_id: str
    job_id: str
    event: str
    created_at: str
    body: str


@dataclass(frozen=True)
class PruneResult:
    by_age: int
    by_count: int

    @property
    def dropped(self) -> int:
        return self.by_age + self.by_count


@dataclass(frozen=True)
class NewJob:
    """A row to enqueue: a validated kind, its params and argv, and its coalescing key (None: never coalesced)."""

    kind: str
    params: Mapping[str, Any]
    argv: Sequence[str]
    coalesce_key: str | None = None


@dataclass(frozen=True)
class PromoteRequest:
    """What ``promote_queued`` needs, for a promotion made in another change's transaction."""

    max_concurrent: int
    boot_id: str
    token_hashes: Sequence[str]
    log_dir: Path | None = None


@dataclass(frozen=True)
class ProcessRecord:
    """A spawned job's identity to record: pid + start time + kernel boot id, or a container id."""

    job_id: str
    pid: int | None = None
    pid_start_time: int | None = None
    kernel_boot_id: str | None = None
    container_id: str | None = None


@dataclass(frozen=True)
class Beat:
    """One heartbeat to record, already validated: whose it is (job id and token), and what it says."""

    job_id: str
    token: str
    completed_units: int
    total_units: int | None = None
    stage: str | None = None


class _ConnectionPool:
    """At most ``size`` SQLite connections, owned by the registry, lent to one thread at a time.

    Connections belong to the pool, never to a thread: the Trio thread cache retires idle worker threads after
    about 10 s, and a connection per thread (what this replaced) opened a new connection and WAL descriptor at
    nearly every sweep and never closed the old ones. A connection that failed is closed and replaced, so an I/O
    error cannot leave a broken connection in circulation.
    """

    def __init__(self, path: Path, size: int) -> None:
        if size < 1:
            raise ValueError("a connection pool needs at least one connection")
        self._path = path
        self.size = size
        self._cond = threading.Condition()
        self._idle: list[sqlite3.Connection] = []
        self._open = 0  # idle + lent
        self._closed = False

    @property
    def open_connections(self) -> int:
        with self._cond:
            return self._open

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self._path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise RegistryError(f"cannot open registry {self._path}: {exc}") from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            # FULL: an acknowledged enqueue or transition survives a power loss or kernel crash, not only
            # a process crash (NORMAL in WAL mode may drop the last commits). Jobs are few; fsyncs are cheap.
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            conn.close()
            raise RegistryError(f"cannot open registry {self._path}: {exc}") from exc
        conn.row_factory = sqlite3.Row
        return conn

    @contextmanager
    def borrow(self) -> Iterator[sqlite3.Connection]:
        """Lend one connection to the calling thread; wait (bounded) when all are lent."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: self._closed or self._idle or self._open < self.size, timeout=BUSY_TIMEOUT_MS / 1000
            ):
                raise RegistryError(f"no registry connection free within {BUSY_TIMEOUT_MS} ms")
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

    def close(self) -> None:
        """Close every idle connection now, and each lent one as it comes back."""
        with self._cond:
            self._closed = True
            for conn in self._idle:
                self._discard(conn)
            self._open -= len(self._idle)
            self._idle.clear()
            self._cond.notify_all()


@dataclass(eq=False)
class _PendingWrite:
    """One change waiting for a group commit, and its outcome once the transaction holding it has ended."""

    change: Callable[[sqlite3.Connection], Any]
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    committed: threading.Event = field(default_factory=threading.Event)  # set once ``done``: wakes its caller only


class _WriteQueue:
    """This process's writers of one registry file: one writer at a time (``lock``), and the changes waiting for
    the next group commit (``pending``).

    A change's caller never waits for the lock itself: it queues its change and, if another writer holds the lock,
    waits on its own event, set as soon as a leader has committed the change (one wake-up per change, no herd).
    Whoever holds the lock runs what is queued before it lets go (``lead``), so a change queued while the lock was
    held is never left behind. SQLite's busy handler would sleep and poll instead (1, 2, 5, 10 ms...) and leave the
    write lock idle between the transactions of concurrent jobs.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.guard = threading.Lock()
        self.pending: list[_PendingWrite] = []

    def take(self) -> list[_PendingWrite]:
        with self.guard:
            group = self.pending[:MAX_GROUP]
            del self.pending[:MAX_GROUP]
            return group

    def has_pending(self) -> bool:
        with self.guard:
            return bool(self.pending)

    def withdraw(self, item: _PendingWrite) -> bool:
        """Take a change back out of the queue; False when a leader already took it (it is being run)."""
        with self.guard:
            for i, queued in enumerate(self.pending):
                if queued is item:
                    del self.pending[i]
                    return True
            return False


_WRITE_QUEUES: dict[str, _WriteQueue] = {}
_WRITE_QUEUES_GUARD = threading.Lock()


def _process_write_queue(path: Path) -> _WriteQueue:
    """The one write queue of this process for the registry file at ``path``, shared by every handle on it (a
    second handle on the same file, as the CLI and tests open, waits in the same queue instead of busy-sleeping)."""
    key = str(path.resolve())
    with _WRITE_QUEUES_GUARD:
        return _WRITE_QUEUES.setdefault(key, _WriteQueue())


class SqliteRegistry:
    """Job rows in one SQLite file (WAL mode). Safe to use from many threads and many processes.

    It holds at most ``max_connections`` connections whatever the number of threads that call it (see
    ``_ConnectionPool``); ``close()`` closes them all.
    """

    def __init__(
        self, path: Path, *, clock: Callable[[], datetime] = utc_now, max_connections: int = DEFAULT_CONNECTIONS
    ) -> None:
        self.path = Path(path)
        self._clock = clock
        # Who makes the changes this handle records (a supervisor's boot id; None for a CLI or another process):
        # it goes into each outbox event as its ``boot_id``.
        self.boot_id: str | None = None
        # Write an outbox event with each change. A supervisor without a webhook turns this off (nothing would
        # ever send them); other processes cannot know, so they write them, and that supervisor discards them.
        self.outbox_enabled = True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._pool = _ConnectionPool(self.path, max_connections)
        # One writer of this process at a time, and the group commit's queue (see ``_write``); readers never wait
        # here (WAL).
        self._writes = _process_write_queue(self.path)
        with self._tx() as conn:
            self._migrate(conn)

    @property
    def max_connections(self) -> int:
        return self._pool.size

    @property
    def open_connections(self) -> int:
        """Connections open right now (idle or lent): never more than ``max_connections``."""
        return self._pool.open_connections

    # -- connections and transactions -------------------------------------------------------------

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction under SQLite's cross-process write lock.

        This process's writers first take its write lock (``_WriteQueue``), which wakes the next one at once;
        ``busy_timeout`` still arbitrates with other processes (a CLI, a second supervisor), which never see it.
        """
        if not self._writes.lock.acquire(timeout=BUSY_TIMEOUT_MS / 1000):
            raise RegistryError(f"registry lock not acquired within {BUSY_TIMEOUT_MS} ms (this process's writers)")
        try:
            with self._locked_tx() as conn:
                yield conn
        finally:
            self._writes.lock.release()
            self._lead()  # group changes queued meanwhile: their callers wait for a leader, not for the lock

    @contextmanager
    def _locked_tx(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on a pooled connection; the caller holds the write lock."""
        with self._pool.borrow() as conn:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise RegistryError(f"registry lock not acquired: {exc}") from exc
            try:
                yield conn
            except sqlite3.Error as exc:
                _rollback(conn)
                raise RegistryError(f"registry write failed: {exc}") from exc
            except BaseException:
                _rollback(conn)
                raise
            else:
                try:
                    conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    _rollback(conn)
                    raise RegistryError(f"registry commit failed: {exc}") from exc

    def _write(self, change: Callable[[sqlite3.Connection], T]) -> T:
        """Run one change in a write transaction shared with this process's concurrent changes (group commit).

        The change is queued; the next writer of this process (the leader) runs every queued change in one
        ``BEGIN IMMEDIATE`` ... ``COMMIT``, each inside its own savepoint, so the jobs that end or start together
        pay one fsync instead of one each. For each change:
        - it sees the writes of the changes before it and commits with them: its checks (a promotion's count of
          running rows, a finalize's ``decide``) run inside the transaction that commits it, as with ``_tx``;
        - its outbox event is written by the change itself, so it commits or rolls back with its change;
        - an error rolls back that change alone (to its savepoint) and is raised to its caller only; the others
          commit;
        - its caller returns only once the transaction holding it has committed (``synchronous = FULL``): an
          acknowledged change is durable. A failed COMMIT fails every change of the group.
        A change may run in another caller's thread, on a connection of another handle on the same file.
        """
        [(result, error)] = self.write_group([change])
        if error is not None:
            raise error
        return result

    def write_group(
        self, changes: Sequence[Callable[[sqlite3.Connection], Any]]
    ) -> list[tuple[Any, BaseException | None]]:
        """Run several changes as ``_write`` runs one, queued together (so one leader commits them together, with
        whatever else is queued): each change's (result, error), in order. For a caller that collects the changes of
        several tasks and hands them over in one thread hop (``AsyncRegistry``)."""
        items = [_PendingWrite(change) for change in changes]
        queue = self._writes
        with queue.guard:
            queue.pending.extend(items)
        self._lead()
        out: list[tuple[Any, BaseException | None]] = []
        for item in items:
            if not item.committed.wait(BUSY_TIMEOUT_MS / 1000):
                if queue.withdraw(item):  # no leader took it in time: give up, nothing was written
                    why = f"registry lock not acquired within {BUSY_TIMEOUT_MS} ms (this process's writers)"
                    out.append((None, RegistryError(why)))
                    continue
                item.committed.wait()  # a leader is running it: its transaction ends (bounded by busy_timeout)
            out.append((item.result, item.error))
        return out

    def _lead(self) -> None:
        """If no writer of this process holds the lock, take it and commit every queued change, group by group;
        look again after letting go (a change queued just before is otherwise left without a leader)."""
        queue = self._writes
        while queue.has_pending() and queue.lock.acquire(blocking=False):
            try:
                while group := queue.take():
                    self._run_group(group)
            finally:
                queue.lock.release()

    def _run_group(self, group: list[_PendingWrite]) -> None:
        """Run ``group`` in one transaction and record each change's outcome; the caller holds the write lock."""
        results: list[tuple[_PendingWrite, Any, BaseException | None]] = []
        try:
            with self._locked_tx() as conn:
                for item in group:
                    conn.execute("SAVEPOINT change")
                    error: BaseException | None = None
                    try:
                        result = item.change(conn)
                    except sqlite3.Error as exc:
                        result, error = None, RegistryError(f"registry write failed: {exc}")
                        error.__cause__ = exc
                    except Exception as exc:  # the change's own verdict (not found, conflict...): its caller's
                        result, error = None, exc
                    if error is not None:
                        conn.execute("ROLLBACK TO change")
                    conn.execute("RELEASE change")
                    results.append((item, result, error))
        except BaseException as exc:
            why = str(exc) if isinstance(exc, RegistryError) else f"registry write failed: {exc!r}"
            for item in group:  # each caller gets its own exception object (raised in its own thread)
                item.error, item.done = RegistryError(why), True
                item.error.__cause__ = exc
                item.committed.set()
            if not isinstance(exc, Exception):
                raise
            return
        for item, result, error in results:
            item.result, item.error, item.done = result, error, True
            item.committed.set()

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._pool.borrow() as conn:
            try:
                return conn.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise RegistryError(f"registry read failed: {exc}") from exc

    def close(self) -> None:
        self._pool.close()

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        version = 0 if row is None else int(row[0])
        if version > SCHEMA_VERSION:
            raise RegistryError(
                f"registry {self.path} has schema version {version}, newer than this supervisor ({SCHEMA_VERSION})"
            )
        for step in MIGRATIONS[version:]:
            for statement in step.split(";"):
                if statement.strip():
                    conn.execute(statement)
        if row is None:
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        else:
            conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

    def schema_version(self) -> int:
        return int(self._read("SELECT version FROM schema_version")[0][0])

    # -- helpers ------------------------------------------------------------------------------------

    def _now(self) -> str:
        return iso(self._clock())

    @staticmethod
    def _row_to_job(row: sqlite3.Row, queue_position: int | None = None) -> Job:
        return Job(
            job_id=row["job_id"],
            seq=row["seq"],
            kind=row["kind"],
            params=json.loads(row["params"]),
            argv=json.loads(row["argv"]),
            status=JobStatus(row["status"]),
            error_reason=row["error_reason"],
            exit_code=row["exit_code"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            attempts=row["attempts"],
            cancel_requested=bool(row["cancel_requested"]),
            boot_id=row["boot_id"],
            pid=row["pid"],
            pid_start_time=row["pid_start_time"],
            kernel_boot_id=row["kernel_boot_id"],
            container_id=row["container_id"],
            token_hash=row["token_hash"],
            completed_units=row["completed_units"],
            total_units=row["total_units"],
            stage=row["stage"],
            last_heartbeat_at=row["last_heartbeat_at"],
            last_progress_at=row["last_progress_at"],
            log_path=row["log_path"],
            queue_position=queue_position,
            stalled=bool(row["stalled"]),
            stalled_since=row["stalled_since"],
            silent=bool(row["silent"]),
        )

    def _get_in(self, conn: sqlite3.Connection, job_id: str) -> Job:
        row = conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(job_id)
        position = None
        if row["status"] == JobStatus.QUEUED:
            position = conn.execute(
                "SELECT COUNT(*) FROM jobs WHERE status = 'queued' AND seq <= ?", (row["seq"],)
            ).fetchone()[0]
        return self._row_to_job(row, position)

    def _record_event(
        self, conn: sqlite3.Connection, job_id: str, event: str, previous_status: str | None, reason: str | None
    ) -> None:
        """Write one outbox event, inside the caller's transaction: it commits (or rolls back) with the change."""
        if not self.outbox_enabled:
            return
        row = conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        job = self._row_to_job(row)  # the row as of this change (no queue position: it would cost a count)
        event_id = uuid.uuid4().hex
        now = self._now()
        body = {
            "event_id": event_id,
            "event": event,
            "job": job.public(),
            "previous_status": previous_status,
            "reason": reason,
            "boot_id": self.boot_id,
            "ts": now,
        }
        conn.execute(
            "INSERT INTO outbox (event_id, job_id, event, created_at, body) VALUES (?, ?, ?, ?, ?)",
            (event_id, job_id, event, now, json.dumps(body, sort_keys=True, separators=(",", ":"))),
        )

    def _set_status(
        self,
        conn: sqlite3.Connection,
        job: Job,
        to_status: JobStatus,
        **fields: Any,
    ) -> None:
        """The one place a row's status changes; an illegal transition raises. The change's outbox event is
        written here too, in the same transaction."""
        check_transition(job.job_id, job.status, to_status)
        if to_status.is_terminal:
            # A job's token works only while the job runs: with its hash gone, a late (or stolen) token matches
            # nothing, and the heartbeat answers 401 exactly as for a job that never existed.
            fields = {**fields, "token_hash": None}
        assignments = ", ".join(f"{name} = ?" for name in ("status", *fields))
        cur = conn.execute(
            f"UPDATE jobs SET {assignments} WHERE job_id = ? AND status = ?",
            (str(to_status), *fields.values(), job.job_id, str(job.status)),
        )
        if cur.rowcount != 1:  # the read above and this write are in one transaction: cannot happen
            raise RegistryError(f"job {job.job_id}: status changed under the registry lock")
        reason = "promoted" if to_status is JobStatus.RUNNING else fields.get("error_reason")
        self._record_event(conn, job.job_id, "job.transition", str(job.status), reason)

    # -- operations ---------------------------------------------------------------------------------

    def enqueue(
        self,
        kind: str,
        params: Mapping[str, Any],
        argv: Sequence[str],
        *,
        coalesce_key: str | None = None,
    ) -> EnqueueResult:
        """Add a queued row. With ``coalesce_key``, an identical **queued** row is returned instead.

        A running row never absorbs a new one: it is already reading its inputs, so a follow-up must run after it.
        Every caller, in any process, enqueues as ``queued``; only a drain makes a row RUNNING.
        """
        return self._write(self.enqueue_change(NewJob(kind, params, argv, coalesce_key)))

    def enqueue_change(self, job: NewJob) -> Callable[[sqlite3.Connection], EnqueueResult]:
        """``enqueue`` as a change, for ``write_group``."""

        def change(conn: sqlite3.Connection) -> EnqueueResult:
            job_id, coalesced = self._enqueue_in(conn, job)
            return EnqueueResult(self._get_in(conn, job_id), coalesced=coalesced)

        return change

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
        """Add several queued rows in one transaction (all or nothing), in order; coalescing as ``enqueue``.

        The answers carry no queue position (it would cost a count per row).
        """
        return self._write(self.enqueue_many_change(jobs))

    def enqueue_many_change(self, jobs: Sequence[NewJob]) -> Callable[[sqlite3.Connection], list[EnqueueResult]]:
        """``enqueue_many`` as a change, for ``write_group``."""

        def change(conn: sqlite3.Connection) -> list[EnqueueResult]:
            added = [self._enqueue_in(conn, job) for job in jobs]
            rows = {
                r["job_id"]: r
                for r in conn.execute(
                    f"SELECT {_COLUMNS} FROM jobs WHERE job_id IN ({','.join('?' * len(added))})",
                    [job_id for job_id, _ in added],
                )
            } if added else {}
            return [EnqueueResult(self._row_to_job(rows[job_id]), coalesced) for job_id, coalesced in added]

        return change

    def _enqueue_in(self, conn: sqlite3.Connection, job: NewJob) -> tuple[str, bool]:
        if job.coalesce_key is not None:
            row = conn.execute(
                "SELECT job_id FROM jobs WHERE status = 'queued' AND coalesce_key = ? ORDER BY seq LIMIT 1",
                (job.coalesce_key,),
            ).fetchone()
            if row is not None:
                return row["job_id"], True
        job_id = uuid.uuid4().hex
        conn.execute(
            "INSERT INTO jobs (job_id, kind, params, argv, status, created_at, coalesce_key) "
            "VALUES (?, ?, ?, ?, 'queued', ?, ?)",
            (
                job_id,
                job.kind,
                json.dumps(dict(job.params), sort_keys=True),
                json.dumps(list(job.argv)),
                self._now(),
                job.coalesce_key,
            ),
        )
        self._record_event(conn, job_id, "job.transition", None, "enqueued")
        return job_id, False

    def promote_queued_if_slot(
        self,
        max_concurrent: int,
        *,
        boot_id: str,
        token_hash: str,
        log_dir: Path | None = None,
    ) -> Job | None:
        """Flip the oldest queued row to RUNNING if a slot is free, and return it; else None."""
        promoted = self.promote_queued(max_concurrent, boot_id=boot_id, token_hashes=[token_hash], log_dir=log_dir)
        return promoted[0] if promoted else None

    def promote_queued(
        self,
        max_concurrent: int,
        *,
        boot_id: str,
        token_hashes: Sequence[str],
        log_dir: Path | None = None,
    ) -> list[Job]:
        """Flip the oldest queued rows to RUNNING, as many as slots are free (at most one per token), oldest first.

        INV-PROMOTION-NEVER-OVERSHOOTS: the count and the flips happen in one ``BEGIN IMMEDIATE`` transaction,
        so a concurrent drain (in this or another process) counts the rows at once. Each row gets this boot's
        ``boot_id`` and ``started_at`` in the same transaction, so a row promoted but not yet spawned is never
        mistaken for a prior-boot orphan (INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING).
        """
        return self._write(lambda conn: self._promote_in(conn, max_concurrent, boot_id, token_hashes, log_dir))

    def _promote_in(
        self,
        conn: sqlite3.Connection,
        max_concurrent: int,
        boot_id: str,
        token_hashes: Sequence[str],
        log_dir: Path | None,
    ) -> list[Job]:
        """``promote_queued`` in the caller's transaction (INV-PROMOTION-NEVER-OVERSHOOTS: count and flips in it)."""
        running = conn.execute("SELECT COUNT(*) FROM jobs WHERE status = 'running'").fetchone()[0]
        free = min(max_concurrent - running, len(token_hashes))
        if free <= 0:
            return []
        rows = conn.execute(
            f"SELECT {_COLUMNS} FROM jobs WHERE status = 'queued' ORDER BY seq LIMIT ?", (free,)
        ).fetchall()
        now = self._now()
        promoted: list[Job] = []
        for row, token_hash in zip(rows, token_hashes, strict=False):
            job = self._row_to_job(row)
            log_path = str(log_dir / f"{job.job_id}.log") if log_dir is not None else None
            fields: dict[str, Any] = {
                "started_at": now,
                "boot_id": boot_id,
                "token_hash": token_hash,
                "attempts": job.attempts + 1,
                "log_path": log_path,
                "pid": None,
                "pid_start_time": None,
                "kernel_boot_id": None,
                "container_id": None,
            }
            self._set_status(conn, job, JobStatus.RUNNING, **fields)
            promoted.append(replace(job, status=JobStatus.RUNNING, **fields))
        return promoted

    def set_job_process(
        self,
        job_id: str,
        *,
        pid: int | None = None,
        pid_start_time: int | None = None,
        kernel_boot_id: str | None = None,
        container_id: str | None = None,
    ) -> Job:
        """Record the spawned process's identity (pid + start time + kernel boot) or its container id."""
        return self.set_job_processes([ProcessRecord(job_id, pid, pid_start_time, kernel_boot_id, container_id)])[0]

    def set_job_processes(self, records: Sequence[ProcessRecord]) -> list[Job]:
        """Record several spawned processes' identities in one transaction; a row no longer RUNNING is left alone."""
        return self._write(self.set_job_processes_change(records))

    def set_job_processes_change(self, records: Sequence[ProcessRecord]) -> Callable[[sqlite3.Connection], list[Job]]:
        """``set_job_processes`` as a change, for ``write_group``."""

        def change(conn: sqlite3.Connection) -> list[Job]:
            out: list[Job] = []
            for rec in records:
                conn.execute(
                    "UPDATE jobs SET pid = ?, pid_start_time = ?, kernel_boot_id = ?, container_id = ? "
                    "WHERE job_id = ? AND status = 'running'",
                    (rec.pid, rec.pid_start_time, rec.kernel_boot_id, rec.container_id, rec.job_id),
                )
                out.append(self._get_in(conn, rec.job_id))
            return out

        return change

    def finalize(
        self,
        job_id: str,
        status: JobStatus | Callable[[Job], tuple[JobStatus, str | None]],
        *,
        reason: str | None = None,
        exit_code: int | None = None,
        expect_pid: int | None = None,
        expect_container_id: str | None = None,
    ) -> FinalizeResult:
        """End a row. A no-op on a terminal row; ``changed`` says whether anything happened.

        ``status`` may be a function of the current row returning (status, reason): it is called inside the
        transaction, so a decision that depends on the row (a cancel requested meanwhile) needs no separate read.
        ``expect_pid`` / ``expect_container_id``: only finalize if the row still records that pid / container
        (evidence gathered before the lock must still be about the same process).
        """
        return self._write(
            lambda conn: self._finalize_in(conn, job_id, status, reason, exit_code, expect_pid, expect_container_id)
        )

    def finalize_then_promote(
        self,
        job_id: str,
        status: JobStatus | Callable[[Job], tuple[JobStatus, str | None]],
        *,
        exit_code: int | None = None,
        promote: PromoteRequest | None,
    ) -> tuple[FinalizeResult, list[Job] | None]:
        """``finalize``, then (with ``promote``) ``promote_queued`` into the slot it freed: one transaction, one fsync.

        The promotion counts the running rows after the finalize, inside the same transaction
        (INV-PROMOTION-NEVER-OVERSHOOTS). It has its own savepoint: if it fails, only it is rolled back and the
        answer's promoted list is None (the finalize stands; a drain promotes later).
        """
        return self._write(self.finalize_then_promote_change(job_id, status, exit_code=exit_code, promote=promote))

    def finalize_then_promote_change(
        self,
        job_id: str,
        status: JobStatus | Callable[[Job], tuple[JobStatus, str | None]],
        *,
        exit_code: int | None = None,
        promote: PromoteRequest | None,
        unless_exists: Path | None = None,
    ) -> Callable[[sqlite3.Connection], tuple[FinalizeResult, list[Job] | None]]:
        """``finalize_then_promote`` as a change, for ``write_group``; ``unless_exists`` (the pause flag): no
        promotion while that file exists, looked at inside the transaction."""

        def change(conn: sqlite3.Connection) -> tuple[FinalizeResult, list[Job] | None]:
            result = self._finalize_in(conn, job_id, status, None, exit_code, None, None)
            return result, self._promote_after(conn, promote, unless_exists)

        return change

    def enqueue_then_promote_change(
        self, job: NewJob, *, promote: PromoteRequest, unless_exists: Path | None = None
    ) -> Callable[[sqlite3.Connection], tuple[EnqueueResult, list[Job] | None]]:
        """``enqueue``, then promote the oldest queued rows into free slots in the same transaction (as
        ``finalize_then_promote_change``): a job enqueued while a slot is free is RUNNING when the commit is."""
        enqueue = self.enqueue_change(job)

        def change(conn: sqlite3.Connection) -> tuple[EnqueueResult, list[Job] | None]:
            result = enqueue(conn)
            return result, self._promote_after(conn, promote, unless_exists)

        return change

    def _promote_after(
        self, conn: sqlite3.Connection, promote: PromoteRequest | None, unless_exists: Path | None
    ) -> list[Job] | None:
        """A promotion made in another change's transaction; [] when none was asked for or promotion is paused
        (``unless_exists``, looked at inside the transaction), None when it failed (the caller drains instead: the
        change it follows must not fail for it)."""
        if promote is None or (unless_exists is not None and unless_exists.exists()):
            return []
        conn.execute("SAVEPOINT promote")
        try:
            promoted: list[Job] | None = self._promote_in(
                conn, promote.max_concurrent, promote.boot_id, promote.token_hashes, promote.log_dir
            )
        except Exception:
            conn.execute("ROLLBACK TO promote")
            promoted = None
        conn.execute("RELEASE promote")
        return promoted

    def _finalize_in(
        self,
        conn: sqlite3.Connection,
        job_id: str,
        status: JobStatus | Callable[[Job], tuple[JobStatus, str | None]],
        reason: str | None,
        exit_code: int | None,
        expect_pid: int | None,
        expect_container_id: str | None,
    ) -> FinalizeResult:
        """``finalize`` inside the caller's transaction: ``status`` (a ``decide``) is called in it."""
        job = self._get_in(conn, job_id)
        if job.status.is_terminal:
            return FinalizeResult(job, changed=False)
        if expect_pid is not None and job.pid != expect_pid:
            return FinalizeResult(job, changed=False)
        if expect_container_id is not None and job.container_id != expect_container_id:
            return FinalizeResult(job, changed=False)
        final, why = status(job) if callable(status) else (status, reason)
        if final not in TERMINAL:
            raise ValueError(f"finalize needs a terminal status, not {final}")
        ended_at = self._now()
        self._set_status(conn, job, final, error_reason=why, exit_code=exit_code, ended_at=ended_at)
        return FinalizeResult(
            replace(
                job,
                status=final,
                error_reason=why,
                exit_code=exit_code,
                ended_at=ended_at,
                token_hash=None,
                queue_position=None,
            ),
            changed=True,
            previous=job.status,
        )

    def request_cancel(self, job_id: str) -> FinalizeResult:
        """Cancel a queued row at once; mark a running row ``cancel_requested``; leave a terminal row alone.

        ``changed`` is True when the row was modified.
        """
        def change(conn: sqlite3.Connection) -> FinalizeResult:
            job = self._get_in(conn, job_id)
            if job.status is JobStatus.QUEUED:
                self._set_status(
                    conn, job, JobStatus.CANCELLED, error_reason="cancelled_before_start", ended_at=self._now()
                )
                return FinalizeResult(self._get_in(conn, job_id), changed=True)
            if job.status is JobStatus.RUNNING and not job.cancel_requested:
                conn.execute("UPDATE jobs SET cancel_requested = 1 WHERE job_id = ?", (job_id,))
                return FinalizeResult(self._get_in(conn, job_id), changed=True)
            return FinalizeResult(job, changed=False)

        return self._write(change)

    def record_heartbeat(
        self,
        job_id: str,
        token: str,
        *,
        completed_units: int,
        total_units: int | None = None,
        stage: str | None = None,
    ) -> Job:
        """Record a child's heartbeat. ``completed_units`` is a watermark: progress moves only when it grows.

        Raises ``Unauthorized`` when the token is not this job's (or there is no such job: a caller without the
        token must not learn which ids exist), and ``Conflict`` when the job is not running (a stale child must
        not revive a finished row).
        """
        [result] = self.record_heartbeats([Beat(job_id, token, completed_units, total_units, stage)])
        if isinstance(result, RequestError):
            raise result
        return result

    def record_heartbeats(self, beats: Sequence[Beat]) -> list[Job | RequestError]:
        """Record several heartbeats in one transaction (one lock, one commit, one fsync), each as
        ``record_heartbeat`` would: per beat, the row after it, or the ``Unauthorized`` / ``Conflict`` it earned.

        A refused beat writes nothing (the checks come before its update), so it never costs the others theirs. Beats
        of one job are applied in the order given. A storage failure fails the whole batch (``RegistryError``).
        """
        results: list[Job | RequestError] = []
        with self._tx() as conn:
            now = self._now()
            for beat in beats:
                try:
                    job = self._authenticated(conn, beat.job_id, beat.token)
                    if job.status is not JobStatus.RUNNING:
                        raise Conflict(f"job {beat.job_id} is {job.status}, not running", field="job_id")
                except RequestError as exc:
                    results.append(exc)
                    continue
                # INV-PROGRESS-NOT-LIVENESS: every beat is liveness; only a higher watermark is progress.
                progressed = beat.completed_units > job.completed_units
                after = replace(
                    job,
                    last_heartbeat_at=now,
                    completed_units=max(beat.completed_units, job.completed_units),
                    total_units=job.total_units if beat.total_units is None else beat.total_units,
                    stage=job.stage if beat.stage is None else beat.stage,
                    last_progress_at=now if progressed else job.last_progress_at,
                )
                conn.execute(
                    "UPDATE jobs SET last_heartbeat_at = ?, completed_units = ?, total_units = ?, stage = ?, "
                    "last_progress_at = ? WHERE job_id = ?",
                    (
                        after.last_heartbeat_at,
                        after.completed_units,
                        after.total_units,
                        after.stage,
                        after.last_progress_at,
                        beat.job_id,
                    ),
                )
                results.append(after)
        return results

    def set_absence(
        self, job_id: str, *, stalled: bool, silent: bool, events: Sequence[tuple[str, str]] = ()
    ) -> FinalizeResult:
        """Record the sweeper's absence judgement of a RUNNING row (``stalled``, ``silent``) and its ``events``
        ((name, reason) pairs, written to the outbox in the same transaction).

        ``stalled_since`` is set when ``stalled`` turns on and cleared when it turns off. ``changed`` is False when
        the row is no longer running or already says so: a judgement that changes nothing writes nothing.
        """
        with self._tx() as conn:
            job = self._get_in(conn, job_id)
            if job.status is not JobStatus.RUNNING or (job.stalled, job.silent) == (stalled, silent):
                return FinalizeResult(job, changed=False)
            since = job.stalled_since if job.stalled and stalled else (self._now() if stalled else None)
            conn.execute(
                "UPDATE jobs SET stalled = ?, stalled_since = ?, silent = ? WHERE job_id = ? AND status = 'running'",
                (int(stalled), since, int(silent), job_id),
            )
            for event, reason in events:
                self._record_event(conn, job_id, event, str(job.status), reason)
            return FinalizeResult(
                replace(job, stalled=stalled, stalled_since=since, silent=silent), changed=True, previous=job.status
            )

    def record_event(self, job_id: str, event: str, reason: str | None) -> Job:
        """Write an event about a change the row does not show (this boot adopted the job), with the row as it is."""
        with self._tx() as conn:
            job = self._get_in(conn, job_id)
            self._record_event(conn, job_id, event, str(job.status), reason)
            return job

    # -- the outbox ---------------------------------------------------------------------------------

    def outbox_pending(self, limit: int) -> list[OutboxEvent]:
        """The oldest undelivered events, in the order they were written (so, per job, in the order of changes)."""
        rows = self._read(
            "SELECT seq, event_id, job_id, event, created_at, body FROM outbox ORDER BY seq LIMIT ?", (limit,)
        )
        return [OutboxEvent(**dict(row)) for row in rows]

    def outbox_delete(self, seqs: Sequence[int]) -> None:
        """Forget delivered events."""
        if not seqs:
            return
        with self._tx() as conn:
            conn.execute(f"DELETE FROM outbox WHERE seq IN ({','.join('?' * len(seqs))})", list(seqs))

    def outbox_depth(self) -> int:
        return int(self._read("SELECT COUNT(*) FROM outbox")[0][0])

    def outbox_prune(self, *, max_events: int, max_age_s: float) -> PruneResult:
        """Drop the events older than ``max_age_s`` and, past ``max_events``, the oldest. Reads first: a prune
        with nothing to drop takes no write lock."""
        cutoff = iso(self._clock() - timedelta(seconds=max_age_s))
        count, oldest = self._read("SELECT COUNT(*), MIN(created_at) FROM outbox")[0]
        if count <= max_events and (oldest is None or oldest >= cutoff):
            return PruneResult(0, 0)
        with self._tx() as conn:
            by_age = conn.execute("DELETE FROM outbox WHERE created_at < ?", (cutoff,)).rowcount
            excess = conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] - max_events
            by_count = 0
            if excess > 0:
                by_count = conn.execute(
                    "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox ORDER BY seq LIMIT ?)", (excess,)
                ).rowcount
            return PruneResult(by_age, by_count)

    def _authenticated(self, conn: sqlite3.Connection, job_id: str, token: str) -> Job:
        try:
            job = self._get_in(conn, job_id)
        except JobNotFound:
            raise Unauthorized("the token is not this job's") from None
        # Constant-time compare of the hashes; a missing hash never matches.
        if job.token_hash is None or not hmac.compare_digest(job.token_hash, hash_token(token)):
            raise Unauthorized("the token is not this job's")
        return job

    def check_job_token(self, job_id: str, token: str) -> None:
        """Raise ``Unauthorized`` unless ``token`` is the job's own."""
        with self._read_tx() as conn:
            self._authenticated(conn, job_id, token)

    # -- reads --------------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        with self._read_tx() as conn:
            return self._get_in(conn, job_id)

    @contextmanager
    def _read_tx(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot for reads that take more than one statement."""
        with self._pool.borrow() as conn:
            try:
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise RegistryError(f"registry read failed: {exc}") from exc

    def running_jobs(self) -> list[Job]:
        """Every RUNNING row (uses the status index: O(running rows))."""
        rows = self._read(f"SELECT {_COLUMNS} FROM jobs WHERE status = 'running' ORDER BY seq")
        return [self._row_to_job(r) for r in rows]

    def list_jobs(
        self,
        *,
        status: str | None = None,
        kind: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """Rows newest first, with an opaque cursor for the next page.

        Paging is by the insertion sequence, so rows added while a caller pages never shift or repeat a page.
        """
        if status is not None and status not in {s.value for s in JobStatus}:
            raise ValidationError(f"unknown status {status!r}", field="status")
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValidationError(f"limit must be between 1 and {MAX_LIST_LIMIT}", field="limit")
        before: int | None = None
        if cursor is not None:
            # A cursor is a row sequence number this server issued: ASCII digits that fit SQLite's INTEGER
            # (a larger number overflows inside sqlite3; int() also takes '1_0', '-3' and non-ASCII digits).
            if not CURSOR_PATTERN.fullmatch(cursor):
                raise ValidationError("cursor is not one this server issued", field="cursor")
            before = int(cursor)
        clauses: list[str] = []
        args: list[object] = []
        if status is not None:
            clauses.append("status = ?")
            args.append(status)
        if kind is not None:
            clauses.append("kind = ?")
            args.append(kind)
        if before is not None:
            clauses.append("seq < ?")
            args.append(before)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        with self._read_tx() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM jobs {where} ORDER BY seq DESC LIMIT ?", (*args, limit + 1)
            ).fetchall()
            page = rows[:limit]
            positions: dict[int, int] = {}
            queued_seqs = [r["seq"] for r in page if r["status"] == JobStatus.QUEUED]
            if queued_seqs:
                for r in conn.execute(
                    "SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) AS pos FROM jobs WHERE status = 'queued' "
                    "AND seq <= ?",
                    (max(queued_seqs),),
                ):
                    positions[r["seq"]] = r["pos"]
        jobs = [self._row_to_job(r, positions.get(r["seq"])) for r in page]
        next_cursor = str(page[-1]["seq"]) if len(rows) > limit else None
        return jobs, next_cursor

    def counts(self) -> dict[str, int]:
        """Rows per status (every status present, zero when none)."""
        out = {s.value: 0 for s in JobStatus}
        for row in self._read("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status"):
            out[row["status"]] = row["n"]
        return out
