"""One build against another, side by side: the supervisor's batch throughput (N x ``/bin/true`` on 8 slots, enqueued
in batches of 100, as in ``throughput.py``) of this tree and of another checkout, each with its own venv.

Usage: .venv/bin/python bench/against.py --python OTHER_TREE/.venv/bin/python --label 076ddaa [--runs 5] [--n 1000]

Each run measures both builds once, in alternating order, so both see the same background load; the raw runs go to
``bench/results/<UTC date>-against-<label>.json``. The child (``--child``) runs under the build's own interpreter:
``supervisor serve`` is that venv's package.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import child_figures, write_side_by_side


def child(n: int) -> int:
    from throughput import BATCH, run_supervisor

    run = run_supervisor(n, batch_size=BATCH)
    print(
        json.dumps(
            {
                "wall_s": run.wall_s,
                "jobs_per_s": n / run.wall_s,
                "batch_route": run.batch_route,
                "supervisor_cpu_ms_per_job": run.cpu_ms["supervisor"],
            }
        )
    )
    return 0


def one(python: str, n: int) -> dict[str, float]:
    return child_figures(python, __file__, "--n", str(n))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", help="the other build's interpreter (its venv's bin/python)")
    parser.add_argument("--label", default="other")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.n)
    if not args.python:
        parser.error("--python is required")
    builds = {"this tree": sys.executable, args.label: args.python}
    runs: dict[str, list[float]] = {name: [] for name in builds}
    cpu: dict[str, list[float]] = {name: [] for name in builds}  # the supervisor process's CPU per job, ms
    for r in range(args.runs):
        order = list(builds) if r % 2 == 0 else list(builds)[::-1]
        for name in order:
            result = one(builds[name], args.n)
            runs[name].append(result["jobs_per_s"])
            cpu[name].append(result["supervisor_cpu_ms_per_job"])
            print(
                f"run {r + 1}/{args.runs} {name}: {runs[name][-1]:.0f} jobs/s, {cpu[name][-1]:.2f} ms CPU/job",
                file=sys.stderr,
            )
    here, other = (statistics.median(runs[name]) for name in builds)
    ratio = here / other
    for name in builds:
        values = runs[name]
        print(
            f"{name:>12}: {statistics.median(values):.0f} jobs/s ({min(values):.0f}-{max(values):.0f}), "
            f"supervisor CPU {statistics.median(cpu[name]):.2f} ms/job"
        )
    print(f"ratio of medians: {ratio:.3f}")
    what = f"{args.n} x /bin/true on 8 slots, batches of 100; jobs/s per run"
    write_side_by_side(
        "against", args.label, builds, what, runs=runs, supervisor_cpu_ms_per_job=cpu, ratio_of_medians=ratio
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
