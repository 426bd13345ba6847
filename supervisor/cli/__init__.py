"""The operator's terminal: the ``supervisor`` command line and the HTTP client it talks to a server with.

``serve``, ``check-config`` and ``migrate`` run locally; every other verb is a client of the control API
(``_client.Client``); ``events``, ``wait`` and ``jobs --watch`` read its event stream on trio (``_stream``, ``_live``).
"""

from ._cli import main
from ._client import Answer, ApiError, Client, NotTheApi, Unreachable, with_retries
from ._command import (
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TEMPFAIL,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from ._live import EXIT_CANCELLED, EXIT_FAILED, EXIT_STALE, EXIT_SUCCEEDED, EXIT_TIMEOUT

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_CONFIG",
    "EXIT_ERROR",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_STALE",
    "EXIT_SUCCEEDED",
    "EXIT_TEMPFAIL",
    "EXIT_TIMEOUT",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "Answer",
    "ApiError",
    "Client",
    "NotTheApi",
    "Unreachable",
    "main",
    "with_retries",
]
