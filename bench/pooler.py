"""What a pooler in transaction mode costs the registry's calls (ADR 0011: ``PODCAST_JOB_DATABASE_POOLER``).

Usage: .venv/bin/python bench/pooler.py [--database-url URL --pooler-url URL] [--rounds R] [--results FILE]
                                        [--no-write] [--smoke]

One job's round trip through the ``Registry`` interface (enqueue, promote, finalize: three calls, each its own
transaction), on one PostgreSQL server, three ways, measured round by round in turn so that they share the machine's
background load:

- direct: the registry straight at PostgreSQL, as by default (each statement prepared once per session, then cached);
- pooler mode, direct: the same server with ``transaction_pooler=True``: each statement prepared at each use, each
  transaction setting its own settings first. The mode's own cost, without a pooler;
- through pgbouncer: the mode through pgbouncer in transaction mode (a pool of 4 server sessions). The mode's cost
  and the hop.

Each round runs ``--round-trips`` (default 200) round trips per way; a figure is the median (min-max) over the rounds
of the mean time of one round trip. Each way has a fresh schema. By default the server and the pooler are the bench's
own (``scripts/postgres.sh`` and ``scripts/pgbouncer.sh`` on free ports, in directories of their own, removed at the
end); ``--database-url`` with ``--pooler-url`` (pgbouncer in transaction mode in front of that server) names others.
The results are added to ``--results`` (``make bench`` names its run's file; alone: bench/results/<UTC date>-pooler
.json) unless ``--no-write``; ``--smoke`` is 2 rounds of 20, written only to ``--results``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import trio
import trio_asyncio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _common import free_port, save_sections  # noqa: E402
from results import Column, Measure, Section, Value  # noqa: E402

from supervisor import JobStatus  # noqa: E402
from supervisor.registry import Ending, NewJob, Outcome, PostgresRegistry, PromoteRequest  # noqa: E402

WAYS = (
    ("direct", "direct (the default)"),
    ("mode_direct", "pooler mode, straight at PostgreSQL"),
    ("pgbouncer", "pooler mode, through pgbouncer"),
)
SCRIPT_TIMEOUT_S = 180


@contextmanager
def private_servers() -> Iterator[tuple[str, str]]:
    """A throwaway cluster and a pgbouncer in front of it, both the bench's own; their DSNs. Removed afterwards."""
    work = Path(tempfile.mkdtemp(prefix="bench-pooler-"))
    work.chmod(0o755)  # pgbouncer runs as the postgres user when this runs as root: it must reach its directory
    env = {
        **os.environ,
        "PG_WORK": str(work / "pg"),
        "PG_PORT": str(free_port()),
        "PG_DB": "bench_pooler",
        "PGB_WORK": str(work / "pgbouncer"),
        "PGB_PORT": str(free_port()),
    }
    scripts = [str(REPO / "scripts" / name) for name in ("postgres.sh", "pgbouncer.sh")]
    try:
        urls = []
        for script in scripts:
            done = subprocess.run(
                ["bash", script, "up"], env=env, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S
            )
            if done.returncode != 0:
                raise RuntimeError(f"{Path(script).name} up failed: {done.stderr.strip()}")
            urls.append(done.stdout.strip().splitlines()[-1])
        yield urls[0], urls[1]
    finally:
        for script in reversed(scripts):
            subprocess.run(
                ["bash", script, "down"], env=env, capture_output=True, timeout=SCRIPT_TIMEOUT_S, check=False
            )
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def servers(database_url: str | None, pooler_url: str | None) -> Iterator[tuple[str, str]]:
    """The servers named, or the bench's own."""
    if database_url is not None and pooler_url is not None:
        yield database_url, pooler_url
        return
    with private_servers() as urls:
        yield urls


async def round_trip(registry: PostgresRegistry, n: int) -> None:
    enqueued = await registry.enqueue(NewJob("k", {"n": n}, ["x"]))
    await registry.promote(PromoteRequest(10_000, "b", ["h"]))
    await registry.finalize(enqueued.job.job_id, Ending(Outcome(JobStatus.SUCCEEDED)))


async def measure(database_url: str, pooler_url: str, rounds: int, per_round: int) -> dict[str, list[float]]:
    """ms per round trip, one value per round, for each way."""
    urls = {"direct": (database_url, False), "mode_direct": (database_url, True), "pgbouncer": (pooler_url, True)}
    schemas = [f"bench_pooler_{uuid.uuid4().hex[:12]}" for _ in WAYS]
    samples: dict[str, list[float]] = {key: [] for key, _ in WAYS}
    async with PostgresRegistry.runtime():
        registries: dict[str, PostgresRegistry] = {}
        try:
            for (key, _), schema in zip(WAYS, schemas, strict=True):
                url, pooled = urls[key]
                registries[key] = await PostgresRegistry.open(
                    url, schema=schema, transaction_pooler=pooled, max_connections=4, outbox=False
                )
            for _ in range(rounds):
                for key, registry in registries.items():
                    t0 = time.perf_counter()
                    for n in range(per_round):
                        await round_trip(registry, n)
                    samples[key].append((time.perf_counter() - t0) / per_round * 1000)
        finally:
            for registry in registries.values():
                await registry.aclose()
            await trio_asyncio.aio_as_trio(_drop)(database_url, schemas)
    return samples


async def _drop(database_url: str, schemas: list[str]) -> None:
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        for schema in schemas:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", help="a PostgreSQL server (default: a throwaway one of the bench's own)")
    parser.add_argument("--pooler-url", help="pgbouncer in transaction mode in front of --database-url")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every way (default 7; --smoke 2)")
    parser.add_argument("--round-trips", type=int, default=None, help="round trips per round (default 200; --smoke 20)")
    parser.add_argument("--results", type=Path, help="add the results to this file")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    parser.add_argument("--smoke", action="store_true", help="2 rounds of 20: that the script still works")
    args = parser.parse_args()
    if (args.database_url is None) != (args.pooler_url is None):
        parser.error("--database-url and --pooler-url go together (the pooler in front of that server)")
    rounds = args.rounds or (2 if args.smoke else 7)
    per_round = args.round_trips or (20 if args.smoke else 200)
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    with servers(args.database_url, args.pooler_url) as (database_url, pooler_url):
        samples = trio.run(measure, database_url, pooler_url, rounds, per_round)
    section = Section(
        "What a pooler in transaction mode costs a registry call (a job's round trip: enqueue, promote, finalize)",
        key="pooler",
        script="bench/pooler.py",
        params={"rounds": rounds, "round_trips": per_round, "smoke": args.smoke, "own_servers": not args.database_url},
    )
    table = section.table(
        "pooler",
        [Column("way", "registry", "left"), Column("round_trip", "one round trip"), Column("ratio", "ratio to direct")],
    )
    direct = Measure.of(samples["direct"], "ms")
    for key, label in WAYS:
        figure = Measure.of(samples[key], "ms")
        ratio = Value(figure.median / direct.median, "", 2)
        print(f"{label}: {figure.fmt()} per round trip (x{ratio.value:.2f})")
        table.add(key, label, figure, ratio)
    section.notes.append(
        f"each figure is the median (min-max) over {rounds} rounds of the mean of {per_round} round trips; the ways "
        "take turns round by round; pgbouncer 1.18, transaction mode, a pool of 4 server sessions"
    )
    save_sections("pooler", [section], results=args.results, smoke=args.smoke, no_write=args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
