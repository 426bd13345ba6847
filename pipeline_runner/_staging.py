"""Who owns a staging directory, and whether that owner can still be alive.

Each episode attempt stages under ``<corpus>/.tmp/``; a run that is SIGKILLed (or OOM-killed) leaves its staging
directories behind. The next run removes them, but only those whose owner is *provably* gone: another run on the
same corpus may be writing into its own right now. So a staging directory's name says which process made it::

    <job_id>.boot-<boot_id>.pidns-<inode>.pid-<pid>.start-<ticks>.<random>

- ``boot_id``: the kernel's boot id (``/proc/sys/kernel/random/boot_id``). Another boot: every process of it is gone.
- ``pidns``: the inode of the owner's PID namespace (``/proc/self/ns/pid``). A pid is a number *in a namespace*: a
  run in another container (docker mode: one PID namespace per job) may be alive with a pid that, here, names
  nothing or someone else. Its directories are never judged from outside; they are kept.
- ``pid`` and ``start``: the owner's pid and its start time in clock ticks since boot (``/proc/PID/stat`` field 22).
  A bare pid is no identity: pids are recycled, and the start time tells the recycled one apart.

The owner is dead -- and the directory removed -- only when its boot differs, or (same boot, same namespace) no
process has its pid (``/proc`` has no entry *and* ``kill(pid, 0)`` says there is no such process), or the process
with its pid started at another time. Anything else keeps the directory: an owner that is running (this run
included), one in another namespace, one whose ``/proc`` entry cannot be read. Age decides nothing. Names without
an identity (an older runner's ``<job_id>-<random>``, or a run that could not read its own) are left alone.
The corpus is on one host's disk (ADR 0002): the boot id of another host would read as another boot.

Everything here is blocking; callers run it through ``_fs.run_blocking``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Final

PROC: Final = Path("/proc")
# A job id may be long; in a staging name it is only for people to read, so it is cut (in bytes: a file name's
# limit is 255 bytes) to keep the name valid.
_JOB_ID_BYTES: Final = 100
_BOOT_ID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_NAME: Final = re.compile(
    rf"(?P<job>.*)\.boot-(?P<boot>{_BOOT_ID})\.pidns-(?P<ns>[0-9]+)\.pid-(?P<pid>[1-9][0-9]*)"
    r"\.start-(?P<start>[0-9]+)\.[0-9a-f]{12}",
    re.DOTALL,
)
_PID_NS_LINK: Final = re.compile(r"pid:\[([0-9]+)\]")


@dataclasses.dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A process, told apart from every other one on this host, before and after pid reuse and reboots."""

    boot_id: str
    pid_ns: int
    pid: int
    start_ticks: int

    def tag(self) -> str:
        return f"boot-{self.boot_id}.pidns-{self.pid_ns}.pid-{self.pid}.start-{self.start_ticks}"


def staging_name(job_id: str, owner: ProcessIdentity | None) -> str:
    """A new staging directory's name. Without an owner it carries none, and no run will ever remove it."""
    random = uuid.uuid4().hex[:12]
    if owner is None:
        return f"{job_id}-{random}"
    return f"{os.fsdecode(os.fsencode(job_id)[:_JOB_ID_BYTES])}.{owner.tag()}.{random}"


def owner_of(name: str) -> ProcessIdentity | None:
    """The identity in a staging directory's name; None when the name carries none."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    return ProcessIdentity(match["boot"], int(match["ns"]), int(match["pid"]), int(match["start"]))


def _read_stat(proc: Path, pid: int | str) -> tuple[int, int] | None:
    """(pid, start ticks) from ``<proc>/<pid>/stat`` (``self`` works too); None when there is no such entry.

    Any other failure (permission, garbage) raises OSError or ValueError: the caller cannot tell.
    """
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Field 2, the command name, may hold spaces and parentheses: the fields after it start past the last ')'.
    head, _, rest = text.rpartition(")")
    fields = rest.split()
    if not head or len(fields) < 20:
        raise ValueError(f"unexpected /proc stat line {text[:80]!r}")
    return int(head.split(" (", 1)[0]), int(fields[19])  # field 22 is the 20th after the name


def read_boot_id(proc: Path = PROC) -> str | None:
    try:
        boot = (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip().lower()
    except OSError:
        return None
    return boot if re.fullmatch(_BOOT_ID, boot) else None


def read_own_identity(proc: Path = PROC) -> ProcessIdentity | None:
    """This process's identity, or None when any part of it cannot be read (not Linux, /proc not mounted...)."""
    boot = read_boot_id(proc)
    try:
        stat = _read_stat(proc, "self")
        ns = _PID_NS_LINK.fullmatch(os.readlink(proc / "self" / "ns" / "pid"))
    except (OSError, ValueError):
        return None
    if boot is None or stat is None or ns is None:
        return None
    return ProcessIdentity(boot, int(ns[1]), stat[0], stat[1])


class Verdict(enum.Enum):
    DEAD = "dead"  # provably: the directory may go
    ALIVE = "alive"  # the owner is running
    UNKNOWN = "unknown"  # cannot tell from here: keep


def judge(owner: ProcessIdentity, me: ProcessIdentity, proc: Path = PROC) -> tuple[Verdict, str]:
    """Is ``owner`` provably gone, seen from this process (``me``)? With the reason, for the log."""
    if owner.boot_id != me.boot_id:
        return Verdict.DEAD, f"its owner ran under another kernel boot ({owner.boot_id})"
    if owner.pid_ns != me.pid_ns:
        return Verdict.UNKNOWN, (
            f"its owner, pid {owner.pid}, is in another PID namespace ({owner.pid_ns}, this run's is {me.pid_ns}), "
            "where it cannot be looked up from here"
        )
    if owner == me:
        return Verdict.ALIVE, "it is this run's"
    try:
        stat = _read_stat(proc, owner.pid)
    except (OSError, ValueError) as exc:
        return Verdict.UNKNOWN, f"cannot read {proc}/{owner.pid}/stat ({exc})"
    if stat is None:
        # No /proc entry. Under hidepid another user's processes have none either: ask the kernel too (signal 0
        # only checks that the pid exists; nothing is sent).
        try:
            os.kill(owner.pid, 0)
        except ProcessLookupError:
            return Verdict.DEAD, f"no process has its owner's pid {owner.pid}"
        except OSError:
            pass
        return Verdict.UNKNOWN, f"pid {owner.pid} exists but {proc}/{owner.pid} does not (hidden?)"
    if stat[1] != owner.start_ticks:
        return Verdict.DEAD, (
            f"pid {owner.pid} is another process now (it started at tick {stat[1]}, the owner at {owner.start_ticks})"
        )
    return Verdict.ALIVE, f"its owner, pid {owner.pid}, is running"


@dataclasses.dataclass
class SweepReport:
    removed: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (name, why the owner is dead)
    kept_alive: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    kept_unknown: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    not_removable: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # dead owner, rmtree failed
    without_owner: list[str] = dataclasses.field(default_factory=list)  # old-format names, stray files
    error: str | None = None  # the staging root could not be listed


def sweep(staging_root: Path, me: ProcessIdentity, proc: Path = PROC) -> SweepReport:
    """Remove every staging directory under ``staging_root`` whose owner is provably dead; report on all."""
    report = SweepReport()
    try:
        entries = sorted(staging_root.iterdir())
    except FileNotFoundError:
        return report
    except OSError as exc:
        report.error = f"cannot list {staging_root}: {exc}"
        return report
    for entry in entries:
        owner = owner_of(entry.name)
        if owner is None or entry.is_symlink() or not entry.is_dir():
            report.without_owner.append(entry.name)
            continue
        verdict, why = judge(owner, me, proc)
        if verdict is Verdict.ALIVE:
            report.kept_alive.append((entry.name, why))
        elif verdict is Verdict.UNKNOWN:
            report.kept_unknown.append((entry.name, why))
        else:
            shutil.rmtree(entry, ignore_errors=True)
            if entry.exists():
                report.not_removable.append((entry.name, why))
            else:
                report.removed.append((entry.name, why))
    return report
