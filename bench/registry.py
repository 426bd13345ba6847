"""Scenario 7: the registry's hot paths, in-process (no HTTP): what a sweep, a list page and one job's round trip
cost as the history grows.

Usage: .venv/bin/python bench/registry.py [--smoke] [--runs R]
       .venv/bin/python bench/registry.py --filters [--history N] [--backend sqlite|postgres]... [--database-url URL]
                                          [--calls C] [--json FILE]

What is measured, and why:
- a sweep's registry read (``running_jobs``) with a small and a large history of terminal rows: it must cost
  O(running rows), not O(history) — the status index makes it so;
- one job's registry round trip (enqueue → promote → set process → finalize), the cost drain pays per job;
- ``list_jobs`` first page with a large history (the operator's view).

``--filters``: every documented filter of the job list (``docs/api.md § Routes``, the listing) on a history of
``--history`` rows (default 1,000,000) on SQLite and on PostgreSQL (``--database-url``, default
``$PODCAST_JOB_TEST_DATABASE_URL``; a fresh schema, dropped after): each filter's first page of 100 and the page after
it (the cursor), a value that matches many rows, few, and none. A figure is the median of ``--calls`` calls through
the ``Registry`` interface. The history is written straight into the tables (setup, not measured); PostgreSQL's is
then ANALYZEd, as its autovacuum would. ``BENCH_SUPERVISOR_ROOT`` names another checkout's tree to measure its
``supervisor`` (the side-by-side run: the same script on the code before).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, os.environ.get("BENCH_SUPERVISOR_ROOT") or str(Path(__file__).resolve().parent.parent))

from _common import Column, Figure, Section, progress

from supervisor import JobStatus, SqliteRegistry
from supervisor.domain import IdentityRecord, JobFilter, PageRequest, hash_token, to_iso, utc_now
from supervisor.registry import Ending, IdentityClaim, NewJob, Outcome, PostgresRegistry, PromoteRequest, Registry

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


# -- every filter on a large history ---------------------------------------------------------------------

START = utc_now().replace(microsecond=0) - timedelta(days=30)
QUEUED_TAIL = 5  # the newest rows are queued (no end, no host)


def history_row(i: int, n: int) -> tuple[object, ...]:
    """Row ``i`` of ``n``, one a second from ``START``: 1 in 10 of kind enrichment (10 rows: tidy), 1 in 100 failed
    with all_feeds_unavailable (20 rows: exit_code_1), 1 in 1,000 cancelled; four hosts (10 rows: h-rare); params
    ``feed`` (200 values), ``n`` (1,000), ``ratio`` (500 floats)."""
    kind = "tidy" if i % 100_000 == 7 else "enrichment" if i % 10 == 0 else "pipeline"
    status, reason = "succeeded", None
    if i % 100 == 0:
        status, reason = "failed", "all_feeds_unavailable"
    elif i % 50_000 == 3:
        status, reason = "failed", "exit_code_1"
    elif i % 1000 == 1:
        status = "cancelled"
    created = START + timedelta(seconds=i)
    ended: object = created + timedelta(seconds=30)
    host: object = "h-rare" if i % 100_000 == 11 else f"h{i % 4}"
    if i >= n - QUEUED_TAIL:
        status, reason, ended, host = "queued", None, None, None
    params = {"feed": f"https://f{i % 200}.example/", "n": i % 1000, "ratio": (i % 500) * 1e-05}
    return (f"h{i}", kind, json.dumps(params, sort_keys=True, separators=(",", ":")), "[]", status, reason, created,
            ended, host)  # fmt: skip


ROW_COLUMNS = ("job_id", "kind", "params", "argv", "status", "error_reason", "created_at", "ended_at", "host_id")


def filters(n: int) -> list[tuple[str, JobFilter]]:
    """Each documented filter with a value that matches many rows, few, and none."""
    end = START + timedelta(seconds=n)
    hour, week = timedelta(hours=1), timedelta(days=7)
    return [
        ("no filter (the page's own cost)", JobFilter()),
        ("status=failed (1 %)", JobFilter(status=JobStatus.FAILED)),
        ("status=cancelled (0.1 %)", JobFilter(status=JobStatus.CANCELLED)),
        (f"status=queued ({QUEUED_TAIL} rows)", JobFilter(status=JobStatus.QUEUED)),
        ("status=running (none)", JobFilter(status=JobStatus.RUNNING)),
        ("kind=enrichment (10 %)", JobFilter(kind="enrichment")),
        ("kind=tidy (10 rows)", JobFilter(kind="tidy")),
        ("kind=none (none)", JobFilter(kind="none")),
        ("reason=all_feeds_unavailable (1 %)", JobFilter(reason="all_feeds_unavailable")),
        ("reason=exit_code_1 (20 rows)", JobFilter(reason="exit_code_1")),
        ("reason=exit_code_9 (none)", JobFilter(reason="exit_code_9")),
        ("param.feed str (0.5 %)", JobFilter(params=(("feed", "https://f7.example/"),))),
        ("param.feed str (none)", JobFilter(params=(("feed", "https://nowhere.example/"),))),
        ("param.n int (0.1 %)", JobFilter(params=(("n", 7),))),
        ("param.n int (none)", JobFilter(params=(("n", 1_000_001),))),
        ("param.ratio float (0.2 %)", JobFilter(params=(("ratio", 7 * 1e-05),))),
        ("param.ratio float (none)", JobFilter(params=(("ratio", 0.5),))),
        ("param.n + param.feed (0.1 %)", JobFilter(params=(("feed", "https://f7.example/"), ("n", 7)))),
        ("since the last hour (3,600 rows)", JobFilter(created_since=end - hour)),
        ("since the first row (all)", JobFilter(created_since=START)),
        ("since tomorrow (none)", JobFilter(created_since=end + 24 * hour)),
        ("until the first hour (3,600 rows)", JobFilter(created_until=START + hour)),
        ("until the first day (86,400 rows)", JobFilter(created_until=START + 24 * hour)),
        ("until the last row (all)", JobFilter(created_until=end)),
        ("until before the first (none)", JobFilter(created_until=START - hour)),
        ("an hour a week ago (3,600)", JobFilter(created_since=end - week - hour, created_until=end - week)),
        ("ended_since the last hour (3,600 rows)", JobFilter(ended_since=end - hour)),
        ("ended_since tomorrow (none)", JobFilter(ended_since=end + 24 * hour)),
        ("host=h1 (25 %)", JobFilter(host="h1")),
        ("host=h-rare (10 rows)", JobFilter(host="h-rare")),
        ("host=h-none (none)", JobFilter(host="h-none")),
        ("failed + pipeline + since a week", JobFilter(JobStatus.FAILED, "pipeline", created_since=end - week)),
    ]  # fmt: skip


async def fill_sqlite(reg: SqliteRegistry, n: int) -> None:
    marks = ", ".join("?" * len(ROW_COLUMNS))
    sql = f"INSERT INTO jobs ({', '.join(ROW_COLUMNS)}) VALUES ({marks})"

    def rows() -> Iterator[tuple[object, ...]]:
        for i in range(n):
            row = history_row(i, n)
            yield (*row[:6], to_iso(row[6]), to_iso(row[7]) if row[7] is not None else None, row[8])  # type: ignore[arg-type]

    def write() -> None:
        with reg.file.tx() as conn:
            # Where the param side table is (migration 14), it is filled as the migration fills it, after the rows
            # and in its key's order: a trigger per row, in random key order, takes minutes for a million.
            found = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'job_params_insert'").fetchall()
            if found:
                conn.execute("DROP TRIGGER job_params_insert")
            conn.executemany(sql, rows())
            if found:
                conn.execute(
                    "INSERT INTO job_params (name, value, seq) SELECT p.key, p.value, jobs.seq "
                    "FROM jobs, json_each(jobs.params) AS p WHERE p.type IN ('integer', 'real', 'text', 'true', "
                    "'false') ORDER BY 1, 2, 3"
                )
                conn.execute(found[0][0])

    await trio.to_thread.run_sync(write)


async def _fill_postgres(url: str, schema: str, n: int) -> None:
    import asyncpg

    conn = await asyncpg.connect(url, server_settings={"search_path": schema})
    try:
        await conn.copy_records_to_table("jobs", records=(history_row(i, n) for i in range(n)), columns=ROW_COLUMNS)
        await conn.execute("ANALYZE jobs")
    finally:
        await conn.close()


async def _drop_schema(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def samples(fn: Callable[[], Awaitable[object]], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


async def _each_filter(reg: Registry, n: int, calls: int) -> dict[str, dict[str, float]]:
    """Each filter's first page and the page after it: the median and the least seconds of ``calls`` calls (on a
    shared machine the least is the code's own cost; the median has the neighbours' in it too), and the rows."""
    out: dict[str, dict[str, float]] = {}
    for name, wanted in filters(n):
        first = PageRequest(wanted, 100)
        jobs, cursor = await reg.list_jobs(first)
        following = PageRequest(wanted, 100, int(cursor)) if cursor is not None else first
        figures: dict[str, float] = {"rows": float(len(jobs))}
        for key, page in (("first", first), ("next", following)):
            taken = await samples(lambda p=page: reg.list_jobs(p), calls)  # type: ignore[misc]
            figures[f"{key}_s"], figures[f"{key}_min_s"] = statistics.median(taken), min(taken)
        out[name] = figures
        progress(
            f"{name}: {figures['first_s'] * 1e3:.2f} ms (min {figures['first_min_s'] * 1e3:.2f}), "
            f"next {figures['next_s'] * 1e3:.2f} ms (min {figures['next_min_s'] * 1e3:.2f})"
        )
    return out


async def _filters_bench(backend: str, n: int, calls: int, url: str | None) -> dict[str, dict[str, float]]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            reg = await SqliteRegistry.open(Path(tmp) / "jobs.sqlite3")
            t0 = time.perf_counter()
            await fill_sqlite(reg, n)
            progress(f"sqlite: {n:,} rows written in {time.perf_counter() - t0:.1f} s")
            try:
                return await _each_filter(reg, n, calls)
            finally:
                await reg.aclose()
    import trio_asyncio

    assert url, "PostgreSQL needs --database-url (or PODCAST_JOB_TEST_DATABASE_URL)"
    schema = f"bench_filters_{uuid.uuid4().hex[:12]}"
    async with PostgresRegistry.runtime():
        try:
            pg = await PostgresRegistry.open(url, schema=schema, outbox=False)
            t0 = time.perf_counter()
            await trio_asyncio.aio_as_trio(_fill_postgres)(url, schema, n)
            progress(f"postgres: {n:,} rows written and analyzed in {time.perf_counter() - t0:.1f} s")
            try:
                return await _each_filter(pg, n, calls)
            finally:
                await pg.aclose()
        finally:
            await trio_asyncio.aio_as_trio(_drop_schema)(url, schema)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="small history, one run: proves the script still works")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--filters", action="store_true", help="every documented filter on a large history")
    parser.add_argument("--history", type=int, default=1_000_000, help="--filters: the history's rows")
    parser.add_argument("--backend", action="append", choices=("sqlite", "postgres"), help="--filters: (both)")
    parser.add_argument("--database-url", default=os.environ.get("PODCAST_JOB_TEST_DATABASE_URL"))
    parser.add_argument("--calls", type=int, default=20, help="--filters: calls per figure (the median)")
    parser.add_argument("--json", type=Path, help="--filters: write the figures to this file")
    args = parser.parse_args()
    if not args.filters:
        measure(smoke=args.smoke, runs=args.runs or (1 if args.smoke else 3)).print()
        return 0
    history = 2_000 if args.smoke else args.history
    found = {
        backend: trio.run(_filters_bench, backend, history, args.calls, args.database_url)
        for backend in args.backend or ("sqlite", "postgres")
    }
    for backend, figures in found.items():
        worst = max(figures.values(), key=lambda f: max(f["first_s"], f["next_s"]))
        slowest = max(max(f["first_s"], f["next_s"]) for f in figures.values())
        print(f"{backend}: {history:,} rows, slowest filter page {slowest * 1e3:.2f} ms ({worst})")
    if args.json:
        args.json.write_text(json.dumps({"history": history, "calls": args.calls, "figures": found}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
