"""The wake-up listener (ADR 0012 §7) on virtual time, over a registry whose listening sessions the test scripts:
what the task does with each wake-up, and with a lost session. PostgreSQL's real sessions and real ``serve``
processes: ``test_core_wakeups_postgres.py``.

- INV-NOTIFY-IS-A-HINT: a wake-up decides nothing. A cancel wake-up is carried out only for a row that is running
  here with its cancel requested, as the registry says now (one naming another host, or a job whose cancel was never
  asked, does nothing); a queued wake-up only wakes the drainer, which promotes by the registry's count;
- a lost session is said once (WARNING) however many reopenings fail, reopened with backoff (0.5 s doubling to 5 s,
  exact on virtual time), said back once (INFO), then caught up (a job queued meanwhile is started);
- a quiet session is checked every ``check_every_s``; one that does not answer is lost like any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio
import trio.lowlevel
import trio.testing
from core_executors import PROGRAMS  # type: ignore[import-not-found]

from supervisor import Config, Supervisor, load_kinds
from supervisor.domain import JobStatus, RegistryUnavailable, SteadyWallClock
from supervisor.execution.memory import MemoryExecutor
from supervisor.registry import WAKE_CANCEL, WAKE_PAUSE, WAKE_QUEUED, MemoryRegistry, NewJob, Wakeup, WakeupFeed

NOW = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
KINDS = """
[kinds.sleep]
argv = ["{python}", "-c", "pass", "{seconds}"]
params = { seconds = "float" }
"""


class ScriptedFeed:
    """A listening session the test speaks through (``say``); ``lose`` ends it as a server would; ``hang`` makes its
    check fail as a partitioned one's does."""

    def __init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[Wakeup](16)
        self.hang = False
        self.checks = 0
        self.dropped = 0

    def say(self, wake: Wakeup) -> None:
        self._send.send_nowait(wake)

    def lose(self) -> None:
        self._send.close()

    async def receive(self) -> Wakeup:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise RegistryUnavailable("the listening session ended") from None

    def receive_nowait(self) -> Wakeup | None:
        try:
            return self._receive.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            return None

    async def check(self) -> None:
        self.checks += 1
        if self.hang:
            raise RegistryUnavailable("the listening session did not answer")


class ListeningRegistry(MemoryRegistry):
    """A memory registry (one process's) that gives scripted sessions: ``refuse`` the next n openings."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.feeds: list[ScriptedFeed] = []
        self.refuse = 0
        self.opened = trio.Event()

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]:
        return self._session()

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[WakeupFeed | None]:
        await trio.lowlevel.checkpoint()
        if self.refuse:
            self.refuse -= 1
            raise RegistryUnavailable("cannot listen: connection refused")
        feed = ScriptedFeed()
        self.feeds.append(feed)
        self.opened.set()
        yield feed

    async def next_feed(self) -> ScriptedFeed:
        self.opened = trio.Event()
        await self.opened.wait()
        return self.feeds[-1]


@pytest.fixture
def jump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.05)  # see test_core_clock: thread hops finish first


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Callable[[], Any]]:
    """A supervisor (host "a") with its drainer and its wake-up listener, no sweeper: nothing polls."""
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(KINDS)
    clock = SteadyWallClock(wall=lambda: NOW + timedelta(seconds=trio.current_time()), monotonic=trio.current_time)
    registry = ListeningRegistry(clock=clock)
    config = Config(
        data_dir=tmp_path / "a",
        bind_port=0,
        kinds_file=kinds,
        max_concurrent=4,
        sweep_interval_s=86400.0,
        host_id="a",
    )
    async with trio.open_nursery() as machines, trio.open_nursery() as nursery:
        machine = MemoryExecutor(PROGRAMS, machines)
        sup = Supervisor(
            config, load_kinds(kinds), registry, boot_id="boot-a", executor=machine, wall_clock=clock, standalone=True
        )
        sup.attach(nursery)
        await nursery.start(sup.drainer.run)
        await nursery.start(sup.wakeups.run)
        yield lambda: (sup, registry)
        nursery.cancel_scope.cancel()
        machines.cancel_scope.cancel()


async def until_status(sup: Supervisor, job_id: str, status: JobStatus) -> None:
    with trio.fail_after(60):
        while (await sup.get(job_id)).status is not status:  # noqa: ASYNC110 - virtual time
            await trio.sleep(1)


def another_hosts_enqueue(registry: MemoryRegistry) -> Any:
    """A row queued as another host would queue it: straight into the registry, this host's drainer not woken."""
    return registry.enqueue(NewJob("sleep", {"seconds": 3600.0}, ["python", "-c", "pass", "3600"]))


async def test_INV_NOTIFY_IS_A_HINT_a_queued_wake_up_wakes_the_drainer_which_decides(
    jump_clock: trio.testing.MockClock, host: Callable[[], Any]
) -> None:
    sup, registry = host()
    [feed] = registry.feeds
    result = await another_hosts_enqueue(registry)
    await trio.sleep(120)  # many quiet checks of the session: nothing else
    assert (await sup.get(result.job.job_id)).status is JobStatus.QUEUED  # nobody polls here: nothing moved it
    feed.say(Wakeup(WAKE_QUEUED))
    await until_status(sup, result.job.job_id, JobStatus.RUNNING)
    # A paused queue: the wake-up wakes the drainer, the registry's pause decides (nothing promoted).
    await registry.set_paused(True, by="operator")
    second = await another_hosts_enqueue(registry)
    feed.say(Wakeup(WAKE_QUEUED))
    feed.say(Wakeup(WAKE_PAUSE))
    await trio.sleep(60)
    assert (await sup.get(second.job.job_id)).status is JobStatus.QUEUED
    await registry.set_paused(False, by="operator")  # resumed through another host: this one hears the pause
    feed.say(Wakeup(WAKE_PAUSE))
    await until_status(sup, second.job.job_id, JobStatus.RUNNING)


async def test_INV_NOTIFY_IS_A_HINT_a_cancel_is_carried_out_only_as_the_row_says(
    jump_clock: trio.testing.MockClock, host: Callable[[], Any]
) -> None:
    sup, registry = host()
    [feed] = registry.feeds
    job_id = (await sup.enqueue("sleep", {"seconds": 3600})).job.job_id
    await until_status(sup, job_id, JobStatus.RUNNING)
    feed.say(Wakeup(WAKE_CANCEL, job_id=job_id, host_id="a"))  # no cancel was asked: the row says so
    await trio.sleep(60)
    assert (await sup.get(job_id)).status is JobStatus.RUNNING
    await registry.request_cancel(job_id)  # through another host: the request is on the row only
    feed.say(Wakeup(WAKE_CANCEL, job_id=job_id, host_id="b"))  # named for another host: not this one's to do
    await trio.sleep(60)
    assert (await sup.get(job_id)).status is JobStatus.RUNNING
    feed.say(Wakeup(WAKE_CANCEL, job_id=job_id, host_id="a"))
    await until_status(sup, job_id, JobStatus.CANCELLED)


async def test_a_lost_session_is_said_once_reopened_with_backoff_said_back_and_caught_up(
    jump_clock: trio.testing.MockClock, host: Callable[[], Any]
) -> None:
    sup, registry = host()
    [feed] = registry.feeds
    with structlog.testing.capture_logs() as logs:
        registry.refuse = 2  # the server is back only at the third try
        lost_at = trio.current_time()
        feed.lose()
        await trio.lowlevel.checkpoint()
        queued = await another_hosts_enqueue(registry)  # meanwhile: its wake-up is lost with the session
        again = await registry.next_feed()
        # 0.5 s, then 1 s, then 2 s: the third try opens it.
        assert trio.current_time() - lost_at == pytest.approx(3.5)
        await until_status(sup, queued.job.job_id, JobStatus.RUNNING)  # the catch-up drained
    said = [(line["event"], line["log_level"]) for line in logs if line["event"].startswith("wakeups_")]
    assert said == [("wakeups_lost", "warning"), ("wakeups_back", "info")]
    assert next(line for line in logs if line["event"] == "wakeups_back")["down_s"] == pytest.approx(3.5)
    assert sup.wakeups.listening and sup.wakeups.losses == 1

    # A quiet session is checked every check_every_s; one that does not answer is lost like any other.
    checks = again.checks
    await trio.sleep(sup.wakeups.check_every_s * 3 + 0.1)
    assert again.checks == checks + 3
    with structlog.testing.capture_logs() as logs:
        again.hang = True
        third = await registry.next_feed()
    assert [line["event"] for line in logs if line["event"].startswith("wakeups_")] == [
        "wakeups_lost",
        "wakeups_back",
    ]
    assert third is not again and sup.wakeups.losses == 2


async def test_a_long_outage_is_retried_every_five_seconds_at_most_so_the_session_is_back_soon_after_the_server(
    jump_clock: trio.testing.MockClock, host: Callable[[], Any]
) -> None:
    # Found by the PostgreSQL restart test (ADR 0012): doubling to 30 s, a session lost in a minute-long database
    # restart came back up to 30 s after the server did.
    sup, registry = host()
    [feed] = registry.feeds
    registry.refuse = 8  # the server answers only at the ninth try
    lost_at = trio.current_time()
    feed.lose()
    await registry.next_feed()
    # After 0.5, 1, 2, 4, then every 5 s: the ninth try is 32.5 s after the loss (doubling to 30 s: 121.5 s).
    assert trio.current_time() - lost_at == pytest.approx(0.5 + 1 + 2 + 4 + 5 * 5)
    assert sup.wakeups.listening and sup.wakeups.losses == 1
