"""The registry: the single source of truth for every job row (``Registry``: each operation its rule, written once
for every backend, and its transaction in a ``Backend``; ``_registry`` lists them and the invariants they keep).

- ``sqlite``: one SQLite file, the embedded default (``SqliteRegistry``);
- ``postgres``: a PostgreSQL database (``PostgresRegistry``), chosen by ``PODCAST_JOB_DATABASE_URL``;
- ``memory``: a process's memory, for fast tests of the core (``MemoryRegistry``).

All pass one contract suite (``tests/registry/``). The backend is chosen once, here (``open_registry``); nothing
else knows which one it talks to. ``IdentityRecord`` (what ``Expect`` and ``IdentityClaim`` carry) and ``hash_token``
(how a ``PromoteRequest``'s token hashes are made from the tokens a job presents) are part of this interface too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from datetime import datetime

import trio

from ..domain import Config, IdentityRecord, hash_token, utc_now
from . import sqlite
from ._health import RegistryFault
from ._registry import Backend, Registry
from ._vocabulary import (
    PAUSED_BY_FILE,
    PAUSED_BY_OPERATOR,
    QUEUE_ANNOUNCED,
    SCHEDULE_TICK,
    WAKE_CANCEL,
    WAKE_FREED,
    WAKE_KINDS,
    WAKE_PAUSE,
    WAKE_QUEUED,
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
    Outcome,
    PauseState,
    PromoteRequest,
    Promotion,
    PrunedJob,
    PruneResult,
    Receipt,
    Retry,
    Wakeup,
    WakeupFeed,
    log_name,
)
from .memory import MemoryRegistry
from .postgres import PostgresRegistry
from .sqlite import SqliteRegistry

__all__ = [
    "PAUSED_BY_FILE",
    "PAUSED_BY_OPERATOR",
    "QUEUE_ANNOUNCED",
    "SCHEDULE_TICK",
    "WAKE_CANCEL",
    "WAKE_FREED",
    "WAKE_KINDS",
    "WAKE_PAUSE",
    "WAKE_QUEUED",
    "Backend",
    "Beat",
    "Change",
    "Ending",
    "EnqueueResult",
    "Expect",
    "FleetSetting",
    "Host",
    "IdentityClaim",
    "IdentityRecord",
    "Lease",
    "MemoryRegistry",
    "NewJob",
    "OutboxEvent",
    "Outcome",
    "PauseState",
    "PostgresRegistry",
    "PromoteRequest",
    "Promotion",
    "PruneResult",
    "PrunedJob",
    "Receipt",
    "Registry",
    "RegistryFault",
    "Retry",
    "SqliteRegistry",
    "Wakeup",
    "WakeupFeed",
    "hash_token",
    "log_name",
    "migrate_registry",
    "open_registry",
    "registry_runtime",
]


def registry_runtime(config: Config) -> AbstractAsyncContextManager[object]:
    """What must stay open on the Trio loop around the life of the registry ``config`` names (open it in the nursery
    tree before ``open_registry``, leave it after ``aclose``): trio-asyncio's loop for PostgreSQL, nothing for
    SQLite."""
    return PostgresRegistry.runtime() if config.database_url is not None else nullcontext()


async def open_registry(
    config: Config, *, boot_id: str | None, outbox: bool, clock: Callable[[], datetime] = utc_now
) -> Registry:
    """The registry ``config`` names, opened and migrated: the PostgreSQL database of ``database_url`` (inside
    ``registry_runtime``), else the SQLite file under the data dir. ``clock``: the wall clock it stamps rows with."""
    if config.database_url is not None:
        return await PostgresRegistry.open(
            config.database_url,
            boot_id=boot_id,
            outbox=outbox,
            timeout_s=config.database_timeout_s,
            migrate=config.database_auto_migrate,
            clock=clock,
            transaction_pooler=config.database_pooler == "transaction",
            listen_dsn=config.database_listen_url,
        )
    return await SqliteRegistry.open(
        config.registry_path,
        boot_id=boot_id,
        outbox=outbox,
        busy_timeout_ms=config.registry_busy_timeout_ms,
        clock=clock,
    )


async def migrate_registry(config: Config) -> tuple[str, int]:
    """Bring the registry ``config`` names up to date now, whatever ``database_auto_migrate`` says (``supervisor
    migrate``): its expands, then its contracts, each contract once no host holds it back (a ``RegistryError``
    naming those hosts: docs/fleet.md § Upgrading a fleet). Where it is and its schema version after. Inside
    ``registry_runtime``."""
    if config.database_url is not None:
        reg = await PostgresRegistry.open(
            config.database_url,
            timeout_s=config.database_timeout_s,
            migrate=True,
            transaction_pooler=config.database_pooler == "transaction",
        )
        try:
            return reg.where, await reg.migrate(contracts=True)
        finally:
            await reg.aclose()
    opened = await SqliteRegistry.open(config.registry_path)  # its expands: SQLite migrates its file at every open
    await opened.aclose()
    version = await trio.to_thread.run_sync(
        functools.partial(sqlite.migrate_file, config.registry_path, busy_timeout_ms=config.registry_busy_timeout_ms)
    )
    return str(config.registry_path), version
