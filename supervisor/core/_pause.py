"""The operator's pause file (ADR 0001 §7), mirrored into the registry's pause.

The registry holds the pause (``Registry.set_paused``): the API pauses and resumes there, and a promotion reads it in
its own atomic step. The file ``<data>/.viewer/jobs.paused`` stays what it always was, an operator's switch that needs
no API: while it exists, promotion is paused (by the file); once it is removed, a pause that the file made ends. A
pause made through the API is never ended by the file's removal.

The drainer looks before a promotion round (at most once per ``LOOK_EVERY_S``: under load rounds come by hundreds a
second, and each look is a thread hop) and the sweeper at every sweep, so touching the file holds promotion within a
second. A look is one ``stat`` in a worker thread; the registry is written only when the file appeared or went since
the last look.
"""

from __future__ import annotations

import math
from pathlib import Path

import trio

from ..observe import get_logger
from ..registry import PAUSED_BY_FILE, Registry

log = get_logger()

LOOK_EVERY_S = 1.0  # the drainer's looks, at most: the file holds promotion within this


class PauseFile:
    def __init__(self, path: Path, registry: Registry, host_id: str | None = None) -> None:
        self.path = path
        self._registry = registry
        # A fleet shares the pause but not the data dir: the pause records whose file made it, and only that host's
        # file ends it (another host, starting without a file of its own, must not undo it). ADR 0012.
        self.by = PAUSED_BY_FILE if host_id is None else f"{PAUSED_BY_FILE}:{host_id}"
        self._seen: bool | None = None  # whether the file existed at the last look (None: not looked yet)
        self._looked_at = -math.inf  # trio.current_time() of the last look
        self._lock = trio.Lock()

    async def mirror(self, *, at_most_every_s: float = 0.0) -> None:
        """Look at the file and mirror it; with ``at_most_every_s``, not if the last look is more recent."""
        if trio.current_time() - self._looked_at < at_most_every_s:
            return
        async with self._lock:  # the drainer and the sweeper may look at once: one of them writes
            self._looked_at = trio.current_time()
            exists = await trio.to_thread.run_sync(self.path.exists)
            if exists == self._seen:
                return
            if exists:
                state = await self._registry.set_paused(True, by=self.by)
                if state.by == self.by:
                    log.warning("queue_paused", by=self.by, flag=str(self.path))
            else:
                state = await self._registry.pause_state()
                # PAUSED_BY_FILE alone: a pause recorded before hosts were, which any host's file ended.
                if state.paused and state.by in (self.by, PAUSED_BY_FILE):
                    await self._registry.set_paused(False, by=self.by)
                    log.info("queue_resumed", by=self.by, flag=str(self.path))
            self._seen = exists

    def forget(self) -> None:
        """Look again at the next mirror (after an API resume removed the file, or a pause made through it)."""
        self._seen = None
        self._looked_at = -math.inf
