"""A Trio loop in a background thread, for sync code (hypothesis's stateful rules) that drives async code.

The loop stays open for the portal's whole life, so what lives on it between calls (a registry's connections; for
the PostgreSQL backend, asyncpg's pool under trio-asyncio, whose asyncio loop must not close between calls) keeps
living. ``around`` (optional) is an async context manager entered on the loop before the first call and left after
the last one: where a backend opens what must outlive every call (``trio_asyncio.open_loop()``).

Each ``run`` is handed to one task that lives inside ``around`` and runs the calls one after the other: a call made
straight from ``trio.from_thread.run`` would run in a system task, outside the context ``around`` set (trio-asyncio
finds its loop in a context variable). Its exception is re-raised in the caller's thread. ``clock`` (optional): the
loop's clock, e.g. a ``trio.testing.MockClock`` that only the calls move. ``nursery``: the loop's own, for tasks
that outlive a call; cancelled when the portal closes.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import trio

T = TypeVar("T")

START_S = 30.0  # a backstop for a broken loop, never a timing assertion


@dataclass
class _Call:
    fn: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...]
    done: trio.Event = field(default_factory=trio.Event)
    result: Any = None
    error: BaseException | None = None


class Portal:
    def __init__(
        self,
        around: Callable[[], AbstractAsyncContextManager[Any]] | None = None,
        *,
        clock: trio.abc.Clock | None = None,
    ) -> None:
        self._around = around
        self._clock = clock
        self._token: trio.lowlevel.TrioToken | None = None
        self._calls: trio.MemorySendChannel[_Call] | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="trio-portal", daemon=True)
        # Tasks that outlive a call (a writer a test starts with ``await portal.nursery.start(fn)`` inside a call).
        self.nursery: trio.Nursery | None = None

    def __enter__(self) -> Portal:
        self._thread.start()
        if not self._ready.wait(START_S):
            raise RuntimeError("the portal's Trio loop never started")
        if self._error is not None:
            raise RuntimeError("the portal's Trio loop failed to start") from self._error
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` on the portal's loop, inside ``around``; its result, or its exception raised here."""
        calls = self._calls
        assert calls is not None and self._token is not None, "the portal is not open"

        async def handed_over() -> _Call:
            call = _Call(fn, args)
            await calls.send(call)
            await call.done.wait()
            return call

        call = trio.from_thread.run(handed_over, trio_token=self._token)
        if call.error is not None:
            raise call.error
        result: T = call.result
        return result

    def close(self) -> None:
        if self._calls is not None and self._token is not None:
            trio.from_thread.run_sync(self._calls.close, trio_token=self._token)  # the runner's loop ends
            self._token = None
        self._thread.join(START_S)
        if self._thread.is_alive():
            raise RuntimeError("the portal's Trio loop never stopped")
        if self._error is not None:
            raise RuntimeError("the portal's Trio loop failed") from self._error

    def _main(self) -> None:
        try:
            trio.run(self._serve, clock=self._clock)
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()  # also when it failed before it was ready: the opener must not wait in vain

    async def _serve(self) -> None:
        send, receive = trio.open_memory_channel[_Call](0)
        around = self._around() if self._around is not None else nullcontext()
        async with around, receive, trio.open_nursery() as nursery:
            self.nursery = nursery
            self._calls = send
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            async for call in receive:
                try:
                    call.result = await call.fn(*call.args)
                except BaseException as exc:  # the caller's, raised in its thread
                    call.error = exc
                finally:
                    call.done.set()
            nursery.cancel_scope.cancel()  # closed: what still runs in the background ends with the loop
