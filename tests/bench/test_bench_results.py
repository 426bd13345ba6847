"""The results model of the benchmarks (bench/results.py): what a results file holds, and that the markdown of a
scenario is the same whether it is printed by the script or rendered from the file. Nothing here is timed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import results  # type: ignore[import-not-found]  # noqa: E402


def a_section() -> results.Section:
    section = results.Section("7. a scenario", key="demo", script="bench/demo.py", params={"n": 3})
    table = section.table(
        "t",
        [results.Column("what", "what", "left"), results.Column("time", "time"), results.Column("n", "calls")],
    )
    table.add("fast", "fast path", results.Figure.of([0.002, 0.001, 0.003]).measure(1e3, "ms"), 200, bold=True)
    table.add("peer", "a peer", "skipped: not installed", None, skipped="not installed")
    section.figure("rate", "saturation throughput", results.Measure.of([510, 563, 692], "requests/s", digits=0))
    section.target(True, "fast path p50 2.00 ms (target ≤ 10 ms)", key="p50", value=2.0, op="<=", threshold=10.0)
    section.skip("a peer: not installed", key="peer")
    section.notes.append("a note")
    return section


def test_a_figure_keeps_its_runs_and_their_median_min_and_max_in_the_unit_shown() -> None:
    m = results.Figure.of([0.002, 0.001, 0.003]).measure(1e3, "ms")
    assert m.runs == pytest.approx((2.0, 1.0, 3.0)) and (m.median, m.lo, m.hi) == pytest.approx((2.0, 1.0, 3.0))
    assert m.fmt() == "2.00 ms (1.00-3.00)" and m.fmt(unit=False) == "2.00 (1.00-3.00)"
    assert math.isnan(results.Measure.of([]).median) and results.Measure.of([]).fmt() == "n/a"
    assert results.Measure.of([]).to_json()["median"] is None  # JSON has no NaN


def test_a_scenario_survives_its_json_and_renders_the_same_markdown(tmp_path: Path) -> None:
    section = a_section()
    path = tmp_path / "r.json"
    results.add_sections(path, [section], results.run_header("make-bench", label="x"))
    data = json.loads(path.read_text())
    [back] = results.sections_of(data)
    assert back.markdown() == section.markdown()
    lines = ["PASS  fast path p50 2.00 ms (target ≤ 10 ms)", "SKIP  a peer: not installed"]
    assert [t.line for t in back.targets] == lines
    cells = data["scenarios"][0]["tables"][0]["rows"][0]["cells"]
    assert cells["time"] == {"median": 2.0, "min": 1.0, "max": 3.0, "unit": "ms", "digits": 2, "runs": [2.0, 1.0, 3.0]}
    assert section.markdown()[:4] == [
        "| what | time | calls |",
        "|---|---:|---:|",
        "| **fast path** | 2.00 ms (1.00-3.00) | 200 |",
        "| a peer | skipped: not installed |  |",
    ]
    # A second script adds its scenario to the same file; one of the same key replaces the older.
    other = results.Section("feeds", key="feeds")
    results.add_sections(path, [other, a_section()], {"unused": True})
    assert [s["key"] for s in json.loads(path.read_text())["scenarios"]] == ["feeds", "demo"]


def test_a_results_file_is_named_by_its_date_and_kind() -> None:
    from datetime import UTC, datetime

    when = datetime(2026, 12, 2, 1, 30, tzinfo=UTC)
    assert results.results_name("make-bench", when) == "2026-12-02T0130Z-make-bench.json"


def test_the_plot_is_drawn_where_matplotlib_is(tmp_path: Path) -> None:
    python = REPO / ".venv-bench" / "bin" / "python"
    if not python.exists() or subprocess.run([str(python), "-c", "import matplotlib"], check=False).returncode:
        pytest.skip("no bench venv with matplotlib here (`make bench` makes one)")
    page = tmp_path / "performance.md"
    section = results.Section("1. throughput", key="throughput", params={"jobs": 16, "slots": 8})
    wall = section.table("wall", [results.Column("tool", "tool", "left"), results.Column("wall", "wall")])
    wall.add("xargs -P8", "xargs -P8", results.Measure.of([0.02, 0.03], "s"))
    wall.add("supervisor, batches of 100", "supervisor, batches of 100", results.Measure.of([0.1, 0.2], "s"))
    path = tmp_path / "2026-12-02T0130Z-make-bench.json"
    results.add_sections(path, [section], results.run_header("make-bench", label=None))
    done = subprocess.run(
        [str(python), str(REPO / "bench" / "report.py"), str(path), "--out", str(page), "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "img" / "bench-latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "](img/bench-latest.png)" in page.read_text()
