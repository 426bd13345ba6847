"""What the PostgreSQL backend's own tests share besides their fixtures (a module name of its own: test modules
import it, and ``conftest`` is a name every test directory has)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio_asyncio

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
