"""Bulk actions: the operator's cancel or retry of every job a filter selects, in two steps that are safe to repeat.

A dry run (``BulkRequest`` with a ``filter`` and ``dry_run``) answers the ids it selects and a ``Selection`` token,
kept fleet-wide for ``SELECTION_TTL_S``. The action (``BulkRequest`` with that ``selection``) acts on exactly those
ids, never on a job that matched later, and each once however often it is repeated: a cancel of a job that ended
changes nothing, and each retry is keyed ``bulk/<token>/<job id>`` (an idempotency key: a repeat answers the job it
made the first time, INV-KEY-ONCE).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from ._errors import ValidationError
from ._kinds import KindCatalog
from ._model import from_iso, to_iso
from ._page import PARAM_PREFIX, JobFilter

BULK_ACTIONS = ("cancel", "retry")
# At most this many jobs in one selection: a bigger one is a narrower filter, or several.
MAX_SELECTION = 10_000
SELECTION_TTL_S = 3600.0
# Where a selection is kept: the fleet's settings, ``bulk/<token>``.
SELECTION_PREFIX = "bulk/"
TOKEN = re.compile(r"[A-Za-z0-9_-]{16,64}")


@dataclass(frozen=True)
class BulkRequest:
    """A dry run (``filter``, ``dry_run``) or the action on a dry run's ``selection``; nothing else."""

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

    @classmethod
    def parse(cls, body: object, kinds: KindCatalog | None = None) -> BulkRequest:
        """The request from its JSON body; a 422 names the field."""
        if not isinstance(body, Mapping):
            raise ValidationError("the body must be a JSON object", field="body")
        unknown = sorted(set(body) - {"action", "filter", "selection", "dry_run"})
        if unknown:
            raise ValidationError(f"unknown field {unknown[0]!r}", field=unknown[0])
        action, dry_run, selection = body.get("action"), body.get("dry_run", False), body.get("selection")
        if not isinstance(action, str):
            raise ValidationError("action must be a string", field="action")
        if not isinstance(dry_run, bool):
            raise ValidationError("dry_run must be true or false", field="dry_run")
        if selection is not None and not isinstance(selection, str):
            raise ValidationError("selection must be a string", field="selection")
        raw = body.get("filter")
        wanted: JobFilter | None = None
        if raw is not None:
            if not isinstance(raw, Mapping):
                raise ValidationError("filter must be an object of the list's filters", field="filter")
            texts: dict[str, str] = {}
            for name, value in raw.items():
                # A filter's value is its text, as in the list's query; a param's may be its JSON value too.
                if str(name).startswith(PARAM_PREFIX) and not isinstance(value, str):
                    if not isinstance(value, bool | int | float):
                        raise ValidationError(f"filter.{name} must be a string or a number", field=f"filter.{name}")
                    value = json.dumps(value)
                if not isinstance(value, str):
                    raise ValidationError(f"filter.{name} must be a string", field=f"filter.{name}")
                texts[str(name)] = value
            try:
                wanted = JobFilter.parse(texts, kinds)
            except ValidationError as exc:
                field = f"filter.{exc.field}" if exc.field else "filter"
                raise ValidationError(f"filter: {exc}", field=field) from None
        return cls(action, wanted, selection, dry_run)


@dataclass(frozen=True)
class Selection:
    """What a dry run selected: the ids, for which action, by whom, until when (kept as a fleet setting)."""

    token: str
    action: str
    job_ids: tuple[str, ...]
    by: str | None
    expires_at: datetime

    def to_json(self) -> str:
        return json.dumps(
            {"action": self.action, "job_ids": list(self.job_ids), "by": self.by, "expires_at": to_iso(self.expires_at)}
        )

    @classmethod
    def from_json(cls, token: str, text: str) -> Selection:
        data = json.loads(text)
        return cls(token, data["action"], tuple(data["job_ids"]), data["by"], from_iso(data["expires_at"]))
