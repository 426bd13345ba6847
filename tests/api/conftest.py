"""Fixtures for the HTTP API and CLI tests: a supervisor on a job nursery behind the quart-trio test client, and a
live server (``run_supervisor`` on port 0).

Jobs really run. Every fixture pauses the queue and cancels what is still running at the end of its test, then
waits (polling under ``trio.fail_after``) until nothing runs: a supervisor shutdown never kills a job.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from quart_trio import QuartTrio

from supervisor._app import create_app
from supervisor._config import Config
from supervisor._core import Supervisor
from supervisor._kinds import KindCatalog, load_kinds
from supervisor._model import Job
from supervisor._registry import SqliteRegistry
from supervisor._server import run_supervisor
from supervisor._store import AsyncRegistry

T = TypeVar("T")

API_TOKEN = "test-api-token-0123456789"
POLL_S = 0.02  # the polling step while waiting for a job's state, always under a fail_after
WAIT_S = 10.0

_HEARTBEAT_ONCE = (
    "import json, os, sys, urllib.request; "
    "req = urllib.request.Request(os.environ['PODCAST_JOB_HEARTBEAT_URL'], method='POST', "
    "data=json.dumps({'completed_units': int(sys.argv[1]), 'stage': 'beating'}).encode(), "
    "headers={'Authorization': 'Bearer ' + os.environ['PODCAST_JOB_TOKEN'], 'Content-Type': 'application/json'}); "
    "print('heartbeat', urllib.request.urlopen(req, timeout=10).status, flush=True)"
)

KINDS: dict[str, dict[str, Any]] = {
    "sleep": {
        "argv": ["{python}", "-c", "import sys, time; time.sleep(float(sys.argv[1]))", "{seconds}"],
        "params": {"seconds": "float"},
    },
    "echo": {
        "argv": ["{python}", "-c", "import sys; print(sys.argv[1], flush=True)", "{text}"],
        "params": {"text": "str"},
    },
    # Prints its job token, then sleeps: lets a route test heartbeat as this job.
    "tokened": {
        "argv": [
            "{python}",
            "-c",
            "import os, sys, time; print(os.environ['PODCAST_JOB_TOKEN'], flush=True); time.sleep(float(sys.argv[1]))",
            "{seconds}",
        ],
        "params": {"seconds": "float"},
    },
    # Heartbeats once through the URL the supervisor gave it, then exits.
    "beater": {"argv": ["{python}", "-c", _HEARTBEAT_ONCE, "{units}"], "params": {"units": "int"}},
    "typed": {
        "argv": ["{python}", "-c", "pass", "{n}", "{ratio}", "{flag}", "{name}"],
        "params": {"n": "int", "ratio": "float", "flag": "bool", "name": "str"},
    },
    "fail": {"argv": ["{python}", "-c", "raise SystemExit(3)"]},
    # Output spread over time, for following a log while it grows.
    "chatty": {
        "argv": [
            "{python}",
            "-c",
            "import sys, time\nfor i in range(int(sys.argv[1])):\n    print('line', i, flush=True); time.sleep(0.3)",
            "{lines}",
        ],
        "params": {"lines": "int"},
    },
    "tidy": {"argv": ["{python}", "-c", "pass"], "coalesce": True},
}


def _toml(kinds: dict[str, dict[str, Any]]) -> str:
    # json.dumps of ASCII text is a valid TOML basic string, and of a list of them a valid TOML array.
    lines: list[str] = []
    for name, spec in kinds.items():
        lines.append(f"[kinds.{name}]")
        lines.append(f"argv = {json.dumps(spec['argv'])}")
        params = spec.get("params", {})
        lines.append("params = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in params.items()) + " }")
        if spec.get("coalesce"):
            lines.append("coalesce = true")
        lines.append("")
    return "\n".join(lines)


@pytest.fixture
def kinds_path(tmp_path: Path) -> Path:
    path = tmp_path / "kinds.toml"
    path.write_text(_toml(KINDS))
    return path


@pytest.fixture
def kinds(kinds_path: Path) -> KindCatalog:
    return load_kinds(kinds_path)


def make_config(tmp_path: Path, kinds_path: Path, **overrides: Any) -> Config:
    base = Config(
        data_dir=tmp_path / "data",
        bind_port=0,
        kinds_file=kinds_path,
        max_concurrent=2,
        cancel_grace_s=5.0,
        sweep_interval_s=3600.0,
    )
    return dataclasses.replace(base, **overrides)


async def poll_until(check: Callable[[], Awaitable[T | None]], *, limit_s: float = WAIT_S) -> T:
    """Poll ``check`` until it returns something other than None; bounded by a deadline (never a bare sleep)."""
    with trio.fail_after(limit_s):
        while True:
            got = await check()
            if got is not None:
                return got
            await trio.sleep(POLL_S)


async def wait_for_job(sup: Supervisor, job_id: str, done: Callable[[Job], bool]) -> Job:
    async def check() -> Job | None:
        job = await sup.get(job_id)
        return job if done(job) else None

    return await poll_until(check)


async def wait_terminal(sup: Supervisor, job_id: str) -> Job:
    return await wait_for_job(sup, job_id, lambda job: job.status.is_terminal)


async def wait_log_line(sup: Supervisor, job_id: str) -> str:
    """The first whole line of a job's log, once it is there."""

    async def check() -> str | None:
        data = await sup.read_log(job_id)
        return data.decode().splitlines()[0] if b"\n" in data else None

    return await poll_until(check)


async def stop_all_jobs(sup: Supervisor) -> None:
    """Pause (so nothing new is promoted), cancel what runs, wait until nothing does."""
    await sup.pause()
    for job in await sup.registry.running_jobs():
        await sup.cancel(job.job_id)

    async def none_running() -> bool | None:
        return True if not await sup.registry.running_jobs() else None

    await poll_until(none_running)


@dataclasses.dataclass
class Harness:
    supervisor: Supervisor
    app: QuartTrio
    client: Any  # quart's TestClientProtocol

    async def json(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        response = await self.client.open(path, method=method, **kwargs)
        return response.status_code, await response.get_json()


OpenHarness = Callable[..., AbstractAsyncContextManager[Harness]]


@pytest.fixture
def open_harness(nursery: trio.Nursery, tmp_path: Path, kinds_path: Path, kinds: KindCatalog) -> OpenHarness:
    """``async with open_harness(**config_overrides) as h``: a supervisor on the test's nursery and its app.

    A context manager rather than a fixture value: the app's lifespan opens a nursery, which must be entered and
    left by the same task.
    """

    @asynccontextmanager
    async def open_(**overrides: Any) -> AsyncIterator[Harness]:
        config = make_config(tmp_path, kinds_path, **overrides)
        registry = SqliteRegistry(config.registry_path)
        try:
            sup = Supervisor(config, kinds, AsyncRegistry(registry))
            sup.attach(nursery)
            app = create_app(sup)
            async with app.test_app() as test_app:
                try:
                    yield Harness(sup, app, test_app.test_client())
                finally:
                    await stop_all_jobs(sup)
        finally:
            registry.close()

    return open_


@pytest.fixture
async def harness(open_harness: OpenHarness) -> AsyncIterator[Harness]:
    async with open_harness() as h:
        yield h


@pytest.fixture
async def authed(open_harness: OpenHarness) -> AsyncIterator[Harness]:
    """A harness whose API requires ``API_TOKEN``."""
    async with open_harness(api_token=API_TOKEN) as h:
        yield h


class ShutdownFlag:
    """A ``trio.Event`` stand-in for ``run_supervisor(shutdown=...)``.

    Workaround: ``run_supervisor`` does ``shutdown or trio.Event()``, and a real ``trio.Event`` refuses ``bool()``
    (NotImplementedError). Remove this once _server.py tests ``is None`` instead.
    """

    def __init__(self) -> None:
        self._event = trio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


@dataclasses.dataclass
class Live:
    supervisor: Supervisor
    shutdown: ShutdownFlag
    stopped: trio.Event

    @property
    def url(self) -> str:
        assert self.supervisor.heartbeat_base_url is not None
        return self.supervisor.heartbeat_base_url


async def _run_live(
    config: Config, kinds: KindCatalog, shutdown: ShutdownFlag, stopped: trio.Event, *, task_status: Any
) -> None:
    try:
        await run_supervisor(config, kinds, shutdown=shutdown, task_status=task_status)  # type: ignore[arg-type]
    finally:
        stopped.set()


MakeLive = Callable[..., Awaitable[Live]]


@pytest.fixture
async def make_live(
    nursery: trio.Nursery, tmp_path: Path, kinds_path: Path, kinds: KindCatalog
) -> AsyncIterator[MakeLive]:
    """Start ``run_supervisor`` on 127.0.0.1:0; at the end stop its jobs, then shut it down gracefully."""
    started: list[Live] = []

    async def make(**overrides: Any) -> Live:
        config = make_config(tmp_path, kinds_path, **overrides)
        shutdown, stopped = ShutdownFlag(), trio.Event()
        sup = await nursery.start(functools.partial(_run_live, config, kinds, shutdown, stopped))
        live = Live(sup, shutdown, stopped)
        started.append(live)
        return live

    yield make
    for live in started:
        if not live.stopped.is_set():
            await stop_all_jobs(live.supervisor)
            live.shutdown.set()
        with trio.fail_after(WAIT_S):
            await live.stopped.wait()
