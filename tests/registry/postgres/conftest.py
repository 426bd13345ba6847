"""Fixtures for the PostgreSQL backend's own tests (what the contract cannot say: its schema and migrations, its
timeouts and faults, a cancelled call, several registries on one schema). Every test module here is marked
``postgres``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import trio_asyncio
from pg_helpers import OpenPg, Raw
from registry_helpers import BOOT, WallClock, open_pooled, open_postgres, postgres_around, postgres_test_url

from supervisor.registry import PostgresRegistry


@pytest.fixture
def backend() -> str:
    """The contract fixtures (``registry``, ``open_registry``), if a test here asks for them: PostgreSQL only."""
    return "postgres"


@pytest.fixture
async def pg_open(clock: WallClock) -> AsyncIterator[OpenPg]:
    """Open PostgreSQL registries (a fresh schema each, unless ``schema=``; ``pooled=True``: through pgbouncer),
    closed and dropped after the test."""
    opened: list[PostgresRegistry] = []

    async def open_(**kwargs: Any) -> PostgresRegistry:
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("boot_id", BOOT)
        kwargs.setdefault("outbox", True)
        # pooled=True: through pgbouncer in transaction mode (the pgbouncer mark's tests).
        opener = open_pooled if kwargs.pop("pooled", False) else open_postgres
        reg = await opener(None, **kwargs)  # type: ignore[arg-type]
        opened.append(reg)
        return reg

    async with postgres_around():
        yield open_
        for reg in opened:
            await reg.aclose()


@pytest.fixture
async def raw(pg_open: OpenPg) -> AsyncIterator[Raw]:
    """A raw connection; ``pg_open`` first, so that it is closed before the loop it runs on."""
    conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(postgres_test_url(), timeout=10)
    try:
        yield Raw(conn)
    finally:
        await trio_asyncio.aio_as_trio(conn.close)()
