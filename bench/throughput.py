"""Scenario 1: N x ``/bin/true`` on 8 slots — the supervisor against its peers, side by side in one run.

Usage: .venv/bin/python bench/throughput.py [--smoke] [--runs R] [--n N]

Tools (a peer whose binary is missing is skipped with the reason printed):
- ``xargs -P8`` — the fork/exec floor every ratio is taken against;
- task-spooler ``-S 8`` (one ``tsp -n`` client per job from a shell loop, as a user would);
- GNU ``parallel -j8``;
- RQ with 8 warm workers, SimpleWorker and the fork-per-job Worker (redis-server started here on a loopback port,
  RQ from the bench venv, one ``Queue.enqueue`` per job);
- the supervisor (real ``supervisor serve``), enqueued by batches of 100 and, separately, one POST per job over
  one keep-alive httpx client.

Wall time runs from the first enqueue to the last job's end: for the supervisor, the largest ``ended_at`` in its
registry (polling ``GET /api/queue`` only tells when to look). Each run measures every tool once, interleaved, so
the ratios compare tools under the same background load of this shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BATCH_FALLBACK_NOTE,
    BENCH_DIR,
    HTTP_TIMEOUT,
    Column,
    Figure,
    Section,
    Supervisor,
    bench_python,
    cpu_seconds,
    enqueue_jobs,
    free_port,
    has_batch_route,
    iso_ts,
    machine_cpu_seconds,
    percentile,
    progress,
    scratch,
    task_spooler,
    wait_idle,
    wait_until,
    which,
)

SLOTS = 8
BATCH = 100
RUN_TIMEOUT_S = 600.0

XARGS = "xargs -P8"
TSP = "task-spooler -S 8"
PARALLEL = "GNU parallel -j8"
RQ_SIMPLE = "RQ, 8 SimpleWorkers"
RQ_FORK = "RQ, 8 fork-per-job Workers"
SUP_BATCH = "supervisor, batches of 100"
SUP_POST = "supervisor, one POST per job"
TOOLS = (XARGS, TSP, PARALLEL, RQ_SIMPLE, RQ_FORK, SUP_BATCH, SUP_POST)


class Skip(Exception):
    """A peer that cannot run here; the message says why."""


# -- peers ----------------------------------------------------------------------------------------------


def run_xargs(n: int) -> float:
    lines = b"\n".join(b"x" for _ in range(n)) + b"\n"
    t0 = time.perf_counter()
    subprocess.run(["xargs", "-P", str(SLOTS), "-n", "1", "/bin/true"], input=lines, check=True, timeout=RUN_TIMEOUT_S)
    return time.perf_counter() - t0


def run_parallel(n: int) -> float:
    parallel = which("parallel")
    if parallel is None:
        raise Skip("GNU parallel is not installed (Debian package `parallel`)")
    lines = b"\n".join(b"x" for _ in range(n)) + b"\n"
    t0 = time.perf_counter()
    subprocess.run(
        [parallel, "--will-cite", "-j", str(SLOTS), "-N0", "/bin/true"],
        input=lines,
        check=True,
        timeout=RUN_TIMEOUT_S,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def run_tsp(n: int) -> float:
    tsp = task_spooler()
    if tsp is None:
        raise Skip("task-spooler is not installed (Debian package `task-spooler`, binary tsp)")
    with scratch("tsp") as tmp:
        env = {**os.environ, "TS_SOCKET": str(tmp / "ts.sock"), "TMPDIR": str(tmp), "TS_SLOTS": str(SLOTS)}
        env["TS_MAXFINISHED"] = "16"  # keep the list (which we poll) short
        subprocess.run([tsp, "-S", str(SLOTS)], env=env, check=True, timeout=60, capture_output=True)
        try:
            t0 = time.perf_counter()
            subprocess.run(
                ["bash", "-c", f'for _ in $(seq {n}); do "$0" -n /bin/true; done', tsp],
                env=env,
                check=True,
                timeout=RUN_TIMEOUT_S,
                stdout=subprocess.DEVNULL,
            )

            def drained() -> bool:
                listing = subprocess.run([tsp, "-l"], env=env, capture_output=True, text=True, timeout=60, check=True)
                states = [line.split()[1] for line in listing.stdout.splitlines()[1:] if len(line.split()) > 1]
                return not any(s in ("queued", "running", "allocating") for s in states)

            wait_until(drained, RUN_TIMEOUT_S, "task-spooler to run every job", interval_s=0.01)
            return time.perf_counter() - t0
        finally:
            subprocess.run([tsp, "-K"], env=env, timeout=60, capture_output=True, check=False)


class Redis:
    """A throwaway redis-server on a loopback port, no persistence."""

    def __init__(self, root: Path) -> None:
        server = which("redis-server")
        if server is None:
            raise Skip("redis-server is not installed (Debian package `redis-server`)")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [
                server,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(root),
                "--logfile",
                str(root / "redis.log"),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._pong, 30, "redis-server to answer")

    def _pong(self) -> bool:
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def run_rq(n: int, worker_class: str, workers_n: int = SLOTS) -> float:
    python = bench_python()
    if python is None:
        raise Skip("RQ is not installed in the bench venv (`make bench` installs it: .venv-bench)")
    rq = python.parent / "rq"
    with scratch("rq") as tmp:
        redis = Redis(tmp)
        env = {**os.environ, "PYTHONPATH": str(BENCH_DIR)}
        workers: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(workers_n):
                workers.append(
                    subprocess.Popen(
                        [str(rq), "worker", "bench", "-u", redis.url, "-w", worker_class, "-q"],
                        env=env,
                        cwd=tmp,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            done = subprocess.run(
                [
                    str(python),
                    str(BENCH_DIR / "rq_peer.py"),
                    "--url",
                    redis.url,
                    "--n",
                    str(n),
                    "--workers",
                    str(workers_n),
                    "--timeout",
                    str(RUN_TIMEOUT_S),
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT_S + 60,
                check=False,
            )
            lines = done.stdout.strip().splitlines()
            result = json.loads(lines[-1]) if lines else {"error": done.stderr[-500:]}
            if "error" in result:
                raise RuntimeError(f"RQ run failed: {result['error']}")
            if result["failed"]:
                raise RuntimeError(f"RQ: {result['failed']} of {n} jobs failed")
            return float(result["wall_s"])
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)  # warm shutdown
            for worker in workers:
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait(timeout=30)
            redis.stop()


# -- the supervisor ------------------------------------------------------------------------------------


class SupervisorRun:
    """One supervisor measurement: wall, time to acknowledge every enqueue, (batches) promotion under load, and the
    CPU each process used per job (``cpu_ms``: see ``CPU_PARTS``)."""

    def __init__(
        self, wall_s: float, enqueue_s: float, promotion: list[float], batch_route: bool, cpu_ms: dict[str, float]
    ) -> None:
        self.wall_s = wall_s
        self.enqueue_s = enqueue_s
        self.promotion = promotion
        self.batch_route = batch_route
        self.cpu_ms = cpu_ms


# Where the machine's CPU went during a supervisor run, per job: the supervisor process (every thread), its shepherd,
# this benchmark's own HTTP client, and the rest (the jobs themselves, the kernel's work for all, anything else
# running), from the machine's busy time. On two cores, the whole machine's CPU per job over 2 is a floor for the
# wall time per job; the supervisor's alone is the floor for its one event loop.
CPU_PARTS = ("supervisor", "shepherd", "client", "rest", "machine")
CPU_LABELS = ("supervisor", "shepherd", "this HTTP client", "the rest (jobs, kernel)", "whole machine")


def promotion_latencies(states: list, slots: int) -> list[float]:
    """A job's exit → the next queued job's process start, matched in order, from the shepherd's clock.

    With a full backlog, the (slots + i)-th start can only follow the i-th slot freed: the i-th exit. Valid only
    while jobs were queued at every exit, which the callers arrange (pause, enqueue, resume).
    """
    starts = sorted(s.started_at for s in states)
    exits = sorted(s.ended_at for s in states if s.ended_at is not None)
    return [starts[slots + i] - exits[i] for i in range(min(len(starts) - slots, len(exits)))]


def run_supervisor(n: int, *, batch_size: int | None) -> SupervisorRun:
    with scratch("sup") as tmp, Supervisor(tmp, max_concurrent=SLOTS) as sup:

        async def drive() -> tuple[float, float, bool, float]:
            async with httpx.AsyncClient(base_url=sup.url, timeout=HTTP_TIMEOUT) as client:
                batch_route = await has_batch_route(client)
                jobs = [{"kind": "noop", "params": {}} for _ in range(n)]
                t0 = time.time()
                p0 = time.perf_counter()
                c0 = time.process_time()
                await enqueue_jobs(client, jobs, batch_size=batch_size, batch_route=batch_route)
                enqueue_s = time.perf_counter() - p0
                await wait_idle(client, RUN_TIMEOUT_S)
                client_cpu_s = time.process_time() - c0
            return t0, enqueue_s, batch_route, client_cpu_s

        assert sup.proc is not None
        sup_cpu0, machine_cpu0 = cpu_seconds(sup.proc.pid) or 0.0, machine_cpu_seconds()
        t0, enqueue_s, batch_route, client_cpu_s = trio.run(drive)
        sup_cpu, machine_cpu = (cpu_seconds(sup.proc.pid) or 0.0) - sup_cpu0, machine_cpu_seconds() - machine_cpu0
        states = sup.job_states()
        # The shepherd starts with the first job: all of its CPU is this run's (its start-up included).
        shepherd_pids = {s.shepherd_pid for s in states if s.shepherd_pid is not None}
        shepherd_cpu = sum(cpu_seconds(pid) or 0.0 for pid in shepherd_pids)
        counts = sup.status_counts()
        if counts.get("succeeded") != n:
            raise RuntimeError(f"supervisor: expected {n} succeeded jobs, the registry says {counts}")
        [(last_end,)] = sup.registry_query("SELECT max(ended_at) FROM jobs")
    per_job = 1e3 / n
    cpu_ms = {
        "supervisor": sup_cpu * per_job,
        "shepherd": shepherd_cpu * per_job,
        "client": client_cpu_s * per_job,
        "rest": max(0.0, machine_cpu - sup_cpu - shepherd_cpu - client_cpu_s) * per_job,
        "machine": machine_cpu * per_job,
    }
    return SupervisorRun(iso_ts(last_end) - t0, enqueue_s, promotion_latencies(states, SLOTS), batch_route, cpu_ms)


# -- the comparison ------------------------------------------------------------------------------------


def measure(*, smoke: bool, runs: int, n: int) -> Section:
    walls: dict[str, list[float]] = {tool: [] for tool in TOOLS}
    skipped: dict[str, str] = {}
    enqueue: dict[str, list[float]] = {SUP_BATCH: [], SUP_POST: []}
    cpu: dict[str, dict[str, list[float]]] = {tool: {part: [] for part in CPU_PARTS} for tool in (SUP_BATCH, SUP_POST)}
    promotion_p50: list[float] = []
    promotion_p99: list[float] = []
    batch_route = True
    # Eight Python workers take seconds to import RQ on this machine: the smoke run starts two.
    rq_workers = 2 if smoke else SLOTS
    runners = {
        XARGS: lambda: run_xargs(n),
        TSP: lambda: run_tsp(n),
        PARALLEL: lambda: run_parallel(n),
        RQ_SIMPLE: lambda: run_rq(n, "rq.worker.SimpleWorker", rq_workers),
        RQ_FORK: lambda: run_rq(n, "rq.worker.Worker", rq_workers),
    }
    for run in range(runs):
        for tool in TOOLS:
            if tool in skipped:
                continue
            progress(f"throughput run {run + 1}/{runs}: {tool}")
            if tool in (SUP_BATCH, SUP_POST):
                result = run_supervisor(n, batch_size=BATCH if tool == SUP_BATCH else None)
                walls[tool].append(result.wall_s)
                enqueue[tool].append(result.enqueue_s)
                for part in CPU_PARTS:
                    cpu[tool][part].append(result.cpu_ms[part])
                if tool == SUP_BATCH:
                    batch_route = result.batch_route
                    if result.promotion:
                        promotion_p50.append(percentile(result.promotion, 50))
                        promotion_p99.append(percentile(result.promotion, 99))
                continue
            try:
                walls[tool].append(runners[tool]())
            except Skip as exc:
                skipped[tool] = str(exc)
                print(f"skip {tool}: {exc}", flush=True)

    section = Section(
        f"1. {n} x /bin/true on {SLOTS} slots ({runs} runs, median (min-max))",
        key="throughput",
        script="bench/throughput.py",
        params={"jobs": n, "slots": SLOTS, "batch": BATCH, "runs": runs, "rq_workers": rq_workers, "smoke": smoke},
    )

    def ratios_of(tool: str) -> Figure:
        """Each run's wall over the same run's xargs: the tools of one run share one background load."""
        return Figure.of([w / x for w, x in zip(walls[tool], walls[XARGS], strict=False)])

    wall_table = section.table(
        "wall",
        [
            Column("tool", "tool", "left"),
            Column("wall", "wall"),
            Column("x_xargs", "x xargs -P8 (same run)", unit_in_header=True),
        ],
    )
    for tool in TOOLS:
        if tool in skipped:
            wall_table.add(tool, tool, f"skipped: {skipped[tool]}", None, skipped=skipped[tool])
            continue
        wall_table.add(
            tool,
            tool,
            Figure.of(walls[tool]).measure(unit="s"),
            ratios_of(tool).measure(unit="x"),
            bold=tool.startswith("supervisor"),
        )
    for tool in (SUP_BATCH, SUP_POST):
        section.figure(
            f"enqueue_acknowledged:{tool}",
            f"{tool}, every enqueue acknowledged after",
            Figure.of(enqueue[tool]).measure(unit="s"),
        )
    cpu_table = section.table(
        "cpu_per_job",
        [
            Column("mode", "CPU per job, ms", "left"),
            *(Column(part, label, unit_in_header=True) for part, label in zip(CPU_PARTS, CPU_LABELS, strict=True)),
        ],
    )
    for tool in (SUP_BATCH, SUP_POST):
        cpu_table.add(tool, tool, *(Figure.of(cpu[tool][part]).measure(unit="ms") for part in CPU_PARTS))
    if promotion_p99:
        what = "promotion latency under saturation (batches, /bin/true, exits faster than promotions)"
        section.figure("saturated_promotion_p50", f"{what}, p50", Figure.of(promotion_p50).measure(1e3, "ms"))
        section.figure("saturated_promotion_p99", f"{what}, p99", Figure.of(promotion_p99).measure(1e3, "ms"))
    if not batch_route:
        section.notes.append(BATCH_FALLBACK_NOTE)
    ratio_batch = ratios_of(SUP_BATCH).median
    section.target(
        ratio_batch <= 3.0,
        f"{n} jobs in batches: x{ratio_batch:.2f} xargs (target ≤ x3; aim < x2.5: "
        f"{'met' if ratio_batch < 2.5 else 'not met'})",
        key="batches_vs_xargs",
        value=ratio_batch,
        op="<=",
        threshold=3.0,
        unit="x xargs",
    )
    post = Figure.of(walls[SUP_POST]).median
    for rq_tool, key in ((RQ_SIMPLE, "post_vs_rq_simple"), (RQ_FORK, "post_vs_rq_fork")):
        if rq_tool in skipped:
            section.skip(f"one POST per job ahead of {rq_tool}: {skipped[rq_tool]}", key=key)
            continue
        rq_wall = Figure.of(walls[rq_tool]).median
        section.target(
            post < rq_wall,
            f"one POST per job {post:.2f} s vs {rq_tool} {rq_wall:.2f} s (target: ahead)",
            key=key,
            value=post,
            op="<",
            threshold=rq_wall,
            unit="s",
        )
    if smoke:
        section.notes.append(f"smoke run: tiny N, {rq_workers} RQ workers; the figures say nothing about speed")
    return section


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny N, one run: proves the scripts still work")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--n", type=int, default=None)
    args = parser.parse_args()
    runs = args.runs or (1 if args.smoke else 3)
    n = args.n or (16 if args.smoke else 2000)
    measure(smoke=args.smoke, runs=runs, n=n).print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
