"""What the PostgreSQL backend's own tests share besides their fixtures (a module name of its own: test modules
import it, and ``conftest`` is a name every test directory has)."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import trio_asyncio
from registry_helpers import postgres_test_url

from supervisor.registry import PostgresRegistry

OpenPg = Callable[..., Awaitable[PostgresRegistry]]


class Raw:
    """A plain asyncpg connection beside the registry (on trio-asyncio's loop): what another client does."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    async def execute(self, query: str, *args: Any) -> str:
        return str(await trio_asyncio.aio_as_trio(self.conn.execute)(query, *args))

    async def fetch(self, query: str, *args: Any) -> list[Any]:
        return list(await trio_asyncio.aio_as_trio(self.conn.fetch)(query, *args))

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await trio_asyncio.aio_as_trio(self.conn.fetchval)(query, *args)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a ``serve`` process's API)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def sql(query: str) -> list[Any]:
    """One statement on a session of its own, straight to the test server (asyncio side: wrap with aio_as_trio)."""
    conn = await asyncpg.connect(postgres_test_url(), timeout=10)
    try:
        return list(await conn.fetch(query))
    finally:
        await conn.close()
