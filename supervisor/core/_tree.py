"""The root of a boot's job nursery (``run_job_nursery``): the first task ``Supervisor.start`` starts, the nursery
that owns every monitor and whatever the executor runs."""

from __future__ import annotations

from typing import Any

import trio


async def run_job_nursery(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Own every monitor. Cancelled last at shutdown; cancelling a monitor never kills its job."""
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep_forever()
