"""``SqliteRegistry``: the embedded default registry, the rules over one SQLite file (WAL); its transactions and
its SQL are ``_backend``'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import trio

from ...domain import utc_now
from .._registry import Registry
from ._backend import SqliteBackend
from ._file import BUSY_TIMEOUT_MS, DEFAULT_CONNECTIONS
from ._schema import CONTRACT_LEVEL


class SqliteRegistry(Registry):
    """Job rows in one SQLite file (its transactions: ``_backend``). ``boot_id``, ``outbox``: as ``Registry``'s;
    ``clock``: the wall clock of every timestamp (and of the leases: one machine's file)."""

    contract_level = CONTRACT_LEVEL

    def __init__(
        self,
        path: Path,
        *,
        boot_id: str | None = None,
        outbox: bool = True,
        clock: Callable[[], datetime] = utc_now,
        max_connections: int = DEFAULT_CONNECTIONS,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
    ) -> None:
        self.sqlite = SqliteBackend(path, clock=clock, max_connections=max_connections, busy_timeout_ms=busy_timeout_ms)
        super().__init__(self.sqlite, boot_id=boot_id, outbox=outbox)
        self.file = self.sqlite.file
        self.path = self.sqlite.path

    @classmethod
    async def open(cls, path: Path, **kwargs: Any) -> SqliteRegistry:
        """Open (and migrate) in a worker thread: the blocking part of starting up. It waits up to the busy timeout
        for a lock another process holds; a cancel (a stop asked for meanwhile) does not wait with it: the thread is
        left to finish on its own, and closes what it opened (``_Handoff``)."""
        handoff = _Handoff()

        def open_and_hand_over() -> SqliteRegistry:
            return handoff.deliver(cls(path, **kwargs))

        try:
            return await trio.to_thread.run_sync(open_and_hand_over, abandon_on_cancel=True)
        except trio.Cancelled:
            late = handoff.abandon()
            if late is not None:  # opened just as the cancel came: nobody else will close it
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(late.close)
            raise

    def close(self) -> None:
        """Close from blocking code (a test's teardown, a script)."""
        self.sqlite.closed = True
        self.file.close()


class _Handoff:
    """A registry opened in a thread the caller may abandon: whichever of the two comes second (the thread's
    ``deliver``, the caller's ``abandon``) knows the other came first, so what was opened is closed exactly once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._delivered: SqliteRegistry | None = None

    def deliver(self, registry: SqliteRegistry) -> SqliteRegistry:
        with self._lock:
            if not self._abandoned:
                self._delivered = registry
                return registry
        registry.close()  # nobody is waiting for it any more
        return registry

    def abandon(self) -> SqliteRegistry | None:
        """The caller gives up; what the thread delivered before that (None: nothing yet), for the caller to close."""
        with self._lock:
            self._abandoned = True
            late, self._delivered = self._delivered, None
        return late
