"""``Doorbell``: a wake-up for one waiting task that is never lost and never replaced.

Several tasks of the supervisor sleep until something changes (the drainer until a job is enqueued or ends, the
webhook sender until an event is written, the fleet's timekeeper until a renewal). They used to wait on a
``trio.Event`` and replace it once awake; that is correct only while the waiter alone replaces it, right after it
woke. A replacement by any other task (a reader that flushed the heartbeats did exactly that) leaves the waiter on
an event that nobody will set again: the heartbeat writer stopped that way (ADR 0019). Here the state is one flag,
set by ``ring`` and taken by ``wait`` with no checkpoint between its look and its park, so no ring can fall between.
"""

from __future__ import annotations

import trio


class Doorbell:
    """``ring()`` from any task, never blocking; one task ``wait()``s. A ring while nobody waits is kept for the next
    ``wait`` (which then returns at once); rings before the waiter runs again are one. A ``wait`` that is cancelled
    takes nothing: a ring it missed is still there for the next."""

    def __init__(self) -> None:
        self._rung = False
        self._lot = trio.lowlevel.ParkingLot()

    @property
    def rung(self) -> bool:
        return self._rung

    def ring(self) -> None:
        self._rung = True
        self._lot.unpark_all()

    async def wait(self) -> None:
        """Return once rung since the last ``wait`` returned (at once, after a checkpoint, if it was already); the
        ring is taken."""
        if self._rung:
            await trio.lowlevel.checkpoint()
        else:
            await self._lot.park()
        self._rung = False

    def discard(self) -> None:
        """Forget a ring not yet taken. For the waiter's owner, before its waiter starts (a ring made while setting
        up that the first wait must not see); never while a task waits."""
        self._rung = False
