"""A job's log as a read gets it: which bytes (``log_slice_of``), then read a chunk at a time (``LogSlice``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import trio

from ..domain import Job, JobNotFound, JobStatus
from ..execution import Executor
from ..registry import log_name

LOG_CHUNK_BYTES = 64 * 1024  # a log is read and sent this much at a time, however large


@dataclass(frozen=True)
class LogSlice:
    """Bytes ``start`` to ``end`` of a job's log (``path`` None: it has none yet)."""

    path: Path | None
    start: int
    end: int

    async def chunks(self, chunk_bytes: int = LOG_CHUNK_BYTES) -> AsyncIterator[bytes]:
        """The slice, ``chunk_bytes`` at a time. INV-LOG-READ-BOUNDED: a read holds one chunk in memory, never the
        log; the file is opened for each chunk, so a reader that stops half way leaves nothing open."""
        position = self.start
        while self.path is not None and position < self.end:
            data = await trio.to_thread.run_sync(_read_at, self.path, position, min(chunk_bytes, self.end - position))
            if not data:
                return  # shorter than it was (replaced by hand): what is there has been read
            position += len(data)
            yield data


async def log_slice_of(
    job: Job, tail_bytes: int | None, offset: int | None, attempt: int | None, executor: Executor | None = None
) -> LogSlice:
    """Which bytes of ``job``'s log a read gets: whole, its last ``tail_bytes``, or from byte ``offset`` on, up to its
    size now; ``attempt``: that attempt's log (each attempt has its own; default the latest). A log file is
    append-only (capped, never rotated), so an offset stays valid while it grows. An attempt the job never had is not
    there (``JobNotFound`` naming it, a 404), before any byte is read."""
    if attempt is not None and not 1 <= attempt <= max(job.attempts, 1):
        raise JobNotFound(job.job_id, attempt=attempt, attempts=job.attempts)
    if executor is not None and job.status is JobStatus.RUNNING and attempt in (None, job.attempts):
        await executor.refresh_log(job)  # ``executor``: the job's own host's, which can read its process
    if job.log_path is None:
        return LogSlice(None, 0, 0)
    path = Path(job.log_path)
    if attempt is not None:
        path = path.parent / log_name(job.job_id, attempt)

    def size() -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    end = await trio.to_thread.run_sync(size)
    start = max(0, end - tail_bytes) if tail_bytes is not None else min(offset or 0, end)
    return LogSlice(path, start, end)


def _read_at(path: Path, position: int, size: int) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(position)
            return fh.read(size)
    except FileNotFoundError:
        return b""
