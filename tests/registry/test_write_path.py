"""How many modules a registry write passes, from the ``Registry`` call to the driver (docs/architecture.md § The
registry): at most four, on every backend (the memory registry's driver is sqlite3 too, run on the caller's thread),
for every operation of ``Registry`` (listed from the class: one without an example call here fails; the reads too,
by their example call), and in detail for an enqueue and a finalize (with the end's follow-up job, and the silent
host's check: every branch that reads another table), a promotion and a heartbeat. Not held: a list read bounded in
time on the memory registry passes five (SQLite's probe of its time indexes, ``SqliteStore.narrowed``, runs its own
counts from the SQLite backend's module; on a file that module is the backend already).

Counted from the call stacks themselves: each ``supervisor.*`` module on the stack at the moment the driver runs a
statement (sqlite3's trace callback, in the worker thread that runs it; asyncpg's connection methods, on the asyncio
loop), and at the moment the work crosses to where the driver runs (``trio.to_thread.run_sync``, trio-asyncio's
``aio_as_trio``: the event loop's side of the call, whose frames are not on the driver's stack). A module that only
forwarded would be one more on that stack.
"""

from __future__ import annotations

import functools
import inspect
import sqlite3
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import FrameType
from typing import Any

import asyncpg
import pytest
import trio
import trio_asyncio
from registry_helpers import BOOT, WallClock, enqueue, new_job

from supervisor.domain import IdempotencyKey, IdentityRecord, Job, JobFilter, JobStatus
from supervisor.registry import (
    PAUSED_BY_OPERATOR,
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


def _within(path: set[str], what: str) -> None:
    assert path, f"{what}: no statement was seen (the counting itself is broken)"
    assert len(path) <= MOST, f"{what} passes {len(path)} modules (at most {MOST}): {', '.join(sorted(path))}"


async def test_an_enqueue_passes_at_most_four_modules(stacks: Stacks, backend: str, registry: Registry) -> None:
    with stacks.during():
        await registry.enqueue(new_job(1))
    print(f"enqueue [{backend}]:", ", ".join(sorted(stacks.seen)))
    _within(stacks.seen, "an enqueue")


async def test_a_finalize_passes_at_most_four_modules(
    stacks: Stacks, backend: str, registry: Registry, clock: WallClock
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
    print(f"finalize [{backend}]:", ", ".join(sorted(stacks.seen)))
    _within(stacks.seen, "a finalize")


async def test_a_promotion_and_a_heartbeat_pass_at_most_four_modules(
    stacks: Stacks, backend: str, registry: Registry
) -> None:
    await enqueue(registry)
    with stacks.during():
        [job] = (await registry.promote(PromoteRequest(1, BOOT, [hash_token("t")]))).jobs
    print(f"promote [{backend}]:", ", ".join(sorted(stacks.seen)))
    _within(stacks.seen, "a promotion")
    with stacks.during():
        [beat] = await registry.record_heartbeats([Beat(job.job_id, "t", completed_units=1)])
    assert isinstance(beat, Job) and beat.completed_units == 1
    print(f"record_heartbeats [{backend}]:", ", ".join(sorted(stacks.seen)))
    _within(stacks.seen, "a heartbeat")


# -- every operation, listed from the class ----------------------------------------------------------------------


def _operations() -> list[str]:
    return sorted(
        name
        for name, value in vars(Registry).items()
        if not name.startswith("_") and inspect.iscoroutinefunction(value) and name != "aclose"
    )


class World:
    """A registry with a host's lease, a running job with its identity (on that host), a queued job, a finished
    job whose key is expired, and events in the outbox: enough for each operation to take its writing branch."""

    def __init__(self, registry: Registry, clock: WallClock) -> None:
        self.registry, self.clock = registry, clock
        self.record = IdentityRecord("subprocess", {"pid": 1})
        self.key = IdempotencyKey("key-1", "f", 1.0)

    async def make(self) -> World:
        reg = self.registry
        await reg.renew_lease("h1", "boot-h1", lease_s=10, lead=True)
        [self.done] = await enqueue(reg)
        await reg.enqueue(new_job(99), key=self.key)
        [self.queued] = await enqueue(reg, start=1)
        [first, keyed] = (await reg.promote(PromoteRequest(2, BOOT, [hash_token("d"), hash_token("k")]))).jobs
        await reg.finalize(first.job_id, Ending(Outcome(JobStatus.SUCCEEDED, None), exit_code=0))
        await reg.finalize(keyed.job_id, Ending(Outcome(JobStatus.FAILED, "x"), exit_code=1))
        [self.job] = (await reg.promote(PromoteRequest(1, BOOT, [hash_token("t")], host_id="h1"))).jobs
        await reg.record_identities([IdentityClaim(self.job.job_id, self.record)])
        self.clock.advance(5)
        return self


CALLS: dict[str, Callable[[World], Any]] = {
    "enqueue": lambda w: w.registry.enqueue(new_job(7, key="c")),
    "enqueue_many": lambda w: w.registry.enqueue_many([new_job(7), new_job(8)]),
    "answer_of": lambda w: w.registry.answer_of(IdempotencyKey("key-2", "f", 60.0)),
    "promote": lambda w: w.registry.promote(PromoteRequest(2, BOOT, [hash_token("u")], host_id="h1")),
    "record_identities": lambda w: w.registry.record_identities([IdentityClaim(w.job.job_id, w.record)]),
    "finalize": lambda w: w.registry.finalize(w.job.job_id, Ending(Outcome(JobStatus.FAILED, "x"), exit_code=1)),
    "requeue": lambda w: w.registry.requeue(w.job.job_id, expect=Expect(w.record), reason="never_started"),
    "request_cancel": lambda w: w.registry.request_cancel(w.job.job_id, "op"),
    "request_stop": lambda w: w.registry.request_stop(w.job.job_id, "deadline", expect=Expect(w.record)),
    "set_paused": lambda w: w.registry.set_paused(True, by=PAUSED_BY_OPERATOR),
    "pause_state": lambda w: w.registry.pause_state(),
    "get": lambda w: w.registry.get(w.queued),
    "oldest_waiting": lambda w: w.registry.oldest_waiting({"k": 5}),
    "set_absence": lambda w: w.registry.set_absence(w.job.job_id, stalled=True, silent=False, events=[("e", "r")]),
    "record_event": lambda w: w.registry.record_event(w.job.job_id, "job.adopted", None),
    "record_queue_event": lambda w: w.registry.record_queue_event(
        "queue.stuck", host_id="h1", job_id=w.queued, details={}, reason="paused", announced="x"
    ),
    "record_heartbeats": lambda w: w.registry.record_heartbeats([Beat(w.job.job_id, "t", completed_units=1)]),
    "check_job_token": lambda w: w.registry.check_job_token(w.job.job_id, "t"),
    "running_jobs": lambda w: w.registry.running_jobs(),
    "list_jobs": lambda w: w.registry.list_jobs(),
    "select_ids": lambda w: w.registry.select_ids(JobFilter(kind="k"), 10),
    "counts": lambda w: w.registry.counts(),
    "kind_counts": lambda w: w.registry.kind_counts(),
    "newest_of_schedules": lambda w: w.registry.newest_of_schedules(),
    "retries_of": lambda w: w.registry.retries_of(w.job.job_id),
    "expire_keys": lambda w: w.registry.expire_keys(),
    "outbox_pending": lambda w: w.registry.outbox_pending(10),
    "outbox_depth": lambda w: w.registry.outbox_depth(),
    "outbox_delete": lambda w: w.registry.outbox_delete([1, 2]),
    "outbox_prune": lambda w: w.registry.outbox_prune(max_events=1, max_age_s=0),
    "prune_jobs": lambda w: w.registry.prune_jobs(
        ended_before=w.clock.now + timedelta(seconds=1), keep_latest=None, limit=5
    ),
    "renew_lease": lambda w: w.registry.renew_lease("h2", "boot-h2", lease_s=10, lead=True),
    "release_lease": lambda w: w.registry.release_lease("h1", "boot-h1"),
    "set_drained": lambda w: w.registry.set_drained("h1", True, by="op"),
    "drained": lambda w: w.registry.drained(),
    "hosts": lambda w: w.registry.hosts(),
    "leader": lambda w: w.registry.leader(),
    "forget_host": lambda w: w.registry.forget_host("h9"),
    "record_setting": lambda w: w.registry.record_setting("max_concurrent", "1", "h1", replace=True),
    "setting": lambda w: w.registry.setting("max_concurrent"),
    "drop_settings": lambda w: w.registry.drop_settings("queue_", w.clock.now + timedelta(seconds=1)),
}


@pytest.mark.parametrize("operation", _operations())
async def test_every_operation_passes_at_most_four_modules(
    stacks: Stacks, backend: str, registry: Registry, clock: WallClock, operation: str
) -> None:
    assert operation in CALLS, f"Registry.{operation} is new: give it an example call here (CALLS)"
    world = await World(registry, clock).make()
    with stacks.during():
        await CALLS[operation](world)
    print(f"{operation} [{backend}]:", len(stacks.seen), ", ".join(sorted(stacks.seen)))
    _within(stacks.seen, operation)
