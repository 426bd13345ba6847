"""The event stream's log (``observe.EventLog``) on its own: ids, the replay ring and its gaps, filters, the bound of
each reader's queue, shutdown. Driven by hand-made events; no server, no clock but a fixed one."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import trio

from supervisor.domain import Job, JobStatus, TooManyStreams, ValidationError
from supervisor.observe import EventLog, EventName, JobEvent, StreamEnded

BOOT = "ab12"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def job(job_id: str, status: JobStatus = JobStatus.QUEUED) -> Job:
    return Job(
        job_id=job_id,
        seq=1,
        kind="echo",
        params={},
        argv=["true"],
        status=status,
        error_reason=None,
        exit_code=None,
        created_at=NOW,
        started_at=None,
        ended_at=None,
        attempts=0,
        cancel_requested=False,
        boot_id=BOOT,
        identity=None,
        token_hash=None,
        completed_units=0,
        total_units=None,
        stage=None,
        last_heartbeat_at=None,
        last_progress_at=None,
        log_path=None,
        queue_position=3,
    )


def event(job_id: str, name: EventName = EventName.TRANSITION) -> JobEvent:
    return JobEvent(name, job(job_id), None, "enqueued", BOOT)


def make(replay: int = 5, buffer: int = 3, clients: int = 4) -> EventLog:
    return EventLog(BOOT, lambda: NOW, replay_events=replay, client_buffer_events=buffer, max_clients=clients)


async def drain(sub: object, n: int) -> list[str]:
    out = []
    for _ in range(n):
        item = await sub.next(1.0)  # type: ignore[attr-defined]
        assert item is not None
        out.append(item.id)
    return out


async def test_ids_name_the_boot_and_count_and_the_payload_is_the_webhook_s() -> None:
    log = make()
    sub = log.subscribe()
    log.on_event(event("j1"))
    [item] = [await sub.next(1.0)]
    assert item is not None and item.id == f"{BOOT}-1" and log.last_event_id == f"{BOOT}-1"
    assert b'"event_id":"ab12-1"' in item.data
    assert b'"queue_position":null' in item.data  # as the outbox holds the row: no position


async def test_resume_replays_exactly_what_came_after_within_the_ring() -> None:
    log = make(replay=5)
    for n in range(4):
        log.on_event(event(f"j{n}"))
    sub = log.subscribe(last_event_id=f"{BOOT}-2")
    assert sub.gap is None
    log.on_event(event("j4"))  # live, after the replay
    assert await drain(sub, 3) == [f"{BOOT}-3", f"{BOOT}-4", f"{BOOT}-5"]
    # Up to date: nothing replayed, no gap.
    assert log.subscribe(last_event_id=f"{BOOT}-5").replay == type(sub.replay)()


async def test_a_resume_behind_the_ring_or_from_another_boot_is_a_gap() -> None:
    log = make(replay=3)
    for n in range(6):
        log.on_event(event(f"j{n}"))
    behind = log.subscribe(last_event_id=f"{BOOT}-2")
    assert behind.gap is not None and behind.gap.why == "evicted" and behind.gap.oldest_event_id == f"{BOOT}-4"
    assert [i.id for i in behind.replay] == [f"{BOOT}-4", f"{BOOT}-5", f"{BOOT}-6"]
    # Just before the oldest held: nothing is missing.
    assert log.subscribe(last_event_id=f"{BOOT}-3").gap is None
    other = log.subscribe(last_event_id="ffff-9")
    assert other.gap is not None and other.gap.why == "restarted" and len(other.replay) == 3


@pytest.mark.parametrize(("last", "field"), [("nonsense", "Last-Event-ID"), (f"{BOOT}-7", "Last-Event-ID")])
async def test_an_id_that_is_not_one_or_is_from_the_future_is_refused(last: str, field: str) -> None:
    log = make()
    log.on_event(event("j0"))
    with pytest.raises(ValidationError) as caught:
        log.subscribe(last_event_id=last)
    assert caught.value.field == field


async def test_filters_by_job_and_kind() -> None:
    log = make()
    sub = log.subscribe(jobs=["j1"], kinds=["job.stalled"])
    log.on_event(event("j1"))
    log.on_event(event("j2", EventName.STALLED))
    log.on_event(event("j1", EventName.STALLED))
    assert await drain(sub, 1) == [f"{BOOT}-3"]
    with pytest.raises(ValidationError) as caught:
        log.subscribe(kinds=["job.finished"])
    assert caught.value.field == "kind"


async def test_a_reader_whose_queue_fills_is_dropped_its_queue_freed_and_its_request_cut() -> None:
    log = make(buffer=3)
    slow, fast = log.subscribe(), log.subscribe()
    cut: list[bool] = []
    slow.on_drop = lambda: cut.append(True)
    for n in range(3):
        log.on_event(event(f"j{n}"))
    assert log.buffered() == 6 and cut == []
    assert await drain(fast, 3) == [f"{BOOT}-{n}" for n in (1, 2, 3)]
    log.on_event(event("j3"))  # the slow one's fourth: over its bound
    assert cut == [True] and log.dropped == 1 and log.clients == 1
    assert slow.buffered() == 0  # freed at once
    with pytest.raises(StreamEnded):
        await slow.next(1.0)
    assert await drain(fast, 1) == [f"{BOOT}-4"]  # the other reader is untouched


async def test_readers_are_bounded_and_a_closed_one_frees_its_slot() -> None:
    log = make(clients=1)
    sub = log.subscribe()
    with pytest.raises(TooManyStreams):
        log.subscribe()
    sub.close()
    log.subscribe()


async def test_shutdown_ends_every_stream_after_what_it_queued() -> None:
    log = make()
    sub = log.subscribe()
    log.on_event(event("j0"))
    log.close()
    assert await drain(sub, 1) == [f"{BOOT}-1"]
    with pytest.raises(StreamEnded):
        await sub.next(1.0)
    # After shutdown a new reader gets what is held, then the end.
    late = log.subscribe(backlog=True)
    assert await drain(late, 1) == [f"{BOOT}-1"]
    with pytest.raises(StreamEnded):
        await late.next(1.0)


async def test_an_idle_stream_returns_none_for_a_keep_alive(autojump_clock: trio.testing.MockClock) -> None:
    log = make()
    sub = log.subscribe()
    started = trio.current_time()
    assert await sub.next(15.0) is None
    assert trio.current_time() - started == 15.0


async def test_an_embedder_s_own_boot_id_resumes_too() -> None:
    log = EventLog("boot-a", lambda: NOW, replay_events=5, client_buffer_events=3, max_clients=2)
    for n in range(3):
        log.on_event(event(f"j{n}"))
    sub = log.subscribe(last_event_id="boot-a-2")
    assert sub.gap is None and [i.id for i in sub.replay] == ["boot-a-3"]
