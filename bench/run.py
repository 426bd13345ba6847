"""Benchmarks of the registry's hot paths; results are appended to docs/performance.md.

Usage: make bench   (or .venv/bin/python bench/run.py [--quick])

What is measured, and why:
- a sweep's registry read (``running_jobs``) with a small and a large history: it must cost O(running rows), not
  O(history) — the status index makes it so;
- one job's registry round trip (enqueue → promote → set process → finalize), the cost drain pays per job;
- ``list_jobs`` first page with a large history (the operator's view).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from supervisor import JobStatus, SqliteRegistry  # noqa: E402
from supervisor._registry import hash_token  # noqa: E402


def timed(fn: Callable[[], object], repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def fill_history(reg: SqliteRegistry, n: int) -> None:
    """n finished rows, written in one transaction (setup, not measured)."""
    now = datetime.now(UTC).isoformat()
    with reg._tx() as conn:
        conn.executemany(
            "INSERT INTO jobs (job_id, kind, params, argv, status, created_at, ended_at) "
            "VALUES (?, 'k', '{}', '[]', 'succeeded', ?, ?)",
            ((f"h{i}", now, now) for i in range(n)),
        )


def bench(history: int, running: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        reg = SqliteRegistry(Path(tmp) / "jobs.sqlite3")
        fill_history(reg, history)
        for i in range(running):
            reg.enqueue("k", {"i": i}, ["x"])
            job = reg.promote_queued_if_slot(running, boot_id="b", token_hash=hash_token("t"))
            assert job is not None
            reg.set_job_process(job.job_id, pid=1000 + i, pid_start_time=1, kernel_boot_id="k")
        sweep = timed(reg.running_jobs, 200)
        page = timed(lambda: reg.list_jobs(limit=100), 50)

        def round_trip() -> None:
            reg.enqueue("k", {}, ["x"])
            job = reg.promote_queued_if_slot(running + 1, boot_id="b", token_hash=hash_token("t"))
            assert job is not None
            reg.set_job_process(job.job_id, pid=1, pid_start_time=1, kernel_boot_id="k")
            reg.finalize(job.job_id, JobStatus.SUCCEEDED)

        trip = timed(round_trip, 200)
        reg.close()
    return {"sweep_read_s": sweep, "list_page_s": page, "job_round_trip_s": trip}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small history only (a smoke run)")
    parser.add_argument("--no-write", action="store_true", help="print only; do not append to docs/performance.md")
    args = parser.parse_args()
    histories = [100, 10_000] if args.quick else [100, 10_000, 200_000]
    rows = []
    for history in histories:
        result = bench(history, running=5)
        rows.append((history, result))
        print(
            f"history={history:>7}  sweep read {result['sweep_read_s'] * 1e6:8.1f} µs   "
            f"list page {result['list_page_s'] * 1e3:7.2f} ms   "
            f"job round trip {result['job_round_trip_s'] * 1e3:6.2f} ms"
        )
    small, large = rows[0][1]["sweep_read_s"], rows[-1][1]["sweep_read_s"]
    ratio = large / small
    verdict = "PASS" if ratio < 3 else "FAIL"
    print(
        f"sweep read with {rows[-1][0]} vs {rows[0][0]} history rows: x{ratio:.2f} ({verdict}: target < x3, O(running))"
    )
    if not args.no_write:
        write(rows, ratio, verdict)
    return 0 if verdict == "PASS" else 1


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def write(rows: list[tuple[int, dict[str, float]]], ratio: float, verdict: str) -> None:
    doc = REPO / "docs" / "performance.md"
    if not doc.exists():
        doc.write_text(
            "# Performance\n\nResults of `make bench` (bench/run.py), newest last. Targets are checked here, never by "
            "timed assertions in unit tests.\n"
        )
    machine = f"{cpu_model()} · {os.cpu_count()} cores · {platform.machine()} · Python {platform.python_version()}"
    lines = [
        "",
        f"## {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} — {machine}",
        "",
        "| history rows | sweep read (running_jobs, 5 running) | list_jobs first page (100) | job round trip |",
        "|---:|---:|---:|---:|",
    ]
    for history, r in rows:
        lines.append(
            f"| {history} | {r['sweep_read_s'] * 1e6:.1f} µs | {r['list_page_s'] * 1e3:.2f} ms | "
            f"{r['job_round_trip_s'] * 1e3:.2f} ms |"
        )
    lines.append("")
    lines.append(
        f"Sweep read cost grows x{ratio:.2f} from the smallest to the largest history: **{verdict}** (target < x3)."
    )
    with doc.open("a") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
