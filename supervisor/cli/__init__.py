"""The operator's terminal: the ``supervisor`` command line and the HTTP client it talks to a server with.

``serve``, ``check-config`` and ``migrate`` run locally; every other verb is a client of the control API
(``_client.Client``).
"""

from ._cli import EXIT_CONFIG, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, main
from ._client import ApiError, Client, Unreachable

__all__ = [
    "EXIT_CONFIG",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "ApiError",
    "Client",
    "Unreachable",
    "main",
]
