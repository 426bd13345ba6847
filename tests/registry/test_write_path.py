"""How many modules a registry write passes, from the ``Registry`` call to the driver (docs/architecture.md § The
registry): at most four, on SQLite and on PostgreSQL, for an enqueue and a finalize (with the end's follow-up job,
and the silent host's check: every branch that reads another table), a promotion and a heartbeat.

Counted from the call stacks themselves: each ``supervisor.*`` module on the stack at the moment the driver runs a
statement (sqlite3's trace callback, in the worker thread that runs it; asyncpg's connection methods, on the asyncio
loop), and at the moment the work crosses to where the driver runs (``trio.to_thread.run_sync``, trio-asyncio's
``aio_as_trio``: the event loop's side of the call, whose frames are not on the driver's stack). A module that only
forwarded would be one more on that stack.
"""

from __future__ import annotations

import functools
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import asyncpg
import pytest
import trio
import trio_asyncio
from registry_helpers import BOOT, WallClock, enqueue, new_job

from supervisor.domain import IdentityRecord, Job, JobStatus
from supervisor.registry import (
    Beat,
    Ending,
    Expect,
    IdentityClaim,
    NewJob,
    Outcome,
    PromoteRequest,
    Registry,
    hash_token,
)

MOST = 4


def _supervisor_modules(frame: FrameType | None) -> set[str]:
    found = set()
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name == "supervisor" or name.startswith("supervisor."):
            found.add(name)
        frame = frame.f_back
    return found


class Stacks:
    """The supervisor modules seen on the stack at each driver statement and each crossing, while ``recording``."""

    def __init__(self) -> None:
        self.recording = False
        self.seen: set[str] = set()
        self.statements = 0
        self._lock = threading.Lock()

    def note(self, frame: FrameType | None, *, statement: bool) -> None:
        if self.recording:
            with self._lock:
                self.seen |= _supervisor_modules(frame)
                self.statements += statement

    @contextmanager
    def during(self) -> Iterator[None]:
        self.seen, self.statements, self.recording = set(), 0, True
        try:
            yield
        finally:
            self.recording = False


@pytest.fixture
def stacks(monkeypatch: pytest.MonkeyPatch) -> Stacks:
    """Every SQLite connection the registry opens traces its statements; asyncpg's connection methods and the two
    crossings are wrapped."""
    seen = Stacks()
    connect = sqlite3.connect

    def traced_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(lambda _sql: seen.note(sys._getframe(1), statement=True))
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced_connect)

    def statement(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def traced(*args: Any, **kwargs: Any) -> Any:
            seen.note(sys._getframe(1), statement=True)
            return await method(*args, **kwargs)

        return traced

    for name in ("execute", "executemany", "fetch", "fetchval", "fetchrow"):
        monkeypatch.setattr(asyncpg.Connection, name, statement(getattr(asyncpg.Connection, name)))

    def crossing(cross: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(cross)
        def traced(*args: Any, **kwargs: Any) -> Any:
            seen.note(sys._getframe(1), statement=False)
            return cross(*args, **kwargs)

        return traced

    monkeypatch.setattr(trio.to_thread, "run_sync", crossing(trio.to_thread.run_sync))
    monkeypatch.setattr(trio_asyncio, "aio_as_trio", crossing(trio_asyncio.aio_as_trio))
    return seen


@pytest.fixture
def sql_backend(backend: str) -> str:
    if backend == "memory":
        pytest.skip("the memory registry has no driver: the path is counted where a driver runs the statements")
    return backend


def _within(path: set[str], what: str) -> None:
    assert path, f"{what}: no statement was seen (the counting itself is broken)"
    assert len(path) <= MOST, f"{what} passes {len(path)} modules (at most {MOST}): {', '.join(sorted(path))}"


async def test_an_enqueue_passes_at_most_four_modules(sql_backend: str, registry: Registry, stacks: Stacks) -> None:
    with stacks.during():
        await registry.enqueue(new_job(1))
    print(f"enqueue [{sql_backend}]:", ", ".join(sorted(stacks.seen)))
    _within(stacks.seen, "an enqueue")


async def test_a_finalize_passes_at_most_four_modules(
    sql_backend: str, registry: Registry, clock: WallClock, stacks: Stacks
) -> None:
    # A job of a host whose lease has expired, ended on the proof that it is silent, with a follow-up job.
    await registry.renew_lease("h1", "boot-h1", lease_s=10, lead=False)
    [job_id] = await enqueue(registry)
    [job] = (await registry.promote(PromoteRequest(1, BOOT, [hash_token("t")], host_id="h1"))).jobs
    record = IdentityRecord("subprocess", {"pid": 1})
    await registry.record_identities([IdentityClaim(job_id, record)])
    clock.advance(60)
    ending = Ending(Outcome(JobStatus.SUCCEEDED, None), exit_code=0, then=NewJob("next", {}, ["next"]))
    with stacks.during():
        change = await registry.finalize(job.job_id, ending, expect=Expect(record, host_silent=True))
    assert change.changed and change.follow_up is not None  # the host's check and the follow-up: on this path too
    print(f"finalize [{sql_backend}]:", ", ".join(sorted(stacks.seen)))
    _within(stacks.seen, "a finalize")


async def test_a_promotion_and_a_heartbeat_pass_at_most_four_modules(
    sql_backend: str, registry: Registry, stacks: Stacks
) -> None:
    await enqueue(registry)
    with stacks.during():
        [job] = (await registry.promote(PromoteRequest(1, BOOT, [hash_token("t")]))).jobs
    print(f"promote [{sql_backend}]:", ", ".join(sorted(stacks.seen)))
    _within(stacks.seen, "a promotion")
    with stacks.during():
        [beat] = await registry.record_heartbeats([Beat(job.job_id, "t", completed_units=1)])
    assert isinstance(beat, Job) and beat.completed_units == 1
    print(f"record_heartbeats [{sql_backend}]:", ", ".join(sorted(stacks.seen)))
    _within(stacks.seen, "a heartbeat")
