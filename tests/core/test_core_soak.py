"""A long-running supervisor keeps flat resources while Trio retires its idle worker threads.

Trio's thread cache ends a worker thread after ``IDLE_TIMEOUT`` (10 s) idle, so at the default 30 s sweep nearly
every registry call lands on a new thread. Here the timeout is 0: every call lands on a new thread, and a few
minutes of a supervisor's life run in a second. Descriptors, threads and registry connections must not grow.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest
import trio
import trio._core._thread_cache as thread_cache
from core_helpers import wait_idle, wait_terminal  # type: ignore[import-not-found]

from supervisor import JobStatus, Supervisor
from supervisor.domain import PageRequest
from supervisor.registry.sqlite import SqliteFile


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def join_retired_workers() -> None:
    """Wait for the worker threads that are on their way out (idle timeout 0)."""
    for thread in threading.enumerate():
        if thread.name.startswith("Trio thread"):
            thread.join(timeout=5)  # bounded: an idle worker with timeout 0 exits at once
            assert not thread.is_alive(), f"{thread.name} did not retire"


def fds_outside_the_pool(registry: SqliteFile) -> int:
    """Open descriptors, less the pool's (a database and a WAL descriptor per connection, at most 4 of them):
    the pool may open a second connection when calls overlap, which is bounded, not a leak."""
    return open_fds() - 2 * registry.open_connections


async def one_round(sup: Supervisor) -> None:
    """What an operator's supervisor does over a few sweeps: a job, sweeps, listing, logs, pause and resume."""
    job = (await sup.enqueue("exit", {"code": 0})).job
    ended = await wait_terminal(sup, job.job_id)
    assert ended.status is JobStatus.SUCCEEDED
    await wait_idle(sup)
    await sup.sweeper.sweep()
    await sup.list_jobs(PageRequest.parse(limit=10))
    await sup.read_log(job.job_id, tail_bytes=10)
    await sup.pause()
    await sup.sweeper.sweep()
    await sup.resume()
    await sup.queue_state()


async def test_idle_thread_expiry_leaks_no_descriptor_thread_or_connection(
    make_supervisor: Callable[..., Supervisor], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(thread_cache, "IDLE_TIMEOUT", 0)
    created = 0
    original_init = thread_cache.WorkerThread.__init__

    def counting_init(self: object, cache: object) -> None:
        nonlocal created
        created += 1
        original_init(self, cache)  # type: ignore[arg-type]

    monkeypatch.setattr(thread_cache.WorkerThread, "__init__", counting_init)
    sup = make_supervisor(max_concurrent=1)
    registry = sup.registry.file
    await one_round(sup)  # warm-up: the pool, the log directory, imports
    join_retired_workers()
    fds_before, threads_before = fds_outside_the_pool(registry), threading.active_count()

    created_before = created
    with trio.fail_after(60):
        for _ in range(40):
            await one_round(sup)
            join_retired_workers()

    assert created - created_before > 200  # the expiry path really ran: calls kept finding fresh threads
    assert registry.open_connections <= registry.max_connections
    assert fds_outside_the_pool(registry) <= fds_before
    assert threading.active_count() <= threads_before
