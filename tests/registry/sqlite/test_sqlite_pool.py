"""The SQLite registry's connections are bounded and owned by it, whatever threads call it.

Before: one connection per calling thread, closed only at ``close()``. Trio retires idle worker threads after about
10 s, so nearly every sweep opened a new connection (and WAL descriptor) that was never closed.

Which connection served a call is told by a TEMP table: it exists on the connection that made it and no other, so
with a pool of one it shows whether the connection was kept or replaced.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from registry_helpers import new_job

from supervisor.domain import JobNotFound, PageRequest, RegistryError
from supervisor.registry import SqliteRegistry

WAIT_S = 30.0  # a backstop for a broken test, never a timing assertion


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def on_fresh_thread(fn: Callable[[], object]) -> None:
    """Run ``fn`` on a brand-new thread that then exits: what the thread cache's idle expiry amounts to."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def set_stage(stage: str) -> Callable[[sqlite3.Connection], object]:
    return lambda conn: conn.execute("UPDATE jobs SET stage = ?", (stage,))


async def test_calls_from_ever_new_threads_reuse_a_bounded_set_of_connections(path: Path) -> None:
    reg = await SqliteRegistry.open(path, max_connections=2)
    try:
        store = reg.file
        await reg.enqueue(new_job())
        on_fresh_thread(lambda: store.read("SELECT COUNT(*) FROM jobs"))  # warm up: the pool has what it needs
        fds_before = open_fds()
        for i in range(100):
            on_fresh_thread(lambda: store.read("SELECT * FROM jobs WHERE status = 'running'"))
            on_fresh_thread(functools.partial(store.write, set_stage(str(i))))
        assert reg.file.open_connections <= reg.file.max_connections == 2
        assert open_fds() <= fds_before
        assert (await reg.list_jobs())[0][0].stage == "99"
    finally:
        await reg.aclose()


async def test_concurrent_callers_never_open_more_than_the_pool(path: Path) -> None:
    reg = await SqliteRegistry.open(path, max_connections=3)
    peak = 0

    def sample(conn: object) -> None:  # runs in a worker thread, holding a connection
        nonlocal peak
        peak = max(peak, reg.file.open_connections)

    async def work() -> None:
        for _ in range(15):
            await reg.enqueue(new_job())
            await reg.list_jobs(PageRequest.parse(limit=5))
            await trio.to_thread.run_sync(lambda: reg.file.write(sample))
            await trio.to_thread.run_sync(reg.file.read, "SELECT COUNT(*) FROM jobs")

    try:
        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as nursery:
                for _ in range(12):
                    nursery.start_soon(work)
        assert 1 <= peak <= 3
        assert reg.file.open_connections <= 3
        assert (await reg.counts())["queued"] == 12 * 15
    finally:
        await reg.aclose()


async def test_aclose_closes_every_connection_and_later_calls_fail_cleanly(path: Path) -> None:
    fds_before = open_fds()
    reg = await SqliteRegistry.open(path)
    await reg.enqueue(new_job())
    await reg.counts()
    assert reg.file.open_connections >= 1
    await reg.aclose()
    assert reg.file.open_connections == 0
    assert open_fds() == fds_before  # the database file and its WAL are closed
    with pytest.raises(RegistryError, match="closed"):
        await reg.counts()
    with pytest.raises(RegistryError, match="closed"):
        reg.file.read("SELECT 1")


async def test_a_connection_that_failed_is_replaced_not_returned(path: Path) -> None:
    reg = await SqliteRegistry.open(path, max_connections=1)
    store = reg.file
    try:
        store.read("CREATE TEMP TABLE marker (x)")
        store.read("SELECT * FROM temp.marker")  # the same connection serves the next call
        with pytest.raises(RegistryError):
            store.read("SELECT * FROM no_such_table")  # a storage error: the connection is not trusted again
        assert store.open_connections == 0  # closed, not kept
        with pytest.raises(RegistryError, match=r"no such table: temp\.marker"):
            store.read("SELECT * FROM temp.marker")  # a fresh connection served this one
        assert (await reg.counts())["queued"] == 0
    finally:
        await reg.aclose()


async def test_a_callers_error_keeps_the_connection(path: Path) -> None:
    reg = await SqliteRegistry.open(path, max_connections=1)
    try:
        reg.file.read("CREATE TEMP TABLE marker (x)")
        with pytest.raises(JobNotFound):
            await reg.get("missing")  # a read
        with pytest.raises(JobNotFound):
            await reg.request_cancel("missing")  # a write
        reg.file.read("SELECT * FROM temp.marker")  # still the connection that made it
        assert reg.file.open_connections == 1
    finally:
        await reg.aclose()


async def test_storage_errors_surface_as_registry_errors(path: Path) -> None:
    reg = await SqliteRegistry.open(path)
    try:
        await reg.enqueue(new_job())
        reg.file.write(lambda conn: conn.execute("DROP TABLE jobs"))  # storage that no longer holds the rows
        with pytest.raises(RegistryError):
            await reg.get("x")
        with pytest.raises(RegistryError):
            await reg.enqueue(new_job())
        with pytest.raises(RegistryError):
            await reg.list_jobs()
        with pytest.raises(RegistryError):
            await reg.running_jobs()
    finally:
        await reg.aclose()


async def test_an_acknowledged_write_is_committed_and_synced_when_its_call_returns(path: Path) -> None:
    reg = await SqliteRegistry.open(path)
    try:
        result = await reg.enqueue(new_job())
        other = sqlite3.connect(path)  # another connection sees only what is committed
        try:
            assert other.execute("SELECT status FROM jobs WHERE job_id = ?", (result.job.job_id,)).fetchall() == [
                ("queued",)
            ]
        finally:
            other.close()
        # FULL: the commit is on disk (not only in the WAL's page cache) before the call returns.
        assert [tuple(row) for row in reg.file.read("PRAGMA synchronous")] == [(2,)]
    finally:
        await reg.aclose()
