"""What the transactional outbox costs the registry's write paths (ADR 0002 D10).

Usage: .venv/bin/python bench/outbox.py [--results FILE] [--no-write] [--smoke]

Each change writes its webhook event in its own transaction; this measures that cost where it is paid: one job's
round trip (enqueue -> promote -> finalize: three events) and a 1,000-job batch enqueue (1,000 events), with the
outbox on (a webhook is configured) and off. Medians of several runs, on a fresh registry each time.

The results are added to ``--results`` (``make bench`` names its run's file; alone: bench/results/<UTC date>-outbox
.json) unless ``--no-write``; ``--smoke`` repeats each case a few times and writes only to ``--results``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _common import save_sections  # noqa: E402
from results import Column, Measure, Section  # noqa: E402

from supervisor import JobStatus, SqliteRegistry  # noqa: E402
from supervisor.registry import Ending, NewJob, Outcome, PromoteRequest  # noqa: E402


def samples_s(fn: Callable[[SqliteRegistry], Awaitable[object]], *, outbox: bool, repeat: int) -> list[float]:
    async def run() -> list[float]:
        samples = []
        with tempfile.TemporaryDirectory() as tmp:
            registry = SqliteRegistry(Path(tmp) / "jobs.sqlite3", outbox=outbox)
            try:
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    await fn(registry)
                    samples.append(time.perf_counter() - t0)
            finally:
                await registry.aclose()
        return samples

    return trio.run(run)


async def round_trip(registry: SqliteRegistry) -> None:
    enqueued = await registry.enqueue(NewJob("k", {"n": 1}, ["x"]))
    await registry.promote(PromoteRequest(10_000, "b", ["h"]))
    await registry.finalize(enqueued.job.job_id, Ending(Outcome(JobStatus.SUCCEEDED)))


async def batch(registry: SqliteRegistry) -> None:
    await registry.enqueue_many([NewJob("k", {"n": i}, ["x"]) for i in range(1000)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, help="add the results to this file")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    parser.add_argument("--smoke", action="store_true", help="a few calls each: that the script still works")
    args = parser.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    cases = (("job round trip (3 events)", round_trip, 200), ("batch of 1,000 (1,000 events)", batch, 7))
    section = Section(
        "What the webhook outbox costs a change (registry write paths, in-process)",
        key="outbox",
        script="bench/outbox.py",
        params={"repeats": {name: 3 if args.smoke else repeat for name, _, repeat in cases}, "smoke": args.smoke},
    )
    table = section.table(
        "outbox",
        [Column("path", "write path", "left"), Column("off", "outbox off"), Column("on", "outbox on")],
    )
    for (name, fn, repeat), key in zip(cases, ("round_trip", "batch_1000"), strict=True):
        repeat = 3 if args.smoke else repeat
        off = Measure.of([v * 1000 for v in samples_s(fn, outbox=False, repeat=repeat)], "ms")
        on = Measure.of([v * 1000 for v in samples_s(fn, outbox=True, repeat=repeat)], "ms")
        extra = (on.median / off.median - 1) * 100
        print(f"{name}: outbox off {off.median:.2f} ms, on {on.median:.2f} ms (+{extra:.0f} %)")
        table.add(key, name, off, on)
    section.notes.append("each figure is the median of every call (min-max), on a fresh registry per case")
    save_sections("outbox", [section], results=args.results, smoke=args.smoke, no_write=args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
