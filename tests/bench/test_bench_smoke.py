"""The benchmarks' smoke runs (bench/README.md): every bench script still runs end to end on a tiny N, so none can rot.

What is checked is that each script runs and reports every scenario, and the one structural fact the footprint
establishes (no per-job helper process) — never how fast anything is: speed targets are PASS/MISS lines of
`make bench`, not assertions. A peer whose binary is missing (task-spooler, GNU parallel, redis-server, RQ in the
bench venv) is skipped by the script with its reason printed, so nothing here needs apt or the network.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# A backstop for a wedged run; a smoke run takes seconds.
SMOKE_LIMIT_S = 240

pytestmark = pytest.mark.e2e

TARGET_LINE = re.compile(r"^\s*(PASS|MISS|SKIP)  ", re.MULTILINE)


def run_bench(script: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), "--smoke", *args],
        capture_output=True,
        text=True,
        timeout=SMOKE_LIMIT_S,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


def table_row(output: str, name: str) -> str:
    rows = [line for line in output.splitlines() if line.startswith(f"| {name} |")]
    assert len(rows) == 1, f"no single row for {name!r} in:\n{output}"
    return rows[0]


def test_throughput_smoke_measures_the_supervisor_both_ways_and_each_peer_or_says_why_not() -> None:
    out = run_bench("throughput.py")
    for peer in (
        "xargs -P8",
        "task-spooler -S 8",
        "GNU parallel -j8",
        "RQ, 8 SimpleWorkers",
        "RQ, 8 fork-per-job Workers",
    ):
        row = table_row(out, peer)
        assert re.search(r"\| [0-9.]+ s \(", row) or "skipped: " in row, row
    assert re.search(r"\| [0-9.]+ s \(", table_row(out, "xargs -P8"))  # the baseline always runs
    for mode in ("supervisor, batches of 100", "supervisor, one POST per job"):
        assert re.search(r"\| [0-9.]+ s \(", table_row(out, f"**{mode}**"))
    assert "jobs in batches: x" in out
    # Where the CPU went, per job and per process.
    for mode in ("supervisor, batches of 100", "supervisor, one POST per job"):
        cells = [cell.strip() for cell in table_row(out, mode).strip("|").split("|")[1:]]
        assert len(cells) == 5, cells  # supervisor, shepherd, client, the rest, the whole machine
        medians = [float(cell.split()[0]) for cell in cells]
        # /proc counts in clock ticks (10 ms): only the supervisor surely used several in a smoke run's few jobs.
        assert medians[0] > 0 and medians[4] >= medians[0], cells
    assert len(TARGET_LINE.findall(out)) == 3  # batches vs xargs, and one POST per job vs each RQ mode


def test_latency_smoke_reports_promotion_enqueue_and_detection() -> None:
    out = run_bench("latency.py")
    for title in ("== 2. Promotion latency", "== 3. Enqueue latency", "== 4. Detection"):
        assert title in out
    assert "| open loop 200/s |" in out and "| open loop 500/s |" in out and "| saturation (closed loop) |" in out
    assert "saturation throughput: " in out
    targets = TARGET_LINE.findall(out)
    assert len(targets) == 3


def test_footprint_smoke_finds_no_process_per_job_but_the_job_itself() -> None:
    out = run_bench("footprint.py")
    assert "== 5. Footprint: 10 running sleep jobs" in out
    assert "| **together** |" in out
    # The shepherd design's point: one shepherd for every job, and no helper process per job.
    assert "10 job processes (`sleep`) under the shepherd, 0 other process(es)" in out
    assert "PASS  10 jobs: nothing per job but the job's own process (0 extra)" in out
    assert "== 6. Heartbeats with 10 running jobs" in out
    assert re.search(
        r"^\| [0-9]+ \([0-9]+-[0-9]+\) \| [0-9.]+ ms \([0-9.]+-[0-9.]+\) \| [1-9][0-9]* \| 0 \|$", out, re.MULTILINE
    ), out
    # The floor under a heartbeat, measured with the same load in the same run: both servers answered, so each has
    # a rate and a CPU per request, and the supervisor's CPU is read against each.
    for server in ("hypercorn, an empty ASGI app", "trio's sockets, no HTTP library"):
        row = re.search(rf"^\| {re.escape(server)} \| ([0-9]+) \(.*\) \| ([0-9.]+) ms \(.*\) \| [0-9.]+ \(", out, re.M)
        assert row, out
        assert int(row[1]) > 0 and float(row[2]) > 0
    assert re.search(r"hypercorn with an empty app answers [1-9][0-9]* requests/s here", out), out


def run_script(script: str, *args: str) -> str:
    """A bench script (or the report) with these arguments, no --smoke added."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=SMOKE_LIMIT_S,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")},
        check=False,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


def repository_outputs() -> dict[str, float]:
    """What a smoke run must never touch: the repository's page, its images and its results files."""
    paths = [
        REPO / "docs" / "performance.md",
        *(REPO / "docs" / "img").glob("*"),
        *(REPO / "bench" / "results").glob("*"),
    ]
    return {str(p): p.stat().st_mtime for p in paths if p.exists()}


def test_make_bench_writes_one_results_file_and_the_page_renders_from_it(tmp_path: Path) -> None:
    """`make bench` in miniature, into a temp dir: run.py, feeds.py, outbox.py and exec_modes.py add their scenarios
    to one results file; bench/report.py renders the page from it; --compare puts two runs side by side."""
    untouched = repository_outputs()
    results = tmp_path / "results" / "2026-12-02T0130Z-make-bench.json"
    out = run_bench("run.py", "--only", "registry", "--results", str(results), "--label", "smoke-before")
    assert "PASS  sweep read with 2,000 vs 100 terminal rows" in out or "MISS  sweep read" in out
    run_bench("feeds.py", "--results", str(results))
    run_bench("outbox.py", "--results", str(results))
    run_bench("exec_modes.py", "--results", str(results))

    data = json.loads(results.read_text())
    assert (data["schema"], data["kind"], data["label"], data["smoke"]) == (1, "make-bench", "smoke-before", True)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["date"])
    machine = data["machine"]
    assert machine["nproc"] >= 1 and machine["cpu"] and machine["kernel"] and machine["tmp_filesystem"]
    assert machine["memory_gib"] > 0 and set(machine["speed_probe"]) == {"python_ms", "spawn_us", "handoff_us"}
    assert {"python", "trio", "hypercorn", "quart", "h11", "httpx", "docker", "sqlite"} <= set(data["versions"])
    assert {"xargs", "task-spooler", "parallel", "rq"} <= set(data["peers"])
    assert data["revision"]["commit"] and data["revision"]["supervisor"]
    assert [s["key"] for s in data["scenarios"]] == ["registry", "feeds", "outbox", "exec_modes"]
    registry = data["scenarios"][0]
    [table] = registry["tables"]
    sweep = table["rows"][0]["cells"]["sweep_read"]
    # Raw runs, their median, min and max, in the unit shown.
    assert sweep["unit"] == "µs" and len(sweep["runs"]) == 1 and sweep["median"] == sweep["min"] == sweep["runs"][0]
    [target] = registry["targets"]
    assert target["verdict"] in ("PASS", "MISS") and target["threshold"] == 3.0 and target["op"] == "<"
    feeds = data["scenarios"][1]
    assert len(feeds["tables"][0]["rows"][0]["cells"]["time"]["runs"]) == feeds["params"]["runs"] == 5
    assert {t["key"] for t in feeds["targets"]} == {"big_feed_time", "big_feed_memory"}

    # The page, rendered from that file into the temp dir (the plot only where matplotlib is installed).
    page = tmp_path / "docs" / "performance.md"
    run_script("report.py", str(results), "--out", str(page), "--results-dir", str(results.parent))
    text = page.read_text()
    assert text.startswith("# Performance\n") and "Generated by bench/report.py" in text
    for heading in ("## The run shown here", "## Targets", "## Throughput", "## Latency", "## Registry hot paths",
                    "## Feed parsing", "## Chaos", "## Soak"):  # fmt: skip
        assert f"\n{heading}" in text, heading
    assert "| label | smoke-before |" in text and "| speed probe | pure-Python work " in text
    assert "**A smoke run: tiny N, one run." in text
    assert "| terminal rows | sweep read (running_jobs, 5 running) |" in text
    assert "| write path | outbox off | outbox on |" in text and "| subprocess | 4 | 2 |" in text
    target_row = r"^\| registry \| sweep read with 2,000 vs 100 terminal rows: x[0-9.]+ .*\| (PASS|\*\*MISS\*\*) \|$"
    assert re.search(target_row, text, re.MULTILINE), text
    assert "_No `throughput` results in the files rendered" in text
    assert not re.search(r"^\{\{.*\}\}$", text, re.MULTILINE)  # every placeholder line was replaced

    # Before and after: a second run, then both side by side with their ratio.
    after = tmp_path / "results" / "2026-12-02T0200Z-make-bench.json"
    run_bench("run.py", "--only", "registry", "--results", str(after), "--label", "smoke-after")
    compared = run_script("report.py", "--compare", str(results), str(after))
    assert compared.startswith("## Before and after\n")
    assert "**Before: smoke-before. After: smoke-after.**" in compared
    assert re.search(r"^\| registry \| 2,000 — job round trip \| [0-9.]+ ms \(.*\) \| [0-9.]+ ms \(.*\) \| [0-9.]+ \|$",
                     compared, re.MULTILINE), compared  # fmt: skip
    assert "| registry | sweep_o_running |" in compared

    assert repository_outputs() == untouched  # nothing written into the repository's docs/ or bench/results/


@pytest.mark.postgres
def test_fleet_smoke_measures_one_and_two_supervisors_on_one_database() -> None:
    """bench/fleet.py on the test server (a schema of its own per run, dropped after): both fleet sizes ran every
    job, and the table, the CPU table and the per-host shares are reported."""
    database_url = os.environ["PODCAST_JOB_TEST_DATABASE_URL"]  # the postgres mark skips without it
    out = run_bench("fleet.py", "--database-url", database_url)
    assert "== Fleet throughput: 40 jobs of /bin/true on 8 fleet-wide slots" in out, out
    for hosts in ("1", "2"):
        rate = re.search(rf"^\| {hosts} \| ([0-9]+) \([0-9]+-[0-9]+\) \| [0-9.]+ \(.*\) \| [0-9]+ ms \(", out, re.M)
        assert rate and int(rate[1]) > 0, out
        shares = re.search(rf"^- {hosts} host\(s\): jobs started per host, each run: \{{(.*)\}}$", out, re.M)
        assert shares, out
        started = {name: int(n) for name, n in (part.split() for part in shares[1].split(", "))}
        assert set(started) <= {f"h{i + 1}" for i in range(int(hosts))} and sum(started.values()) == 40, started
    assert "PostgreSQL's CPU not measured: the server named by --database-url is not the bench's own" in out


@pytest.mark.postgres
@pytest.mark.pgbouncer
def test_pooler_smoke_measures_a_round_trip_direct_and_behind_pgbouncer() -> None:
    """bench/pooler.py on the test server and its pgbouncer (a schema of its own per way, dropped after): the three
    ways each ran, and the ratio to direct is reported."""
    database_url = os.environ["PODCAST_JOB_TEST_DATABASE_URL"]  # the marks skip without them
    pooler_url = os.environ["PODCAST_JOB_TEST_PGBOUNCER_URL"]
    out = run_bench("pooler.py", "--database-url", database_url, "--pooler-url", pooler_url)
    for way in ("direct (the default)", "pooler mode, straight at PostgreSQL", "pooler mode, through pgbouncer"):
        line = rf"^{re.escape(way)}: ([0-9.]+) ms \([0-9.]+-[0-9.]+\) per round trip \(x([0-9.]+)\)$"
        found = re.search(line, out, re.M)
        assert found and float(found[1]) > 0, out
        if way.startswith("direct"):
            assert found[2] == "1.00"


@pytest.mark.postgres
def test_migration_smoke_times_promotions_while_an_expand_migration_runs() -> None:
    """bench/migration.py on the test server (a schema of its own, dropped after): both ways ran while the promoter
    promoted, and each says its longest promotion."""
    database_url = os.environ["PODCAST_JOB_TEST_DATABASE_URL"]  # the postgres mark skips without it
    out = run_bench("migration.py", "--database-url", database_url)
    assert "filled 20,000 rows" in out, out
    for way in ("expand (13-15, CONCURRENTLY)", "the same index built in a transaction"):
        found = re.search(rf"^{re.escape(way)}: .*'during_longest_s': ([0-9.e-]+)", out, re.M)
        assert found and float(found[1]) > 0, out


def test_deep_queue_smoke_times_an_end_and_a_promotion_at_each_depth() -> None:
    out = run_bench("deep_queue.py")
    for depth in (100, 1000):
        assert re.search(rf"^\s*{depth} queued: this tree [0-9.]+ ms per end \+ promotion$", out, re.MULTILINE), out
