"""The shepherd's records as the supervisor reads them: a job's two state records (``JobFiles``: ``<id>.pid``,
its identity written before its program runs, and ``<id>.exit``, its true exit status written at reap), in the run
directory or next to its log, and each shepherd's marker (``marker_path``). Blocking reads, for worker threads.

What is read here is what a shepherd writes (``_shepherd_files``), of this boot or of an earlier one still running:
the names and formats are the protocol between them, and do not change.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..domain import Job, Liveness
from ._base import ExitStatus
from ._identity import ProcessIdentity, probe


@dataclass(frozen=True)
class JobFiles:
    """Where one job's log and state records live: next to the log (``pid``, ``exit``), and in the run directory
    while a connected supervisor may still need them (``run_pid``, ``run_exit``; None without a run directory)."""

    log: Path
    pid: Path
    exit: Path
    run_pid: Path | None = None
    run_exit: Path | None = None

    @classmethod
    def for_log(cls, log: Path, run_dir: Path | None = None) -> JobFiles:
        stem = log.name.removesuffix(".log")
        return cls(
            log,
            log.with_suffix(".pid"),
            log.with_suffix(".exit"),
            run_dir / f"{stem}.pid" if run_dir is not None else None,
            run_dir / f"{stem}.exit" if run_dir is not None else None,
        )

    @classmethod
    def for_job(cls, job: Job, log_dir: Path, run_dir: Path | None = None) -> JobFiles:
        """Where the row says its log is (fixed at promotion), else where this boot would put it."""
        return cls.for_log(Path(job.log_path) if job.log_path else log_dir / f"{job.job_id}.log", run_dir)

    @property
    def run_records(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.run_pid, self.run_exit) if p is not None)


@dataclass(frozen=True)
class RecordedStart:
    """What the shepherd recorded before the job's program ran: the job's identity and its own."""

    identity: ProcessIdentity | None
    shepherd: ProcessIdentity | None


def _load_json(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None  # torn or unreadable: files are replaced atomically, so this is not ours; treat as absent
    return data if isinstance(data, dict) else None


def read_start_file(path: Path) -> RecordedStart | None:
    """The ``<id>.pid`` file (blocking). None when the shepherd never recorded the job: it never ran."""
    data = _load_json(path)
    if data is None:
        return None
    identity = None
    if isinstance(data.get("pid"), int) and isinstance(data.get("start_time"), int) and data.get("kernel_boot_id"):
        identity = ProcessIdentity(data["pid"], data["start_time"], str(data["kernel_boot_id"]))
    shepherd = None
    sh = data.get("shepherd")
    shepherd_known = isinstance(sh, dict) and isinstance(sh.get("pid"), int) and isinstance(sh.get("start_time"), int)
    if shepherd_known and identity is not None:
        assert isinstance(sh, dict)
        shepherd = ProcessIdentity(sh["pid"], sh["start_time"], identity.kernel_boot_id)
    return RecordedStart(identity, shepherd)


def read_exit_file(path: Path, pid: int | None = None) -> ExitStatus | None:
    """The ``<id>.exit`` file (blocking): the job's true exit status, or None when none was recorded.

    With ``pid``, only a record of that process counts.
    """
    data = _load_json(path)
    if data is None or (pid is not None and data.get("pid") != pid):
        return None
    code, sig = data.get("exit_code"), data.get("signal")
    if isinstance(code, int) and not isinstance(code, bool):
        return ExitStatus(code=code)
    if isinstance(sig, int) and not isinstance(sig, bool):
        return ExitStatus(signal=sig)
    return None


def read_exit_of(path: Path, identity: ProcessIdentity) -> ExitStatus | None:
    """The exit record at ``path`` (blocking), only if it names exactly ``identity``: pid, start time and kernel boot
    id (INV-PID-NEEDS-BOOT-AND-IDENTITY). A record of a pid alone (a shepherd from before these fields) is None."""
    data = _load_json(path)
    if data is None:
        return None
    named = (data.get("pid"), data.get("start_time"), data.get("kernel_boot_id"))
    if named != (identity.pid, identity.start_time, identity.kernel_boot_id):
        return None
    return read_exit_file(path, identity.pid)


def read_start(files: JobFiles) -> RecordedStart | None:
    """The job's start record (blocking): in the run directory first, then next to the log.

    In that order: the shepherd writes a record next to the log before it removes the run copy, never after.
    """
    if files.run_pid is not None and (found := read_start_file(files.run_pid)) is not None:
        return found
    return read_start_file(files.pid)


MARKER_PREFIX = ".shepherd-"


def marker_path(log_dir: Path, boot_id: str) -> Path:
    """Where the shepherd of supervisor boot ``boot_id`` keeps its marker: next to that boot's job logs."""
    return log_dir / f"{MARKER_PREFIX}{boot_id}.json"


@dataclass(frozen=True)
class ShepherdMarker:
    """A shepherd's marker (``shepherd.py``): who it is, and whether its supervisor was still connected."""

    identity: ProcessIdentity | None
    connected: bool


def read_marker(path: Path) -> ShepherdMarker | None:
    """The marker at ``path`` (blocking); None when there is none (its shepherd has exited, or never started)."""
    data = _load_json(path)
    if data is None:
        return None
    identity = None
    if isinstance(data.get("pid"), int) and isinstance(data.get("start_time"), int) and data.get("kernel_boot_id"):
        identity = ProcessIdentity(data["pid"], data["start_time"], str(data["kernel_boot_id"]))
    return ShepherdMarker(identity, data.get("control") == "connected")


def may_still_start(marker: ShepherdMarker | None) -> bool:
    """Whether that shepherd may yet start a job its (dead) supervisor asked for: it is alive and has not read the
    end of its control socket. An unverifiable identity counts as alive (INV-UNKNOWN-KEEPS-SLOT)."""
    if marker is None or not marker.connected:
        return False
    return marker.identity is None or probe(marker.identity) is not Liveness.DEAD


def prune_markers(log_dir: Path) -> None:
    """Remove the markers of shepherds that are gone (blocking): a killed one cannot remove its own, and a marker
    naming a dead shepherd says no more than no marker at all."""
    try:
        paths = list(log_dir.glob(f"{MARKER_PREFIX}*.json"))
    except OSError:
        return
    for path in paths:
        marker = read_marker(path)
        if marker is not None and marker.identity is not None and probe(marker.identity) is Liveness.DEAD:
            try:
                path.unlink()
            except OSError:
                pass


def read_exit(files: JobFiles, pid: int | None = None) -> ExitStatus | None:
    """The job's exit record (blocking): in the run directory first, then next to the log (see ``read_start``)."""
    if files.run_exit is not None and (found := read_exit_file(files.run_exit, pid)) is not None:
        return found
    return read_exit_file(files.exit, pid)


def prepare_run_dir(run_dir: Path, private_from: Path) -> None:
    """Make the run directory (blocking), and refuse one that others could write to.

    Every directory from ``private_from`` down to ``run_dir`` must be a real directory (no symlink) owned by this
    user and writable by nobody else: the default lives on a shared tmpfs (/dev/shm), where another user could have
    made the name first, and a record planted there would be read as a job's identity.
    """
    chain = [run_dir, *(p for p in run_dir.parents if p.is_relative_to(private_from))]
    private_from.parent.mkdir(parents=True, exist_ok=True)
    for directory in reversed(chain):  # the private ones made private: nobody else lists its jobs
        directory.mkdir(mode=0o700, exist_ok=True)
    for directory in chain:
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PermissionError(
                f"{directory} must be a directory of this user's that nobody else can write to "
                f"(owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)})"
            )
