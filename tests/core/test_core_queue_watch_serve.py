"""The queue's watch end to end: a real ``supervisor serve`` with a webhook receiver on loopback, short
thresholds (1 s; sweeps every second). A pause file left behind and a pause made through the API each show on
``/metrics`` within a sweep, send one ``queue.stuck`` past the threshold, nothing more while they hold -- across a
``kill -9`` and a restart too -- and one ``queue.moving`` when they clear."""

from __future__ import annotations

import http.server
import json
import shutil
import signal
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from core_engine import FakeEngine  # type: ignore[import-not-found]
from core_helpers import poll, serve_env  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

TIMEOUT = httpx.Timeout(10.0)


class Receiver(http.server.ThreadingHTTPServer):
    """Every webhook body, in the order received."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    def queue_events(self) -> list[tuple[str, str]]:
        """The queue's events, each once: delivery is at least once (a supervisor killed between a receiver's 2xx and
        the outbox row's removal sends that event again, with its event id), and a receiver keeps one per id."""
        seen: dict[str, tuple[str, str]] = {}
        for b in list(self.bodies):
            if b["event"].startswith("queue."):
                seen.setdefault(b["event_id"], (b["event"], b["queue"]["reason"]))
        return list(seen.values())


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.bodies.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def env(tmp_path: Path, receiver: Receiver) -> dict[str, str]:
    return serve_env(
        tmp_path,
        PODCAST_JOB_WEBHOOK_URL=f"http://127.0.0.1:{receiver.server_address[1]}/hook",
        PODCAST_JOB_QUEUE_STUCK_SECONDS="1",
        PODCAST_JOB_PAUSE_WARN_SECONDS="1",
        PODCAST_JOB_HOST_LEASE_SECONDS="3",
    )


async def metric(url: str, line: str) -> bool | None:
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        text = (await client.get(f"{url}/metrics", timeout=TIMEOUT)).text
    return True if line in text.splitlines() else None


async def events_are(receiver: Receiver, expected: list[tuple[str, str]]) -> bool | None:
    return True if receiver.queue_events() == expected else None


async def test_a_pause_file_left_behind_is_said_once_across_a_kill_and_a_restart_and_its_removal_once(
    start_server: Callable[[], Awaitable[Any]], receiver: Receiver, tmp_path: Path
) -> None:
    flag = tmp_path / "data" / ".viewer" / "jobs.paused"
    server = await start_server()
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        await trio.Path(flag).touch()  # a corpus repair that never removed it
        answer = await client.post(f"{server.url}/api/jobs", json={"kind": "exit", "params": {"code": 0}})
        assert answer.status_code == 202, answer.text
    await poll(lambda: metric(server.url, 'podcast_queue_held{reason="pause_file"} 1.0'))
    await poll(lambda: events_are(receiver, [("queue.stuck", "pause_file")]))
    [stuck] = [b for b in receiver.bodies if b["event"] == "queue.stuck"]
    assert stuck["queue"]["oldest_job_id"] == answer.json()["job_id"] and stuck["queue"]["free_slots"] >= 1
    server.proc.send_signal(signal.SIGKILL)
    await server.proc.wait()
    again = await start_server()
    # The new boot finds the queue still stuck (its metric), and says nothing new about it.
    await poll(lambda: metric(again.url, 'podcast_queue_stuck{reason="pause_file"} 1.0'))
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        for _ in range(3):  # three more sweeps' worth of health answers: still one announcement
            health = (await client.get(f"{again.url}/api/health", timeout=TIMEOUT)).json()
            assert health["degraded"]["queue"].endswith("pause_file")
            await trio.sleep(1)  # a sweep's length: what is checked is that nothing more is sent meanwhile
    assert receiver.queue_events() == [("queue.stuck", "pause_file")]
    await trio.Path(flag).unlink()
    await poll(lambda: events_are(receiver, [("queue.stuck", "pause_file"), ("queue.moving", "pause_file")]))


async def test_an_api_pause_is_said_stuck_once_and_moving_once_and_a_busy_queue_never(
    start_server: Callable[[], Awaitable[Any]], receiver: Receiver, env: dict[str, str]
) -> None:
    env["PODCAST_JOB_MAX_CONCURRENT"] = "1"
    server = await start_server()
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        # Busy first: one slot held by a long job, another job waiting, for several thresholds: nothing.
        for seconds in (4, 4):
            answer = await client.post(f"{server.url}/api/jobs", json={"kind": "sleep", "params": {"seconds": seconds}})
            assert answer.status_code == 202, answer.text
        await trio.sleep(3)  # three thresholds of a busy queue: what is checked is that nothing is sent
        assert receiver.queue_events() == []
        await client.post(f"{server.url}/api/queue/pause", timeout=TIMEOUT)
        await poll(lambda: events_are(receiver, [("queue.stuck", "pause_operator")]), timeout_s=30)
        state = (await client.get(f"{server.url}/api/queue", timeout=TIMEOUT)).json()
        assert state["stuck"]["reason"] == "pause_operator" and "pause_operator" in state["held"]
        await client.post(f"{server.url}/api/queue/resume", timeout=TIMEOUT)
    await poll(lambda: events_are(receiver, [("queue.stuck", "pause_operator"), ("queue.moving", "pause_operator")]))


@pytest.mark.docker
async def test_an_engine_that_does_not_answer_is_said_stuck_once_and_moving_once_when_it_answers(
    start_server: Callable[[], Awaitable[Any]], receiver: Receiver, env: dict[str, str], nursery: trio.Nursery
) -> None:
    """Docker mode, the engine stopped (its socket refuses) behind a fake in front of the real one: the queue is
    held by the engine with a slot free and a job waiting; the engine comes back and the job runs."""
    where = Path(tempfile.mkdtemp(prefix="fake-engine-", dir="/tmp"))  # a unix socket's path is short
    engine = FakeEngine(where / "docker.sock")
    await nursery.start(engine.run)
    await engine.set_mode("stopped")
    env.update(PODCAST_PIPELINE_EXEC_MODE="docker", DOCKER_HOST=engine.url, PODCAST_JOB_DOCKER_TIMEOUT_SECONDS="1")
    server = await start_server()
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        answer = await client.post(f"{server.url}/api/jobs", json={"kind": "exit", "params": {"code": 0}})
        assert answer.status_code == 202, answer.text
        await poll(lambda: metric(server.url, 'podcast_queue_held{reason="engine_unreachable"} 1.0'), timeout_s=30)
        await poll(lambda: events_are(receiver, [("queue.stuck", "engine_unreachable")]), timeout_s=30)
        await engine.set_mode("proxy")
        expected = [("queue.stuck", "engine_unreachable"), ("queue.moving", "engine_unreachable")]
        await poll(lambda: events_are(receiver, expected), timeout_s=60)

        async def succeeded() -> bool | None:
            row = (await client.get(f"{server.url}/api/jobs/{answer.json()['job_id']}", timeout=TIMEOUT)).json()
            return True if row["status"] == "succeeded" else None

        await poll(succeeded, timeout_s=60)
    shutil.rmtree(where, ignore_errors=True)
