"""The second alert channel end to end (ADR-150 D9; docs/alerting.md): a real ``supervisor serve`` scraped every second
by VictoriaMetrics, the shipped rules (durations scaled down: ``alert_stack.SCALED``) evaluated by vmalert,
Alertmanager routing page and warn to a receiver of the test's own. One supervisor, one run, its scenarios in turn:

- a job that beats without progress pages ``PodcastJobStalled``; its neighbour, which progresses, never does, nor
  does the busy queue behind them (every slot running, a job waiting);
- another process holds the registry's lock for longer than the stall threshold: one page, the registry's, naming
  it -- no stalled page for the job that progresses (its beats are taken and held), no supervisor down (``/metrics``
  answers within its budget), no queue page for the lease the lock starves;
- the queue paused with a job waiting: ``PodcastQueuePausedLong``, a warning;
- the supervisor SIGKILLed: ``PodcastSupervisorDown`` while nothing of its API answers.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from alert_stack import Alert, Stack, alert_stack, free_port  # type: ignore[import-not-found]
from core_helpers import poll, serve_env  # type: ignore[import-not-found]
from serve_process import kill_running_jobs, serve_process  # type: ignore[import-not-found]

pytestmark = [pytest.mark.e2e, pytest.mark.alerting]

STALL_S = 8.0  # alert_stack.SCALED's PodcastJobStalled threshold
LOCK_S = 14.0  # the registry's lock: longer than the stall threshold, and than the registry's page takes
WAIT_S = 60.0  # the bound of any one wait below

# Jobs that beat every half second over real HTTP: one whose watermark rises at every beat, one whose never moves.
KINDS = "\n".join(
    f'''
[kinds.{name}]
argv = ["{{python}}", "-c", """
import json, os, threading, urllib.request
units = 0
while True:
    units += {step}
    req = urllib.request.Request(os.environ["PODCAST_JOB_HEARTBEAT_URL"], method="POST",
        data=json.dumps({{"completed_units": max(units, 1)}}).encode(),
        headers={{"Authorization": "Bearer " + os.environ["PODCAST_JOB_TOKEN"], "Content-Type": "application/json"}})
    try:
        urllib.request.urlopen(req, timeout=5).read()
    except Exception:
        pass
    threading.Event().wait(0.5)
"""]
'''
    for name, step in (("rising", 1), ("flat", 0))
)

# Another process holds the registry's write lock until its stdin closes.
LOCKER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
"""


def firing(stack: Stack) -> set[tuple[str, str, str]]:
    """Each alert ever sent firing: route, name, and its job id or reason."""
    return {
        (route, name, dict(labels).get("job_id") or dict(labels).get("reason") or "")
        for route, name, labels in stack.receiver.paged()
    }


async def until_alert(stack: Stack, route: str, name: str, status: str = "firing") -> Alert:
    async def check() -> Alert | None:
        found = [a for a in stack.receiver.received() if (a.route, a.name, a.status) == (route, name, status)]
        return found[0] if found else None

    try:
        return await poll(check, timeout_s=WAIT_S)
    except trio.TooSlowError:
        raise AssertionError(
            f"no {status} {name} at {route} within {WAIT_S} s; received {stack.receiver.received()}; "
            f"vmalert has {await stack.active()}"
        ) from None


async def scalar(stack: Stack, expr: str) -> float:
    [sample] = await stack.query(expr)
    return float(sample["value"][1])


async def test_the_shipped_rules_page_for_each_fault_once_and_never_for_a_progressing_job(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    env = serve_env(
        tmp_path,
        KINDS,
        PODCAST_JOB_BIND=f"127.0.0.1:{port}",
        PODCAST_JOB_MAX_CONCURRENT="2",
        PODCAST_JOB_PROGRESS_STALE_SECONDS=str(STALL_S),
        PODCAST_JOB_QUEUE_STUCK_SECONDS="2",
        PODCAST_JOB_PAUSE_WARN_SECONDS="2",
        PODCAST_JOB_HOST_LEASE_SECONDS="3",
        PODCAST_JOB_REGISTRY_BUSY_TIMEOUT_MS="1000",
    )
    api = f"http://127.0.0.1:{port}"
    async with (
        alert_stack(tmp_path, f"127.0.0.1:{port}") as (stack, start_vmalert),
        serve_process(env, tmp_path, tmp_path / "supervisor.log") as server,
    ):
        try:
            await _scenarios(stack, start_vmalert, server, api, data)
        finally:
            await kill_running_jobs(data)


async def _scenarios(stack: Stack, start_vmalert: Any, server: trio.Process, api: str, data: Path) -> None:
    client = stack.client

    async def job(kind: str) -> str:
        answer = await client.post(f"{api}/api/jobs", json={"kind": kind, "params": {}})
        assert answer.status_code == 202, answer.text
        return str(answer.json()["job_id"])

    async def started() -> bool | None:
        try:
            return True if (await client.get(f"{api}/api/health")).status_code == 200 else None
        except httpx.TransportError:
            return None

    await poll(started, timeout_s=WAIT_S)
    flat, rising = await job("flat"), await job("rising")
    waiting = await job("flat")  # behind them: every slot runs, a job waits -- a busy queue

    async def visible() -> bool | None:
        """Both jobs' series in VictoriaMetrics: vmalert starts on data (docs/alerting.md, "The query delay")."""
        result = await stack.query('podcast_job_running{job="podcast-supervisor"}')
        return True if {r["metric"]["job_id"] for r in result} == {flat, rising} else None

    await poll(visible, timeout_s=WAIT_S)
    await start_vmalert()

    # 1. The job that beats without progress pages, once; nothing else does.
    await until_alert(stack, "/page", "PodcastJobStalled")
    assert firing(stack) == {("/page", "PodcastJobStalled", flat)}
    assert (await client.get(f"{api}/api/jobs/{waiting}")).json()["status"] == "queued"

    # 2. Another process holds the registry's lock for longer than the stall threshold.
    locker = await trio.lowlevel.open_process(
        [sys.executable, "-c", LOCKER, str(data / ".viewer" / "jobs.sqlite3")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert locker.stdout is not None and locker.stdin is not None
        with trio.fail_after(WAIT_S):
            assert (await locker.stdout.receive_some(100)).startswith(b"locked")
        locked_at = time.monotonic()
        refused = await client.post(f"{api}/api/jobs", json={"kind": "flat", "params": {}})
        assert refused.status_code == 503, refused.text  # the registry takes no write
        await trio.sleep(max(0.0, LOCK_S - (time.monotonic() - locked_at)))  # the lock's length: the scenario's
        lock_s = time.monotonic() - locked_at
        # While locked: the progressing job's progress kept moving, every scrape answered within its second.
        window = f"{int(lock_s)}s"
        progress = f'podcast_job_last_progress_timestamp_seconds{{job_id="{rising}"}}'
        scraped = await scalar(stack, f"count_over_time({progress}[{window}])")
        assert scraped >= lock_s - 3, f"{scraped} scrapes of the progressing job in {lock_s:.1f} s"
        oldest = await scalar(
            stack,
            f"max_over_time((time() - {progress})[{window}:1s])",
        )
        assert oldest < STALL_S, f"the progressing job's progress was {oldest} s old while the registry was locked"
        slowest = await scalar(stack, f'max_over_time(scrape_duration_seconds{{job="podcast-supervisor"}}[{window}])')
        # (One scrape in ten may miss its second on a loaded machine: the page needs five in a row.)
        answered = await scalar(stack, f'avg_over_time(up{{job="podcast-supervisor"}}[{window}])')
        assert answered >= 0.9, f"{answered:.0%} of the scrapes answered; the slowest took {slowest} s"
        # What once paged twice happened: the supervisor said its queue stuck for the registry, and the lock starved
        # the lease (the queue's alerts stayed quiet for both). The one page is the registry's.
        stuck = f'max_over_time(podcast_queue_stuck{{reason="registry_unwritable"}}[{window}])'
        starved = f'max_over_time(podcast_queue_held{{reason="lease_not_fresh"}}[{window}])'
        assert (await scalar(stack, stuck), await scalar(stack, starved)) == (1, 1)
        await until_alert(stack, "/page", "PodcastRegistryUnwritable")
    finally:
        if locker.stdin is not None:
            await locker.stdin.aclose()
        with trio.fail_after(WAIT_S):
            await locker.wait()
    released_at = time.monotonic()

    # The registry writes again: its page resolves, and the lease is renewed (the echo's end).
    async def renewed() -> bool | None:
        held = await stack.query('podcast_queue_held{reason="lease_not_fresh"} == 0')
        return True if held else None

    await poll(renewed, timeout_s=WAIT_S)
    echo_s = time.monotonic() - released_at
    await until_alert(stack, "/page", "PodcastRegistryUnwritable", status="resolved")
    assert firing(stack) == {("/page", "PodcastJobStalled", flat), ("/page", "PodcastRegistryUnwritable", "")}

    # 3. The queue held: paused with a job waiting, past PODCAST_JOB_PAUSE_WARN_SECONDS: a warning.
    assert (await client.post(f"{api}/api/queue/pause")).status_code == 200
    await until_alert(stack, "/warn", "PodcastQueuePausedLong")

    # 4. The supervisor SIGKILLed: down, while nothing of its API answers.
    server.send_signal(signal.SIGKILL)
    await server.wait()
    killed_at = time.monotonic()
    down = await until_alert(stack, "/page", "PodcastSupervisorDown")
    with pytest.raises(httpx.ConnectError):
        await client.get(f"{api}/api/health")
    assert firing(stack) == {
        ("/page", "PodcastJobStalled", flat),
        ("/page", "PodcastRegistryUnwritable", ""),
        ("/warn", "PodcastQueuePausedLong", "pause_operator"),
        ("/page", "PodcastSupervisorDown", ""),
    }
    print(
        f"lock {lock_s:.1f} s: {answered:.0%} of scrapes answered, the slowest in {slowest:.3f} s, the progressing "
        f"job's progress at most {oldest:.1f} s "
        f"old; the lease renewed {echo_s:.1f} s after the lock; down paged {down.at - killed_at:.1f} s after the kill"
    )
