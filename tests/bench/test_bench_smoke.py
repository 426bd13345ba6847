"""The benchmarks' smoke runs (issue 10): every bench script still runs end to end on a tiny N, so none can rot.

What is checked is that each script runs and reports every scenario, and the one structural fact the footprint
establishes (no per-job helper process) — never how fast anything is: speed targets are PASS/MISS lines of
`make bench`, not assertions. A peer whose binary is missing (task-spooler, GNU parallel, redis-server, RQ in the
bench venv) is skipped by the script with its reason printed, so nothing here needs apt or the network.
"""

from __future__ import annotations

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
    assert re.search(r"here hypercorn with an empty app answers [1-9][0-9]* requests/s", out), out


def test_make_bench_appends_a_dated_section_with_machine_versions_and_targets(tmp_path: Path) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\nan earlier section\n")
    out = run_bench("run.py", "--only", "registry", "--doc", str(doc))
    assert "PASS  sweep read with 2,000 vs 100 terminal rows" in out or "MISS  sweep read" in out
    text = doc.read_text()
    assert text.startswith("# Performance\n\nan earlier section\n")  # earlier sections are kept
    assert re.search(r"^## \d{4}-\d\d-\d\d \d\d:\d\d UTC — make bench", text, re.MULTILINE)
    assert "nproc " in text and "Versions: " in text and "supervisor 0." in text
    # The speed probe, so that two runs on different machines are compared knowingly.
    assert re.search(r"pure-Python work [0-9.]+ ms, start and reap `/bin/true` [0-9]+ µs, a thread hand-off", text)
    assert "**Targets**" in text and "### 7. Registry hot paths" in text
