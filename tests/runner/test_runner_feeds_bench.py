"""The feed benchmark's smoke run: bench/feeds.py must keep working (the figures themselves live in the results files
of bench/results/ and in docs/performance.md; nothing here is timed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "feeds.py"


def load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_feeds", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_feed_has_the_asked_size_and_items() -> None:
    bench = load_bench()
    document = bench.generate_feed(300, 600_000)
    assert 0.9 * 600_000 < len(document) < 1.05 * 600_000
    assert document.count(b"<item>") == 300


def test_smoke_run_parses_every_generated_episode_in_child_processes(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench()
    sets = bench.data_sets(smoke=True)
    results = bench.bench("pipeline_runner", sets, runs=3, trace=False)
    assert results["big"]["episodes"] == 200 and results["small"]["episodes"] == 5 * 20
    assert all(len(r["times_s"]) == 3 and r["extra_rss_mb"] >= 0 for r in results.values())
    assert bench.main(["--smoke", "--no-write"]) == 0
    assert "200 episodes" in capsys.readouterr().out
