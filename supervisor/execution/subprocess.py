"""Subprocess mode: the executor whose jobs are processes of this boot's shepherd, on this machine.

Jobs are started by this boot's shepherd (``shepherd.py``, its own process and session): it forks each job into
its own session, reads its output into the log, reaps it and writes its true exit status to disk. The supervisor
talks to it over a socket pair (newline-delimited JSON). A supervisor crash never takes the shepherd or the jobs
down; the next boot starts its own shepherd and adopts the prior boot's jobs by their recorded identity.

The shepherd keeps two state records per job (``JobFiles``): ``<id>.pid`` (identity, written before the program
runs) and ``<id>.exit`` (true exit status, written at reap). While this supervisor is connected they are written to
the run directory (tmpfs) and dropped once the job's row is final (``release``); when the supervisor goes away the
shepherd writes whatever is left there next to the job's log, where they otherwise are. Readers look in both.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from ..domain import IdentityRecord, Job, Liveness
from ..observe import get_logger
from ._base import Evidence, Executor, ExitStatus, JobHandle, Launch, ProofOfEnd, Unwatchable
from ._identity import ProcessIdentity, identify, kernel_boot_id, pidfd_open, probe
from ._job_files import (
    JobFiles,
    RecordedStart,
    ShepherdMarker,
    marker_path,
    may_still_start,
    prepare_run_dir,
    read_exit,
    read_exit_file,
    read_exit_of,
    read_marker,
    read_start,
    read_start_file,
)
from ._shepherd_client import ShepherdClient, ShepherdLost

__all__ = [
    "JobFiles",
    "ProcessHandle",
    "ProcessIdentity",
    "RecordedStart",
    "ShepherdClient",
    "ShepherdLost",
    "ShepherdMarker",
    "SubprocessExecutor",
    "identify",
    "identity_of",
    "kernel_boot_id",
    "marker_path",
    "prepare_run_dir",
    "probe",
    "read_exit",
    "read_exit_file",
    "read_exit_of",
    "read_marker",
    "read_start",
    "read_start_file",
    "signal_by_identity",
]

log = get_logger()

# The shepherd answers a start in milliseconds; this bounds a wedged one (``ShepherdClient``).
START_TIMEOUT_S = 30.0


def signal_by_identity(identity: ProcessIdentity, signum: int) -> tuple[bool, int | None]:
    """Signal a process this boot's shepherd does not own, only if it is still exactly the recorded one.

    INV-NEVER-BLIND-SIGNAL: a pidfd is opened first and the identity checked after, so the signal reaches the
    process that was verified, never one that inherited the number. Returns (signalled, pidfd); the caller owns
    the pidfd (it becomes readable when the process exits).
    """
    fd = pidfd_open(identity.pid)
    if fd is None:
        return False, None
    if probe(identity) is not Liveness.ALIVE:
        os.close(fd)
        return False, None
    try:
        signal.pidfd_send_signal(fd, signum)
    except OSError:  # gone (ProcessLookupError) or not ours to signal (PermissionError): the fd is ours to close
        os.close(fd)
        return False, None
    # The leader is verified; its group shares its pid as group id while it lives.
    try:
        os.killpg(identity.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
    return True, fd


def open_verified_pidfd(identity: ProcessIdentity) -> int | None:
    """A pidfd for exactly the recorded process (blocking), or None when it is not (or no longer) that process."""
    fd = pidfd_open(identity.pid)
    if fd is None:
        return None
    if probe(identity) is Liveness.ALIVE:
        return fd
    os.close(fd)
    return None


# -- the executor -------------------------------------------------------------------------------------

# Once an adopted job's process is gone, its shepherd records the exit at reap (milliseconds); this bounds the wait
# for that record while the shepherd is alive.
EXIT_RECORD_WAIT_S = 10.0
EXIT_RECORD_POLL_S = 0.02


def identity_of(job: Job) -> ProcessIdentity | None:
    """INV-PID-NEEDS-BOOT-AND-IDENTITY: a bare pid is no identity."""
    return ProcessIdentity.from_record(job.identity)


def _remove_files(paths: Sequence[Path]) -> None:
    for path in paths:
        try:
            path.unlink()
        except OSError:
            pass


def _shepherd_alive(start: RecordedStart | None) -> bool:
    return bool(start and start.shepherd and probe(start.shepherd) is Liveness.ALIVE)


@dataclass
class ProcessHandle(JobHandle):
    """A job's process: its pid, its verified identity (None only when /proc could not be read), its state files.

    ``adopted``: watched through its identity (pidfd, then the exit file), not through this boot's shepherd: a prior
    boot's job, or one whose shepherd died.
    """

    job_id: str
    pid: int
    identity: ProcessIdentity | None
    files: JobFiles
    adopted: bool = False

    @property
    def record(self) -> IdentityRecord:
        if self.identity is not None:
            return self.identity.to_record()
        # /proc could not be read at the start: the pid alone is recorded, which is no identity (judged UNKNOWN).
        return IdentityRecord("process", {"pid": self.pid, "pid_start_time": None, "kernel_boot_id": None})

    def log_fields(self) -> dict[str, object]:
        return {"pid": self.pid}


class SubprocessExecutor(Executor):
    """Jobs as processes on this machine, children of this boot's shepherd (ADR 0004).

    ``base_env``: the environment every job inherits (the supervisor's, without its private variables); the
    launch's own variables are laid over it. ``log_dir``: where a row without a log path has its state files.
    """

    mode = "subprocess"

    def __init__(
        self,
        *,
        base_env: Mapping[str, str],
        log_dir: Path,
        shepherd_log: Path,
        run_dir: Path | None = None,
        run_dir_private_from: Path | None = None,
        trace: Path | None = None,
    ) -> None:
        self.python = sys.executable
        self._base_env = dict(base_env)
        self._log_dir = log_dir
        self.shepherd = ShepherdClient(
            stderr_path=shepherd_log,
            base_env=self._base_env,
            run_dir=run_dir,
            run_dir_private_from=run_dir_private_from,
            trace=trace,
            start_timeout_s=START_TIMEOUT_S,
        )

    def attach(self, nursery: trio.Nursery) -> None:
        self.shepherd.attach(nursery)

    async def start(self, launch: Launch) -> ProcessHandle:
        files = JobFiles.for_log(launch.log, self.shepherd.run_dir)
        started = await self.shepherd.start_job(
            launch.job_id,
            launch.argv,
            env=launch.env,
            cwd=launch.data_dir,
            files=files,
            log_max_bytes=launch.log_max_bytes,
            marker=marker_path(launch.log.parent, launch.boot_id),
            memory_max_mb=launch.memory_max_mb,
        )
        return ProcessHandle(launch.job_id, started.pid, started.identity, files)

    async def wait(self, handle: JobHandle) -> ExitStatus | None:
        assert isinstance(handle, ProcessHandle)
        if not handle.adopted:
            try:
                return await self.shepherd.wait_exit(handle.job_id)
            except ShepherdLost:
                handle.adopted = True  # from now on, watched and signalled through its identity
                log.warning("job_watched_by_identity", job_id=handle.job_id, pid=handle.pid, why="shepherd lost")
        if handle.identity is None:
            raise Unwatchable("no recorded process identity to watch")
        return await self._await_exit_by_identity(handle.identity, handle.files)

    async def _await_exit_by_identity(self, identity: ProcessIdentity, files: JobFiles) -> ExitStatus | None:
        """Wait for a process this boot's shepherd does not own to exit (pidfd), then for its recorded exit."""
        pidfd = await trio.to_thread.run_sync(open_verified_pidfd, identity)
        if pidfd is not None:
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                trio.lowlevel.notify_closing(pidfd)
                os.close(pidfd)
        # Gone. Its shepherd (if alive) records the exit at reap, within milliseconds: there is no event to wait on
        # across processes, so look for the record, bounded, while that shepherd lives.
        with trio.move_on_after(EXIT_RECORD_WAIT_S):
            while True:
                status = await trio.to_thread.run_sync(read_exit, files, identity.pid)
                if status is not None:
                    return status
                start = await trio.to_thread.run_sync(read_start, files)
                if not await trio.to_thread.run_sync(_shepherd_alive, start):
                    # One last look: it may have written the record just before it exited.
                    return await trio.to_thread.run_sync(read_exit, files, identity.pid)
                await trio.sleep(EXIT_RECORD_POLL_S)
        return None

    async def release(self, handle: JobHandle) -> None:
        """The row is final: its state records say nothing the registry does not (their run copies go)."""
        assert isinstance(handle, ProcessHandle)
        await self.shepherd.forget(handle.job_id)  # this shepherd's job or not: it drops only what it holds
        if handle.adopted and handle.files.run_records:
            # Another shepherd's job (a prior boot's, or ours that died): it left its run copies behind only if it
            # was killed; drop them. What is next to the log stays, as for any job whose supervisor went away.
            await trio.to_thread.run_sync(_remove_files, handle.files.run_records)

    async def stop(self, handle: JobHandle, grace_s: float) -> None:
        assert isinstance(handle, ProcessHandle)
        log.info("job_cancel_signal", job_id=handle.job_id, signal="SIGTERM", pid=handle.pid)
        await self._signal(handle, signal.SIGTERM)
        await trio.sleep(grace_s)
        log.warning("job_cancel_signal", job_id=handle.job_id, signal="SIGKILL", pid=handle.pid)
        await self._signal(handle, signal.SIGKILL)

    async def _signal(self, handle: ProcessHandle, signum: int) -> None:
        """Signal a job's process group: through its shepherd, else only by verified identity."""
        if not handle.adopted and await self.shepherd.signal(handle.job_id, signum):
            return
        if handle.identity is None:
            log.error("job_not_signalled", job_id=handle.job_id, pid=handle.pid, why="no verified identity")
            return
        # INV-NEVER-BLIND-SIGNAL: pidfd first, identity checked, then the signal.
        _, pidfd = await trio.to_thread.run_sync(signal_by_identity, handle.identity, signum)
        if pidfd is not None:
            os.close(pidfd)

    def gather_evidence(self, jobs: Sequence[Job], *, boot_id: str) -> list[Evidence]:
        return [self._evidence(job, this_boot=job.boot_id == boot_id) for job in jobs]

    def proof_of_end(self, jobs: Sequence[Job]) -> list[ProofOfEnd | None]:
        """INV-SILENT-HOST-ENDS-BY-PROOF: the exit record another host's shepherd wrote next to the job's log (where a
        shepherd whose supervisor went away keeps it), readable here (the same machine, or a shared volume), naming
        the row's full identity. Never a probe of the pid: another machine's pid says nothing here, and a process
        that looks alive or dead by its number is no proof. No record, or one of another process: None."""
        out: list[ProofOfEnd | None] = []
        for job in jobs:
            identity = identity_of(job)
            if identity is None or job.log_path is None:
                out.append(None)
                continue
            # Next to the log only: the other host's run directory is its own (a tmpfs of its machine).
            exit_path = JobFiles.for_log(Path(job.log_path)).exit
            status = read_exit_of(exit_path, identity)
            out.append(ProofOfEnd(status, f"exit record {exit_path}") if status is not None else None)
        return out

    def _evidence(self, job: Job, *, this_boot: bool) -> Evidence:
        files = JobFiles.for_job(job, self._log_dir, self.shepherd.run_dir)
        # A start this boot gave up on (no answer in time, a drain cancelled part way): asked before the record.
        pending = not job.spawned and this_boot and self.shepherd.start_pending(job.job_id)
        start = read_start(files)
        identity = identity_of(job)
        found = None
        if pending and (start is None or start.identity is None):
            # INV-UNKNOWN-KEEPS-SLOT: this boot's shepherd was asked to start it and has not answered yet.
            return Evidence(Liveness.UNKNOWN, detail="its start was asked of this boot's shepherd, not yet answered")
        if not job.spawned and not this_boot and (start is None or start.identity is None):
            if job.log_path is not None and job.boot_id is not None:
                marker = read_marker(marker_path(Path(job.log_path).parent, job.boot_id))
                if may_still_start(marker):
                    # INV-UNKNOWN-KEEPS-SLOT: a start that boot sent just before it died may still be in its
                    # shepherd's hands (it reads what is on its socket after the supervisor is gone).
                    return Evidence(Liveness.UNKNOWN, detail="no start record yet: its shepherd may still start it")
            # That shepherd has handled every request it was sent (or is gone): a record written meanwhile is
            # there now, and none means the start never happened.
            start = read_start(files)
        if not job.spawned and start is not None and start.identity is not None:
            # INV-IDENTITY-BEFORE-PROGRAM: a prior boot died between the spawn and recording the pid (or this boot
            # gave up on the start's answer); the shepherd's start file names the process.
            identity = start.identity
            found = identity.to_record()
        if identity is None:
            # A pid without its start time is no evidence either way (UNKNOWN); no pid at all: it never ran.
            return Evidence(Liveness.UNKNOWN if job.spawned else None, detail="no verifiable process identity")
        liveness = probe(identity)
        exit_status = read_exit(files, identity.pid) if liveness is Liveness.DEAD else None
        return Evidence(
            liveness,
            exit_status=exit_status,
            exit_pending=_shepherd_alive(start),
            handle=ProcessHandle(job.job_id, identity.pid, identity, files, adopted=True),
            found=found,
        )
