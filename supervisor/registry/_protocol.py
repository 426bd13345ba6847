"""The registry's interface: the domain operations the core asks of the single source of truth, in domain types.

Every implementation (``sqlite.SqliteRegistry``, the embedded default; ``memory.MemoryRegistry``, for fast tests;
PostgreSQL next) passes one contract suite (``tests/registry/``), so the core never learns which one it talks to:
no connection, no SQL, no storage format crosses this line, and every timestamp is an aware ``datetime``.

The rules every implementation keeps (named in the decision records; the contract suite tests each):

- INV-PROMOTION-NEVER-OVERSHOOTS: a promotion counts the RUNNING rows and flips queued rows to RUNNING in one
  atomic step (a transaction under the registry's write lock): concurrent promotions, in any process, can never
  make more rows RUNNING than ``max_concurrent``.
- One place changes a status (``TRANSITIONS``); a terminal row never changes again, and a change that finds the
  row already terminal reports ``changed=False``.
- FIFO: the oldest queued row (by insertion) is promoted first; only a *queued* row absorbs an identical one
  (coalescing).
- Each change's events are written with the change, atomically (the transactional outbox): a committed change
  always has its events, a rolled-back one never; undelivered events are read back in the order written.
- A job's token is checked against the hash the row holds while the job runs; a terminal row holds none.
- An acknowledged write is durable when its call returns.
- Every call is bounded: a registry that cannot answer raises ``RegistryError``, never hangs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from ..domain import Job, JobStatus, RequestError
from ..domain._model import IdentityRecord
from ._health import RegistryFault

MAX_LIST_LIMIT = 1000
# The shape of every cursor a registry issues (opaque to callers; the OpenAPI document states it).
CURSOR_PATTERN = re.compile(r"[0-9]{1,18}")


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

    def free_slots(self, running: int, running_here: int) -> int:
        """How many rows this promotion may flip, given the RUNNING rows (all, and this host's)."""
        free = min(self.max_concurrent - running, len(self.token_hashes))
        if self.host_max_concurrent is not None:
            free = min(free, self.host_max_concurrent - running_here)
        return max(0, free)


@dataclass(frozen=True)
class Promotion:
    """What a promotion did. ``paused``: nothing was promoted because promotion is paused. ``failed``: a promotion
    made in another change's transaction failed and was rolled back alone (that change stands; drain again)."""

    jobs: tuple[Job, ...] = ()
    paused: bool = False
    failed: bool = False
    # The earliest moment a queued job now waiting out its backoff may run (None: none waits): the drainer's next wake.
    next_at: datetime | None = None


@dataclass(frozen=True)
class EnqueueResult:
    job: Job
    coalesced: bool  # an identical queued row was returned instead of a new one


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
    """

    outcome: Outcome
    if_cancel_requested: Outcome | None = None
    exit_code: int | None = None
    retry: Retry | None = None
    # A kind's ``then``: enqueued in the same atomic step when the row ends ``succeeded`` (a crash, or a write that
    # fails, can neither lose the follow-up of a recorded success nor make it without one).
    then: NewJob | None = None

    def __post_init__(self) -> None:
        for chosen in (self.outcome, self.if_cancel_requested):
            if chosen is not None and not chosen.status.is_terminal:
                raise ValueError(f"an ending needs a terminal status, not {chosen.status}")

    def chosen(self, cancel_requested: bool) -> Outcome:
        if cancel_requested and self.if_cancel_requested is not None:
            return self.if_cancel_requested
        return self.outcome


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


@runtime_checkable
class Registry(Protocol):
    """The single source of truth for every job row. See the module docstring for the rules every implementation
    keeps; every method may raise ``RegistryError`` (storage unavailable, lock not acquired in time)."""

    # -- enqueue and promotion (claim before run) ----------------------------------------------------------

    async def enqueue(self, job: NewJob, *, promote: PromoteRequest | None = None) -> tuple[EnqueueResult, Promotion]:
        """Add a queued row (or, with a coalescing key, return the identical queued one); with ``promote``, then
        promote into free slots in the same atomic step (unless paused): a job enqueued while a slot is free is
        RUNNING when the call returns. A failed promotion never fails the enqueue (``Promotion.failed``).
        ``EnqueueResult.job`` is the row as enqueued (queued, with its position); a row promoted in the same step
        is in ``Promotion.jobs`` as it is after it."""
        ...

    async def enqueue_many(self, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
        """Add several rows at once, all or nothing, in order (answers carry no queue position)."""
        ...

    async def promote(self, request: PromoteRequest) -> Promotion:
        """Flip the oldest queued rows whose backoff has passed to RUNNING, as many as slots are free
        (INV-PROMOTION-NEVER-OVERSHOOTS), each with this boot's id, ``started_at``, a token hash, ``attempts + 1`` and
        its log path; none while paused. ``Promotion.next_at``: when a row still waiting out its backoff may run."""
        ...

    async def record_identities(self, claims: Sequence[IdentityClaim]) -> list[Job]:
        """Record started jobs' identities; the rows after it, in order."""
        ...

    # -- ends --------------------------------------------------------------------------------------------

    async def finalize(
        self, job_id: str, ending: Ending, *, expect: Expect | None = None, promote: PromoteRequest | None = None
    ) -> tuple[Change, Promotion]:
        """End a RUNNING row as ``ending`` says (a terminal row is left alone: ``changed=False``; so is a row whose
        identity is not ``expect``'s, and, with ``expect.host_silent``, a row whose host's lease is live
        at the registry's clock). With ``promote``, promote into the freed slot in the same atomic step (a
        finalize that changed nothing freed none, and promotes nothing). Ending a queued row raises
        ``IllegalTransition``."""
        ...

    async def requeue(self, job_id: str, *, expect: Expect, reason: str) -> Change:
        """A RUNNING row whose start provably never happened goes back to the head of the queue: ``queued`` again
        with its job id and its place (its insertion order), the start not counted in ``attempts``. Only if the row
        still records ``expect``'s identity (changed=False otherwise, or when it is not running)."""
        ...

    async def request_cancel(self, job_id: str) -> Change:
        """A queued row ends ``cancelled/cancelled_before_start`` at once; a running row is marked
        ``cancel_requested`` (its process is stopped by whoever watches it); a terminal row is left alone."""
        ...

    # -- what a running job says, and what the sweeper judges -----------------------------------------------

    async def record_heartbeats(self, beats: Sequence[Beat]) -> list[Job | RequestError]:
        """Record beats (per beat: the row after it, or the ``Unauthorized``/``Conflict`` it earned; a refused beat
        writes nothing; a row holds a token hash only while it runs, so a beat for a row that does not run finds
        no token and earns ``Unauthorized``, as one for an unknown job). ``completed_units`` is a watermark
        (INV-PROGRESS-NOT-LIVENESS): every beat moves ``last_heartbeat_at``, only a higher count moves
        ``last_progress_at``."""
        ...

    async def check_job_token(self, job_id: str, token: str) -> None:
        """Raise ``Unauthorized`` unless ``token`` is the running job's own (a missing job looks the same)."""
        ...

    async def set_absence(
        self, job_id: str, *, stalled: bool, silent: bool, events: Sequence[tuple[str, str]] = ()
    ) -> Change:
        """Record the sweeper's absence flags on a RUNNING row with ``events`` ((name, reason) pairs); ``stalled_since``
        is set when ``stalled`` turns on. A judgement that changes nothing writes nothing."""
        ...

    async def record_event(self, job_id: str, event: str, reason: str | None) -> Job:
        """Write an event about a change the row does not show (this boot adopted the job)."""
        ...

    # -- the outbox ---------------------------------------------------------------------------------------

    async def outbox_pending(self, limit: int) -> list[OutboxEvent]:
        """The oldest undelivered events, in the order they were written (``limit``: at least 1)."""
        ...

    async def outbox_delete(self, seqs: Sequence[int]) -> None:
        """Forget delivered events."""
        ...

    async def outbox_depth(self) -> int: ...

    async def outbox_prune(self, *, max_events: int, max_age_s: float) -> PruneResult:
        """Drop events older than ``max_age_s`` (one exactly that old is kept) and, past ``max_events``, the oldest
        (both limits at least 0)."""
        ...

    # -- the queue's pause ----------------------------------------------------------------------------------

    async def set_paused(self, paused: bool, *, by: str) -> PauseState:
        """Pause or resume promotion (``by``: who asked); the state after it."""
        ...

    async def pause_state(self) -> PauseState: ...

    # -- reads --------------------------------------------------------------------------------------------

    async def get(self, job_id: str) -> Job:
        """One row (``JobNotFound``); a queued row carries its queue position."""
        ...

    async def running_jobs(self) -> list[Job]:
        """Every RUNNING row, oldest first: O(running rows), whatever the history."""
        ...

    async def list_jobs(
        self, *, status: str | None = None, kind: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> tuple[list[Job], str | None]:
        """Rows newest first and an opaque cursor for the next page (None at the end); rows added meanwhile never
        shift a page. A bad status, limit or cursor is a ``ValidationError`` naming it."""
        ...

    async def counts(self) -> dict[str, int]:
        """Rows per status (every status present)."""
        ...

    async def retries_of(self, job_id: str) -> list[str]:
        """The ids of the rows enqueued as explicit retries of ``job_id`` (``NewJob.retry_of``), oldest first; empty
        when there is none (an unknown job too: a retry may outlive the row it retried)."""
        ...

    # -- retention ----------------------------------------------------------------------------------------

    async def prune_jobs(
        self, *, ended_before: datetime | None, keep_latest: int | None, limit: int, dry_run: bool = False
    ) -> list[PrunedJob]:
        """Remove finished rows, oldest first (by ``ended_at``, then insertion order), at most ``limit`` (at least
        1): each one that ended before ``ended_before``, and each one older than the newest ``keep_latest`` finished
        rows (None: that rule is off; both None: nothing goes). Never a queued or running row, and never a row with
        an event still in the outbox (undelivered: it is kept until its events are delivered or dropped, and its
        event's row stays whole). ``dry_run``: what would go now, nothing removed. The rows removed, oldest first.
        The row's files are the caller's to remove."""
        ...

    # -- the fleet (ADR 0012) ---------------------------------------------------------------------------------

    async def renew_lease(self, host_id: str, boot_id: str, *, lease_s: float, lead: bool) -> Lease:
        """Register or renew host ``host_id`` as run by boot ``boot_id`` until now + ``lease_s`` at the registry's
        clock (a new boot of the same host id replaces the old one's row); with ``lead``, also take the fleet's lead
        when nobody holds it or its holder's lease expired, or keep it when this boot holds it (renewed to the same
        expiry). One atomic step: two hosts never both lead. A boot an operator forgot is refused: ``HostForgotten``
        (INV-FORGET-IS-FENCED)."""
        ...

    async def release_lease(self, host_id: str, boot_id: str) -> None:
        """A clean shutdown: this boot's host lease and lead (if it holds them) end now."""
        ...

    async def hosts(self) -> list[Host]:
        """Every registered host, by host id, each with ``as_of`` the registry's clock at this read."""
        ...

    async def leader(self) -> Host | None:
        """The host that holds the lead now (its lease may have expired: ``Host.live`` says, as of this read)."""
        ...

    async def forget_host(self, host_id: str) -> Host | None:
        """The operator says host ``host_id`` will never come back. One atomic step (INV-FORGET-IS-FENCED): refused
        (``Conflict``) while its lease is live at the registry's clock; else its boot is fenced (a renewal by it is
        refused from now on), its row and its lead go. Its running rows are the caller's to end after this step
        (each guarded by its identity). The row removed, or None when there was none (nothing is fenced)."""
        ...

    async def record_setting(self, name: str, value: str, host_id: str, *, replace: bool) -> FleetSetting:
        """The fleet's value of setting ``name``: the one recorded first (``value``, by ``host_id``, when none was);
        with ``replace``, this one whatever was recorded (a host that starts alone)."""
        ...

    def listen(self) -> AbstractAsyncContextManager[WakeupFeed | None]:
        """A session that hears other processes' changes (``Wakeup``), open while the context is: entering connects
        (bounded; ``RegistryUnavailable`` when it cannot), leaving closes. None: this registry has nothing to hear
        (one process owns it: SQLite, memory), its own wakes suffice. Wake-ups are only hints
        (INV-NOTIFY-IS-A-HINT)."""
        ...

    def fault(self) -> RegistryFault | None:
        """Whether writes are failing now (a full disk, a read-only or removed file, a lock held by another process):
        since when, and why. None while writes succeed. Cheap and non-blocking: the health route asks it."""
        ...

    async def aclose(self) -> None:
        """Release what the registry holds (connections); later calls raise ``RegistryError``."""
        ...
