"""The job row and its lifecycle: the states, and the one table of legal transitions."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
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
    JobStatus.RUNNING: frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.STALE}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
    JobStatus.STALE: frozenset(),
}


def check_transition(job_id: str, from_status: JobStatus, to_status: JobStatus) -> None:
    if to_status not in TRANSITIONS[from_status]:
        raise IllegalTransition(job_id, from_status, to_status)


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
    created_at: str
    started_at: str | None
    ended_at: str | None
    attempts: int
    cancel_requested: bool
    boot_id: str | None
    pid: int | None
    pid_start_time: int | None
    kernel_boot_id: str | None
    container_id: str | None
    token_hash: str | None
    completed_units: int
    total_units: int | None
    stage: str | None
    last_heartbeat_at: str | None
    last_progress_at: str | None
    log_path: str | None
    queue_position: int | None = None
    # Absence flags, set only by the supervisor's sweeper (INV-STALE-SET-BY-SUPERVISOR): the last judgement made
    # while the job ran. ``stalled``: no progress for PODCAST_JOB_PROGRESS_STALE_SECONDS; ``silent``: heartbeats
    # stopped while the process lives.
    stalled: bool = False
    stalled_since: str | None = None
    silent: bool = False

    @property
    def spawned(self) -> bool:
        """A process identity (pid or container) has been recorded."""
        return self.pid is not None or self.container_id is not None

    def public(self) -> dict[str, Any]:
        """The row as callers see it: every registry field but the job token."""
        out = asdict(self)
        out.pop("token_hash")
        out.pop("seq")
        out["status"] = str(self.status)
        if self.status is not JobStatus.QUEUED:
            out.pop("queue_position")
        return out
