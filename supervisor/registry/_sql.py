"""What the two SQL backends share: the store port's one SQL text (``SqlStore``) and the migrations' loader. Each
backend keeps its own stored forms (how a timestamp is kept) and its own connection."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..domain import JobStatus, RegistryError, SchemaNotHonoured
from ._tables import COLUMNS, EVERY, JSON_COLUMNS, Either, Read, Where

# A status condition is written as a literal of the closed ``JobStatus`` set, never a parameter: SQLite plans a
# statement with a bound status again at each bind (its partial indexes on ``status = 'queued'`` make the plan depend
# on the value: 70-130 µs a whole-row select, against ~10 µs prepared once), and PostgreSQL's generic plan of
# ``status = $1`` cannot use them. Only these values become literals (a member of the set, checked here, whatever
# the caller passed: never user input), so the text stays free of injection.
_STATUS_LITERALS = {status.value: f"'{status.value}'" for status in JobStatus}
_STATUS_COLUMNS = frozenset({"status"})

# How a stored value is read back as the domain's (``SqlStore.reader``), None: as it is.
Reader = Callable[[Any], Any]
# Per store class and column list, the columns a select converts and how: built once, not per row and column.
_CONVERSIONS: dict[tuple[type, tuple[str, ...]], tuple[tuple[str, Reader], ...]] = {}


# Per store class and query shape (``_shape``), a select's text: built once, its values bound at each call. Bounded:
# a shape is a few columns and operators, but an ``in`` list's length is one too.
_TEXTS: dict[tuple[Any, ...], str] = {}
_MOST_TEXTS = 1024


def json_value(value: Any) -> Any:
    return None if value is None else json.loads(value)


def _literal_statuses(op: str, value: object) -> str | None:
    """A status condition as literals of ``JobStatus`` (see ``_STATUS_LITERALS``); None: not one (another value,
    or an operator this does not write), written with parameters as any other."""
    values = tuple(value) if op in ("in", "not in") and isinstance(value, (tuple, list)) else (value,)
    if op not in ("=", "!=", "in", "not in") or not values:
        return None
    if not all(isinstance(v, str) and v in _STATUS_LITERALS for v in values):
        return None
    literals = ", ".join(_STATUS_LITERALS[str(v)] for v in values)
    return f"status {op} {literals}" if op in ("=", "!=") else f"status {op.upper()} ({literals})"


def _shape(where: Where) -> tuple[Any, ...] | None:
    """What the text of ``where`` depends on, in the order ``SqlStore.where`` writes it: the columns and operators,
    a NULL, an ``in`` list's length, the statuses written as literals. None: a text not kept (a JSON member's
    condition, which each backend writes its own way)."""
    out: list[Any] = []
    for cond in where:
        if isinstance(cond, Either):
            options = tuple(_shape(option) for option in cond.options)
            if any(option is None for option in options):
                return None
            out.append(("|", options))
            continue
        column, op, value = cond
        literal = _literal_statuses(op, value) if column in _STATUS_COLUMNS else None
        if literal is not None:
            out.append(literal)
        elif value is None:
            out.append((column, op, None))
        elif op == "json=":
            return None
        else:
            out.append((column, op, len(value) if op in ("in", "not in") else -1))
    return tuple(out)


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

    def reader(self, column: str) -> Reader | None:
        """How a stored value of ``column`` is read back as the domain's (the SQL NULL: None); None: as it is."""
        return json_value if column in JSON_COLUMNS else None

    def _conversions(self, names: tuple[str, ...]) -> tuple[tuple[str, Reader], ...]:
        key = (type(self), names)
        found = _CONVERSIONS.get(key)
        if found is None:
            found = _CONVERSIONS[key] = tuple((n, r) for n in names if (r := self.reader(n)) is not None)
        return found

    # How a statement runs: here, on a DB-API connection (``conn``: sqlite3's, whose calls answer at once, in the
    # SQLite backend's worker thread or the memory registry's caller); PostgreSQL's store awaits asyncpg instead. Here
    # and not in the SQLite backend, so that the memory registry's step passes its own backend and this module only.
    conn: Any

    async def fetch(self, sql: str, args: Sequence[object]) -> Sequence[Sequence[Any]]:
        return self.conn.execute(sql, args).fetchall()

    async def execute(self, sql: str, args: Sequence[object]) -> int:
        """Run one statement; how many rows it changed."""
        return self.conn.execute(sql, args).rowcount

    async def execute_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        self.conn.executemany(sql, rows)

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
            literal = _literal_statuses(op, value) if column in _STATUS_COLUMNS else None
            if literal is not None:
                parts.append(literal)
            elif value is None:
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

    def _values(self, where: Where, args: list[object]) -> None:
        """The values ``where`` binds, in the order its text marks them (``where``, whose text is kept)."""
        for cond in where:
            if isinstance(cond, Either):
                for option in cond.options:
                    self._values(option, args)
                continue
            column, op, value = cond
            if value is None or (column in _STATUS_COLUMNS and _literal_statuses(op, value) is not None):
                continue
            if op in ("in", "not in"):
                args.extend(self.encode(column, item) for item in value)
            else:
                args.append(self.encode(column, value))

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
        source, where = await self.narrowed(table, where, read)
        return await self.select_from(table, source, where, read)

    async def narrowed(self, table: str, where: Where, read: Read) -> tuple[str, Where]:
        """Where a select reads (``table``, or ``table`` with a backend's hint of the index to read) and its
        conditions (a backend may add one that bounds the walk): asked before the select runs, so that the backend
        is not on the select's own way to the driver."""
        return table, where

    async def select_from(self, table: str, source: str, where: Where, read: Read) -> list[dict[str, Any]]:
        """``select`` from ``source``: ``table``, or ``table`` with a backend's hint of the index to read. Its text
        is kept per shape (``_shape``): a select of a shape seen before binds its values only."""
        names = tuple(read.columns or COLUMNS[table])
        shape = _shape(where)
        key = (type(self), source, names, shape, tuple(read.order), read.limit is None, not read.offset, read.lock,
               read.skip_locked)  # fmt: skip
        args: list[object] = []
        sql = _TEXTS.get(key) if shape is not None else None
        if sql is None:
            sql = self._select_text(source, names, where, read, args)
            if shape is not None:
                if len(_TEXTS) >= _MOST_TEXTS:
                    _TEXTS.clear()
                _TEXTS[key] = sql
        else:
            self._values(where, args)
            args += [n for n in (read.limit, read.offset or None) if n is not None]
        conversions = self._conversions(names)
        rows = await self.fetch(sql, args)
        out = [dict(zip(names, row, strict=True)) for row in rows]
        for found in out:
            for name, convert in conversions:
                found[name] = convert(found[name])
        return out

    def _select_text(self, source: str, names: Sequence[str], where: Where, read: Read, args: list[object]) -> str:
        """A select's text, its values appended to ``args``."""
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
        return sql

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
# A migration's phase, declared in a comment line of its own (``-- phase: contract``); none declared: an expand
# (docs/fleet.md § Upgrading a fleet).
_PHASE = re.compile(r"^--\s*phase:\s*(\S+)\s*$", re.MULTILINE)
# PostgreSQL: a migration that cannot run in a transaction (CREATE INDEX CONCURRENTLY) declares it; it holds one
# statement, and is run alone.
_NO_TRANSACTION = re.compile(r"^--\s*transaction:\s*none\s*$", re.MULTILINE)
EXPAND, CONTRACT = "expand", "contract"


@dataclass(frozen=True)
class Migration:
    version: int  # its number: applied in this order, once
    name: str
    script: str
    # EXPAND only adds (the previous release runs on its result); CONTRACT drops, renames or tightens (a release that
    # does not know it cannot run on its result: INV-CONTRACT-AFTER-FLEET).
    phase: str = EXPAND
    transactional: bool = True  # False: ``-- transaction: none`` (PostgreSQL's CREATE INDEX CONCURRENTLY)


def load_migrations(package: str) -> list[Migration]:
    """Every migration ``package`` ships (``migrations/NNNN_name.sql``), in order of their numbers (each number
    once; a number may be missing: another branch's migration, merged later, is applied where it is missing)."""
    found: list[Migration] = []
    for entry in resources.files(package).joinpath("migrations").iterdir():
        match = _NAME.fullmatch(entry.name)
        if match is not None:
            script = entry.read_text(encoding="utf-8")
            phases = _PHASE.findall(script)
            if len(phases) > 1 or any(phase not in (EXPAND, CONTRACT) for phase in phases):
                raise RegistryError(f"migration {entry.name} declares its phase as {phases}: one of expand, contract")
            transactional = _NO_TRANSACTION.search(script) is None
            found.append(
                Migration(int(match.group(1)), entry.name, script, phases[0] if phases else EXPAND, transactional)
            )
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions) or (versions and versions[0] < 1):
        raise RegistryError(f"the registry's migrations are not numbered once each from 1: {[m.name for m in found]}")
    return found


def contract_level(known: Sequence[Migration]) -> int:
    """What a release can honour: how many contract migrations it knows. A host records it with its lease; a contract
    migration numbered N among the contracts waits for every live host to honour N (INV-CONTRACT-AFTER-FLEET)."""
    return sum(1 for m in known if m.phase == CONTRACT)


@dataclass(frozen=True)
class SchemaPlan:
    """A schema as this release sees it: ``applied`` (number: phase, as the schema records them), what of this
    release's is still to apply (``pending``, in order) and what was applied by a newer release (``unknown``)."""

    applied: Mapping[int, str]
    pending: tuple[Migration, ...]
    unknown: tuple[int, ...]

    @property
    def contracted_beyond(self) -> tuple[int, ...]:
        """The newer release's contract migrations applied here: this release cannot run on them."""
        return tuple(v for v in self.unknown if self.applied[v] == CONTRACT)

    def next_batch(self, *, contracts: bool) -> tuple[Migration, ...]:
        """What to apply now, in order: everything (a new schema: nobody runs on it yet, or ``contracts``: the
        operator's ``supervisor migrate``), else up to the first contract migration (``serve`` applies expands only)."""
        if contracts or not self.applied:
            return self.pending
        out: list[Migration] = []
        for migration in self.pending:
            if migration.phase == CONTRACT:
                break
            out.append(migration)
        return tuple(out)


def require_expanded(schema: SchemaPlan, where: str) -> None:
    """This release runs on a schema where every expand it ships is applied (its contracts may wait: it runs before
    and after them). An expand behind a pending contract waits for that contract: ``supervisor migrate``."""
    missing = [m.name for m in schema.pending if m.phase == EXPAND]
    if missing:
        waiting = [
            m.name
            for m in schema.pending
            if m.phase == CONTRACT and m.version < max(m2.version for m2 in schema.pending if m2.phase == EXPAND)
        ]
        why = f" (behind the contract {', '.join(waiting)})" if waiting else ""
        raise RegistryError(
            f"registry {where} lacks this release's migrations {', '.join(missing)}{why}: run `supervisor migrate`"
        )


def plan(known: Sequence[Migration], applied: Mapping[int, str]) -> SchemaPlan:
    versions = {m.version for m in known}
    return SchemaPlan(
        dict(applied),
        tuple(m for m in known if m.version not in applied),
        tuple(sorted(v for v in applied if v not in versions)),
    )


def level_of(known: Sequence[Migration], migration: Migration) -> int:
    """A contract migration's number among the contracts (1 for the first): the level a host must honour."""
    return contract_level([m for m in known if m.version <= migration.version])


def refuse_contracted(schema: SchemaPlan, where: str, release: str) -> None:
    """INV-CONTRACT-AFTER-FLEET: a release meeting a newer release's contract refuses to run, in one line."""
    beyond = schema.contracted_beyond
    if beyond:
        raise SchemaNotHonoured(
            f"registry {where} was contracted by a newer release (migration {', '.join(map(str, beyond))}): release "
            f"{release} cannot run on it; start the newer release on this host"
        )


@dataclass(frozen=True)
class HostRecord:
    """A host as a contract migration judges it: which release it runs and what it honours (None: a host of a
    release before 1.0.0, which recorded neither), whether its lease is live, and its running rows."""

    host_id: str
    release: str | None
    level: int | None
    live: bool
    running: int


def held_back_by(hosts: Sequence[HostRecord], level: int) -> list[str]:
    """The hosts a contract migration of ``level`` waits for (INV-CONTRACT-AFTER-FLEET): each live host that honours
    less, and each silent one that does and still holds running rows (it may come back, on its old code)."""
    return [
        f"{h.host_id} (release {h.release or 'before 1.0.0'}, {'live' if h.live else 'silent, holding jobs'})"
        for h in sorted(hosts, key=lambda h: h.host_id)
        if (h.level or 0) < level and (h.live or h.running > 0)
    ]


def contract_refused(migration: Migration, level: int, holders: Sequence[str], where: str) -> RegistryError:
    return RegistryError(
        f"registry {where}: contract migration {migration.name} (contract level {level}) held back by "
        f"{', '.join(holders)}: drain, stop and upgrade each (docs/fleet.md § Upgrading a fleet; a host that will not "
        "come back: supervisor hosts forget HOST), then run supervisor migrate again"
    )
