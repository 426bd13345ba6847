"""What the registry's contract suite needs beside its fixtures: one factory per backend, a wall clock the test
moves, and the few steps most tests start with (rows enqueued, rows running).

Everything here speaks the ``Registry`` interface only. A new backend is one more entry in ``BACKENDS``: a
``Backend`` whose ``open`` gives a fresh, empty registry with the given clock, boot id and outbox setting (its
storage under ``where``, a directory of its own), and whose ``around`` is what must stay open on the Trio loop
while its registries are used (PostgreSQL: ``trio_asyncio.open_loop()``, under which asyncpg runs).
``conftest.py`` (once per test) and the state machine (once per machine, on its portal's loop) pick it up there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import pytest
import trio
import trio_asyncio

from supervisor.domain import Job, JobStatus
from supervisor.registry import (
    MemoryRegistry,
    NewJob,
    PostgresRegistry,
    PromoteRequest,
    Registry,
    SqliteRegistry,
    hash_token,
)

# A wall-clock instant far from "now", so a timestamp the registry took from the real clock instead of its own
# would show.
EPOCH = datetime(2031, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
BOOT = "boot-test"


class WallClock:
    """The registry's wall clock (its ``clock`` argument), moved only by the test."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


class Opener(Protocol):
    def __call__(
        self, where: Path, *, clock: Callable[[], datetime], boot_id: str | None, outbox: bool
    ) -> Awaitable[Registry]: ...


async def open_sqlite(where: Path, *, clock: Callable[[], datetime], boot_id: str | None, outbox: bool) -> Registry:
    return await SqliteRegistry.open(where / "jobs.sqlite3", clock=clock, boot_id=boot_id, outbox=outbox)


async def open_memory(where: Path, *, clock: Callable[[], datetime], boot_id: str | None, outbox: bool) -> Registry:
    return MemoryRegistry(clock=clock, boot_id=boot_id, outbox=outbox)


@asynccontextmanager
async def nothing_around() -> AsyncIterator[None]:
    yield


@dataclass(frozen=True)
class Backend:
    open: Opener
    around: Callable[[], AbstractAsyncContextManager[object]] = nothing_around
    marks: tuple[pytest.MarkDecorator, ...] = ()  # e.g. a marker that skips it where its server is missing


# -- PostgreSQL: a schema of its own for every registry a test opens, dropped when the test ends -----------------

# The server the PostgreSQL backend's tests use (``.ci/run`` sets it; ``bash scripts/postgres.sh up`` prints one).
TEST_DATABASE_URL_VAR = "PODCAST_JOB_TEST_DATABASE_URL"
# The same server through pgbouncer in transaction mode (scripts/pgbouncer.sh up; .ci/run sets it).
TEST_POOLER_URL_VAR = "PODCAST_JOB_TEST_PGBOUNCER_URL"
_SCHEMAS: ContextVar[list[str]] = ContextVar("postgres_test_schemas")


def postgres_test_url() -> str | None:
    return os.environ.get(TEST_DATABASE_URL_VAR) or None


def pooler_test_url() -> str | None:
    return os.environ.get(TEST_POOLER_URL_VAR) or None


def new_schema() -> str:
    """A fresh schema's name, dropped when the enclosing ``postgres_around`` ends."""
    schema = f"test_{uuid.uuid4().hex[:20]}"
    _SCHEMAS.get().append(schema)
    return schema


async def open_postgres(
    where: Path, *, clock: Callable[[], datetime], boot_id: str | None, outbox: bool, **kwargs: Any
) -> PostgresRegistry:
    """A registry in a fresh schema (or in ``schema=``, to share one); further ``PostgresRegistry`` arguments pass.
    The test's ``clock`` also stands in for the server's clock of the leases (``lease_clock``), so that the contract
    suite moves both at once; ``lease_clock=None`` leaves the leases on the server's clock, as in production."""
    dsn = postgres_test_url()
    assert dsn is not None, f"{TEST_DATABASE_URL_VAR} is unset (the postgres mark skips these tests)"
    kwargs.setdefault("max_connections", 4)
    kwargs.setdefault("lease_clock", clock)
    schema = kwargs.pop("schema", None) or new_schema()
    return await PostgresRegistry.open(dsn, schema=schema, clock=clock, boot_id=boot_id, outbox=outbox, **kwargs)


async def open_pooled(
    where: Path, *, clock: Callable[[], datetime], boot_id: str | None, outbox: bool, **kwargs: Any
) -> PostgresRegistry:
    """As ``open_postgres``, through pgbouncer in transaction mode: its pool of a few server sessions is shared by
    every registry of the test run, so consecutive transactions of one registry meet other sessions."""
    dsn = pooler_test_url()
    assert dsn is not None, f"{TEST_POOLER_URL_VAR} is unset (the pgbouncer mark skips these tests)"
    kwargs.setdefault("max_connections", 4)
    kwargs.setdefault("lease_clock", clock)
    schema = kwargs.pop("schema", None) or new_schema()
    return await PostgresRegistry.open(
        dsn, schema=schema, clock=clock, boot_id=boot_id, outbox=outbox, transaction_pooler=True, **kwargs
    )


@asynccontextmanager
async def postgres_around() -> AsyncIterator[None]:
    """trio-asyncio's loop around the test (asyncpg runs on it); the schemas its registries made are dropped after."""
    made: list[str] = []
    token = _SCHEMAS.set(made)
    try:
        async with PostgresRegistry.runtime():
            try:
                yield
            finally:
                if made:
                    with trio.CancelScope(shield=True), trio.fail_after(30):
                        await trio_asyncio.aio_as_trio(_drop_schemas)(made)
    finally:
        _SCHEMAS.reset(token)


async def _drop_schemas(schemas: list[str]) -> None:
    conn = await asyncpg.connect(postgres_test_url(), timeout=10)
    try:
        for schema in schemas:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


BACKENDS: dict[str, Backend] = {
    "sqlite": Backend(open_sqlite),
    "memory": Backend(open_memory),
    # Marked: skipped with its reason where no server is configured, a failure in CI (tests/conftest.py).
    "postgres": Backend(open_postgres, postgres_around, (pytest.mark.postgres,)),
    "pgbouncer": Backend(open_pooled, postgres_around, (pytest.mark.postgres, pytest.mark.pgbouncer)),
}


# -- the steps most tests start with ----------------------------------------------------------------------


def new_job(n: int = 0, *, kind: str = "k", key: str | None = None) -> NewJob:
    return NewJob(kind, {"n": n}, ["run", str(n)], coalesce_key=key)


def request(max_concurrent: int = 1, *tokens: str, log_dir: Path | None = None, boot_id: str = BOOT) -> PromoteRequest:
    """A promotion into ``max_concurrent`` slots, one row per token (default: one token, ``t``)."""
    return PromoteRequest(max_concurrent, boot_id, [hash_token(t) for t in tokens or ("t",)], log_dir)


async def enqueue(reg: Registry, n: int = 1, *, kind: str = "k", start: int = 0) -> list[str]:
    """Enqueue ``n`` rows (params ``{"n": start..}``); their ids, oldest first."""
    ids = []
    for i in range(start, start + n):
        result = await reg.enqueue(new_job(i, kind=kind))
        ids.append(result.job.job_id)
    return ids


async def running(reg: Registry, tokens: Sequence[str] = ("t",)) -> list[Job]:
    """One freshly enqueued row per token, promoted with it (whatever else is queued stays queued only if older
    rows are none: call it on a registry with no queued rows)."""
    await enqueue(reg, len(tokens), start=1000)
    promotion = await reg.promote(request(len(tokens) + len(await reg.running_jobs()), *tokens))
    assert len(promotion.jobs) == len(tokens)
    assert all(job.status is JobStatus.RUNNING for job in promotion.jobs)
    return list(promotion.jobs)


async def one_running(reg: Registry, token: str = "t") -> Job:
    [job] = await running(reg, [token])
    return job
