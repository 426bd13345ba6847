"""What the supervisor tells the world: the event bus and its log lines (every log event declared once:
``LOG_EVENTS``), the webhook sender, the event stream (``GET /api/events``), the metrics, systemd.

Nothing here decides anything about a job: the core announces (``EventBus.emit``), these parts report.
"""

from ._events import EventBus, EventName, JobEvent, log_event
from ._log_events import LOG_EVENTS, LogEvent, log_events_table
from ._logging import RequestScope, ResilientStream, configure_logging, enter_request, get_logger, request_fields
from ._metrics import Metrics, QueueGauges, RegistryView, Snapshot
from ._notify import Notifier, run_watchdog
from ._stream import EVENT_NAMES, GAP, LAST_EVENT_ID, EventLog, StreamEnded, StreamEvent, Subscription
from ._webhook import BACKOFF_MAX_S, WebhookSender, backoff_s, render_event, sign, sign_standard

__all__ = [
    "BACKOFF_MAX_S",
    "EVENT_NAMES",
    "GAP",
    "LAST_EVENT_ID",
    "LOG_EVENTS",
    "EventBus",
    "EventLog",
    "EventName",
    "JobEvent",
    "LogEvent",
    "Metrics",
    "Notifier",
    "QueueGauges",
    "RegistryView",
    "RequestScope",
    "ResilientStream",
    "Snapshot",
    "StreamEnded",
    "StreamEvent",
    "Subscription",
    "WebhookSender",
    "backoff_s",
    "configure_logging",
    "enter_request",
    "get_logger",
    "log_event",
    "log_events_table",
    "render_event",
    "request_fields",
    "run_watchdog",
    "sign",
    "sign_standard",
]
