"""``supervisor wait``, ``supervisor events`` and ``supervisor jobs --watch`` as a person uses them: real processes
against a real ``supervisor serve``, and, for the live views, a real terminal (tmux: the screen is read back with
``capture-pane``).

Every wait is bounded by ``trio.fail_after`` and polls a real process or the screen; nothing sleeps to wait.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from api_support import KINDS, kinds_toml

from supervisor.cli import (
    EXIT_CANCELLED,
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STALE,
    EXIT_SUCCEEDED,
    EXIT_TIMEOUT,
    EXIT_UNREACHABLE,
)

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
START_S = 20.0
RUN_S = 30.0
POLL_S = 0.05
TIMEOUT = httpx.Timeout(10.0)

LIVE_KINDS: dict[str, dict[str, Any]] = {
    **KINDS,
    # Heartbeats n times with a total, one unit per step, `every` seconds apart; then exits 0.
    "steps": {
        "argv": [
            "{python}",
            "-c",
            "import json, os, sys, time, urllib.request\n"
            "n, every = int(sys.argv[1]), float(sys.argv[2])\n"
            "for i in range(n):\n"
            "    body = {'completed_units': i + 1, 'total_units': n, 'stage': f'step {i + 1}'}\n"
            "    req = urllib.request.Request(os.environ['PODCAST_JOB_HEARTBEAT_URL'], method='POST',"
            " data=json.dumps(body).encode(), headers={'Authorization': 'Bearer ' + os.environ['PODCAST_JOB_TOKEN'],"
            " 'Content-Type': 'application/json'})\n"
            "    urllib.request.urlopen(req, timeout=10)\n"
            "    time.sleep(every)\n",
            "{n}",
            "{every}",
        ],
        "params": {"n": "int", "every": "float"},
    },
}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@dataclass
class Server:
    url: str
    env: dict[str, str]
    tmp: Path
    process: trio.Process | None = None

    async def start(self) -> None:
        log = (self.tmp / "serve.log").open("ab")
        self.process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "supervisor", "serve"], env=self.env, cwd=self.tmp, stdout=log, stderr=log
        )
        log.close()
        async with httpx.AsyncClient(timeout=TIMEOUT) as client:
            with trio.fail_after(START_S):
                while True:
                    try:
                        if (await client.get(f"{self.url}/api/health", timeout=TIMEOUT)).status_code == 200:
                            return
                    except httpx.TransportError:
                        pass
                    await trio.sleep(POLL_S)  # polling for the server to come up, under the deadline above

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        with trio.fail_after(START_S):
            await self.process.wait()

    async def post(self, path: str, body: Any = None) -> Any:
        async with httpx.AsyncClient(base_url=self.url, timeout=TIMEOUT) as client:
            response = await client.post(path, json=body, timeout=TIMEOUT)
        assert response.status_code < 300, response.text
        return response.json()

    async def get(self, path: str) -> Any:
        async with httpx.AsyncClient(base_url=self.url, timeout=TIMEOUT) as client:
            response = await client.get(path, timeout=TIMEOUT)
        assert response.status_code == 200, response.text
        return response.json()

    async def enqueue(self, kind: str, **params: Any) -> str:
        answer = await self.post("/api/jobs", {"kind": kind, "params": params})
        return str(answer["job_id"])

    async def until(self, job_id: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        with trio.fail_after(RUN_S):
            while True:
                row = await self.get(f"/api/jobs/{job_id}")
                if check(row):
                    return row
                await trio.sleep(POLL_S)  # polling the real server's row, under the deadline above


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(kinds_toml(LIVE_KINDS))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
        PODCAST_JOB_DATA_DIR=str(tmp_path / "data"),
        PODCAST_JOB_BIND=f"127.0.0.1:{port}",
        PODCAST_JOB_URL=f"http://127.0.0.1:{port}",
        PODCAST_JOB_KINDS_FILE=str(kinds),
        PODCAST_JOB_MAX_CONCURRENT="4",
        PODCAST_JOB_CANCEL_GRACE_SECONDS="2",
        PODCAST_JOB_STALE_SECONDS="1",  # the operator's reconcile marks a job stale after 1 s
        PODCAST_JOB_PROGRESS_STALE_SECONDS="2",
        PODCAST_JOB_SWEEP_SECONDS="1",
        PODCAST_JOB_EVENTS_KEEPALIVE_SECONDS="1",
        COLUMNS="160",
    )
    srv = Server(f"http://127.0.0.1:{port}", env, tmp_path)
    await srv.start()
    try:
        yield srv
    finally:
        try:
            # Jobs outlive a supervisor: end what still runs, then stop it.
            await srv.post("/api/queue/pause")
            for job in (await srv.get("/api/jobs?status=running"))["jobs"]:
                await srv.post(f"/api/jobs/{job['job_id']}/cancel")
            for job in (await srv.get("/api/jobs?status=running"))["jobs"]:
                await srv.until(job["job_id"], lambda row: row["status"] != "running")
        finally:
            # Even when the tidy-up fails (a server that answers errors): a server left running outlives the test.
            await srv.stop()


async def cli(server: Server, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    with trio.fail_after(RUN_S):
        done = await trio.run_process(
            [sys.executable, "-m", "supervisor", *args],
            env=env or server.env,
            cwd=server.tmp,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


# -- wait: the exit code mirrors the outcome --------------------------------------------------------------------


async def test_wait_exits_with_each_outcome(server: Server) -> None:
    ok = await server.enqueue("echo", text="hi")
    failed = await server.enqueue("fail")
    cancelled = await server.enqueue("sleep", seconds=60)
    await server.until(cancelled, lambda row: row["status"] == "running")
    await server.post(f"/api/jobs/{cancelled}/cancel")
    stale = await server.enqueue("sleep", seconds=60)
    await server.until(stale, lambda row: row["status"] == "running" and row["pid"])

    async def mark_stale() -> None:
        # The operator's reconcile marks a live job past the wall-clock window (1 s here) stale.
        with trio.fail_after(RUN_S):
            while (await server.get(f"/api/jobs/{stale}"))["status"] == "running":
                await server.post("/api/jobs/reconcile")
                await trio.sleep(0.2)  # a second reconcile once the window has passed

    await mark_stale()
    expected = ((ok, EXIT_SUCCEEDED), (failed, EXIT_FAILED), (cancelled, EXIT_CANCELLED), (stale, EXIT_STALE))
    assert [code for _, code in expected] == [0, 10, 11, 12]  # the documented numbers
    for job_id, code in expected:
        done = await cli(server, "wait", job_id)
        assert done.returncode == code, (job_id, done)
    # Several jobs: the worst, in the order succeeded < cancelled < failed < stale < timeout.
    assert (await cli(server, "wait", ok, cancelled)).returncode == EXIT_CANCELLED
    assert (await cli(server, "wait", cancelled, failed, ok)).returncode == EXIT_FAILED
    assert (await cli(server, "wait", failed, stale)).returncode == EXIT_STALE
    running = await server.enqueue("sleep", seconds=60)
    timed_out = await cli(server, "wait", running, stale, "--timeout", "1", "--json")
    assert timed_out.returncode == EXIT_TIMEOUT == 124, timed_out
    answer = json.loads(timed_out.stdout)
    assert answer["timed_out"] is True and answer["exit_code"] == 124
    assert [(j["job_id"], j["status"]) for j in answer["jobs"]] == [(running, "running"), (stale, "stale")]
    assert "timed out after 1 s" in timed_out.stderr


async def test_wait_blocks_until_the_end_printing_one_line_per_change(server: Server) -> None:
    job_id = await server.enqueue("steps", n=3, every=0.4)
    done = await cli(server, "wait", job_id)
    assert done.returncode == EXIT_OK, done
    lines = done.stdout.splitlines()
    assert lines[-1].split()[1:4] == [job_id, "steps", "succeeded"], lines
    assert all(job_id in line for line in lines)


async def started_wait(server: Server, *args: str) -> tuple[trio.Process, bytes]:
    """A ``supervisor wait`` process (stdout not a terminal), once it has read its jobs (its first line)."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "supervisor", "wait", *args],
        env=server.env,
        cwd=server.tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    seen = b""
    with trio.fail_after(RUN_S):
        while b"\n" not in seen:
            chunk = await process.stdout.receive_some()
            assert chunk, f"wait exited before it printed anything: {process.returncode}"
            seen += chunk
    return process, seen


async def finish(process: trio.Process, seen: bytes) -> tuple[int, str, str]:
    assert process.stdout is not None and process.stderr is not None
    with trio.fail_after(RUN_S):
        while chunk := await process.stdout.receive_some():
            seen += chunk
        err = b""
        while chunk := await process.stderr.receive_some():
            err += chunk
        code = await process.wait()
    return code, seen.decode(), err.decode()


async def test_wait_follows_a_resubmitted_job_across_its_attempts(server: Server) -> None:
    await server.post("/api/queue/pause")
    job_id = await server.enqueue("flaky")  # exits 75: resubmitted once, then failed
    process, seen = await started_wait(server, job_id)
    assert b"queued" in seen
    await server.post("/api/queue/resume")
    code, out, _ = await finish(process, seen)
    assert code == EXIT_FAILED, out
    assert "resubmitted, followed: resubmitted: exit_code_75" in out
    assert out.splitlines()[-1].split()[3:5] == ["failed", "(exit_code_75)"]


async def test_wait_names_an_unknown_job_and_an_unreachable_server(server: Server) -> None:
    unknown = await cli(server, "wait", "nosuchjob")
    assert unknown.returncode == EXIT_ERROR
    assert "no job with id 'nosuchjob'" in unknown.stderr
    gone = {**server.env, "PODCAST_JOB_URL": f"http://127.0.0.1:{free_port()}"}
    unreachable = await cli(server, "wait", "abc", env=gone)
    assert unreachable.returncode == EXIT_UNREACHABLE
    assert "cannot reach the supervisor" in unreachable.stderr


async def test_wait_survives_a_restart_of_the_supervisor(server: Server) -> None:
    """The stream drops with the old boot; wait reconnects (Last-Event-ID of another boot: a gap), reads the row
    again, and learns the outcome from the new boot."""
    job_id = await server.enqueue("sleep", seconds=3)
    await server.until(job_id, lambda row: row["status"] == "running" and row["pid"])
    waiting, seen = await started_wait(server, job_id, "--timeout", str(RUN_S))
    try:
        await server.stop()
        await server.start()
        code, out, err = await finish(waiting, seen)
        assert code == EXIT_OK, (out, err)
        assert out.splitlines()[-1].split()[1:4] == [job_id, "sleep", "succeeded"]
    finally:
        if waiting.returncode is None:
            waiting.kill()
            with trio.CancelScope(shield=True):
                await waiting.wait()


# -- events --------------------------------------------------------------------------------------------------------


async def test_events_prints_what_the_server_holds_filtered(server: Server) -> None:
    first = await server.enqueue("echo", text="a")
    await server.until(first, lambda row: row["status"] == "succeeded")
    other = await server.enqueue("fail")
    await server.until(other, lambda row: row["status"] == "failed")
    done = await cli(server, "events", "--job", first)
    assert done.returncode == EXIT_OK, done
    changes = [line.split("  ", 3)[3] for line in done.stdout.splitlines()]
    assert changes == ["- -> queued  (enqueued)", "queued -> running  (promoted)", "running -> succeeded"]
    as_json = await cli(server, "events", "--kind", "job.transition", "--job", other, "--json")
    bodies = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [b["job"]["status"] for b in bodies] == ["queued", "running", "failed"]
    assert all(b["event_id"].endswith(f"-{n}") for b, n in zip(bodies, (4, 5, 6), strict=True))


# -- the live views, in a real terminal ------------------------------------------------------------------------------


@dataclass
class Terminal:
    socket: str  # a tmux server of this test's own (-L), never a user's
    session: str

    async def screen(self) -> str:
        done = await trio.run_process(
            ["tmux", "-L", self.socket, "capture-pane", "-p", "-t", self.session], capture_stdout=True, check=True
        )
        return done.stdout.decode()

    async def until(self, *texts: str) -> str:
        """The screen, once it shows every one of ``texts``."""
        screen = ""
        try:
            with trio.fail_after(RUN_S):
                while True:
                    screen = await self.screen()
                    if all(text in screen for text in texts):
                        break
                    await trio.sleep(POLL_S)  # polling the real screen, under the deadline above
        except trio.TooSlowError:
            raise AssertionError(f"the screen never showed {texts}:\n{screen}") from None
        return screen

    async def keys(self, *keys: str) -> None:
        await trio.run_process(["tmux", "-L", self.socket, "send-keys", "-t", self.session, *keys], check=True)


@pytest.fixture
async def terminal(server: Server) -> AsyncIterator[Callable[[list[str]], Any]]:
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and tmux is not installed (.ci/run installs it)", pytrace=False)
        pytest.skip("tmux is not installed (apt-get install tmux)")
    socket = f"supervisor-test-{os.getpid()}"
    sessions: list[str] = []

    async def open_terminal(argv: list[str]) -> Terminal:
        session = f"live-{len(sessions)}"
        sessions.append(session)
        env_args = [f"{k}={v}" for k, v in server.env.items() if k.startswith(("PODCAST_", "PYTHONPATH"))]
        env_args += ["TERM=xterm-256color", "COLUMNS=160", "LINES=30"]
        # The exit code is shown on the screen; the pane stays open to be read (the session is killed at the end).
        run = shlex.join(["env", *env_args, sys.executable, "-m", "supervisor", *argv])
        command = f"cd {shlex.quote(str(server.tmp))} && {run}; echo EXIT=$?; sleep 600"
        await trio.run_process(
            ["tmux", "-L", socket, "new-session", "-d", "-s", session, "-x", "160", "-y", "30", command], check=True
        )
        return Terminal(socket, session)

    yield open_terminal
    if sessions:
        await trio.run_process(["tmux", "-L", socket, "kill-server"], check=False)


async def test_wait_on_a_terminal_draws_progress_and_ends_with_the_outcome(server: Server, terminal: Any) -> None:
    job_id = await server.enqueue("steps", n=10, every=0.5)
    term: Terminal = await terminal(["wait", job_id])
    screen = await term.until(job_id, "running", "step ", "/10", "waiting")
    assert "PROGRESS AGE" in screen and "━" in screen  # the bar
    screen = await term.until("succeeded", "10/10", "done after", "EXIT=0")


async def test_jobs_watch_shows_running_jobs_flags_stalled_and_quits_on_ctrl_c(server: Server, terminal: Any) -> None:
    term: Terminal = await terminal(["jobs", "--watch"])
    await term.until("queue", "active", "no job running")
    moving = await server.enqueue("steps", n=60, every=0.5)
    stuck = await server.enqueue("sleep", seconds=60)  # no progress: stalled after 2 s
    screen = await term.until(moving, stuck, "/60", "STALLED", "1 stalled")
    await server.post("/api/queue/pause")
    screen = await term.until("PAUSED")
    await term.keys("C-c")
    screen = await term.until("EXIT=0")
    assert "Traceback" not in screen
