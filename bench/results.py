"""What a benchmark hands on: structured results (figures with their runs and units, tables, targets) that a results
JSON file holds and from which every markdown table is derived.

Standard library only: bench/report.py imports this module from the bench venv, which has no project dependencies.

One ``make bench`` run is one file, ``bench/results/<UTC date>-make-bench.json``; ``make chaos`` and ``make soak``
write ``...-chaos.json`` and ``...-soak.json`` beside it. The history is those files and git, never the page.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

SCHEMA = 1
REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# -- one figure over repeated runs --------------------------------------------------------------------


@dataclass(frozen=True)
class Measure:
    """A figure as the results hold it: each run's value (in ``unit``), and their median, min and max.

    ``runs`` is None only for figures transcribed from an older page, which kept the median, min and max alone.
    ``digits`` is how many decimals the tables show; it changes nothing in the file's values.
    """

    median: float
    lo: float
    hi: float
    unit: str = ""
    digits: int = 2
    runs: tuple[float, ...] | None = None

    @classmethod
    def of(cls, runs: Sequence[float], unit: str = "", digits: int = 2) -> Measure:
        values = tuple(float(v) for v in runs)
        if not values:
            return cls(math.nan, math.nan, math.nan, unit, digits, ())
        return cls(statistics.median(values), min(values), max(values), unit, digits, values)

    def fmt(self, unit: bool = True) -> str:
        """``median unit (min-max)``, as every table of the bench has shown figures."""
        if math.isnan(self.median):
            return "n/a"
        m, lo, hi = (f"{v:.{self.digits}f}" for v in (self.median, self.lo, self.hi))
        suffix = f" {self.unit}" if unit and self.unit else ""
        return f"{m}{suffix} ({lo}-{hi})"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "median": _num(self.median),
            "min": _num(self.lo),
            "max": _num(self.hi),
            "unit": self.unit,
            "digits": self.digits,
            "runs": None if self.runs is None else [_num(v) for v in self.runs],
        }
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measure:
        runs = data.get("runs")
        return cls(
            median=_float(data["median"]),
            lo=_float(data["min"]),
            hi=_float(data["max"]),
            unit=str(data.get("unit", "")),
            digits=int(data.get("digits", 2)),
            runs=None if runs is None else tuple(_float(v) for v in runs),
        )


def _num(value: float) -> float | None:
    """JSON has no NaN: a figure with no run is null."""
    return None if math.isnan(value) else round(value, 9)


def _float(value: Any) -> float:
    return math.nan if value is None else float(value)


@dataclass(frozen=True)
class Figure:
    """One figure over repeated runs, in the unit it was measured in: the scenarios' working form of a Measure."""

    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> Figure:
        return cls(tuple(samples))

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan

    @property
    def lo(self) -> float:
        return min(self.samples) if self.samples else math.nan

    @property
    def hi(self) -> float:
        return max(self.samples) if self.samples else math.nan

    def measure(self, scale: float = 1.0, unit: str = "", digits: int = 2) -> Measure:
        """The results' form: every run multiplied by ``scale`` (seconds to ms: 1e3), in ``unit``."""
        return Measure.of([v * scale for v in self.samples], unit, digits)

    def fmt(self, scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
        """``median unit (min-max)``, values multiplied by ``scale``."""
        return self.measure(scale, unit, digits).fmt()


@dataclass(frozen=True)
class Value:
    """A single number with its unit (a count, a peak, a one-off wall time): a figure that has no runs."""

    value: float
    unit: str = ""
    digits: int = 2

    @property
    def median(self) -> float:  # so that a Value compares with a Measure (report --compare)
        return self.value

    def fmt(self, unit: bool = True) -> str:
        suffix = f" {self.unit}" if unit and self.unit else ""
        return f"{self.value:.{self.digits}f}{suffix}"

    def to_json(self) -> dict[str, Any]:
        return {"value": _num(self.value), "unit": self.unit, "digits": self.digits}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Value:
        return cls(_float(data["value"]), str(data.get("unit", "")), int(data.get("digits", 2)))


Cell = Measure | Value | str | int | float | None


def cell_to_json(cell: Cell) -> Any:
    return cell.to_json() if isinstance(cell, Measure | Value) else cell


def cell_from_json(data: Any) -> Cell:
    if isinstance(data, dict):
        return Value.from_json(data) if "value" in data else Measure.from_json(data)
    return data


def fmt_cell(cell: Cell, unit: bool = True) -> str:
    if isinstance(cell, Measure | Value):
        return cell.fmt(unit)
    if cell is None:
        return ""
    return str(cell)


# -- tables -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    align: str = "right"  # or "left"
    unit_in_header: bool = False  # the header names the unit: the cells show numbers alone


@dataclass
class Row:
    key: str
    cells: dict[str, Cell]
    bold: bool = False
    skipped: str | None = None  # why this row's tool did not run


@dataclass
class Table:
    """A table of a scenario. Rows and columns have keys, so two runs' tables can be matched (report --compare)."""

    key: str
    columns: list[Column]
    rows: list[Row] = field(default_factory=list)
    intro: str = ""  # a sentence shown before the table

    def add(self, key: str, *cells: Cell, bold: bool = False, skipped: str | None = None) -> Row:
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.key}: {len(cells)} cells for {len(self.columns)} columns")
        row = Row(key, {c.key: v for c, v in zip(self.columns, cells, strict=True)}, bold, skipped)
        self.rows.append(row)
        return row

    def row(self, key: str) -> Row | None:
        return next((r for r in self.rows if r.key == key), None)

    def markdown(self) -> list[str]:
        lines = [self.intro, ""] if self.intro else []
        lines.append("| " + " | ".join(c.label for c in self.columns) + " |")
        lines.append("|" + "|".join("---:" if c.align == "right" else "---" for c in self.columns) + "|")
        for row in self.rows:
            cells = [fmt_cell(row.cells.get(c.key), not c.unit_in_header) for c in self.columns]
            if row.bold and cells:
                cells[0] = f"**{cells[0]}**"
            lines.append("| " + " | ".join(cells) + " |")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "intro": self.intro,
            "columns": [
                {"key": c.key, "label": c.label, "align": c.align, "unit_in_header": c.unit_in_header}
                for c in self.columns
            ],
            "rows": [
                {
                    "key": r.key,
                    "cells": {k: cell_to_json(v) for k, v in r.cells.items()},
                    **({"bold": True} if r.bold else {}),
                    **({"skipped": r.skipped} if r.skipped else {}),
                }
                for r in self.rows
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Table:
        return cls(
            key=data["key"],
            intro=data.get("intro", ""),
            columns=[
                Column(c["key"], c["label"], c.get("align", "right"), bool(c.get("unit_in_header")))
                for c in data["columns"]
            ],
            rows=[
                Row(
                    r["key"],
                    {k: cell_from_json(v) for k, v in r["cells"].items()},
                    bool(r.get("bold")),
                    r.get("skipped"),
                )
                for r in data["rows"]
            ],
        )


# -- targets ------------------------------------------------------------------------------------------


@dataclass
class Target:
    """A target checked by a run: the figure, the threshold it is held to, and PASS, MISS or SKIP.

    ``op`` says how: ``value <= threshold`` and so on; ``text`` is the line the scripts print after the verdict.
    """

    key: str
    verdict: str
    text: str
    value: float | None = None
    threshold: float | None = None
    op: str = ""
    unit: str = ""

    @property
    def line(self) -> str:
        return f"{self.verdict}  {self.text}"

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "verdict": self.verdict,
            "value": self.value,
            "op": self.op,
            "threshold": self.threshold,
            "unit": self.unit,
            "text": self.text,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Target:
        return cls(
            key=data["key"],
            verdict=data["verdict"],
            text=data["text"],
            value=data.get("value"),
            threshold=data.get("threshold"),
            op=data.get("op", ""),
            unit=data.get("unit", ""),
        )


# -- a scenario's results -----------------------------------------------------------------------------


@dataclass
class Section:
    """One scenario's results: its tables, named figures, PASS/MISS targets, and notes (skips, fallbacks).

    The markdown that the scripts print, and that the page shows, is derived from these; the JSON holds them.
    """

    title: str
    key: str = ""
    script: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    figures: dict[str, tuple[str, Measure]] = field(default_factory=dict)  # key -> (label, figure)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    date: str = field(default_factory=lambda: utc_now())

    def table(self, key: str, columns: Sequence[Column], intro: str = "") -> Table:
        table = Table(key, list(columns), intro=intro)
        self.tables.append(table)
        return table

    def figure(self, key: str, label: str, measure: Measure) -> None:
        self.figures[key] = (label, measure)

    def target(
        self,
        ok: bool,
        text: str,
        *,
        key: str,
        value: float | None = None,
        threshold: float | None = None,
        op: str = "",
        unit: str = "",
    ) -> None:
        self.targets.append(Target(key, verdict(ok), text, value, threshold, op, unit))

    def skip(self, text: str, *, key: str) -> None:
        self.targets.append(Target(key, "SKIP", text))

    def get_table(self, key: str) -> Table | None:
        return next((t for t in self.tables if t.key == key), None)

    def markdown(self) -> list[str]:
        """The tables, then the named figures and the notes as a list."""
        lines: list[str] = []
        for table in self.tables:
            if lines:
                lines.append("")
            lines += table.markdown()
        bullets = [f"{label}: {m.fmt()}" for label, m in self.figures.values()] + self.notes
        if bullets:
            lines.append("")
            lines += [f"- {b}" for b in bullets]
        return lines

    def print(self) -> None:
        print(f"\n== {self.title}")
        for line in self.markdown():
            print(line)
        for target in self.targets:
            print(target.line)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "script": self.script,
            "date": self.date,
            "params": self.params,
            "tables": [t.to_json() for t in self.tables],
            "figures": {k: {"label": label, **m.to_json()} for k, (label, m) in self.figures.items()},
            "targets": [t.to_json() for t in self.targets],
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Section:
        return cls(
            title=data["title"],
            key=data["key"],
            script=data.get("script", ""),
            params=dict(data.get("params", {})),
            tables=[Table.from_json(t) for t in data.get("tables", [])],
            figures={k: (v["label"], Measure.from_json(v)) for k, v in data.get("figures", {}).items()},
            targets=[Target.from_json(t) for t in data.get("targets", [])],
            notes=list(data.get("notes", [])),
            date=data.get("date", ""),
        )


# -- results files ------------------------------------------------------------------------------------


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def results_name(kind: str, when: datetime | None = None) -> str:
    """``2026-12-02T0130Z-make-bench.json``: sorts by date, says what wrote it."""
    return f"{(when or datetime.now(UTC)).strftime('%Y-%m-%dT%H%MZ')}-{kind}.json"


def default_path(kind: str, directory: Path = RESULTS_DIR) -> Path:
    return directory / results_name(kind)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (a reader never sees half a file), ending with a newline, stable key order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, ensure_ascii=False)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, this reader knows {SCHEMA}")
    return data


def run_header(kind: str, **fields: Any) -> dict[str, Any]:
    """The first keys of every results file; the caller adds the machine, versions and revision."""
    return {"schema": SCHEMA, "kind": kind, "date": utc_now(), "source": "measured", **fields}


def add_sections(path: Path, sections: Sequence[Section], header: dict[str, Any]) -> None:
    """Add (or replace, by key) scenarios in the results file at ``path``; make it with ``header`` when missing.

    ``make bench`` runs bench/run.py, then feeds.py, outbox.py and exec_modes.py as separate processes: each adds
    its scenarios to the same file, so one run is one file.
    """
    data = read_json(path) if path.exists() else header
    keys = {s.key for s in sections}
    data["scenarios"] = [s for s in data.get("scenarios", []) if s.get("key") not in keys]
    data["scenarios"] += [s.to_json() for s in sections]
    write_json(path, data)


def sections_of(data: dict[str, Any]) -> list[Section]:
    return [Section.from_json(s) for s in data.get("scenarios", [])]


def find(directory: Path, kind: str) -> Iterator[Path]:
    """The results files of one kind in ``directory``, oldest first (the names sort by date)."""
    yield from sorted(directory.glob(f"*-{kind}.json"))
