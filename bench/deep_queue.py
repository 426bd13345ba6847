"""A deep queue: what one job's end and the promotion into its slot cost in the registry (SQLite, in-process, no
HTTP) as the queue behind them grows, for this tree and for another build, side by side.

Usage: .venv/bin/python bench/deep_queue.py --python OTHER_TREE/.venv/bin/python --label REV [--runs 3]
       .venv/bin/python bench/deep_queue.py --smoke   (this tree only, tiny queues, nothing written)

Each cycle is the drainer's pair on a full house of 8 running jobs: ``finalize`` one, then ``promote`` into its slot.
The queue holds 1,000, 20,000 and 100,000 rows; the figure is ms per cycle (median of the runs). Both builds run
in alternating order; the child (``--child``) runs under the build's own interpreter, its ``supervisor`` package.
Raw runs: ``bench/results/<UTC date>-deep-queue-<label>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEPTHS = (1_000, 20_000, 100_000)
CYCLES = 300
SMOKE_DEPTHS, SMOKE_CYCLES = (100, 1_000), 20
SLOTS = 8


def child(depths: tuple[int, ...], cycles: int) -> int:
    import trio

    from supervisor.domain import JobStatus
    from supervisor.registry import Ending, NewJob, Outcome, PromoteRequest, SqliteRegistry

    def request(n: int) -> PromoteRequest:
        return PromoteRequest(SLOTS, "bench", [f"hash-{n}"])

    async def cycle_ms(depth: int) -> float:
        with tempfile.TemporaryDirectory() as tmp:
            reg = await SqliteRegistry.open(Path(tmp) / "registry.db")
            try:
                for start in range(0, depth, 1000):
                    batch = range(start, min(depth, start + 1000))
                    await reg.enqueue_many([NewJob("k", {"n": n}, ["x"]) for n in batch])
                running = []
                for n in range(SLOTS):
                    running.extend((await reg.promote(request(n))).jobs)
                t0 = time.perf_counter()
                for n in range(cycles):
                    job = running.pop(0)
                    await reg.finalize(job.job_id, Ending(Outcome(JobStatus.SUCCEEDED)))
                    running.extend((await reg.promote(request(SLOTS + n))).jobs)
                return (time.perf_counter() - t0) / cycles * 1e3
            finally:
                await reg.aclose()

    async def run() -> dict[str, float]:
        return {str(depth): await cycle_ms(depth) for depth in depths}

    print(json.dumps(trio.run(run)))
    return 0


def one(python: str, *, smoke: bool = False) -> dict[str, float]:
    argv = [python, str(Path(__file__).resolve()), "--child", *(["--smoke"] if smoke else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=True)
    return {depth: float(ms) for depth, ms in json.loads(done.stdout).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", help="the other build's interpreter (its venv's bin/python)")
    parser.add_argument("--label", default="other")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="this tree only, tiny queues: proves the script runs")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(SMOKE_DEPTHS, SMOKE_CYCLES) if args.smoke else child(DEPTHS, CYCLES)
    if args.smoke:
        for depth, ms in one(sys.executable, smoke=True).items():
            print(f"{depth:>7} queued: this tree {ms:.2f} ms per end + promotion")
        return 0
    if not args.python:
        parser.error("--python is required")
    from _common import write_side_by_side

    builds = {"this tree": sys.executable, args.label: args.python}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in builds}
    for r in range(args.runs):
        for name in list(builds) if r % 2 == 0 else list(builds)[::-1]:
            runs[name].append(one(builds[name]))
            print(f"run {r + 1}/{args.runs} {name}: {runs[name][-1]}", file=sys.stderr)
    medians = {
        name: {str(depth): statistics.median(run[str(depth)] for run in runs[name]) for depth in DEPTHS}
        for name in builds
    }
    for depth in DEPTHS:
        here, other = (medians[name][str(depth)] for name in builds)
        print(f"{depth:>7} queued: this tree {here:.2f} ms, {args.label} {other:.2f} ms per end + promotion")
    what = (
        f"ms per finalize + promote on {SLOTS} slots (SQLite, in-process), by queued rows; {CYCLES} cycles per "
        "depth, one value per run"
    )
    write_side_by_side("deep-queue", args.label, builds, what, runs=runs, medians_ms=medians)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
