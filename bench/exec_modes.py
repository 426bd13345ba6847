"""What a job costs in each exec mode: the same trivial job (`exit 0`), run by a supervisor in this process.

Usage: .venv/bin/python bench/exec_modes.py [--jobs 20] [--slots 10] [--results FILE] [--no-write] [--smoke]
       (docker mode needs scripts/docker-engine.sh up)

For each mode it enqueues one job alone, then ``--jobs`` at once with ``--slots`` slots, and prints the wall time until
every row is terminal and the median (min-max) of each job's started_at -> ended_at (promotion to finalized row).

The results are added to ``--results`` (``make bench`` names its run's file; alone: bench/results/<UTC date>-exec-modes
.json) unless ``--no-write``. ``--smoke``: subprocess mode only, 4 jobs on 2 slots, written only to ``--results``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _common import save_sections  # noqa: E402
from results import Column, Measure, Section, Value  # noqa: E402

from supervisor import Config, SqliteRegistry, Supervisor, load_kinds  # noqa: E402
from supervisor.domain import JobRequest  # noqa: E402

KINDS = """
[kinds.exit]
argv = ["{python}", "-c", "import sys; sys.exit(int(sys.argv[1]))", "{code}"]
params = { code = "int" }
"""
LIMIT_S = 300


async def run(mode: str, jobs: int, slots: int) -> tuple[float, list[float], int]:
    """(wall seconds, each job's started -> ended seconds, jobs succeeded)."""
    work = Path(tempfile.mkdtemp(prefix=f"bench-{mode}-"))
    (work / "kinds.toml").write_text(KINDS)
    config = Config(
        data_dir=work / "data",
        exec_mode=mode,  # type: ignore[arg-type]
        max_concurrent=slots,
        kinds_file=work / "kinds.toml",
    )
    registry = SqliteRegistry(config.registry_path)
    sup = Supervisor(
        config, load_kinds(config.kinds_file), registry, base_env={"PATH": "/usr/bin:/bin"}, standalone=True
    )
    try:
        with trio.fail_after(LIMIT_S):
            async with trio.open_nursery() as nursery:
                sup.attach(nursery)
                nursery.start_soon(sup.drainer.run)
                started = time.monotonic()
                batch = await sup.enqueue_many([JobRequest("exit", {"code": 0})] * jobs)
                while True:
                    counts = await sup.registry.counts()
                    if counts["succeeded"] + counts["failed"] >= jobs:
                        break
                    await trio.sleep(0.02)  # the rows are the measurement: poll them
                wall = time.monotonic() - started
                rows = [await sup.get(result.job.job_id) for result in batch]
                while len(sup.boot.ledger):  # noqa: ASYNC110 - monitors remove themselves after releasing the job
                    await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
    finally:
        await sup.executor.aclose()
        registry.close()
    spans = [
        (r.ended_at - r.started_at).total_seconds()
        for r in rows
        if r.started_at and r.ended_at
    ]
    return wall, spans, counts["succeeded"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--results", type=Path, help="add the results to this file")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    parser.add_argument("--smoke", action="store_true", help="subprocess mode, 4 jobs on 2 slots")
    args = parser.parse_args()
    modes = ("subprocess",) if args.smoke else ("subprocess", "docker")
    jobs_n, slots_n = (4, 2) if args.smoke else (args.jobs, args.slots)
    section = Section(
        "Exec modes: a trivial job (`exit 0`) in each mode, run by a supervisor in the bench's process",
        key="exec_modes",
        script="bench/exec_modes.py",
        params={"modes": list(modes), "jobs": jobs_n, "slots": slots_n, "smoke": args.smoke},
    )
    table = section.table(
        "exec_modes",
        [
            Column("mode", "mode", "left"),
            Column("jobs", "jobs"),
            Column("slots", "slots"),
            Column("wall", "wall"),
            Column("span", "started→ended, median (min-max)"),
            Column("succeeded", "succeeded"),
        ],
    )
    print("\n".join(table.markdown()), flush=True)  # the header; a row as each mode's figures come
    for mode in modes:
        for jobs, slots in ((1, 1), (jobs_n, slots_n)):
            wall, spans, succeeded = trio.run(run, mode, jobs, slots)
            table.add(
                f"{mode}:{jobs}",
                mode,
                jobs,
                slots,
                Value(wall, "s"),
                Measure.of(spans, "s", 3),
                f"{succeeded} of {jobs}",
            )
            print(table.markdown()[-1], flush=True)
    section.notes.append("wall: enqueue until every row is terminal; started→ended: a row's promotion to its finalize")
    save_sections("exec-modes", [section], results=args.results, smoke=args.smoke, no_write=args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
