"""``make bench``: every benchmark of the supervisor, side by side in one run; raw results kept as a dated JSON file.

Usage: .venv/bin/python bench/run.py [--smoke] [--no-write] [--results FILE] [--label TEXT] [--only NAME[,NAME...]]
                                     [--runs R]

NAME is one of: throughput (1: 2,000 x /bin/true against xargs, task-spooler, GNU parallel, RQ), latency
(2: promotion, 3: enqueue, 4: detection), footprint (5: RSS and process tree with 500 jobs, 6: heartbeats),
registry (7: sweep read with 100 vs 100,000 terminal rows, list page, job round trip).

Each figure is the median of R runs (default 3) with min-max. Absolute times on a shared 2-core machine are noise;
the ratios and the targets are the result. Targets are printed as PASS/MISS lines (never timed unit tests);
``--smoke`` (tiny N, one run, nothing written unless ``--results``) is what ``make test`` runs so the scripts cannot
rot.

The results file (default ``bench/results/<UTC date>-make-bench.json``) holds the date, the machine, the versions of
Python, the libraries and the peers, the revision measured, the label, and every scenario's runs, figures and
targets; ``make bench`` then adds feeds.py's, outbox.py's and exec_modes.py's scenarios to the same file and renders
docs/performance.md from it with bench/report.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import footprint
import latency
import registry
import throughput
from _common import Section, git_revision, machine, peers, speed_probe, versions
from results import add_sections, default_path, run_header

SCENARIOS = ("throughput", "latency", "footprint", "registry")


def revision_text(revision: dict[str, object]) -> str:
    """``supervisor/ at <hash> <subject>`` as the page shows it."""
    return f"supervisor/ at {revision['supervisor']}{' (modified)' if revision.get('modified') else ''}"


def run(only: list[str], *, smoke: bool, runs: int) -> list[Section]:
    sections: list[Section] = []
    if "throughput" in only:
        sections.append(throughput.measure(smoke=smoke, runs=runs, n=16 if smoke else 2000))
    if "latency" in only:
        sections.extend(latency.measure(smoke=smoke, runs=runs))
    if "footprint" in only:
        sections.extend(footprint.measure(smoke=smoke, runs=runs, n=10 if smoke else 500))
        sections.extend(footprint.heartbeat_guard(smoke=smoke, runs=runs))
    if "registry" in only:
        sections.append(registry.measure(smoke=smoke, runs=runs))
    return sections


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", "--quick", action="store_true", help="tiny N, one run, nothing written")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios (default: all)")
    parser.add_argument("--runs", type=int, default=None, help="runs per figure (default 3; 1 with --smoke)")
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="the results file to write, or to add these scenarios to (default bench/results/<UTC date>-make-bench"
        ".json; --smoke: none)",
    )
    parser.add_argument("--label", default=None, help='a name for this run, e.g. "before-issue-24"')
    args = parser.parse_args()
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r} (choose from {', '.join(SCENARIOS)})")
    runs = args.runs or (1 if args.smoke else 3)
    header = run_header("make-bench", label=args.label, smoke=args.smoke, runs=runs)
    header["machine"] = machine()
    header["versions"] = versions()
    header["peers"] = peers()
    header["revision"] = git_revision()
    print("machine: " + "; ".join(f"{k} {v}" for k, v in header["machine"].items()), flush=True)
    print("versions: " + "; ".join(f"{k} {v}" for k, v in {**header["versions"], **header["peers"]}.items()))
    print(f"revision: {revision_text(header['revision'])}", flush=True)
    speed = speed_probe()
    header["machine"]["speed_probe"] = {k: round(v, 3) for k, v in speed.items()}
    print("speed probe: " + "; ".join(f"{k} {v:.1f}" for k, v in speed.items()), flush=True)
    t0 = time.monotonic()
    sections = run(only, smoke=args.smoke, runs=runs)
    header["elapsed_s"] = round(time.monotonic() - t0, 1)
    for section in sections:
        section.print()
    print("\ntargets:")
    for section in sections:
        for target in section.targets:
            print(f"  {target.line}")
    if args.smoke:
        print("smoke run: tiny N, the figures and targets say nothing about speed")
    path = args.results or (None if args.smoke or args.no_write else default_path("make-bench"))
    if path is not None:
        add_sections(path, sections, header)
        print(f"results: {path} (render the page: python bench/report.py {path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
