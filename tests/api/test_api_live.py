"""The API on a live server (``run_supervisor`` on port 0) over real HTTP with httpx."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import httpx
import trio
from api_support import API_TOKEN, Live, MakeLive, make_config, wait_terminal

from supervisor import run_supervisor
from supervisor.api import HttpLimits
from supervisor.core import LOG_CHUNK_BYTES
from supervisor.domain import KindCatalog

GRACEFUL_TIMEOUT_S = HttpLimits().graceful_timeout_s

TIMEOUT = httpx.Timeout(10.0)
# A graceful stop waits at most GRACEFUL_TIMEOUT_S on idle keep-alive connections; allow scheduling slack on top.
SHUTDOWN_BOUND_S = GRACEFUL_TIMEOUT_S + 1.5


async def test_a_job_heartbeats_itself_through_the_url_it_was_given(make_live: MakeLive) -> None:
    live: Live = await make_live()
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        health = await client.get("/api/health", timeout=TIMEOUT)
        assert health.json()["boot_id"] == live.supervisor.boot_id
        response = await client.post("/api/jobs", json={"kind": "beater", "params": {"units": 5}}, timeout=TIMEOUT)
        assert response.status_code == 202
        job = await wait_terminal(live.supervisor, response.json()["job_id"])
        assert job.status == "succeeded"
        row = (await client.get(f"/api/jobs/{job.job_id}", timeout=TIMEOUT)).json()
        assert (row["completed_units"], row["stage"]) == (5, "beating")
        assert row["last_progress_at"] is not None
        log = await client.get(f"/api/jobs/{job.job_id}/log", timeout=TIMEOUT)
        assert log.text == "heartbeat 204\n"


async def test_the_token_is_required_over_the_wire(make_live: MakeLive) -> None:
    live = await make_live(api_token=API_TOKEN)
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        refused = await client.get("/api/jobs", timeout=TIMEOUT)
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "unauthorized"
        allowed = await client.get("/api/jobs", headers={"Authorization": f"Bearer {API_TOKEN}"}, timeout=TIMEOUT)
        assert allowed.status_code == 200
        assert (await client.get("/api/health", timeout=TIMEOUT)).status_code == 200


async def test_shutdown_with_a_keep_alive_client_completes_within_a_bound(make_live: MakeLive) -> None:
    live = await make_live()
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        first = await client.get("/api/health", timeout=TIMEOUT)
        second = await client.get("/api/queue", timeout=TIMEOUT)
        # The same connection served both: the client holds an idle keep-alive connection open right now.
        assert first.extensions["network_stream"] is second.extensions["network_stream"]

        started = trio.current_time()
        live.shutdown.set()
        with trio.fail_after(SHUTDOWN_BOUND_S):
            await live.stopped.wait()
        assert trio.current_time() - started < SHUTDOWN_BOUND_S

        # Stopped means stopped accepting: a new connection is refused.
        fresh = httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT)
        async with fresh:
            try:
                await fresh.get("/api/health", timeout=TIMEOUT)
            except httpx.ConnectError:
                pass
            else:
                raise AssertionError("the server still accepts connections after shutdown")


async def test_serve_freezes_what_startup_built_out_of_the_collectors_sight(
    nursery: trio.Nursery, tmp_path: Path, kinds_path: Path, kinds: KindCatalog
) -> None:
    # `supervisor serve` passes freeze_heap: a full collection must not scan the startup heap again (it was a
    # 25-45 ms stop of the event loop, the enqueue and promotion tails). Startup's garbage is collected first.
    gc.unfreeze()
    shutdown, stopped = trio.Event(), trio.Event()

    async def serve(*, task_status: Any) -> None:
        try:
            await run_supervisor(
                make_config(tmp_path, kinds_path), kinds, shutdown=shutdown, freeze_heap=True, task_status=task_status
            )
        finally:
            stopped.set()

    try:
        garbage = _Cycle()
        garbage.me = garbage  # unreachable after the del: only a collection frees it
        alive = weakref.ref(garbage)
        del garbage
        await nursery.start(serve)
        assert gc.get_freeze_count() > 0
        assert alive() is None  # collected before the freeze, not kept forever
    finally:
        shutdown.set()
        with trio.fail_after(SHUTDOWN_BOUND_S):
            await stopped.wait()
        gc.unfreeze()  # the rest of the test session collects as usual


class _Cycle:
    me: object = None


async def test_a_large_log_is_streamed_a_chunk_at_a_time_whole_tail_and_offset(make_live: MakeLive) -> None:
    """INV-LOG-READ-BOUNDED: a log read holds one chunk in memory, not the log (up to PODCAST_JOB_LOG_MAX_BYTES, per
    request); over the wire the answer is the file's bytes with their length announced."""
    live = await make_live()
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        response = await client.post("/api/jobs", json={"kind": "echo", "params": {"text": "x" * 4000}})
        job = await wait_terminal(live.supervisor, response.json()["job_id"])
        assert job.log_path is not None
        # A log of several chunks (written here: a job's own output is covered elsewhere).
        content = bytes(range(256)) * (3 * LOG_CHUNK_BYTES // 256) + b"tail"
        await trio.Path(job.log_path).write_bytes(content)
        piece = await live.supervisor.log_slice(job.job_id)
        sizes = [len(chunk) async for chunk in piece.chunks()]
        assert sizes == [LOG_CHUNK_BYTES] * 3 + [4]
        path = f"/api/jobs/{job.job_id}/log"
        whole = await client.get(path)
        assert (whole.content, whole.headers["Content-Length"]) == (content, str(len(content)))
        tail = await client.get(path, params={"tail_bytes": LOG_CHUNK_BYTES + 4})
        assert tail.content == content[-(LOG_CHUNK_BYTES + 4) :]
        rest = await client.get(path, params={"offset": 5})
        assert rest.content == content[5:]
        assert (await client.get(path, params={"offset": len(content) + 9})).content == b""
        # The connection is still good for the next request (the answer was framed exactly).
        assert (await client.get("/api/health")).status_code == 200
