"""Helpers shared by the API and CLI tests (imported by name: a module called ``conftest`` would be ambiguous,
since other test directories have their own).

Jobs really run. Helpers wait by polling the registry under ``trio.fail_after``, never by sleeping blindly.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import trio
from quart_trio import QuartTrio

from supervisor import Supervisor, run_supervisor
from supervisor.api import HttpLimits
from supervisor.domain import Config, Credentials, Job, KindCatalog

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
        "argv": ["{python}", "-c", "import sys, threading; threading.Event().wait(float(sys.argv[1]))", "{seconds}"],
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
            "import os, sys, threading; print(os.environ['PODCAST_JOB_TOKEN'], flush=True); "
            "threading.Event().wait(float(sys.argv[1]))",
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
            "import sys, threading\nfor i in range(int(sys.argv[1])):\n"
            "    print('line', i, flush=True); threading.Event().wait(0.3)",
            "{lines}",
        ],
        "params": {"lines": "int"},
    },
    "tidy": {"argv": ["{python}", "-c", "pass"], "coalesce": True},
    # Params with defaults: `paged` requires one param of two, `knobs` none.
    "paged": {
        "argv": ["{python}", "-c", "pass", "{feed}", "{limit}"],
        "params": {"feed": "str", "limit": {"type": "int", "default": 0}},
    },
    # Exits 75 ("try again later") every time: resubmitted once, after a short backoff, then failed.
    "flaky": {
        "argv": ["{python}", "-c", "raise SystemExit(75)"],
        "max_attempts": 2,
        "retry_backoff_seconds": 0.1,
        "retry_backoff_max_seconds": 0.1,
        "retry_on_exit_codes": [75],
    },
    # Two attempts of 40 lines each: the first exits 75 ("try again later"), the second 0. The marker file
    # (a param) tells the attempts apart.
    "twice": {
        "argv": [
            "{python}",
            "-c",
            "import os, sys, time\n"
            "first = not os.path.exists(sys.argv[1])\n"
            "open(sys.argv[1], 'a').close()\n"
            "for i in range(40):\n"
            "    print('attempt', 1 if first else 2, 'line', i, flush=True)\n"
            "    time.sleep(0.01)\n"
            "sys.exit(75 if first else 0)\n",
            "{marker}",
        ],
        "params": {"marker": "str"},
        "max_attempts": 2,
        "retry_backoff_seconds": 0.1,
        "retry_backoff_max_seconds": 0.1,
        "retry_on_exit_codes": [75],
    },
    "knobs": {
        "argv": ["{python}", "-c", "pass", "{ratio}", "{flag}"],
        "params": {"ratio": {"type": "float", "default": 0.5}, "flag": {"type": "bool", "default": True}},
    },
}


def kinds_toml(kinds: dict[str, dict[str, Any]]) -> str:
    # json.dumps of ASCII text is a valid TOML basic string, and of a list of them a valid TOML array.
    lines: list[str] = []
    for name, spec in kinds.items():
        lines.append(f"[kinds.{name}]")
        lines.append(f"argv = {json.dumps(spec['argv'])}")
        params = spec.get("params", {})
        lines.append("params = { " + ", ".join(f"{k} = {_toml_param(v)}" for k, v in params.items()) + " }")
        if spec.get("coalesce"):
            lines.append("coalesce = true")
        for key in ("max_attempts", "retry_backoff_seconds", "retry_backoff_max_seconds", "retry_on_exit_codes"):
            if key in spec:
                lines.append(f"{key} = {json.dumps(spec[key])}")
        lines.append("")
    return "\n".join(lines)


def _toml_param(declared: str | dict[str, Any]) -> str:
    """``"int"``, or ``{"type": "int", "default": 0}`` as the inline table ``{ type = "int", default = 0 }``."""
    if isinstance(declared, str):
        return json.dumps(declared)
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in declared.items()) + " }"


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


async def wait_running(sup: Supervisor, job_id: str) -> Job:
    """Until the drainer has promoted and spawned the job (an enqueue answers 202 before the spawn)."""
    return await wait_for_job(sup, job_id, lambda job: job.status == "running" and job.identity is not None)


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
    credentials: Credentials | None = None  # the tokens the app takes (reload them after a change of the file)

    async def json(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        response = await self.client.open(path, method=method, **kwargs)
        return response.status_code, await response.get_json()


OpenHarness = Callable[..., AbstractAsyncContextManager[Harness]]


@dataclasses.dataclass
class Live:
    supervisor: Supervisor
    shutdown: trio.Event
    stopped: trio.Event

    @property
    def url(self) -> str:
        assert self.supervisor.heartbeat_base_url is not None
        return self.supervisor.heartbeat_base_url


async def run_live(
    config: Config,
    kinds: KindCatalog,
    shutdown: trio.Event,
    stopped: trio.Event,
    *,
    limits: HttpLimits | None = None,
    task_status: Any,
) -> None:
    try:
        await run_supervisor(config, kinds, shutdown=shutdown, http_limits=limits, task_status=task_status)
    finally:
        stopped.set()


MakeLive = Callable[..., Awaitable[Live]]


def assert_error(body: Any, code: str, field: str | None = None) -> None:
    assert set(body) == {"error"}
    assert body["error"]["code"] == code, body
    assert body["error"]["field"] == field, body
    assert body["error"]["message"]


async def start_tokened(harness: Harness) -> tuple[str, str]:
    """A running job and its token (it prints the token it was given, then sleeps)."""
    _, answer = await harness.json("POST", "/api/jobs", json={"kind": "tokened", "params": {"seconds": 30}})
    return answer["job_id"], await wait_log_line(harness.supervisor, answer["job_id"])


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
