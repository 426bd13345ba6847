"""An expand migration on a large PostgreSQL history while a host promotes (docs/fleet.md § Upgrading a fleet).

Usage: .venv/bin/python bench/migration.py [--database-url URL] [--rows N] [--results FILE] [--no-write] [--smoke]

A registry of the previous release's schema (1.0.0: this release's migrations 13-16 undone) holds ``--rows``
(default 1,000,000) finished jobs and a queue of waiting ones. One task promotes and ends jobs through the
``Registry`` interface, one at a time, as fast as it can (what a busy host's drainer does); meanwhile the next
release's expand migrations are applied by a second registry opening the schema, as the first host of the new release
does at its start (13: a nullable column; 14 and 15: indexes built CONCURRENTLY, outside a transaction; 15 is the
queued rows' own index, which takes a promotion's read off the history). Measured: the
longest promotion (one ``promote`` call) and the longest gap between two promotions' ends while the migration runs,
against the same host's longest before it, and side by side the same index built the blocking way (``CREATE INDEX``
in a transaction, what a migration without ``-- transaction: none`` would do). The target: no promotion held for a
second.

The server is ``--database-url`` (default ``$PODCAST_JOB_TEST_DATABASE_URL``; without either, a throwaway cluster of
the bench's own, ``scripts/postgres.sh``, removed at the end), in a fresh schema dropped at the end. A server other
sessions use makes the concurrent build wait for their transactions too (it waits for every older snapshot): the
migration takes longer, promotions are not held longer.
The results are added to ``--results`` (``make bench``'s file; alone: bench/results/<UTC date>-migration.json) unless
``--no-write``; ``--smoke`` is 20,000 rows, written only to ``--results``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import trio
import trio_asyncio

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _common import free_port, save_sections  # noqa: E402
from results import Column, Section, Value  # noqa: E402

from supervisor import JobStatus, PostgresRegistry  # noqa: E402
from supervisor.domain import hash_token  # noqa: E402
from supervisor.registry import Ending, Outcome, PromoteRequest  # noqa: E402

QUEUED = 50_000  # waiting rows: more than the promoter can take during a run
BEFORE_S = 2.0  # the promoter's steady state, before the migration starts
AFTER_S = 1.0
SCRIPT_TIMEOUT_S = 300  # scripts/postgres.sh up may install PostgreSQL first

UNDO_1_1_0 = (
    "DROP INDEX IF EXISTS jobs_host",
    "DROP INDEX IF EXISTS jobs_queued_seq",
    "ALTER TABLE jobs DROP COLUMN IF EXISTS enqueued_release",
    "DELETE FROM schema_migrations WHERE version IN (13, 14, 15, 16)",
)
FILL = """
INSERT INTO jobs (job_id, kind, params, argv, status, created_at, started_at, ended_at, attempts, host_id, boot_id)
SELECT 'h' || i, 'pipeline', '{"feed":"https://f' || (i % 200) || '.example/"}', '[]',
       CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'succeeded' END,
       now() - make_interval(secs => $1 - i), now() - make_interval(secs => $1 - i),
       now() - make_interval(secs => $1 - i - 1), 1, 'host-' || (i % 3), 'boot'
FROM generate_series(1, $1) AS i
"""
QUEUE = """
INSERT INTO jobs (job_id, kind, params, argv, status, created_at)
SELECT 'q' || i, 'k', '{}', '[]', 'queued', now() FROM generate_series(1, $1) AS i
"""


class Promoter:
    """Promotes and ends one job at a time; each promotion's start and end (perf_counter seconds)."""

    def __init__(self, reg: PostgresRegistry) -> None:
        self.reg = reg
        self.spans: list[tuple[float, float]] = []

    async def run(self, stop: trio.Event) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            request = PromoteRequest(1, "bench-boot", [hash_token(f"t{n}")], host_id="bench-host")
            t0 = time.perf_counter()
            promotion = await self.reg.promote(request)
            self.spans.append((t0, time.perf_counter()))
            for job in promotion.jobs:
                await self.reg.finalize(job.job_id, Ending(Outcome(JobStatus.SUCCEEDED), exit_code=0))

    def worst(self, start: float, end: float) -> tuple[float, float, int]:
        """Within [start, end]: the longest promotion, the longest gap between two promotions' ends, and how many."""
        inside = [(a, b) for a, b in self.spans if b >= start and a <= end]
        longest = max((b - a for a, b in inside), default=0.0)
        ends = [start] + [b for _, b in inside] + [end]
        gap = max(b - a for a, b in itertools.pairwise(ends))
        return longest, gap, len(inside)


async def sql(dsn: str, schema: str, *statements: str, args: tuple[Any, ...] = ()) -> None:
    conn = await trio_asyncio.aio_as_trio(asyncpg.connect)(dsn, timeout=30, server_settings={"search_path": schema})
    try:
        for statement in statements:
            await trio_asyncio.aio_as_trio(conn.execute)(statement, *args)
    finally:
        await trio_asyncio.aio_as_trio(conn.close)()


async def one_way(
    dsn: str, schema: str, migrate: Callable[[], Awaitable[object]], promoter: Promoter
) -> dict[str, float]:
    """The promoter's steady state, then ``migrate`` while it promotes: the figures of both windows."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(promoter.run, stop)
        t0 = time.perf_counter()
        await trio.sleep(BEFORE_S)
        t1 = time.perf_counter()
        await migrate()
        t2 = time.perf_counter()
        await trio.sleep(AFTER_S)
        stop.set()
    before = promoter.worst(t0 + 0.2, t1)
    during = promoter.worst(t1, t2)
    return {
        "migration_s": t2 - t1,
        "before_longest_s": before[0],
        "before_gap_s": before[1],
        "during_longest_s": during[0],
        "during_gap_s": during[1],
        "promotions_during": during[2],
    }


async def measure(dsn: str, rows: int) -> dict[str, dict[str, float]]:
    schema = f"bench_migration_{uuid.uuid4().hex[:12]}"
    url = f"{dsn}{'&' if '?' in dsn else '?'}search_path={schema}"
    async with trio_asyncio.open_loop():
        await sql(dsn, "public", f'CREATE SCHEMA "{schema}"')
        try:
            # The promoter runs the previous release's work: it never writes the new column (this tree's promote and
            # finalize do not), so it runs on the schema before and after the expand alike. Opened on the schema
            # made whole, which is then taken back to 1.0.0's.
            host = await PostgresRegistry.open(url, boot_id="bench-boot", outbox=False)
            await sql(dsn, schema, *UNDO_1_1_0)
            t = time.perf_counter()
            await sql(dsn, schema, FILL, args=(rows,))
            await sql(dsn, schema, QUEUE, args=(QUEUED,))
            await sql(dsn, schema, "VACUUM ANALYZE jobs")
            print(f"filled {rows:,} rows in {time.perf_counter() - t:.1f} s")
            try:

                async def expand() -> None:
                    first = await PostgresRegistry.open(url, boot_id="new-boot", outbox=False)
                    await first.aclose()

                concurrent = await one_way(dsn, schema, expand, Promoter(host))
                print(f"expand (13-15, CONCURRENTLY): {concurrent}")

                async def blocking() -> None:
                    await sql(dsn, schema, "BEGIN; CREATE INDEX jobs_host_blocking ON jobs (host_id, seq) "
                              "WHERE host_id IS NOT NULL; COMMIT")  # fmt: skip

                plain = await one_way(dsn, schema, blocking, Promoter(host))
                print(f"the same index built in a transaction: {plain}")
            finally:
                await host.aclose()
        finally:
            with trio.CancelScope(shield=True):
                await sql(dsn, "public", f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return {"concurrently": concurrent, "blocking": plain}


@contextmanager
def server(database_url: str | None) -> Iterator[str]:
    """The server named, or a throwaway cluster of the bench's own (removed afterwards)."""
    if database_url is not None:
        yield database_url
        return
    work = Path(tempfile.mkdtemp(prefix="bench-migration-"))
    env = {**os.environ, "PG_WORK": str(work / "pg"), "PG_PORT": str(free_port()), "PG_DB": "bench_migration"}
    script = str(REPO / "scripts" / "postgres.sh")
    try:
        done = subprocess.run(["bash", script, "up"], env=env, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"postgres.sh up failed: {done.stderr.strip()}")
        yield done.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["bash", script, "down"], env=env, capture_output=True, timeout=SCRIPT_TIMEOUT_S, check=False)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("PODCAST_JOB_TEST_DATABASE_URL"))
    parser.add_argument("--rows", type=int, default=None, help="finished rows (default 1,000,000; --smoke 20,000)")
    parser.add_argument("--results", type=Path, help="add the results to this file")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    parser.add_argument("--smoke", action="store_true", help="20,000 rows: that the script still works")
    args = parser.parse_args()
    rows = args.rows or (20_000 if args.smoke else 1_000_000)
    with server(args.database_url or None) as database_url:
        found = trio.run(measure, database_url, rows)
    section = Section(
        f"An expand migration on a {rows:,}-row PostgreSQL registry while a host promotes",
        key="migration",
        script="bench/migration.py",
        params={"rows": rows, "queued": QUEUED, "smoke": args.smoke, "own_server": not args.database_url},
    )
    table = section.table(
        "migration",
        [
            Column("way", "the index built", "left"),
            Column("migration", "migration"),
            Column("during_longest", "longest promotion during it"),
            Column("during_gap", "longest gap between promotions"),
            Column("before_longest", "longest promotion before it"),
            Column("promotions", "promotions during it"),
        ],
    )
    for key, label in (("concurrently", "CONCURRENTLY (migrations 13-15)"), ("blocking", "in a transaction")):
        f = found[key]
        table.add(
            key,
            label,
            Value(f["migration_s"], "s", 2),
            Value(f["during_longest_s"] * 1000, "ms", 1),
            Value(f["during_gap_s"] * 1000, "ms", 1),
            Value(f["before_longest_s"] * 1000, "ms", 1),
            Value(f["promotions_during"], "", 0),
        )
    section.notes.append(
        "one promoter (promote then finalize, one job at a time) on the same server; the migration is the first host "
        "of the new release opening the schema (13: a nullable column; 14, 15: CREATE INDEX CONCURRENTLY), then 14's "
        "index built in a transaction, each with the promoter running"
    )
    save_sections("migration", [section], results=args.results, smoke=args.smoke, no_write=args.no_write)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
