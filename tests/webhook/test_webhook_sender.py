"""The sender on a virtual clock: capped exponential backoff, one bounded attempt at a time, order kept, bounds
enforced with drops counted and logged. The transport is httpx's MockTransport (no sockets)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from supervisor import Config, SqliteRegistry
from supervisor.domain import JobStatus, RegistryUnavailable
from supervisor.observe import BACKOFF_MAX_S, WebhookSender, backoff_s, sign
from supervisor.registry import Ending, NewJob, Outcome, PromoteRequest


class _Lead:
    """The sender's gate: ``leading`` open (the one process that sends, or a fleet's leader) or shut."""

    def __init__(self, leading: bool = True) -> None:
        self.leading = leading

    def may_lead(self) -> bool:
        return self.leading


ALONE = _Lead()  # the gate held open: the one process that sends (no fleet)


@pytest.fixture
async def reg(tmp_path: Path) -> AsyncIterator[_CountingRegistry]:
    registry = _CountingRegistry(tmp_path / "jobs.sqlite3")
    yield registry
    await registry.aclose()


async def _enqueue(reg: SqliteRegistry, argv: str) -> str:
    result = await reg.enqueue(NewJob("k", {}, [argv]))
    return result.job.job_id


def test_backoff_doubles_from_one_second_and_is_capped() -> None:
    assert [backoff_s(n) for n in range(1, 12)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert backoff_s(10_000) == BACKOFF_MAX_S


def test_the_signature_is_an_hmac_sha256_of_the_raw_body() -> None:
    # Known answer, computed independently: printf '{"a":1}' | openssl dgst -sha256 -hmac key
    assert sign("key", b'{"a":1}') == "sha256=88a67f24bbcdaed0e6c997404bb79a743baf44c6bab2f4c27328e3009d22e342"


async def test_failures_back_off_exponentially_and_events_go_out_in_order(
    autojump_clock: trio.testing.MockClock, reg: _CountingRegistry
) -> None:
    first = await _enqueue(reg, "x")
    await reg.promote(PromoteRequest(5, "b", ["h"]))
    await reg.finalize(first, Ending(Outcome(JobStatus.SUCCEEDED)))
    second = await _enqueue(reg, "y")
    attempts: list[tuple[float, str]] = []
    answers = iter(["500", "307", "hang", "500"])
    start = trio.current_time()
    done = trio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        payload = json.loads(request.read())
        attempts.append((trio.current_time() - start, f"{payload['job']['job_id']}:{payload['job']['status']}"))
        answer = next(answers, "ok")
        if answer == "hang":
            await trio.sleep_forever()
        if len(attempts) == 8:
            done.set()
        return httpx.Response({"500": 500, "307": 307, "ok": 204}[answer], headers={"Location": "http://x/"})

    config = Config(webhook_url="http://receiver.invalid/hook", webhook_timeout_s=0.5, webhook_secret="s")
    sender = WebhookSender(config, reg, lead=ALONE, poll_s=3600, transport=httpx.MockTransport(handler))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        await done.wait()
        nursery.cancel_scope.cancel()
    times = [t for t, _ in attempts]
    # 500 at 0, wait 1; a redirect (not followed) at 1, wait 2; a hang at 3, cut at 3 + 2 x 0.5, wait 4;
    # a 500 at 8, wait 8; then the same first event is delivered at 16 and the rest follow at once.
    assert times == [0, 1, 3, 8, 16, 16, 16, 16]
    assert sender.outcomes == {"failed": 4, "delivered": 4}
    pending = await reg.outbox_pending(10)
    assert pending == []
    # In the order written (the head was tried five times before it went through): first's three changes, then
    # second's enqueue.
    assert [what for _, what in attempts[4:]] == [
        f"{first}:queued", f"{first}:running", f"{first}:succeeded", f"{second}:queued"
    ]
    assert {what for _, what in attempts[:5]} == {f"{first}:queued"}


async def test_the_outbox_is_bounded_and_what_is_dropped_is_counted_and_logged(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    reg = SqliteRegistry(tmp_path / "jobs.sqlite3", clock=lambda: now[0])
    try:
        for _ in range(3):
            await _enqueue(reg, "old")
        now[0] += timedelta(days=8)  # those three are now past the 7-day bound
        for _ in range(5):
            await _enqueue(reg, "new")
        delivered: list[str] = []
        done = trio.Event()

        async def handler(request: httpx.Request) -> httpx.Response:
            delivered.append(request.read().decode())
            if len(delivered) == 3:
                done.set()
            return httpx.Response(200)

        config = Config(webhook_url="http://receiver.invalid/hook", webhook_outbox_max_events=3)
        sender = WebhookSender(config, reg, lead=ALONE, poll_s=3600, transport=httpx.MockTransport(handler))
        with capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                await nursery.start(sender.run)
                await done.wait()
                nursery.cancel_scope.cancel()
        assert sender.outcomes == {"dropped": 5, "delivered": 3}
        assert all('"new"' in body for body in delivered)  # the three newest survive, in order
        dropped = [e for e in logs if e["event"] == "webhook_events_dropped"]
        assert [(e["by_age"], e["by_count"]) for e in dropped] == [(3, 2)]
    finally:
        await reg.aclose()


async def test_without_a_webhook_url_stray_events_are_dropped_and_counted(
    autojump_clock: trio.testing.MockClock, reg: _CountingRegistry
) -> None:
    await _enqueue(reg, "x")  # another process cannot know that no webhook is configured
    sender = WebhookSender(Config(), reg, lead=ALONE, poll_s=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        nursery.cancel_scope.cancel()
    assert sender.outcomes == {"dropped": 1}
    assert await reg.outbox_depth() == 0


class _CountingRegistry(SqliteRegistry):
    """The real registry, recording when the sender applies the outbox bounds (a registry call in a worker thread).

    The virtual clock jumps while a worker thread runs, so a test waits for each call to end (``pruned``) instead of
    sleeping past it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.prunes: list[float] = []
        self.pruned = trio.Event()

    async def outbox_prune(self, *, max_events: int, max_age_s: float) -> Any:
        self.prunes.append(trio.current_time())
        try:
            return await super().outbox_prune(max_events=max_events, max_age_s=max_age_s)
        finally:
            self.pruned.set()
            self.pruned = trio.Event()


async def test_without_a_webhook_url_the_buses_wakes_cost_no_registry_call(
    autojump_clock: trio.testing.MockClock, reg: _CountingRegistry
) -> None:
    # Every job change wakes the sender; with no URL this process writes no event, so only the clock makes it look
    # (for events other processes wrote). A prune per job change was 6 % of the CPU under load.
    registry = reg
    sender = WebhookSender(Config(), registry, lead=ALONE, poll_s=10)
    async with trio.open_nursery() as nursery:
        first = registry.pruned
        await nursery.start(sender.run)
        await first.wait()
        for _ in range(50):
            sender.wake()
            await trio.sleep(0.1)
        assert len(registry.prunes) == 1  # 5 s of wakes: only the look at startup
        await _enqueue(reg, "x")  # another process's event
        # The enqueue's own thread hop lets the virtual clock run on: wait for the prune that drops it, whenever.
        while not sender.outcomes.get("dropped"):
            pruned = registry.pruned
            await pruned.wait()
        nursery.cancel_scope.cancel()
    assert registry.prunes[1] - registry.prunes[0] >= 10  # the clock's look, not a wake's
    assert sender.outcomes == {"dropped": 1}


async def test_with_a_webhook_url_the_bounds_are_applied_at_most_once_a_second(
    autojump_clock: trio.testing.MockClock, reg: _CountingRegistry
) -> None:
    delivered = 0
    all_delivered = trio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal delivered
        delivered += 1
        if delivered == 30:
            all_delivered.set()
        return httpx.Response(200)

    registry = reg
    config = Config(webhook_url="http://receiver.invalid/hook")
    sender = WebhookSender(config, registry, lead=ALONE, poll_s=3600, transport=httpx.MockTransport(handler))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        for _ in range(30):  # a job change at a time: each wakes the sender, and each is delivered
            await _enqueue(reg, "x")
            sender.wake()
            await trio.sleep(0.1)
        await all_delivered.wait()
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(registry.prunes, registry.prunes[1:], strict=False)]
    assert registry.prunes and all(gap >= 1.0 for gap in gaps)
    assert len(registry.prunes) <= 1 + (trio.current_time() - registry.prunes[0])


class _EndlessBody(httpx.AsyncByteStream):
    """An answer's body that never ends (a chunked stream): counts what the sender pulls from it."""

    def __init__(self) -> None:
        self.pulled = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self.pulled += 65536
            yield b"x" * 65536

    async def aclose(self) -> None:
        self.closed = True


async def test_an_answers_body_is_read_only_when_its_framing_bounds_it(
    autojump_clock: trio.testing.MockClock, reg: _CountingRegistry
) -> None:
    """Only the status counts. An endless chunked body, or one announcing a GiB, is never read (the response is
    closed unread); a small announced one is, so that the connection can carry the next event."""
    for argv in ("a", "b", "c"):
        await _enqueue(reg, argv)
    bodies: list[_EndlessBody] = []
    answers = iter(["endless", "announced", "small"])
    done = trio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        answer = next(answers)
        if answer == "small":
            done.set()
            return httpx.Response(200, content=b"ok")
        body = _EndlessBody()
        bodies.append(body)
        headers = {"Content-Length": str(1024**3)} if answer == "announced" else {}
        return httpx.Response(200, headers=headers, stream=body)

    config = Config(webhook_url="http://receiver.invalid/hook")
    sender = WebhookSender(config, reg, lead=ALONE, poll_s=3600, transport=httpx.MockTransport(handler))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        await done.wait()
        nursery.cancel_scope.cancel()
    assert sender.outcomes == {"delivered": 3}
    assert [(b.pulled, b.closed) for b in bodies] == [(0, True), (0, True)]
    assert trio.current_time() < 1  # no attempt waited out a timeout


async def test_the_outbox_bounds_hold_while_the_sender_backs_off_from_a_failing_receiver(
    autojump_clock: trio.testing.MockClock, reg: _CountingRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver down for minutes: the sender waits up to 300 s between attempts, while jobs keep writing events.
    Those past the bound are dropped within a second of their arrival, not when the backoff ends."""

    async def inline(fn: Callable[..., object], *args: object, **_: object) -> object:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    # The registry's calls inline: a worker thread would let the virtual clock jump to the backoff's end meanwhile.
    monkeypatch.setattr(trio.to_thread, "run_sync", inline)
    attempts: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(trio.current_time())
        return httpx.Response(503)

    await _enqueue(reg, "first")
    config = Config(webhook_url="http://receiver.invalid/hook", webhook_outbox_max_events=3)
    sender = WebhookSender(config, reg, lead=ALONE, poll_s=3600, transport=httpx.MockTransport(handler))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        while len(attempts) < 9:  # noqa: ASYNC110 - virtual time: the ninth failure starts a 256 s backoff
            await trio.sleep(1)
        backoff_started = attempts[-1]
        for _ in range(10):  # jobs change meanwhile: each event wakes the sender, as the event bus does
            await _enqueue(reg, "later")
            sender.wake()
        written_at = trio.current_time()
        with trio.fail_after(5):
            while await reg.outbox_depth() > 3:  # noqa: ASYNC110 - the sender prunes on its own clock
                await trio.sleep(0.1)
        pruned_at = trio.current_time()
        nursery.cancel_scope.cancel()
    assert len(attempts) == 9  # still backing off: the bound was applied during the backoff
    assert pruned_at - written_at <= 2 and pruned_at < backoff_started + backoff_s(9)
    assert sender.outcomes == {"failed": 9, "dropped": 8}


class _UnreachableRegistry(_CountingRegistry):
    """The real registry, but every outbox call fails as an unreachable database's do while ``down`` (a partition, a
    PostgreSQL restart)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.down = True
        self.failed_calls = 0

    def _check(self) -> None:
        if self.down:
            self.failed_calls += 1
            raise RegistryUnavailable("cannot read registry: no answer within 1 s")

    async def outbox_prune(self, *, max_events: int, max_age_s: float) -> Any:
        self._check()
        return await super().outbox_prune(max_events=max_events, max_age_s=max_age_s)

    async def outbox_pending(self, limit: int) -> Any:
        self._check()
        return await super().outbox_pending(limit)


@pytest.fixture
def thread_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.05)  # SQLite's worker threads finish before time jumps


@pytest.mark.parametrize("webhook_url", [None, "http://receiver.invalid/hook"])
async def test_an_unreachable_registry_never_ends_the_sender_and_what_waited_goes_out_after(
    thread_clock: trio.testing.MockClock, tmp_path: Path, webhook_url: str | None
) -> None:
    # Found by the partition test (ADR 0012): an outbox call that failed ended the sender's task, and with it the
    # whole supervisor, on a database that merely did not answer for a moment.
    registry = _UnreachableRegistry(tmp_path / "jobs.sqlite3")
    delivered: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        delivered.append(json.loads(request.read())["job"]["job_id"])
        return httpx.Response(204)

    sender = WebhookSender(
        Config(webhook_url=webhook_url), registry, lead=ALONE, poll_s=1, transport=httpx.MockTransport(handler)
    )
    job_id = await _enqueue(registry, "x")
    try:
        with capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                await nursery.start(sender.run)
                await trio.sleep(10)  # ten polls on an unreachable registry: the sender runs on
                assert registry.failed_calls >= 5
                registry.down = False
                with trio.fail_after(30):
                    while not (delivered or sender.outcomes.get("dropped")):  # noqa: ASYNC110 - virtual time
                        await trio.sleep(0.5)
                nursery.cancel_scope.cancel()
    finally:
        await registry.aclose()
    assert [e["event"] for e in logs if e["event"].startswith("webhook_outbox_")] == [
        "webhook_outbox_unreachable",  # once for the whole episode
        "webhook_outbox_reachable",
    ]
    if webhook_url is None:
        assert sender.outcomes == {"dropped": 1}
    else:
        assert delivered == [job_id]


@pytest.mark.parametrize("webhook_url", [None, "http://receiver.invalid/hook"])
async def test_a_sender_that_loses_the_lead_while_the_registry_is_unreachable_ends_the_episode_it_said(
    thread_clock: trio.testing.MockClock, tmp_path: Path, webhook_url: str | None
) -> None:
    # Found by the PostgreSQL restart test (ADR 0012): the leader said webhook_outbox_unreachable, lost the lead
    # while the database was down (every lease expired), and never said anything more -- its episode never ended.
    registry = _UnreachableRegistry(tmp_path / "jobs.sqlite3")
    lead = _Lead()
    sender = WebhookSender(
        Config(webhook_url=webhook_url),
        registry,
        poll_s=1,
        transport=httpx.MockTransport(lambda request: httpx.Response(204)),
        lead=lead,
    )
    try:
        with capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                await nursery.start(sender.run)
                await trio.sleep(3)
                assert registry.failed_calls >= 2
                lead.leading = False  # another host leads once the database is back
                registry.down = False
                await trio.sleep(5)
                lead.leading = True  # and this one again, later: nothing was left open to close
                await trio.sleep(5)
                nursery.cancel_scope.cancel()
    finally:
        await registry.aclose()
    assert [e["event"] for e in logs if e["event"].startswith("webhook_outbox_")] == [
        "webhook_outbox_unreachable",
        "webhook_outbox_left_to_leader",
    ]
