"""Structured logs: one JSON object per line on stderr.

Not only ours: the standard-library logging of the libraries in the server process (urllib3's "connection pool is
full" under the Docker SDK, asyncio's "task exception was never retrieved" under trio-asyncio, asyncpg's) and Python's
warnings go through the same renderer, with their logger's name, so that a log pipeline reading these lines never
meets a plain-text traceback. Those libraries speak from WARNING up: their INFO and DEBUG are for their developers.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

_configured = False
FOREIGN_LEVEL = logging.WARNING  # the least level of another library's record that reaches the log


def configure_logging(level: int = logging.INFO) -> None:
    global _configured
    if _configured:
        return
    _configured = True
    stamped: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    render: list[Any] = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer(sort_keys=True)]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *stamped, *render],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,  # the server process only (tests never call this): no bind per line
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *stamped],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]  # instead of the last-resort handler's plain text
    root.setLevel(FOREIGN_LEVEL)
    logging.captureWarnings(True)  # warnings.warn(...) -> the "py.warnings" logger -> a JSON line


def get_logger(**bound: Any) -> Any:
    return structlog.get_logger("supervisor", **bound)
