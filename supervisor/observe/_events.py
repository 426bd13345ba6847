"""The one way the core announces what happened to a job: a ``JobEvent`` on an ``EventBus``.

The bus is synchronous and never blocks: ``emit`` calls each subscriber in turn, and a subscriber may only do
something that cannot wait (write a log line, move a counter, set a ``trio.Event``). Subscribers today: the log
(``log_event``, below), the metrics (``_metrics.Metrics.on_event``), the webhook sender's wake-up
(``_webhook.WebhookSender.wake``), the event stream (``_stream.EventLog.on_event``), the job tokens the heartbeat
route knows and the latest beats (``core._heartbeats.Heartbeats.on_event``) and the absence tracker
(``core._absence.AbsenceTracker.on_event``). A subscriber that raises is logged and skipped: announcing a change can
never undo it or stop the others hearing of it.

The durable copy of each event is not written here: the registry writes it to its outbox table in the same
transaction as the change itself (``registry._jobs.job_event``), so a crash can neither lose the event of a
committed change nor send one for a change that was rolled back. The bus is what the running process hears at once;
the outbox is what a receiver is eventually told.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..domain import Job, to_iso
from ._logging import get_logger

log = get_logger()


class EventName(enum.StrEnum):
    TRANSITION = "job.transition"  # a status change (enqueue, promotion, every terminal one)
    ADOPTED = "job.adopted"  # this boot watches a live job it did not start
    STALLED = "job.stalled"  # no progress for PODCAST_JOB_PROGRESS_STALE_SECONDS
    SILENT = "job.silent"  # heartbeats stopped while the process lives
    RECOVERED = "job.recovered"  # progress or heartbeats resumed: a flag cleared


@dataclass(frozen=True)
class JobEvent:
    event: EventName
    job: Job  # the row as of the change
    previous_status: str | None  # None for an enqueue
    reason: str | None
    boot_id: str
    extra: Mapping[str, Any] = field(default_factory=dict)


Subscriber = Callable[[JobEvent], None]


class EventBus:
    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    def emit(self, event: JobEvent) -> None:
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception:
                log.exception("event_subscriber_failed", job_event=str(event.event), job_id=event.job.job_id)


def log_event(event: JobEvent) -> None:
    """The log's subscription: every status change is one ``job_transition`` line, as before the bus existed."""
    job = event.job
    # The event's extra fields win over the row's: an adoption names the process it found (its handle's pid or
    # container), which may not have reached the row yet.
    if event.event is EventName.TRANSITION:
        fields: dict[str, Any] = {"from": event.previous_status or "-", "to": str(job.status)}  # `from` is a keyword
        log.info(
            "job_transition",
            **{
                "job_id": job.job_id,
                "kind": job.kind,
                "reason": event.reason,
                "boot_id": event.boot_id,
                **_identity(job),
                **fields,
                **event.extra,
            },
        )
        return
    level = log.warning if event.event in (EventName.STALLED, EventName.SILENT) else log.info
    level(
        str(event.event).replace(".", "_"),  # job_stalled, job_silent, job_recovered, job_adopted
        **{
            "job_id": job.job_id,
            "kind": job.kind,
            "reason": event.reason,
            "boot_id": event.boot_id,
            **_identity(job),
            "stalled": job.stalled,
            "silent": job.silent,
            "completed_units": job.completed_units,
            "last_progress_at": to_iso(job.last_progress_at) if job.last_progress_at else None,
            "last_heartbeat_at": to_iso(job.last_heartbeat_at) if job.last_heartbeat_at else None,
            **event.extra,
        },
    )


def _identity(job: Job) -> dict[str, Any]:
    """The process the row records, as its executor named it (pid and start time, or container id)."""
    return dict(job.identity.fields) if job.identity is not None else {}
