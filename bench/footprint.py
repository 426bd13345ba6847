"""Scenarios 5-6: what 500 running jobs cost the supervisor, and how many heartbeats/s it ingests with them.

Usage: .venv/bin/python bench/footprint.py [--smoke] [--runs R] [--jobs N] [--connections C]

One server per run with ``PODCAST_JOB_MAX_CONCURRENT=N`` and N jobs of the ``token_nap`` kind (it prints its
``$PODCAST_JOB_TOKEN`` and then *is* ``/bin/sleep``). With all N running:

5. Footprint: VmRSS of the supervisor and of its shepherd (named in every job's start, in its trace),
   and the process tree: the supervisor must have no child process, and the shepherd's descendants must be exactly
   the N jobs' ``sleep`` processes — no per-job helper of any kind.
6. Heartbeats: each job's token is read back with ``GET /api/jobs/{id}/log``; then a load generator (a lean raw
   HTTP/1.1 client, C keep-alive connections (16 unless told), back to back, round-robin over the N jobs) posts
   heartbeats for a fixed time. Ingested = answered 204, per second. RSS is read again after the load. The same
   load then runs, in the same run, against ``http_floor.py``: hypercorn serving an empty app, and trio's sockets
   with no HTTP library. Their CPU per request is the floor under a heartbeat on this machine, and hypercorn's rate
   is the most requests a second that one event loop on hypercorn takes here: the heartbeat target is read against
   both.
"""

from __future__ import annotations

import argparse
import json
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BATCH_FALLBACK_NOTE,
    HTTP_TIMEOUT,
    Column,
    Figure,
    Measure,
    RawHttp,
    Section,
    Supervisor,
    cpu_seconds,
    descendants,
    enqueue_jobs,
    has_batch_route,
    process_table,
    progress,
    read_tokens,
    rss_bytes,
    save_sections,
    scratch,
    wait_running,
)

MIB = 1024 * 1024
CONNECTIONS = 16
START_TIMEOUT_S = 300.0


class Run:
    def __init__(self) -> None:
        self.supervisor_rss = 0
        self.shepherd_rss = 0
        self.supervisor_rss_after = 0
        self.shepherd_rss_after = 0
        self.supervisor_children: list[str] = []
        self.job_processes = 0
        self.other_processes: list[str] = []
        self.heartbeats = 0
        self.heartbeat_errors = 0
        self.heartbeat_s = 0.0
        self.heartbeat_cpu_s = 0.0  # the supervisor's CPU time (user + system) during the load
        self.batch_route = True
        # The same load against http_floor.py's servers: kind -> (answered, seconds, server CPU seconds).
        self.floor: dict[str, tuple[int, float, float]] = {}

    @property
    def heartbeat_rate(self) -> float:
        return self.heartbeats / self.heartbeat_s if self.heartbeat_s else 0.0

    @property
    def cpu_per_heartbeat_ms(self) -> float:
        return 1000 * self.heartbeat_cpu_s / self.heartbeats if self.heartbeats else 0.0

    def floor_rate(self, kind: str) -> float:
        answered, seconds, _ = self.floor[kind]
        return answered / seconds if seconds else 0.0

    def floor_cpu_ms(self, kind: str) -> float:
        answered, _, cpu = self.floor[kind]
        return 1000 * cpu / answered if answered else 0.0


async def heartbeat_load(
    host: str, port: int, jobs: list[tuple[str, str]], duration_s: float, connections: int = CONNECTIONS
) -> tuple[int, int, float]:
    """Back-to-back heartbeats over ``connections`` connections for ``duration_s``: (ok, errors, elapsed)."""
    conns = [await RawHttp.connect(host, port) for _ in range(connections)]
    ok = errors = 0
    counter = 0
    t0 = trio.current_time()
    stop_at = t0 + duration_s

    async def worker(slot: int) -> None:
        nonlocal ok, errors, counter
        while trio.current_time() < stop_at:
            i = counter
            counter += 1
            job_id, token = jobs[i % len(jobs)]
            body = json.dumps({"completed_units": i // len(jobs)}).encode()
            try:
                status, _ = await conns[slot].request("POST", f"/api/jobs/{job_id}/heartbeat", body, token=token)
            except (ConnectionError, trio.BrokenResourceError):
                status = 0  # counted as an error; a new connection carries on
                await conns[slot].aclose()
                conns[slot] = await RawHttp.connect(host, port)
            if status == 204:
                ok += 1
            else:
                errors += 1

    async with trio.open_nursery() as nursery:
        for slot in range(len(conns)):
            nursery.start_soon(worker, slot)
    elapsed = trio.current_time() - t0
    for conn in conns:
        await conn.aclose()
    return ok, errors, elapsed


FLOOR_KINDS = ("quart", "hypercorn", "trio")  # http_floor.py's servers
# The heartbeat guard: heartbeats through the supervisor's one dispatcher at least this share of the rate of the stack's
# own floor (quart-trio with one trivial heartbeat-shaped route), measured side by side in the same run.
QUART_FLOOR_SHARE = 0.6
FLOOR_START_TIMEOUT_S = 30.0


def floor_load(
    kind: str, jobs: list[tuple[str, str]], heartbeat_s: float, connections: int
) -> tuple[int, float, float]:
    """The heartbeat load against ``http_floor.py KIND``: (answered, seconds, the server's CPU seconds)."""
    script = Path(__file__).resolve().parent / "http_floor.py"
    server = subprocess.Popen([sys.executable, str(script), kind], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], FLOOR_START_TIMEOUT_S)
        line = server.stdout.readline() if ready else ""  # "PORT <n>" once it listens ("" if it died)
        if not line.startswith("PORT "):
            raise RuntimeError(f"http_floor.py {kind} did not start (exit {server.poll()})")
        port = int(line.split()[1])
        cpu_before = cpu_seconds(server.pid) or 0.0
        ok, errors, elapsed = trio.run(heartbeat_load, "127.0.0.1", port, jobs, heartbeat_s, connections)
        cpu = (cpu_seconds(server.pid) or 0.0) - cpu_before
        if errors:
            raise RuntimeError(f"http_floor.py {kind}: {errors} requests not answered 204")
        return ok, elapsed, cpu
    finally:
        server.terminate()
        server.wait(timeout=30)


def one_run(n: int, heartbeat_s: float, connections: int) -> Run:
    run = Run()
    with scratch("foot") as tmp, Supervisor(tmp, max_concurrent=n) as sup:
        host, port = sup.host_port

        async def start_jobs() -> list[tuple[str, str]]:
            async with httpx.AsyncClient(base_url=sup.url, timeout=HTTP_TIMEOUT) as client:
                run.batch_route = await has_batch_route(client)
                jobs = [{"kind": "token_nap", "params": {"seconds": 3600}} for _ in range(n)]
                ids = await enqueue_jobs(client, jobs, batch_size=100, batch_route=run.batch_route)
                await wait_running(client, n, START_TIMEOUT_S)
                return await read_tokens(client, ids, START_TIMEOUT_S)

        jobs = trio.run(start_jobs)
        states = sup.job_states()
        shepherd_pids = {s.shepherd_pid for s in states}
        if len(shepherd_pids) != 1 or None in shepherd_pids:
            raise RuntimeError(f"footprint: expected one shepherd, the jobs name {shepherd_pids}")
        shepherd = shepherd_pids.pop()
        assert shepherd is not None and sup.proc is not None
        job_pids = {s.pid for s in states}

        def measure_tree() -> None:
            table = process_table()
            run.supervisor_children = [f"{pid} {table[pid][1]}" for pid in descendants(sup.proc.pid, table)]  # type: ignore[union-attr]
            under = descendants(shepherd, table)
            run.job_processes = sum(1 for pid in under if pid in job_pids and table[pid][1] == "sleep")
            run.other_processes = [f"{pid} {table[pid][1]}" for pid in under if pid not in job_pids]
            run.other_processes += [f"{pid} {table[pid][1]} (job, not sleep)" for pid in under
                                    if pid in job_pids and table[pid][1] != "sleep"]  # fmt: skip

        # The shells exec sleep right after printing: give the last few a moment to get there.
        deadline = time.monotonic() + 10
        measure_tree()
        while (run.other_processes or run.job_processes != n) and time.monotonic() < deadline:
            time.sleep(0.05)
            measure_tree()
        run.supervisor_rss = sup.rss() or 0
        run.shepherd_rss = rss_bytes(shepherd) or 0
        cpu_before = cpu_seconds(sup.proc.pid) or 0.0
        ok, errors, elapsed = trio.run(heartbeat_load, host, port, jobs, heartbeat_s, connections)
        run.heartbeat_cpu_s = (cpu_seconds(sup.proc.pid) or 0.0) - cpu_before
        run.heartbeats, run.heartbeat_errors, run.heartbeat_s = ok, errors, elapsed
        run.supervisor_rss_after = sup.rss() or 0
        run.shepherd_rss_after = rss_bytes(shepherd) or 0
    for kind in FLOOR_KINDS:
        run.floor[kind] = floor_load(kind, jobs, heartbeat_s, connections)
    return run


def measure(
    *,
    smoke: bool,
    runs: int,
    n: int,
    connections: int = CONNECTIONS,
    heartbeats_only: bool = False,
    floor_share: float | None = None,
) -> list[Section]:
    """Scenario 5 (RSS and process tree with ``n`` jobs) and 6 (heartbeats ingested over ``connections``);
    ``heartbeats_only``: scenario 6 alone (4 jobs over 4 keep-alive connections, 10 s); ``floor_share``: the target,
    the share of the quart floor's rate the supervisor's heartbeats reach."""
    heartbeat_s = 1.0 if smoke else (10.0 if heartbeats_only else 5.0)
    results: list[Run] = []
    for i in range(runs):
        progress(f"footprint run {i + 1}/{runs}: {n} running jobs, {heartbeat_s:g} s of heartbeats")
        results.append(one_run(n, heartbeat_s, connections))

    s5 = Section(
        f"5. Footprint: {n} running sleep jobs ({runs} runs, median (min-max))",
        key="footprint",
        script="bench/footprint.py",
        params={"jobs": n, "runs": runs, "smoke": smoke},
    )

    def mib(values: list[int]) -> Measure:
        return Figure.of([v / MIB for v in values]).measure(unit="MiB", digits=1)

    total = mib([r.supervisor_rss + r.shepherd_rss for r in results])
    t5 = s5.table(
        "rss",
        [
            Column("process", "process", "left"),
            Column("running", "RSS, jobs running"),
            Column("after_load", "RSS after the heartbeat load"),
        ],
    )
    t5.add(
        "supervisor",
        "supervisor",
        mib([r.supervisor_rss for r in results]),
        mib([r.supervisor_rss_after for r in results]),
    )
    t5.add("shepherd", "shepherd", mib([r.shepherd_rss for r in results]), mib([r.shepherd_rss_after for r in results]))
    t5.add(
        "together",
        "together",
        total,
        mib([r.supervisor_rss_after + r.shepherd_rss_after for r in results]),
        bold=True,
    )
    extra = sorted({p for r in results for p in r.other_processes + r.supervisor_children})
    jobs_seen = Figure.of([r.job_processes for r in results])
    s5.params["job_processes_seen"] = list(jobs_seen.samples)
    s5.params["other_processes"] = extra
    s5.notes.append(
        f"process tree: {jobs_seen.median:.0f} job processes (`sleep`) under the shepherd, "
        f"{len(extra)} other process(es) under the supervisor or the shepherd"
        + (f": {', '.join(extra[:10])}" if extra else " — no per-job helper")
    )
    if not results[0].batch_route:
        s5.notes.append(BATCH_FALLBACK_NOTE)
    worst = max(r.supervisor_rss + r.shepherd_rss for r in results) / MIB
    total_mb = statistics.median(r.supervisor_rss + r.shepherd_rss for r in results) / 1e6
    s5.target(
        total_mb <= 150,
        f"{n} jobs: supervisor + shepherd RSS {total_mb:.1f} MB = {total.median:.1f} MiB (max {worst:.1f} MiB; "
        "target ≤ 150 MB)",
        key="rss",
        value=total_mb,
        op="<=",
        threshold=150.0,
        unit="MB",
    )
    s5.target(
        not extra and jobs_seen.lo == n,
        f"{n} jobs: nothing per job but the job's own process ({len(extra)} extra)",
        key="nothing_per_job",
        value=len(extra),
        op="==",
        threshold=0,
        unit="processes",
    )

    s6 = Section(
        f"6. Heartbeats with {n} running jobs, {connections} connections ({runs} runs, median (min-max))",
        key=f"heartbeats_{n}_jobs" if heartbeats_only else "heartbeats",
        script="bench/footprint.py",
        params={"jobs": n, "connections": connections, "seconds": heartbeat_s, "runs": runs, "smoke": smoke},
    )
    rate = Figure.of([r.heartbeat_rate for r in results]).measure(unit="/s", digits=0)
    # The supervisor's CPU per heartbeat: what a shared machine disturbs least (the rate also depends on the cores
    # that the load generator and everything else leave to the supervisor).
    cpu = Figure.of([r.cpu_per_heartbeat_ms for r in results]).measure(unit="ms", digits=3)
    t6 = s6.table(
        "heartbeats",
        [
            Column("rate", "ingested heartbeats/s", unit_in_header=True),
            Column("cpu", "supervisor CPU per heartbeat"),
            Column("heartbeats", "heartbeats"),
            Column("errors", "errors"),
        ],
    )
    t6.add(
        "supervisor",
        rate,
        cpu,
        sum(r.heartbeats for r in results),
        sum(r.heartbeat_errors for r in results),
    )
    # The floor: the same load, in the same run, against servers with nothing behind them (http_floor.py). A ratio
    # to it moves far less between machines than the rate does.
    floor_names = {
        "quart": "quart-trio, one trivial heartbeat-shaped route (the stack's floor)",
        "hypercorn": "hypercorn, an empty ASGI app",
        "trio": "trio's sockets, no HTTP library",
    }
    floor = s6.table(
        "floor",
        [
            Column("server", "server", "left"),
            Column("rate", "requests/s", unit_in_header=True),
            Column("cpu", "server CPU per request"),
            Column("ratio", "supervisor's CPU per heartbeat ÷ this", unit_in_header=True),
        ],
        intro="The same load against servers with nothing behind them (`bench/http_floor.py`), in the same runs:",
    )
    floor.add("supervisor", "supervisor, heartbeats", rate, cpu, 1)
    for kind in FLOOR_KINDS:
        ratio = Figure.of([r.cpu_per_heartbeat_ms / r.floor_cpu_ms(kind) for r in results if r.floor_cpu_ms(kind)])
        floor.add(
            kind,
            floor_names[kind],
            Figure.of([r.floor_rate(kind) for r in results]).measure(unit="/s", digits=0),
            Figure.of([r.floor_cpu_ms(kind) for r in results]).measure(unit="ms", digits=3),
            ratio.measure(unit="x"),
        )
    hypercorn_rate = Figure.of([r.floor_rate("hypercorn") for r in results])
    s6.notes.append(
        f"hypercorn with an empty app answers {hypercorn_rate.median:.0f} requests/s here, and the supervisor "
        f"ingests {100 * rate.median / hypercorn_rate.median:.0f} % of that rate"
        if hypercorn_rate.median
        else "hypercorn's floor answered nothing"
    )
    quart_rate = Figure.of([r.floor_rate("quart") for r in results])
    share = Figure.of([r.heartbeat_rate / r.floor_rate("quart") for r in results if r.floor_rate("quart")])
    s6.notes.append(
        f"the supervisor ingests {share.median:.2f} times the rate of the stack's own floor (quart-trio, one trivial "
        f"route: {quart_rate.median:.0f}/s), side by side in each run"
    )
    if floor_share is not None:
        s6.target(
            share.median >= floor_share,
            f"heartbeats with {n} jobs over {connections} keep-alive connections: {rate.median:.0f}/s, "
            f"{share.median:.2f} x the quart-trio floor's {quart_rate.median:.0f}/s (target ≥ {floor_share:g} x)",
            key="heartbeats_floor_share",
            value=share.median,
            op=">=",
            threshold=floor_share,
            unit="x",
        )
    sections = [s6] if heartbeats_only else [s5, s6]
    if smoke:
        for section in sections:
            section.notes.append("smoke run: tiny N, the figures say nothing about speed")
    return sections


def heartbeat_guard(*, smoke: bool, runs: int) -> list[Section]:
    """The heartbeat guard: 4 jobs beating back to back, each over its own keep-alive connection, against the stack's
    own floor in the same run (``make bench`` runs it, and ``--heartbeats-guard`` alone)."""
    return measure(smoke=smoke, runs=runs, n=4, connections=4, heartbeats_only=True, floor_share=QUART_FLOOR_SHARE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny N, one run: proves the scripts still work")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--connections", type=int, default=CONNECTIONS, help=f"default {CONNECTIONS}")
    parser.add_argument(
        "--heartbeats-guard",
        action="store_true",
        help="scenario 6 alone as make bench runs its guard: 4 jobs, 4 connections, against the quart-trio floor",
    )
    parser.add_argument("--results", type=Path, default=None, help="add the sections to this results file")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    args = parser.parse_args()
    runs = args.runs or (1 if args.smoke else 3)
    if args.heartbeats_guard:
        sections = heartbeat_guard(smoke=args.smoke, runs=runs)
    else:
        n = args.jobs or (10 if args.smoke else 500)
        sections = measure(smoke=args.smoke, runs=runs, n=n, connections=args.connections)
    for section in sections:
        section.print()
    if args.heartbeats_guard:
        save_sections("heartbeats", sections, results=args.results, smoke=args.smoke, no_write=args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
