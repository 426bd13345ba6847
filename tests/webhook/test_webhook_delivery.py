"""Webhooks from the transactional outbox, to a real local receiver (ADR 0002 D10)."""

from __future__ import annotations

import functools
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from webhook_helpers import HUGE_BODY_BYTES, KINDS, SECRET, Receiver, statuses

from supervisor import Config, JobStatus, Supervisor, load_kinds, run_supervisor
from supervisor.domain import JobRequest
from supervisor.registry import NewJob

pytestmark = pytest.mark.e2e

TERMINAL = {s for s in JobStatus if s.is_terminal}
WAIT_S = 30.0

Start = Callable[..., Awaitable[Supervisor]]


@pytest.fixture
async def start(tmp_path: Path, nursery: trio.Nursery) -> AsyncIterator[Start]:
    """``await start(**config)``: ``run_supervisor`` on 127.0.0.1:0 with the webhook kinds; shut down at the end."""
    kinds_file = tmp_path / "kinds.toml"
    kinds_file.write_text(KINDS)
    stops: list[trio.Event] = []

    async def start_(**overrides: Any) -> Supervisor:
        values: dict[str, Any] = {
            "data_dir": tmp_path / "data",
            "bind_port": 0,
            "kinds_file": kinds_file,
            "max_concurrent": 4,
            "cancel_grace_s": 2.0,
            "webhook_secret": SECRET,
            **overrides,
        }
        config = Config(**values)
        shutdown = trio.Event()
        stops.append(shutdown)
        sup: Supervisor = await nursery.start(
            functools.partial(run_supervisor, config, load_kinds(kinds_file), shutdown=shutdown)
        )
        return sup

    yield start_
    for shutdown in stops:
        shutdown.set()


async def _all_terminal(sup: Supervisor, job_ids: list[str]) -> None:
    """Poll the registry: the jobs are real processes, there is no event to wait on across them."""
    with trio.fail_after(WAIT_S):
        while True:
            rows = [await sup.get(job_id) for job_id in job_ids]
            if all(row.status in TERMINAL for row in rows):
                return
            await trio.sleep(0.05)


async def test_every_kind_of_change_reaches_the_receiver_signed_and_in_order_per_job(
    receiver: Receiver, tmp_path: Path, start: Start
) -> None:
    sup = await start(
        webhook_url=receiver.url, sweep_interval_s=0.2, progress_stale_after_s=2.0, silent_after_s=2.0
    )
    succeeds = (await sup.enqueue("exit", {"code": 0})).job.job_id
    fails = (await sup.enqueue("exit", {"code": 3})).job.job_id
    await sup.pause()
    cancelled_queued = (await sup.enqueue("sleep", {"seconds": 30})).job.job_id
    await sup.cancel(cancelled_queued)
    # Another process enqueues straight into the registry, with an argv no OS can take: the spawn fails.
    queued = await sup.registry.enqueue(NewJob("exit", {"code": 0}, ["python3", "-c", "pass", "\ud800"]))
    spawn_fails = queued.job.job_id
    quiet = (await sup.enqueue("quiet", {"quiet_s": 5.0})).job.job_id
    cancelled_running = (await sup.enqueue("sleep", {"seconds": 30})).job.job_id
    await sup.resume()
    with trio.fail_after(WAIT_S):
        while (await sup.get(cancelled_running)).identity is None:  # noqa: ASYNC110 - a real spawn, polled
            await trio.sleep(0.05)
    await sup.cancel(cancelled_running)
    jobs = [succeeds, fails, cancelled_queued, spawn_fails, quiet, cancelled_running]
    await _all_terminal(sup, jobs)

    expected = {
        succeeds: ["job.transition:queued", "job.transition:running", "job.transition:succeeded"],
        fails: ["job.transition:queued", "job.transition:running", "job.transition:failed"],
        cancelled_queued: ["job.transition:queued", "job.transition:cancelled"],
        spawn_fails: ["job.transition:queued", "job.transition:running", "job.transition:failed"],
        cancelled_running: ["job.transition:queued", "job.transition:running", "job.transition:cancelled"],
    }
    with trio.fail_after(WAIT_S):
        await receiver.wait_for(lambda r: statuses(r.events(), quiet)[-1:] == ["job.transition:succeeded"])
        await receiver.wait_for(lambda r: all(statuses(r.events(), j)[-1:] == e[-1:] for j, e in expected.items()))
    events = receiver.events()
    total = len(events)
    for job_id, sequence in expected.items():
        assert statuses(events, job_id) == sequence, job_id
    quiet_events = statuses(events, quiet)
    assert quiet_events[:2] == ["job.transition:queued", "job.transition:running"]
    # Quiet for 5 s after its first beat: stalled and silent (usually at the same sweep; a slow start may add an
    # early stall and its recovery before the first beat), then recovered by its second beat, then done.
    assert {"job.silent", "job.stalled"} <= set(quiet_events[2:-2])
    assert quiet_events[-2:] == ["job.recovered", "job.transition:succeeded"]

    reasons = {(p["job"]["job_id"], p["job"]["status"]): p["reason"] for p in events if p["event"] == "job.transition"}
    assert reasons[(fails, "failed")] == "exit_code_3"
    assert reasons[(cancelled_queued, "cancelled")] == "cancelled_before_start"
    assert reasons[(spawn_fails, "failed")].startswith("spawn_failed: ")
    assert reasons[(cancelled_running, "cancelled")] == "cancelled"
    stalled = next(p for p in events if p["event"] == "job.stalled")
    assert (stalled["job"]["stalled"], stalled["reason"]) == (True, "progress_stalled")
    assert stalled["previous_status"] == "running"
    for delivery in receiver.accepted:
        assert delivery.signed_by(SECRET)
        assert not delivery.signed_by("another secret")
        assert delivery.headers["x-podcast-timestamp"].isdigit()
        payload = delivery.json()
        assert set(payload) == {"event_id", "event", "job", "previous_status", "reason", "boot_id", "ts"}
        assert payload["boot_id"] == sup.boot_id
        assert delivery.headers["x-podcast-event-id"] == payload["event_id"]
        assert "token_hash" not in payload["job"]
    assert len({p["event_id"] for p in events}) == total == sum(map(len, expected.values())) + len(quiet_events)
    with trio.fail_after(WAIT_S):
        while await sup.registry.outbox_depth():  # noqa: ASYNC110 - the sender deletes after the answer
            await trio.sleep(0.05)
    assert sup.webhooks.outcomes["delivered"] >= total


@pytest.mark.parametrize("behaviour", ["hang", "fail", "redirect"])
async def test_a_receiver_that_hangs_fails_or_redirects_never_delays_a_burst_of_finalizations(
    behaviour: str, receiver: Receiver, start: Start
) -> None:
    receiver.behaviour = behaviour  # type: ignore[assignment]
    sup = await start(webhook_url=receiver.url, webhook_timeout_s=0.5, sweep_interval_s=3600.0)
    results = await sup.enqueue_many([JobRequest("exit", {"code": 0}) for _ in range(20)])
    job_ids = [r.job.job_id for r in results]
    await _all_terminal(sup, job_ids)
    # Every job was finalized while no event at all was delivered: the receiver held up only its own deliveries.
    assert receiver.accepted == []
    assert sup.webhooks.outcomes["delivered"] == 0
    assert await sup.registry.outbox_depth() == 60  # queued, running, succeeded for each: none lost
    families = {f.name: f for f in text_string_to_metric_families((await sup.render_metrics()).decode())}
    assert families["podcast_webhook_outbox_depth"].samples[0].value == 60  # what the outbox alert watches
    if behaviour == "hang":
        assert len(receiver.requests) <= 1  # one attempt, stuck; the next comes only after its bound and a backoff
    if behaviour == "redirect":
        # A redirect to itself (a loop) is never followed: one request per attempt (one may be in flight).
        assert len(receiver.requests) - sup.webhooks.outcomes["failed"] in (0, 1)
    # The receiver comes back: everything arrives, in the order of each job's changes.
    receiver.behaviour = "ok"
    with trio.fail_after(WAIT_S):
        await receiver.wait_for(lambda r: len(r.events()) == 60)
    for job_id in job_ids:
        assert statuses(receiver.events(), job_id) == [
            "job.transition:queued", "job.transition:running", "job.transition:succeeded"
        ]
    assert sup.webhooks.outcomes["failed"] >= 1


def _refused_url() -> str:
    """A URL on 127.0.0.1 where nothing listens: a connection there is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


async def test_a_receiver_that_is_down_never_delays_finalizations_and_the_outbox_keeps_its_bound(
    start: Start,
) -> None:
    sup = await start(webhook_url=_refused_url(), webhook_outbox_max_events=30, sweep_interval_s=3600.0)
    results = await sup.enqueue_many([JobRequest("exit", {"code": 0}) for _ in range(20)])
    await _all_terminal(sup, [r.job.job_id for r in results])
    assert sup.webhooks.outcomes["delivered"] == 0 and sup.webhooks.outcomes["failed"] >= 1
    # 60 events written, the receiver refusing every attempt and the sender backing off: the oldest past the bound
    # are dropped (counted), within a second of their arrival, not at the end of a backoff. The count moves once the
    # sender's prune has returned, a moment after its commit: wait for both, then hold them to each other.
    async def pruned_and_counted() -> bool:
        depth = await sup.registry.outbox_depth()
        return depth <= 30 and sup.webhooks.outcomes["dropped"] >= 60 - depth

    with trio.fail_after(WAIT_S):
        while not await pruned_and_counted():  # noqa: ASYNC110 - the sender prunes on its own clock
            await trio.sleep(0.05)
    assert sup.webhooks.outcomes["dropped"] == 60 - await sup.registry.outbox_depth()


async def test_a_slow_receiver_delays_only_its_deliveries(receiver: Receiver, start: Start) -> None:
    receiver.behaviour = "slow"  # 0.2 s per answer: 30 events take 6 s to deliver
    sup = await start(webhook_url=receiver.url, webhook_timeout_s=2.0, sweep_interval_s=3600.0)
    results = await sup.enqueue_many([JobRequest("exit", {"code": 0}) for _ in range(10)])
    job_ids = [r.job.job_id for r in results]
    await _all_terminal(sup, job_ids)
    assert len(receiver.accepted) < 30  # every job ended while its events were still being delivered
    with trio.fail_after(WAIT_S):
        await receiver.wait_for(lambda r: len(r.events()) == 30)
    for job_id in job_ids:
        assert statuses(receiver.events(), job_id) == [
            "job.transition:queued", "job.transition:running", "job.transition:succeeded"
        ]


async def test_a_receiver_answering_with_a_huge_body_is_not_read_beyond_a_small_cap(
    receiver: Receiver, start: Start
) -> None:
    receiver.behaviour = "huge"  # 200 with a GiB of body: delivered by its status, the body left unread
    sup = await start(webhook_url=receiver.url, webhook_timeout_s=5.0, sweep_interval_s=3600.0)
    job_id = (await sup.enqueue("exit", {"code": 0})).job.job_id
    await _all_terminal(sup, [job_id])
    with trio.fail_after(WAIT_S):
        await receiver.wait_for(lambda r: len(r.events()) == 3)
        while await sup.registry.outbox_depth():  # noqa: ASYNC110 - the sender deletes after the answer
            await trio.sleep(0.05)
    assert statuses(receiver.events(), job_id) == [
        "job.transition:queued", "job.transition:running", "job.transition:succeeded"
    ]
    assert sup.webhooks.outcomes == {"delivered": 3}  # each at its first attempt: no timeout spent reading
    # What the client let through before it closed: its socket buffers, never the GiB.
    print(f"huge answers: body bytes the receiver could send before the sender closed: {receiver.huge_sent}")
    assert len(receiver.huge_sent) == 3 and max(receiver.huge_sent) < HUGE_BODY_BYTES // 16
