"""What the shepherd writes to disk: each job's state records (``Records``, placed by ``RecordKeeper``), its own
marker (``Marker``), the optional trace (``Trace``), all written atomically (``write_atomically``, ``Spares``).

Part of the shepherd (``shepherd.py``, run as a script): it imports nothing but the standard library, as the
shepherd does. The records' names and formats are what a supervisor of any boot reads (``_job_files``): a shepherd
of an earlier boot may still be writing them while a new supervisor reads.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime


def say(message: str) -> None:
    """One diagnostic line on stderr (the shepherd's log file). Never raises: that file is most often on the disk
    that just filled up, and a shepherd that died of its own complaint would leave every job unwatched."""
    try:
        os.write(2, message.encode(errors="replace") + b"\n")
    except OSError:
        pass


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def write_atomically(path: str, payload: dict[str, object], spare: str | None = None) -> None:
    """Write JSON to ``path`` so that a reader sees the old file or the whole new one, never a part.

    ``spare``: an empty file of this shepherd's, made beforehand in the same directory, written and renamed instead of
    a new temporary file (one metadata change on the way instead of two; see ``Spares``).
    """
    fd = None
    if spare is not None:
        # Made empty (O_EXCL) by this shepherd and never written but here: no O_TRUNC, which on ext4 marks the file
        # for a data flush at close (the replace-by-truncate heuristic), three times slower here.
        try:
            tmp, fd = spare, os.open(spare, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            pass  # removed by hand: make the temporary file after all
    if fd is None:
        tmp = f"{path}.tmp{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
    try:
        os.write(fd, json.dumps(payload, sort_keys=True).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


class Spares:
    """Empty files made ahead, while the shepherd is idle, in each directory where it writes state files.

    A state file is written to a temporary file and renamed, so that a reader never sees a part of it; making that
    temporary file is a metadata change as costly as the rename (on this project's VMs, from 20 us to nearly 1 ms
    when the journal is busy), and both sat on the way from a job's exit to the next job's start (docs/performance.md:
    promotion latency). A spare is made while nothing else waits; taking one costs nothing. When none is left (a
    burst), the temporary file is made as before. A shepherd removes its spares when it exits; a killed one's are
    removed, while idle, by the next shepherd that writes in the same directory.
    """

    PER_DIRECTORY = 4
    PREFIX = ".shepherd-spare-"

    def __init__(self) -> None:
        self._ready: dict[str, list[str]] = {}
        self._broken: set[str] = set()
        self._unswept: set[str] = set()  # directories whose dead shepherds' spares are still to be removed
        self._seq = 0

    def take(self, path: str) -> str | None:
        directory = os.path.dirname(path)
        if directory not in self._ready:
            self._ready[directory] = []
            self._unswept.add(directory)  # swept while idle: the jobs' directory holds every past job's files
        ready = self._ready[directory]
        return ready.pop(0) if ready else None  # the oldest first

    def wanted(self) -> bool:
        return bool(self._unswept) or any(
            len(r) < self.PER_DIRECTORY and d not in self._broken for d, r in self._ready.items()
        )

    def make_one(self) -> None:
        """One step of idle work: sweep a directory, or make one missing spare (a failure is left for the write that
        would have used it to meet)."""
        if self._unswept:
            self._sweep_dead(self._unswept.pop())
            return
        for directory, ready in self._ready.items():
            if len(ready) < self.PER_DIRECTORY and directory not in self._broken:
                self._seq += 1
                path = os.path.join(directory, f"{self.PREFIX}{os.getpid()}-{self._seq}")
                try:
                    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640))
                except OSError:
                    # Cannot make files there (gone, full, read-only): no spares there; writes make their own.
                    self._broken.add(directory)
                    return
                ready.append(path)
                return

    def remove_all(self) -> None:
        for ready in self._ready.values():
            for path in ready:
                try:
                    os.unlink(path)
                except OSError:
                    pass
        self._ready.clear()

    def _sweep_dead(self, directory: str) -> None:
        """Spares left by a shepherd that was killed (its pid no longer runs)."""
        try:
            names = [n for n in os.listdir(directory) if n.startswith(self.PREFIX)]
        except OSError:
            return
        for name in names:
            try:
                pid = int(name[len(self.PREFIX) :].split("-", 1)[0])
                os.kill(pid, 0)
                continue  # alive (or another user's): not ours to remove
            except ProcessLookupError:
                pass
            except (ValueError, PermissionError):
                continue
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


class Records:
    """One job's two state records (``pid``: its identity; ``exit``: its true exit status) and where they are.

    While a supervisor is connected, a record is written to the run directory (tmpfs: no journal, so microseconds,
    where a create-and-rename in the jobs' directory on ext4 cost about 1 ms under load, twice per job;
    docs/performance.md), and the supervisor says ``forget`` once the job's row is final: the registry then holds
    everything they say, and the run copies go. When the supervisor goes away (or the shepherd is told to stop) every
    record still in the run directory is first written next to the log (``RecordKeeper.persist``), and from then on
    records are written there directly: what a next boot reads is where it always was, and survives an orderly reboot.
    Without a run directory (none configured, or it cannot be written) a record goes next to the log at once, as before.
    """

    __slots__ = ("durable", "in_run", "payload", "run")

    def __init__(self, durable: dict[str, str], run: dict[str, str]) -> None:
        self.durable = durable  # "pid"/"exit" -> the path next to the log
        self.run = run  # "pid"/"exit" -> the path in the run directory (empty: none)
        self.payload: dict[str, dict[str, object]] = {}
        self.in_run: set[str] = set()  # which records exist only in the run directory


def write_run_record(path: str, payload: dict[str, object], spares: Spares) -> None:
    """A state record in the run directory (made again, private, if it went)."""
    try:
        write_atomically(path, payload, spares.take(path))
    except FileNotFoundError:
        # The directory went: a shepherd of this data dir's previous boot removes it when it leaves, empty, and may
        # have just done so. Its parents were checked by our supervisor; make it again, private.
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomically(path, payload)


class RecordKeeper:
    """Where each job's state records are written now (see ``Records``), and which exist only in the run directory."""

    def __init__(self, spares: Spares) -> None:
        self.spares = spares
        self.records: dict[str, Records] = {}  # job id -> records that exist only in the run directory
        self.run_dirs: set[str] = set()  # removed when this shepherd leaves, if empty

    def record(self, records: Records, which: str, payload: dict[str, object], *, connected: bool) -> None:
        """Write one state record where it belongs now (see ``Records``); raises OSError when it cannot be written.
        ``connected``: the supervisor is still on the control socket (only then is the run directory used: nobody
        would say ``forget`` otherwise)."""
        run_path = records.run.get(which) if connected else None
        records.payload[which] = payload
        if run_path:
            try:
                write_run_record(run_path, payload, self.spares)
                self.run_dirs.add(os.path.dirname(run_path))
            except OSError as exc:  # the run directory is unusable (full, say): the durable place is always right
                say(f"shepherd: {run_path}: {exc}; writing next to the log")
            else:
                records.in_run.add(which)
                self.records[str(payload["job_id"])] = records
                return
        path = records.durable[which]
        write_atomically(path, payload, self.spares.take(path))

    def forget(self, job_id: str, *, running: bool) -> None:
        """The supervisor has made the job's row final: its run-directory records are redundant. ``running``: the
        job has not been reaped yet (its identity is still evidence: kept)."""
        records = self.records.get(job_id)
        if records is None or running:
            return  # none there, or still running: its identity is still evidence
        del self.records[job_id]
        for which in records.in_run:
            try:
                os.unlink(records.run[which])
            except OSError:
                pass
        records.in_run.clear()

    def persist(self) -> None:
        """Every record that only the run directory holds, written next to its log; then the run copy goes.

        Written before it is removed, so that a reader who looks in the run directory first and then next to the log
        always finds one of them.
        """
        for job_id, records in list(self.records.items()):
            for which in sorted(records.in_run, reverse=True):  # the identity first
                try:
                    write_atomically(records.durable[which], records.payload[which])
                except OSError as exc:  # the run copy stays: a next boot still reads it there (until a reboot)
                    say(f"shepherd: job {job_id}: cannot persist its {which} record: {exc}")
                    continue
                records.in_run.discard(which)
                try:
                    os.unlink(records.run[which])
                except OSError:
                    pass
            if not records.in_run:
                del self.records[job_id]
        sys.stderr.flush()

    def close(self) -> None:
        """As the shepherd leaves: its spares go, and its run directories if empty."""
        self.spares.remove_all()
        for directory in self.run_dirs:
            try:
                os.rmdir(directory)  # only if empty: what a killed shepherd left is still read from there
            except OSError:
                pass


class Marker:
    """The marker (see the module docstring): who this shepherd is, and whether its supervisor is connected. ``error``:
    why it could not be written (no job starts without it)."""

    def __init__(self, identity: Mapping[str, object], boot_id: str | None) -> None:
        self.identity = identity
        self.boot_id = boot_id
        self.path: str | None = None  # where to keep it (the "env" request)
        self.error: str | None = None

    def write(self, control: str) -> None:
        if self.path is None:
            return
        payload: dict[str, object] = {**self.identity, "kernel_boot_id": self.boot_id, "control": control}
        try:
            write_atomically(self.path, payload)
        except OSError as exc:
            self.error = f"cannot write the shepherd's marker {self.path}: {exc}"
            say(f"shepherd: {self.error}")
        else:
            self.error = None

    def remove(self) -> None:
        if self.path is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass  # a marker left behind names a dead shepherd: read the same as none


class Trace:
    """The optional trace (diagnostics: every start and exit as this shepherd saw them, on its clock)."""

    def __init__(self) -> None:
        self.fd: int | None = None

    def open(self, path: str) -> None:
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            say(f"shepherd: cannot open the trace {path}: {exc}")

    def write(self, event: dict[str, object]) -> None:
        """One line of the trace."""
        if self.fd is None:
            return
        try:
            os.write(self.fd, json.dumps(event).encode() + b"\n")  # one write: lines never interleave
        except OSError as exc:
            say(f"shepherd: trace write failed, tracing stops: {exc}")
            os.close(self.fd)
            self.fd = None
