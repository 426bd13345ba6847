"""JSON-lines events on stdout: ``run_started``, ``feed_failed``, ``episode_done``, ``episode_skipped``,
``episode_failed``, ``episode_cancelled``, ``run_finished``; and the log (``JsonLogFormatter``) as JSON lines on
stderr, so that every line a job's log holds is one JSON object.

Emitting never blocks the caller: lines go through an unbounded in-memory channel to one writer
task, which does the blocking write in a thread. A supervisor that stops reading stdout can
therefore stall the event log, but never a worker or the deadlines.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import trio

from . import _fs


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _write_stdout(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


class EventSink:
    def __init__(self, job_id: str, write_line: Callable[[str], None] | None = _write_stdout) -> None:
        self.job_id = job_id
        self.emitted: list[dict[str, Any]] = []
        self._write_line = write_line
        self._send, self._recv = trio.open_memory_channel[str](math.inf)

    def emit(self, event: str, **fields: Any) -> None:
        record = {"event": event, "job_id": self.job_id, "ts": utc_now_iso(), **fields}
        self.emitted.append(record)
        try:
            self._send.send_nowait(json.dumps(record, sort_keys=True) + "\n")
        except trio.ClosedResourceError:
            # After close() the run is over; a straggler event is kept in `emitted` only.
            pass

    def close(self) -> None:
        """No more events; the writer drains what is queued and returns."""
        self._send.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self._recv:
            async for line in self._recv:
                if self._write_line is not None:
                    await _fs.run_blocking(self._write_line, line)


class JsonLogFormatter(logging.Formatter):
    """A log record as one JSON line, shaped like an event: ``{"event": "log", "level", "logger", "message",
    "job_id", "ts"}``, plus ``exception`` (the traceback, one string) when there is one. Python's warnings come
    through it too (``logging.captureWarnings``: logger ``py.warnings``). Without it a library's warning was a plain
    text line among the job's JSON events (docs/operations.md § Logs)."""

    def __init__(self, job_id: str | None) -> None:
        super().__init__()
        self.job_id = job_id

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "event": "log",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "job_id": self.job_id,
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }
        if record.exc_info:
            line["exception"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(line, sort_keys=True, default=str)


def configure_logging(level: str | int, job_id: str | None) -> None:
    """The runner's log: JSON lines on stderr at ``level`` (and Python's warnings with them)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter(job_id))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)
