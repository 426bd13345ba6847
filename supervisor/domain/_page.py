"""A page of the job list as a caller asks for it: filters, a size, and where the previous page ended.

The wire's text (``?status=queued&cursor=42``) becomes a ``PageRequest`` at the edge (``PageRequest.parse``, called by
the API); the core and the registry take only the value, which cannot be built out of bounds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._errors import ValidationError
from ._idempotency import key_problem
from ._model import JobStatus

MAX_LIST_LIMIT = 1000
DEFAULT_LIST_LIMIT = 100
# The shape of every cursor a registry issues: a row's sequence number in ASCII digits that fit a 64-bit integer
# (int() also takes '1_0', '-3' and other scripts' digits). Opaque to callers; the OpenAPI document states it.
CURSOR_PATTERN = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class PageRequest:
    """Rows newest first, before the row ``before`` (its ``seq``: the previous page's cursor), at most ``limit``;
    ``idempotency_key``: only the jobs that live key answered. Out of bounds is a ``ValidationError`` naming the
    field, at construction."""

    status: JobStatus | None = None
    kind: str | None = None
    limit: int = DEFAULT_LIST_LIMIT
    before: int | None = None
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_LIST_LIMIT:
            raise ValidationError(f"limit must be between 1 and {MAX_LIST_LIMIT}", field="limit")
        if self.before is not None and not 0 <= self.before < 10**18:
            raise ValidationError("cursor is not one this server issued", field="cursor")
        problem = key_problem(self.idempotency_key) if self.idempotency_key is not None else None
        if problem is not None:
            raise ValidationError(f"idempotency_key {problem}", field="idempotency_key")

    @classmethod
    def parse(
        cls,
        *,
        status: str | None = None,
        kind: str | None = None,
        limit: int = DEFAULT_LIST_LIMIT,
        cursor: str | None = None,
        idempotency_key: str | None = None,
    ) -> PageRequest:
        """The request from its wire text: a status by its value, a cursor as a registry issued it."""
        if status is not None and status not in {s.value for s in JobStatus}:
            raise ValidationError(f"unknown status {status!r}", field="status")
        if cursor is not None and not CURSOR_PATTERN.fullmatch(cursor):
            raise ValidationError("cursor is not one this server issued", field="cursor")
        return cls(
            status=JobStatus(status) if status is not None else None,
            kind=kind,
            limit=limit,
            before=int(cursor) if cursor is not None else None,
            idempotency_key=idempotency_key,
        )


# The first page of every row at the default size: a caller's default.
FIRST_PAGE = PageRequest()
