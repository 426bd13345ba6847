"""The two programs together: a `pipeline` job enqueued over the real HTTP API, run by the real supervisor as a
real `pipeline_runner` (a subprocess, or a container of the local image on the real Docker engine), heartbeating back
over real HTTP with its token, then chaining the `enrichment` kind."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
import trio
from runner_helpers import HttpServer, respond, rss

from pipeline_runner import episode_key
from supervisor import Config, load_kinds, run_supervisor

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
