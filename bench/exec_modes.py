"""What a job costs in each exec mode: the same trivial job (`exit 0`), run by a supervisor in this process.

Usage: .venv/bin/python bench/exec_modes.py [--jobs 20] [--slots 10]   (docker mode needs scripts/docker-engine.sh up)

For each mode it enqueues one job alone, then ``--jobs`` at once with ``--slots`` slots, and prints the wall time until
every row is terminal and the median / max of each job's started_at -> ended_at (promotion to finalized row).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from supervisor import Config, SqliteRegistry, load_kinds  # noqa: E402
from supervisor._core import Supervisor  # noqa: E402
from supervisor._store import AsyncRegistry  # noqa: E402

KINDS = """
[kinds.exit]
argv = ["{python}", "-c", "import sys; sys.exit(int(sys.argv[1]))", "{code}"]
params = { code = "int" }
"""
LIMIT_S = 300


async def run(mode: str, jobs: int, slots: int) -> str:
    work = Path(tempfile.mkdtemp(prefix=f"bench-{mode}-"))
    (work / "kinds.toml").write_text(KINDS)
    config = Config(
        data_dir=work / "data",
        exec_mode=mode,  # type: ignore[arg-type]
        max_concurrent=slots,
        kinds_file=work / "kinds.toml",
    )
    registry = SqliteRegistry(config.registry_path)
    sup = Supervisor(config, load_kinds(config.kinds_file), AsyncRegistry(registry), base_env={"PATH": "/usr/bin:/bin"})
    try:
        with trio.fail_after(LIMIT_S):
            async with trio.open_nursery() as nursery:
                sup.attach(nursery)
                nursery.start_soon(sup.run_drainer)
                started = time.monotonic()
                batch = await sup.enqueue_many([{"kind": "exit", "params": {"code": 0}}] * jobs)
                while True:
                    counts = await sup.registry.counts()
                    if counts["succeeded"] + counts["failed"] >= jobs:
                        break
                    await trio.sleep(0.02)  # the rows are the measurement: poll them
                wall = time.monotonic() - started
                rows = [await sup.get(result.job.job_id) for result in batch]
                while sup._running:  # noqa: ASYNC110 - monitors remove themselves after releasing the job
                    await trio.sleep(0.02)
                nursery.cancel_scope.cancel()
    finally:
        await sup.executor.aclose()
        registry.close()
    spans = [
        (datetime.fromisoformat(r.ended_at) - datetime.fromisoformat(r.started_at)).total_seconds()
        for r in rows
        if r.started_at and r.ended_at
    ]
    return (
        f"| {mode} | {jobs} | {slots} | {wall:.2f} s | {statistics.median(spans):.3f} s | {max(spans):.3f} s "
        f"| {counts['succeeded']} of {jobs} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--slots", type=int, default=10)
    args = parser.parse_args()
    print("| mode | jobs | slots | wall | started→ended median | max | succeeded |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode in ("subprocess", "docker"):
        for jobs, slots in ((1, 1), (args.jobs, args.slots)):
            print(trio.run(run, mode, jobs, slots), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
