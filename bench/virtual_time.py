"""What a virtual day of a scenario (``supervisor.testing``, docs/testing.md) costs in wall time, this tree against
another build, side by side.

Usage: .venv/bin/python bench/virtual_time.py --python /work/main/.venv/bin/python --label 45527f4 [--runs 5]

Two scenarios, each a virtual day (86,400 s) on ``trio.testing.MockClock``:

- ``quiet``: a started scenario with its kinds and nothing enqueued (the supervisor's own periodic work alone);
- ``beating``: two jobs that beat every 5 s all day (``sc.script(beats_every=5)``, ``max_concurrent=2``).

Each run measures both builds once per scenario, in alternating order, so both see the same background load; each
figure is a child process's wall time and CPU time for ``sc.advance(86400)`` alone (its start-up excluded). The
child (``--child``) uses only what both builds' kits have (``open_scenario``, ``start(kinds=...)``, ``script``,
``enqueue``, ``advance``), under the build's own interpreter. Targets (docs/testing.md § Virtual time is free): a quiet
day ≤ 0.3 s, a beating day ≤ 4 s. The raw runs go to ``bench/results/<UTC date>-virtual-time-<label>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import child_figures, write_side_by_side

DAY_S = 86_400.0
SCENARIOS = ("quiet", "beating")
TARGETS_S = {"quiet": 0.3, "beating": 4.0}


def child(scenario: str) -> int:
    import trio
    import trio.testing

    from supervisor.testing import open_scenario

    async def main() -> dict[str, float]:
        with tempfile.TemporaryDirectory() as tmp:
            async with open_scenario(Path(tmp)) as sc:
                if scenario == "quiet":
                    await sc.start(kinds={"work": sc.script(run_for=60)})
                else:
                    await sc.start(kinds={"work": sc.script(beats_every=5)}, max_concurrent=2)
                    await sc.enqueue("work")
                    await sc.enqueue("work")
                    await sc.advance(1)
                wall, cpu = time.perf_counter(), time.process_time()
                await sc.advance(DAY_S)
                return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}

    print(json.dumps(trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))))
    return 0


def one(python: str, scenario: str) -> dict[str, float]:
    return child_figures(python, __file__, scenario)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", help="the other build's interpreter (its venv's bin/python)")
    parser.add_argument("--label", default="other")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    if not args.python:
        parser.error("--python is required")
    builds = {"this tree": sys.executable, args.label: args.python}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {s: {name: [] for name in builds} for s in SCENARIOS}
    for r in range(args.runs):
        for scenario in SCENARIOS:
            order = list(builds) if r % 2 == 0 else list(builds)[::-1]
            for name in order:
                result = one(builds[name], scenario)
                runs[scenario][name].append(result)
                wall, cpu = result["wall_s"], result["cpu_s"]
                print(f"run {r + 1}/{args.runs} {scenario} {name}: {wall:.3f} s wall, {cpu:.3f} s CPU", file=sys.stderr)
    medians: dict[str, dict[str, float]] = {}
    for scenario in SCENARIOS:
        for name in builds:
            walls = [run["wall_s"] for run in runs[scenario][name]]
            cpus = [run["cpu_s"] for run in runs[scenario][name]]
            medians.setdefault(scenario, {})[name] = statistics.median(walls)
            print(
                f"{scenario:>8} {name:>10}: {statistics.median(walls):.3f} s wall ({min(walls):.3f}-{max(walls):.3f}), "
                f"{statistics.median(cpus):.3f} s CPU"
            )
        here = medians[scenario]["this tree"]
        verdict = "PASS" if here <= TARGETS_S[scenario] else "MISS"
        print(f"{verdict} {scenario}: {here:.3f} s per virtual day (target {TARGETS_S[scenario]} s)")
    what = "wall and CPU seconds of sc.advance(86400): a quiet day, and a day of two jobs beating every 5 s"
    write_side_by_side("virtual-time", args.label, builds, what, runs=runs, medians_wall_s=medians, targets_s=TARGETS_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
