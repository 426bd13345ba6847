"""The operator's view of the fleet's hosts, and the operator's word that a host will never come back (ADR 0012)."""

from __future__ import annotations

from typing import Any

from ..domain import HostNotFound
from ..observe import get_logger
from ._boot import Boot
from ._fleet import host_view
from ._monitor import Monitors
from ._ports import DrainBell

log = get_logger()

# How a job of a host the operator forgot ends (then resubmitted under the crash rules while attempts remain).
ORPHAN_HOST_FORGOTTEN = "orphan_host_forgotten"


class HostAdmin:
    """``GET /api/hosts`` and ``POST /api/hosts/{id}/forget`` on the core's side, and this boot's own forgetting."""

    def __init__(self, boot: Boot, monitors: Monitors, drain_bell: DrainBell) -> None:
        self.boot = boot
        self.monitors = monitors
        self._drain_bell = drain_bell

    async def view(self) -> dict[str, Any]:
        """Every host of the fleet, live or silent, and which leads; each one's release, running jobs and drain."""
        registry = self.boot.registry
        hosts = await registry.hosts()
        leader = await registry.leader()
        drained = await registry.drained()
        running: dict[str, int] = {}
        for job in await registry.running_jobs():
            if job.host_id is not None:
                running[job.host_id] = running.get(job.host_id, 0) + 1
        live_leader = leader.host_id if leader is not None and leader.live else None
        return {
            "hosts": [host_view(h, leader, running.get(h.host_id, 0), h.host_id in drained) for h in hosts],
            "leader": live_leader,
        }

    async def drain(self, host_id: str, drained: bool, by: str | None) -> dict[str, Any]:
        """Drain ``host_id`` (it starts nothing new, its running jobs run to their end under its watch, it hands the
        lead over; ``drained`` in the view once it holds nothing) or undrain it. Nothing is failed or cancelled."""
        changed = await self.boot.registry.set_drained(host_id, drained, by=by)
        if changed:
            if drained:
                log.warning("host_drain_requested", host_id=host_id, by=by)
            else:
                log.warning("host_undrain_requested", host_id=host_id, by=by)
        if not drained:
            self._drain_bell.ring()  # this host's own promotion, when it is the one undrained
        [host] = [h for h in (await self.view())["hosts"] if h["host_id"] == host_id] or [None]
        return {"host_id": host_id, "changed": changed, "drain": host["drain"] if host is not None else None}

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
        self._drain_bell.ring()
        return {"host_id": host_id, "jobs_ended": ended}

    def this_boot_forgotten(self) -> None:
        """An operator forgot this boot (INV-FORGET-IS-FENCED): its rows were ended, perhaps resubmitted to run
        elsewhere. None is its own any more: stop every process it still watches (kill-and-resubmit is the only
        recovery verb); their rows' ends are refused by the identity guard, never recorded as this boot's."""
        for entry in self.boot.ledger.entries():
            entry.request_cancel()
