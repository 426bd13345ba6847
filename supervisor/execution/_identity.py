"""Process identity and tri-state liveness.

A pid alone is not evidence: pids are recycled, and a pid recorded before a reboot (or in another PID namespace)
names nothing. INV-PID-NEEDS-BOOT-AND-IDENTITY: a process is identified by pid + its start time (clock ticks
since kernel boot, /proc/PID/stat field 22) + the kernel boot id. A pid whose start time or kernel boot differs is
a different process: for us, the one we recorded is dead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..domain import IdentityRecord, Liveness

PROC = Path("/proc")
RECORD_KIND = "process"


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    start_time: int
    kernel_boot_id: str

    def to_record(self) -> IdentityRecord:
        """The row's identity record (its fields are what the API shows as pid, pid_start_time, kernel_boot_id)."""
        return IdentityRecord(
            RECORD_KIND, {"pid": self.pid, "pid_start_time": self.start_time, "kernel_boot_id": self.kernel_boot_id}
        )

    @classmethod
    def from_record(cls, record: IdentityRecord | None) -> ProcessIdentity | None:
        """INV-PID-NEEDS-BOOT-AND-IDENTITY: a record without all three (a bare pid) is no identity."""
        if record is None or record.kind != RECORD_KIND:
            return None
        pid, start, boot = (record.fields.get(k) for k in ("pid", "pid_start_time", "kernel_boot_id"))
        if not isinstance(pid, int) or not isinstance(start, int) or not isinstance(boot, str) or not boot:
            return None
        return cls(pid, start, boot)


def kernel_boot_id() -> str | None:
    """This kernel's boot id; None where the kernel does not expose one."""
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _read_stat(pid: int) -> tuple[str, int] | None:
    """(state, start_time) of ``pid``, or None when no such process exists.

    Raises OSError for any other failure, which callers treat as "cannot tell".
    """
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = text[text.rindex(")") + 2 :].split()
    return rest[0], int(rest[19])


def identify(pid: int) -> ProcessIdentity | None:
    """The identity of a live process, or None when it cannot be read."""
    boot = kernel_boot_id()
    try:
        stat = _read_stat(pid)
    except (OSError, ValueError, IndexError):
        return None
    if stat is None or boot is None:
        return None
    return ProcessIdentity(pid, stat[1], boot)


def probe(identity: ProcessIdentity) -> Liveness:
    """Is the process with exactly this identity alive?"""
    current_boot = kernel_boot_id()
    if current_boot is None:
        return Liveness.UNKNOWN
    if current_boot != identity.kernel_boot_id:
        return Liveness.DEAD  # the machine rebooted: every process of that boot is gone
    try:
        stat = _read_stat(identity.pid)
    except (OSError, ValueError, IndexError):
        return Liveness.UNKNOWN
    if stat is None:
        return Liveness.DEAD
    state, start_time = stat
    if start_time != identity.start_time:
        return Liveness.DEAD  # the pid was recycled: another process owns the number now
    if state in ("Z", "X"):
        return Liveness.DEAD  # exited; only its exit status is left to collect
    return Liveness.ALIVE


def pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid`` (Linux 5.3+), or None where unavailable."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
    except OSError:
        return None
    return fd
