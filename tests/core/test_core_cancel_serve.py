"""End to end through a real ``supervisor serve``: a cancel sent at any moment of a job's start -- at once after its
enqueue, or a few milliseconds later, while the drainer promotes and starts the jobs enqueued beside it -- ends the
job ``cancelled``: before its start (it never ran), or stopped after it. Never on evidence that could not exist yet
(``cancelled_unverified_process_left_alone``, while the drainer went on to start the job: a cancel that found a
just-promoted row not yet held), and no program outlives its row's end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from core_helpers import poll, serve_env  # type: ignore[import-not-found]

SLOTS = 4
JOBS = 48
# How long after the enqueue's answer the cancel is sent: a spread that meets every step of a start (the promotion's
# commit, the pause file's second look, the spawn, the identity's write) on a quiet machine and a loaded one.
DELAYS_S = (0.0, 0.0, 0.001, 0.002, 0.004, 0.008, 0.015, 0.03)


def _runs(pid: int, start_time: int) -> bool:
    """Whether the process ``pid`` that started at ``start_time`` (clock ticks since boot) is still there: a pid
    alone could be another process's by now."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19]) == start_time and fields[0] != "Z"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return serve_env(tmp_path, PODCAST_JOB_MAX_CONCURRENT=str(SLOTS))


async def test_a_cancel_at_any_moment_of_a_start_ends_the_job_cancelled_and_leaves_no_process(
    start_server: Callable[[], trio.Process],
) -> None:
    server = await start_server()  # type: ignore[misc]
    url = server.url
    ids: list[str] = []
    async with httpx.AsyncClient(timeout=10) as client:

        async def enqueue_then_cancel(delay_s: float) -> None:
            answer = await client.post(f"{url}/api/jobs", json={"kind": "sleep", "params": {"seconds": 60}})
            assert answer.status_code == 202, answer.text
            job_id = answer.json()["job_id"]
            ids.append(job_id)
            await trio.sleep(delay_s)  # the client's own timing: the moment injected, not a wait for an event
            cancelled = await client.post(f"{url}/api/jobs/{job_id}/cancel")
            assert cancelled.status_code == 200, cancelled.text

        async with trio.open_nursery() as nursery:
            for n in range(JOBS):
                nursery.start_soon(enqueue_then_cancel, DELAYS_S[n % len(DELAYS_S)])

        async def all_ended() -> list[dict[str, Any]] | None:
            rows = [(await client.get(f"{url}/api/jobs/{job_id}")).json() for job_id in ids]
            return rows if all(row["status"] not in ("queued", "running") for row in rows) else None

        rows = await poll(all_ended, timeout_s=60)
    assert len(rows) == JOBS
    ends = Counter((row["status"], row["error_reason"]) for row in rows)
    assert set(ends) <= {("cancelled", "cancelled_before_start"), ("cancelled", "cancelled")}, ends
    for row in rows:
        if row["error_reason"] == "cancelled_before_start":
            assert row["attempts"] == 0 and row["pid"] is None, row  # it never ran
        elif row["pid"] is not None:
            assert not _runs(row["pid"], row["pid_start_time"]), f"the program of a cancelled job still runs: {row}"
    assert server.proc.returncode is None
