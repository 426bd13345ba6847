"""The wake-up listener: what another host of the fleet changed, heard at once instead of at the next sweep (ADR
0012 §7).

The registry gives a session of wake-ups (``Registry.listen``; PostgreSQL's LISTEN/NOTIFY; None for a registry one
process owns, which has nothing to hear). This task, in the root nursery, acts on them:

- something queued, or slots freed by a forget: wake the drainer (a job enqueued through a full host is started by a
  host with a free slot now, not at that host's next sweep);
- a cancel requested on a running job this host owns: carried out now, by the path the sweep takes (the job's
  monitor stops it; a prior boot's job is adopted, then stopped); the row still ends ``cancelled`` only once the
  process is gone;
- the pause set or cleared: the pause is read again, and a resume wakes the drainer.

INV-NOTIFY-IS-A-HINT: a wake-up decides nothing. What is acted on is read again from the registry (the row, the
pause), and the periodic sweep does all of this anyway, so a wake-up that is lost (this host was not listening at
that moment, the session dropped, the reader fell behind) only delays. The session is checked with a cheap round
trip when nothing was heard for ``check_every_s`` (a partition hangs without an error); a lost one is said once
(WARNING), opened again with backoff, and said once when back (INFO), after which whatever may have been missed
meanwhile is looked at once. The supervisor never stops for it.
"""

from __future__ import annotations

from typing import Any

import trio

from ..domain import JobStatus, RegistryError, SupervisorError
from ..observe import get_logger
from ..registry import WAKE_CANCEL, WAKE_FREED, WAKE_PAUSE, WAKE_QUEUED, Wakeup, WakeupFeed
from ._boot import Boot, log_failure
from ._monitor import Monitors
from ._ports import DrainBell

log = get_logger()

CHECK_EVERY_S = 5.0  # a listening session that heard nothing for this long is asked a cheap question
RECONNECT_MIN_S = 0.5  # a lost session is opened again after this, doubling up to RECONNECT_MAX_S
# Each try is one connection attempt: cheap against a server that refuses it. A longer cap only made the session come
# back late after a database restart (by up to the cap, 30 s it was), while the sweep did the wake-ups' work.
RECONNECT_MAX_S = 5.0
MAX_BATCH = 256  # wake-ups acted on together (coalesced: one drainer wake, one pause read, each cancel once)


class WakeupListener:
    """See the module docstring. ``drain_bell``: ask for a promotion round; ``monitors``: how a cancel is carried
    out."""

    def __init__(
        self,
        boot: Boot,
        drain_bell: DrainBell,
        monitors: Monitors,
        *,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self.boot = boot
        self._drain_bell = drain_bell
        self.monitors = monitors
        self.check_every_s = check_every_s
        self.listening = False  # a session is open now (False too for a registry that has nothing to hear)
        self.losses = 0  # sessions lost (or never opened) since this boot began

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, reconnecting with backoff, until cancelled. Reports started once the first session is open, or
        failed to open (never holds the start-up back: the sweep is the guarantee), or at once when there is
        nothing to hear. Start it before the startup sweep: what is changed after the session opens is heard, what
        was changed before is read by the sweep."""
        reported = False
        delay_s = RECONNECT_MIN_S
        lost_at: float | None = None
        while True:
            try:
                async with self.boot.registry.listen() as feed:
                    if feed is None:
                        task_status.started()
                        return
                    self.listening = True
                    if not reported:
                        task_status.started()
                        reported = True
                    if lost_at is not None:
                        log.info("wakeups_back", down_s=round(trio.current_time() - lost_at, 3))
                        lost_at = None
                        await self._catch_up()  # what was said while nobody here listened
                    delay_s = RECONNECT_MIN_S
                    await self._serve(feed)
            except RegistryError as exc:
                self.listening = False
                if lost_at is None:
                    self.losses += 1
                    lost_at = trio.current_time()
                    log.warning(
                        "wakeups_lost",
                        error=str(exc),
                        meanwhile=f"the sweep (every {self.boot.config.sweep_interval_s:g} s) does their work",
                    )
                if not reported:
                    task_status.started()
                    reported = True
                await trio.sleep(delay_s)
                delay_s = min(delay_s * 2, RECONNECT_MAX_S)
            finally:
                self.listening = False

    async def _serve(self, feed: WakeupFeed) -> None:
        """Act on the session's wake-ups until it is lost (``RegistryError`` from ``receive`` or ``check``)."""
        while True:
            wake: Wakeup | None = None
            with trio.move_on_after(self.check_every_s):
                wake = await feed.receive()
            if wake is None:
                await feed.check()  # nothing heard for a while: is anyone there?
                continue
            batch = [wake]
            while len(batch) < MAX_BATCH and (more := feed.receive_nowait()) is not None:
                batch.append(more)
            await self.act(batch)

    async def act(self, batch: list[Wakeup]) -> None:
        """Act on wake-ups heard together, each kind once. A registry that fails here is only a delay: the sweep
        does the same (never a lost session: that is the feed's to say)."""
        kinds = {wake.kind for wake in batch}
        if kinds & {WAKE_QUEUED, WAKE_FREED}:
            self._drain_bell.ring()
        try:
            if WAKE_PAUSE in kinds and not (await self.boot.registry.pause_state()).paused:
                self._drain_bell.ring()  # resumed: another host's resume wakes this host's drainer too
            mine = {
                wake.job_id
                for wake in batch
                if wake.kind == WAKE_CANCEL and wake.job_id is not None and wake.host_id in (None, self.boot.host_id)
            }
            for job_id in sorted(mine):
                await self._carry_out_cancel(job_id)
        except SupervisorError:
            log_failure("wakeup_not_acted_on", kinds=sorted(kinds))

    async def _carry_out_cancel(self, job_id: str) -> None:
        # INV-NOTIFY-IS-A-HINT: decided on the row as it is now, never on what the wake-up said.
        job = await self.boot.registry.get(job_id)
        if job.status is JobStatus.RUNNING and job.cancel_requested and self.boot.owns(job):
            await self.monitors.carry_out_requested_cancel(job)

    async def _catch_up(self) -> None:
        """After a lost session: whatever was queued meanwhile (a drain), and the cancels asked of this host's jobs."""
        self._drain_bell.ring()
        try:
            for job in await self.boot.registry.running_jobs():
                if job.cancel_requested and self.boot.owns(job):
                    await self.monitors.carry_out_requested_cancel(job)
        except SupervisorError:
            log_failure("wakeup_catch_up_failed")
