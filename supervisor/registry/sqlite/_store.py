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
from .._tables import BOOLEANS, EVERY, JOBS, TIMESTAMPS, Read, Where

# A time filter of the job list (its column, and the index that holds it in time order, migrations 7 and 14). The
# list is read newest first by seq; SQLite keeps no statistics of a range, so it walks seq and tests the time, which
# reads the whole history when few rows or none are in the range. Where at most ``NARROW_RANGE_ROWS`` are (a count
# that stops there, on the index), they are read from the index and sorted instead.
TIME_INDEXES = {"created_at": "jobs_created", "ended_at": "jobs_ended"}
NARROW_RANGE_ROWS = 5000
_RANGE = ("<", "<=", ">", ">=")


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

    async def select(self, table: str, where: Where = (), read: Read = EVERY) -> list[dict[str, Any]]:
        source = table
        if table == JOBS and read.order == ("-seq",):
            index = await self._narrow_time_index(where)
            source = f"{table} INDEXED BY {index}" if index is not None else table
        return await self.select_from(table, source, where, read)

    async def _narrow_time_index(self, where: Where) -> str | None:
        """The time index whose range in ``where`` holds the fewest rows, when at most ``NARROW_RANGE_ROWS``."""
        best: tuple[int, str] | None = None
        for column, index in TIME_INDEXES.items():
            bounds = tuple(c for c in where if isinstance(c, tuple) and c[0] == column and c[1] in _RANGE)
            if not bounds:
                continue
            args: list[object] = []
            probe = f"SELECT 1 FROM {JOBS} INDEXED BY {index} WHERE {self.where(bounds, args)} LIMIT ?"
            [[count]] = await self.fetch(f"SELECT COUNT(*) FROM ({probe})", [*args, NARROW_RANGE_ROWS + 1])
            if count <= NARROW_RANGE_ROWS and (best is None or count < best[0]):
                best = (count, index)
        return best[1] if best is not None else None

    def json_equals(self, column: str, key: str, value: object, args: list[object]) -> str:
        # The side table of params (migration 14): its key answers a value, numbers compared as numbers.
        assert column == "params", column
        args += [key, int(value) if isinstance(value, bool) else value]
        return "seq IN (SELECT seq FROM job_params WHERE name = ? AND value = ?)"

    async def fetch(self, sql: str, args: Sequence[object]) -> list[sqlite3.Row]:
        return self.conn.execute(sql, args).fetchall()

    async def execute(self, sql: str, args: Sequence[object]) -> int:
        return self.conn.execute(sql, args).rowcount

    async def execute_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self.conn.executemany(sql, rows)
