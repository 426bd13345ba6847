"""What the supervisor tells the world: the event bus and its log lines, the webhook sender, the event stream
(``GET /api/events``), the metrics, systemd.

Nothing here decides anything about a job: the core announces (``EventBus.emit``), these parts report.
"""

from ._events import EventBus, EventName, JobEvent, log_event
from ._logging import ResilientStream, configure_logging, get_logger
from ._metrics import Metrics, QueueGauges, RegistryView, Snapshot
from ._notify import Notifier, run_watchdog
from ._stream import EVENT_NAMES, GAP, LAST_EVENT_ID, EventLog, StreamEnded, StreamEvent, Subscription
from ._webhook import BACKOFF_MAX_S, WebhookSender, backoff_s, render_event, sign

__all__ = [
    "BACKOFF_MAX_S",
    "EVENT_NAMES",
    "GAP",
    "LAST_EVENT_ID",
    "EventBus",
    "EventLog",
    "EventName",
    "JobEvent",
    "Metrics",
    "Notifier",
    "QueueGauges",
    "RegistryView",
    "ResilientStream",
    "Snapshot",
    "StreamEnded",
    "StreamEvent",
    "Subscription",
    "WebhookSender",
    "backoff_s",
    "configure_logging",
    "get_logger",
    "log_event",
    "render_event",
    "run_watchdog",
    "sign",
]
