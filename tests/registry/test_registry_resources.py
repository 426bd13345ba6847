"""The registry's connections are bounded and owned by it, whatever threads call it (issue 8).

Before: one connection per calling thread, closed only at ``close()``. Trio retires idle worker threads after
about 10 s, so nearly every sweep opened a new connection (and WAL descriptor) that was never closed.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor import RegistryError, SqliteRegistry


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def on_fresh_thread(fn: Callable[[], object]) -> None:
    """Run ``fn`` on a brand-new thread that then exits: what the thread cache's idle expiry amounts to."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def test_calls_from_ever_new_threads_reuse_a_bounded_set_of_connections(tmp_path: Path) -> None:
    reg = SqliteRegistry(tmp_path / "r.sqlite3", max_connections=2)
    job = reg.enqueue("k", {}, ["x"]).job
    on_fresh_thread(lambda: reg.get(job.job_id))  # warm up: the pool has opened what it needs
    fds_before = open_fds()
    for _ in range(200):
        on_fresh_thread(lambda: reg.get(job.job_id))
        on_fresh_thread(reg.running_jobs)
        on_fresh_thread(lambda: reg.enqueue("k", {}, ["x"]))
    assert reg.open_connections <= reg.max_connections == 2
    assert open_fds() <= fds_before
    reg.close()


def test_concurrent_callers_never_open_more_than_the_pool(tmp_path: Path) -> None:
    reg = SqliteRegistry(tmp_path / "r.sqlite3", max_connections=3)
    peak = 0
    peak_lock = threading.Lock()

    def work() -> None:
        nonlocal peak
        for _ in range(20):
            reg.enqueue("k", {}, ["x"])
            reg.list_jobs(limit=5)
            with peak_lock:
                peak = max(peak, reg.open_connections)

    threads = [threading.Thread(target=work) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 1 <= peak <= 3
    assert reg.counts()["queued"] == 12 * 20
    reg.close()


def test_close_closes_every_connection_and_later_calls_fail_cleanly(tmp_path: Path) -> None:
    fds_before = open_fds()
    reg = SqliteRegistry(tmp_path / "r.sqlite3")
    reg.enqueue("k", {}, ["x"])
    assert reg.open_connections >= 1
    reg.close()
    assert reg.open_connections == 0
    assert open_fds() == fds_before  # the database file and its WAL are closed
    with pytest.raises(RegistryError, match="closed"):
        reg.counts()


def test_a_connection_that_failed_is_replaced_not_returned(tmp_path: Path) -> None:
    reg = SqliteRegistry(tmp_path / "r.sqlite3", max_connections=1)
    with reg._pool.borrow() as conn:
        first = conn
    with pytest.raises(sqlite3.OperationalError), reg._pool.borrow() as conn:
        assert conn is first
        raise sqlite3.OperationalError("disk I/O error")  # what a failing disk raises mid-statement
    assert reg.open_connections == 0  # closed, not kept
    with pytest.raises(sqlite3.ProgrammingError):
        first.execute("SELECT 1")  # really closed
    assert reg.counts()["queued"] == 0  # a fresh connection serves the next call
    with reg._pool.borrow() as conn:
        assert conn is not first
    reg.close()


def test_a_caller_error_keeps_the_connection(tmp_path: Path) -> None:
    from supervisor import JobNotFound

    reg = SqliteRegistry(tmp_path / "r.sqlite3", max_connections=1)
    with reg._pool.borrow() as conn:
        first = conn
    with pytest.raises(JobNotFound):
        reg.get("missing")
    with reg._pool.borrow() as conn:
        assert conn is first
    reg.close()
