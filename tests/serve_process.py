"""``supervisor serve`` as a real process for end-to-end tests: started with its output in a log file, stopped
gracefully by the test (``stop``), and killed on the way out whatever happened, so no server outlives its test."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio


@asynccontextmanager
async def serve_process(env: dict[str, str], cwd: Path, log_path: Path) -> AsyncIterator[trio.Process]:
    """``supervisor serve`` with ``env``, in ``cwd``, its stdout and stderr to ``log_path``."""
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "supervisor", "serve"], env=env, cwd=cwd, stdout=log, stderr=log
        )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()


async def stop(process: trio.Process, limit_s: float) -> int:
    """SIGTERM, as an operator's stop; the exit code, within ``limit_s``."""
    process.send_signal(signal.SIGTERM)
    with trio.fail_after(limit_s):
        return await process.wait()


def beater_kind(name: str, *, every_s: float, timeout_s: float) -> str:
    """A kinds-file table: a job that beats every ``every_s`` with its watermark rising by one each time, over real
    HTTP with its own token, for ever (a failed beat is tried again at the next: no supervisor right now)."""
    return f'''
[kinds.{name}]
argv = ["{{python}}", "-c", """
import json, os, threading, urllib.request
units = 0
while True:
    units += 1
    req = urllib.request.Request(os.environ["PODCAST_JOB_HEARTBEAT_URL"], method="POST",
        data=json.dumps({{"completed_units": units}}).encode(),
        headers={{"Authorization": "Bearer " + os.environ["PODCAST_JOB_TOKEN"], "Content-Type": "application/json"}})
    try:
        urllib.request.urlopen(req, timeout={timeout_s}).read()
    except Exception:
        pass  # no supervisor right now: keep beating
    threading.Event().wait({every_s})
"""]
'''


async def kill_running_jobs(data_dir: Path) -> None:
    """Kill the process group of every running job recorded in ``data_dir``'s registry whose process is verified
    alive: a job outlives its supervisor by design, so a test that started one stops it, whatever became of the
    server (call it in a ``finally``)."""
    from supervisor import SqliteRegistry
    from supervisor.execution.subprocess import identity_of, probe

    path = data_dir / ".viewer" / "jobs.sqlite3"
    if not path.exists():
        return
    registry = SqliteRegistry(path)
    try:
        for job in await registry.running_jobs():
            identity = identity_of(job)
            if identity is not None and probe(identity).value == "alive":
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(identity.pid, signal.SIGKILL)
    finally:
        await registry.aclose()
