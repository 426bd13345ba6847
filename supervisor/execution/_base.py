"""The executor seam: what the core asks of whatever runs a job, and nothing about how.

The core (``_core.py``) holds the rules: when a job starts, what its exit means, when a slot is freed, when a prior
boot's job is adopted. An ``Executor`` holds the mechanics: a process started by this boot's shepherd
(``subprocess.py``), a container on a Docker engine (``docker.py``), or a task in memory for tests (``memory.py``).

The core speaks to it only in these terms:

- ``unavailable()`` → why no job can start right now (an engine that does not answer), so the queue waits instead.
- ``fault()`` → the engine trouble of now (since when, why), for the health route; no I/O.
- ``start(launch)`` → a ``JobHandle`` whose ``record`` (pid + start time + kernel boot, or container id) goes into the
  row. Whatever the executor writes before the program runs (a start file, a labelled container) is what lets a
  later boot find a job whose record never reached the row (INV-IDENTITY-BEFORE-PROGRAM). It raises
  ``ExecutorUnavailable`` when its engine could not make the start and nothing of the job runs (the job goes back to
  the queue), ``SpawnError`` when this job cannot start (it fails).
- ``wait(handle)`` → the job's ``ExitStatus`` once it has ended and its output is in its log; ``None`` when it is
  gone and nothing recorded how it ended. It raises ``Unwatchable`` when it can no longer be watched at all (the
  row then keeps its slot, and reconcile judges it).
- ``stop(handle, grace_s)`` → ask it to end (SIGTERM, or ``docker stop``), and force it after the grace period.
  Never a blind signal (INV-NEVER-BLIND-SIGNAL): an executor only acts on an identity it verified.
- ``gather_evidence(jobs, boot_id)`` (blocking: run in a thread, before any registry lock) → one ``Evidence`` per
  RUNNING row: tri-state liveness, the recorded exit status, a handle to adopt.
- ``proof_of_end(jobs)`` (blocking) → for rows another host runs (its lease expired): positive proof, readable from
  here, that the row's own recorded process ended, and how (INV-SILENT-HOST-ENDS-BY-PROOF); None for anything else.
- ``collect(handle)`` → make sure the output of a job that ended is in its log (before a reconcile finalizes it).
- ``release(handle)`` → once the row is terminal: forget the job (Docker removes the container).
- ``leftovers()`` (blocking) → what the executor still holds of jobs that no longer run (a stopped container), so that
  a boot can release what a dead boot recorded as ended but never released; None when it cannot tell now.
"""

from __future__ import annotations

import abc
import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import ClassVar

import trio

from ..domain import ExitStatus, IdentityRecord, Job, Liveness, SpawnError, SupervisorError

__all__ = [
    "Evidence",
    "Executor",
    "ExecutorFault",
    "ExitStatus",
    "JobHandle",
    "Launch",
    "Leftover",
    "Liveness",
    "ProofOfEnd",
    "Unwatchable",
]

ORPHAN_DEAD_PID = "orphan_reconciled_dead_pid"


def check_log_writable(log: Path) -> None:
    """Raise ``SpawnError`` naming the path when the job's log could not be written where the row says (blocking):
    its directory gone, not a directory, read-only, or not this user's to write. Checked before a start, so that no
    job runs whose output would be lost (the shepherd checks the same, in its own process)."""
    directory = log.parent
    try:
        st = os.stat(directory)
        if not stat.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))
        if not os.access(directory, os.W_OK | os.X_OK):
            # access() says no without saying why: a read-only mount (which even root cannot write), or permissions.
            code = errno.EROFS if os.statvfs(directory).f_flag & os.ST_RDONLY else errno.EACCES
            raise OSError(code, os.strerror(code), str(directory))
    except OSError as exc:
        raise SpawnError(f"cannot write the job's log {log}: {exc.strerror or exc} ({exc.filename})") from exc


class Unwatchable(SupervisorError):
    """A job that can no longer be watched (its identity is unknown): the row keeps its slot; the sweeper judges it."""


@dataclass(frozen=True)
class Launch:
    """What the core asks an executor to run: one promoted job."""

    job_id: str
    kind: str
    boot_id: str
    argv: Sequence[str]
    env: Mapping[str, str]  # the job's own variables (id, token, heartbeat URL, data dir); never the API token
    data_dir: Path  # absolute; the job's working directory
    log: Path  # where its output goes (fixed in the row at promotion)
    log_max_bytes: int
    attempt: int = 1  # which start of the job this is (a resubmitted job's later attempts: 2, 3, ...)
    memory_max_mb: int | None = None  # its kind's memory bound (docker: the container's limit; subprocess: RLIMIT_AS)


class JobHandle:
    """A job an executor started or found: what the row records, and what log lines name."""

    job_id: str

    @property
    @abc.abstractmethod
    def record(self) -> IdentityRecord:
        """The identity to record in the row (pid + start time + kernel boot id, or a container id): this executor's
        record, which only it reads back (``gather_evidence``, adoption)."""

    @abc.abstractmethod
    def log_fields(self) -> dict[str, object]:
        """How log lines name the job's process: ``{"pid": ...}`` or ``{"container_id": ...}``."""


@dataclass(frozen=True)
class Evidence:
    """What an executor knows of one RUNNING row, gathered before any registry lock.

    ``liveness`` is None when no process was ever recorded or found for the row (the program never ran).
    ``exit_pending``: the job is gone but its exit is about to be recorded (its shepherd lives): adopt and wait.
    ``found``: an identity found outside the row (a start file, a labelled container) for a row that has none.
    ``detail``: why the liveness is unknown (the engine's error), for the WARNING.
    ``outage``: it is unknown because the engine does not answer, which the executor says itself, once per episode
    (``fault()``): the row's kept slot is then no WARNING of its own at every sweep.
    """

    liveness: Liveness | None
    exit_status: ExitStatus | None = None
    exit_pending: bool = False
    handle: JobHandle | None = None
    found: IdentityRecord | None = None
    detail: str | None = None
    outage: bool = False


@dataclass(frozen=True)
class ProofOfEnd:
    """Ground truth this host can read that a job another host ran has ended: its exit status, found under the row's
    own recorded identity (a container with the recorded id, exited; an exit record of the recorded pid + start time +
    kernel boot). ``evidence``: what was read, for the log line. ``handle``: to collect its output into the row's log
    (None: there is nothing to collect, or its log is not reachable from here)."""

    exit_status: ExitStatus
    evidence: str
    handle: JobHandle | None = None


@dataclass(frozen=True)
class ExecutorFault:
    """The executor's engine has not answered (refused, timed out, or answered a server error) since ``since`` (the
    first failure of this episode); ``reason``: the latest failure; ``failed_calls``: how many failed since."""

    since: datetime
    reason: str
    failed_calls: int


@dataclass(frozen=True)
class Leftover:
    """Something an executor holds of one attempt of a job that no longer runs (a stopped container): released once
    the row records that attempt's end."""

    job_id: str
    attempt: int
    handle: JobHandle


class Executor(abc.ABC):
    """Runs jobs for the core. One instance per supervisor boot, chosen once at startup (``create_executor``)."""

    mode: ClassVar[str]
    #: what a job that is gone with no record of how it ended is called in this mode
    orphan_reason: ClassVar[str] = ORPHAN_DEAD_PID
    #: what a kind's ``{python}`` placeholder becomes: the interpreter the job will find where it runs
    python: str

    def attach(self, nursery: trio.Nursery) -> None:  # noqa: B027 - most executors own no task
        """The job nursery: where an executor runs any task it owns (the shepherd's reader)."""

    async def unavailable(self) -> str | None:
        """Why no job can be started now (its engine does not answer), or None. Asked before jobs are promoted."""
        return None

    def fault(self) -> ExecutorFault | None:
        """The engine trouble of now (None: none, or no engine), as last seen by any call; no I/O."""
        return None

    @abc.abstractmethod
    async def start(self, launch: Launch) -> JobHandle:
        """Start a job; raise ``SpawnError`` with a one-line reason when it cannot start, ``ExecutorUnavailable``
        when the engine could not make the start and nothing of it runs (the job is not at fault: it waits)."""

    @abc.abstractmethod
    async def wait(self, handle: JobHandle) -> ExitStatus | None:
        """The job's exit status once it ended (its output in its log); None when gone with nothing recorded."""

    @abc.abstractmethod
    async def stop(self, handle: JobHandle, grace_s: float) -> None:
        """Ask the job to end, then force it after ``grace_s``. Returns once both were sent (or it is gone)."""

    @abc.abstractmethod
    def gather_evidence(self, jobs: Sequence[Job], *, boot_id: str) -> list[Evidence]:
        """Blocking: one ``Evidence`` per row, in order. Never raises for an unreachable engine: UNKNOWN."""

    def proof_of_end(self, jobs: Sequence[Job]) -> list[ProofOfEnd | None]:
        """Blocking: for rows of another host whose lease expired, one answer each, in order: a ``ProofOfEnd`` only
        when this host can read positive proof that exactly the row's recorded process ended (INV-SILENT-HOST-ENDS-
        BY-PROOF). Anything else (running, not found, cannot tell, a pid that looks dead) is None: not evidence
        here. Never raises for an engine that does not answer. By default this host can see none of it."""
        return [None for _ in jobs]

    async def refresh_log(self, job: Job) -> None:  # noqa: B027 - nothing to do where output is live
        """Bring a running job's log up to what it has printed, where output reaches the log only at the end (a
        container's): a reader following the log calls it. Nothing by default (a process writes its log itself)."""

    async def collect(self, handle: JobHandle) -> None:  # noqa: B027 - nothing to do where output is live
        """Make sure an ended job's output is in its log before the row is finalized."""

    async def release(self, handle: JobHandle) -> None:  # noqa: B027 - nothing to forget by default
        """The row is terminal: forget the job (nothing by default)."""

    def leftovers(self) -> list[Leftover] | None:
        """Blocking: what this executor holds of attempts that no longer run (nothing by default); None when it
        cannot tell now (an engine that does not answer). Never a running job's."""
        return []

    async def aclose(self) -> None:  # noqa: B027 - nothing held open by default
        """The supervisor stops: close whatever the executor holds open (its jobs keep running)."""
