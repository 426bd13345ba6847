"""Fixtures for the pipeline-runner tests; the helpers they use live in runner_helpers.py."""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable
from typing import Any

import pytest
import trio
from runner_helpers import FakeNet, HttpServer  # also puts the repo root on sys.path

import pipeline_runner._fs as runner_fs


@pytest.fixture
async def http_server(nursery: trio.Nursery) -> HttpServer:
    server = HttpServer()
    listeners = await nursery.start(functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
    server.port = listeners[0].socket.getsockname()[1]
    return server


@pytest.fixture
def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/dead"


@pytest.fixture
def fake_net() -> FakeNet:
    return FakeNet()


@pytest.fixture
def inline_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the runner's blocking file I/O inline, so the autojump clock only jumps when the run is idle."""

    async def inline(fn: Callable[..., Any], *args: Any) -> Any:
        await trio.lowlevel.checkpoint()
        return fn(*args)

    monkeypatch.setattr(runner_fs, "run_blocking", inline)
