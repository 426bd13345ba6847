"""Heartbeats (ADR-150 D7) in virtual time: liveness cadence, a monotonic progress watermark, and a
dead or hanging endpoint that changes nothing about the run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from runner_helpers import FakeNet, fake_hang, fake_ok, rss
from trio.testing import MockClock

from pipeline_runner import ConfigError, EventSink, Heartbeat, HeartbeatConfig, RunnerConfig
from pipeline_runner._cli import amain

pytestmark = pytest.mark.usefixtures("inline_blocking")

HB = "http://sup/api/jobs/job-1/heartbeat"


def recording(beats: list[tuple[float, dict[str, Any], str]]) -> Any:
    async def handler(request: httpx.Request) -> httpx.Response:
        beats.append((trio.current_time(), json.loads(await request.aread()), request.headers["authorization"]))
        return httpx.Response(204)

    return handler


async def test_liveness_every_interval_and_progress_at_once(autojump_clock: MockClock) -> None:
    beats: list[tuple[float, dict[str, Any], str]] = []
    hb = Heartbeat(
        HeartbeatConfig(url=HB, token="tok", interval_s=5.0), transport=httpx.MockTransport(recording(beats))
    )
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        await nursery.start(hb.run)
        hb.set_total(3)
        await trio.sleep(12)  # virtual: lets the liveness cadence run
        hb.advance()
        await trio.sleep(1)
        hb.advance()
        hb.advance()  # coalesces with the one above when the beat task is busy or not yet woken
        await trio.sleep(1)
        hb.stop()
    times = [round(t - t0, 6) for t, _, _ in beats]
    marks = [body["completed_units"] for _, body, _ in beats]
    assert times[:3] == [0.0, 5.0, 10.0]  # liveness
    assert 12.0 in times  # a progress beat right after the first completion, not at the next tick
    assert marks == sorted(marks) and marks[-1] == 3  # the watermark never decreases
    assert all(auth == "Bearer tok" for _, _, auth in beats)
    assert set(beats[-1][1]) == {"completed_units", "total_units", "stage"}


async def test_a_burst_of_progress_is_one_beat_per_gap_and_a_stop_never_waits_for_it(autojump_clock: MockClock) -> None:
    """The supervisor's load is bounded by the number of jobs: a job beats at most once per ``min_gap_s`` however fast
    its episodes end, and its final beat (stop) goes at once."""
    beats: list[tuple[float, dict[str, Any], str]] = []
    config = HeartbeatConfig(url=HB, token="tok", interval_s=5.0, min_gap_s=1.0)
    hb = Heartbeat(config, transport=httpx.MockTransport(recording(beats)))
    async with trio.open_nursery() as nursery:
        t0 = trio.current_time()
        await nursery.start(hb.run)
        for _ in range(30):  # 30 episodes over 3 s: one every 0.1 s
            await trio.sleep(0.1)
            hb.advance()
        await trio.sleep(0.05)
        hb.stop()
    times = [round(t - t0, 6) for t, _, _ in beats]
    marks = [body["completed_units"] for _, body, _ in beats]
    assert times == [0.0, 1.0, 2.0, 3.0, 3.05]  # start, one per gap while progressing, the final one at once
    # Each carries the watermark as it stands (an advance due at the very instant of a beat may fall either side).
    assert marks[0] == 0 and marks[-1] == 30 and marks == sorted(marks)
    assert all(marks[i] in (10 * i - 1, 10 * i) for i in (1, 2, 3)), marks
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(times[:-1]))


def test_min_gap_must_not_exceed_the_interval() -> None:
    with pytest.raises(ConfigError, match="heartbeat_min_gap_s"):
        HeartbeatConfig(interval_s=2.0, min_gap_s=3.0)
    with pytest.raises(ConfigError, match="heartbeat_min_gap_s"):
        HeartbeatConfig(min_gap_s=0)


def test_watermark_never_decreases() -> None:
    hb = Heartbeat(HeartbeatConfig())
    with pytest.raises(ValueError):
        hb.advance(-1)


async def test_unset_url_disables_heartbeats(caplog: pytest.LogCaptureFixture) -> None:
    hb = Heartbeat(HeartbeatConfig(url=None))
    with caplog.at_level("INFO"):
        async with trio.open_nursery() as nursery:
            await nursery.start(hb.run)
    hb.advance()
    assert "heartbeats are disabled" in caplog.text
    assert hb.beats_ok == hb.beats_failed == 0


def run_config(tmp_path: Path, hb_url: str | None) -> RunnerConfig:
    return RunnerConfig(
        data_dir=tmp_path,
        job_id="job-1",
        feeds=("http://net/feed",),
        workers=1,
        heartbeat=HeartbeatConfig(url=hb_url, token="t", interval_s=5.0, timeout_s=2.0),
    )


def slow_audio(seconds: float) -> Any:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep(seconds)
        return httpx.Response(200, content=b"audio")

    return handler


@pytest.mark.parametrize("endpoint", ["ok", "hang", "500", "none"])
async def test_heartbeat_endpoint_state_changes_nothing(
    autojump_clock: MockClock, tmp_path: Path, endpoint: str
) -> None:
    """A dead or hanging heartbeat endpoint neither stops nor slows the run (exact virtual time)."""
    net = FakeNet()
    net.routes["/feed"] = fake_ok(rss([(f"g{i}", f"http://net/a{i}", None) for i in range(3)]))
    for i in range(3):
        net.routes[f"/a{i}"] = slow_audio(7.0)
    beats: list[tuple[float, dict[str, Any], str]] = []
    net.routes["/api/jobs/job-1/heartbeat"] = {
        "ok": recording(beats),
        "hang": fake_hang(),
        "500": lambda request: _status(500),
        "none": recording(beats),
    }[endpoint]
    hb_url = None if endpoint == "none" else HB
    events = EventSink("job-1", write_line=None)

    t0 = trio.current_time()
    outcome = await amain("run", run_config(tmp_path, hb_url), events=events, transport=net.transport())
    run_done = next(e for e in events.emitted if e["event"] == "run_finished")

    assert outcome.exit_code == 0 and outcome.counts.done == 3
    # The work itself is 3 x 7 s; the final beat may add up to 2 x timeout *after* run_finished.
    assert trio.current_time() - t0 <= 21.0 + 4.0
    assert run_done["reason"] == "completed"
    if endpoint == "ok":
        marks = [body["completed_units"] for _, body, _ in beats]
        assert marks == sorted(marks) and marks[-1] == 3
        assert beats[-1][1]["stage"] == "finished"


async def _status(code: int) -> httpx.Response:
    return httpx.Response(code)
