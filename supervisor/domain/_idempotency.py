"""Idempotency keys (ADR 0016): a client's name for one enqueue request, so that its retries make no second
job. The key is recorded with what the request made, in the transaction that made it; the same key with the same
request answers that again, and with another request is refused.

What makes two requests "the same" is the request, not the jobs' arguments: the route (one job or a batch) and each
job's kind and validated params, in order (``fingerprint``). Two clients that enqueue the same arguments under two
keys get two jobs (that is coalescing's business, ADR-152 §8, not this).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._errors import InvalidHeader

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
# The answer to a request whose key was seen: what the first request was answered, and this header on it.
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_CHARS = 255
# Printable ASCII; no space at either end (HTTP drops it there, so such a key could never come back the same).
_KEY = re.compile(rf"[!-~](?:[ -~]{{0,{MAX_KEY_CHARS - 2}}}[!-~])?")
# The key a kind's ``then`` follow-up is enqueued under: one per parent job, so a finalize that is run again (a lost
# answer, a second host) never queues a second follow-up.
FOLLOW_UP_PREFIX = "then/"


def key_problem(text: str) -> str | None:
    """Why ``text`` is no idempotency key (None: it is one): 1-255 printable ASCII characters, no space at an end."""
    if not text:
        return "is empty"
    if len(text) > MAX_KEY_CHARS:
        return f"is longer than {MAX_KEY_CHARS} characters ({len(text)})"
    if not _KEY.fullmatch(text):
        return "must be printable ASCII (no control character, no space at either end)"
    return None


# The same rule as a JSON Schema pattern, for the OpenAPI document (a test holds the two together).
KEY_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_KEY_CHARS,
    "pattern": "^[!-~]([ -~]*[!-~])?$",
}


def fingerprint(route: str, jobs: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The request a key names: ``route`` (``enqueue`` or ``batch``) and each job's kind and validated params."""
    canonical = json.dumps([route, [[kind, params] for kind, params in jobs]], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class RequestKey:
    """A client's ``Idempotency-Key``, validated once, where it comes in (``parse``: the API's header); the core
    takes only this."""

    text: str

    def __post_init__(self) -> None:
        problem = key_problem(self.text)
        if problem is not None:
            raise ValueError(f"idempotency key {self.text!r} {problem}")

    @classmethod
    def parse(cls, text: str) -> RequestKey:
        """The header's value as a key, or a 400 naming the header and what is wrong with it."""
        problem = key_problem(text)
        if problem is not None:
            raise InvalidHeader(f"{IDEMPOTENCY_KEY_HEADER} {problem}", field=IDEMPOTENCY_KEY_HEADER)
        return cls(text)


@dataclass(frozen=True)
class IdempotencyKey:
    """A keyed request: the client's key, the request's ``fingerprint``, and how long the key is kept."""

    key: str
    fingerprint: str
    ttl_s: float

    def __post_init__(self) -> None:
        problem = key_problem(self.key)
        if problem is not None:
            raise ValueError(f"idempotency key {self.key!r} {problem}")
        if not self.ttl_s > 0:
            raise ValueError(f"an idempotency key is kept for a positive time, not {self.ttl_s!r} s")


def follow_up_key(parent_job_id: str) -> str:
    return f"{FOLLOW_UP_PREFIX}{parent_job_id}"
