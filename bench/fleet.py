"""Enqueue-to-start throughput of a fleet: 1, 2 and 3 ``supervisor serve`` processes on one PostgreSQL database.

Usage: .venv/bin/python bench/fleet.py [--database-url URL] [--jobs N] [--runs R] [--results FILE] [--no-write]
                                       [--smoke]

Each run starts N real supervisors (subprocess mode, each its own data dir and host id) on a fresh schema of one
PostgreSQL database, with one fleet-wide limit of 8 slots, and enqueues the same total load — ``--jobs`` (default
1,200) jobs of ``/bin/true``, by batches of 100 — split evenly over the N hosts' APIs at once (a host learns of work
enqueued elsewhere only at its next sweep, so every host is handed its share). It waits until every row has ended,
then reads every row back from the API: a job's enqueue-to-start latency is its ``created_at`` to ``started_at``
(the registry's timestamps, written by the hosts of this one machine: one clock); the throughput is the jobs started
per second from the first enqueue to the last start. The CPU is read from /proc: the supervisors and their shepherds,
the load client, PostgreSQL, and the rest of the machine (whatever else this shared machine runs).

The three fleet sizes are measured in turn within each run (1, 2, 3, 1, 2, 3, ...), so the ratios compare them under
the same background load. The database is a throwaway cluster of the bench's own (``scripts/postgres.sh`` on a free
port, stopped and removed at the end), so that PostgreSQL's CPU can be measured too; ``--database-url`` names another
(then its CPU is not measured). The results are added to ``--results`` (``make bench`` names its run's file; alone:
bench/results/<UTC date>-fleet.json) unless ``--no-write``; ``--smoke`` is 1 and 2 hosts, 40 jobs, one run, written
only to ``--results``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import AsyncExitStack, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    HTTP_TIMEOUT,
    REPO,
    Column,
    Section,
    Supervisor,
    cpu_seconds,
    descendants,
    enqueue_jobs,
    free_port,
    iso_ts,
    machine_cpu_seconds,
    percentile,
    process_table,
    progress,
    save_sections,
    scratch,
)
from results import Measure

SLOTS = 8  # fleet-wide PODCAST_JOB_MAX_CONCURRENT, as in the single-host throughput scenario
BATCH = 100
RUN_TIMEOUT_S = 300.0
SQL_TIMEOUT_S = 30.0
FLEETS = (1, 2, 3)


@dataclass
class FleetRun:
    hosts: int
    jobs: int
    started_per_s: float
    latencies_s: list[float]
    wall_s: float  # first enqueue to the last job's end
    ran_on: dict[str, int]  # host id -> jobs it started
    cpu_s: dict[str, float]  # supervisors (with their shepherds), client, postgres, rest, machine
    machine_busy: float  # the machine's busy CPU over the run, as a fraction of every core


@dataclass
class Server:
    """The PostgreSQL server measured: its URL, and its postmaster's pid when it is this bench's own (then its CPU,
    every backend's included, is measured too)."""

    url: str
    postmaster: int | None


@contextmanager
def private_cluster() -> Iterator[Server]:
    """A throwaway cluster of this bench's own (scripts/postgres.sh on a free port, in a directory of its own):
    nothing else connects to it, so its processes' CPU is the fleet's. Stopped and removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="bench-fleet-pg-"))
    env = {**os.environ, "PG_WORK": str(work), "PG_PORT": str(free_port()), "PG_DB": "bench_fleet"}
    script = str(REPO / "scripts" / "postgres.sh")
    try:
        done = subprocess.run(["bash", script, "up"], env=env, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"scripts/postgres.sh up failed: {done.stderr.strip()}")
        cluster = Path((work / "cluster").read_text().strip())
        postmaster = int((cluster / "data" / "postmaster.pid").read_text().split()[0])
        yield Server(done.stdout.strip(), postmaster)
    finally:
        subprocess.run(["bash", script, "down"], env=env, capture_output=True, timeout=180, check=False)
        shutil.rmtree(work, ignore_errors=True)


def server_cpu(server: Server) -> dict[int, float]:
    """pid -> CPU seconds of the server's processes (the postmaster and every backend), now; none for a server that
    is not this bench's own."""
    if server.postmaster is None:
        return {}
    pids = [server.postmaster, *descendants(server.postmaster, process_table())]
    return {pid: cpu for pid in pids if (cpu := cpu_seconds(pid)) is not None}


async def _sql(dsn: str, query: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=SQL_TIMEOUT_S)
    try:
        await conn.execute(query, timeout=SQL_TIMEOUT_S)
    finally:
        await conn.close(timeout=SQL_TIMEOUT_S)


def sql(dsn: str, query: str) -> None:
    """One statement on its own connection (the bench's own: the supervisors are other processes)."""
    asyncio.run(_sql(dsn, query))


def shepherds_cpu(sup: Supervisor) -> float:
    """CPU of the shepherds this supervisor started (each starts with its first job: all its CPU is this run's)."""
    pids = {s.shepherd_pid for s in sup.job_states() if s.shepherd_pid is not None}
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


def run_fleet(server: Server, hosts: int, jobs: int) -> FleetRun:
    database_url = server.url
    schema = f"bench_fleet_{uuid.uuid4().hex[:12]}"
    sql(database_url, f'CREATE SCHEMA "{schema}"')
    try:
        with scratch(f"fleet{hosts}") as tmp, ExitStack() as stack:
            sups = []
            for i in range(hosts):
                root = tmp / f"{tmp.name}-h{i + 1}"  # the shepherd trace's name in /dev/shm is the root's
                root.mkdir()
                env = {
                    "PODCAST_JOB_DATABASE_URL": f"{database_url}?search_path={schema}",
                    "PODCAST_JOB_HOST_ID": f"h{i + 1}",
                }
                sups.append(stack.enter_context(Supervisor(root, max_concurrent=SLOTS, extra_env=env)))
            return measure_fleet(server, sups, jobs)
    finally:
        sql(database_url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def measure_fleet(server: Server, sups: list[Supervisor], jobs: int) -> FleetRun:
    shares = [jobs // len(sups) + (1 if i < jobs % len(sups) else 0) for i in range(len(sups))]

    async def drive() -> tuple[float, float, list[dict[str, Any]]]:
        async with AsyncExitStack() as clients, trio.open_nursery() as nursery:
            conns = [
                await clients.enter_async_context(httpx.AsyncClient(base_url=s.url, timeout=HTTP_TIMEOUT)) for s in sups
            ]
            t0 = time.time()
            c0 = time.process_time()
            for client, share in zip(conns, shares, strict=True):
                batch = [{"kind": "noop", "params": {}}] * share
                nursery.start_soon(lambda c=client, b=batch: enqueue_jobs(c, b, batch_size=BATCH, batch_route=True))
        async with httpx.AsyncClient(base_url=sups[0].url, timeout=HTTP_TIMEOUT) as client:
            with trio.fail_after(RUN_TIMEOUT_S):
                while True:  # the rows are the measurement: poll them (no event crosses processes)
                    state = (await client.get("/api/queue", timeout=HTTP_TIMEOUT)).json()
                    if state["queued"] == 0 and state["running"] == 0:
                        break
                    await trio.sleep(0.05)
            client_cpu = time.process_time() - c0
            rows: list[dict[str, Any]] = []
            cursor: str | None = None
            while True:
                params = {"limit": 500, **({"cursor": cursor} if cursor else {})}
                page = (await client.get("/api/jobs", params=params, timeout=HTTP_TIMEOUT)).json()
                rows += page["jobs"]
                if (cursor := page["next_cursor"]) is None:
                    break
        return t0, client_cpu, rows

    pids = [s.proc.pid for s in sups if s.proc is not None]
    sup_cpu0 = sum(cpu_seconds(pid) or 0.0 for pid in pids)
    machine0, wall0, server0 = machine_cpu_seconds(), time.monotonic(), server_cpu(server)
    t0, client_cpu, rows = trio.run(drive)
    wall = time.monotonic() - wall0
    # A backend that ended during the run takes its CPU with it: the pools' connections live as long as the hosts.
    server_s = sum(cpu - server0.get(pid, 0.0) for pid, cpu in server_cpu(server).items())
    sup_cpu = sum(cpu_seconds(pid) or 0.0 for pid in pids) - sup_cpu0 + sum(shepherds_cpu(s) for s in sups)
    machine = machine_cpu_seconds() - machine0
    statuses = {row["status"] for row in rows}
    if len(rows) != jobs or statuses != {"succeeded"}:
        raise RuntimeError(f"{len(sups)} hosts: expected {jobs} succeeded jobs, got {len(rows)} ({statuses})")
    starts = [iso_ts(row["started_at"]) for row in rows]
    ran_on: dict[str, int] = {}
    for row in rows:
        ran_on[row["host_id"]] = ran_on.get(row["host_id"], 0) + 1
    return FleetRun(
        hosts=len(sups),
        jobs=jobs,
        started_per_s=jobs / (max(starts) - t0),
        latencies_s=[iso_ts(row["started_at"]) - iso_ts(row["created_at"]) for row in rows],
        wall_s=max(iso_ts(row["ended_at"]) for row in rows) - t0,
        ran_on=dict(sorted(ran_on.items())),
        cpu_s={
            "supervisors": sup_cpu,
            "client": client_cpu,
            "postgres": server_s if server.postmaster is not None else math.nan,
            "rest": max(0.0, machine - sup_cpu - client_cpu - (server_s if server.postmaster is not None else 0.0)),
            "machine": machine,
        },
        machine_busy=machine / (wall * (os.cpu_count() or 1)),
    )


def measure(server: Server, *, fleets: tuple[int, ...], jobs: int, runs: int, smoke: bool) -> Section:
    results: dict[int, list[FleetRun]] = {n: [] for n in fleets}
    for run in range(runs):
        for n in fleets:
            progress(f"fleet run {run + 1}/{runs}: {n} host(s), {jobs} jobs")
            results[n].append(run_fleet(server, n, jobs))
    section = Section(
        f"Fleet throughput: {jobs:,} jobs of /bin/true on {SLOTS} fleet-wide slots, 1 to {max(fleets)} supervisors on "
        "one PostgreSQL database",
        key="fleet",
        script="bench/fleet.py",
        params={"jobs": jobs, "slots": SLOTS, "batch": BATCH, "fleets": list(fleets), "runs": runs, "smoke": smoke},
    )
    table = section.table(
        "fleet",
        [
            Column("hosts", "supervisors", "left"),
            Column("rate", "started/s"),
            Column("ratio", "x 1 host"),
            Column("p50", "enqueue→start p50"),
            Column("p95", "p95"),
            Column("p99", "p99"),
            Column("wall", "first enqueue → last end"),
        ],
    )
    base = Measure.of([r.started_per_s for r in results[fleets[0]]]).median
    for n in fleets:
        rs = results[n]
        table.add(
            f"hosts_{n}",
            f"{n}",
            Measure.of([r.started_per_s for r in rs], "", 0),
            Measure.of([r.started_per_s / base for r in rs], "", 2),
            Measure.of([percentile(r.latencies_s, 50) * 1e3 for r in rs], "ms", 0),
            Measure.of([percentile(r.latencies_s, 95) * 1e3 for r in rs], "ms", 0),
            Measure.of([percentile(r.latencies_s, 99) * 1e3 for r in rs], "ms", 0),
            Measure.of([r.wall_s for r in rs], "s", 2),
        )
    cpu = section.table(
        "fleet_cpu",
        [
            Column("hosts", "supervisors", "left"),
            Column("supervisors", "supervisors + shepherds", unit_in_header=True),
            Column("client", "load client", unit_in_header=True),
            Column("postgres", "PostgreSQL", unit_in_header=True),
            Column("rest", "the rest (other work on this machine)", unit_in_header=True),
            Column("machine", "whole machine", unit_in_header=True),
            Column("busy", "machine busy, % of all cores"),
        ],
        intro="CPU per job (ms), from /proc over each run:",
    )
    for n in fleets:
        rs = results[n]
        keys = ("supervisors", "client", "postgres", "rest", "machine")
        cells = [Measure.of([r.cpu_s[k] * 1e3 / r.jobs for r in rs if not math.isnan(r.cpu_s[k])], "ms") for k in keys]
        cpu.add(f"hosts_{n}", f"{n}", *cells, Measure.of([r.machine_busy * 100 for r in rs], "%", 0))
    for n in fleets:
        shares = ", ".join(
            "{" + ", ".join(f"{h} {c}" for h, c in r.ran_on.items()) + "}" for r in results[n]
        )
        section.notes.append(f"{n} host(s): jobs started per host, each run: {shares}")
    section.notes.append(
        "started/s: jobs / (last started_at - first enqueue); enqueue→start: each row's created_at → started_at; the "
        f"load is split evenly over the hosts' APIs, enqueued at once by batches of {BATCH}"
    )
    return section


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--database-url",
        default=None,
        help="a PostgreSQL database to use (default: a throwaway cluster of the bench's own); each run makes a schema "
        "of its own there and drops it",
    )
    parser.add_argument("--jobs", type=int, default=1200, help="jobs per run, split over the hosts (default 1,200)")
    parser.add_argument("--runs", type=int, default=None, help="runs of every fleet size (default 3; --smoke 1)")
    parser.add_argument("--results", type=Path, help="add the results to this file")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    parser.add_argument("--smoke", action="store_true", help="1 and 2 hosts, 40 jobs, one run")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs: must be at least 1, not {args.jobs}")
    runs = args.runs or (1 if args.smoke else 3)
    if runs < 1:
        parser.error(f"--runs: must be at least 1, not {runs}")
    fleets = (1, 2) if args.smoke else FLEETS
    jobs = 40 if args.smoke else args.jobs
    with ExitStack() as stack:
        if args.database_url:
            server = Server(args.database_url, None)
        else:
            progress("starting a PostgreSQL cluster of the bench's own (scripts/postgres.sh)")
            server = stack.enter_context(private_cluster())
        section = measure(server, fleets=fleets, jobs=jobs, runs=runs, smoke=args.smoke)
    if server.postmaster is None:
        section.notes.append("PostgreSQL's CPU not measured: the server named by --database-url is not the bench's own")
    else:
        section.notes.append(
            "PostgreSQL: a throwaway cluster of the bench's own on this machine (scripts/postgres.sh: Debian's server, "
            "fsync off, 127.0.0.1); its CPU is its postmaster's and every backend's"
        )
    section.print()
    save_sections("fleet", [section], results=args.results, smoke=args.smoke, no_write=args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
