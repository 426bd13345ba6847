"""The sweeper: reconcile -> drain every ``sweep_interval_s``, and once immediately at startup.

Order matters: freeing a ghost slot (reconcile) is what makes a promotion (drain) possible in the wedged case.
The startup sweep matters as much as the loop: a restart is precisely when ghost rows exist.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio

from .observe._logging import get_logger

log = get_logger()


class Sweepable(Protocol):
    async def sweep(self) -> None: ...


async def run_sweeper(target: Sweepable, interval_s: float, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Sweep once, report started, then sweep every ``interval_s``. A sweep that raises never ends the loop."""
    await _sweep_logged(target)
    task_status.started()
    while True:
        await trio.sleep(interval_s)
        await _sweep_logged(target)


async def _sweep_logged(target: Sweepable) -> None:
    try:
        await target.sweep()
    except Exception:
        log.exception("sweep_failed")
