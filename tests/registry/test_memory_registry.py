"""The in-memory registry is the SQLite registry in memory: the schema its migrations make, the rows of one database
shared by the boots that reopen it, each step in a transaction of its own, answered on the caller's thread with no
thread hop (so the scenario kit's virtual time does not move while it answers)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
import trio.testing
from registry_helpers import WallClock, new_job

from supervisor.registry import MemoryRegistry, sqlite


async def test_its_schema_is_the_one_the_sqlite_migrations_make() -> None:
    registry = MemoryRegistry(clock=WallClock())
    applied = {version for (version,) in registry.backend.conn.execute("SELECT version FROM schema_migrations")}
    assert applied == {m.version for m in sqlite.migrations()}
    await registry.aclose()


async def test_a_boot_reopened_on_it_reads_the_same_rows_and_names_itself_in_its_events() -> None:
    first = MemoryRegistry(boot_id="boot-a", clock=WallClock())
    enqueued = (await first.enqueue(new_job(1))).job
    again = first.reopened(boot_id="boot-b")
    assert (await again.get(enqueued.job_id)).params == {"n": 1}
    second = (await again.enqueue(new_job(2))).job
    events = {event.job_id: event.boot_id for event in await again.outbox_pending(10)}
    assert events == {enqueued.job_id: "boot-a", second.job_id: "boot-b"}


async def test_a_step_that_raises_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = MemoryRegistry(clock=WallClock())
    write = registry.backend.write

    async def write_then_fail(step: Any) -> Any:
        async def enqueue_then_fail(store: Any) -> None:
            await step(store)
            raise RuntimeError("the step fails after its write")

        return await write(enqueue_then_fail)

    monkeypatch.setattr(registry.backend, "write", write_then_fail)  # the enqueue's own step, then a failure
    with pytest.raises(RuntimeError):
        await registry.enqueue(new_job(1))
    assert not any((await registry.counts()).values())
    assert await registry.outbox_depth() == 0


async def test_it_answers_on_the_callers_thread_in_no_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    registry = MemoryRegistry(clock=WallClock())

    async def which_thread(store: object) -> int:
        return threading.get_ident()

    began = trio.current_time()
    for n in range(20):
        await registry.enqueue(new_job(n))
    assert await registry.backend.read(which_thread) == threading.get_ident()
    assert await registry.backend.write(which_thread) == threading.get_ident()
    assert sum((await registry.counts()).values()) == 20
    assert trio.current_time() == began
