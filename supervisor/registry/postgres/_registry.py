"""``PostgresRegistry``: the registry in a PostgreSQL database, behind the ``Registry`` interface; its transactions
and its SQL are ``_backend``'s, its wake-ups ``_listen``'s, its migrations ``_schema``'s.
"""

from __future__ import annotations

from typing import Any

import trio

from .._registry import Registry
from ._backend import PostgresBackend
from ._schema import CONTRACT_LEVEL


class PostgresRegistry(Registry):
    """The rules over a PostgreSQL database (see ``PostgresBackend`` for ``dsn`` and the rest); ``boot_id`` and
    ``outbox`` as ``Registry``'s."""

    contract_level = CONTRACT_LEVEL

    def __init__(self, dsn: str, *, boot_id: str | None = None, outbox: bool = True, **kwargs: Any) -> None:
        self.postgres = PostgresBackend(dsn, **kwargs)
        super().__init__(self.postgres, boot_id=boot_id, outbox=outbox)
        self.schema = self.postgres.schema
        self.transaction_pooler = self.postgres.transaction_pooler

    runtime = staticmethod(PostgresBackend.runtime)

    @classmethod
    async def open(cls, dsn: str, **kwargs: Any) -> PostgresRegistry:
        """Connect, and migrate (or check the schema's version); inside ``runtime()``."""
        reg = cls(dsn, **kwargs)
        try:
            await reg.postgres._start()
        except BaseException:
            with trio.CancelScope(shield=True):
                await reg.aclose()
            raise
        return reg

    async def migrate(self, *, contracts: bool = False) -> int:
        """Apply this release's missing migrations now (``contracts``: its contract migrations too, each once no host
        holds it back: ``supervisor migrate``); the schema's version after."""
        return await self.postgres.migrate(contracts=contracts)
