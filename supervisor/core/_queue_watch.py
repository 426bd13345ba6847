"""The queue's own watch (docs/operations.md § The queue's watch): whatever holds the queue, a metric and a log line say
so within minutes.

ADR-152 exists because a job sat queued for hours before anyone noticed; ADR-150 D9 names the failure: a human had to
go looking. Each job's own progress is watched (stalled, silent); this watches the queue itself, on this host:

- **signals**, read at every sweep (and at a scrape): how long the oldest job ready to run has waited, when this
  host last promoted one, and each reason promotion is held now and since when (``HOLD_REASONS``);
- **one rule**, judged at every sweep (``QueueRule``): the queue is *stuck* when, for longer than
  ``PODCAST_JOB_QUEUE_STUCK_SECONDS`` without a break, jobs have been waiting while a slot was free or promotion was
  held for any reason but a pause. A pause is held on purpose: jobs waiting behind one for longer than
  ``PODCAST_JOB_PAUSE_WARN_SECONDS`` is the same condition with the pause as its reason. A busy queue -- every slot
  running, jobs waiting -- is never stuck. The start and the end are each said once (``queue_stuck``, an ERROR;
  ``queue_moving``, INFO), and shown on ``/metrics`` (``podcast_queue_stuck``) and in ``/api/health``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import trio

from ..domain import SupervisorError, from_iso, to_iso
from ..observe import QueueGauges, get_logger
from ..registry import PAUSED_BY_OPERATOR, QUEUE_ANNOUNCED, SCHEDULE_TICK
from ._boot import Boot
from ._ports import OutboxSender, Promotions

log = get_logger()

# Where a missed schedule's announcement is recorded: the last tick it was announced for (once per tick).
SCHEDULE_MISSED = "schedule_missed/"
# Each reason this host's promotion can be held, and what an operator does about it (docs/operations.md).
HOLD_REASONS: dict[str, str] = {
    "pause_operator": "an operator paused the queue (API or CLI): `supervisor resume` ends it",
    "pause_file": "the pause file <data>/.viewer/jobs.paused exists (a corpus repair?): remove it when done",
    "engine_unreachable": "the executor's engine does not answer (Docker mode): bring the engine back",
    "registry_unwritable": "the registry cannot take writes (a full disk, a lock held elsewhere): free it",
    "lease_not_fresh": "this host's lease could not be renewed (the database unreachable?): nothing is promoted here",
    "host_drained": "an operator drained this host (supervisor hosts drain): `supervisor hosts undrain HOST` ends it",
}
PAUSES = frozenset({"pause_operator", "pause_file", "host_drained"})  # held on purpose
# Which reason a stuck queue names when several hold (docs/alerting.md § One fault, one page): the root cause first.
# A registry that cannot write is why a lease cannot be renewed (the renewal is a write), so a lock held elsewhere
# names the registry, never the lease it starves; the engine is a fault of its own; a pause is held on purpose.
ROOT_CAUSE_ORDER = (
    "registry_unwritable",
    "lease_not_fresh",
    "engine_unreachable",
    "pause_operator",
    "pause_file",
    "host_drained",
)
# A reason that follows from another while that other clears: a stuck queue keeps naming the cause (the lease is
# renewed a moment after the registry writes again) rather than page anew for its echo.
CONSEQUENCE_OF = {"lease_not_fresh": "registry_unwritable"}
# Jobs wait, a slot is free, and nothing holds promotion: the drainer should have promoted them.
NOT_PROMOTED = "slots_free_not_promoted"
NOT_PROMOTED_MEANS = "jobs wait while slots are free and nothing holds promotion: look at the log for the drainer"


@dataclass(frozen=True)
class Stuck:
    """The queue stuck: why, since when (wall clock), and the oldest waiting job's id and age then."""

    reason: str
    since: datetime
    oldest_job_id: str
    oldest_age_s: float
    free_slots: int


@dataclass
class QueueRule:
    """The stuck rule over the observations of successive sweeps (monotonic time ``now_s``; a wall ``now``)."""

    stuck_after_s: float
    pause_warn_after_s: float
    stuck: Stuck | None = None
    _since_s: float | None = None  # monotonic: since when the condition has held without a break
    _since: datetime | None = None  # the same moment, on the wall clock
    _held_since: dict[str, datetime] = field(default_factory=dict)

    def held_since(self) -> dict[str, datetime]:
        """Each reason holding promotion now, and since when (as first seen by a sweep of this boot)."""
        return dict(self._held_since)

    def observe(
        self,
        *,
        now_s: float,
        now: datetime,
        held: Iterable[str],
        oldest_job_id: str | None,
        oldest_age_s: float,
        free_slots: int,
    ) -> tuple[str, Stuck] | None:
        """One sweep's look: ``held`` reasons, the oldest waiting job (None: nothing waits) and the free slots.
        Returns ``("stuck", ...)`` when the queue has just become stuck, ``("moving", the stuck that ended)`` when it
        has just stopped being so, else None."""
        holding = set(held)
        for name in list(self._held_since):
            if name not in holding:
                del self._held_since[name]
        for name in holding:
            self._held_since.setdefault(name, now)
        reason = self._condition(holding, oldest_job_id is not None, free_slots)
        if reason is None:
            self._since_s = self._since = None
            if self.stuck is not None:
                ended, self.stuck = self.stuck, None
                return "moving", ended
            return None
        if self._since_s is None:
            self._since_s, self._since = now_s, now
        assert self._since is not None and oldest_job_id is not None
        limit = self.pause_warn_after_s if reason in PAUSES else self.stuck_after_s
        if self.stuck is None and now_s - self._since_s > limit:
            self.stuck = Stuck(reason, self._since, oldest_job_id, oldest_age_s, free_slots)
            return "stuck", self.stuck
        if self.stuck is not None and self.stuck.reason != reason and CONSEQUENCE_OF.get(reason) != self.stuck.reason:
            # Still stuck, for another reason now (the engine came back, the pause did not end): say it as it is.
            self.stuck = Stuck(reason, self.stuck.since, oldest_job_id, oldest_age_s, free_slots)
        return None

    @staticmethod
    def _condition(held: set[str], waiting: bool, free_slots: int) -> str | None:
        """Why the queue does not move (None: it moves, is busy, or nothing waits): the root cause of what holds it
        (``ROOT_CAUSE_ORDER``)."""
        if not waiting:
            return None
        for reason in ROOT_CAUSE_ORDER:
            if reason in held:
                return reason
        return NOT_PROMOTED if free_slots > 0 else None


@dataclass
class _Look:
    """The queue as one read of the registry found it (empty: not read yet)."""

    pauses: set[str] = field(default_factory=set)
    oldest_job_id: str | None = None
    ready_at: datetime | None = None
    free_slots: int = 0


@dataclass(frozen=True)
class KindLoad:
    """One kind's jobs running and queued, fleet-wide, and its ``max_running`` (None: no limit of its own)."""

    running: int
    queued: int
    max_running: int | None


@dataclass(frozen=True)
class QueueSignals:
    """The queue's signals as of one look (``GET /api/queue``, ``/metrics``)."""

    oldest_queued_age_s: float  # 0 when nothing waits
    last_promotion_at: datetime  # this host's last promotion, or its boot's start before any
    held: dict[str, datetime]  # each reason holding promotion now, since when
    stuck: Stuck | None


class QueueWatch:
    """Reads the queue's signals for this host and judges the rule at every sweep (``judge``); the error boundary is
    the sweeper's step ``queue_watch_failed`` (a registry that cannot be read is a condition, tried next sweep)."""

    def __init__(
        self,
        boot: Boot,
        drainer: Promotions,
        sender: OutboxSender,
    ) -> None:
        """``drainer``: why promotion is held and this host's last promotion; ``sender``: the webhook sender, woken
        when the watch writes an event (queue.stuck / queue.moving go through the outbox). The rule's thresholds are
        the boot's config's (``queue_stuck_s``, ``pause_warn_s``)."""
        self.boot = boot
        self._drainer = drainer
        self._sender = sender
        self.rule = QueueRule(boot.config.queue_stuck_s, boot.config.pause_warn_s)
        self.latest: QueueSignals | None = None
        self._restored = False  # the announced state read back (once per boot, at the first look)
        self._pending: tuple[str, Stuck] | None = None  # a start or end said, its webhook not yet written
        self._look = _Look()  # the queue as the registry last said it
        self.schedules_missed: dict[str, int] = {}  # each schedule: 1 while it misses its runs (the last judgement)

    def own_holds(self) -> set[str]:
        """The reasons this host knows without reading the registry: its drainer's holds and the registry's fault."""
        out = set(self._drainer.holds())
        if self.boot.registry.fault() is not None:
            out.add("registry_unwritable")
        return out

    async def look(self) -> _Look:
        """What the registry says of the queue now: the pause, the oldest waiting job, the free slots."""
        registry, out = self.boot.registry, _Look()
        pause = await registry.pause_state()
        if pause.paused:
            out.pauses.add("pause_operator" if pause.by == PAUSED_BY_OPERATOR else "pause_file")
        # A row of a kind at its max_running waits on its kind, not on the queue: busy, never stuck.
        oldest = await registry.oldest_waiting(self.boot.kinds.running_limits())
        running = await registry.running_jobs()
        free = self.boot.max_concurrent - len(running)
        cap = self.boot.config.host_max_concurrent
        if cap is not None:
            free = min(free, cap - sum(1 for job in running if job.host_id == self.boot.host_id))
        out.free_slots = max(0, free)
        if oldest is not None:
            out.oldest_job_id = oldest.job_id
            # How long it has been ready to run: since it was enqueued, or since its backoff ended (a resubmission).
            out.ready_at = max(oldest.created_at, oldest.next_attempt_at or oldest.created_at)
        return out

    async def judge(self) -> QueueSignals:
        """One look and the rule's verdict; the start and the end of a stuck queue are said once each."""
        registry, now = self.boot.registry, self.boot.wall_clock()
        if not self._restored:
            # What an earlier boot of this host announced: a stuck queue that still holds is not announced twice.
            recorded = await registry.setting(f"{QUEUE_ANNOUNCED}{self.boot.host_id}")
            self.rule.stuck = _parse_stuck(recorded.value) if recorded is not None else None
            self._restored = True
        try:
            self._look = await self.look()
            unread = None
        except SupervisorError as exc:
            # The registry cannot be read (a host cut off from its database): judged on what needs no read -- this
            # host's own holds, a stale lease among them -- and the queue as last read; the step still fails after.
            unread = exc
        look = self._look
        held = self.own_holds() | look.pauses
        waited = (now - look.ready_at).total_seconds() if look.ready_at is not None else 0.0
        change = self.rule.observe(
            now_s=trio.current_time(),
            now=now,
            held=held,
            oldest_job_id=look.oldest_job_id,
            oldest_age_s=max(0.0, waited),
            free_slots=look.free_slots,
        )
        if change is not None:
            what, stuck = change
            fields = {"reason": stuck.reason, "since": stuck.since.isoformat(), "host_id": self.boot.host_id}
            if what == "stuck":
                log.error(
                    "queue_stuck",
                    **fields,
                    oldest_job_id=stuck.oldest_job_id,
                    oldest_age_s=round(stuck.oldest_age_s, 3),
                    free_slots=stuck.free_slots,
                    meaning=HOLD_REASONS.get(stuck.reason, NOT_PROMOTED_MEANS),
                )
            else:
                log.info("queue_moving", **fields)
            # A stuck queue that began and ended before its start could be written is announced not at all.
            moot = what == "moving" and self._pending is not None and self._pending[0] == "stuck"
            self._pending = None if moot else (what, stuck)
        # The signals first: they stand whether or not the webhook below can be written now.
        self.latest = QueueSignals(
            max(0.0, waited), self._drainer.last_promotion_at, self.rule.held_since(), self.rule.stuck
        )
        if unread is not None:
            raise unread
        if self._pending is not None:
            # Written when the registry takes it: a full disk holds the webhook (the log, the metric and the health
            # said it at once), never drops it; one that fails is tried again at the next sweep.
            what, stuck = self._pending
            await self._announce(what, stuck, now)
            self._pending = None
        return self.latest

    async def judge_schedules(self) -> None:
        """A schedule whose last tick -- a job made, or a tick skipped, coalesced or replayed: each proves the timer
        fires (INV-EVERY-TICK-COUNTS) -- is older than twice its period missed its runs (a timer that stopped, a host
        that is down): a log line, a metric and one webhook, once per last tick. The leader's duty alone (one
        announcement for the fleet)."""
        if not self.boot.standing.may_lead():
            return
        registry, now = self.boot.registry, self.boot.wall_clock()
        missed: dict[str, int] = {}
        for name, (created, every_s, job_id) in (await registry.newest_of_schedules()).items():
            tick = await registry.setting(f"{SCHEDULE_TICK}{name}")
            last = max(created, tick.recorded_at) if tick is not None else created
            late = (now - last).total_seconds() > 2 * every_s
            missed[name] = int(late)
            if not late:
                continue
            # The announcement's mark: the newest job, and the last tick when it made none (so a timer that comes
            # back with skips only, then stops again, is said again).
            mark = job_id if last == created else f"{job_id}@{to_iso(last)}"
            said = await registry.setting(f"{SCHEDULE_MISSED}{name}")
            if said is not None and said.value == mark:
                continue  # announced already, for this last tick
            details = {"schedule": name, "every_s": every_s, "newest_job_id": job_id}
            details["newest_created_at"] = to_iso(created)
            details["last_tick_at"] = to_iso(last)
            log.warning("schedule_missed", **details, meaning="no tick for two periods: is its timer still running?")
            await registry.record_queue_event(
                "schedule.missed", host_id=self.boot.host_id, job_id=job_id, details=details,
                reason="schedule_missed", announced=mark, setting=f"{SCHEDULE_MISSED}{name}",
            )  # fmt: skip
            self._sender.wake()
        self.schedules_missed = missed

    async def kinds(self) -> dict[str, KindLoad]:
        """Each kind with jobs running or queued fleet-wide, or with a limit of its own: what it runs, what waits."""
        limits = self.boot.kinds.running_limits()
        counts = await self.boot.registry.kind_counts()
        return {kind: KindLoad(*counts.get(kind, (0, 0)), limits.get(kind)) for kind in sorted({*counts, *limits})}

    def gauges(self) -> QueueGauges | None:
        """The signals as ``/metrics`` shows them (None before the first sweep): one series per hold reason."""
        latest = self.latest
        if latest is None:
            return None
        stuck = {reason: 0 for reason in (*HOLD_REASONS, NOT_PROMOTED)}
        if latest.stuck is not None:
            stuck[latest.stuck.reason] = 1
        return QueueGauges(
            oldest_queued_age_s=latest.oldest_queued_age_s,
            last_promotion_s=latest.last_promotion_at.timestamp(),
            held={reason: int(reason in latest.held) for reason in HOLD_REASONS},
            held_since_s={reason: since.timestamp() for reason, since in latest.held.items()},
            stuck=stuck,
        )

    async def _announce(self, what: str, stuck: Stuck, now: datetime) -> None:
        """The webhook (``queue.stuck`` / ``queue.moving``, through the signed outbox: the leader sends it) and the
        announced state, in one registry step."""
        details: dict[str, Any] = {
            "host_id": self.boot.host_id,
            "reason": stuck.reason,
            "since": to_iso(stuck.since),
            "oldest_job_id": stuck.oldest_job_id,
            "oldest_age_s": round(stuck.oldest_age_s, 3),
            "free_slots": stuck.free_slots,
        }
        if what == "moving":
            details["moving_since"] = to_iso(now)
        await self.boot.registry.record_queue_event(
            f"queue.{what}",
            host_id=self.boot.host_id,
            job_id=stuck.oldest_job_id,
            details=details,
            reason=stuck.reason,
            announced=json.dumps(details, sort_keys=True) if what == "stuck" else "",
        )
        self._sender.wake()


def _parse_stuck(text: str) -> Stuck | None:
    """The announced stuck queue recorded by ``_announce`` (None: none, or nothing readable)."""
    try:
        data = json.loads(text) if text else None
        if not isinstance(data, dict):
            return None
        return Stuck(
            str(data["reason"]), from_iso(str(data["since"])), str(data["oldest_job_id"]),
            float(data["oldest_age_s"]), int(data["free_slots"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError):
        return None
