"""The operator's bulk actions (``domain._bulk``): a dry run keeps its selection fleet-wide, and the action on it
acts on exactly those ids, each once however often it is repeated (after a lost answer, or a supervisor killed
halfway: what was done is on the rows and in the idempotency keys, so the repeat finishes the rest)."""

from __future__ import annotations

import json
import secrets
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..domain import (
    MAX_SELECTION,
    SELECTION_PREFIX,
    SELECTION_TTL_S,
    BulkRequest,
    IdempotencyKey,
    JobNotFound,
    JobStatus,
    RequestError,
    Selection,
    SelectionNotFound,
    ValidationError,
    fingerprint,
    from_iso,
    to_iso,
)
from ..observe import get_logger
from ._boot import Boot
from ._enqueue import Enqueuer
from ._ports import Cancels

log = get_logger()


@dataclass(frozen=True)
class BulkAnswer:
    """A dry run's selection (``job_ids``, ``selection``, ``expires_at``), or what the action did to each id
    (``results``: ``cancelled``, ``cancel_requested``, ``already_ended``, ``retried`` (with ``new_job_ids``), or
    ``refused: why``), with the counts of each."""

    action: str
    selection: str
    count: int
    expires_at: datetime
    dry_run: bool
    job_ids: tuple[str, ...] = ()
    results: dict[str, str] = field(default_factory=dict)
    new_job_ids: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)


class Bulk:
    """Dry runs and bulk actions over the registry's rows; ``cancel``: the supervisor's own cancel of one job."""

    def __init__(self, boot: Boot, enqueuer: Enqueuer, monitors: Cancels) -> None:
        self.boot = boot
        self.enqueuer = enqueuer
        self.monitors = monitors

    async def run(self, request: BulkRequest, by: str | None) -> BulkAnswer:
        if request.dry_run:
            return await self._select(request, by)
        return await self._act(request, by)

    async def _select(self, request: BulkRequest, by: str | None) -> BulkAnswer:
        assert request.filter is not None
        ids = await self.boot.registry.select_ids(request.filter, MAX_SELECTION + 1)
        if len(ids) > MAX_SELECTION:
            raise ValidationError(
                f"the filter selects more than {MAX_SELECTION} jobs: narrow it (since, until, reason, ...), or act "
                "in parts",
                field="filter",
            )
        expires = self.boot.wall_clock() + timedelta(seconds=SELECTION_TTL_S)
        chosen = Selection(secrets.token_urlsafe(24), request.action, tuple(ids), by, expires)
        setting = f"{SELECTION_PREFIX}{chosen.token}"
        await self.boot.registry.record_setting(setting, _selection_text(chosen), self.boot.host_id, replace=False)
        log.info("bulk_selected", action=request.action, by=by, selection=chosen.token, count=len(ids))
        return BulkAnswer(request.action, chosen.token, len(ids), expires, True, job_ids=chosen.job_ids)

    async def _act(self, request: BulkRequest, by: str | None) -> BulkAnswer:
        assert request.selection is not None
        kept = await self.boot.registry.setting(f"{SELECTION_PREFIX}{request.selection}")
        chosen = _selection_of(request.selection, kept.value) if kept is not None else None
        if chosen is None or chosen.expires_at <= self.boot.wall_clock():
            raise SelectionNotFound(request.selection)
        if chosen.action != request.action:
            raise ValidationError(f"selection was made for {chosen.action}, not {request.action}", field="action")
        results: dict[str, str] = {}
        made: dict[str, str] = {}
        for job_id in chosen.job_ids:  # exactly the dry run's ids, whatever matches the filter now
            if request.action == "cancel":
                results[job_id] = await self._cancel_one(job_id, by)
            else:
                results[job_id], new_id = await self._retry_one(chosen.token, job_id, by)
                if new_id is not None:
                    made[job_id] = new_id
        outcomes = dict(Counter(result.split(":")[0] for result in results.values()))
        # The audit line: who did what to how many, and how each ended.
        log.info("bulk_action", action=request.action, by=by, selection=chosen.token, count=len(results), **outcomes)
        return BulkAnswer(
            request.action, chosen.token, len(results), chosen.expires_at, False, results=results,
            new_job_ids=made, outcomes=outcomes,
        )  # fmt: skip

    async def _cancel_one(self, job_id: str, by: str | None) -> str:
        try:
            before = await self.boot.registry.get(job_id)
            if before.status.is_terminal:
                return "already_ended"
            after = await self.monitors.cancel(job_id, by)
        except JobNotFound:
            return "refused: no such job (pruned?)"
        if after.status is JobStatus.CANCELLED:
            return "cancelled"
        return "cancel_requested" if after.status is JobStatus.RUNNING else "already_ended"

    async def _retry_one(self, token: str, job_id: str, by: str | None) -> tuple[str, str | None]:
        """A retry keyed by the selection and the job: a repeat of the action answers the job it made the first time
        and makes none (INV-KEY-ONCE). The single retry's rules hold: never a row whose process may still run."""
        try:
            old = await self.boot.registry.get(job_id)
            key = IdempotencyKey(
                f"{SELECTION_PREFIX}{token}/{job_id}",
                fingerprint("retry", [(old.kind, old.params)]),
                self.boot.config.idempotency_ttl_s,
            )
            result = await self.enqueuer.retry(job_id, by, key=key)
        except RequestError as exc:  # a Conflict (its state, its live process), a job pruned since: said, not raised
            return f"refused: {exc}", None
        return "retried", result.job.job_id


# A selection is kept as a fleet setting's text (``bulk/<token>``), as JSON: written and read here only.
def _selection_text(chosen: Selection) -> str:
    fields = {"action": chosen.action, "job_ids": list(chosen.job_ids), "by": chosen.by}
    return json.dumps({**fields, "expires_at": to_iso(chosen.expires_at)})


def _selection_of(token: str, text: str) -> Selection:
    data = json.loads(text)
    return Selection(token, data["action"], tuple(data["job_ids"]), data["by"], from_iso(data["expires_at"]))
