"""The fleet task: this host's lease on the registry, and the fleet's one leader (ADR 0012).

Every supervisor registers ``(host_id, boot_id)`` and renews its lease every third of ``host_lease_s``. The lease
renewal also asks for the lead; the registry gives it only when nobody holds it or its holder's lease expired, in the
same atomic step (INV-ONE-LEADER). The leader runs what must run once for the fleet (the webhook sender, to keep
delivery order; the watch over silent hosts); every host drains and monitors its own jobs.

A leader that cannot renew stops acting as one **before** its lease can expire: ``leading`` is true only until the
monotonic time of the last renewal's request plus the lease minus a margin. The registry counted the lease from its
commit, which came after that request, so by the time another host may take the lead this one has let go.

Promotion is gated the same way (INV-NO-PROMOTION-WITHOUT-LEASE): a host promotes only while its lease is fresh --
until the monotonic time of its last successful renewal's request plus the lease minus the margin -- whether it
leads or not. A host whose lease may have expired may be forgotten by an operator (its rows ended, resubmitted
elsewhere); a job it started then would be a second run. A task of the fleet wakes at each of those moments, so
that a step-down (``fleet_leader_stepped_down``) and a stale lease (``host_lease_stale``) are said when they
happen, not at the next renewal's failure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import trio

from ..domain import Doorbell, HostForgotten, SupervisorError, to_iso
from ..observe import get_logger
from ..registry import Host, Lease
from ._boot import Boot, boundary, log_failure
from ._ports import ForgetListener, LeaseListener, SilentHostJudge

log = get_logger()

# A leader lets go this share of the lease before it could expire (clock rates differ; a renewal takes time).
LEAD_MARGIN = 0.2


class Fleet:
    def __init__(
        self,
        boot: Boot,
        *,
        drainer: LeaseListener,
        hosts: ForgetListener,
        silent_jobs: SilentHostJudge,
        succeeds: str | None = None,
    ) -> None:
        """The fleet task of ``boot``: it alone writes ``boot.standing`` (a standalone boot runs none). ``drainer``:
        told when the lease is fresh again after it was not (promotion may resume: ``Drainer.lease_renewed``).
        ``hosts``: told once when the registry says an operator forgot this boot (its processes are to be stopped:
        ``HostAdmin.this_boot_forgotten``). ``silent_jobs``: the leader's judge of silent hosts' rows on the ground
        truth this host can reach (``SilentHostJobs.end_by_proof``). ``succeeds``: this host's previous boot, proved
        gone by the data dir's lock (``_succession``): its lease and lead are taken at once."""
        self.boot = boot
        self.succeeds = succeeds
        self._silent_hosts_judge = silent_jobs
        self._drainer = drainer
        self._hosts = hosts
        self.forgotten = False
        self._was_leading = False
        self._was_fresh = False
        self._went_stale = False  # said stale, not yet renewed since
        self._renewed = Doorbell()  # rung at each successful renewal: the standing's deadlines moved
        self._silent_hosts: set[str] = set()  # hosts said silent (one ERROR per silence)
        # monotonic: the request of the first renewal since this boot began or its lease last went stale (None: stale)
        self._steady_since: float | None = None
        self.lease: Lease | None = None
        self._lead_renewed = Doorbell()  # rung by a renewal that kept the lead: the silent-host round's turn

    @property
    def _lease_s(self) -> float:
        return self.boot.config.host_lease_s

    def may_lead(self) -> bool:
        """Whether the fleet's once-only duties (the webhook sender, retention) may run here: when leading, or when
        standalone. Refused until the first renewal says so: a gate is never open by default."""
        return self.boot.standing.may_lead()

    def may_promote(self) -> bool:
        """Whether this host may promote now: its lease is fresh enough that it cannot have expired
        (INV-NO-PROMOTION-WITHOUT-LEASE), or it is standalone. Refused until the first renewal."""
        return self.boot.standing.may_promote()

    @property
    def fresh(self) -> bool:
        return self.boot.standing.fresh

    @property
    def leading(self) -> bool:
        """This host leads now (INV-ONE-LEADER)."""
        return self.boot.standing.leading

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Renew at once (so that the first sweep knows whether it leads), report started, then renew every third of
        the lease on a clock of its own; at a clean shutdown (cancelled), end the lease and the lead now.

        The renewals keep a fixed period (``trio.sleep_until``): nothing else runs between two of them, and each is
        bounded by a period, so two renewals' requests are at most about a period apart -- well inside the share of
        the lease a renewal keeps fresh -- however slowly the registry answers and whatever else the leader does.
        The leader's round over silent hosts runs in a task of its own after each renewal that kept the lead, bounded
        by a period too: a slow read there never pushes a renewal back (ADR 0014).

        Error boundary: a renewal that fails (the registry, a timeout) is logged and tried at the next tick; the
        freshness it would have given runs out, said by ``host_lease_stale``; the silent-host round is guarded the
        same way. A bug ends the supervisor."""
        if self.boot.standing.standalone:
            raise SupervisorError("a standalone supervisor runs no fleet task: it holds its registry alone")
        period_s = self._lease_s / 3
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._keep_time)
                first = trio.current_time()
                await self.renew()
                await self.settle_settings()
                self._lead_renewed.discard()  # the first round comes after the next renewal, a period from now
                await nursery.start(self._silent_host_rounds, period_s)
                task_status.started()
                tick = first
                while True:
                    # The next tick of the renewal's own clock; one missed (a renewal that took its whole period)
                    # is not made up with a burst: the next renewal starts at once, then the clock goes on from it.
                    tick = max(tick + period_s, trio.current_time())
                    await trio.sleep_until(tick)
                    await self.renew()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                try:
                    await self.boot.registry.release_lease(self.boot.host_id, self.boot.boot_id)
                except SupervisorError:
                    log_failure("host_lease_not_released", host_id=self.boot.host_id)

    async def _silent_host_rounds(self, period_s: float, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The leader's round over silent hosts, once after each renewal that kept the lead, each bounded by a
        renewal period (a slow read, a proof on a hung shared volume, never holds the next round past it)."""
        task_status.started()
        tally = self.boot.tally
        while True:
            await self._lead_renewed.wait()
            if not self.leading:
                continue
            with trio.move_on_after(period_s) as bound, boundary("silent_hosts_not_watched", tally):
                await self.sweep_silent_hosts()
            if bound.cancelled_caught:
                log.warning("silent_hosts_round_cut_short", within_s=round(period_s, 3))

    async def renew(self) -> None:
        asked = trio.current_time()
        try:
            with trio.fail_after(self._lease_s / 3):
                lease = await self.boot.registry.renew_lease(
                    self.boot.host_id, self.boot.boot_id, lease_s=self._lease_s, lead=True, succeeds=self.succeeds
                )
        except HostForgotten as exc:
            self._forgotten(exc)
            return
        except trio.TooSlowError:
            # A hang (a partition): each failed renewal is a DEBUG line; host_lease_stale says the episode, on time.
            log.debug(
                "host_lease_not_renewed", host_id=self.boot.host_id, why=f"no answer within {self._lease_s / 3:g} s"
            )
            return
        except SupervisorError:
            log_failure("host_lease_not_renewed", host_id=self.boot.host_id, leading_until_s=self._left())
            return
        first = self.lease is None
        self.lease = lease
        if self._steady_since is None:
            self._steady_since = asked
        # INV-NO-PROMOTION-WITHOUT-LEASE, INV-ONE-LEADER: counted from the request, before the registry's commit.
        self.boot.standing.renewed(asked + self._lease_s * (1 - LEAD_MARGIN), leading=lease.leading)
        if lease.leading:
            self._lead_renewed.ring()
        self._renewed.ring()
        self._note_drained(lease.drained)
        self._note_leading()
        self._note_fresh()
        if first:
            self._say_whom_it_replaced(lease)

    def _forgotten(self, exc: HostForgotten) -> None:
        # INV-FORGET-IS-FENCED: never a lease again for this boot, so never a promotion or a lead; its jobs' rows
        # were ended by the operator's forget and may run elsewhere now.
        if self.forgotten:
            return
        self.forgotten = True
        log.error(
            "host_forgotten_by_operator",
            host_id=self.boot.host_id,
            boot_id=self.boot.boot_id,
            error=str(exc),
            done="its running jobs are being stopped: their rows were ended (and resubmitted where attempts "
            "remain) and are not this boot's any more",
            fix="restart this supervisor to register a new boot; retry (kill-and-resubmit) what must run",
        )
        self._hosts.this_boot_forgotten()

    def _say_whom_it_replaced(self, lease: Lease) -> None:
        """This boot's first lease, taken over from a previous boot of this host id: its own predecessor, or a live
        one (a crash, or two supervisors with one host id)."""
        if lease.replaced is not None and lease.replaced.boot_id == self.succeeds:
            log.info(
                "host_restarted",
                host_id=self.boot.host_id,
                boot_id=self.boot.boot_id,
                previous_boot_id=self.succeeds,
                leading=lease.leading,
                why="its previous boot on this data dir is gone (the data dir's lock was free): its lease and lead "
                "are taken at once",
            )
        elif lease.replaced is not None and lease.replaced.live:
            # A restart after a crash looks the same as a second machine given this host id: say which it may be.
            log.warning(
                "host_id_taken_over",
                host_id=self.boot.host_id,
                previous_boot_id=lease.replaced.boot_id,
                why="its lease had not expired: a restart after a crash, or two supervisors with one host id",
            )

    async def settle_settings(self) -> None:
        """The settings a fleet must share, recorded by the first host and compared by the others: the fleet-wide
        limit (``settle_max_concurrent``) and the kinds (``settle_kinds``). A host that starts while no other host's
        lease is live records its own (how an operator changes them: restart the fleet with the new ones)."""
        try:
            alone = not any(h.live and h.host_id != self.boot.host_id for h in await self.boot.registry.hosts())
        except SupervisorError:
            log_failure("fleet_setting_not_settled", setting="max_concurrent and kinds")
            return
        await self.settle_max_concurrent(alone)
        await self.settle_kinds(alone)

    async def settle_kinds(self, alone: bool) -> None:
        """The kinds must be the same on every host: a job's argv is made by the host that enqueues it, and its end
        judged (its resubmissions, its follow-up) by the host that runs it. A host whose kinds differ from the
        fleet's says so loudly at start, and keeps its own (there is no fleet copy of a kinds file to use)."""
        mine = self.boot.kinds.fingerprint()
        try:
            setting = await self.boot.registry.record_setting("kinds", mine, self.boot.host_id, replace=alone)
        except SupervisorError:
            log_failure("fleet_setting_not_settled", setting="kinds")
            return
        if setting.value != mine:
            log.error(
                "fleet_setting_disagrees",
                setting="PODCAST_JOB_KINDS_FILE",
                here=mine,
                fleet=setting.value,
                recorded_by=setting.host_id,
                recorded_at=to_iso(setting.recorded_at),
                used="this host's own kinds",
                fix="give every host the same kinds file (and restart the fleet when it changes): a job's command is "
                "made where it was enqueued, and its resubmissions and follow-up decided where it ran",
            )

    async def settle_max_concurrent(self, alone: bool) -> None:
        """The fleet-wide limit must be one value: the first recorded wins, and a host that disagrees says so loudly
        and promotes under the fleet's."""
        mine = self.boot.config.max_concurrent
        try:
            setting = await self.boot.registry.record_setting(
                "max_concurrent", str(mine), self.boot.host_id, replace=alone
            )
        except SupervisorError:
            log_failure("fleet_setting_not_settled", setting="max_concurrent")
            return
        fleet = int(setting.value)
        if fleet != mine:
            log.error(
                "fleet_setting_disagrees",
                setting="PODCAST_JOB_MAX_CONCURRENT",
                here=mine,
                fleet=fleet,
                recorded_by=setting.host_id,
                recorded_at=to_iso(setting.recorded_at),
                used=fleet,
                fix="give every host the same value, or restart the whole fleet with the new one",
            )
            self.boot.standing.settle_limit(fleet)
        else:
            self.boot.standing.settle_limit(None)

    def _left(self) -> float:
        lead_until = self.boot.standing.lead_until
        return max(0.0, round(lead_until - trio.current_time(), 3)) if lead_until > -math.inf else 0.0

    async def _keep_time(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Wake when the lead or the lease's freshness runs out (or a renewal moves them): say it then."""
        task_status.started()
        while True:
            now = trio.current_time()
            upcoming = [at for at in (self.boot.standing.lead_until, self.boot.standing.fresh_until) if at > now]
            with trio.move_on_at(min(upcoming, default=math.inf)):
                await self._renewed.wait()
            self._note_leading()
            self._note_fresh()

    def _note_fresh(self) -> None:
        now = self.fresh
        if self._was_fresh and not now:
            log.warning(
                "host_lease_stale",
                host_id=self.boot.host_id,
                why="the lease could not be renewed in time: no job is promoted here until it is",
            )
            self._went_stale = True
            self._steady_since = None
        elif now and not self._was_fresh:
            if self._went_stale:
                log.info("host_lease_renewed", host_id=self.boot.host_id, promotion="resumed")
                self._went_stale = False
            self._drainer.lease_renewed()  # the queue may have waited for this host
        self._was_fresh = now

    def _note_drained(self, drained: bool) -> None:
        """An operator drained or undrained this host (docs/fleet.md § Draining a host): said once per change."""
        if drained and not self.boot.standing.drained:
            log.warning(
                "host_draining",
                host_id=self.boot.host_id,
                running_jobs=len(self.boot.ledger.entries()),
                why="an operator drained this host: nothing new starts here, its running jobs run to their end, the "
                "lead goes to another host; supervisor hosts undrain ends it",
            )
        elif self.boot.standing.drained and not drained:
            log.info("host_undrained", host_id=self.boot.host_id, promotion="resumed")
            self._drainer.lease_renewed()  # the queue may have waited for this host
        self.boot.standing.drained = drained

    def _note_leading(self) -> None:
        now = self.leading
        if now and not self._was_leading:
            log.info("fleet_leader", host_id=self.boot.host_id, boot_id=self.boot.boot_id, lease_s=self._lease_s)
        elif self._was_leading and not now and self.boot.standing.drained and self.fresh:
            log.info("fleet_leader_handed_over", host_id=self.boot.host_id, why="this host is drained")
        elif self._was_leading and not now:
            log.warning(
                "fleet_leader_stepped_down", host_id=self.boot.host_id, why="the lease could not be renewed in time"
            )
        self._was_leading = now

    async def sweep_silent_hosts(self) -> None:
        """The leader's round over silent hosts (hosts whose lease expired while they have running rows): the rows
        whose end this host can prove are ended with their true outcome (``end_by_proof``,
        INV-SILENT-HOST-ENDS-BY-PROOF: each end is checked against the host's lease again in its own registry step);
        the rest stay as they are, and each silent host is named once (``watch_silent_hosts``)."""
        if not self.leading:
            return
        rows = await self.boot.registry.running_jobs()
        hosts = {host.host_id: host for host in await self.boot.registry.hosts()}
        silent = self._silent(hosts, {job.host_id for job in rows if job.host_id is not None})
        if silent and self.leading:
            ended = set(
                await self._silent_hosts_judge.end_by_proof(
                    [job for job in rows if job.host_id in silent], lambda: self.leading
                )
            )
            rows = [job for job in rows if job.job_id not in ended]
            # The proofs took their time (up to a renewal period): silence is named on a read made after them, so
            # that a host that renewed meanwhile is never called silent.
            hosts = {host.host_id: host for host in await self.boot.registry.hosts()}
        remaining: dict[str, int] = {}
        for job in rows:
            if job.host_id is not None:
                remaining[job.host_id] = remaining.get(job.host_id, 0) + 1
        if self.leading:
            self._name_silent(hosts, set(remaining), remaining)

    def _silent(self, hosts: Mapping[str, Host], running_host_ids: set[str]) -> set[str]:
        """The hosts among ``running_host_ids`` whose lease has expired (or who have no row any more), judged at the
        registry's clock as of its read (INV-LEASE-ON-REGISTRY-CLOCK: never this host's own clock)."""
        return {
            host_id
            for host_id in running_host_ids
            if host_id != self.boot.host_id and (host_id not in hosts or not hosts[host_id].live)
        }

    async def watch_silent_hosts(self, running_host_ids: set[str], running: Mapping[str, int] | None = None) -> None:
        """The leader's watch: a host whose lease expired while it has running jobs is silent. Its jobs that no
        proof ended stay as they are (INV-UNKNOWN-KEEPS-SLOT: nobody here can see its processes) until it comes back
        or the operator forgets it; one ERROR per silence, naming the host (``running``: its running rows, by host)."""
        if not self.leading:
            return
        self._name_silent({host.host_id: host for host in await self.boot.registry.hosts()}, running_host_ids, running)

    def _name_silent(
        self, hosts: Mapping[str, Host], running_host_ids: set[str], running: Mapping[str, int] | None
    ) -> None:
        # Only once this host has renewed without a break for a whole lease: after a database outage (or this boot's
        # start) the others' leases expired for the same reason this one's went stale, and each needs a renewal
        # period to renew. Judged sooner, every live host was named silent by the first to lead again.
        if self._steady_since is None or trio.current_time() - self._steady_since < self._lease_s:
            return
        silent = self._silent(hosts, running_host_ids)
        for host_id in sorted(silent - self._silent_hosts):
            host = hosts.get(host_id)
            log.error(
                "host_silent",
                host_id=host_id,
                lease_expired_at=host.lease_expires_at.isoformat() if host is not None else None,
                running_jobs=running.get(host_id) if running is not None else None,
                kept="its running jobs keep their slots until it comes back, a proof of their end is found here, or "
                "an operator forgets it",
                forget=f"POST /api/hosts/{host_id}/forget (supervisor hosts forget {host_id})",
            )
        for host_id in sorted(self._silent_hosts - silent):
            log.info("host_back", host_id=host_id)
        self._silent_hosts = silent


def host_view(host: Host, leader: Host | None, running: int = 0, drained: bool = False) -> dict[str, Any]:
    """One host as the API lists it: ``drain`` is None (not drained), ``draining`` (drained, still running jobs or
    leading) or ``drained`` (it holds nothing: it may be stopped)."""
    leads = leader is not None and leader.live and (leader.host_id, leader.boot_id) == (host.host_id, host.boot_id)
    return {
        "release": host.release,
        "contract_level": host.contract_level,
        "running_jobs": running,
        "drain": None if not drained else "draining" if running or leads else "drained",
        "host_id": host.host_id,
        "boot_id": host.boot_id,
        "started_at": to_iso(host.started_at),
        "last_seen_at": to_iso(host.last_seen_at),
        "lease_expires_at": to_iso(host.lease_expires_at),
        "live": host.live,
        "leader": leader is not None and (leader.host_id, leader.boot_id) == (host.host_id, host.boot_id),
    }
