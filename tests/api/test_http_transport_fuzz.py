"""A transport-level fuzzer against a real ``supervisor serve`` (issue 52): hundreds of connections that cut their
request heads and bodies at random bytes, pipeline requests, hang up at random points and around each of the
edge's timeouts (keep-alive, body, answer), with and without tokens, on every kind of route -- beside a job that
beats every 0.2 s and an operator's well-formed requests.

Invariants: the process stays up; ``/api/health`` answers 200 throughout; the beating job is never judged silent or
stalled; every well-formed request sent beside the fuzz gets its answer, never a 5xx. Seeded: a failure names its
seed, and the same seed sends the same connections (their timing is the machine's).

The server is the real ``serve`` command with its edge's timeouts shortened (``tests/serve_with_limits.py``), so that
a connection that waits for one meets it in about a second.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

pytestmark = pytest.mark.e2e

TOKEN = "transport-fuzz-token-0123456789abcdef"
SEEDS = (52, 1152)
CONNECTIONS = 300
AT_ONCE = 40
KEEP_ALIVE_S, BODY_TIMEOUT_S, RESPONSE_TIMEOUT_S = 1.0, 1.0, 2.0
LIMITS = {
    "keep_alive_timeout_s": KEEP_ALIVE_S,
    "body_timeout_s": BODY_TIMEOUT_S,
    "response_timeout_s": RESPONSE_TIMEOUT_S,
    "write_stall_timeout_s": 1.0,
}
REPO = Path(__file__).resolve().parents[2]
KINDS = """
[kinds.noop]
argv = ["{python}", "-c", "pass"]

[kinds.beater]
argv = ["{python}", "-c", '''
import json, os, threading, urllib.request
units = 0
while True:
    units += 1
    req = urllib.request.Request(os.environ["PODCAST_JOB_HEARTBEAT_URL"], method="POST",
        data=json.dumps({"completed_units": units}).encode(),
        headers={"Authorization": "Bearer " + os.environ["PODCAST_JOB_TOKEN"], "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=5).read()
    except Exception:
        pass
    threading.Event().wait(0.2)
''']
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Route:
    method: str
    path: str
    body: bytes | None = None


def _routes(job_id: str) -> list[Route]:
    enqueue = json.dumps({"kind": "noop", "params": {}}).encode()
    batch = json.dumps({"jobs": [{"kind": "noop", "params": {}}] * 3}).encode()
    return [
        Route("GET", "/api/health"),
        Route("GET", "/api/jobs?limit=50"),
        Route("GET", f"/api/jobs/{job_id}"),
        Route("GET", "/api/queue"),
        Route("GET", "/metrics"),
        Route("GET", "/api/events?follow=false"),
        Route("GET", "/api/events"),
        Route("GET", f"/api/jobs/{job_id}/log?tail_bytes=100"),
        Route("POST", "/api/jobs", enqueue),
        Route("POST", "/api/jobs/batch", batch),
        Route("POST", f"/api/jobs/{job_id}/heartbeat", b'{"completed_units": 1}'),
        Route("POST", "/api/jobs/no-such-job/cancel", b""),
        Route("POST", "/api/queue/resume", b""),
        Route("POST", "/api/jobs/reconcile", b""),
    ]


def _request(route: Route, token: str | None, *, declared_body: int | None = None) -> bytes:
    head = f"{route.method} {route.path} HTTP/1.1\r\nHost: fuzz\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    body = route.body or b""
    if route.method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {declared_body or len(body)}\r\n"
    return (head + "\r\n").encode() + body


async def _one(rng: random.Random, port: int, routes: list[Route], job_token: str, tally: dict[str, int]) -> None:
    """One misbehaving connection: what it sends and when it hangs up are the seed's."""
    route = rng.choice(routes)
    token = rng.choice([None, TOKEN, "wrong-token", job_token if "heartbeat" in route.path else TOKEN])
    whole = _request(route, token)
    pipelined = b"".join(_request(rng.choice(routes), token) for _ in range(rng.randint(2, 5)))
    how = rng.choice(["cut_head", "cut_body", "no_body", "hang_up_before_answer", "read_part", "pipeline", "idle"])
    tally[how] = tally.get(how, 0) + 1
    around = rng.choice([KEEP_ALIVE_S, BODY_TIMEOUT_S, RESPONSE_TIMEOUT_S, 0.0]) + rng.uniform(-0.05, 0.05)
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        tally["connect_refused"] = tally.get("connect_refused", 0) + 1
        return
    async with stream:
        try:
            with trio.move_on_after(5):
                if how == "cut_head":
                    head = whole.split(b"\r\n\r\n")[0]
                    await stream.send_all(head[: rng.randint(1, max(1, len(head) - 1))])
                elif how in ("cut_body", "no_body") and route.method == "POST":
                    declared = len(route.body or b"") + rng.randint(1, 200)
                    data = _request(route, token, declared_body=declared)
                    await stream.send_all(data if how == "cut_body" else data[: data.index(b"\r\n\r\n") + 4])
                elif how == "pipeline":
                    await stream.send_all(pipelined)
                    await stream.receive_some(rng.randint(1, 4096))
                elif how == "idle":
                    await stream.send_all(whole)
                    await stream.receive_some()  # one answer's start, then silence past the keep-alive
                else:
                    await stream.send_all(whole)
                    if how == "read_part":
                        await stream.receive_some(rng.randint(1, 64))
                await trio.sleep(max(0.0, around))  # the hang-up's moment is the scenario, not a wait for an event
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the server closed first: an answer too


async def _well_formed(client: httpx.AsyncClient, job_id: str, answers: list[int]) -> None:
    """An operator beside the fuzz: health, a read and an enqueue, every 0.2 s, each answered, never a 5xx."""
    while True:
        for method, path, body in (
            ("GET", "/api/health", None),
            ("GET", f"/api/jobs/{job_id}", None),
            ("POST", "/api/jobs", {"kind": "noop", "params": {}}),
        ):
            with trio.fail_after(10):
                answer = await client.request(method, path, json=body, timeout=10)
            answers.append(answer.status_code)
            assert answer.status_code < 500, (method, path, answer.status_code, answer.text)
        await trio.sleep(0.2)  # paced, as a person's requests


@pytest.mark.parametrize("seed", SEEDS)
async def test_transport_fuzz_leaves_the_server_up_its_jobs_unflagged_and_its_well_formed_requests_answered(
    tmp_path: Path, seed: int
) -> None:
    port = _free_port()
    (tmp_path / "kinds.toml").write_text(KINDS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env.update(
        PODCAST_JOB_DATA_DIR=str(tmp_path / "data"),
        PODCAST_JOB_BIND=f"127.0.0.1:{port}",
        PODCAST_JOB_KINDS_FILE=str(tmp_path / "kinds.toml"),
        PODCAST_JOB_API_TOKEN=TOKEN,
        PODCAST_JOB_MAX_CONCURRENT="3",
        PODCAST_JOB_PROGRESS_STALE_SECONDS="4",
        PODCAST_JOB_SILENT_SECONDS="4",
        PODCAST_JOB_SWEEP_SECONDS="1",
        TEST_HTTP_LIMITS=json.dumps(LIMITS),
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p),
    )
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(REPO / "tests" / "serve_with_limits.py")],
            env=env, cwd=tmp_path, stdout=log, stderr=log,
        )  # fmt: skip
    headers = {"Authorization": f"Bearer {TOKEN}"}
    tally: dict[str, int] = {}
    answers: list[int] = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=10) as client:
            with trio.fail_after(20):
                while "supervisor_started" not in log_path.read_text():
                    assert process.returncode is None, log_path.read_text()
                    await trio.sleep(0.05)  # polling for the server to come up, under the deadline above
            beater = (await client.post("/api/jobs", json={"kind": "beater", "params": {}}, timeout=10)).json()
            job_id = beater["job_id"]
            with trio.fail_after(20):
                while (await client.get(f"/api/jobs/{job_id}", timeout=10)).json()["completed_units"] < 2:  # noqa: ASYNC110
                    await trio.sleep(0.05)  # a real process: polled until it beats
            routes = _routes(job_id)
            rng = random.Random(seed)
            limiter = trio.CapacityLimiter(AT_ONCE)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_well_formed, client, job_id, answers)

                async def fuzz_one(r: random.Random) -> None:
                    async with limiter:
                        await _one(r, port, routes, "not-the-jobs-token", tally)

                with trio.fail_after(120):
                    async with trio.open_nursery() as fuzz:
                        for i in range(CONNECTIONS):
                            fuzz.start_soon(fuzz_one, random.Random(rng.random() + i))
                assert process.returncode is None, f"seed {seed}: the server exited: {log_path.read_text()[-3000:]}"
                nursery.cancel_scope.cancel()
            health = (await client.get("/api/health", timeout=10)).json()
            assert health["status"] in ("ok", "degraded") and "http" not in health.get("degraded", {}), health
            row: dict[str, Any] = (await client.get(f"/api/jobs/{job_id}", timeout=10)).json()
            assert row["status"] == "running" and not row["stalled"] and not row["silent"], row
            assert answers and all(code < 500 for code in answers)
    finally:
        if process.returncode is None:
            process.terminate()
            with trio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
    lines = [json.loads(t) for t in log_path.read_text().splitlines() if t.startswith("{")]
    flagged = [line for line in lines if line.get("event") in ("job_stalled", "job_silent", "http_server_restarted")]
    assert flagged == [], f"seed {seed}: {flagged}"
    assert len(tally) >= 5, tally  # the seed spread the connections over the ways of misbehaving
