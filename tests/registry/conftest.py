"""The registry contract suite's fixtures: every test that asks for ``registry`` (or ``open_registry``) runs once per
backend in ``registry_helpers.BACKENDS``, each time on a fresh, empty registry.

- ``backend``: the backend's name (the test id's suffix: ``[sqlite]``, ``[memory]``);
- ``clock``: the registry's wall clock (``WallClock``), moved only by the test;
- ``open_registry(boot_id=..., outbox=..., clock=...)``: a further fresh registry of the same backend (each in a
  place of its own: two calls never share rows), closed after the test;
- ``registry``: one such registry with the defaults (boot ``boot-test``, outbox on, the ``clock`` fixture).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path

import pytest
from registry_helpers import BACKENDS, BOOT, WallClock

from supervisor.registry import Registry

OpenRegistry = Callable[..., Awaitable[Registry]]


@pytest.fixture(params=[pytest.param(name, marks=BACKENDS[name].marks) for name in sorted(BACKENDS)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> WallClock:
    return WallClock()


@pytest.fixture
async def open_registry(backend: str, tmp_path: Path, clock: WallClock) -> AsyncIterator[OpenRegistry]:
    opened: list[Registry] = []
    places = itertools.count()

    async def open_(
        *, boot_id: str | None = BOOT, outbox: bool = True, clock: Callable[[], datetime] = clock
    ) -> Registry:
        where = tmp_path / f"{backend}-{next(places)}"
        where.mkdir()
        reg = await BACKENDS[backend].open(where, clock=clock, boot_id=boot_id, outbox=outbox)
        opened.append(reg)
        return reg

    # pytest-trio runs the fixtures and the test in one contextvars context: what ``around`` opens here (an asyncio
    # loop under trio-asyncio) is the test's too.
    async with BACKENDS[backend].around():
        yield open_
        for reg in opened:
            await reg.aclose()


@pytest.fixture
async def registry(open_registry: OpenRegistry) -> Registry:
    return await open_registry()
