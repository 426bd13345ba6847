"""What the two SQL backends share: the store port's one SQL text (``SqlStore``) and the migrations' loader. Each
backend keeps its own stored forms (how a timestamp is kept) and its own connection."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..domain import RegistryError
from ._tables import COLUMNS, EVERY, JSON_COLUMNS, Either, Read, Where


class SqlStore:
    """The ``_tables.Store`` port as SQL: one text for SQLite and PostgreSQL, each backend a subclass that says how
    a parameter is marked, how a value is stored and read back, and how a statement runs on its connection (the
    SQLite one answers at once, in its worker thread; the PostgreSQL one awaits asyncpg). Table and column names
    come from ``_tables`` only, never from a caller's input; every value is a parameter."""

    def mark(self, n: int) -> str:
        """The ``n``-th parameter's marker (from 1)."""
        raise NotImplementedError

    def encode(self, column: str, value: object) -> object:
        """A domain value as its column keeps it (JSON columns as JSON text)."""
        if value is not None and column in JSON_COLUMNS:
            return json.dumps(value, sort_keys=True, separators=(",", ":"))
        return value

    def decode(self, column: str, value: Any) -> Any:
        """A stored value as the domain's (the SQL NULL: None)."""
        if value is not None and column in JSON_COLUMNS:
            return json.loads(value)
        return value

    async def fetch(self, sql: str, args: Sequence[object]) -> Sequence[Sequence[Any]]:
        raise NotImplementedError

    async def execute(self, sql: str, args: Sequence[object]) -> int:
        """Run one statement; how many rows it changed."""
        raise NotImplementedError

    async def execute_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        raise NotImplementedError

    def locking(self, skip_locked: bool) -> str:
        """What a select that locks its rows ends with (nothing where the transaction holds them all)."""
        return ""

    def where(self, where: Where, args: list[object]) -> str:
        parts: list[str] = []
        for cond in where:
            if isinstance(cond, Either):
                parts.append("(" + " OR ".join(f"({self.where(o, args) or 'TRUE'})" for o in cond.options) + ")")
                continue
            column, op, value = cond
            if value is None:
                parts.append(f"{column} IS {'NOT ' if op == '!=' else ''}NULL")
            elif op == "json=":
                key, wanted = value
                parts.append(self.json_equals(column, key, wanted, args))
            elif op in ("in", "not in"):
                marks = [self._arg(args, column, item) for item in value]
                if op == "in":
                    parts.append(f"{column} IN ({', '.join(marks)})" if marks else "FALSE")
                elif marks:
                    parts.append(f"{column} NOT IN ({', '.join(marks)})")
            else:
                parts.append(f"{column} {op} {self._arg(args, column, value)}")
        return " AND ".join(parts)

    def json_equals(self, column: str, key: str, value: object, args: list[object]) -> str:
        """A JSON column's member ``key`` equals ``value`` (SQLite's JSON1; PostgreSQL overrides it)."""
        args.append(f'$."{key}"')
        path = self.mark(len(args))
        args.append(int(value) if isinstance(value, bool) else value)
        return f"json_extract({column}, {path}) = {self.mark(len(args))}"

    def _arg(self, args: list[object], column: str, value: object) -> str:
        args.append(self.encode(column, value))
        return self.mark(len(args))

    def _filtered(self, head: str, where: Where, args: list[object]) -> str:
        cond = self.where(where, args)
        return f"{head} WHERE {cond}" if cond else head

    async def select(self, table: str, where: Where = (), read: Read = EVERY) -> list[dict[str, Any]]:
        return await self.select_from(table, table, where, read)

    async def select_from(self, table: str, source: str, where: Where, read: Read) -> list[dict[str, Any]]:
        """``select`` from ``source``: ``table``, or ``table`` with a backend's hint of the index to read."""
        names = read.columns or COLUMNS[table]
        args: list[object] = []
        sql = self._filtered(f"SELECT {', '.join(names)} FROM {source}", where, args)
        if read.order:
            sql += " ORDER BY " + ", ".join(f"{o[1:]} DESC" if o.startswith("-") else o for o in read.order)
        if read.limit is not None:
            args.append(read.limit)
            sql += f" LIMIT {self.mark(len(args))}"
        if read.offset:
            args.append(read.offset)
            sql += f" OFFSET {self.mark(len(args))}"
        if read.lock:
            sql += self.locking(read.skip_locked)
        decode = self.decode
        rows = await self.fetch(sql, args)
        return [{name: decode(name, value) for name, value in zip(names, row, strict=True)} for row in rows]

    async def count(self, table: str, where: Where = ()) -> int:
        args: list[object] = []
        [[found]] = await self.fetch(self._filtered(f"SELECT COUNT(*) FROM {table}", where, args), args)
        return int(found)

    async def tally(self, table: str, column: str, where: Where = ()) -> dict[Any, int]:
        args: list[object] = []
        sql = self._filtered(f"SELECT {column}, COUNT(*) FROM {table}", where, args)
        rows = await self.fetch(f"{sql} GROUP BY {column}", args)
        return {row[0]: row[1] for row in rows}

    def _insert(self, table: str, names: Sequence[str]) -> str:
        marks = ", ".join(self.mark(n) for n in range(1, len(names) + 1))
        return f"INSERT INTO {table} ({', '.join(names)}) VALUES ({marks})"

    async def insert(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        names = list(rows[0])
        values = [[self.encode(name, row[name]) for name in names] for row in rows]
        if len(values) == 1:
            await self.execute(self._insert(table, names), values[0])
        else:
            await self.execute_many(self._insert(table, names), values)

    async def put(self, table: str, row: Mapping[str, Any], key: Sequence[str]) -> None:
        names = list(row)
        others = ", ".join(f"{name} = excluded.{name}" for name in names if name not in key)
        upsert = f"DO UPDATE SET {others}" if others else "DO NOTHING"
        sql = f"{self._insert(table, names)} ON CONFLICT ({', '.join(key)}) {upsert}"
        await self.execute(sql, [self.encode(name, row[name]) for name in names])

    async def update(self, table: str, where: Where, values: Mapping[str, Any]) -> int:
        args: list[object] = []
        sets = ", ".join(f"{name} = {self._arg(args, name, value)}" for name, value in values.items())
        return await self.execute(self._filtered(f"UPDATE {table} SET {sets}", where, args), args)

    async def delete(self, table: str, where: Where) -> int:
        args: list[object] = []
        return await self.execute(self._filtered(f"DELETE FROM {table}", where, args), args)


_NAME = re.compile(r"(\d{4})_[a-z0-9_]+\.sql")


@dataclass(frozen=True)
class Migration:
    version: int  # the schema version after it
    name: str
    script: str


def load_migrations(package: str) -> list[Migration]:
    """Every migration ``package`` ships (``migrations/NNNN_name.sql``), in order (versions 1, 2, 3... with no gap)."""
    found: list[Migration] = []
    for entry in resources.files(package).joinpath("migrations").iterdir():
        match = _NAME.fullmatch(entry.name)
        if match is not None:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RegistryError(f"the registry's migrations are not numbered 1..n: {[m.name for m in found]}")
    return found
