"""Clients that do not read (ADR 0019), against a real ``supervisor serve``: 300 of them, each asking for a 1.8 MB page
of jobs and never reading it, beside a job that beats and progresses and an operator's ``/api/health``. Before: the
server's RSS went 107 -> 648 MiB until the 60 s answer deadline cut them, /api/health took 12 s, and the job's beats
waited behind the pages' encoding. Now: the pages are built two at a time, the answers not taken hold at most the
unsent-bytes budget (64 MiB) and a stalled write is cut after 10 s.

The RSS and the answer times are the process's own, read from outside; the bounds asserted are generous (a loaded CI
machine), far from the failure: what the figures are is measured by ``make bench`` and ``make soak``.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from serve_process import beater_kind, kill_running_jobs, serve_process, stop  # type: ignore[import-not-found]

pytestmark = pytest.mark.e2e

TOKEN = "slow-readers-test-token-0123456789"
CLIENTS = 300
ROWS = 1000
KINDS = """
[kinds.big]
argv = ["{python}", "-c", "pass", "{text}"]
params = { text = "str" }

""" + beater_kind("beater", every_s=0.2, timeout_s=5)


async def _rss(pid: int) -> int:
    """The process's resident memory, in bytes (Linux's own accounting)."""
    for line in (await trio.Path(f"/proc/{pid}/status").read_text()).splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_300_clients_that_never_read_a_large_page_pin_bounded_memory_and_starve_nobody(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "kinds.toml").write_text(KINDS)
    env: dict[str, Any] = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env.update(
        PODCAST_JOB_DATA_DIR=str(tmp_path / "data"),
        PODCAST_JOB_BIND=f"127.0.0.1:{port}",
        PODCAST_JOB_KINDS_FILE=str(tmp_path / "kinds.toml"),
        PODCAST_JOB_API_TOKEN=TOKEN,
        PODCAST_JOB_MAX_CONCURRENT="1",
        PODCAST_JOB_PROGRESS_STALE_SECONDS="4",
        PODCAST_JOB_SWEEP_SECONDS="1",
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        await _run(env, tmp_path, url, port, headers)
    finally:
        await kill_running_jobs(tmp_path / "data")  # the beating job outlives the server by design


async def _run(env: dict[str, Any], tmp_path: Path, url: str, port: int, headers: dict[str, str]) -> None:
    async with (
        serve_process(env, tmp_path, tmp_path / "serve.log") as process,
        httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as client,
    ):
        with trio.fail_after(20):
            while True:
                try:
                    if (await client.get("/api/health", timeout=10)).status_code == 200:
                        break
                except httpx.ConnectError:
                    pass
                await trio.sleep(0.05)  # polling for the server to come up, under the deadline above
        beater = (await client.post("/api/jobs", json={"kind": "beater", "params": {}}, timeout=10)).json()["job_id"]
        with trio.fail_after(20):
            while (await client.get(f"/api/jobs/{beater}", timeout=10)).json()["completed_units"] < 2:  # noqa: ASYNC110
                await trio.sleep(0.05)  # a real process in another program: polled until it beats
        await client.post("/api/queue/pause", timeout=10)  # the big rows stay queued: they are only read
        text = "x" * 1500  # each row about 1.8 KB as the list shows it: a page of 1,000 is about 1.8 MB
        for start in range(0, ROWS, 500):
            batch = [{"kind": "big", "params": {"text": f"{text}{i}"}} for i in range(start, start + 500)]
            assert (await client.post("/api/jobs/batch", json={"jobs": batch}, timeout=30)).status_code == 202
        page = await client.get("/api/jobs", params={"limit": ROWS}, timeout=30)
        assert len(page.content) > 1_700_000
        rss_before = await _rss(process.pid)

        sockets: list[trio.SocketStream] = []
        request = f"GET /api/jobs?limit={ROWS} HTTP/1.1\r\nHost: s\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
        worst_health_s = 0.0
        peak_rss = rss_before
        try:
            for _ in range(CLIENTS):  # each asks for the page and never reads a byte of it
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(request)
                sockets.append(stream)
            with trio.move_on_after(8):  # the pages' builds, and the cuts past the budget, happen in this window
                while True:
                    began = trio.current_time()
                    with trio.fail_after(10):
                        assert (await client.get("/api/health", timeout=10)).status_code == 200
                    worst_health_s = max(worst_health_s, trio.current_time() - began)
                    peak_rss = max(peak_rss, await _rss(process.pid))
                    row = (await client.get(f"/api/jobs/{beater}", timeout=10)).json()
                    assert row["status"] == "running" and not row["stalled"] and not row["silent"], row
                    await trio.sleep(0.25)  # sampling a real process from outside
        finally:
            for stream in sockets:
                await stream.aclose()
        growth_mib = (peak_rss - rss_before) / 2**20
        # Before: +540 MiB, health 12 s. The budget is 64 MiB of unsent answers, two pages in the making.
        assert growth_mib < 200, f"RSS grew {growth_mib:.0f} MiB"
        assert worst_health_s < 3, f"/api/health took {worst_health_s:.2f} s"
        metrics = (await client.get("/metrics", timeout=10)).text
        cut_lines = [line for line in metrics.splitlines() if line.startswith("podcast_http_answers_cut_total")]
        cut = sum(float(line.split()[-1]) for line in cut_lines)
        assert cut > 0  # the budget and the stall cut are what bounded it
        assert await stop(process, 10) == 0
    lines = [json.loads(t) for t in (tmp_path / "serve.log").read_text().splitlines() if t.startswith("{")]
    assert not [line for line in lines if line.get("event") in ("job_stalled", "job_silent")]
