"""Which boot this one succeeds on its data dir, proved (ADR 0012 §9): a lock on the data dir.

Every ``supervisor serve`` holds an exclusive ``flock`` on ``<data>/.viewer/supervisor.lock`` for the life of its
process, the file naming its boot id. The kernel releases the lock when the process ends, however it ends (a
SIGKILL, an OOM kill, a crash): a boot that takes the lock knows that the boot named in the file is gone, on this
machine, for good. That boot's host lease -- and its lead -- are then taken at once instead of after the lease runs
out (``Registry.renew_lease(succeeds=...)``): a crash-restarted single box leads again in well under a second.

What the lock proves is only that: the boot named in *this* data dir's file is gone. Another machine given the same
host id has its own data dir and its own file, naming its own boots, so a boot never succeeds a live boot of another
machine, and two machines with one host id still never lead together (the lead passes only once the other's lease
has expired). A data dir that another live supervisor holds is said (``data_dir_in_use``) and this boot claims no
succession; the file system must support ``flock`` (local disks do; NFS through its lock manager).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from ..observe import get_logger

log = get_logger()

LOCK_NAME = "supervisor.lock"
MAX_BOOT_ID_BYTES = 200


class DataDirLock:
    """This process's hold on its data dir (``take``), and the boot it proved gone (``succeeds``; None: none)."""

    def __init__(self, fd: int | None, succeeds: str | None) -> None:
        self._fd = fd
        self.succeeds = succeeds

    @classmethod
    def take(cls, viewer_dir: Path, boot_id: str) -> DataDirLock:
        """Blocking (a worker thread's): lock the file, read whose it was, write this boot's id."""
        path = viewer_dir / LOCK_NAME
        try:
            viewer_dir.mkdir(parents=True, exist_ok=True)
            # O_CLOEXEC: a process this one execs (the shepherd) must not hold the lock after this boot is gone.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            # A data dir that cannot be made or written: opening the registry says so, in its one line.
            log.debug("data_dir_not_locked", path=str(path), error=str(exc))
            return cls(None, None)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            log.warning(
                "data_dir_in_use",
                path=str(path),
                why="another supervisor on this machine holds this data dir: this boot claims no succession",
            )
            return cls(None, None)
        previous = os.pread(fd, MAX_BOOT_ID_BYTES, 0).decode(errors="replace").strip() or None
        os.ftruncate(fd, 0)
        os.pwrite(fd, boot_id.encode(), 0)
        os.fsync(fd)
        return cls(fd, previous if previous != boot_id else None)

    def release(self) -> None:
        """At the end of the process's serve (an in-process restart takes it again)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
