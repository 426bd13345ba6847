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
from .._sql import SqlStore
from .._tables import BOOLEANS, EVERY, JOBS, TIMESTAMPS, LocalStore, Read, Where

# A time filter of the job list (its column, and the index that holds it in time order, migrations 7 and 14). The
# list is read newest first by seq, and SQLite keeps no statistics of a range: with the index in reach its planner
# reads a whole wide range and sorts it (a week: 600,000 rows), without it it walks seq from the newest row and tests
# the time, which reads the whole history when the range holds few rows or none. So the range is counted on its
# index first, stopping past ``NARROW_RANGE_ROWS``: a narrow one is read from the index and sorted, a wide one is
# kept out of the planner's choice (``+column``) and walked from the newest row, or from another filter's index.
TIME_INDEXES = {"created_at": "jobs_created", "ended_at": "jobs_ended"}
NARROW_RANGE_ROWS = 1000
# A wide range that ends before the newest row is walked from its own newest row, found on its index (covering: no
# row is read) when it holds at most this many rows; a wider one is walked from the newest row of all.
WALK_BOUND_ROWS = 200_000
_RANGE = ("<", "<=", ">", ">=")


def _time_bound(cond: object) -> bool:
    return isinstance(cond, tuple) and cond[0] in TIME_INDEXES and cond[1] in _RANGE and cond[2] is not None


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
        if table != JOBS or read.order != ("-seq",) or not any(_time_bound(c) for c in where):
            return await self.select_from(table, table, where, read)
        index = await self._narrow_time_index(where)
        if index is not None:
            return await self.select_from(table, f"{table} INDEXED BY {index}", where, read)
        walked = tuple(("+" + c[0], *c[1:]) if _time_bound(c) else c for c in where)
        return await self.select_from(table, table, walked + await self._walk_from(where), read)

    async def _walk_from(self, where: Where) -> Where:
        """Where a walk down seq may begin: a range that ends before the newest row's creation begins at its own
        newest row (the largest seq its index holds: ``seq <=`` it is true of every row in the range), counted on
        the index up to ``WALK_BOUND_ROWS``; else (or past that) at the newest row."""
        until = tuple(c for c in where if _time_bound(c) and c[0] == "created_at")
        if not any(c[1] in ("<", "<=") for c in until):
            return ()
        rows = await self.fetch(f"SELECT created_at FROM {JOBS} ORDER BY seq DESC LIMIT 1", [])
        if not rows or all(self._holds(rows[0][0], c) for c in until):
            return ()
        args: list[object] = []
        inner = f"SELECT seq FROM {JOBS} INDEXED BY jobs_created WHERE {self.where(until, args)} LIMIT ?"
        [[count, last]] = await self.fetch(f"SELECT COUNT(*), MAX(seq) FROM ({inner})", [*args, WALK_BOUND_ROWS + 1])
        return (("seq", "<=", last),) if count <= WALK_BOUND_ROWS and last is not None else ()

    def _holds(self, stored: str, cond: tuple[str, str, Any]) -> bool:
        bound = self.encode(cond[0], cond[2])
        assert isinstance(bound, str)
        return {"<": stored < bound, "<=": stored <= bound, ">": stored > bound, ">=": stored >= bound}[cond[1]]

    async def _narrow_time_index(self, where: Where) -> str | None:
        """The time index whose range in ``where`` holds the fewest rows, when at most ``NARROW_RANGE_ROWS``."""
        best: tuple[int, str] | None = None
        for column, index in TIME_INDEXES.items():
            bounds = tuple(c for c in where if _time_bound(c) and c[0] == column)
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
