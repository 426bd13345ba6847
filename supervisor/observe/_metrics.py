"""The supervisor's Prometheus metrics (``GET /metrics``), every name under ``podcast_``.

Two sources, neither of them the HTTP layer:

- counters and the sweep histogram move as things happen: ``on_event`` is an event-bus subscriber (transitions),
  the sweep observes its own duration and the liveness it could not establish;
- gauges are what the supervisor knows at scrape time (``Supervisor.render_metrics``): its own state (the queue's
  watch, the registry's write fault, the beats it has taken and not yet written) over the registry's last read
  (``RegistryView``: the jobs by status, one series per *running* job). A scrape starts a fresh read and waits for
  it a moment at most; a registry that does not answer within that (a lock held elsewhere, a database cut off)
  never makes a scrape late: it shows the last read, and ``podcast_metrics_registry_age_seconds`` how old it is
  (docs/alerting.md). A job's series are gone from the first read after it ends, and a restarted supervisor shows
  the registry's truth, whoever made the change.

Each ``Metrics`` has its own ``CollectorRegistry`` (never the process-global one), so two supervisors in one
process never collide.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..domain import RESUBMITTED, Job, JobStatus
from ._events import EventName, JobEvent

SWEEP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DELIVERY_OUTCOMES = ("delivered", "failed", "dropped")


def reason_label(reason: str | None) -> str:
    """A bounded label: ``spawn_failed: <message>`` becomes ``spawn_failed``; none becomes ``""``."""
    return (reason or "").split(":", 1)[0]


def _epoch(ts: datetime | None) -> float | None:
    return ts.timestamp() if ts else None


@dataclass(frozen=True)
class QueueGauges:
    """The queue's watch as ``/metrics`` shows it (docs/operations.md § The queue's watch; computed by the core's
    ``QueueWatch`` at each sweep)."""

    oldest_queued_age_s: float
    last_promotion_s: float  # Unix time
    held: Mapping[str, int]  # every hold reason: 1 while it holds promotion
    held_since_s: Mapping[str, float]  # the reasons that hold: since when, Unix time
    stuck: Mapping[str, int]  # every reason the queue can be stuck for: 1 while it is, for that one


@dataclass(frozen=True)
class RegistryView:
    """The registry's part of a scrape, as one background read found it. ``running``: each running job's row, its
    progress already brought up to what the supervisor knows (beats taken, not yet written)."""

    counts: Mapping[str, int]
    paused: bool
    running: list[Job]
    outbox_depth: int
    kinds: Mapping[str, tuple[int, int, int | None]] = field(default_factory=dict)  # running, queued, max_running


@dataclass(frozen=True)
class Snapshot:
    """What a scrape shows: the registry's last read (None: none has completed yet) and how old it is, and what the
    supervisor holds itself."""

    registry: RegistryView | None
    registry_age_s: float
    max_concurrent: int
    writes_failing_since_s: float | None = None  # the registry's write fault: since when, Unix time (None: none)
    deliveries: Mapping[str, int] = field(default_factory=dict)
    streams: Mapping[str, int] = field(default_factory=dict)  # the event stream's EventLog.stats()
    conditions: Mapping[str, int] = field(default_factory=dict)  # the background tasks' conditions, by step
    queue: QueueGauges | None = None  # None before the first sweep
    schedules_missed: Mapping[str, int] = field(default_factory=dict)  # each schedule: 1 while it misses its runs


def _queue_families(queue: QueueGauges) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "podcast_queue_oldest_queued_age_seconds",
        "How long the oldest job ready to run has waited, as of the last sweep (0 when none waits).",
        value=queue.oldest_queued_age_s,
    )
    yield GaugeMetricFamily(
        "podcast_queue_last_promotion_timestamp_seconds",
        "When this host last promoted a job (its boot's start before any), Unix time.",
        value=queue.last_promotion_s,
    )
    yield _by_label("podcast_queue_held", "1 while this host's promotion is held, one series per reason.", queue.held)
    yield _by_label(
        "podcast_queue_held_since_timestamp_seconds",
        "Since when each reason holds promotion, Unix time.",
        queue.held_since_s,
    )
    yield _by_label(
        "podcast_queue_stuck",
        "1 while the queue is stuck (PODCAST_JOB_QUEUE_STUCK_SECONDS; behind a pause, PODCAST_JOB_PAUSE_WARN_SECONDS), "
        "for its reason.",
        queue.stuck,
    )


def _by_label(
    name: str, documentation: str, values: Mapping[str, float], *, label: str = "reason"
) -> GaugeMetricFamily:
    """One series per key of ``values``, the key as its ``label``."""
    family = GaugeMetricFamily(name, documentation, labels=[label])
    for reason, value in sorted(values.items()):
        family.add_metric([reason], value)
    return family


class _SnapshotCollector:
    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None

    def describe(self) -> list[Metric]:
        return []  # the families depend on the snapshot; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        if snap is None:
            return
        if snap.registry is not None:
            yield GaugeMetricFamily(
                "podcast_metrics_registry_age_seconds",
                "How old the registry's part of this scrape is: a scrape never waits long on the registry, it shows "
                "the last read (absent until the first).",
                value=snap.registry_age_s,
            )
        failing = snap.writes_failing_since_s
        yield GaugeMetricFamily(
            "podcast_registry_writes_failing", "1 while the registry's writes fail.", value=int(failing is not None)
        )
        since = GaugeMetricFamily(
            "podcast_registry_writes_failing_since_timestamp_seconds",
            "Since when the registry's writes fail, Unix time (absent while they work).",
            labels=[],
        )
        if failing is not None:
            since.add_metric([], failing)
        yield since
        yield GaugeMetricFamily("podcast_max_concurrent", "Jobs allowed to run at once.", value=snap.max_concurrent)
        yield from _memory_families(snap)
        if snap.queue is not None:
            yield from _queue_families(snap.queue)
        if snap.registry is not None:
            yield from _registry_families(snap.registry)


def _memory_families(snap: Snapshot) -> Iterator[Metric]:
    """What the supervisor counts itself: the schedules' judgement, webhook deliveries, the event stream, conditions."""
    yield _by_label(
        "podcast_schedule_missed",
        "1 while a schedule's newest job is older than twice its period (the leader's judgement).",
        snap.schedules_missed,
        label="schedule",
    )
    deliveries = CounterMetricFamily(
        "podcast_webhook_deliveries",
        "Webhook delivery attempts by outcome since this boot (dropped: removed by the outbox bounds).",
        labels=["outcome"],
    )
    for outcome in DELIVERY_OUTCOMES:
        deliveries.add_metric([outcome], snap.deliveries.get(outcome, 0))
    yield deliveries
    streams = snap.streams
    yield GaugeMetricFamily(
        "podcast_event_stream_clients", "Readers of GET /api/events now.", value=streams.get("clients", 0)
    )
    yield GaugeMetricFamily(
        "podcast_event_stream_buffered_events",
        "Events queued for the event stream's readers now, over every reader.",
        value=streams.get("buffered", 0),
    )
    yield CounterMetricFamily(
        "podcast_event_stream_dropped_clients",
        "Event-stream readers dropped since this boot because their queue was full (they did not read).",
        value=streams.get("dropped", 0),
    )
    conditions = CounterMetricFamily(
        "podcast_background_conditions",
        "Conditions (the registry, the engine or a disk failing) a background task met since this boot, by step; "
        "each was logged and the step tried again.",
        labels=["step"],
    )
    for step, n in sorted(snap.conditions.items()):
        conditions.add_metric([step], n)
    yield conditions


def _registry_families(view: RegistryView) -> Iterator[Metric]:
    """The registry's last read: the jobs by status and by kind, the pause, the outbox, one series per running job."""
    jobs = GaugeMetricFamily("podcast_jobs", "Jobs in the registry, by status.", labels=["status"])
    for status, n in view.counts.items():
        jobs.add_metric([status], n)
    yield jobs
    yield GaugeMetricFamily("podcast_queue_paused", "1 while promotion is paused.", value=int(view.paused))
    by_kind = GaugeMetricFamily(
        "podcast_queue_jobs", "Jobs running and queued fleet-wide, by kind.", labels=["kind", "status"]
    )
    limits = GaugeMetricFamily(
        "podcast_queue_kind_max_running", "A kind's max_running (kinds with a limit of their own).", labels=["kind"]
    )
    for kind, (kind_running, kind_queued, max_running) in sorted(view.kinds.items()):
        by_kind.add_metric([kind, "running"], kind_running)
        by_kind.add_metric([kind, "queued"], kind_queued)
        if max_running is not None:
            limits.add_metric([kind], max_running)
    yield by_kind
    yield limits
    yield GaugeMetricFamily(
        "podcast_webhook_outbox_depth", "Events in the outbox, not yet delivered.", value=view.outbox_depth
    )
    yield from _job_families(view.running)


def _job_families(running: list[Job]) -> Iterator[Metric]:
    labels = ["job_id", "kind"]
    up = GaugeMetricFamily("podcast_job_running", "1 while the job runs.", labels=labels)
    progress = GaugeMetricFamily(
        "podcast_job_last_progress_timestamp_seconds",
        "When the job's progress watermark last rose (its start while it has made none), Unix time; beats taken "
        "and not yet written included.",
        labels=labels,
    )
    beat = GaugeMetricFamily(
        "podcast_job_last_heartbeat_timestamp_seconds",
        "When the job last sent a heartbeat, Unix time (absent until its first).",
        labels=labels,
    )
    units = GaugeMetricFamily("podcast_job_completed_units", "The job's progress watermark.", labels=labels)
    stalled = GaugeMetricFamily("podcast_job_stalled", "1 while the sweeper judges the job stalled.", labels=labels)
    silent = GaugeMetricFamily("podcast_job_silent", "1 while the sweeper judges the job silent.", labels=labels)
    for job in running:
        key = [job.job_id, job.kind]
        up.add_metric(key, 1)
        progressed = _epoch(job.last_progress_at or job.started_at)
        if progressed is not None:
            progress.add_metric(key, progressed)
        beaten = _epoch(job.last_heartbeat_at)
        if beaten is not None:
            beat.add_metric(key, beaten)
        units.add_metric(key, job.completed_units)
        stalled.add_metric(key, int(job.stalled))
        silent.add_metric(key, int(job.silent))
    yield from (up, progress, beat, units, stalled, silent)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.transitions = Counter(
            "podcast_job_transitions",
            "Job status changes made by this boot, by new status and reason.",
            ["to", "reason"],
            registry=self.registry,
        )
        self.resubmits = Counter(
            "podcast_job_resubmits",
            "Crashed attempts this boot resubmitted (ADR-150 D4), by what the attempt ended with.",
            ["why"],
            registry=self.registry,
        )
        self.liveness_unknown = Counter(
            "podcast_liveness_unknown",
            "Sweeps' judgements of a running job whose liveness could not be established (its slot was kept).",
            registry=self.registry,
        )
        self.sweep_duration = Histogram(
            "podcast_sweep_duration_seconds",
            "Duration of each completed sweep (reconcile, absence judgement, drain).",
            buckets=SWEEP_BUCKETS_S,
            registry=self.registry,
        )
        self._snapshot = _SnapshotCollector()
        self.registry.register(self._snapshot)
        # The counter's children by label values: looked up by the client library on every change otherwise (a
        # lock, a tuple, validation), and there are few of them (statuses x reasons).
        self._transition_children: dict[tuple[str, str], Any] = {}

    def on_event(self, event: JobEvent) -> None:
        """Event-bus subscriber."""
        if event.event is EventName.TRANSITION:
            key = (str(event.job.status), reason_label(event.reason))
            child = self._transition_children.get(key)
            if child is None:
                child = self._transition_children[key] = self.transitions.labels(to=key[0], reason=key[1])
            child.inc()
            reason = event.reason or ""
            if event.job.status is JobStatus.QUEUED and reason.startswith(RESUBMITTED):
                self.resubmits.labels(why=reason_label(reason.removeprefix(RESUBMITTED))).inc()

    def render(self, snapshot: Snapshot) -> bytes:
        """The text exposition with ``snapshot`` as the gauges' values (synchronous: one consistent scrape)."""
        self._snapshot.snapshot = snapshot
        data: Any = generate_latest(self.registry)
        return bytes(data)
