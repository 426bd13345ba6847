"""The registry's vocabulary: what a caller hands the registry (``NewJob``, ``PromoteRequest``, ``Ending``, ...) and
what it answers (``Change``, ``Promotion``, ``Host``, ...), in domain types -- no connection, no SQL, no storage format
crosses this line, and every timestamp is an aware ``datetime``. The registry itself is ``_registry.Registry``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from ..domain import IdempotencyKey, IdentityRecord, Job, JobStatus, Schedule

# The fleet setting that records, per host, the stuck queue its watch announced (docs/operations.md § The queue's
# watch): ``queue_stuck/<host>``.
QUEUE_ANNOUNCED = "queue_stuck/"
# The fleet setting that records each schedule's last tick, whatever it made (a job, a skip, a coalesce, a replay):
# ``schedule_tick/<name>``, its value the tick's key, ``recorded_at`` when the timer fired (docs/operations.md,
# "Periodic runs"). The missed-run judge reads it: a tick that made no job still proves the timer runs.
SCHEDULE_TICK = "schedule_tick/"


# What a row that goes back to the queue (a requeue, a resubmission) forgets: the attempt's process, token, progress
# and judgement. One rule for every backend (SQLite stores the booleans as 0/1 itself).
BACK_IN_QUEUE: Mapping[str, object] = MappingProxyType(
    {
        "boot_id": None,
        "host_id": None,
        "identity": None,
        "started_at": None,
        "ended_at": None,
        "error_reason": None,
        "exit_code": None,
        "completed_units": 0,
        "total_units": None,
        "stage": None,
        "last_heartbeat_at": None,
        "last_progress_at": None,
        "stalled": False,
        "stalled_since": None,
        "silent": False,
        "cancel_requested": False,
        "cancelled_by": None,
        "stop_reason": None,
    }
)


def log_name(job_id: str, attempt: int) -> str:
    """A job's log file under ``PromoteRequest.log_dir``: ``<id>.log`` for its first attempt, ``<id>.<n>.log`` for a
    later one (each attempt's output, and its process's state records beside it, apart from the others')."""
    return f"{job_id}.log" if attempt <= 1 else f"{job_id}.{attempt}.log"


@dataclass(frozen=True)
class NewJob:
    """A row to enqueue: a validated kind, its params and argv, and its coalescing key (None: never coalesced).

    ``params`` and ``argv`` are JSON values (the core validated them): a registry may store them as JSON, so a tuple
    may come back a list and a value JSON cannot hold may be refused. The contract says nothing of other values."""

    kind: str
    params: Mapping[str, Any]
    argv: Sequence[str]
    coalesce_key: str | None = None
    max_attempts: int = 1  # the starts it may have: its kind's max_attempts when it was enqueued
    retry_of: str | None = None  # the finished job this one is an operator's explicit retry of
    idempotency_key: str | None = None  # the key of the request that makes it (recorded on its row)
    enqueued_by: str | None = None  # who asks for it: an API token's name, or the supervisor's own (ADR 0017)
    schedule: Schedule | None = None  # the schedule whose tick makes it (recorded on its row)


@dataclass(frozen=True)
class PromoteRequest:
    """Promote the oldest queued rows into the free slots, at most one per token hash (each promoted row gets one,
    its job's token), recording this boot and the job's log path (``log_dir / <job_id>.log``)."""

    max_concurrent: int
    boot_id: str
    token_hashes: Sequence[str]
    log_dir: Path | None = None
    host_id: str | None = None  # the promoting host, recorded on each row (ADR 0012)
    # This host's own cap (PODCAST_JOB_HOST_MAX_CONCURRENT): its RUNNING rows, counted in the same atomic step as the
    # fleet's. None: only the fleet-wide limit.
    host_max_concurrent: int | None = None
    # Each limited kind's max_running (fleet-wide), counted from the RUNNING rows in the same step: a queued row of a
    # full kind is passed over, never holding up the rows of other kinds behind it.
    kind_limits: Mapping[str, int] = field(default_factory=dict)

    def free_slots(self, running: int, running_here: int) -> int:
        """How many rows this promotion may flip, given the RUNNING rows (all, and this host's)."""
        free = min(self.max_concurrent - running, len(self.token_hashes))
        if self.host_max_concurrent is not None:
            free = min(free, self.host_max_concurrent - running_here)
        return max(0, free)


@dataclass(frozen=True)
class Promotion:
    """What a promotion did. ``paused``: nothing was promoted because promotion is paused."""

    jobs: tuple[Job, ...] = ()
    paused: bool = False
    # The earliest moment a queued job now waiting out its backoff may run (None: none waits, or every free slot was
    # filled, so the round after the next end reads it again): the drainer's next wake.
    next_at: datetime | None = None


@dataclass(frozen=True)
class Receipt:
    """What an enqueue answered for one job: an idempotency key keeps these, and a replay answers them as they were."""

    job_id: str
    status: JobStatus
    queue_position: int | None
    coalesced: bool


@dataclass(frozen=True)
class EnqueueResult:
    job: Job  # the row (a replay: as it is now)
    coalesced: bool  # an identical queued row was returned instead of a new one
    # A replay: the request's idempotency key had answered this already, and nothing was written; what it answered.
    replayed: Receipt | None = None
    # An --if-idle tick skipped: ``job`` is the schedule's job still queued or running, and nothing was written.
    skipped: bool = False

    @property
    def receipt(self) -> Receipt:
        """The answer to give: a replay's first answer, else the row as this enqueue left it."""
        if self.replayed is not None:
            return self.replayed
        return Receipt(self.job.job_id, self.job.status, self.job.queue_position, self.coalesced)


@dataclass(frozen=True)
class Change:
    """A write's answer: the row after it, and whether the call changed it (events fire only on real changes)."""

    job: Job
    changed: bool
    previous: JobStatus | None = None  # the status it left, when the status changed
    follow_up: EnqueueResult | None = None  # what ``Ending.then`` enqueued (or coalesced into)


@dataclass(frozen=True)
class Outcome:
    """A terminal status and its reason."""

    status: JobStatus
    reason: str | None = None


@dataclass(frozen=True)
class Retry:
    """Resubmit instead of ending (ADR-150 D4): the row goes back to ``queued`` with its job id, in the same atomic
    step as the attempt's outcome (kept in its history), not promoted before ``not_before``. ``why`` says what it
    follows (the attempt's reason)."""

    not_before: datetime
    why: str


@dataclass(frozen=True)
class Ending:
    """How a RUNNING row ends, decided before the write and handed to it as data.

    ``outcome`` is recorded, unless the row says a cancel was requested by the time the write commits: then
    ``if_cancel_requested`` (when given). So a cancel requested until that very instant counts, with no read before
    the write and no callback inside it. With ``retry``, the ``outcome`` is not final: it goes into the row's
    history and the row is resubmitted (never when the cancel's outcome is chosen). With ``then``, a success enqueues
    that follow-up in the same step (``Change.follow_up``).

    What the row records of a stop is read the same way: a row whose ``stop_reason`` (a stop the supervisor began,
    whichever boot began it) is a key of ``if_stopped`` ends as that ending says (its own cancel rule included), so
    a stop cut off by a restart still ends as it was planned (INV-STOP-REASON-BEFORE-SIGNAL).
    """

    outcome: Outcome
    if_cancel_requested: Outcome | None = None
    exit_code: int | None = None
    retry: Retry | None = None
    # A kind's ``then``: enqueued in the same atomic step when the row ends ``succeeded`` (a crash, or a write that
    # fails, can neither lose the follow-up of a recorded success nor make it without one).
    then: NewJob | None = None
    # The key the follow-up is enqueued under (``then/<parent id>``): a finalize run again never queues a second one.
    then_key: IdempotencyKey | None = None
    # The ending instead, by the reason of a stop the row records (``Job.stop_reason``).
    if_stopped: Mapping[str, Ending] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for chosen in (self.outcome, self.if_cancel_requested):
            if chosen is not None and not chosen.status.is_terminal:
                raise ValueError(f"an ending needs a terminal status, not {chosen.status}")

    def chosen(self, cancel_requested: bool) -> Outcome:
        if cancel_requested and self.if_cancel_requested is not None:
            return self.if_cancel_requested
        return self.outcome

    def for_stop(self, stop_reason: str | None) -> Ending:
        """The ending for a row that records ``stop_reason`` (None: it records no stop)."""
        if stop_reason is None:
            return self
        return self.if_stopped.get(stop_reason, self)


@dataclass(frozen=True)
class Expect:
    """Only act if the row still records exactly this identity (None: no identity at all). Evidence gathered before
    the write must still be about the same process when the write happens."""

    identity: IdentityRecord | None
    # INV-SILENT-HOST-ENDS-BY-PROOF: also only if the row's host (``Job.host_id``) holds no live lease at the
    # registry's clock, checked in the write's own step: a host that renewed meanwhile judges its own rows.
    host_silent: bool = False


@dataclass(frozen=True)
class IdentityClaim:
    """A started job's identity, to record in its row (a row no longer RUNNING is left alone)."""

    job_id: str
    identity: IdentityRecord


@dataclass(frozen=True)
class Beat:
    """One heartbeat to record, already validated: whose it is (job id and token), and what it says."""

    job_id: str
    token: str
    completed_units: int
    total_units: int | None = None
    stage: str | None = None


@dataclass(frozen=True)
class OutboxEvent:
    """One undelivered event, as written in its change's transaction: ``job`` is the public row as of the change.
    A receiver's body is rendered from these fields (``observe.render_event``), the same bytes at every attempt."""

    seq: int
    event_id: str
    job_id: str
    event: str
    created_at: datetime
    previous_status: str | None
    reason: str | None
    boot_id: str | None
    job: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PruneResult:
    by_age: int
    by_count: int

    @property
    def dropped(self) -> int:
        return self.by_age + self.by_count


@dataclass(frozen=True)
class PrunedJob:
    """A finished row that a prune removed (or, in a dry run, would remove): what its caller needs to remove the
    row's files too (each attempt's log: ``log_name(job_id, n)`` for n in 1..attempts, beside ``log_path``) and to
    say what went."""

    job_id: str
    kind: str
    status: JobStatus
    ended_at: datetime
    log_path: str | None  # the last attempt's log (None: the job never started)
    attempts: int


def check_prune(keep_latest: int | None, limit: int) -> None:
    """A prune's bounds, as every registry refuses them (a caller's mistake, never an unbounded delete)."""
    if limit < 1:
        raise ValueError(f"a prune's limit must be at least 1, not {limit}")
    if keep_latest is not None and keep_latest < 0:
        raise ValueError(f"keep_latest must be at least 0 (None: no count rule), not {keep_latest}")


@dataclass(frozen=True)
class Host:
    """A supervisor of the fleet as the registry last heard of it: its boot, and until when its lease holds (it
    renews it every few seconds; one that stops renewing is silent once it expires).

    Every time here is the registry's clock (the database server's, on PostgreSQL), never a host's own: a lease is
    written and judged by one clock, so hosts whose clocks disagree still agree on whose lease holds
    (INV-LEASE-ON-REGISTRY-CLOCK)."""

    host_id: str
    boot_id: str
    started_at: datetime  # when this boot registered
    last_seen_at: datetime  # its last renewal
    lease_expires_at: datetime
    as_of: datetime  # the registry's clock when it read (or wrote) this row
    # The release its boot runs and the contract level it honours (None: a release before 1.0.0 recorded neither).
    release: str | None = None
    contract_level: int | None = None

    @property
    def live(self) -> bool:
        """Whether its lease held when the registry read it (at the registry's clock)."""
        return self.as_of < self.lease_expires_at


@dataclass(frozen=True)
class Lease:
    """What a renewal answered: this host's row, the fleet's leader after it (None: nobody leads), and the host row
    this boot replaced (a previous boot of the same host id; ``live`` if its lease had not expired yet)."""

    host: Host
    leader: Host | None
    replaced: Host | None = None
    drained: bool = False  # an operator drained this host: it promotes nothing and hands the lead over

    @property
    def leading(self) -> bool:
        leader = self.leader
        return leader is not None and (leader.host_id, leader.boot_id) == (self.host.host_id, self.host.boot_id)


@dataclass(frozen=True)
class FleetSetting:
    """A setting the fleet shares: its value, and the host that recorded it, when."""

    name: str
    value: str
    host_id: str
    recorded_at: datetime


# What a wake-up says happened (``Wakeup.kind``).
WAKE_QUEUED = "queued"  # a row became queued (an enqueue, a requeue, a resubmission, a follow-up)
WAKE_FREED = "freed"  # running rows ended on behalf of another host (forget): slots were freed
WAKE_CANCEL = "cancel"  # a cancel was requested on a running row (``job_id``; ``host_id``: the host that runs it)
WAKE_PAUSE = "pause"  # the queue's pause was set or cleared
WAKE_KINDS = frozenset({WAKE_QUEUED, WAKE_FREED, WAKE_CANCEL, WAKE_PAUSE})


@dataclass(frozen=True)
class Wakeup:
    """A hint that another process (another host of the fleet) changed something this host may act on.

    INV-NOTIFY-IS-A-HINT: a wake-up never decides anything. It may come late, twice, or never (a listener that was
    not connected at that moment hears nothing of it); whoever hears it re-reads what it acts on from the registry,
    and the periodic sweep does the same work anyway, so a lost wake-up only delays."""

    kind: str
    job_id: str | None = None
    host_id: str | None = None


class WakeupFeed(Protocol):
    """The wake-ups of one listening session (``Registry.listen``)."""

    async def receive(self) -> Wakeup:
        """The next wake-up; raises ``RegistryUnavailable`` once the session is lost (listen again to go on)."""
        ...

    def receive_nowait(self) -> Wakeup | None:
        """A wake-up already received, or None: what a caller coalesces with the one it just got."""
        ...

    async def check(self) -> None:
        """A cheap round trip on the session, bounded: raises ``RegistryUnavailable`` when it does not answer (a
        partition that hangs, which no error would ever report)."""
        ...

    @property
    def dropped(self) -> int:
        """Wake-ups dropped because the reader fell behind (harmless: see ``Wakeup``)."""
        ...


PAUSED_BY_OPERATOR = "operator"  # POST /api/queue/pause
PAUSED_BY_FILE = "pause_file"  # the .viewer/jobs.paused file, mirrored by the sweeper


@dataclass(frozen=True)
class PauseState:
    paused: bool
    by: str | None = None  # PAUSED_BY_OPERATOR or PAUSED_BY_FILE while paused
    since: datetime | None = None
