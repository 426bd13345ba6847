"""``JobLedger``: the jobs this boot watches or is starting, and the stops it makes itself: the one mutable state
the core's parts share (ADR 0015 §5; the rest of a ``Boot`` is frozen).

Who writes what, by verb:

    drainer     promoting() around a promotion; hold(rows) once promoted; handed(job, handle) once started;
                release(job) / release_each(jobs) for a start dropped or undone
    monitors    adopt(job, handle) (a prior boot's job); release(job) when a monitor ends
    reconciler  stop_for(job, why) (a stall under stall_action = terminate; a kind's deadline), once the row records it
    monitors    stop_for(job, why) on adopting a job whose row records a stop a prior boot began
    monitors    stop_done(job) once its end is recorded

Everyone reads (``entry``, ``in``, ``being_started``, ``promotion_mark``, ``stopping_for``). Every verb is
synchronous, with no checkpoint inside, and is called on the event loop only (never from a worker thread): each is
whole with respect to every other task, which is all the guarding Trio needs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from ..execution import JobHandle


@dataclass
class Watched:
    """A job this boot watches (one it started, or one it adopted): ``request_cancel`` stops it.

    ``handle`` is None only while the job is being started (the spawn window). ``on_cancel`` is set by the job's
    monitor while it waits for the job's end: it starts the stop then (a cancel in the spawn window is carried out
    as soon as the monitor starts).
    """

    job_id: str
    handle: JobHandle | None = None
    cancel_requested: bool = False
    on_cancel: Callable[[], None] | None = None

    def request_cancel(self) -> None:
        if self.cancel_requested:
            return
        self.cancel_requested = True
        if self.on_cancel is not None:
            self.on_cancel()


class JobLedger:
    """See the module docstring."""

    def __init__(self) -> None:
        self._entries: dict[str, Watched] = {}
        self._stops: dict[str, str] = {}  # job id -> why this boot stops it (``_rules.STOPS``)
        # Promotions asked of the registry whose rows are not held yet (the await of its promote), and how many have
        # begun: a read of the rows that overlapped one may show rows nobody holds yet (``promotion_mark``).
        self._promotions_in_flight = 0
        self._promotions_begun = 0

    # -- the drainer's promotion and starts -------------------------------------------------------------

    @contextlib.contextmanager
    def promoting(self) -> Iterator[None]:
        """Around one promotion, from before its registry step until its rows are held (``hold``) or dropped.
        INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING: while it is under way, a row it promoted is being started, whatever a
        read of the rows shows."""
        self._promotions_in_flight += 1
        self._promotions_begun += 1
        try:
            yield
        finally:
            self._promotions_in_flight -= 1

    def hold(self, job_ids: Iterable[str]) -> None:
        """Promoted rows whose starts this boot now holds (no handle yet: the spawn window)."""
        for job_id in job_ids:
            self._entries.setdefault(job_id, Watched(job_id))

    def handed(self, job_id: str, handle: JobHandle) -> Watched:
        """A held start was made: the job runs as ``handle``."""
        entry = self._entries[job_id]
        entry.handle = handle
        return entry

    def adopt(self, job_id: str, handle: JobHandle) -> Watched | None:
        """Watch a job this boot did not start; None if it is watched already (that entry stays the authority)."""
        if job_id in self._entries:
            return None
        entry = self._entries[job_id] = Watched(job_id, handle=handle)
        return entry

    def release(self, job_id: str, entry: Watched | None = None) -> None:
        """Let go of a job: its monitor ended, or its start was dropped. With ``entry``, only if it is still that one
        (a later adoption of the same job keeps its own)."""
        if entry is None or self._entries.get(job_id) is entry:
            self._entries.pop(job_id, None)

    def release_each(self, job_ids: Iterable[str]) -> None:
        """Let go of held starts that will not be made (a promotion undone, or cut short)."""
        for job_id in job_ids:
            self._entries.pop(job_id, None)

    # -- reads -------------------------------------------------------------------------------------------

    def entry(self, job_id: str) -> Watched | None:
        return self._entries.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def job_ids(self) -> set[str]:
        """The jobs watched or being started now (a copy)."""
        return set(self._entries)

    def entries(self) -> list[Watched]:
        """Their entries now (a copy: a caller may await while it goes through them)."""
        return list(self._entries.values())

    def being_started(self, job_id: str) -> bool:
        """This boot is starting the job now: the drainer holds its start (promoted, not yet handed to its monitor
        or dropped). Past that, an unspawned row of this boot is judged on the executor's evidence like any other
        (INV-UNKNOWN-KEEPS-SLOT): the start's outcome is unknown, never assumed."""
        entry = self._entries.get(job_id)
        return entry is not None and entry.handle is None

    def promotion_under_way(self) -> bool:
        return self._promotions_in_flight > 0

    def promotion_mark(self) -> tuple[int, int]:
        """Taken before and after a read of the rows: if the two differ, or a promotion was under way at the first,
        the read may show rows of a promotion whose start is not yet held here (INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING:
        they are being started, not unheld)."""
        return self._promotions_in_flight, self._promotions_begun

    # -- the supervisor's own stops ----------------------------------------------------------------------

    def stop_for(self, job_id: str, why: str) -> bool:
        """Mark a job as being stopped by the supervisor for ``why`` (a stall, its deadline: it ends with that
        outcome, not cancelled); False if it already is, for whatever reason (the first one stands)."""
        if job_id in self._stops:
            return False
        self._stops[job_id] = why
        return True

    def stopping_for(self, job_id: str) -> str | None:
        """Why the supervisor is stopping the job (None: it is not)."""
        return self._stops.get(job_id)

    def stop_done(self, job_id: str) -> None:
        """The job's end is recorded (or it was never this boot's to stop): the mark goes."""
        self._stops.pop(job_id, None)
