"""A Trio loop in a background thread, for sync code (hypothesis's stateful rules) that drives async code.

The loop stays open for the portal's whole life, so what lives on it between calls (a registry's connections; for
the PostgreSQL backend, asyncpg's pool under trio-asyncio, whose asyncio loop must not close between calls) keeps
living; each ``run`` is ``trio.from_thread.run`` into it, and its exception is re-raised in the caller's thread.
``around`` (optional) is an async context manager entered on the loop before the first call and left after the
last one: where a backend opens what must outlive every call (``trio_asyncio.open_loop()``).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from types import TracebackType
from typing import Any, TypeVar

import trio

T = TypeVar("T")

START_S = 30.0  # a backstop for a broken loop, never a timing assertion


class Portal:
    def __init__(self, around: Callable[[], AbstractAsyncContextManager[Any]] | None = None) -> None:
        self._around = around
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="registry-portal", daemon=True)

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
        """``await fn(*args)`` on the portal's loop; its result, or its exception raised here."""
        assert self._token is not None, "the portal is not open"
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            self._token = None
        self._thread.join(START_S)
        if self._thread.is_alive():
            raise RuntimeError("the portal's Trio loop never stopped")
        if self._error is not None:
            raise RuntimeError("the portal's Trio loop failed") from self._error

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()  # also when it failed before it was ready: the opener must not wait in vain

    async def _serve(self) -> None:
        self._stop = trio.Event()
        around = self._around() if self._around is not None else nullcontext()
        async with around:
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
