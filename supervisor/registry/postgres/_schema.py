"""The PostgreSQL registry's schema: migrations as SQL files (``migrations/NNNN_name.sql``), applied in order.

Each migration runs in its own transaction together with its row in ``schema_migrations`` (version, name, when), so
a failure leaves the schema at the version before it, never half-migrated. Supervisors that start at once take
turns: each migration's transaction first takes a transaction-scoped advisory lock for this schema and reads the
version again under it. A script goes to the server whole (the simple query protocol runs every statement in it):
it is never split on ``;``. asyncio code, run on trio-asyncio's loop by ``_registry``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import asyncpg

from ...domain import RELEASE, RegistryError
from .._sql import (
    CONTRACT,
    EXPAND,
    HostRecord,
    Migration,
    SchemaPlan,
    contract_level,
    contract_refused,
    held_back_by,
    level_of,
    load_migrations,
    plan,
    refuse_contracted,
    require_expanded,
)

# The advisory lock namespaces (the first key of pg_advisory_xact_lock(int, int)); the second key is the schema's
# (``Keys``), so registries in different schemas of one database never wait on each other.
MIGRATE_LOCK = 0x706A6D31  # "pjm1"
PROMOTE_LOCK = 0x706A7031  # "pjp1"
COALESCE_LOCK = 0x706A6331  # "pjc1"
KEY_LOCK = 0x706A6B31  # "pjk1": the requests of one idempotency key take turns (ADR 0016)
LEADER_LOCK = 0x706A6C31  # "pjl1": host leases and the lead take turns (ADR 0012)
SCHEMA_LOCK = 0x706A7331  # "pjs1": starters making the schema itself take turns
# "pjt1": starters of this release take turns migrating, holding it for all of it; not MIGRATE_LOCK, which a release
# before 1.1.0 waits for in a statement: its snapshot would hold up a concurrent index build under it (a deadlock).
TURN_LOCK = 0x706A7431


_CONCURRENTLY = re.compile(r"\bCONCURRENTLY\b", re.IGNORECASE)
TURN_POLL_S = 0.05  # how often a session waiting for the migrations' lock tries it again


def migrations() -> list[Migration]:
    """Every migration shipped with this package, in order."""
    return load_migrations(__package__ or "")


SCHEMA_VERSION = max(m.version for m in migrations())
CONTRACT_LEVEL = contract_level(migrations())  # what this release honours (recorded with each host's lease)


async def schema_version(conn: Any) -> int:
    """The schema's version: the highest migration applied (0: never migrated)."""
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return 0
    return int(await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"))


async def applied(conn: Any) -> dict[int, str]:
    """Each migration applied, by number: its phase (a schema migrated by a release before 1.0.0 recorded none: each
    of its migrations was an expand)."""
    if not await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        return {}
    phased = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'schema_migrations'::regclass "
        "AND attname = 'phase' AND NOT attisdropped)"
    )
    rows = await conn.fetch(f"SELECT version, {'phase' if phased else repr(EXPAND)} FROM schema_migrations")
    return {int(version): str(phase) for version, phase in rows}


async def schema_plan(conn: Any) -> SchemaPlan:
    return plan(migrations(), await applied(conn))


async def _hosts(conn: Any) -> list[HostRecord]:
    if not await conn.fetchval("SELECT to_regclass('hosts') IS NOT NULL"):
        return []
    recorded = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'hosts'::regclass "
        "AND attname = 'contract_level' AND NOT attisdropped)"
    )
    rows = await conn.fetch(
        f"SELECT host_id, {'release_version, contract_level' if recorded else 'NULL, NULL'}, "
        "lease_expires_at > clock_timestamp(), (SELECT COUNT(*) FROM jobs WHERE jobs.host_id = hosts.host_id "
        "AND jobs.status = 'running') FROM hosts"
    )
    return [HostRecord(row[0], row[1], row[2], bool(row[3]), int(row[4])) for row in rows]


async def _run(conn: Any, migration: Migration, where: str) -> None:
    try:
        # No arguments: the simple query protocol, which runs the whole script, statement by statement.
        await conn.execute(migration.script)
    except asyncpg.PostgresError as exc:
        raise RegistryError(f"registry {where}: migration {migration.name} failed: {exc}") from exc


async def _record(conn: Any, migration: Migration) -> None:
    # The server's clock: when the schema changed is the database's own record, not a job's timestamp.
    await conn.execute(
        "INSERT INTO schema_migrations (version, name, applied_at, phase) VALUES ($1, $2, now(), $3) "
        "ON CONFLICT (version) DO NOTHING",
        migration.version,
        migration.name,
        migration.phase,
    )


async def _apply_alone(conn: Any, migration: Migration, *, where: str) -> None:
    """A migration outside any transaction (CREATE INDEX CONCURRENTLY: writes go on while it builds). Its script is
    idempotent (``IF NOT EXISTS``), and an expand only."""
    if migration.phase == CONTRACT:
        raise RegistryError(f"migration {migration.name}: a contract runs in a transaction")
    if migration.version not in await applied(conn):
        await _run(conn, migration, where)
        await _record(conn, migration)


async def take_turn(conn: Any, schema_key: int) -> None:
    """This release's turn to migrate, for this session, taken by trying, never by waiting in a statement: a session
    waiting on a lock holds a snapshot, and CREATE INDEX CONCURRENTLY in the holder waits for every older snapshot to
    end (a deadlock). Each transactional migration also takes MIGRATE_LOCK for itself, as every release does. Bounded
    by the caller's timeout."""
    while True:
        if await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", TURN_LOCK, schema_key):
            return
        await asyncio.sleep(TURN_POLL_S)


async def migrate(
    conn: Any,
    *,
    schema_key: int,
    where: str,
    begin: Callable[[Any], Awaitable[None]] | None = None,
    contracts: bool = False,
) -> int:
    """Apply this release's migrations not yet applied, in order, each once (``schema_migrations`` records each one
    and its phase); its version after. A new schema takes them all; an existing one the expands up to the first
    contract migration, which waits for ``contracts`` (``supervisor migrate``) and for every host to honour it
    (INV-CONTRACT-AFTER-FLEET). A schema a newer release contracted is refused (``SchemaNotHonoured``); one it only
    expanded is used as it is. ``begin``: what each transaction runs first (behind a transaction pooler: its
    settings)."""
    if begin is None:
        # A session of PostgreSQL's own: one migrating session at a time, for the whole of it (what a migration
        # outside a transaction needs). Behind a transaction pooler a session lock cannot be held: each transaction
        # takes the lock below instead, and a migration outside a transaction runs without it (idempotent).
        await take_turn(conn, schema_key)
        try:
            return await _migrate(conn, schema_key=schema_key, where=where, begin=begin, contracts=contracts)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1, $2)", TURN_LOCK, schema_key)
    return await _migrate(conn, schema_key=schema_key, where=where, begin=begin, contracts=contracts)


async def _migrate(
    conn: Any,
    *,
    schema_key: int,
    where: str,
    begin: Callable[[Any], Awaitable[None]] | None,
    contracts: bool,
) -> int:
    known = migrations()
    async with conn.transaction():
        if begin is not None:
            await begin(conn)
        # Taken first in each transaction: whoever comes second reads what the first one left.
        await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", MIGRATE_LOCK, schema_key)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            "version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL)"
        )
        await conn.execute(
            f"ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS phase text NOT NULL DEFAULT '{EXPAND}'"
        )
        schema = await schema_plan(conn)
    refuse_contracted(schema, where, RELEASE)
    for migration in schema.next_batch(contracts=contracts):
        pooled_alone = not migration.transactional and begin is not None
        if pooled_alone:
            # Behind a transaction pooler a statement outside a transaction has no schema of its own (each transaction
            # sets it). With no job rows there is nothing to keep writing meanwhile: built in a transaction, at once.
            migration = replace(migration, script=_CONCURRENTLY.sub("", migration.script), transactional=True)
        if not migration.transactional:
            await _apply_alone(conn, migration, where=where)
            continue
        async with conn.transaction():
            if begin is not None:
                await begin(conn)
            await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", MIGRATE_LOCK, schema_key)
            if migration.version in await applied(conn):
                continue
            if pooled_alone and await conn.fetchval("SELECT EXISTS (SELECT 1 FROM jobs)"):
                raise RegistryError(
                    f"registry {where}: migration {migration.name} runs outside a transaction, which a pooler in "
                    "transaction mode cannot give: run `supervisor migrate` with PODCAST_JOB_DATABASE_URL naming "
                    "PostgreSQL itself (docs/fleet.md § Upgrading a fleet)"
                )
            if migration.phase == CONTRACT:
                # Under the leases' lock too: no host registers between this judgement and the contract's commit.
                await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", LEADER_LOCK, schema_key)
                level = level_of(known, migration)
                holders = held_back_by(await _hosts(conn), level)
                if holders:
                    raise contract_refused(migration, level, holders, where)
            await _run(conn, migration, where)
            await _record(conn, migration)
    async with conn.transaction():
        if begin is not None:
            await begin(conn)
        require_expanded(await schema_plan(conn), where)
        return await schema_version(conn)
