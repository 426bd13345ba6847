"""End to end: the real ``python -m pipeline_runner`` subprocess against a real misbehaving HTTP server.

Timeouts are configured small (read 0.3 s, episode budget 1-2 s) so the whole file stays fast; each
subprocess is bounded by ``trio.fail_after`` inside ``run_runner``.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import trio
from conftest import (
    BILLION_LAUGHS,
    MALFORMED_XML,
    HttpServer,
    drip,
    hang_after_headers,
    json_answer,
    no_content,
    respond,
    rss,
    run_runner,
    runner_env,
    spawn_runner,
)

from pipeline_runner import (
    EXIT_BUDGET_EXHAUSTED,
    EXIT_CRASH,
    EXIT_OK,
    EXIT_TIME_BUDGET_EXHAUSTED,
    EXIT_USAGE,
    episode_key,
)

pytestmark = pytest.mark.e2e

FAST = ["--read-timeout-seconds", "0.3", "--connect-timeout-seconds", "1", "--heartbeat-interval-seconds", "0.2"]


def manifest(data_dir: Path, job_id: str = "job-1") -> dict:
    return json.loads((data_dir / "corpus" / ".runs" / job_id / "run.json").read_text())


def complete(data_dir: Path, guid: str) -> bool:
    return (data_dir / "corpus" / "episodes" / episode_key(guid) / "COMPLETE").exists()


async def test_happy_run_writes_corpus_manifest_events_and_heartbeats(http_server: HttpServer, tmp_path: Path) -> None:
    s = http_server
    s.routes["/feed"] = respond(200, rss([(f"g{i}", s.url(f"/a{i}"), "10:00") for i in range(3)]))
    for i in range(3):
        s.routes[f"/a{i}"] = respond(200, b"A" * 5000)
    s.routes["/transcribe"] = json_answer({"text": "hello"})
    s.routes["/hb"] = no_content()
    env = runner_env(tmp_path, PODCAST_JOB_HEARTBEAT_URL=s.url("/hb"), PODCAST_JOB_TOKEN="tok")

    result = await run_runner(
        ["run", "--feed", s.url("/feed"), "--max-episodes", "5", "--transcribe-url", s.url("/transcribe"), *FAST],
        env,
        cwd=tmp_path,
    )

    assert result.returncode == EXIT_OK, result.stderr
    assert [e["event"] for e in result.events][0] == "run_started"
    assert len(result.of("episode_done")) == 3
    assert result.of("run_finished")[0]["reason"] == "completed"
    m = manifest(tmp_path)
    assert m["reason"] == "completed"
    assert m["counts"] == {"done": 3, "skipped": 0, "failed": 0, "poisoned": 0, "cancelled": 0}
    assert m["spend_usd"] == pytest.approx(3 * 10 * 0.0043)
    assert all(complete(tmp_path, f"g{i}") for i in range(3))
    beats = s.requests_to("/hb")
    assert beats and all(b.headers["authorization"] == "Bearer tok" for b in beats)
    marks = [b.json()["completed_units"] for b in beats]
    assert marks == sorted(marks) and marks[-1] == 3
    assert beats[-1].json() == {"completed_units": 3, "total_units": 3, "stage": "finished"}
