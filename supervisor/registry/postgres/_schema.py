"""The PostgreSQL registry's schema: migrations as SQL files (``migrations/NNNN_name.sql``), applied in order.

Each migration runs in its own transaction together with its row in ``schema_migrations`` (version, name, when), so
a failure leaves the schema at the version before it, never half-migrated. Supervisors that start at once take
turns: each migration's transaction first takes a transaction-scoped advisory lock for this schema and reads the
version again under it. A script goes to the server whole (the simple query protocol runs every statement in it):
it is never split on ``;``. asyncio code, run on trio-asyncio's loop by ``_registry``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from ...domain import RegistryError
from .._sql import Migration, load_migrations

# The advisory lock namespaces (the first key of pg_advisory_xact_lock(int, int)); the second key is the schema's
# (``Keys``), so registries in different schemas of one database never wait on each other.
MIGRATE_LOCK = 0x706A6D31  # "pjm1"
PROMOTE_LOCK = 0x706A7031  # "pjp1"
COALESCE_LOCK = 0x706A6331  # "pjc1"
KEY_LOCK = 0x706A6B31  # "pjk1": the requests of one idempotency key take turns (ADR 0016)
LEADER_LOCK = 0x706A6C31  # "pjl1": host leases and the lead take turns (ADR 0012)


def migrations() -> list[Migration]:
    """Every migration shipped with this package, in order."""
    return load_migrations(__package__ or "")


SCHEMA_VERSION = len(migrations())


async def schema_version(conn: Any) -> int:
    """The schema's version (0: never migrated)."""
    exists = await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL")
    if not exists:
        return 0
    return int(await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"))


async def migrate(
    conn: Any, *, schema_key: int, where: str, begin: Callable[[Any], Awaitable[None]] | None = None
) -> int:
    """Bring the schema to ``SCHEMA_VERSION``; its version after. Refuses a schema newer than this code. ``begin``:
    what each transaction runs first (behind a transaction pooler: its settings)."""
    for migration in [None, *migrations()]:
        async with conn.transaction():
            if begin is not None:
                await begin(conn)
            # Taken first in each transaction: whoever comes second reads the version the first one left.
            await conn.execute("SELECT pg_advisory_xact_lock($1, $2)", MIGRATE_LOCK, schema_key)
            if migration is None:
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    "version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL)"
                )
                continue
            version = await schema_version(conn)
            if version > SCHEMA_VERSION:
                raise RegistryError(
                    f"registry {where} has schema version {version}, newer than this supervisor ({SCHEMA_VERSION})"
                )
            if version < migration.version:
                try:
                    # No arguments: the simple query protocol, which runs the whole script, statement by statement.
                    await conn.execute(migration.script)
                except asyncpg.PostgresError as exc:
                    raise RegistryError(f"registry {where}: migration {migration.name} failed: {exc}") from exc
                # The server's clock: when the schema changed is the database's own record, not a job's timestamp.
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, now())",
                    migration.version,
                    migration.name,
                )
    async with conn.transaction():
        if begin is not None:
            await begin(conn)
        return await schema_version(conn)
