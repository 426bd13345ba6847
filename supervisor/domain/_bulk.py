"""Bulk actions: the operator's cancel or retry of every job a filter selects, in two steps that are safe to repeat.

A dry run (``BulkRequest`` with a ``filter`` and ``dry_run``) answers the ids it selects and a ``Selection`` token,
kept fleet-wide for ``SELECTION_TTL_S``. The action (``BulkRequest`` with that ``selection``) acts on exactly those
ids, never on a job that matched later, and each once however often it is repeated: a cancel of a job that ended
changes nothing, and each retry is keyed ``bulk/<token>/<job id>`` (an idempotency key: a repeat answers the job it
made the first time, INV-KEY-ONCE).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from ._errors import ValidationError
from ._page import JobFilter

BULK_ACTIONS = ("cancel", "retry")
# At most this many jobs in one selection: a bigger one is a narrower filter, or several.
MAX_SELECTION = 10_000
SELECTION_TTL_S = 3600.0
# Where a selection is kept: the fleet's settings, ``bulk/<token>``.
SELECTION_PREFIX = "bulk/"
TOKEN = re.compile(r"[A-Za-z0-9_-]{16,64}")


@dataclass(frozen=True)
class BulkRequest:
    """A dry run (``filter``, ``dry_run``) or the action on a dry run's ``selection``; nothing else (its body is read
    at the edge: ``api.parse_bulk``)."""

    action: str
    filter: JobFilter | None = None
    selection: str | None = None
    dry_run: bool = False

    def __post_init__(self) -> None:
        if self.action not in BULK_ACTIONS:
            actions = ", ".join(BULK_ACTIONS)
            raise ValidationError(f"action must be one of {actions}, not {self.action!r}", field="action")
        if self.dry_run and self.filter is None:
            raise ValidationError("a dry run selects by a filter: give filter", field="filter")
        if not self.dry_run and self.selection is None:
            raise ValidationError(
                "a bulk action acts on a dry run's selection: send the filter with dry_run first, then its selection",
                field="selection",
            )
        if self.filter is not None and self.selection is not None:
            raise ValidationError("give a filter (with dry_run) or a selection, not both", field="selection")
        if self.selection is not None and not TOKEN.fullmatch(self.selection):
            raise ValidationError("selection is not a token this server issued", field="selection")


@dataclass(frozen=True)
class Selection:
    """What a dry run selected: the ids, for which action, by whom, until when (kept as a fleet setting)."""

    token: str
    action: str
    job_ids: tuple[str, ...]
    by: str | None
    expires_at: datetime
