"""A transport-level fuzzer against a real ``supervisor serve`` (ADR 0019): hundreds of connections that cut their
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
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from serve_process import beater_kind, kill_running_jobs  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

TOKEN = "transport-fuzz-token-0123456789abcdef"
SEEDS = (52,)  # the seed that ends the server at 3837a44 (make soak runs the same clients for its whole hour)
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
sys.path.insert(0, str(REPO / "tests" / "longrun"))
import _misbehave  # type: ignore[import-not-found]  # noqa: E402

TIMEOUTS = _misbehave.Timeouts(KEEP_ALIVE_S, BODY_TIMEOUT_S, RESPONSE_TIMEOUT_S)
KINDS = """
[kinds.noop]
argv = ["{python}", "-c", "pass"]

""" + beater_kind("beater", every_s=0.2, timeout_s=5)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
            routes = _misbehave.routes(job_id, {"kind": "noop", "params": {}})
            tokens = [None, TOKEN, "wrong-token", "not-the-jobs-token"]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_well_formed, client, job_id, answers)
                with trio.fail_after(120):
                    await _misbehave.keep_misbehaving(
                        random.Random(seed), port, routes, tokens, TIMEOUTS, tally, at_once=AT_ONCE, count=CONNECTIONS
                    )
                assert process.returncode is None, f"seed {seed}: the server exited: {log_path.read_text()[-3000:]}"
                nursery.cancel_scope.cancel()
            health = (await client.get("/api/health", timeout=10)).json()
            assert health["status"] in ("ok", "degraded") and "http" not in health.get("degraded", {}), health
            row: dict[str, Any] = (await client.get(f"/api/jobs/{job_id}", timeout=10)).json()
            assert row["status"] == "running" and not row["stalled"] and not row["silent"], row
            assert answers and all(code < 500 for code in answers)
    finally:
        await kill_running_jobs(tmp_path / "data")  # the beating job outlives the server by design
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
