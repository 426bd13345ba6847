"""Scenario 7: the registry's hot paths, in-process (no HTTP): what a sweep, a list page and one job's round trip
cost as the history grows.

Usage: .venv/bin/python bench/registry.py [--smoke] [--runs R]

What is measured, and why:
- a sweep's registry read (``running_jobs``) with a small and a large history of terminal rows: it must cost
  O(running rows), not O(history) — the status index makes it so;
- one job's registry round trip (enqueue → promote → set process → finalize), the cost drain pays per job;
- ``list_jobs`` first page with a large history (the operator's view).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import Column, Figure, Section, progress

from supervisor import JobStatus, SqliteRegistry
from supervisor.domain import IdentityRecord, JobFilter, PageRequest, hash_token, to_iso, utc_now
from supervisor.registry import Ending, IdentityClaim, NewJob, Outcome, PromoteRequest

RUNNING = 5


async def timed(fn: Callable[[], Awaitable[object]], repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def fill_history(reg: SqliteRegistry, n: int) -> None:
    """n finished rows, written in one transaction straight into the file (setup, not measured): one in 100 failed
    with ``all_feeds_unavailable``, each of 200 feeds one row in 200 (what an operator's search looks for)."""
    now = to_iso(utc_now())
    with reg.file.tx() as conn:
        conn.executemany(
            "INSERT INTO jobs (job_id, kind, params, argv, status, error_reason, created_at, ended_at, "
            "enqueued_release) VALUES (?, 'k', ?, '[]', ?, ?, ?, ?, 'bench')",
            (
                (
                    f"h{i}",
                    json.dumps({"feed": f"https://f{i % 200}.example/"}),
                    "failed" if i % 100 == 0 else "succeeded",
                    "all_feeds_unavailable" if i % 100 == 0 else None,
                    now,
                    now,
                )
                for i in range(n)
            ),
        )


IDENTITY = IdentityRecord("process", {"pid": 1, "pid_start_time": 1, "kernel_boot_id": "k"})


async def _promote_one(reg: SqliteRegistry, max_concurrent: int) -> str:
    promotion = await reg.promote(PromoteRequest(max_concurrent, "b", [hash_token("t")]))
    [job] = promotion.jobs
    await reg.record_identities([IdentityClaim(job.job_id, IDENTITY)])
    return job.job_id


async def _bench(history: int, running: int, repeat: int) -> dict[str, float]:
    """Each call as the supervisor makes it: through the ``Registry`` interface (a worker thread per call)."""
    with tempfile.TemporaryDirectory() as tmp:
        reg = SqliteRegistry(Path(tmp) / "jobs.sqlite3")
        fill_history(reg, history)
        for i in range(running):
            await reg.enqueue(NewJob("k", {"i": i}, ["x"]))
            await _promote_one(reg, running)
        sweep = await timed(reg.running_jobs, repeat)
        page = await timed(lambda: reg.list_jobs(PageRequest(limit=100)), max(5, repeat // 4))
        by_reason = JobFilter(reason="all_feeds_unavailable")
        reason = await timed(lambda: reg.list_jobs(PageRequest(by_reason, 100)), max(5, repeat // 4))
        by_feed = JobFilter(params=(("feed", "https://f7.example/"),))
        param = await timed(lambda: reg.list_jobs(PageRequest(by_feed, 100)), max(5, repeat // 4))

        async def round_trip() -> None:
            await reg.enqueue(NewJob("k", {}, ["x"]))
            job_id = await _promote_one(reg, running + 1)
            await reg.finalize(job_id, Ending(Outcome(JobStatus.SUCCEEDED)))

        trip = await timed(round_trip, repeat)
        await reg.aclose()
    return {
        "sweep_read_s": sweep,
        "list_page_s": page,
        "reason_page_s": reason,
        "param_page_s": param,
        "job_round_trip_s": trip,
    }


def bench(history: int, running: int, repeat: int) -> dict[str, float]:
    return trio.run(_bench, history, running, repeat)


def measure(*, smoke: bool, runs: int) -> Section:
    histories = [100, 2_000] if smoke else [100, 100_000]
    repeat = 20 if smoke else 200
    results: dict[int, list[dict[str, float]]] = {h: [] for h in histories}
    for run in range(runs):
        for history in histories:
            progress(f"registry run {run + 1}/{runs}: history {history}")
            results[history].append(bench(history, RUNNING, repeat))
    section = Section(
        f"7. Registry hot paths, in-process ({runs} runs of {repeat} calls, median (min-max))",
        key="registry",
        script="bench/registry.py",
        params={"histories": histories, "running": RUNNING, "calls": repeat, "runs": runs, "smoke": smoke},
    )
    table = section.table(
        "registry",
        [
            Column("history", "terminal rows"),
            Column("sweep_read", f"sweep read (running_jobs, {RUNNING} running)"),
            Column("list_page", "list_jobs first page (100)"),
            Column("reason_page", "… filtered by reason (1 row in 100)"),
            Column("param_page", "… by a param's value (1 in 200)"),
            Column("round_trip", "job round trip"),
        ],
    )

    def fig(history: int, key: str) -> Figure:
        return Figure.of([r[key] for r in results[history]])

    for history in histories:
        table.add(
            str(history),
            f"{history:,}",
            fig(history, "sweep_read_s").measure(1e6, "µs", 1),
            fig(history, "list_page_s").measure(1e3, "ms"),
            fig(history, "reason_page_s").measure(1e3, "ms"),
            fig(history, "param_page_s").measure(1e3, "ms"),
            fig(history, "job_round_trip_s").measure(1e3, "ms"),
        )
    small, large = histories[0], histories[-1]
    ratio = fig(large, "sweep_read_s").median / fig(small, "sweep_read_s").median
    section.target(
        ratio < 3,
        f"sweep read with {large:,} vs {small:,} terminal rows: x{ratio:.2f} (target < x3: O(running))",
        key="sweep_o_running",
        value=ratio,
        op="<",
        threshold=3.0,
        unit="x",
    )
    if smoke:
        section.notes.append("smoke run: tiny N, the figures say nothing about speed")
    return section


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="small history, one run: proves the script still works")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    measure(smoke=args.smoke, runs=args.runs or (1 if args.smoke else 3)).print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
