"""What the transactional outbox costs the registry's write paths (issue 12).

Usage: .venv/bin/python bench/outbox.py

Each change writes its webhook event in its own transaction; this measures that cost where it is paid: one job's
round trip (enqueue -> promote -> finalize: three events) and a 1,000-job batch enqueue (1,000 events), with the
outbox on (a webhook is configured) and off. Medians of several runs, on a fresh registry each time.
"""

from __future__ import annotations

import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from supervisor import JobStatus, SqliteRegistry  # noqa: E402
from supervisor._registry import NewJob  # noqa: E402


def median_s(fn: Callable[[SqliteRegistry], object], *, outbox: bool, repeat: int) -> float:
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        registry = SqliteRegistry(Path(tmp) / "jobs.sqlite3")
        registry.outbox_enabled = outbox
        try:
            for _ in range(repeat):
                t0 = time.perf_counter()
                fn(registry)
                samples.append(time.perf_counter() - t0)
        finally:
            registry.close()
    return statistics.median(samples)


def round_trip(registry: SqliteRegistry) -> None:
    job = registry.enqueue("k", {"n": 1}, ["x"]).job
    registry.promote_queued(10_000, boot_id="b", token_hashes=["h"])
    registry.finalize(job.job_id, JobStatus.SUCCEEDED)


def batch(registry: SqliteRegistry) -> None:
    registry.enqueue_many([NewJob("k", {"n": i}, ["x"]) for i in range(1000)])


def main() -> None:
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    cases = (("job round trip (3 events)", round_trip, 200), ("batch of 1,000 (1,000 events)", batch, 7))
    for name, fn, repeat in cases:
        off = median_s(fn, outbox=False, repeat=repeat)
        on = median_s(fn, outbox=True, repeat=repeat)
        print(f"{name}: outbox off {off * 1000:.2f} ms, on {on * 1000:.2f} ms (+{(on / off - 1) * 100:.0f} %)")


if __name__ == "__main__":
    main()
