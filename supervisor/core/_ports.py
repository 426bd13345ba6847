"""What one part of the core offers another, each a small protocol named for its use: a part's constructor takes the
collaborators it calls as these (besides the ``Boot`` it shares with every part), never a loose callable, so that a
reader sees which part answers, and ``Supervisor.__init__`` is the one place that says which object it is.

    DrainBell        ring(): ask the drainer for a round                        domain.Doorbell -> six parts
    MonitorStarts    start(watched, job): watch a job just started              Monitors -> Drainer
    Cancels          cancel(job_id, by): a job cancelled                        Monitors -> Bulk
    FollowUps        follow_up_of / announce: a kind's ``then`` job             Enqueuer -> Monitors
    BeatsWriter      flush(): the beats taken, written now                      Heartbeats -> Monitors
    BeatWitness      beat(job): a beat was recorded                             AbsenceTracker -> Heartbeats
    StallStops       stop_stalled(job): a stalled job stopped                   Reconciler -> AbsenceJudge
    LeaseListener    lease_renewed(): promotion may resume                      Drainer -> Fleet
    ForgetListener   this_boot_forgotten(): an operator forgot this boot        HostAdmin -> Fleet
    SilentHostJudge  end_by_proof(rows, leading): a silent host's jobs ended    SilentHostJobs -> Fleet
    Promotions       holds(), last_promotion_at: the drainer, as watched        Drainer -> QueueWatch
    OutboxSender     wake(): the outbox has something to send                   WebhookSender -> QueueWatch
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from ..domain import IdempotencyKey, Job
from ..registry import EnqueueResult, NewJob

if TYPE_CHECKING:
    from ._ledger import Watched


class DrainBell(Protocol):
    """Rung by whatever may free a slot or queue a job; waited on by the drainer alone: many rings make one drain."""

    def ring(self) -> None: ...


class MonitorStarts(Protocol):
    """What the monitors offer the drainer: a job whose process just started is watched from now on."""

    async def start(self, watched: Watched, job: Job) -> None: ...


class Cancels(Protocol):
    """A job cancelled as the operator's cancel does it (a queued one ends; a running one is stopped)."""

    async def cancel(self, job_id: str, by: str | None = None) -> Job: ...


class FollowUps(Protocol):
    """What the enqueuer offers the monitors: the job a kind's ``then`` names, made and announced."""

    def follow_up_of(self, parent: Job, then: str) -> tuple[NewJob, IdempotencyKey] | None: ...

    def announce(self, results: list[EnqueueResult]) -> None: ...


class BeatsWriter(Protocol):
    """The beats taken so far written now (a row that ends takes no beat after: ADR 0018)."""

    async def flush(self) -> None: ...


class BeatWitness(Protocol):
    """Told of each recorded heartbeat (``job``: the row after it)."""

    def beat(self, job: Job) -> None: ...


class StallStops(Protocol):
    """A stalled job stopped (``stall_action = "terminate"``)."""

    async def stop_stalled(self, job: Job) -> None: ...


class LeaseListener(Protocol):
    """Told when this host's lease is fresh again after it was not (promotion may resume)."""

    def lease_renewed(self) -> None: ...


class ForgetListener(Protocol):
    """Told once when the registry says an operator forgot this boot (its processes are to be stopped)."""

    def this_boot_forgotten(self) -> None: ...


class SilentHostJudge(Protocol):
    """The leader's judge of silent hosts' rows: those whose end this host can prove are ended; their ids."""

    async def end_by_proof(self, rows: list[Job], leading: Callable[[], bool]) -> list[str]: ...


class Promotions(Protocol):
    """The drainer as the queue's watch reads it: why promotion is held now, and this host's last promotion."""

    @property
    def last_promotion_at(self) -> datetime: ...

    def holds(self) -> set[str]: ...


class OutboxSender(Protocol):
    """The webhook sender's wake: what the outbox holds goes out."""

    def wake(self) -> None: ...
