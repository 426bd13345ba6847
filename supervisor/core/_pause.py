"""The operator's pause file (ADR 0001 §7), mirrored into the registry's pause.

The registry holds the pause (``Registry.set_paused``): the API pauses and resumes there, and a promotion reads it in
its own atomic step. The file ``<data>/.viewer/jobs.paused`` stays what it always was, an operator's switch that needs
no API: while it exists, promotion is paused (by the file); once it is removed, a pause that the file made ends. A
pause made through the API is never ended by the file's removal.

The drainer looks before **every** promotion (``look``), and again once the promotion is written, before anything
starts (a file that appeared in between sends the promoted rows back to the queue), so the file holds every job that
was not yet started when it appeared: a corpus repair run as a plain command can ``touch`` it and start at once
(ADR-152 §7; docs/operations.md § Pausing -- a look at most once a second let a job be promoted after the ``touch``
returned). The file's presence holds this host's promotion by itself, whatever the registry says or whether the mirror
could be written. On a fleet every host looks at the file in its own data dir before each of its promotions, so a file
holds its own host exactly (its corpus is that host's: data dirs are never shared); the other hosts are held from the
moment the mirror commits, which is this host's next look (its next promotion round, or sweep), and read in each of
their promotions' own registry step. The sweeper looks at every sweep too. A look is one ``stat`` in a worker thread
(two thread hops per round that promotes: tens of microseconds each); the registry is written only when the file
appeared or went since the last look."""

from __future__ import annotations

from pathlib import Path

import trio

from ..domain import Conflict, SupervisorError
from ..observe import get_logger
from ..registry import PAUSED_BY_FILE
from ._boot import Boot, log_failure

log = get_logger()


class PauseFile:
    def __init__(self, boot: Boot) -> None:
        """The boot's config's ``pause_flag_path``, mirrored into its registry."""
        self.boot = boot
        # A fleet shares the pause but not the data dir: the pause records whose file made it, and only that host's
        # file ends it (another host, starting without a file of its own, must not undo it). ADR 0012.
        self.by = f"{PAUSED_BY_FILE}:{boot.host_id}"
        self._seen: bool | None = None  # whether the file existed at the last look (None: not looked yet)
        self._lock = trio.Lock()

    @property
    def path(self) -> Path:
        return self.boot.config.pause_flag_path

    async def look(self) -> bool:
        """Whether the file exists now, its appearance or removal mirrored into the registry. Its presence holds
        promotion whatever the mirror did: a mirror that fails is logged (``pause_file_not_mirrored``), not raised."""
        exists = await trio.to_thread.run_sync(self.path.exists)
        try:
            await self._mirror(exists)
        except SupervisorError:
            log_failure("pause_file_not_mirrored", path=str(self.path))
        return exists

    async def mirror(self) -> None:
        """Look at the file and mirror it (the sweeper's look; a failure to write the mirror is raised)."""
        await self._mirror(await trio.to_thread.run_sync(self.path.exists))

    async def _mirror(self, exists: bool) -> None:
        async with self._lock:  # the drainer and the sweeper may look at once: one of them writes
            if exists == self._seen:
                return
            if exists:
                state = await self.boot.registry.set_paused(True, by=self.by)
                if state.by == self.by:
                    log.warning("queue_paused", by=self.by, flag=str(self.path))
            else:
                state = await self.boot.registry.pause_state()
                # PAUSED_BY_FILE alone: a pause recorded before hosts were, which any host's file ended.
                if state.paused and state.by in (self.by, PAUSED_BY_FILE):
                    await self.boot.registry.set_paused(False, by=self.by)
                    log.info("queue_resumed", by=self.by, flag=str(self.path))
            self._seen = exists

    def forget(self) -> None:
        """Mirror again at the next look (after an API resume removed the file, or a pause made through it)."""
        self._seen = None

    async def remove(self) -> None:
        """An operator's resume: the file goes (it would pause again), and is mirrored again at the next look. One
        this process may not remove (a directory made by hand, a file of another owner) is a ``Conflict`` naming
        it: the queue stays paused by it, and the operator is told what holds it (a 409, never a 500)."""
        try:
            await trio.to_thread.run_sync(lambda: self.path.unlink(missing_ok=True))
        except (IsADirectoryError, PermissionError) as exc:
            raise Conflict(f"the pause flag {self.path} cannot be removed ({exc.strerror}): remove it by hand") from exc
        self.forget()
