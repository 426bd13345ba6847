"""Scenarios 2-4: promotion latency, enqueue latency under an open-loop load, and detection of a killed job.

Usage: .venv/bin/python bench/latency.py [--smoke] [--runs R]

2. Promotion: a job's exit → the next queued job's process start, from the shepherd's own trace
   (``PODCAST_JOB_SHEPHERD_TRACE_FILE``: ``exited`` ``ended_at``, ``started`` ``started_at``: one clock).
   8 slots; jobs sleep 50-250 ms (a fixed seed), so exits are spread as in real work and the figure is the promote
   path, not a queue of exits. The queue is paused while the jobs are enqueued and resumed after, so a job waits at
   every exit.
3. Enqueue: ``POST /api/jobs`` (kind ``noop``, the jobs really run on 8 slots) at a fixed 200 and 500 requests/s,
   open loop: request i is due at t0 + i/rate and its latency counts from then, so a slow server cannot slow the
   load down and hide its own delay. Several concurrent connections (a lean raw HTTP/1.1 client, so the shared CPU
   goes to the server). Then saturation: the same connections closed-loop, back to back.
4. Detection: SIGKILL a running job's process → its row terminal (the row's ``ended_at``, the supervisor's clock,
   against the bench's clock at the kill; one machine, one clock).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
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
    RawHttp,
    Section,
    Supervisor,
    enqueue_jobs,
    has_batch_route,
    iso_ts,
    percentile,
    progress,
    scratch,
    wait_idle,
)
from throughput import promotion_latencies

SLOTS = 8
CONNECTIONS = 16
DRAIN_TIMEOUT_S = 600.0
NOOP = json.dumps({"kind": "noop", "params": {}}).encode()


# -- 2. promotion ---------------------------------------------------------------------------------------


PHASES = (
    ("exit → row finalized (shepherd's report, monitor, finalize transaction)", "exit", "finalized", False),
    (
        "row finalized → next job promoted (drainer wake, pause check, promote transaction)",
        "finalized",
        "promoted",
        True,
    ),
    ("promoted → next job's process started (spawn request, shepherd fork)", "promoted", "started", False),
)


def promotion_phases(sup: Supervisor) -> dict[str, list[float]]:
    """Where a promotion's time goes: the shepherd's trace joined with the supervisor's log of the same jobs.

    Per job: its exit → its row finalized; its promotion → its process start. Between jobs (matched in order, as
    for the latency itself): a slot's row finalized → the next promotion.
    """
    states = {s.job_id: s for s in sup.job_states()}
    events = sup.log_events()
    rows = []
    for job_id, state in states.items():
        ev = events.get(job_id, {})
        if state.ended_at is None or "queued->running" not in ev or "running->succeeded" not in ev:
            continue
        rows.append({"exit": state.ended_at, "started": state.started_at, "promoted": ev["queued->running"],
                     "finalized": ev["running->succeeded"]})  # fmt: skip
    # The first SLOTS starts follow the resume, not an exit (and the very first one starts the shepherd).
    rows.sort(key=lambda r: r["started"])
    later = rows[SLOTS:]
    out: dict[str, list[float]] = {}
    for label, a, b, matched in PHASES:
        if matched:
            froms, tos = sorted(r[a] for r in rows), sorted(r[b] for r in rows)
            out[label] = [tos[SLOTS + i] - froms[i] for i in range(len(tos) - SLOTS)]
        else:
            out[label] = [r[b] - r[a] for r in (later if b == "started" else rows)]
    return out


def promotion_run(n: int, seed: int) -> tuple[list[float], dict[str, list[float]], bool]:
    rng = random.Random(seed)
    jobs = [{"kind": "nap", "params": {"seconds": round(rng.uniform(0.05, 0.25), 3)}} for _ in range(n)]
    with scratch("promo") as tmp, Supervisor(tmp, max_concurrent=SLOTS) as sup:

        async def drive() -> bool:
            async with httpx.AsyncClient(base_url=sup.url, timeout=HTTP_TIMEOUT) as client:
                batch_route = await has_batch_route(client)
                (await client.post("/api/queue/pause", timeout=HTTP_TIMEOUT)).raise_for_status()
                await enqueue_jobs(client, jobs, batch_size=100, batch_route=batch_route)
                (await client.post("/api/queue/resume", timeout=HTTP_TIMEOUT)).raise_for_status()
                await wait_idle(client, DRAIN_TIMEOUT_S)
            return batch_route

        batch_route = trio.run(drive)
        counts = sup.status_counts()
        if counts.get("succeeded") != n:
            raise RuntimeError(f"promotion: expected {n} succeeded jobs, the registry says {counts}")
        return promotion_latencies(sup.job_states(), SLOTS), promotion_phases(sup), batch_route


# -- 3. enqueue latency ----------------------------------------------------------------------------------


async def _connections(host: str, port: int, n: int) -> list[RawHttp]:
    return [await RawHttp.connect(host, port) for _ in range(n)]


async def open_loop(host: str, port: int, rate: float, n: int) -> tuple[list[float], int]:
    """n POSTs due at a fixed rate over CONNECTIONS connections; latency from each request's due time."""
    conns = await _connections(host, port, CONNECTIONS)
    idle_send, idle_recv = trio.open_memory_channel[RawHttp](CONNECTIONS)
    for conn in conns:
        idle_send.send_nowait(conn)
    latencies: list[float] = []
    errors = 0

    async def one(conn: RawHttp, due: float) -> None:
        nonlocal errors
        status, _ = await conn.request("POST", "/api/jobs", NOOP)
        latencies.append(trio.current_time() - due)
        if status != 202:
            errors += 1
        idle_send.send_nowait(conn)

    t0 = trio.current_time() + 0.05
    async with trio.open_nursery() as nursery:
        for i in range(n):
            due = t0 + i / rate
            await trio.sleep_until(due)
            conn = await idle_recv.receive()  # all busy: this request is late, and its latency says so
            nursery.start_soon(one, conn, due)
    for conn in conns:
        await conn.aclose()
    return latencies, errors


async def closed_loop(host: str, port: int, n: int) -> tuple[float, list[float], int]:
    """n POSTs, CONNECTIONS at a time back to back: (requests/s, latencies, errors)."""
    conns = await _connections(host, port, CONNECTIONS)
    remaining = n
    latencies: list[float] = []
    errors = 0

    async def worker(conn: RawHttp) -> None:
        nonlocal remaining, errors
        while remaining > 0:
            remaining -= 1
            t = trio.current_time()
            status, _ = await conn.request("POST", "/api/jobs", NOOP)
            latencies.append(trio.current_time() - t)
            if status != 202:
                errors += 1

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for conn in conns:
            nursery.start_soon(worker, conn)
    elapsed = trio.current_time() - t0
    for conn in conns:
        await conn.aclose()
    return n / elapsed, latencies, errors


def enqueue_run(rates: list[tuple[float, int]], saturation_n: int) -> dict[str, object]:
    """One server: each open-loop rate, then saturation; the queue drains between them."""
    out: dict[str, object] = {}
    with scratch("enq") as tmp, Supervisor(tmp, max_concurrent=SLOTS) as sup:
        host, port = sup.host_port

        async def drive() -> None:
            async with httpx.AsyncClient(base_url=sup.url, timeout=HTTP_TIMEOUT) as client:
                for rate, n in rates:
                    latencies, errors = await open_loop(host, port, rate, n)
                    out[f"rate{rate:g}"] = (latencies, errors)
                    await wait_idle(client, DRAIN_TIMEOUT_S)
                throughput, latencies, errors = await closed_loop(host, port, saturation_n)
                out["saturation"] = (throughput, latencies, errors)
                await wait_idle(client, DRAIN_TIMEOUT_S)

        trio.run(drive)
    return out


# -- 4. detection ----------------------------------------------------------------------------------------


def detection_run(samples: int) -> list[float]:
    latencies: list[float] = []
    with scratch("detect") as tmp, Supervisor(tmp, max_concurrent=SLOTS) as sup:

        async def drive() -> None:
            async with httpx.AsyncClient(base_url=sup.url, timeout=HTTP_TIMEOUT) as client:
                for _ in range(samples):
                    answer = await client.post(
                        "/api/jobs", json={"kind": "nap", "params": {"seconds": 600}}, timeout=HTTP_TIMEOUT
                    )
                    answer.raise_for_status()
                    job_id = answer.json()["job_id"]
                    with trio.fail_after(60):
                        while True:  # running, with its process recorded
                            row = (await client.get(f"/api/jobs/{job_id}", timeout=HTTP_TIMEOUT)).json()
                            if row["status"] == "running" and row.get("pid"):
                                break
                            await trio.sleep(0.01)
                    killed_at = time.time()
                    os.kill(int(row["pid"]), signal.SIGKILL)
                    with trio.fail_after(60):
                        while True:
                            row = (await client.get(f"/api/jobs/{job_id}", timeout=HTTP_TIMEOUT)).json()
                            if row["ended_at"]:
                                break
                            await trio.sleep(0.01)
                    if row["status"] != "failed":
                        raise RuntimeError(f"detection: a killed job ended {row['status']}/{row['error_reason']}")
                    latencies.append(iso_ts(row["ended_at"]) - killed_at)

        trio.run(drive)
    return latencies


# -- the report ------------------------------------------------------------------------------------------


def measure(*, smoke: bool, runs: int) -> list[Section]:
    promo_n = 24 if smoke else 240
    rates = [(200.0, 40), (500.0, 50)] if smoke else [(200.0, 1000), (500.0, 2000)]
    saturation_n = 50 if smoke else 2000
    detect_n = 4 if smoke else 40

    promo: list[list[float]] = []
    phases: list[dict[str, list[float]]] = []
    batch_route = True
    enq: list[dict[str, object]] = []
    detect: list[list[float]] = []
    for run in range(runs):
        progress(f"latency run {run + 1}/{runs}: promotion ({promo_n} jobs)")
        latencies, phase, batch_route = promotion_run(promo_n, seed=run)
        promo.append(latencies)
        phases.append(phase)
        progress(f"latency run {run + 1}/{runs}: enqueue at {', '.join(f'{r:g}/s' for r, _ in rates)}, saturation")
        enq.append(enqueue_run(rates, saturation_n))
        progress(f"latency run {run + 1}/{runs}: detection ({detect_n} kills)")
        detect.append(detection_run(detect_n))

    sections = []
    s2 = Section(
        f"2. Promotion latency: exit → next start ({runs} runs, median (min-max))",
        key="promotion",
        script="bench/latency.py",
        params={"jobs": promo_n, "slots": SLOTS, "sleep_ms": [50, 250], "runs": runs, "smoke": smoke},
    )
    p50 = Figure.of([percentile(x, 50) for x in promo])
    p99 = Figure.of([percentile(x, 99) for x in promo])
    t2 = s2.table(
        "promotion",
        [
            Column("what", f"{promo_n} jobs of sleep 50-250 ms, {SLOTS} slots", "left"),
            Column("p50", "p50"),
            Column("p99", "p99"),
            Column("max", "max"),
        ],
    )
    t2.add(
        "exit_to_next_start",
        "exit → next job's process start",
        p50.measure(1e3, "ms"),
        p99.measure(1e3, "ms"),
        Figure.of([max(x) for x in promo]).measure(1e3, "ms"),
        bold=True,
    )
    for label, a, b, _ in PHASES:
        got = [p[label] for p in phases if p.get(label)]
        t2.add(
            f"{a}_to_{b}",
            f"of which: {label}",
            Figure.of([percentile(x, 50) for x in got]).measure(1e3, "ms"),
            Figure.of([percentile(x, 99) for x in got]).measure(1e3, "ms"),
            Figure.of([max(x) for x in got]).measure(1e3, "ms"),
        )
    s2.notes.append(
        "the phases come from the supervisor's own log (its clock) joined with the shepherd's trace; each is "
        "measured on its own, so their percentiles do not add up exactly"
    )
    if not batch_route:
        s2.notes.append(BATCH_FALLBACK_NOTE)
    s2.target(
        p99.median <= 0.010,
        f"promotion p99 {p99.median * 1e3:.2f} ms (target ≤ 10 ms)",
        key="promotion_p99",
        value=p99.median * 1e3,
        op="<=",
        threshold=10.0,
        unit="ms",
    )
    sections.append(s2)

    s3 = Section(
        f"3. Enqueue latency, POST /api/jobs, {CONNECTIONS} connections ({runs} runs, median (min-max))",
        key="enqueue",
        script="bench/latency.py",
        params={
            "connections": CONNECTIONS,
            "rates": [{"per_s": rate, "requests": n} for rate, n in rates],
            "saturation_requests": saturation_n,
            "runs": runs,
            "smoke": smoke,
        },
    )
    t3 = s3.table(
        "enqueue",
        [
            Column("load", "load", "left"),
            Column("requests", "requests"),
            Column("p50", "p50"),
            Column("p99", "p99"),
            Column("errors", "errors"),
        ],
    )
    p99_at: dict[float, Figure] = {}
    for rate, n in rates:
        runs_at = [r[f"rate{rate:g}"] for r in enq]
        lat = [x[0] for x in runs_at]  # type: ignore[index]
        errors = sum(x[1] for x in runs_at)  # type: ignore[index]
        p99_at[rate] = Figure.of([percentile(x, 99) for x in lat])
        t3.add(
            f"open_loop_{rate:g}",
            f"open loop {rate:g}/s",
            n,
            Figure.of([percentile(x, 50) for x in lat]).measure(1e3, "ms"),
            p99_at[rate].measure(1e3, "ms"),
            errors,
        )
    sat = [r["saturation"] for r in enq]
    t3.add(
        "saturation",
        "saturation (closed loop)",
        saturation_n,
        Figure.of([percentile(x[1], 50) for x in sat]).measure(1e3, "ms"),  # type: ignore[index]
        Figure.of([percentile(x[1], 99) for x in sat]).measure(1e3, "ms"),  # type: ignore[index]
        sum(x[2] for x in sat),  # type: ignore[index]
    )
    throughput = Figure.of([x[0] for x in sat])  # type: ignore[index]
    s3.figure("saturation_throughput", "saturation throughput", throughput.measure(unit="requests/s", digits=0))
    s3.target(
        p99_at[200.0].median <= 0.020,
        f"enqueue p99 at 200/s {p99_at[200.0].median * 1e3:.2f} ms (target ≤ 20 ms)",
        key="enqueue_p99_200",
        value=p99_at[200.0].median * 1e3,
        op="<=",
        threshold=20.0,
        unit="ms",
    )
    sections.append(s3)

    s4 = Section(
        f"4. Detection: SIGKILL a running job → row terminal ({runs} runs, median (min-max))",
        key="detection",
        script="bench/latency.py",
        params={"kills": detect_n, "runs": runs, "smoke": smoke},
    )
    d50 = Figure.of([percentile(x, 50) for x in detect])
    d99 = Figure.of([percentile(x, 99) for x in detect])
    t4 = s4.table(
        "detection",
        [Column("kills", "kills"), Column("p50", "p50"), Column("p99", "p99"), Column("max", "max")],
    )
    t4.add(
        "kill",
        detect_n,
        d50.measure(1e3, "ms"),
        d99.measure(1e3, "ms"),
        Figure.of([max(x) for x in detect]).measure(1e3, "ms"),
    )
    s4.target(
        d99.median <= 0.050,
        f"detection p99 {d99.median * 1e3:.2f} ms (target ≤ 50 ms)",
        key="detection_p99",
        value=d99.median * 1e3,
        op="<=",
        threshold=50.0,
        unit="ms",
    )
    sections.append(s4)
    if smoke:
        for section in sections:
            section.notes.append("smoke run: tiny N, the figures say nothing about speed")
    return sections


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny N, one run: proves the scripts still work")
    parser.add_argument("--runs", type=int, default=None)
    args = parser.parse_args()
    for section in measure(smoke=args.smoke, runs=args.runs or (1 if args.smoke else 3)):
        section.print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
