"""The sender on a virtual clock: capped exponential backoff, one bounded attempt at a time, order kept, bounds
enforced with drops counted and logged. The transport is httpx's MockTransport (no sockets)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from supervisor import Config, SqliteRegistry
from supervisor._model import JobStatus
from supervisor._store import AsyncRegistry
from supervisor._webhook import BACKOFF_MAX_S, WebhookSender, backoff_s, sign


@pytest.fixture
def reg(tmp_path: Path) -> Iterator[SqliteRegistry]:
    registry = SqliteRegistry(tmp_path / "jobs.sqlite3")
    yield registry
    registry.close()


def test_backoff_doubles_from_one_second_and_is_capped() -> None:
    assert [backoff_s(n) for n in range(1, 12)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert backoff_s(10_000) == BACKOFF_MAX_S


def test_the_signature_is_an_hmac_sha256_of_the_raw_body() -> None:
    # Known answer, computed independently: printf '{"a":1}' | openssl dgst -sha256 -hmac key
    assert sign("key", b'{"a":1}') == "sha256=88a67f24bbcdaed0e6c997404bb79a743baf44c6bab2f4c27328e3009d22e342"


async def test_failures_back_off_exponentially_and_events_go_out_in_order(
    autojump_clock: trio.testing.MockClock, reg: SqliteRegistry
) -> None:
    first = reg.enqueue("k", {}, ["x"]).job
    reg.promote_queued(5, boot_id="b", token_hashes=["h"])
    reg.finalize(first.job_id, JobStatus.SUCCEEDED)
    second = reg.enqueue("k", {}, ["y"]).job
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
    sender = WebhookSender(config, AsyncRegistry(reg), poll_s=3600, transport=httpx.MockTransport(handler))
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        await done.wait()
        nursery.cancel_scope.cancel()
    times = [t for t, _ in attempts]
    # 500 at 0, wait 1; a redirect (not followed) at 1, wait 2; a hang at 3, cut at 3 + 2 x 0.5, wait 4;
    # a 500 at 8, wait 8; then the same first event is delivered at 16 and the rest follow at once.
    assert times == [0, 1, 3, 8, 16, 16, 16, 16]
    assert sender.outcomes == {"failed": 4, "delivered": 4}
    pending = reg.outbox_pending(10)
    assert pending == []
    # In the order written (the head was tried five times before it went through): first's three changes, then
    # second's enqueue.
    assert [what for _, what in attempts[4:]] == [
        f"{first.job_id}:queued", f"{first.job_id}:running", f"{first.job_id}:succeeded", f"{second.job_id}:queued"
    ]
    assert {what for _, what in attempts[:5]} == {f"{first.job_id}:queued"}


async def test_the_outbox_is_bounded_and_what_is_dropped_is_counted_and_logged(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    reg = SqliteRegistry(tmp_path / "jobs.sqlite3", clock=lambda: now[0])
    try:
        for _ in range(3):
            reg.enqueue("k", {}, ["old"])
        now[0] += timedelta(days=8)  # those three are now past the 7-day bound
        for _ in range(5):
            reg.enqueue("k", {}, ["new"])
        delivered: list[str] = []
        done = trio.Event()

        async def handler(request: httpx.Request) -> httpx.Response:
            delivered.append(request.read().decode())
            if len(delivered) == 3:
                done.set()
            return httpx.Response(200)

        config = Config(webhook_url="http://receiver.invalid/hook", webhook_outbox_max_events=3)
        sender = WebhookSender(config, AsyncRegistry(reg), poll_s=3600, transport=httpx.MockTransport(handler))
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
        reg.close()


async def test_without_a_webhook_url_stray_events_are_dropped_and_counted(
    autojump_clock: trio.testing.MockClock, reg: SqliteRegistry
) -> None:
    reg.enqueue("k", {}, ["x"])  # another process cannot know that no webhook is configured
    sender = WebhookSender(Config(), AsyncRegistry(reg), poll_s=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(sender.run)
        nursery.cancel_scope.cancel()
    assert sender.outcomes == {"dropped": 1}
    assert reg.outbox_depth() == 0
