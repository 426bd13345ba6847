"""The test package's own plumbing, which the PostgreSQL backend will lean on: the portal runs each call inside
what the backend keeps open around its registries (a context variable, as trio-asyncio keeps its loop), and so does
the fixture (pytest-trio runs fixtures and test in one context)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio_asyncio
from trio_portal import Portal

WHERE: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="outside")


@asynccontextmanager
async def inside() -> AsyncIterator[None]:
    token = WHERE.set("inside")
    try:
        yield
    finally:
        WHERE.reset(token)


async def where() -> str:
    await trio.lowlevel.checkpoint()
    return WHERE.get()


async def fails() -> None:
    await trio.lowlevel.checkpoint()
    raise KeyError("the call's own error")


def test_the_portal_runs_every_call_inside_around_on_one_loop() -> None:
    with Portal(around=inside) as portal:
        assert [portal.run(where) for _ in range(3)] == ["inside"] * 3
        tokens = {portal.run(_token) for _ in range(3)}
        assert len(tokens) == 1  # one loop for the portal's life
        with pytest.raises(KeyError, match="the call's own error"):
            portal.run(fails)
        assert portal.run(where) == "inside"  # an error ends the call, not the portal
    with Portal() as portal:
        assert portal.run(where) == "outside"


async def _token() -> object:
    await trio.lowlevel.checkpoint()
    return trio.lowlevel.current_trio_token()


def test_the_portal_keeps_a_trio_asyncio_loop_open_between_calls() -> None:
    async def on_asyncio(n: int) -> int:
        return int(await trio_asyncio.aio_as_trio(asyncio.sleep)(0, result=n))

    with Portal(around=trio_asyncio.open_loop) as portal:
        assert [portal.run(on_asyncio, n) for n in range(3)] == [0, 1, 2]


@pytest.fixture
async def opened_around() -> AsyncIterator[None]:
    async with inside():
        yield


async def test_what_a_fixture_opens_around_is_open_in_the_test(opened_around: None) -> None:
    assert await where() == "inside"
