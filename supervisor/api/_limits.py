"""How long the HTTP server waits on a client, and how much it reads: one validated value object, seconds and bytes.

Every bound is finite and positive: a client that opens a body and never finishes it, stops reading an answer, or
keeps an idle connection open cannot hold a request task, a connection or a graceful stop for longer than these.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

# Descriptors kept for everything but connections: the registry's pool, the jobs' pipes and logs, the engine's
# sockets, the signal and notify sockets.
RESERVED_DESCRIPTORS = 256


@dataclass(frozen=True)
class HttpLimits:
    # An idle connection (kept alive after an answer, or opened and not yet sending a complete request head) is
    # closed after this long: it bounds slow request heads too.
    keep_alive_timeout_s: float = 5.0
    # A request body not complete within this is answered 408.
    body_timeout_s: float = 10.0
    # An answer not written within this (a client that stops reading) is cut and its connection closed.
    response_timeout_s: float = 60.0
    # How long a graceful stop lets requests in flight finish; idle keep-alive connections close at once.
    graceful_timeout_s: float = 1.0
    # A request line plus headers that grow past this without being complete are answered 431 and the connection
    # closed. (h11 checks while a head is incomplete, so a head that arrives in one read may be up to 64 KiB larger.)
    max_head_bytes: int = 16 * 1024
    # Connections open at once; one more is answered 503 (``Retry-After``) and closed at once, so that clients that
    # open many connections and read nothing cannot exhaust the process's descriptors or its memory.
    max_connections: int = 512
    # An answer's write that moves no byte for this long (a client that stopped reading) is cut and its connection
    # closed: what such a client pins in memory is one answer, for this long at most.
    write_stall_timeout_s: float = 10.0
    # Bytes of answers written and not yet taken by their clients, over every connection. A large write that would go
    # past this is cut (its connection closed) instead of waiting: clients that read nothing can pin this much
    # memory at most. Writes up to ``small_write_bytes`` (heads, heartbeats' 204, health, errors) always pass.
    max_unsent_answer_bytes: int = 64 * 1024 * 1024
    small_write_bytes: int = 64 * 1024
    # List pages built at once (each reads up to 1,000 rows and encodes them): more wait their turn, so that many
    # at once never keep a heartbeat or /api/health behind them on the event loop.
    max_page_builds: int = 2

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"HttpLimits.{f.name} must be a positive finite number, not {value!r}")

    def fitted_to(self, open_files: int) -> HttpLimits:
        """These limits with ``max_connections`` lowered, if need be, so that the connections and
        ``RESERVED_DESCRIPTORS`` fit in ``open_files`` descriptors (at least one connection): a bound the process
        cannot keep would end in EMFILE for every client, the jobs' starts included."""
        fit = max(1, open_files - RESERVED_DESCRIPTORS)
        return self if self.max_connections <= fit else dataclasses.replace(self, max_connections=fit)

