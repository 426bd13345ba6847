"""Fixtures for the HTTP API's and the CLI's tests (``tests/api``, ``tests/cli``; a plugin of ``tests/conftest.py``): a
supervisor on a job nursery behind the quart-trio test client, and a live server (``run_supervisor`` on port 0).
Shared helpers live in ``api_support``.

Jobs really run. Every fixture pauses the queue and cancels what is still running at the end of its test, then
waits (polling under ``trio.fail_after``) until nothing runs: a supervisor shutdown never kills a job.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from api_support import (
    API_TOKEN,
    KINDS,
    WAIT_S,
    Harness,
    Live,
    MakeLive,
    OpenHarness,
    kinds_toml,
    make_config,
    run_live,
    stop_all_jobs,
)

from supervisor import SqliteRegistry, Supervisor
from supervisor.api import HttpLimits, create_app
from supervisor.domain import Credentials, KindCatalog, load_kinds


@pytest.fixture
def kinds_path(tmp_path: Path) -> Path:
    path = tmp_path / "kinds.toml"
    path.write_text(kinds_toml(KINDS))
    return path


@pytest.fixture
def kinds(kinds_path: Path) -> KindCatalog:
    return load_kinds(kinds_path)


@pytest.fixture
def open_harness(nursery: trio.Nursery, tmp_path: Path, kinds_path: Path, kinds: KindCatalog) -> OpenHarness:
    """``async with open_harness(**config_overrides) as h``: a supervisor on the test's nursery and its app.

    A context manager rather than a fixture value: the app's lifespan opens a nursery, which must be entered and
    left by the same task.
    """

    @asynccontextmanager
    async def open_(**overrides: Any) -> AsyncIterator[Harness]:
        config = make_config(tmp_path, kinds_path, **overrides)
        # As run_supervisor opens it: events are written only when a webhook will send them.
        registry = SqliteRegistry(config.registry_path, outbox=config.webhook_url is not None)
        try:
            sup = Supervisor(config, kinds, registry, standalone=True)  # no fleet task: the tests drive it
            sup.attach(nursery)
            await nursery.start(sup.drainer.run)  # what run_supervisor starts in its root nursery
            await nursery.start(sup.heartbeats.run)
            credentials = Credentials.from_config(config)
            await trio.to_thread.run_sync(credentials.load)
            app = create_app(sup, credentials)
            async with app.test_app() as test_app:
                try:
                    yield Harness(sup, app, test_app.test_client(), credentials)
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


@pytest.fixture
async def make_live(
    nursery: trio.Nursery, tmp_path: Path, kinds_path: Path, kinds: KindCatalog
) -> AsyncIterator[MakeLive]:
    """Start ``run_supervisor`` on 127.0.0.1:0; at the end stop its jobs, then shut it down gracefully."""
    started: list[Live] = []

    async def make(*, limits: HttpLimits | None = None, **overrides: Any) -> Live:
        """``limits``: the HTTP server's timeouts; ``overrides``: the supervisor's settings."""
        config = make_config(tmp_path, kinds_path, **overrides)
        shutdown, stopped = trio.Event(), trio.Event()
        sup = await nursery.start(functools.partial(run_live, config, kinds, shutdown, stopped, limits=limits))
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
