"""The PostgreSQL registry's transactions, and its SQL dialect: what runs between a ``Registry`` operation and asyncpg.

asyncpg, driven from Trio through trio-asyncio: every call hands its work to the asyncio loop that
``trio_asyncio.open_loop()`` runs (``PostgresRegistry.runtime()``; it must stay open around the registry's whole
life), so nothing blocks the Trio loop. A pool of at most ``max_connections`` connections serves the calls
(``PostgresBackend``).

Every call is one transaction, bounded by ``timeout_s`` from the moment it asks for a connection to its commit
(``trio.fail_after`` at this boundary: the steps inside take no timeout of their own). A call that runs out raises
``RegistryUnavailable``, as does one whose connection or server fails in a way that may pass (a refused or lost
connection, a server shutting down, a deadlock, a full disk); the health route then shows ``fault()``.

Cancellation-safe: a call cancelled at any await (its deadline, a shutdown) never leaves a transaction open or a
connection checked out. The connection it held is closed at once, with no round trip to a server that may not
answer, and goes back to the pool (which opens a fresh one when needed); the server rolls back the closed session's
transaction and releases its advisory locks. A call refused on its own merits (not found, unauthorized...) rolls
back and keeps its connection.

The rows (``PostgresStore``): the store port's one SQL text (``_sql.SqlStore``) on one asyncpg connection, inside
that transaction (READ COMMITTED for a write: each statement sees what committed before it began, which the
promotion relies on; one REPEATABLE READ snapshot for a read). Concurrency, with no registry-wide write lock
(several supervisors may share the database): a write that reads a row to decide its change locks it first (``FOR
UPDATE``); promotions take turns under a transaction-scoped advisory lock, so do enqueues of one coalescing key or
one idempotency key, and the leases and the lead (ADR 0012). The changes other hosts of a fleet may act on also
send a wake-up (``notify``: ``pg_notify`` in the change's transaction, so it is delivered on commit and never for a
rolled-back change); INV-NOTIFY-IS-A-HINT: whoever hears one re-reads what it acts on. Timestamps are
``timestamptz`` (aware ``datetime``s both ways); params, argv, the identity record and the history are JSON text,
as in the SQLite registry.
"""

from __future__ import annotations

import functools
import json
import math
import urllib.parse
import zlib
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg
import trio
import trio_asyncio

from ...domain import RELEASE, RegistryError, RegistryUnavailable, SupervisorError, redacted_url, utc_now
from .._health import RegistryFault, WriteHealth
from .._registry import Step
from .._sql import Reader, SqlStore, refuse_contracted, require_expanded
from .._tables import COALESCE_LOCK, KEY_LOCK, LEASES, PROMOTION, TIMESTAMPS
from .._vocabulary import Wakeup, WakeupFeed
from ._listen import encode_wakeup, listening, wakeup_channel
from ._schema import COALESCE_LOCK as COALESCE_ADVISORY_LOCK
from ._schema import KEY_LOCK as KEY_ADVISORY_LOCK
from ._schema import LEADER_LOCK, PROMOTE_LOCK, SCHEMA_LOCK, migrate, migrations, schema_plan

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0  # as the SQLite registry's busy timeout
DEFAULT_CONNECTIONS = 8
APPLICATION_NAME = "podcast-job-supervisor"  # how the registry's sessions show in pg_stat_activity

# SQLSTATE classes that say "not now" rather than "never": a connection exception (08), insufficient resources
# (53: a full disk, too many connections), operator intervention (57: a shutdown, a cancelled statement), a system
# error (58: I/O), a transaction rolled back by the server (40: a deadlock, a serialization failure); and a lock not
# available (55P03) or a read-only transaction (25006: a standby after a failover).
_UNAVAILABLE_CLASSES = ("08", "53", "57", "58", "40")
_UNAVAILABLE_STATES = frozenset({"55P03", "25006"})


def redacted(dsn: str) -> str:
    """The DSN without its password: what logs and errors may show."""
    return redacted_url(dsn)


def failure(exc: BaseException, what: str) -> RegistryError:
    """The registry's error for a failed database call: ``RegistryUnavailable`` when the same call may succeed later
    (the caller retries, or answers 503), else ``RegistryError``. The cause is chained by the caller's ``from``."""
    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        if state[:2] in _UNAVAILABLE_CLASSES or state in _UNAVAILABLE_STATES:
            return RegistryUnavailable(f"{what}: {exc}")
        return RegistryError(f"{what}: {exc}")
    # No answer at all: a refused or reset connection, a connect timeout, a connection asyncpg found closed.
    return RegistryUnavailable(f"{what}: {type(exc).__name__}: {exc}")


# What a database call raises when the server or the connection fails (InternalClientError: a connection in a state
# asyncpg did not expect, as after the server ended the session; OSError includes TimeoutError).
_DATABASE_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)


def _lock_key(name: str) -> int:
    """A schema's advisory lock key: a signed 32-bit number from its name (a collision only makes two schemas'
    promotions take turns)."""
    key = zlib.crc32(name.encode())
    return key - 2**32 if key >= 2**31 else key


def _without_search_path(dsn: str) -> tuple[str, str | None]:
    """``dsn`` without its ``search_path`` query parameter, and that parameter's value (None: it had none)."""
    parts = urllib.parse.urlsplit(dsn)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    found = [value for name, value in query if name == "search_path"]
    if not found:
        return dsn, None
    kept = urllib.parse.urlencode([(name, value) for name, value in query if name != "search_path"])
    return urllib.parse.urlunsplit(parts._replace(query=kept)), found[-1]


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _keep(conn: Any) -> None:
    """The pool's reset between two calls: nothing. A call leaves no session state -- its locks are its transaction's,
    and a connection left in a transaction is closed, never returned -- so the default reset query (a round trip) has
    nothing to undo."""


async def _session(conn: Any) -> None:
    """Each new connection: from PostgreSQL 14 on, the server looks every second whether the client is still there
    while a statement runs (a statement waiting on a lock for a client that gave up is ended, not left to finish)."""
    if conn.get_server_version().major >= 14:
        await conn.execute("SET client_connection_check_interval = 1000")


class PostgresBackend:
    """Job rows in a PostgreSQL database, for the rules: see the module docstring.

    ``dsn``: a ``postgresql://`` URL. ``schema``: the schema to keep the tables in (made when missing; None: the
    first of the connection's search path). ``clock``: as ``SqliteRegistry``'s, but the
    hosts' leases are written and judged at the database server's clock, one for the whole fleet (``lease_clock``
    stands in for it in tests; INV-LEASE-ON-REGISTRY-CLOCK).
    ``timeout_s``: the bound of every call. ``migrate``: bring the schema up to date at open (False: refuse one
    that is not, and let ``supervisor migrate`` do it). ``application_name``: how its pooled sessions show in
    ``pg_stat_activity`` (1-63 printable ASCII characters). ``transaction_pooler``: ``dsn`` names a pooler in
    transaction mode (pgbouncer's ``pool_mode = transaction``), which hands each transaction whatever server session
    is free: no statement is prepared by name, no setting is sent at connection start or set for a session (each
    transaction sets its own), and nothing is LISTENed to there. ``listen_dsn``: where ``listen`` opens its session
    instead of ``dsn`` (PostgreSQL itself, or a pooler in session mode); None behind a transaction pooler: no feed
    (the sweeps move the fleet).
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        clock: Callable[[], datetime] = utc_now,
        lease_clock: Callable[[], datetime] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int = DEFAULT_CONNECTIONS,
        migrate: bool = True,
        application_name: str = APPLICATION_NAME,
        transaction_pooler: bool = False,
        listen_dsn: str | None = None,
    ) -> None:
        if not (0 < len(application_name) <= 63 and application_name.isascii() and application_name.isprintable()):
            raise ValueError(f"application_name must be 1-63 printable ASCII characters, not {application_name!r}")
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"a PostgreSQL registry needs a postgresql:// URL, not {redacted(dsn)!r}")
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
        if max_connections < 1:
            raise ValueError("a PostgreSQL registry needs at least one connection")
        if schema is not None and not schema:
            raise ValueError("schema must be a name, or None for the search path's")
        # Behind a transaction pooler the search_path an operator put in the URL cannot go at connection start (it
        # is refused): each transaction sets it instead.
        self._dsn, self._dsn_search_path = _without_search_path(dsn) if transaction_pooler else (dsn, None)
        self.schema = schema
        self.where = redacted(dsn) + (f" (schema {schema})" if schema else "")
        self.timeout_s = float(timeout_s)
        self.max_connections = max_connections
        self._migrate = migrate
        self.application_name = application_name
        self.transaction_pooler = transaction_pooler
        self._listen_dsn = listen_dsn
        self._local_settings: dict[str, str] = {}  # set by each transaction behind a pooler (``_begin``)
        self._local_settings_query = ""
        self.clock = clock
        self.lease_clock = lease_clock
        self.schema_key = 0  # this schema's advisory lock key, once known (``_start``)
        self.channel: str | None = None  # this schema's wake-up channel (``wakeup_channel``), set with the key
        self._health = WriteHealth(self.where, clock)
        self._pool: Any = None
        self._closed = False

    @staticmethod
    def runtime() -> AbstractAsyncContextManager[Any]:
        """What must stay open on the Trio loop around every registry of this kind: the asyncio loop asyncpg runs
        on (trio-asyncio's). Open it in the nursery tree, around the registry's whole life."""
        return trio_asyncio.open_loop()

    def _settings(self) -> dict[str, str]:
        """What every transaction of this registry runs under (a pooler's: set by each transaction itself)."""
        settings = {
            # A session that stops talking mid-transaction (its client partitioned away) is ended by the server, its
            # locks with it: a transaction of this registry never idles longer than one round trip.
            "idle_in_transaction_session_timeout": str(max(1, round(self.timeout_s * 1000))),
        }
        if self.schema is not None:
            settings["search_path"] = _quote_ident(self.schema)
        elif self._dsn_search_path is not None:
            settings["search_path"] = self._dsn_search_path
        return settings

    async def _begin(self, conn: Any) -> None:
        """The start of each transaction behind a transaction pooler: this transaction's settings, which end with it
        (``set_config(..., true)``), on whichever server session the pooler gave it."""
        if self._local_settings:
            await conn.execute(self._local_settings_query, *self._local_settings.values())

    async def _start(self) -> None:
        settings = {"application_name": self.application_name}
        pooled: dict[str, Any] = {}
        if self.transaction_pooler:
            # Only application_name at startup (a pooler refuses the others); the rest set by each transaction.
            self._local_settings = self._settings()
            names = ", ".join(f"set_config('{name}', ${i}, true)" for i, name in enumerate(self._local_settings, 1))
            self._local_settings_query = f"SELECT {names}"
            # Statements unnamed, never cached by name: the next transaction may run on another server session.
            pooled = {"statement_cache_size": 0}
        else:
            settings.update(self._settings())
            pooled = {"init": _session}
        connect = functools.partial(
            asyncpg.create_pool,
            self._dsn,
            # No floor: asyncpg (0.32) keeps one by reconnecting in a task of its own, outside every call's bound, and
            # logs each failed attempt with its traceback through the standard logging (lines that are not this
            # process's JSON) while the server is down. Every call here connects when it needs to, under its bound.
            min_size=0,
            max_size=self.max_connections,
            timeout=self.timeout_s,  # the connect timeout of each new connection
            reset=_keep,
            server_settings=settings,
            **pooled,
        )
        self._pool = await self._boundary(connect, "cannot connect to")
        try:
            await self._boundary(self._first_connection, "cannot connect to")  # a server that is not there: said now
        except RegistryUnavailable as exc:
            if "unsupported startup parameter" in str(exc) and not self.transaction_pooler:
                # pgbouncer's word for a setting sent at connection start: it will refuse every connection alike.
                raise RegistryError(
                    f"{exc} (a connection pooler in transaction mode? it refuses the settings a connection starts "
                    "with: set PODCAST_JOB_DATABASE_POOLER=transaction)"
                ) from exc
            raise
        schema = self.schema or await self._transaction(lambda conn: conn.fetchval("SELECT current_schema()"))
        if schema is None:
            raise RegistryError(f"registry {self.where}: the connection's search_path names no schema that exists")
        self.schema_key = _lock_key(schema)
        self.channel = wakeup_channel(schema)
        if self.schema is not None:
            await self._transaction(self._create_schema)
        if self._migrate:
            await self.migrate()
            return
        # Automatic migration off: only a look. A newer release's contract refuses this one; its expands do not.
        found = await self._transaction(schema_plan)
        refuse_contracted(found, self.where, RELEASE)
        try:
            require_expanded(found, self.where)
        except RegistryError as exc:
            raise RegistryError(f"{exc} (automatic migration is off)") from exc

    async def _first_connection(self) -> None:
        conn = await self._pool.acquire()
        await self._pool.release(conn)

    async def _create_schema(self, conn: Any) -> None:
        # A lock of its own, not the migrations': a starter migrating holds theirs for as long as its migrations take.
        await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", SCHEMA_LOCK, self.schema_key)
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote_ident(self.schema or '')}")

    async def migrate(self, *, contracts: bool = False) -> int:
        """Apply this release's missing migrations now (at open, the expands; ``supervisor migrate``, ``contracts``
        too, each once no host holds it back); the schema's version after."""

        async def migrate_now(conn: Any) -> int:
            # ``begin`` only behind a transaction pooler: its absence is what says the session is PostgreSQL's own
            # (the migrations then take turns on a lock the session holds).
            begin = self._begin if self.transaction_pooler else None
            return await migrate(conn, schema_key=self.schema_key, where=self.where, begin=begin, contracts=contracts)

        # One transaction per migration, which migrate() opens itself; each step under the call's bound.
        # Not a write the health route speaks of: a migration that fails ends the start (or `supervisor migrate`).
        bound = self.timeout_s * (len(migrations()) + 2)
        return await self._transaction(migrate_now, tx=False, timeout_s=bound, report=False)

    # -- the boundary between Trio and asyncpg ----------------------------------------------------------

    async def _boundary(self, work: Callable[[], Awaitable[T]], what: str, *, timeout_s: float | None = None) -> T:
        """Run ``work`` on the asyncio loop under the call's deadline; database failures become registry errors."""
        bound = self.timeout_s if timeout_s is None else timeout_s
        try:
            with trio.fail_after(bound):
                result: T = await trio_asyncio.aio_as_trio(work)()
                return result
        except trio.TooSlowError as exc:
            raise RegistryUnavailable(f"{what} registry {self.where}: no answer within {bound:g} s") from exc
        except _DATABASE_ERRORS as exc:
            raise failure(exc, f"{what} registry {self.where}") from exc

    async def _transaction(
        self,
        work: Callable[[Any], Awaitable[T]],
        *,
        write: bool = True,
        tx: bool = True,
        timeout_s: float | None = None,
        report: bool = True,
    ) -> T:
        """``work`` in one transaction on a pooled connection: READ COMMITTED for a write (the promotion relies on
        it: ``_jobs.promote_rows``), one REPEATABLE READ snapshot for a read. ``tx=False``: ``work`` makes its
        own transactions (the migrations)."""
        if self._closed or self._pool is None:
            raise RegistryError(f"registry {self.where} is closed")
        pool = self._pool

        async def run() -> T:
            conn = await pool.acquire()
            try:
                if not tx:
                    return await work(conn)
                transaction = conn.transaction(
                    isolation="read_committed" if write else "repeatable_read", readonly=not write
                )
                await transaction.start()
                try:
                    await self._begin(conn)
                    result = await work(conn)
                except Exception:
                    # Refused (a domain error, a failed statement): undone, a round trip under the same deadline.
                    await transaction.rollback()
                    raise
                await transaction.commit()
                return result
            except BaseException as exc:
                # Cancelled (a deadline, a shutdown), the connection broke, or anything but a refusal the server
                # answered cleanly: close the connection without waiting on the server again (the pool opens a fresh
                # one). The closed session's transaction and advisory locks end with it, on the server.
                refused = isinstance(exc, SupervisorError | asyncpg.PostgresError)
                if not refused or conn.is_closed() or conn.is_in_transaction():
                    conn.terminate()
                raise
            finally:
                await pool.release(conn)

        what = "cannot write" if write else "cannot read"
        if not (write and report):  # ``report``: a write the health route speaks of (not a migration)
            return await self._boundary(run, what, timeout_s=timeout_s)
        try:
            result = await self._boundary(run, what, timeout_s=timeout_s)
        except RegistryError as exc:
            self._health.failed(exc)
            raise
        except SupervisorError:
            self._health.succeeded()  # refused on its own merits: the database answered
            raise
        self._health.succeeded()
        return result

    def fault(self) -> RegistryFault | None:
        return self._health.fault

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]:
        """A session of its own (outside the pool: ``_listen``) that LISTENs on this schema's channel, on which the
        writes that other hosts may act on send their wake-ups when they commit (``PostgresStore.notify``), on
        ``listen_dsn`` if given. Behind a pooler in transaction mode without one, nothing (None): no session of its
        own would stay this client's between statements there."""
        if self._closed or self.channel is None:
            raise RegistryError(f"registry {self.where} is closed")
        if self._listen_dsn is not None:
            where = redacted(self._listen_dsn)
            return listening(self._listen_dsn, self.channel, where=where, timeout_s=self.timeout_s)
        if self.transaction_pooler:
            return nullcontext(None)
        return listening(self._dsn, self.channel, where=self.where, timeout_s=self.timeout_s)

    # -- the rules' transactions ---------------------------------------------------------------------------

    def _store(self, conn: Any) -> PostgresStore:
        return PostgresStore(
            conn,
            clock=self.clock,
            lease_clock=self.lease_clock,
            schema_key=self.schema_key,
            channel=self.channel,
        )

    async def write(self, step: Step[T]) -> T:
        return await self._transaction(lambda conn: step(self._store(conn)))

    async def read(self, step: Step[T]) -> T:
        return await self._transaction(lambda conn: step(self._store(conn)), write=False)

    async def aclose(self) -> None:
        """Close the pool: gracefully within the timeout, else at once (a server that does not answer)."""
        self._closed = True
        pool, self._pool = self._pool, None
        if pool is None:
            return
        with trio.move_on_after(self.timeout_s) as waited:
            try:
                await trio_asyncio.aio_as_trio(pool.close)()
            except _DATABASE_ERRORS:
                pool.terminate()
        if waited.cancelled_caught:
            pool.terminate()


# -- the store port as PostgreSQL's SQL -----------------------------------------------------------------------


def _count(status: str) -> int:
    """The row count of a command's status (``DELETE 3``)."""
    return int(status.rsplit(" ", 1)[-1])


# Each named lock of the store port (``_tables``) as a transaction-scoped advisory lock of this schema's.
_LOCKS = {
    PROMOTION: PROMOTE_LOCK,
    LEASES: LEADER_LOCK,
    KEY_LOCK: KEY_ADVISORY_LOCK,
    COALESCE_LOCK: COALESCE_ADVISORY_LOCK,
}


class PostgresStore(SqlStore):
    """The store port on ``conn`` (see ``_tables.Store``). ``clock``: the rows' wall clock; ``lease_clock``: the
    leases' (None: the database server's); ``schema_key``: this schema's advisory lock key; ``channel``: its wake-up
    channel."""

    def __init__(
        self,
        conn: Any,
        *,
        clock: Callable[[], datetime],
        lease_clock: Callable[[], datetime] | None,
        schema_key: int,
        channel: str | None,
    ) -> None:
        self.conn = conn
        self.clock = clock
        self.lease_clock = lease_clock
        self.schema_key = schema_key
        self.channel = channel

    def now(self) -> datetime:
        """The clock's time in UTC (a naive time is refused, as the other registries refuse it)."""
        return _utc_of(self.clock(), "clock")

    async def lease_now(self) -> datetime:
        """The time every lease is written and judged by: the database server's clock, one for every host of the
        fleet (INV-LEASE-ON-REGISTRY-CLOCK): hosts whose own clocks disagree still agree on whose lease holds. Read
        at the moment of the call (``clock_timestamp()``, not the transaction's start: a renewal may have waited for
        the leases' lock). A test's ``lease_clock`` stands in for it."""
        if self.lease_clock is not None:
            return _utc_of(self.lease_clock(), "lease clock")
        now = await self.conn.fetchval("SELECT clock_timestamp()")
        assert isinstance(now, datetime)
        return now.astimezone(UTC)

    async def lock(self, name: str, key: str | None = None) -> None:
        """A transaction-scoped advisory lock of this schema's (released at commit or rollback). Promotions take
        turns under one (INV-PROMOTION-NEVER-OVERSHOOTS: the count that follows is a statement begun after the lock
        is held, so under READ COMMITTED it sees every promotion committed before), so do the leases and the lead,
        and the enqueues of one coalescing key or one idempotency key (``key``)."""
        if key is None:
            await self.conn.execute("SELECT pg_advisory_xact_lock($1, $2)", _LOCKS[name], self.schema_key)
        else:
            sql = "SELECT pg_advisory_xact_lock($1, hashtext($2))"
            await self.conn.execute(sql, _LOCKS[name], f"{self.schema_key}/{key}")

    def mark(self, n: int) -> str:
        return f"${n}"

    def reader(self, column: str) -> Reader | None:
        return _utc if column in TIMESTAMPS else super().reader(column)

    def json_equals(self, column: str, key: str, value: object, args: list[object]) -> str:
        # Containment compares as jsonb does: a number as a number (1e-05 is 0.00001, 2 is 2.0, whatever spelling
        # the server stored), a string or a bool as itself; the GIN index on the params' jsonb answers it.
        args.append(json.dumps({key: value}))
        return f"({column})::jsonb @> {self.mark(len(args))}::jsonb"

    def locking(self, skip_locked: bool) -> str:
        return " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE"

    async def fetch(self, sql: str, args: Sequence[object]) -> Sequence[Sequence[Any]]:
        rows: Sequence[Sequence[Any]] = await self.conn.fetch(sql, *args)
        return rows

    async def execute(self, sql: str, args: Sequence[object]) -> int:
        return _count(await self.conn.execute(sql, *args))

    async def execute_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        await self.conn.executemany(sql, rows)

    async def notify(self, wake: Wakeup) -> None:
        """A wake-up on this schema's channel, in the caller's transaction: delivered when it commits, never when it
        rolls back (the same one sent twice in one transaction is delivered once: the server folds them)."""
        if self.channel is not None:
            await self.conn.execute("SELECT pg_notify($1, $2)", self.channel, encode_wakeup(wake))


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def _utc_of(now: datetime, which: str) -> datetime:
    if now.tzinfo is None:
        raise ValueError(f"the registry's {which} gave a naive datetime: {now!r}")
    return now.astimezone(UTC)
