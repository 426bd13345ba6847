"""Copy a job's output from a pipe into its log file, up to a byte cap; then keep draining, writing nothing.

Run as a separate process (``python -I _logcap.py LOG MAX_BYTES``), in its own session, so that a job's output
never depends on the supervisor staying up: the job writes into a pipe whose reader survives a supervisor crash,
and the reader never stops reading, so the job can neither block on a full pipe nor die of SIGPIPE.
This file imports nothing from the package on purpose: it is executed as a script.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    path, cap = sys.argv[1], int(sys.argv[2])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    written = os.fstat(fd).st_size
    truncated = written >= cap
    while True:
        chunk = os.read(0, 65536)
        if not chunk:
            return 0
        if truncated:
            continue
        room = cap - written
        if len(chunk) > room:
            chunk = chunk[:room]
            truncated = True
        os.write(fd, chunk)
        written += len(chunk)
        if truncated:
            os.write(fd, f"\n[log capped at {cap} bytes; further output discarded]\n".encode())


if __name__ == "__main__":
    raise SystemExit(main())
