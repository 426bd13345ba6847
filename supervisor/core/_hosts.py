"""The operator's view of the fleet's hosts, and the operator's word that a host will never come back (ADR 0012)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..domain import HostNotFound
from ..observe import get_logger
from ._boot import Boot
from ._fleet import host_view
from ._monitor import Monitors

log = get_logger()

# How a job of a host the operator forgot ends (then resubmitted under the crash rules while attempts remain).
ORPHAN_HOST_FORGOTTEN = "orphan_host_forgotten"


class HostAdmin:
    """``GET /api/hosts`` and ``POST /api/hosts/{id}/forget`` on the core's side, and this boot's own forgetting."""

    def __init__(self, boot: Boot, monitors: Monitors, wake_drainer: Callable[[], None]) -> None:
        self.boot = boot
        self.monitors = monitors
        self.wake_drainer = wake_drainer

    async def view(self) -> dict[str, Any]:
        """Every host of the fleet, live or silent, and which leads."""
        hosts = await self.boot.registry.hosts()
        leader = await self.boot.registry.leader()
        live_leader = leader.host_id if leader is not None and leader.live else None
        return {"hosts": [host_view(h, leader) for h in hosts], "leader": live_leader}

    async def forget(self, host_id: str) -> dict[str, Any]:
        """Host ``host_id`` will never come back: its running jobs end ``orphan_host_forgotten`` (resubmitted under
        the crash rules while attempts remain), their slots are freed, its row goes. The registry refuses a host
        whose lease is live (a ``Conflict``: it may be running them; stop it first)."""
        # INV-FORGET-IS-FENCED: the lease's check and the fence on its boot are one registry step (a Conflict while
        # its lease is live); from then on that boot can renew nothing, so it can no longer come back between the
        # check and the rows' ends and find its running jobs ended under it.
        forgotten = await self.boot.registry.forget_host(host_id)
        rows = [job for job in await self.boot.registry.running_jobs() if job.host_id == host_id]
        if forgotten is None and not rows:
            raise HostNotFound(host_id)
        ended: list[str] = []
        for job in rows:
            # INV-UNKNOWN-KEEPS-SLOT ends here, by the operator's word (as Kubernetes frees a deleted node's pods).
            # Guarded by the row's identity: only the attempt read above is ended.
            if await self.monitors.finish(
                job, None, cancel_asked=job.cancel_requested, expect=job, orphan_reason=ORPHAN_HOST_FORGOTTEN
            ):
                ended.append(job.job_id)
        log.warning(
            "host_forgotten",
            host_id=host_id,
            boot_id=forgotten.boot_id if forgotten is not None else None,
            jobs_ended=len(ended),
        )
        self.wake_drainer()
        return {"host_id": host_id, "jobs_ended": ended}

    def this_boot_forgotten(self) -> None:
        """An operator forgot this boot (INV-FORGET-IS-FENCED): its rows were ended, perhaps resubmitted to run
        elsewhere. None is its own any more: stop every process it still watches (kill-and-resubmit is the only
        recovery verb); their rows' ends are refused by the identity guard, never recorded as this boot's."""
        for entry in self.boot.ledger.entries():
            entry.request_cancel()
