"""``pipeline_runner.testing``: the runner in-process on scripted servers, each deadline at its exact virtual time.

Each deadline level (ADR-150 D6: transport ⊂ episode ⊂ job) and each budget ends the run at the instant it names,
and the transport's replies keep httpx's timeout semantics (connect, read per chunk) in virtual time. The users' own
view of it, the examples of docs/testing.md § The runner's deadlines, runs from outside the project in
tests/testing/test_docs_examples.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import httpx
import pytest
import trio
from trio.testing import MockClock

from pipeline_runner import (
    EXIT_BUDGET_EXHAUSTED,
    EXIT_CRASH,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_TIME_BUDGET_EXHAUSTED,
    EXIT_TRANSIENT,
    EXIT_USAGE,
    REASON_BUDGET_EXHAUSTED,
    REASON_TERMINATED,
    REASON_TIME_BUDGET_EXHAUSTED,
    ConfigError,
)
from pipeline_runner.testing import (
    HEARTBEAT_URL,
    InProcessRun,
    ScriptedTransport,
    drip,
    episode,
    hang,
    respond,
    rss,
    run_in_process,
    unreachable,
)

FEED = "http://feeds.test/show.xml"


def cdn(name: str) -> str:
    return f"http://cdn.test/{name}.mp3"


def show(*names: str, duration_s: float | None = None) -> ScriptedTransport:
    """A feed listing one episode per name, every enclosure answered at once unless re-routed."""
    net = ScriptedTransport({FEED: respond(body=rss(*(episode(n, cdn(n), duration_s=duration_s) for n in names)))})
    for name in names:
        net.route(cdn(name), respond(body=b"audio"))
    return net


async def run(
    net: httpx.AsyncBaseTransport, tmp_path: Path, *flags: str, sigterm_at_s: float | None = None
) -> InProcessRun:
    return await run_in_process(
        "run", "--feed", FEED, *flags, transport=net, data_dir=tmp_path, sigterm_at_s=sigterm_at_s
    )


async def test_a_hung_enclosure_fails_at_the_read_timeout_and_the_run_goes_on(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    net = show("ep-1", "ep-2")
    net.route(cdn("ep-1"), hang())
    result = await run_in_process(
        "run", "--feed", FEED, "--read-timeout-seconds", "30", transport=net, data_dir=tmp_path
    )
    assert (result.exit_code, result.reason, result.elapsed_s) == (EXIT_OK, "completed", 30.0)
    [failed] = result.named("episode_failed")
    assert (failed["guid"], failed["reason"]) == ("ep-1", "enclosure transport timeout (ReadTimeout)")
    assert result.times_of("episode_failed") == [30.0]
    assert list(result.corpus) == ["ep-2"]
    assert result.manifest is not None and result.manifest["counts"]["failed"] == 1


async def test_a_hung_feed_is_a_transient_failure_exit_75_at_the_read_timeout(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    net = ScriptedTransport({FEED: hang()})
    result = await run_in_process(
        "run", "--feed", FEED, "--read-timeout-seconds", "12", transport=net, data_dir=tmp_path
    )
    assert (result.exit_code, result.elapsed_s) == (EXIT_TRANSIENT, 12.0)
    assert result.named("feed_failed")[0]["reason"] == "transport timeout (ReadTimeout)"


async def test_an_unreachable_host_fails_at_the_connect_timeout(autojump_clock: MockClock, tmp_path: Path) -> None:
    net = ScriptedTransport({FEED: unreachable()})
    result = await run_in_process(
        "run", "--feed", FEED, "--connect-timeout-seconds", "7", transport=net, data_dir=tmp_path
    )
    assert (result.exit_code, result.elapsed_s) == (EXIT_TRANSIENT, 7.0)
    assert result.named("feed_failed")[0]["reason"] == "transport timeout (ConnectTimeout)"


async def test_a_slow_answer_within_the_read_timeout_is_no_timeout(autojump_clock: MockClock, tmp_path: Path) -> None:
    net = show("ep-1")
    net.route(cdn("ep-1"), respond(body=b"audio", after_s=29.5))
    result = await run_in_process("run", "--feed", FEED, transport=net, data_dir=tmp_path)  # read timeout 30 s
    assert (result.exit_code, result.elapsed_s, list(result.corpus)) == (EXIT_OK, 29.5, ["ep-1"])


async def test_a_dripping_enclosure_beats_the_read_timeout_and_the_episode_budget_ends_it(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    """Each byte within the read timeout resets it: only the episode scope, one level up, bounds the episode."""
    net = show("ep-1", "ep-2")
    net.route(cdn("ep-1"), drip(b"x" * 10_000, every_s=20))
    result = await run_in_process(
        "run", "--feed", FEED, "--episode-budget-seconds", "600", transport=net, data_dir=tmp_path
    )
    assert (result.exit_code, result.elapsed_s) == (EXIT_OK, 600.0)
    [failed] = result.named("episode_failed")
    assert (failed["guid"], failed["reason"]) == ("ep-1", "episode over its 600.0 s budget")
    assert result.times_of("episode_done") == [0.0] and result.times_of("episode_failed") == [600.0]


async def test_a_drip_slower_than_the_read_timeout_is_a_read_timeout(autojump_clock: MockClock, tmp_path: Path) -> None:
    net = show("ep-1")
    net.route(cdn("ep-1"), drip(b"x" * 100, every_s=45))
    result = await run_in_process("run", "--feed", FEED, transport=net, data_dir=tmp_path)
    assert result.times_of("episode_failed") == [30.0]
    assert result.named("episode_failed")[0]["reason"] == "enclosure transport timeout (ReadTimeout)"


async def test_the_job_budget_ends_the_run_exit_11_with_the_episode_in_flight_cancelled(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    net = show(*(f"ep-{i}" for i in range(5)))
    for i in range(5):
        net.route(cdn(f"ep-{i}"), respond(body=b"audio", after_s=25))
    result = await run_in_process(
        "run", "--feed", FEED, "--workers", "1", "--processing-loop-budget-seconds", "60",
        transport=net, data_dir=tmp_path,
    )  # fmt: skip
    assert (result.exit_code, result.reason, result.elapsed_s) == (
        EXIT_TIME_BUDGET_EXHAUSTED,
        REASON_TIME_BUDGET_EXHAUSTED,
        60.0,
    )
    assert result.times_of("episode_done") == [25.0, 50.0]
    assert [e["reason"] for e in result.named("episode_cancelled")] == [REASON_TIME_BUDGET_EXHAUSTED]
    assert result.manifest is not None and result.manifest["counts"]["cancelled"] == 1
    assert [sent.url for sent in result.requests] == [FEED, cdn("ep-0"), cdn("ep-1"), cdn("ep-2")]


async def test_the_job_budget_from_the_environment_is_read_as_the_process_reads_it(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    net = show("ep-1")
    net.route(cdn("ep-1"), hang())
    result = await run_in_process(
        "run", "--feed", FEED, "--read-timeout-seconds", "9000", "--episode-budget-seconds", "9000",
        transport=net, data_dir=tmp_path, env={"PODCAST_PROCESSING_LOOP_BUDGET_SECONDS": "120"},
    )  # fmt: skip
    assert (result.exit_code, result.elapsed_s) == (EXIT_TIME_BUDGET_EXHAUSTED, 120.0)


async def test_the_cost_cap_is_budget_exhausted_exit_10(autojump_clock: MockClock, tmp_path: Path) -> None:
    """Four 60-minute episodes at $0.05 a minute ($3 each) against a $9 cap: three are transcribed, the fourth
    is refused before the provider is called, and the run stops gracefully."""
    net = show(*(f"ep-{i}" for i in range(4)), duration_s=3600)
    net.route("http://asr.test/v1", respond(json={"text": "words"}, after_s=20))
    result = await run_in_process(
        "run", "--feed", FEED, "--workers", "1", "--transcribe-url", "http://asr.test/v1",
        "--transcribe-usd-per-audio-minute", "0.05", "--cost-cap-usd", "9",
        transport=net, data_dir=tmp_path,
    )  # fmt: skip
    assert (result.exit_code, result.reason) == (EXIT_BUDGET_EXHAUSTED, REASON_BUDGET_EXHAUSTED)
    assert result.times_of("episode_done") == [20.0, 40.0, 60.0] and result.elapsed_s == 60.0
    assert result.named("run_finished")[0]["spend_usd"] == 9.0
    assert sum(sent.url == "http://asr.test/v1" for sent in result.requests) == 3


async def test_sigterm_at_a_virtual_instant_is_exit_143(autojump_clock: MockClock, tmp_path: Path) -> None:
    net = show("ep-1")
    net.route(cdn("ep-1"), hang())
    result = await run(net, tmp_path, "--read-timeout-seconds", "900", sigterm_at_s=42)
    assert (result.exit_code, result.reason, result.elapsed_s) == (EXIT_TERMINATED, REASON_TERMINATED, 42.0)


async def test_heartbeats_are_recorded_in_virtual_time_and_the_final_one_carries_the_watermark(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    net = show("ep-1", "ep-2")
    net.route(cdn("ep-2"), respond(body=b"audio", after_s=12))
    result = await run_in_process(
        "run", "--feed", FEED, "--workers", "1", "--heartbeat-interval-seconds", "5",
        transport=net, data_dir=tmp_path,
    )  # fmt: skip
    beats = [(beat.at_s, beat.completed_units, beat.stage) for beat in result.heartbeats]
    assert beats[0] == (0.0, 0, "starting")
    assert beats[-1] == (12.0, 2, "finished")
    assert [at for at, _, _ in beats] == sorted(at for at, _, _ in beats)
    assert max(b - a for (a, _, _), (b, _, _) in itertools.pairwise(beats)) <= 5.0


async def test_a_scripted_heartbeat_endpoint_that_hangs_changes_nothing_about_the_run(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    net = show("ep-1")
    net.route(cdn("ep-1"), respond(body=b"audio", after_s=10))
    net.route(HEARTBEAT_URL, hang())
    result = await run(net, tmp_path, "--heartbeat-timeout-seconds", "2")
    assert (result.exit_code, list(result.corpus)) == (EXIT_OK, ["ep-1"])
    assert result.times_of("run_finished") == [10.0]
    assert result.elapsed_s <= 10.0 + 2 * 2  # the last beats are bounded by 2 x timeout


async def test_successive_replies_answer_successive_requests(autojump_clock: MockClock, tmp_path: Path) -> None:
    net = ScriptedTransport({FEED: [respond(503), respond(body=rss())]})
    first = await run(net, tmp_path / "a")
    second = await run(net, tmp_path / "b")
    assert (first.exit_code, second.exit_code) == (EXIT_TRANSIENT, EXIT_OK)


async def test_a_usage_error_is_exit_2_and_nothing_runs(autojump_clock: MockClock, tmp_path: Path) -> None:
    result = await run(ScriptedTransport(), tmp_path, "--workers", "zero")
    assert result.exit_code == EXIT_USAGE and isinstance(result.error, ConfigError)
    assert result.events == [] and result.requests == []


async def test_a_crash_is_exit_1_with_the_error(autojump_clock: MockClock, tmp_path: Path) -> None:
    class Broken(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            await trio.lowlevel.checkpoint()
            raise RuntimeError("a bug in the stage")

    result = await run(Broken(), tmp_path)
    assert result.exit_code == EXIT_CRASH and "a bug in the stage" in repr(result.error)


def test_drip_refuses_a_negative_interval() -> None:
    with pytest.raises(ValueError, match="every_s"):
        drip(b"x", every_s=-1)


async def test_an_empty_heartbeat_url_turns_heartbeats_off_as_for_the_process(
    autojump_clock: MockClock, tmp_path: Path
) -> None:
    net = show("ep-1")
    net.route(cdn("ep-1"), respond(body=b"audio", after_s=3600))
    result = await run_in_process(
        "run", "--feed", FEED, "--read-timeout-seconds", "7200",
        transport=net, data_dir=tmp_path, env={"PODCAST_JOB_HEARTBEAT_URL": ""},
    )  # fmt: skip
    assert (result.exit_code, result.elapsed_s, result.heartbeats) == (EXIT_OK, 3600.0, [])
