"""``make bench``: every benchmark of issue 10, side by side in one run; results appended to docs/performance.md.

Usage: .venv/bin/python bench/run.py [--smoke] [--no-write] [--only NAME[,NAME...]] [--runs R]

NAME is one of: throughput (1: 2,000 x /bin/true against xargs, task-spooler, GNU parallel, RQ), latency
(2: promotion, 3: enqueue, 4: detection), footprint (5: RSS and process tree with 500 jobs, 6: heartbeats),
registry (7: sweep read with 100 vs 100,000 terminal rows, list page, job round trip).

Each figure is the median of R runs (default 3) with min-max. Absolute times on a shared 2-core machine are noise;
the ratios and the targets are the result. Targets are printed as PASS/MISS lines (never timed unit tests);
``--smoke`` (tiny N, one run, no write) is what ``make test`` runs so the scripts cannot rot.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import footprint
import latency
import registry
import throughput
from _common import REPO, Section, machine, speed_probe

SCENARIOS = ("throughput", "latency", "footprint", "registry")
DOC = REPO / "docs" / "performance.md"
DOC_HEADER = (
    "# Performance\n\nResults of `make bench` (bench/run.py), newest last. Targets are checked here, never by "
    "timed assertions in unit tests.\n"
)


def git_revision() -> str:
    """The supervisor code measured: the last commit that touched supervisor/, and whether it is modified."""
    try:
        last = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%h %s", "--", "supervisor"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--", "supervisor"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    if len(last) > 90:
        last = last[:90].rsplit(" ", 1)[0] + " …"
    return f"supervisor/ at {last or '?'}{' (modified)' if dirty else ''}"


def run(only: list[str], *, smoke: bool, runs: int) -> list[Section]:
    sections: list[Section] = []
    if "throughput" in only:
        sections.append(throughput.measure(smoke=smoke, runs=runs, n=16 if smoke else 2000))
    if "latency" in only:
        sections.extend(latency.measure(smoke=smoke, runs=runs))
    if "footprint" in only:
        sections.extend(footprint.measure(smoke=smoke, runs=runs, n=10 if smoke else 500))
    if "registry" in only:
        sections.append(registry.measure(smoke=smoke, runs=runs))
    return sections


def render(sections: list[Section], info: dict[str, str], speed: dict[str, float], runs: int, elapsed_s: float) -> str:
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "",
        f"## {stamp} — make bench: the supervisor against its peers (issue 10)",
        "",
        f"Machine: {info['cpu']}, nproc {info['nproc']}, Linux {info['kernel']}, temp dir on {info['tmp filesystem']}"
        f" (shared with other work). Code: {git_revision()}. Every figure is the median of {runs} runs (min-max);"
        f" the whole run took {elapsed_s / 60:.1f} min.",
        "",
        f"Speed probe at the start of the run (medians; see `_common.speed_probe`): pure-Python work"
        f" {speed['python_ms']:.1f} ms, start and reap `/bin/true` {speed['spawn_us']:.0f} µs, a thread hand-off"
        f" and back {speed['handoff_us']:.1f} µs. Compare these before comparing two runs' figures.",
        "",
        "Versions: "
        + "; ".join(f"{k} {v}" for k, v in info.items() if k not in ("cpu", "nproc", "kernel", "tmp filesystem"))
        + ".",
        "",
        "**Targets**",
        "",
        "```",
        *[t for s in sections for t in s.targets],
        "```",
    ]
    for section in sections:
        lines += ["", f"### {section.title}", "", *section.table]
        if section.notes:
            lines.append("")
            lines += [f"- {note}" for note in section.notes]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", "--quick", action="store_true", help="tiny N, one run, nothing written")
    parser.add_argument("--no-write", action="store_true", help="print only; do not append to docs/performance.md")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="comma-separated scenarios (default: all)")
    parser.add_argument("--runs", type=int, default=None, help="runs per figure (default 3; 1 with --smoke)")
    parser.add_argument(
        "--doc", type=Path, default=None, help=f"append the results here (default {DOC}; --smoke: none)"
    )
    args = parser.parse_args()
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario {unknown[0]!r} (choose from {', '.join(SCENARIOS)})")
    runs = args.runs or (1 if args.smoke else 3)
    info = machine()
    print("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    speed = speed_probe()
    print("speed probe: " + "; ".join(f"{k} {v:.1f}" for k, v in speed.items()), flush=True)
    t0 = time.monotonic()
    sections = run(only, smoke=args.smoke, runs=runs)
    elapsed = time.monotonic() - t0
    for section in sections:
        section.print()
    print("\ntargets:")
    for section in sections:
        for line in section.targets:
            print(f"  {line}")
    if args.smoke:
        print("smoke run: tiny N, the figures and targets say nothing about speed")
    doc = args.doc or (None if args.smoke or args.no_write else DOC)
    if doc is not None:
        if not doc.exists():
            doc.write_text(DOC_HEADER)
        with doc.open("a") as fh:
            fh.write(render(sections, info, speed, runs, elapsed))
        print(f"appended to {doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
