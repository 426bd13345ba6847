"""A deadline stop cut off by the supervisor's death, end to end through a real ``supervisor serve``, in both exec modes
(INV-STOP-REASON-BEFORE-SIGNAL; docs/reliability.md § A stop's reason outlives its boot).

A kind with ``deadline_seconds = 3``, ``max_attempts = 3`` and ``retry_on_exit_codes = [143]``, whose program cleans up
for 4 s on SIGTERM and exits 143 (as pipeline_runner does). The supervisor begins the deadline stop, and is then
SIGKILLed, or stopped by a plain SIGTERM, during the job's grace; the job exits 143 while no supervisor runs; the
next boot reads that exit -- a code the kind retries -- and must still end the job failed / deadline_exceeded: one
attempt, one "attempt started" in its log, never resubmitted."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from core_helpers import poll, serve_env  # type: ignore[import-not-found]
from serve_process import kill_running_jobs  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

TIDY = '''
[kinds.tidy]
argv = ["{python}", "-c", """
import signal, sys, time
def clean_up(signum, frame):
    print("cleaning up", flush=True)
    time.sleep(4)
    sys.exit(143)
signal.signal(signal.SIGTERM, clean_up)
print("attempt started", flush=True)
time.sleep(600)
"""]
deadline_seconds = 3
max_attempts = 3
retry_on_exit_codes = [143]
retry_backoff_seconds = 1
'''
TIMEOUT = httpx.Timeout(10.0)
IMAGE = os.environ.get("ENGINE_IMAGE", "podcast-job-supervisor:local")
MODES = ["subprocess", pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    # A grace longer than the clean-up: nothing but the program's own exit ends the job.
    return serve_env(tmp_path, TIDY, PODCAST_JOB_CANCEL_GRACE_SECONDS="30")


@pytest.fixture
def containers() -> Iterator[list[str]]:
    """The job ids whose containers a docker-mode test removes at its end, whatever became of its servers."""
    ids: list[str] = []
    yield ids
    if ids:
        from supervisor.execution.docker import LABEL_JOB, make_client

        client = make_client()
        for job_id in ids:
            for found in client.containers(all=True, filters={"label": f"{LABEL_JOB}={job_id}"}):
                client.remove_container(found["Id"], force=True)


def _runs(pid: int, start_time: int) -> bool:
    """Whether the process ``pid`` that started at ``start_time`` (clock ticks since boot) still runs: a pid alone
    could be another process's by now."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19]) == start_time and fields[0] != "Z"


def _container_exited(container_id: str) -> bool:
    from supervisor.execution.docker import make_client

    return str(make_client().inspect_container(container_id)["State"]["Status"]) == "exited"


def _said(log: Path, event: str) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, log.read_text().splitlines()) if line.get("event") == event]


@pytest.mark.parametrize("exec_mode", MODES)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
async def test_INV_STOP_REASON_BEFORE_SIGNAL_a_deadline_stop_cut_off_by_a_restart_is_never_resubmitted(
    start_server: Callable[[], Awaitable[Any]],
    env: dict[str, str],
    tmp_path: Path,
    containers: list[str],
    exec_mode: str,
    how: str,
) -> None:
    if exec_mode == "docker":
        env.update(PODCAST_PIPELINE_EXEC_MODE="docker", PODCAST_JOB_DOCKER_IMAGE=IMAGE)
    data_dir = Path(env["PODCAST_JOB_DATA_DIR"])
    try:
        server = await start_server()
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            answer = await client.post(f"{server.url}/api/jobs", json={"kind": "tidy", "params": {}})
            assert answer.status_code == 202, answer.text
            job_id = answer.json()["job_id"]
            containers.append(job_id)

            async def stopping() -> list[dict[str, Any]] | None:
                return await trio.to_thread.run_sync(_said, server.log, "deadline_job_terminating") or None

            [said] = await poll(stopping, timeout_s=30)
            assert said["job_id"] == job_id
            row = (await client.get(f"{server.url}/api/jobs/{job_id}")).json()
        assert (row["status"], row["stop_reason"]) == ("running", "deadline"), row  # recorded before the signal

        # The supervisor goes in the job's grace (4 s of clean-up): killed outright, or stopped as an operator does.
        server.proc.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)
        with trio.fail_after(30):
            await server.proc.wait()

        # The job exits 143 while no supervisor runs: the next boot reads only that exit.
        async def gone() -> bool | None:
            if exec_mode == "docker":
                exited = await trio.to_thread.run_sync(_container_exited, row["container_id"])
            else:
                exited = not _runs(row["pid"], row["pid_start_time"])
            return True if exited else None

        await poll(gone, timeout_s=30)

        again = await start_server()
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:

            async def ended() -> dict[str, Any] | None:
                found = (await client.get(f"{again.url}/api/jobs/{job_id}")).json()
                return found if found["status"] not in ("queued", "running") else None

            # A resubmission would run a second attempt first (its backoff is 1 s), and end only after its own
            # deadline stop: the first end this boot records is the one checked.
            final = await poll(ended, timeout_s=60)
        assert (final["status"], final["error_reason"], final["exit_code"]) == ("failed", "deadline_exceeded", 143)
        assert (final["attempts"], final["history"]) == (1, []), final
        logs = sorted((data_dir / ".viewer" / "jobs").glob(f"{job_id}*.log"))
        assert [p.name for p in logs] == [f"{job_id}.log"]  # one attempt's log, no second
        text = logs[0].read_text()
        assert (text.count("attempt started"), text.count("cleaning up")) == (1, 1), text
    finally:
        if exec_mode == "subprocess":
            await kill_running_jobs(data_dir)
