"""History that does not grow forever (docs/operations.md § History retention): finished jobs older than the retention
go -- their registry rows, each attempt's log and the shepherd's state records beside it -- in small batches, from the
sweeper, at most once a minute, and so do expired idempotency keys (ADR 0016). Like Oban's pruner, or a Kubernetes Job's
``ttlSecondsAfterFinished``.

The registry chooses the rows (``Registry.prune_jobs``: never a queued or running one, never one whose events are
still in the outbox) and removes them first; the files go after, in a worker thread. A crash between the two leaves
files with no row (the disk's loss, never a row that points at nothing it promised); a file already gone is no error.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import trio

from ..domain import MAX_LIST_LIMIT, SELECTION_PREFIX, SELECTION_TTL_S, ValidationError
from ..observe import get_logger
from ..registry import PrunedJob, log_name
from ._boot import Boot

log = get_logger()

# The sweeper prunes at most this often, and at most this many jobs at a time: a history of millions is worked off a
# batch a minute (720,000 a day), never in one long transaction beside the jobs' own writes.
PRUNE_INTERVAL_S = 60.0
PRUNE_BATCH_JOBS = 500
# Expired idempotency keys removed per turn (rows: one per job a key answered): a day of keys is worked off in minutes.
EXPIRE_BATCH_KEYS = 10_000


def job_files(job: PrunedJob) -> list[Path]:
    """Every file a finished job left beside its log: each attempt's log (``<id>.log``, ``<id>.<n>.log``) and the
    shepherd's ``.pid`` and ``.exit`` records next to each (``execution.subprocess.JobFiles``)."""
    if job.log_path is None:
        return []  # it never started: it wrote nothing
    where = Path(job.log_path).parent
    out: list[Path] = []
    for attempt in range(1, max(job.attempts, 1) + 1):
        log_file = where / log_name(job.job_id, attempt)
        out += [log_file, log_file.with_suffix(".pid"), log_file.with_suffix(".exit")]
    return out


def remove_files(paths: Sequence[Path]) -> int:
    """Remove what exists of ``paths`` (blocking: a worker thread's); how many were removed. A file that cannot be
    removed is logged and left."""
    removed = 0
    for path in paths:
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("pruned_job_file_not_removed", path=str(path), error=str(exc))
    return removed


class Pruner:
    """The retention rules of the boot's config applied to its registry: by the sweeper (``maybe_prune``), or by the
    operator now (``prune``). Only while this host does the fleet's once-only duties (``Standing.may_lead``: one host
    prunes)."""

    def __init__(self, boot: Boot) -> None:
        self.boot = boot
        self.interval_s = PRUNE_INTERVAL_S
        self.batch_jobs = PRUNE_BATCH_JOBS
        self.batch_keys = EXPIRE_BATCH_KEYS
        self._last_at: float | None = None  # trio.current_time() of the last sweep's prune

    @property
    def enabled(self) -> bool:
        return self.boot.config.retention_days is not None or self.boot.config.retention_max_jobs is not None

    async def maybe_prune(self) -> list[PrunedJob]:
        """The sweeper's turn, unless another host leads or the last turn was less than ``interval_s`` ago: expired
        idempotency keys go (whatever the retention: keys never pile up), then one batch of jobs unless retention
        is off (a job a live key answered is kept until the key expires)."""
        if not self.boot.standing.may_lead():
            return []
        now = trio.current_time()
        if self._last_at is not None and now - self._last_at < self.interval_s:
            return []
        self._last_at = now
        expired = await self.boot.registry.expire_keys(limit=self.batch_keys)
        if expired:
            log.info("idempotency_keys_expired", rows=expired)
        # Bulk selections past their time: their ids are no use to anybody now (a repeat makes a new dry run).
        cutoff = self.boot.wall_clock() - timedelta(seconds=SELECTION_TTL_S)
        dropped = await self.boot.registry.drop_settings(SELECTION_PREFIX, cutoff)
        if dropped:
            log.info("bulk_selections_expired", rows=dropped)
        if not self.enabled:
            return []
        return await self.prune(limit=self.batch_jobs)

    async def prune(self, *, limit: int = MAX_LIST_LIMIT, dry_run: bool = False) -> list[PrunedJob]:
        """Up to ``limit`` finished jobs past the retention, oldest first, removed with their files (``dry_run``:
        only what would go). Nothing when retention is off."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise ValidationError(f"limit must be between 1 and {MAX_LIST_LIMIT}, not {limit}", field="limit")
        if not self.enabled:
            return []
        days = self.boot.config.retention_days
        ended_before = self.boot.wall_clock() - timedelta(days=days) if days is not None else None
        gone = await self.boot.registry.prune_jobs(
            ended_before=ended_before, keep_latest=self.boot.config.retention_max_jobs, limit=limit, dry_run=dry_run
        )
        if gone and not dry_run:
            files = [path for job in gone for path in job_files(job)]
            removed = await trio.to_thread.run_sync(remove_files, files)
            log.info(
                "jobs_pruned",
                jobs=len(gone),
                files_removed=removed,
                oldest_ended_at=gone[0].ended_at.isoformat(),
                newest_ended_at=gone[-1].ended_at.isoformat(),
            )
        return gone
