"""The job row and its lifecycle: the states, the one table of legal transitions, and what a row says about the
process that runs it (an identity record, an exit status, a liveness).

Timestamps are aware ``datetime``s in UTC everywhere in the code; only a storage or a wire format turns them into
text (``to_iso`` / ``from_iso``: ISO 8601 with microseconds and ``+00:00``, the API's format).
"""

from __future__ import annotations

import copy
import enum
import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from ._errors import IllegalTransition


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STALE = "stale"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.STALE})

# Every state change goes through check_transition(); a terminal row never moves again.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.CANCELLED}),
    # RUNNING -> QUEUED: a crashed attempt resubmitted (ADR-150 D4), or a start that provably never happened.
    JobStatus.RUNNING: frozenset(
        {JobStatus.QUEUED, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.STALE}
    ),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
    JobStatus.STALE: frozenset(),
}


def check_transition(job_id: str, from_status: JobStatus, to_status: JobStatus) -> None:
    if to_status not in TRANSITIONS[from_status]:
        raise IllegalTransition(job_id, from_status, to_status)


# -- time ---------------------------------------------------------------------------------------------


def utc_now() -> datetime:
    return datetime.now(UTC)


class SteadyWallClock:
    """Wall-clock time as the monotonic clock moves it: the system's wall time read once (at construction), plus the
    monotonic time elapsed since. A step of the system clock (an operator's ``date -s``, NTP correcting a wrong RTC)
    moves no timestamp this boot writes and no duration it judges: no stall, no wall-clock stale, no backoff skipped
    or stretched by it. ``step_s()``: how far the system clock has stepped away since (the sweeper warns).

    ``wall`` and ``monotonic``: the two clocks read (a test seam; monotonic: seconds, any origin)."""

    def __init__(
        self, wall: Callable[[], datetime] = utc_now, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._anchor_wall = wall()
        self._anchor_mono = monotonic()

    def __call__(self) -> datetime:
        return self._anchor_wall + timedelta(seconds=self._monotonic() - self._anchor_mono)

    def step_s(self) -> float:
        """The system's wall time minus this clock's: 0 unless the system clock was stepped (or slewed apart)."""
        return (self._wall() - self()).total_seconds()


def to_iso(ts: datetime) -> str:
    """The one text form of a timestamp (storage and the API): UTC, microseconds, ``+00:00``."""
    if ts.tzinfo is None:
        raise ValueError(f"a naive datetime has no place in a job row: {ts!r}")
    return ts.astimezone(UTC).isoformat(timespec="microseconds")


def from_iso(text: str) -> datetime:
    ts = datetime.fromisoformat(text)
    if ts.tzinfo is None:
        raise ValueError(f"a timestamp without its offset: {text!r}")
    return ts.astimezone(UTC)


def hash_token(token: str) -> str:
    """What the registry keeps of a job's token: its SHA-256, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()


# -- what a row says about the process that runs the job ------------------------------------------------


class Liveness(enum.Enum):
    """INV-UNKNOWN-KEEPS-SLOT: UNKNOWN is not DEAD. Only DEAD may free a slot."""

    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"


IdentityValue = str | int | None


@dataclass(frozen=True)
class IdentityRecord:
    """What an executor recorded about the process (or container) that runs a job.

    The executor that wrote it is the only reader of its ``fields`` (INV-PID-NEEDS-BOOT-AND-IDENTITY is its
    business: a process record holds pid, start time and kernel boot; a container record its id). The registry
    stores it as it is and compares it as a whole; the core passes it between the two without looking inside.
    """

    kind: str  # which executor wrote it: "process", "container", ...
    fields: Mapping[str, IdentityValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    def __hash__(self) -> int:
        return hash((self.kind, tuple(sorted(self.fields.items()))))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IdentityRecord):
            return NotImplemented
        return self.kind == other.kind and dict(self.fields) == dict(other.fields)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "fields": dict(self.fields)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IdentityRecord:
        return cls(str(data["kind"]), dict(data.get("fields") or {}))


@dataclass(frozen=True)
class ExitStatus:
    """How a job ended: an exit code, or the signal that killed it.

    ``oom_killed``: the engine reports that the kernel's OOM killer ended it (Docker's ``State.OOMKilled``); the
    code is then what the engine reported (137), and the outcome says ``killed_out_of_memory``.
    """

    code: int | None = None
    signal: int | None = None
    oom_killed: bool = False

    @property
    def returncode(self) -> int:
        """The row's ``exit_code``: the code, or minus the signal (as ``subprocess`` reports it)."""
        if self.code is not None:
            return self.code
        assert self.signal is not None
        return -self.signal

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        return cls(code=returncode) if returncode >= 0 else cls(signal=-returncode)


# A resubmission's transition reason: "resubmitted: <what the attempt ended with>" (the event log, the metrics).
RESUBMITTED = "resubmitted: "


@dataclass(frozen=True)
class Attempt:
    """One start of a job that was resubmitted after it: when it ran and how it ended (the row's own fields say how
    the last attempt ended)."""

    attempt: int  # 1 for the first start
    started_at: datetime | None
    ended_at: datetime
    status: JobStatus  # how this attempt ended (failed, stale)
    reason: str | None
    exit_code: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "started_at": to_iso(self.started_at) if self.started_at else None,
            "ended_at": to_iso(self.ended_at),
            "status": str(self.status),
            "reason": self.reason,
            "exit_code": self.exit_code,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        started = data.get("started_at")
        return cls(
            attempt=int(data["attempt"]),
            started_at=from_iso(started) if started else None,
            ended_at=from_iso(data["ended_at"]),
            status=JobStatus(data["status"]),
            reason=data.get("reason"),
            exit_code=data.get("exit_code"),
        )


# The identity fields the API has always shown at the top level of a row (null when the record has none):
# operators read ``pid`` and ``container_id`` there.
PUBLIC_IDENTITY_KEYS = ("pid", "pid_start_time", "kernel_boot_id", "container_id")
_PRIVATE = frozenset({"token_hash", "seq", "identity"})
_TIMESTAMPS = (
    "created_at",
    "started_at",
    "ended_at",
    "last_heartbeat_at",
    "last_progress_at",
    "stalled_since",
    "next_attempt_at",
)


# A heartbeat's progress, as the API takes it: its unit counts are stored as 64-bit signed integers (a larger number
# is refused, not a 500), and its stage is a short text.
MAX_UNITS = 2**63 - 1
MAX_STAGE_LEN = 200


@dataclass(frozen=True)
class Progress:
    """What one heartbeat says of a job's progress (the API's ``Heartbeat`` body, validated at the edge): the
    watermark (``completed_units``), and optionally the total and the stage it is in."""

    completed_units: int
    total_units: int | None = None
    stage: str | None = None


# Jobs in one batch (``POST /api/jobs/batch``), at most.
MAX_BATCH = 1000


@dataclass(frozen=True)
class JobRequest:
    """One job asked for (alone, or in a batch), as the edge parsed it: a kind's name and its params (a JSON
    object's names and values; None: none given), which the core checks against the kind."""

    kind: str
    params: Mapping[str, object] | None = None


@dataclass(frozen=True)
class Job:
    """One registry row. ``token_hash`` never leaves the supervisor; ``public()`` drops it."""

    job_id: str
    seq: int
    kind: str
    params: dict[str, Any]
    argv: list[str]
    status: JobStatus
    error_reason: str | None
    exit_code: int | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    attempts: int
    cancel_requested: bool
    boot_id: str | None
    identity: IdentityRecord | None
    token_hash: str | None
    completed_units: int
    total_units: int | None
    stage: str | None
    last_heartbeat_at: datetime | None
    last_progress_at: datetime | None
    log_path: str | None
    queue_position: int | None = None
    # Absence flags, set only by the supervisor's sweeper (INV-STALE-SET-BY-SUPERVISOR): the last judgement made
    # while the job ran. ``stalled``: no progress for PODCAST_JOB_PROGRESS_STALE_SECONDS; ``silent``: heartbeats
    # stopped while the process lives.
    stalled: bool = False
    stalled_since: datetime | None = None
    silent: bool = False
    # Crash-only recovery (ADR-150 D4): how many starts the job may have (its kind's, when it was enqueued), when a
    # resubmitted job may run again (None: at once), and each earlier attempt that was resubmitted.
    max_attempts: int = 1
    next_attempt_at: datetime | None = None
    history: tuple[Attempt, ...] = ()
    # The host whose supervisor promoted it (a fleet on one registry, ADR 0012): only that host judges its process.
    # None: a row promoted before hosts were recorded (judged as this host's own, as then).
    host_id: str | None = None
    # The job this one is an operator's explicit retry of (``supervisor retry``: same kind and params, a new row);
    # None for any other job. Automatic resubmission keeps the job's own id and never sets it.
    retry_of: str | None = None
    # The Idempotency-Key of the request that made this row (a kind's ``then`` follow-up: ``then/<parent id>``);
    # None for a request without one.
    idempotency_key: str | None = None
    # Who asked (ADR 0017): the name of the API token that enqueued the job (``operator``: the operator token;
    # ``anonymous``: a server without tokens; ``supervisor``: a kind's follow-up), and of the one that asked for its
    # cancel (the first such request). None: not asked, or a row older than the record.
    enqueued_by: str | None = None
    cancelled_by: str | None = None
    # The schedule whose tick enqueued it, and that schedule's period (docs/operations.md, "Periodic runs"); None for
    # any other job.
    schedule: str | None = None
    schedule_every_s: float | None = None
    # Why the supervisor itself began to stop this attempt (``deadline``, ``stall``), recorded before its signal
    # (INV-STOP-REASON-BEFORE-SIGNAL); None when it began none. Its end is that stop's, whichever boot records it.
    stop_reason: str | None = None

    @property
    def spawned(self) -> bool:
        """A process identity (pid or container) has been recorded."""
        return self.identity is not None

    def public(self) -> dict[str, Any]:
        """The row as callers see it (the API, the webhook): every field but the job token, timestamps as ISO 8601
        text, the identity record's fields at the top level."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _PRIVATE}
        out["params"] = copy.deepcopy(self.params)
        out["argv"] = list(self.argv)
        out["status"] = str(self.status)
        for name in _TIMESTAMPS:
            value = getattr(self, name)
            out[name] = to_iso(value) if value is not None else None
        out["history"] = [attempt.to_json() for attempt in self.history]
        out.update(dict.fromkeys(PUBLIC_IDENTITY_KEYS))
        if self.identity is not None:
            out.update(self.identity.fields)
        if self.status is not JobStatus.QUEUED:
            out.pop("queue_position")
        return out
