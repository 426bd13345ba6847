"""The supervisor's log may sit on the disk that filled up (ADR 0010): a line that cannot be written is dropped and
counted, never raised into the code that logs -- the lease's renewal logs too, and must never stop for it -- and the
first line written once the disk takes writes again says how many were lost."""

from __future__ import annotations

import errno
import json

import structlog

from supervisor.observe import ResilientStream


class Disk:
    """A stream on a disk that is full until ``full`` is False."""

    def __init__(self) -> None:
        self.full = True
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.lines.append(text)
        return len(text)

    def flush(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_drops_log_lines_and_never_raises_then_says_how_many_it_lost() -> None:
    disk = Disk()
    stream = ResilientStream(disk)  # type: ignore[arg-type]
    log = structlog.wrap_logger(
        structlog.PrintLogger(stream),  # type: ignore[arg-type]
        processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer(sort_keys=True)],
    )
    for n in range(3):
        log.warning("host_lease_stale", n=n)  # raised OSError before: into whatever loop logged it
    assert disk.lines == [] and stream.dropped == 3
    disk.full = False
    log.info("registry_writes_recovered")
    dropped, recovered = (json.loads(line) for line in "".join(disk.lines).splitlines())
    assert (dropped["event"], dropped["dropped"], dropped["level"]) == ("log_lines_dropped", 3, "warning")
    assert recovered["event"] == "registry_writes_recovered" and stream.dropped == 0
