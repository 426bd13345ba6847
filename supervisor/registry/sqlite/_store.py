"""The SQLite registry's rows: the store port's one SQL text (``_sql.SqlStore``) on one connection, inside the
transaction that ``_store.SqliteFile`` runs it in. Blocking code, in worker threads only: its coroutines never
suspend (``_engine.run_now`` runs them there).

The rows' stored forms live here and nowhere else: timestamps as ISO 8601 text (``to_iso``, fixed width, so that
text order is time order), booleans as 0/1, JSON as text.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ...domain import from_iso, to_iso
from .._engine import LocalStore
from .._sql import SqlStore
from .._tables import BOOLEANS, TIMESTAMPS


class SqliteStore(LocalStore, SqlStore):
    """The store port on ``conn`` (see ``_tables.Store``)."""

    def __init__(self, conn: sqlite3.Connection, *, clock: Callable[[], datetime]) -> None:
        self.conn = conn
        self.clock = clock

    def mark(self, n: int) -> str:
        return "?"

    def encode(self, column: str, value: object) -> object:
        if isinstance(value, datetime):
            return to_iso(value)
        if isinstance(value, bool):
            return int(value)
        return super().encode(column, value)

    def decode(self, column: str, value: Any) -> Any:
        if value is not None and column in TIMESTAMPS:
            return from_iso(value)
        if column in BOOLEANS:
            return bool(value)
        return super().decode(column, value)

    async def fetch(self, sql: str, args: Sequence[object]) -> list[sqlite3.Row]:
        return self.conn.execute(sql, args).fetchall()

    async def execute(self, sql: str, args: Sequence[object]) -> int:
        return self.conn.execute(sql, args).rowcount

    async def execute_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self.conn.executemany(sql, rows)
