"""Structured logs: one JSON object per line on stderr.

Not only ours: the standard-library logging of the libraries in the server process (urllib3's "connection pool is
full" under the Docker SDK, asyncio's "task exception was never retrieved" under trio-asyncio, asyncpg's) and Python's
warnings go through the same renderer, with their logger's name, so that a log pipeline reading these lines never
meets a plain-text traceback. Those libraries speak from WARNING up: their INFO and DEBUG are for their developers.

Every event is declared in ``_log_events.LOG_EVENTS`` (docs/log-events.md). A line written while an API request is
served carries that request's ``request_id`` and ``by`` (``RequestScope``), whichever part of the code writes it.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

import structlog

_configured = False
FOREIGN_LEVEL = logging.WARNING  # the least level of another library's record that reaches the log


class ResilientStream:
    """The log's output, which never raises into the code that logs (ADR 0010).

    The log may sit on the disk that just filled up (an operator redirects stderr to a file in the data dir). A line
    that cannot be written is dropped and counted, never raised: a log call sits in every loop of the supervisor,
    the lease's renewal among them, and none of them may stop for want of a log line. The first line written once
    the stream takes writes again says how many were lost (``log_lines_dropped``)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.dropped = 0  # whole lines lost since the last one written
        self._in_dropped_line = False  # a piece of a line was dropped: the rest of it goes too, never half a line
        self._lock = threading.Lock()  # worker threads log too

    def write(self, text: str) -> int:
        with self._lock:
            if self._in_dropped_line:
                return self._drop(text)
            try:
                if self.dropped:
                    note = json.dumps(
                        {"dropped": self.dropped, "event": "log_lines_dropped", "level": "warning", "timestamp":
                         datetime.now(UTC).isoformat().replace("+00:00", "Z")}, sort_keys=True
                    ) + "\n"  # fmt: skip
                    self.stream.write(note)
                    self.stream.flush()
                    self.dropped = 0
                self.stream.write(text)
                return len(text)
            except (OSError, ValueError):  # ENOSPC, EIO, EPIPE; ValueError: the stream was closed
                return self._drop(text)

    def _drop(self, text: str) -> int:
        """``text`` is lost (a ``print`` writes a line and its newline apart: a line counts once, at its end)."""
        self.dropped += text.count("\n")
        self._in_dropped_line = not text.endswith("\n")
        return 0

    def flush(self) -> None:
        with self._lock:
            try:
                self.stream.flush()
            except (OSError, ValueError):
                pass  # what the stream still holds is written with its next line, once it can be


@dataclass
class RequestScope:
    """The API request being served: its id and, once authenticated, its token's name (``by``). Set by the HTTP
    layer at the request's start (``enter_request``) and closed at its end: a task the request started (a job's
    monitor) inherits the scope with the context, and its lines stop naming the request once that is over."""

    request_id: str
    by: str | None = None
    open: bool = True

    def fields(self) -> dict[str, str]:
        if not self.open:
            return {}
        return {"request_id": self.request_id, **({"by": self.by} if self.by is not None else {})}


_REQUEST: contextvars.ContextVar[RequestScope | None] = contextvars.ContextVar("supervisor_request", default=None)


def enter_request(request_id: str) -> RequestScope:
    """Every line this task (and what it starts) writes until the scope is closed names this request."""
    scope = RequestScope(request_id)
    _REQUEST.set(scope)
    return scope


def request_fields() -> dict[str, str]:
    """``request_id`` and ``by`` of the request being served here (empty: none)."""
    scope = _REQUEST.get()
    return scope.fields() if scope is not None else {}


def _add_request_fields(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in request_fields().items():
        event_dict.setdefault(key, value)  # a line that names its own request keeps it
    return event_dict


def configure_logging(level: int = logging.INFO) -> None:
    global _configured
    if _configured:
        return
    _configured = True
    out = ResilientStream(sys.stderr)  # ours and the libraries' lines: one count of what was dropped
    stamped: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    render: list[Any] = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer(sort_keys=True)]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, _add_request_fields, *stamped, *render],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(out),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,  # the server process only (tests never call this): no bind per line
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *stamped],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]  # instead of the last-resort handler's plain text
    root.setLevel(FOREIGN_LEVEL)
    logging.captureWarnings(True)  # warnings.warn(...) -> the "py.warnings" logger -> a JSON line


def get_logger(**bound: Any) -> Any:
    return structlog.get_logger("supervisor", **bound)
