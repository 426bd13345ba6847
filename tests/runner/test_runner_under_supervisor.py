"""The two programs together: a `pipeline` job enqueued over the real HTTP API, run by the real supervisor as a
real `pipeline_runner` (a subprocess, or a container of the local image on the real Docker engine), heartbeating back
over real HTTP with its token, then chaining the `enrichment` kind."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import trio
from runner_helpers import HttpServer, drip, hang_after_headers, respond, rss

from pipeline_runner import episode_key
from supervisor import Config, KindCatalog, load_kinds, run_supervisor
from supervisor.execution.docker import make_client
from supervisor.execution.subprocess import identify

pytestmark = pytest.mark.e2e


async def _poll_job(client: httpx.AsyncClient, url: str, *, timeout_s: float = 30) -> dict[str, Any]:
    """Poll a job until it is terminal: it is a real process in another program, there is no event to wait on."""
    with trio.fail_after(timeout_s):
        while (row := (await client.get(url)).json())["status"] in ("queued", "running"):  # noqa: ASYNC110
            await trio.sleep(0.05)
        return row  # type: ignore[no-any-return]


@pytest.mark.parametrize("exec_mode", ["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
async def test_pipeline_job_runs_under_the_supervisor_reports_progress_and_chains_enrichment(
    http_server: HttpServer, tmp_path: Path, exec_mode: Literal["subprocess", "docker"]
) -> None:
    s = http_server
    s.routes["/feed"] = respond(200, rss([(f"g{i}", s.url(f"/a{i}"), "1:00") for i in range(3)]))
    for i in range(3):
        s.routes[f"/a{i}"] = respond(200, b"A" * 2000)
    data = tmp_path / "data"
    # In docker mode the job container shares the host's network: the supervisor (bound to 127.0.0.1) and the feed
    # server are reachable at the addresses they were given. The data dir is bind-mounted at the same path.
    config = Config(data_dir=data, bind_port=0, max_concurrent=1, exec_mode=exec_mode, docker_network="host")
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        sup = await nursery.start(functools.partial(run_supervisor, config, load_kinds(None), shutdown=shutdown))
        base = sup.heartbeat_base_url
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.post(
                f"{base}/api/jobs", json={"kind": "pipeline", "params": {"feed": s.url("/feed"), "max_episodes": 3}}
            )
            assert answer.status_code == 202, answer.text
            job = await _poll_job(client, f"{base}/api/jobs/{answer.json()['job_id']}")
            assert (job["status"], job["error_reason"], job["exit_code"]) == ("succeeded", None, 0)
            # Progress arrived over HTTP with the job's own token: a watermark of completed episodes.
            assert (job["completed_units"], job["total_units"]) == (3, 3)
            assert job["last_progress_at"] is not None and job["last_heartbeat_at"] is not None
            for i in range(3):
                assert (data / "corpus" / "episodes" / episode_key(f"g{i}") / "COMPLETE").exists()
            # then = "enrichment": the follow-up kind is enqueued on success and runs over the corpus.
            with trio.fail_after(10):
                while not (listed := (await client.get(f"{base}/api/jobs?kind=enrichment")).json()["jobs"]):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            enrichment = await _poll_job(client, f"{base}/api/jobs/{listed[0]['job_id']}")
            assert enrichment["status"] == "succeeded", (
                await client.get(f"{base}/api/jobs/{listed[0]['job_id']}/log")
            ).text
        shutdown.set()


async def _running_attempt(client: httpx.AsyncClient, url: str, attempt: int) -> dict[str, Any]:
    """The row once its ``attempt``-th start is recorded (its identity reaches the row just after the start)."""
    while not ((row := (await client.get(url)).json())["status"] == "running" and row["attempts"] == attempt):  # noqa: ASYNC110
        await trio.sleep(0.05)
    return row  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def _pipeline_job(data: Path, exec_mode: str, feed: str) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A supervisor with the built-in kinds as shipped (their argv, max_attempts, exit codes, poison threshold) but a
    backoff of 0.2-0.4 s (not 60 s + 120 s), one slot, and one ``pipeline`` job of ``feed`` enqueued over HTTP: the
    client and the job's URL. Shut down on leaving."""
    builtin = load_kinds(None)
    fast = dataclasses.replace(builtin.get("pipeline"), retry_backoff_s=0.2, retry_backoff_max_s=0.4)
    kinds = KindCatalog({"pipeline": fast, "enrichment": builtin.get("enrichment")})
    config = Config(data_dir=data, bind_port=0, max_concurrent=1, exec_mode=exec_mode, docker_network="host")
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        sup = await nursery.start(functools.partial(run_supervisor, config, kinds, shutdown=shutdown))
        base = sup.heartbeat_base_url
        async with httpx.AsyncClient(timeout=10) as client:
            answer = await client.post(f"{base}/api/jobs", json={"kind": "pipeline", "params": {"feed": feed}})
            assert answer.status_code == 202, answer.text
            yield client, f"{base}/api/jobs/{answer.json()['job_id']}"
        shutdown.set()


def _from_outside(exec_mode: str, row: dict[str, Any], *, polite: bool) -> None:
    """What happens to the running attempt from outside (blocking). ``polite``: what a host shutdown, ``kill`` or
    ``docker stop`` does (SIGTERM; docker: SIGKILL only after 10 s); else what the OOM killer or an operator's
    ``kill -9`` does (SIGKILL, to the whole process group)."""
    if exec_mode == "docker":
        client = make_client()
        try:
            if polite:
                client.stop(row["container_id"], timeout=10)  # SIGTERM through docker-init
            else:
                client.kill(row["container_id"], signal="SIGKILL")
        finally:
            client.close()
        return
    identity = identify(row["pid"])
    assert identity is not None and identity.start_time == row["pid_start_time"]  # still that process
    if polite:
        os.kill(row["pid"], signal.SIGTERM)
    else:
        os.killpg(row["pid"], signal.SIGKILL)


@pytest.mark.parametrize("exec_mode", ["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
async def test_an_episode_that_kills_every_attempt_is_poisoned_by_the_third_and_the_run_finishes(
    http_server: HttpServer, tmp_path: Path, exec_mode: Literal["subprocess", "docker"]
) -> None:
    """ADR-150 D4's hazard, closed end to end (ADR 0009): the built-in pipeline kind, resubmitted after each crash,
    with one episode that kills its runner (SIGKILL from outside, while that episode is being fetched) on every
    attempt. The memo counts it before each try; the third attempt skips it as poisoned and finishes the run."""
    s = http_server
    s.routes["/feed"] = respond(200, rss([("fatal", s.url("/fatal"), None), ("fine", s.url("/fine"), None)]))
    s.routes["/fatal"] = hang_after_headers()  # the episode's fetch never ends: the kill lands during it
    s.routes["/fine"] = respond(200, b"F" * 100)
    data = tmp_path / "data"
    async with _pipeline_job(data, exec_mode, s.url("/feed")) as (client, url):
        for attempt in (1, 2):
            with trio.fail_after(60):
                await s.wait_for_requests("/fatal", attempt)  # this attempt is fetching the fatal episode
                row = await _running_attempt(client, url, attempt)
            await trio.to_thread.run_sync(functools.partial(_from_outside, exec_mode, row, polite=False))
        job = await _poll_job(client, url, timeout_s=90)
    killed = "exit_code_137" if exec_mode == "docker" else "killed_by_SIGKILL"
    assert (job["status"], job["error_reason"], job["attempts"], job["max_attempts"]) == ("succeeded", None, 3, 3)
    assert [(a["attempt"], a["status"], a["reason"]) for a in job["history"]] == [
        (1, "failed", killed),
        (2, "failed", killed),
    ]
    assert len(s.requests_to("/fatal")) == 2  # never fetched a third time
    run = json.loads((data / "corpus" / ".runs" / job["job_id"] / "run.json").read_text())
    assert [p["guid"] for p in run["poisoned"]] == ["fatal"]
    assert (data / "corpus" / "episodes" / episode_key("fine") / "COMPLETE").exists()


@pytest.mark.parametrize("exec_mode", ["subprocess", pytest.param("docker", marks=pytest.mark.docker)])
async def test_a_pipeline_job_terminated_from_outside_mid_download_is_started_again_and_its_half_episode_never_counts(
    http_server: HttpServer, tmp_path: Path, exec_mode: Literal["subprocess", "docker"]
) -> None:
    """A polite kill is a kill. SIGTERM (``kill``; ``docker stop`` in docker mode) while an enclosure is
    half downloaded: the runner stops gracefully with its own code for it, and the built-in kind resubmits the job
    (attempt 2) instead of failing it for good; the half-written episode never reaches the corpus, and the poison-pill
    memo does not count it (the second attempt fetches and keeps it)."""
    s = http_server
    body = bytes(range(256)) * 40
    s.routes["/feed"] = respond(200, rss([("fine", s.url("/fine"), None), ("slow", s.url("/slow"), None)]))
    s.routes["/fine"] = respond(200, b"F" * 100)
    # The first fetch sends half the enclosure, then nothing more (a slow link): the kill lands mid-download.
    s.routes["/slow"] = drip(len(body), 3600, after=body[: len(body) // 2])
    data = tmp_path / "data"
    async with _pipeline_job(data, exec_mode, s.url("/feed")) as (client, url):
        with trio.fail_after(60):
            await s.wait_for_requests("/slow", 1)  # attempt 1 is half way through the enclosure
            row = await _running_attempt(client, url, 1)
        s.routes["/slow"] = respond(200, body)  # the link is fine again for the next start
        await trio.to_thread.run_sync(functools.partial(_from_outside, exec_mode, row, polite=True))
        job = await _poll_job(client, url, timeout_s=90)
    assert (job["status"], job["error_reason"], job["attempts"]) == ("succeeded", None, 2), job
    assert [(a["attempt"], a["status"], a["reason"], a["exit_code"]) for a in job["history"]] == [
        (1, "failed", "terminated", 143)
    ]
    assert len(s.requests_to("/slow")) == 2  # fetched again: the memo did not count the terminated attempt
    audio = data / "corpus" / "episodes" / episode_key("slow") / "audio.bin"
    assert audio.read_bytes() == body  # the whole enclosure, never the half the first attempt had
    run = json.loads((data / "corpus" / ".runs" / job["job_id"] / "run.json").read_text())
    assert run["poisoned"] == []
