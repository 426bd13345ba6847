"""Which feed failures may pass by themselves (exit 75, try again later) and which are the feed's (exit 3).

In-process runs on a fake network in virtual time; the end-to-end cases against a real server are in
test_runner_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from runner_helpers import MALFORMED_XML, FakeHandler, FakeNet, fake_hang, fake_ok, fake_status, rss
from trio.testing import MockClock

from pipeline_runner import (
    EXIT_ALL_FEEDS_FAILED,
    EXIT_OK,
    EXIT_TRANSIENT,
    REASON_ALL_FEEDS_FAILED,
    REASON_ALL_FEEDS_UNAVAILABLE,
    EventSink,
    Heartbeat,
    HeartbeatConfig,
    PipelineRun,
    RunnerConfig,
)

pytestmark = pytest.mark.usefixtures("inline_blocking")

NET = "http://net"


def raising(exc: Exception) -> FakeHandler:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.lowlevel.checkpoint()
        raise exc

    return handler


def moved_to(url: str) -> FakeHandler:
    document = (
        '<rss version="2.0" xmlns:itunes="http://www.itunes.com/dtds/podcast-1.0.dtd"><channel><title>t</title>'
        f"<itunes:new-feed-url>{url}</itunes:new-feed-url></channel></rss>"
    ).encode()
    return fake_ok(document)


def too_large() -> FakeHandler:
    return fake_ok(b"x" * 2048)


def dummy_request() -> httpx.Request:
    return httpx.Request("GET", f"{NET}/x")


TRANSIENT: dict[str, FakeHandler] = {
    "500": fake_status(500),
    "502": fake_status(502),
    "503": fake_status(503),
    "599": fake_status(599),
    "429": fake_status(429),
    "connect refused": raising(httpx.ConnectError("refused", request=dummy_request())),
    "connection reset": raising(httpx.ReadError("reset", request=dummy_request())),
    "closed mid-response": raising(httpx.RemoteProtocolError("peer closed", request=dummy_request())),
    "connect timeout": raising(httpx.ConnectTimeout("slow", request=dummy_request())),
    "read timeout": raising(httpx.ReadTimeout("slow", request=dummy_request())),
    "over the budget": fake_hang(),
    "moved to a 503": moved_to(f"{NET}/moved-503"),
}
CONTENT: dict[str, FakeHandler] = {
    "400": fake_status(400),
    "403": fake_status(403),
    "404": fake_status(404),
    "410": fake_status(410),
    "204": fake_status(204),
    "malformed": fake_ok(MALFORMED_XML),
    "too large": too_large(),
    "unsupported scheme": raising(httpx.UnsupportedProtocol("ftp", request=dummy_request())),
    "too many redirects": raising(httpx.TooManyRedirects("loop", request=dummy_request())),
    "moved to a 404": moved_to(f"{NET}/moved-404"),
}


async def run_feeds(tmp_path: Path, handlers: dict[str, FakeHandler], **overrides: Any) -> tuple[PipelineRun, int]:
    net = FakeNet()
    net.routes["/moved-503"] = fake_status(503)
    net.routes["/moved-404"] = fake_status(404)
    paths = {}
    for index, (name, handler) in enumerate(handlers.items()):
        paths[name] = f"/feed{index}"
        net.routes[paths[name]] = handler
    cfg = RunnerConfig(
        data_dir=tmp_path,
        job_id="job-1",
        feeds=tuple(f"{NET}{path}" for path in paths.values()),
        episode_budget_s=60.0,
        max_feed_bytes=1024,
        **overrides,
    )
    run = PipelineRun(
        cfg,
        events=EventSink(cfg.job_id, write_line=None),
        heartbeat=Heartbeat(HeartbeatConfig()),
        transport=net.transport(),
    )
    outcome = await run.run()
    return run, outcome.exit_code


@pytest.mark.parametrize("name", sorted(TRANSIENT))
async def test_a_failure_that_may_pass_is_transient(autojump_clock: MockClock, tmp_path: Path, name: str) -> None:
    run, code = await run_feeds(tmp_path, {name: TRANSIENT[name]})
    [failed] = run.feeds_failed
    assert failed["transient"] is True, failed
    assert code == EXIT_TRANSIENT


@pytest.mark.parametrize("name", sorted(CONTENT))
async def test_a_failure_of_the_feed_itself_is_not_transient(
    autojump_clock: MockClock, tmp_path: Path, name: str
) -> None:
    run, code = await run_feeds(tmp_path, {name: CONTENT[name]})
    [failed] = run.feeds_failed
    assert failed["transient"] is False, failed
    assert code == EXIT_ALL_FEEDS_FAILED


async def test_every_feed_failed_transiently_exits_75(autojump_clock: MockClock, tmp_path: Path) -> None:
    run, code = await run_feeds(tmp_path, TRANSIENT)
    assert code == EXIT_TRANSIENT
    manifest = json.loads((tmp_path / "corpus" / ".runs" / "job-1" / "run.json").read_text())
    assert (manifest["reason"], manifest["exit_code"]) == (REASON_ALL_FEEDS_UNAVAILABLE, EXIT_TRANSIENT)
    assert len(manifest["feeds"]["failed"]) == len(TRANSIENT)
    assert all(f["transient"] for f in manifest["feeds"]["failed"])
    events = [e for e in run.events.emitted if e["event"] == "feed_failed"]
    assert len(events) == len(TRANSIENT) and all(e["transient"] is True for e in events)


@pytest.mark.parametrize("name", sorted(CONTENT))
async def test_one_feed_failed_for_its_content_makes_it_exit_3(
    autojump_clock: MockClock, tmp_path: Path, name: str
) -> None:
    transient = {"503": TRANSIENT["503"], "connect refused": TRANSIENT["connect refused"]}
    _, code = await run_feeds(tmp_path, {**transient, name: CONTENT[name]})
    assert code == EXIT_ALL_FEEDS_FAILED
    manifest = json.loads((tmp_path / "corpus" / ".runs" / "job-1" / "run.json").read_text())
    assert manifest["reason"] == REASON_ALL_FEEDS_FAILED


async def test_transient_failures_do_not_matter_when_a_feed_was_read(autojump_clock: MockClock, tmp_path: Path) -> None:
    run, code = await run_feeds(tmp_path, {"503": TRANSIENT["503"], "ok": fake_ok(rss([]))})
    assert code == EXIT_OK
    assert run.feeds_ok == 1 and run.feeds_failed[0]["transient"] is True


@pytest.mark.parametrize("url", ["http://xn--zz.example/feed.xml", "http://[ff]/feed.xml", "http://ä..example/feed"])
async def test_a_url_the_http_client_cannot_use_fails_as_its_feed_not_as_a_crash(
    autojump_clock: MockClock, tmp_path: Path, url: str
) -> None:
    """It matches the URL rule the runner and the supervisor share (so it was queued), but httpx refuses its host (an
    invalid IDNA label, a bad IPv6 literal): that feed failed, for good (exit 3), never a crash (exit 1)."""
    cfg = RunnerConfig(data_dir=tmp_path, job_id="job-1", feeds=(url,), episode_budget_s=60.0)
    run = PipelineRun(
        cfg,
        events=EventSink(cfg.job_id, write_line=None),
        heartbeat=Heartbeat(HeartbeatConfig()),
        transport=FakeNet().transport(),
    )
    outcome = await run.run()
    [failed] = run.feeds_failed
    assert failed["transient"] is False, failed
    assert outcome.exit_code == EXIT_ALL_FEEDS_FAILED
