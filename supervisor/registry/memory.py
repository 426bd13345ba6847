"""``MemoryRegistry``: the registry's rules over a process's memory, for fast tests of the core (the fake beside the
real thing, never instead of it: it runs the very rules the SQL backends run, and passes the same contract suite).

Its store is the store port (``_tables.Store``) as a match over lists of dicts, one list per table. A step never
suspends (``run_now`` holds it to that), so on one Trio loop no other task sees it half done, which is what the
other backends' transactions give; a step that raises is undone by putting back the tables it began
with (rows are never changed in place, only replaced, so a copy of the lists is a snapshot). JSON columns are kept as
JSON text, as the SQL stores keep them: a caller never shares a mutable value with a row, and a value JSON cannot
hold is refused here too. Nothing survives the process, and nothing here is shared with another one.
"""

from __future__ import annotations

import json
import operator
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import trio

from ..domain import RegistryError, utc_now
from ._health import RegistryFault
from ._registry import Registry, Step, T, run_now
from ._tables import AUTO_SEQ, COLUMNS, EVERY, JSON_COLUMNS, QUEUE, Either, LocalStore, Read, Where
from ._vocabulary import WakeupFeed

_COMPARE: Mapping[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}  # fmt: skip

Row = dict[str, Any]


def _kept(column: str, value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if value is not None and column in JSON_COLUMNS else value


def _same_param(member: object, wanted: object) -> bool:
    """A param's stored value is the filter's: numbers as numbers (2 is 2.0, 1e-05 is 0.00001), as the SQL registries
    compare them; a bool, a string only as itself."""
    number = (int, float)
    if isinstance(member, bool) or isinstance(wanted, bool) or not isinstance(member, number):
        return type(member) is type(wanted) and member == wanted
    return isinstance(wanted, number) and member == wanted


def _holds(row: Row, where: Where) -> bool:
    """Whether ``row`` meets every condition (a NULL meets no comparison, as in SQL)."""
    for cond in where:
        if isinstance(cond, Either):
            if not any(_holds(row, option) for option in cond.options):
                return False
            continue
        column, op, value = cond
        have = row[column]
        if value is None:
            met = (have is None) == (op == "=")
        elif op == "in":
            met = have in value
        elif op == "not in":
            met = have is not None and have not in value
        elif op == "json=":
            key, wanted = value
            member = json.loads(have).get(key) if have is not None else None
            met = _same_param(member, wanted)
        else:
            met = have is not None and _COMPARE[op](have, value)
        if not met:
            return False
    return True


@dataclass
class _Tables:
    rows: dict[str, list[Row]] = field(default_factory=lambda: {table: [] for table in COLUMNS})
    seqs: dict[str, int] = field(default_factory=lambda: dict.fromkeys(AUTO_SEQ, 0))

    def __post_init__(self) -> None:
        self.rows[QUEUE] = self.rows[QUEUE] or [{"paused": False, "paused_by": None, "paused_at": None}]

    def copy(self) -> _Tables:
        return _Tables({table: list(rows) for table, rows in self.rows.items()}, dict(self.seqs))


class MemoryStore(LocalStore):
    """The store port over ``_Tables`` (see ``_tables.Store``)."""

    def __init__(self, backend: MemoryBackend) -> None:
        self.clock = backend.clock
        self.t = backend.tables

    async def select(self, table: str, where: Where = (), read: Read = EVERY) -> list[Row]:
        rows = [row for row in self.t.rows[table] if _holds(row, where)]
        for name in reversed(read.order):  # stable sorts, the last key first
            rows.sort(key=operator.itemgetter(name.lstrip("-")), reverse=name.startswith("-"))
        rows = rows[read.offset : None if read.limit is None else read.offset + read.limit]
        names = read.columns or COLUMNS[table]
        return [{n: json.loads(r[n]) if r[n] is not None and n in JSON_COLUMNS else r[n] for n in names} for r in rows]

    async def count(self, table: str, where: Where = ()) -> int:
        return sum(1 for row in self.t.rows[table] if _holds(row, where))

    async def tally(self, table: str, column: str, where: Where = ()) -> dict[Any, int]:
        return dict(Counter(row[column] for row in self.t.rows[table] if _holds(row, where)))

    async def insert(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        for row in rows:
            kept = {name: _kept(name, value) for name, value in row.items()}
            if table in AUTO_SEQ:
                self.t.seqs[table] += 1
                kept["seq"] = self.t.seqs[table]
            self.t.rows[table].append(kept)

    async def put(self, table: str, row: Mapping[str, Any], key: Sequence[str]) -> None:
        kept = {name: _kept(name, value) for name, value in row.items()}
        rows = self.t.rows[table]
        same = [i for i, old in enumerate(rows) if all(old[k] == kept[k] for k in key)]
        if same:
            rows[same[0]] = {**rows[same[0]], **kept}
        else:
            rows.append(kept)

    async def update(self, table: str, where: Where, values: Mapping[str, Any]) -> int:
        kept = {name: _kept(name, value) for name, value in values.items()}
        rows = self.t.rows[table]
        changed = [i for i, row in enumerate(rows) if _holds(row, where)]
        for i in changed:
            rows[i] = {**rows[i], **kept}
        return len(changed)

    async def delete(self, table: str, where: Where) -> int:
        rows = self.t.rows[table]
        kept = [row for row in rows if not _holds(row, where)]
        gone = len(rows) - len(kept)
        rows[:] = kept
        return gone


class MemoryBackend:
    """Steps run at once on the caller's loop, after one checkpoint; a write that raises leaves the tables as they
    were."""

    where = "memory"

    def __init__(self, *, clock: Callable[[], datetime]) -> None:
        self.clock = clock
        self.tables = _Tables()
        self.closed = False

    async def write(self, step: Step[T]) -> T:
        await self._enter()
        before = self.tables.copy()
        try:
            return run_now(step(MemoryStore(self)))
        except BaseException:
            self.tables.rows, self.tables.seqs = before.rows, before.seqs
            raise

    async def read(self, step: Step[T]) -> T:
        await self._enter()
        return run_now(step(MemoryStore(self)))

    async def _enter(self) -> None:
        await trio.lowlevel.checkpoint()
        if self.closed:
            raise RegistryError("the registry is closed")

    def fault(self) -> RegistryFault | None:
        return None  # memory does not fail to write

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]:
        """Nothing to hear: one process owns this registry, and its own wakes (an enqueue, a job's end) suffice."""
        return nullcontext(None)

    async def aclose(self) -> None:
        self.closed = True


class MemoryRegistry(Registry):
    """The rules over a process's memory; the constructor takes what ``SqliteRegistry``'s does, but the path."""

    def __init__(
        self, *, boot_id: str | None = None, outbox: bool = True, clock: Callable[[], datetime] = utc_now
    ) -> None:
        super().__init__(MemoryBackend(clock=clock), boot_id=boot_id, outbox=outbox)

    def reopened(self, *, boot_id: str | None) -> MemoryRegistry:
        """The same rows opened by another boot, as a restarted process opens the same file: its changes are that
        boot's (each event names it)."""
        again = MemoryRegistry(boot_id=boot_id, outbox=self.rules.outbox)
        again.backend = self.backend
        return again
