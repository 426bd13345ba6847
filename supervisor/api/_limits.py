"""How long the HTTP server waits on a client, and how much it reads: one validated value object, seconds and bytes.

Every bound is finite and positive: a client that opens a body and never finishes it, stops reading an answer, or
keeps an idle connection open cannot hold a request task, a connection or a graceful stop for longer than these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


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

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"HttpLimits.{f.name} must be a positive finite number, not {value!r}")
