"""The heartbeat path's two economies, used by ``Supervisor.heartbeat`` (the rules stay there and in the registry).

- ``JobTokens``: the token hashes of the jobs running now, in memory, so that the check that must come before a
  heartbeat's body is read costs no registry call. Filled from the event bus when this boot promotes a job and, for
  a job it did not promote (an adopted one), after one registry check; dropped when the job ends. It only ever
  *admits* a token early: a miss or a mismatch asks the registry, and the write that records the beat checks the
  token again in its own transaction, so a stale entry can cost a body read, never a beat recorded for a job that
  ended, nor a 401 turned into another answer (see ``Supervisor.heartbeat``).
- ``BeatBatcher``: the beats that arrive while one is being written wait and go together in the next transaction
  (one thread hop, one lock, one commit and fsync for all of them). Each beat is answered only after the commit
  that holds it: a 204 still means the beat is durable, as with one transaction per beat.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence

from ._registry import Beat, hash_token
from .domain._model import Job, JobStatus
from .observe._events import EventName, JobEvent
from .registry._coalesce import Coalescer

# Far more than any max_concurrent: a bound in case entries for jobs ended by another process are never dropped.
MAX_TOKENS = 100_000


class JobTokens:
    """Token hashes of running jobs by job id; see the module docstring."""

    def __init__(self) -> None:
        self._hashes: dict[str, str] = {}
        self._ends = 0  # bumped at every job end: a lookup that raced with one must not re-admit its token

    def admits(self, job_id: str, token: str) -> bool:
        """True when ``token`` is the token of ``job_id`` as this boot last saw it running (constant-time compare)."""
        known = self._hashes.get(job_id)
        return known is not None and hmac.compare_digest(known, hash_token(token))

    @property
    def generation(self) -> int:
        return self._ends

    def remember(self, job_id: str, token: str, generation: int) -> None:
        """After the registry admitted ``token``: keep it, unless a job ended since ``generation`` was read."""
        if generation != self._ends:
            return
        if len(self._hashes) >= MAX_TOKENS:
            self._hashes.clear()
        self._hashes[job_id] = hash_token(token)

    def forget(self, job_id: str) -> None:
        self._hashes.pop(job_id, None)
        self._ends += 1

    def on_event(self, event: JobEvent) -> None:
        """The event bus's subscriber: learn a token when this boot promotes its job, forget it when the job ends."""
        if event.event is not EventName.TRANSITION:
            return
        job = event.job
        if job.status is JobStatus.RUNNING and job.token_hash is not None:
            self._hashes[job.job_id] = job.token_hash
        elif job.status.is_terminal:
            self.forget(job.job_id)

    def __len__(self) -> int:
        return len(self._hashes)


class BeatBatcher:
    """Coalesce concurrent heartbeats into one registry transaction per batch (a ``Coalescer`` of beats).

    A lone beat is written at once (no timer, no added latency), a beat waits at most for the write in flight, and
    under load each transaction holds every beat that arrived during the previous one.

    ``write`` records a batch and gives, per beat in order, the row after it or the ``RequestError`` it earned;
    ``recorded`` is called with each row in commit order (the absence tracker's ``beat``).
    """

    def __init__(
        self,
        write: Callable[[Sequence[Beat]], Awaitable[Sequence[Job | BaseException]]],
        recorded: Callable[[Job], None],
    ) -> None:
        self._coalescer: Coalescer[Beat, Job] = Coalescer(write, recorded)

    @property
    def batches(self) -> int:
        """Transactions written (for tests and the benchmark's curiosity)."""
        return self._coalescer.calls

    async def record(self, beat: Beat) -> Job:
        """Record ``beat`` (in this task's batch or a later one) and return the row after it, once committed."""
        return await self._coalescer.submit(beat)
