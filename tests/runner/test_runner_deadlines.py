"""Deadline and stop logic in virtual time: MockClock autojump, a fake network, exact time asserts.

The network is an httpx MockTransport (no sockets), and blocking file I/O runs inline
(`inline_blocking`), so virtual time advances only when the run is truly waiting on a deadline.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from runner_helpers import FakeNet, fake_hang, fake_json, fake_ok, fake_status, rss
from trio.testing import MockClock

from pipeline_runner import (
    EXIT_BUDGET_EXHAUSTED,
    EXIT_CRASH,
    EXIT_OK,
    EXIT_TIME_BUDGET_EXHAUSTED,
    REASON_TERMINATED,
    EventSink,
    Heartbeat,
    HeartbeatConfig,
    PipelineRun,
    PoisonMemo,
    RunnerConfig,
    StopSignal,
    episode_key,
)

pytestmark = pytest.mark.usefixtures("inline_blocking")

NET = "http://net"


def config(tmp_path: Path, **overrides: Any) -> RunnerConfig:
    settings: dict[str, Any] = {
        "data_dir": tmp_path,
        "job_id": "job-1",
        "feeds": (f"{NET}/feed",),
        "workers": 2,
        "episode_budget_s": 60.0,
        "processing_loop_budget_s": 4 * 3600.0,
        "stop_grace_s": 30.0,
    }
    settings.update(overrides)
    return RunnerConfig(**settings)


def make_run(cfg: RunnerConfig, net: FakeNet, stop: StopSignal | None = None) -> PipelineRun:
    return PipelineRun(
        cfg,
        events=EventSink(cfg.job_id, write_line=None),
        heartbeat=Heartbeat(HeartbeatConfig()),
        stop=stop,
        transport=net.transport(),
    )


def manifest(tmp_path: Path, job_id: str = "job-1") -> dict[str, Any]:
    return json.loads((tmp_path / "corpus" / ".runs" / job_id / "run.json").read_text())


def feed(net: FakeNet, items: list[tuple[str, str, str | None]]) -> None:
    net.routes["/feed"] = fake_ok(rss([(guid, f"{NET}{path}", dur) for guid, path, dur in items]))


def sleeping(seconds: float, body: bytes = b"audio") -> Any:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep(seconds)  # the fake provider's own latency, in virtual time
        return httpx.Response(200, content=body)

    return handler


async def test_episode_budget_cancels_only_the_hung_episode(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path
) -> None:
    """ADR-150 D6: the episode budget cancels one hung episode; the others finish; the run goes on."""
    feed(fake_net, [("g0", "/a0", None), ("hung", "/hang", None), ("g2", "/a2", None)])
    fake_net.routes.update({"/a0": fake_ok(), "/a2": fake_ok(), "/hang": fake_hang()})
    run = make_run(config(tmp_path), fake_net)

    start = trio.current_time()
    outcome = await run.run()

    assert trio.current_time() - start == 60.0  # exactly the episode budget, not the job budget
    assert outcome.exit_code == EXIT_OK
    assert (outcome.counts.done, outcome.counts.failed) == (2, 1)
    [failed] = [e for e in run.events.emitted if e["event"] == "episode_failed"]
    assert failed["guid"] == "hung" and "budget" in failed["reason"]


async def test_job_budget_stops_the_run_writes_manifest_and_exit_11(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path
) -> None:
    """ADR-150 D1: the job budget cancels in-flight episodes, takes no more, and finalizes."""
    feed(fake_net, [(f"g{i}", "/hang", None) for i in range(5)])
    fake_net.routes["/hang"] = fake_hang()
    run = make_run(config(tmp_path, processing_loop_budget_s=100.0, episode_budget_s=1000.0), fake_net)

    start = trio.current_time()
    outcome = await run.run()

    assert trio.current_time() - start == 100.0
    assert outcome.reason == "time_budget_exhausted"
    assert outcome.exit_code == EXIT_TIME_BUDGET_EXHAUSTED
    m = manifest(tmp_path)
    assert m["reason"] == "time_budget_exhausted" and m["exit_code"] == 11
    assert m["counts"]["cancelled"] == 2  # the two in-flight workers; the other three never started
    assert m["planned"] == 5
    assert fake_net.calls_to("/hang") == 2
    assert not list((tmp_path / "corpus" / ".tmp").iterdir())  # cancelled staging dirs are discarded


async def test_disabled_job_budget_is_unbounded_but_episode_budget_still_holds(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path
) -> None:
    feed(fake_net, [("hung", "/hang", None)])
    fake_net.routes["/hang"] = fake_hang()
    run = make_run(config(tmp_path, processing_loop_budget_s=None, episode_budget_s=7 * 3600.0), fake_net)
    start = trio.current_time()
    outcome = await run.run()
    assert trio.current_time() - start == 7 * 3600.0
    assert outcome.counts.failed == 1


def transcribing(tmp_path: Path, **overrides: Any) -> RunnerConfig:
    # 60-minute episodes at $0.05 per audio minute: $3.00 each.
    settings: dict[str, Any] = {
        "transcribe_url": f"{NET}/transcribe",
        "transcribe_usd_per_audio_minute": Decimal("0.05"),
        "workers": 4,
    }
    settings.update(overrides)
    return config(tmp_path, **settings)


async def test_cost_cap_stops_exactly_at_the_cap(autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path) -> None:
    """ADR-150 D5: budget exhaustion is a planned stop; exactly-at-cap is allowed, one cent more is not."""
    feed(fake_net, [(f"g{i}", f"/a{i}", "60:00") for i in range(6)])
    for i in range(6):
        fake_net.routes[f"/a{i}"] = fake_ok()
    fake_net.routes["/transcribe"] = fake_json({"text": "words"})
    run = make_run(transcribing(tmp_path, cost_cap_usd=Decimal("9.00")), fake_net)

    outcome = await run.run()

    assert outcome.reason == "budget_exhausted"
    assert outcome.exit_code == EXIT_BUDGET_EXHAUSTED
    assert outcome.spend_usd == Decimal("9.00")
    assert outcome.counts.done == 3
    assert fake_net.calls_to("/transcribe") == 3
    m = manifest(tmp_path)
    assert (m["reason"], m["spend_usd"], m["cost_cap_usd"]) == ("budget_exhausted", 9.0, 9.0)


async def test_two_workers_cannot_both_take_the_last_dollar(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path
) -> None:
    feed(fake_net, [("g0", "/a0", "60:00"), ("g1", "/a1", "60:00")])
    fake_net.routes.update({"/a0": fake_ok(), "/a1": fake_ok(), "/transcribe": fake_json({"text": "w"})})
    run = make_run(transcribing(tmp_path, cost_cap_usd=Decimal("3.00"), workers=2), fake_net)
    outcome = await run.run()
    assert fake_net.calls_to("/a0") == fake_net.calls_to("/a1") == 1  # both were in flight together
    assert fake_net.calls_to("/transcribe") == 1
    assert (outcome.counts.done, outcome.counts.cancelled, outcome.spend_usd) == (1, 1, Decimal("3.00"))


def transcriber(slow_guid: str, slow: Any) -> Any:
    async def handler(request: httpx.Request) -> httpx.Response:
        await request.aread()
        if json.loads(request.headers["x-episode"])["guid"] == slow_guid:
            return await slow(request)  # type: ignore[no-any-return]
        return httpx.Response(200, json={"text": "w"})

    return handler


async def test_cost_cap_lets_in_flight_episodes_finish_within_grace(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path
) -> None:
    feed(fake_net, [("slow", "/a0", "20:00"), ("big", "/a1", "999:00"), ("later", "/a2", "1:00")])
    fake_net.routes.update({"/a0": fake_ok(), "/a1": fake_ok(), "/a2": fake_ok()})
    fake_net.routes["/transcribe"] = transcriber("slow", sleeping(10, b'{"text": "slow"}'))
    run = make_run(transcribing(tmp_path, workers=2), fake_net)

    start = trio.current_time()
    outcome = await run.run()

    assert trio.current_time() - start == 10.0  # the slow one finished; nobody waited for the grace deadline
    assert outcome.reason == "budget_exhausted"
    assert (outcome.counts.done, outcome.counts.cancelled) == (1, 1)
    assert fake_net.calls_to("/a2") == 0  # no episode is taken after the stop


async def test_cost_cap_cancels_in_flight_episodes_at_the_grace_deadline(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path
) -> None:
    feed(fake_net, [("slow", "/a0", "20:00"), ("big", "/a1", "999:00")])
    fake_net.routes.update({"/a0": fake_ok(), "/a1": fake_ok()})
    fake_net.routes["/transcribe"] = transcriber("slow", fake_hang())
    run = make_run(transcribing(tmp_path, workers=2, stop_grace_s=30.0), fake_net)

    start = trio.current_time()
    outcome = await run.run()

    assert trio.current_time() - start == 30.0
    assert outcome.exit_code == EXIT_BUDGET_EXHAUSTED
    assert (outcome.counts.done, outcome.counts.cancelled, outcome.counts.failed) == (0, 2, 0)
    # A call cancelled mid-flight may have been billed, so the cap counts it.
    assert outcome.spend_usd == Decimal("1.00")


async def test_exception_in_main_flow_cancels_every_worker_at_once(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path
) -> None:
    """ADR-150 D1: no worker outlives the run. Two workers hang; the dispatcher then crashes."""
    feed(fake_net, [(f"g{i}", "/hang", None) for i in range(4)])
    entered, exited = [], []
    both_stuck = trio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        entered.append(request)
        if len(entered) == 2:
            both_stuck.set()
        try:
            await trio.sleep_forever()
        finally:
            exited.append(request)
        raise AssertionError("unreachable")

    fake_net.routes["/hang"] = hang
    run = make_run(config(tmp_path, episode_budget_s=3600.0), fake_net)
    real_is_complete = run.corpus.is_complete
    calls = 0

    async def failing_is_complete(key: str) -> bool:
        nonlocal calls
        calls += 1
        if calls == 3:
            await both_stuck.wait()  # both workers are stuck in their downloads right now
            raise RuntimeError("bug in the main flow")
        return await real_is_complete(key)

    run.corpus.is_complete = failing_is_complete  # type: ignore[method-assign]

    start = trio.current_time()
    with pytest.raises(ExceptionGroup) as caught:
        await run.run()

    assert caught.group_contains(RuntimeError, match="bug in the main flow")
    assert trio.current_time() == start  # not a virtual second spent waiting on the stuck workers
    assert len(exited) == 2
    m = manifest(tmp_path)
    assert m["reason"] == "crashed" and m["counts"]["cancelled"] == 2


async def test_scheduling_failure_stops_submission_and_finalizes(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR-150 D2: a failure to hand out work stops submission cleanly; it does not propagate."""
    feed(fake_net, [(f"g{i}", f"/a{i}", None) for i in range(4)])
    for i in range(4):
        fake_net.routes[f"/a{i}"] = fake_ok()
    run = make_run(config(tmp_path), fake_net)
    real_hand_out = run._hand_out
    calls = 0

    async def flaky_hand_out(send: Any, episode: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")
        await real_hand_out(send, episode)

    monkeypatch.setattr(run, "_hand_out", flaky_hand_out)
    outcome = await run.run()

    assert outcome.reason == "scheduling_failed" and outcome.exit_code == EXIT_CRASH
    assert outcome.counts.done == 1
    assert fake_net.calls_to("/a2") == fake_net.calls_to("/a3") == 0
    assert manifest(tmp_path)["reason"] == "scheduling_failed"


async def test_terminate_cancels_at_once(autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path) -> None:
    feed(fake_net, [("g0", "/hang", None)])
    started = trio.Event()

    async def hang(request: httpx.Request) -> httpx.Response:
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    fake_net.routes["/hang"] = hang
    stop = StopSignal()
    run = make_run(config(tmp_path), fake_net, stop=stop)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run.run)
        await started.wait()
        t0 = trio.current_time()
        stop.request(REASON_TERMINATED)
    assert trio.current_time() == t0
    assert manifest(tmp_path)["reason"] == "terminated"


async def test_poison_episode_is_skipped_after_n_failures(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path
) -> None:
    """ADR-150 D4: a deterministically fatal episode cannot loop forever across resubmissions."""
    feed(fake_net, [("poison", "/bad", None), ("fine", "/ok", None)])
    fake_net.routes.update({"/bad": fake_status(500), "/ok": fake_ok()})
    results = []
    for attempt in range(1, 5):
        run = make_run(config(tmp_path, job_id=f"job-{attempt}", poison_threshold=3), fake_net)
        results.append(await run.run())

    assert [r.counts.failed for r in results] == [1, 1, 1, 0]
    assert [r.counts.poisoned for r in results] == [0, 0, 0, 1]
    assert [r.counts.skipped for r in results] == [0, 1, 1, 1]  # the fine one is done once, then present
    assert fake_net.calls_to("/bad") == 3
    assert all(r.exit_code == EXIT_OK for r in results)
    memo = json.loads((tmp_path / "corpus" / ".poison.json").read_text())
    assert memo[episode_key("poison")]["failures"] == 3
    assert manifest(tmp_path, "job-4")["poisoned"][0]["guid"] == "poison"


async def test_suspects_of_a_killed_run_run_first_each_alone_INV_POISON_ATTRIBUTED(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path
) -> None:
    """A run killed with two episodes in flight counted an attempt against both (the memo counts before the work):
    the next run tries each of them alone, before the rest, so the bystander is cleared by its own success and
    only the guilty one can reach the threshold."""
    feed(
        fake_net, [("fresh1", "/f1", None), ("guilty", "/g", None), ("bystander", "/b", None), ("fresh2", "/f2", None)]
    )
    open_now: set[str] = set()
    seen_together: list[tuple[str, frozenset[str]]] = []

    def tracked(path: str, seconds: float) -> Any:
        async def handler(request: httpx.Request) -> httpx.Response:
            open_now.add(path)
            seen_together.append((path, frozenset(open_now)))
            try:
                await trio.sleep(seconds)
                return httpx.Response(200, content=b"audio")
            finally:
                open_now.discard(path)

        return handler

    fake_net.routes.update({p: tracked(p, 1.0) for p in ("/f1", "/g", "/b", "/f2")})
    memo = PoisonMemo(tmp_path / "corpus" / ".poison.json", threshold=2)
    await memo.load()
    for guid in ("guilty", "bystander"):  # what a killed run leaves: begun, never reported
        await memo.begin(episode_key(guid), guid=guid, feed_url=f"{NET}/feed")

    outcome = await make_run(config(tmp_path, workers=4, poison_threshold=2), fake_net).run()

    assert outcome.exit_code == EXIT_OK and outcome.counts.done == 4
    order = [path for path, _ in seen_together]
    assert set(order[:2]) == {"/g", "/b"}  # the suspects first ...
    alone = {path: others for path, others in seen_together}
    assert alone["/g"] == {"/g"} and alone["/b"] == {"/b"}  # ... each with nothing else in flight
    assert {"/f1", "/f2"} <= alone["/f2"] | alone["/f1"]  # the rest together, as workers allow
    memo_after = json.loads((tmp_path / "corpus" / ".poison.json").read_text())
    assert memo_after == {}  # both succeeded: neither is counted any more


@pytest.mark.parametrize(("max_episodes", "done"), [(0, 5), (None, 5), (2, 2)])
async def test_max_episodes_zero_plans_every_episode(
    autojump_clock: MockClock, fake_net: FakeNet, tmp_path: Path, max_episodes: int | None, done: int
) -> None:
    feed(fake_net, [(f"g{i}", "/ok", None) for i in range(5)])
    fake_net.routes["/ok"] = fake_ok()
    run = make_run(config(tmp_path, max_episodes=max_episodes), fake_net)
    outcome = await run.run()
    assert outcome.exit_code == EXIT_OK
    assert (run.planned, outcome.counts.done) == (done, done)
    assert manifest(tmp_path)["planned"] == done
