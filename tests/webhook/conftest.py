"""Fixtures for the webhook tests: a real receiver on 127.0.0.1:0."""

from __future__ import annotations

import functools

import pytest
import trio
from webhook_helpers import Receiver


@pytest.fixture
async def receiver(nursery: trio.Nursery) -> Receiver:
    rec = Receiver()
    listeners = await nursery.start(functools.partial(trio.serve_tcp, rec.handle, 0, host="127.0.0.1"))
    rec.port = listeners[0].socket.getsockname()[1]
    return rec
