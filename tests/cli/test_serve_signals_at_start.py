"""Signals at start-up: ``supervisor serve`` started as an operator starts it (the console script),
signalled at 0.05 s steps through its first second, and while another process holds the registry's lock.

SIGHUP (the token reload) never ends it; SIGTERM and SIGINT end it with exit 0, every line of its output a JSON
object, one of them ``shutdown_requested`` naming the signal. Before, the watcher was installed after the imports, the
registry's opening and the data dir's lock: a SIGHUP or SIGTERM in that window ended the process without a line, a
SIGINT with a ``KeyboardInterrupt`` traceback.

Only the interpreter's own start comes before the command's first line (~35 ms in this venv, whose editable install
adds an import hook; more on a loaded machine): it is not ours to hold. So a step is never sent before the process
catches the three signals (its ``SigCgt`` in ``/proc``), waited for up to ``FIRST_LINE_S``: on a quiet machine that
changes nothing, on a busy one the first steps come as soon as the process can hear them. (Before the fix nothing
caught them until the watcher, most of a second in: its steps came at ``FIRST_LINE_S``, and failed.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from supervisor import SqliteRegistry

STEP_S = 0.05
FIRST_LINE_S = 0.5  # the longest a step waits for the process to catch the signals
STEPS = 20  # through the first second
LIMIT_S = 20.0
# Long enough that a start which waited for the lock instead of abandoning it would outlast the test's bound.
BUSY_TIMEOUT_MS = 60_000

# Each stop at its own step: SIGTERM at the odd ones, SIGINT at the even ones (one process each: the signal ends it).
STOPS = [(step, signal.SIGTERM if step % 2 else signal.SIGINT) for step in range(1, STEPS + 1)]
# With the lock held: during the imports, and while the opening waits for the lock (held to the end of the test).
LOCKED_STOPS = [(5, signal.SIGTERM), (10, signal.SIGINT), (20, signal.SIGTERM), (30, signal.SIGINT)]


def serve_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}
    env["PODCAST_JOB_DATA_DIR"] = str(tmp_path / "data")
    env["PODCAST_JOB_BIND"] = "127.0.0.1:0"
    env["PODCAST_JOB_REGISTRY_BUSY_TIMEOUT_MS"] = str(BUSY_TIMEOUT_MS)
    return env


def console_script() -> list[str]:
    """The installed ``supervisor`` command (the unit's ExecStart, the image's CMD), not ``python -m``."""
    return [str(Path(sys.executable).with_name("supervisor")), "serve"]


@contextlib.contextmanager
def registry_locked(tmp_path: Path) -> Iterator[None]:
    """Another process's write lock on the registry (here a connection of the test's own), as a migration or a
    backup holds it."""
    path = tmp_path / "data" / ".viewer" / "jobs.sqlite3"
    path.parent.mkdir(parents=True)
    SqliteRegistry(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        yield
    finally:
        conn.close()


def output_lines(log_path: Path) -> list[dict[str, Any]]:
    """Every line the process wrote (stdout and stderr), each a JSON object, or the assertion names the one not."""
    lines = log_path.read_text().splitlines()
    for line in lines:
        assert line.startswith("{") and isinstance(json.loads(line), dict), f"not a JSON line: {line!r}\n{lines}"
    return [json.loads(line) for line in lines]


def _catches_all(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    except (FileNotFoundError, StopIteration):
        return False
    return all(caught & (1 << (signum - 1)) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))


async def signal_at_steps(process: trio.Process, signum: int, steps: list[int]) -> None:
    """``signum`` at each step after the process was spawned, none before it catches the signals (or
    ``FIRST_LINE_S``)."""
    start = trio.current_time()
    with trio.move_on_after(FIRST_LINE_S):
        while not await trio.to_thread.run_sync(_catches_all, process.pid):  # noqa: ASYNC110 - nothing to wait on
            await trio.sleep(0.001)  # polling /proc for the process's first line, up to the bound above
    for step in steps:
        await trio.sleep_until(start + step * STEP_S)
        assert process.returncode is None, f"serve ended before the signal at {step * STEP_S:.2f} s"
        process.send_signal(signum)


async def serving_url(log_path: Path, process: trio.Process) -> str:
    """The API's address from the start line, once the server is up; fails if it ended instead."""
    with trio.fail_after(LIMIT_S):
        while True:
            text = await trio.Path(log_path).read_text()
            assert process.returncode is None, text
            for line in text.splitlines():
                if '"supervisor_started"' in line:
                    url: str = json.loads(line)["url"]
                    return url
            await trio.sleep(0.05)  # polling the log for the start line, under the deadline above


@pytest.mark.parametrize("locked", [False, True], ids=["plain", "registry_locked"])
async def test_sighup_at_every_step_of_the_start_never_ends_serve_and_is_acted_on(tmp_path: Path, locked: bool) -> None:
    log_path = tmp_path / "serve.log"
    with registry_locked(tmp_path) if locked else contextlib.nullcontext():
        with log_path.open("wb") as log:
            process = await trio.lowlevel.open_process(
                console_script(), env=serve_env(tmp_path), stdout=log, stderr=log
            )
        try:
            await signal_at_steps(process, signal.SIGHUP, list(range(1, STEPS + 1)))
            if locked:  # still waiting for the lock: it cannot have served
                assert process.returncode is None
                assert "supervisor_started" not in log_path.read_text()
        except BaseException:
            process.kill()
            raise
    try:
        url = await serving_url(log_path, process)
        async with httpx.AsyncClient(timeout=5.0) as client:
            assert (await client.get(f"{url}/api/health")).status_code == 200
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(LIMIT_S):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
    events = [line["event"] for line in output_lines(log_path)]
    assert "api_tokens_reloaded" in events  # a SIGHUP held through the start is acted on, not dropped
    assert events[-2:] == ["shutdown_requested", "supervisor_stopped"]


async def _stop_at(tmp_path: Path, step: int, signum: signal.Signals) -> list[dict[str, Any]]:
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(console_script(), env=serve_env(tmp_path), stdout=log, stderr=log)
    try:
        await signal_at_steps(process, signum, [step])
        with trio.fail_after(LIMIT_S):
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
    assert code == 0, log_path.read_text()
    lines = output_lines(log_path)
    assert {"event": "shutdown_requested", "signal": signum.name} in [
        {k: line.get(k) for k in ("event", "signal")} for line in lines
    ], lines
    assert lines[-1]["event"] == "supervisor_stopped"
    return lines


@pytest.mark.parametrize(("step", "signum"), STOPS, ids=[f"{s * STEP_S:.2f}s-{n.name}" for s, n in STOPS])
async def test_sigterm_or_sigint_at_any_step_of_the_start_ends_serve_with_exit_0_and_json_lines(
    tmp_path: Path, step: int, signum: signal.Signals
) -> None:
    await _stop_at(tmp_path, step, signum)


@pytest.mark.parametrize(
    ("step", "signum"), LOCKED_STOPS, ids=[f"{s * STEP_S:.2f}s-{n.name}" for s, n in LOCKED_STOPS]
)
async def test_a_stop_while_the_registry_is_locked_ends_the_start_without_waiting_for_the_lock(
    tmp_path: Path, step: int, signum: signal.Signals
) -> None:
    """The lock stays held to the end: a start that waited for it (the busy timeout is a minute) fails the bound."""
    with registry_locked(tmp_path):
        lines = await _stop_at(tmp_path, step, signum)
    assert "supervisor_started" not in [line["event"] for line in lines]


@pytest.mark.parametrize("command", [["jobs"], ["wait", "job-1"]])
async def test_a_client_command_interrupted_while_it_imports_exits_130_without_a_traceback(
    tmp_path: Path, command: list[str]
) -> None:
    """Every other command gets the held signals back once it is known: a Ctrl-C during the imports is the CLI's
    "interrupted" (130), as one after them is, not a ``KeyboardInterrupt`` traceback."""
    env = serve_env(tmp_path) | {"PODCAST_JOB_URL": "http://127.0.0.1:9"}  # never reached: interrupted first
    process = await trio.lowlevel.open_process(
        [console_script()[0], *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        await signal_at_steps(process, signal.SIGINT, [4])  # 0.2 s: well inside the imports
        with trio.fail_after(LIMIT_S):
            code = await process.wait()
        assert process.stderr is not None
        stderr = await process.stderr.receive_some()
    finally:
        if process.returncode is None:
            process.kill()
    assert (code, stderr) == (130, b"")
