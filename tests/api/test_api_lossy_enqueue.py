"""Exactly-once enqueue through a lossy network (ADR 0016), end to end: a real ``supervisor serve`` behind a TCP proxy
that loses a share of the requests and a share of the answers (the connection reset either way), and a client that
sends each request again with its Idempotency-Key until an answer comes back (the CLI's own retry). A thousand jobs,
one request each and in batches: as many rows as acknowledged jobs, and each job ran once (its own log, once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from lossy_client import enqueue_through_loss  # type: ignore[import-not-found]
from tcp_proxy import LossyProxy  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

WAIT_S = 120.0  # a backstop for a broken server, never a timing assertion
TIMEOUT = httpx.Timeout(10.0)
KINDS = '[kinds.say]\nargv = ["/bin/echo", "{text}"]\nparams = { text = "str" }\n'


async def serve(tmp_path: Path) -> AsyncIterator[str]:
    (tmp_path / "kinds.toml").write_text(KINDS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env.update(
        PODCAST_JOB_DATA_DIR=str(tmp_path / "data"),
        PODCAST_JOB_BIND="127.0.0.1:0",
        PODCAST_JOB_KINDS_FILE=str(tmp_path / "kinds.toml"),
        PODCAST_JOB_MAX_CONCURRENT="8",
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "supervisor", "serve"], env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=out
        )
    try:
        with trio.fail_after(WAIT_S):
            while True:
                started = [json.loads(line) for line in log.read_text().splitlines() if '"supervisor_started"' in line]
                if started:
                    break
                assert proc.returncode is None, log.read_text()
                await trio.sleep(0.05)  # polling for the server's start line, under the deadline above
        yield str(started[0]["url"])
    finally:
        proc.terminate()
        with trio.fail_after(WAIT_S):
            await proc.wait()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[str]:
    async for url in serve(tmp_path):
        yield url


async def rows(client: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {"limit": "1000", **({"cursor": cursor} if cursor else {})}
        page = (await client.get(f"{url}/api/jobs", params=query, timeout=TIMEOUT)).json()
        out += page["jobs"]
        cursor = page["next_cursor"]
        if cursor is None:
            return out


async def test_INV_KEY_ONCE_a_thousand_enqueues_through_a_lossy_network_make_a_thousand_jobs_each_run_once(
    server: str, nursery: trio.Nursery
) -> None:
    host, port = server.removeprefix("http://").rsplit(":", 1)
    proxy = LossyProxy(host, int(port), seed=35, lose_request=0.1, lose_answer=0.2)
    await nursery.start(proxy.run)
    acknowledged = await trio.to_thread.run_sync(
        lambda: enqueue_through_loss(
            [f"http://127.0.0.1:{proxy.port}"], kind="say", singles=600, batches=4, batch_size=100
        )
    )
    assert proxy.lost_requests > 20 and proxy.lost_answers > 20, "the network lost too little to prove anything"
    assert acknowledged.retries >= proxy.lost_requests + proxy.lost_answers
    assert len(acknowledged.job_ids) == len(set(acknowledged.job_ids)) == 1000

    async with httpx.AsyncClient(timeout=TIMEOUT) as client:

        async def every_job_ended() -> list[dict[str, Any]] | None:
            found = await rows(client, server)
            return found if all(row["status"] not in ("queued", "running") for row in found) else None

        with trio.fail_after(WAIT_S):
            while (found := await every_job_ended()) is None:  # noqa: ASYNC110 - no event exists across processes
                await trio.sleep(0.2)  # polling for the jobs to end, under the deadline above
        # As many rows as acknowledged jobs: none made twice by a retry, none made without its answer counted.
        assert sorted(row["job_id"] for row in found) == sorted(acknowledged.job_ids)
        assert {row["status"] for row in found} == {"succeeded"} and {row["attempts"] for row in found} == {1}
        for row in found:
            assert row["params"]["text"] == acknowledged.texts[row["job_id"]]
            log = (await client.get(f"{server}/api/jobs/{row['job_id']}/log", timeout=TIMEOUT)).text
            assert log == row["params"]["text"] + "\n"  # its own record, once
    print(f"lost {proxy.lost_requests} requests and {proxy.lost_answers} answers; {acknowledged.retries} retries")


async def test_INV_KEY_ONCE_enqueues_through_a_proxy_that_cuts_requests_in_their_head_leave_the_server_up(
    server: str, nursery: trio.Nursery
) -> None:
    """A lossy proxy that forwarded a request's first segment and closed the connection once the answer
    came stopped the server within a minute (a write racing hypercorn's send_eof). Here a share of the requests is
    cut in its head, and of the answers lost: every key is acknowledged once, and the server stays up."""
    host, port = server.removeprefix("http://").rsplit(":", 1)
    proxy = LossyProxy(host, int(port), seed=52, lose_answer=0.1, lose_head=0.3)
    await nursery.start(proxy.run)
    acknowledged = await trio.to_thread.run_sync(
        lambda: enqueue_through_loss(
            [f"http://127.0.0.1:{proxy.port}"], kind="say", singles=200, batches=1, batch_size=50
        )
    )
    assert proxy.lost_heads > 20 and proxy.lost_answers > 5, "the proxy cut too little to prove anything"
    with trio.fail_after(WAIT_S):
        # The server answers each cut request when its own timeout for it runs out (its 400 or 408, or a close), and
        # the proxy closes that side as the answer comes: the moment the old edge could not take.
        while proxy.heads_held:  # noqa: ASYNC110 - the proxy's count, moved by its own tasks
            await trio.sleep(0.1)
    assert len(acknowledged.job_ids) == len(set(acknowledged.job_ids)) == 250
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        assert (await client.get(f"{server}/api/health", timeout=TIMEOUT)).status_code == 200  # straight, not proxied
        found = await rows(client, server)
    assert sorted(row["job_id"] for row in found) == sorted(acknowledged.job_ids)  # none twice, none unacknowledged

