"""What every verb of the ``supervisor`` command shares: its exit codes, where it writes (``Io``), how a client
verb is run (``run_client``: its client built from the environment, its failures told as a message and an exit
code), and how a live one runs on trio (``run_live``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import trio

from ..domain import ConfigError, read_token_file
from . import _live
from ._client import DEFAULT_URL, ApiError, Client, NotTheApi, Unreachable

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_UNREACHABLE = 4
# sysexits' EX_TEMPFAIL: a temporary condition (the registry locked by another process at start), not a broken
# configuration; the same start may succeed later.
EXIT_TEMPFAIL = 75
# serve: a newer release contracted the registry's schema; this release cannot run on it (a restart loop would not
# help: the unit's RestartPreventExitStatus names it). As graphile-worker's exit on a breaking migration.
EXIT_SCHEMA_CONTRACTED = 5
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away

ENV_URL = "PODCAST_JOB_URL"
ENV_API_TOKEN = "PODCAST_JOB_API_TOKEN"
ENV_API_TOKEN_FILE = "PODCAST_JOB_API_TOKEN_FILE"
_TOKEN_HINT = (
    f"set {ENV_API_TOKEN} (or {ENV_API_TOKEN_FILE}) to a token of the server: its operator token, or one that "
    "supervisor token add made there (and the server took with a SIGHUP)"
)


class Io:
    """Where a client command writes, and the environment it reads (both injectable for tests)."""

    def __init__(self, environ: Mapping[str, str], out: TextIO, err: TextIO) -> None:
        self.environ = environ
        self.out = out
        self.err = err

    def print(self, *parts: object) -> None:
        print(*parts, file=self.out)

    def json(self, payload: Any) -> None:
        print(json.dumps(payload, indent=2, sort_keys=True), file=self.out)

    def write_bytes(self, data: bytes) -> None:
        buffer = getattr(self.out, "buffer", None)
        if buffer is not None:
            self.out.flush()
            buffer.write(data)
            buffer.flush()
        else:
            self.out.write(data.decode("utf-8", errors="replace"))
            self.out.flush()

    def error(self, message: str) -> None:
        print(f"error: {message}", file=self.err)

    def note(self, message: str) -> None:
        """What a human reads and a script ignores: to stderr, as it is."""
        print(message, file=self.err)


ClientCommand = Callable[[Client, argparse.Namespace, Io], int]


def run_client(command: ClientCommand) -> Callable[[argparse.Namespace], int]:
    """Wrap a client command: build the client from the environment, turn failures into messages and exit codes."""

    def run(args: argparse.Namespace) -> int:
        io: Io = args.io
        url = io.environ.get(ENV_URL, "").strip() or DEFAULT_URL
        token = io.environ.get(ENV_API_TOKEN, "").strip() or None
        token_file = io.environ.get(ENV_API_TOKEN_FILE, "").strip()
        if token is None and token_file:
            try:
                token = read_token_file(Path(token_file))
            except ConfigError as exc:
                io.error(f"{ENV_API_TOKEN_FILE}: {exc}")
                return EXIT_CONFIG
        try:
            client = Client(url, token=token)
        except ValueError as exc:
            io.error(f"{ENV_URL}: {exc}")
            return EXIT_CONFIG
        try:
            with client:
                return command(client, args, io)
        except BaseExceptionGroup as group:
            # A live command runs on trio, whose nurseries wrap what they raise: an error of the client's, or the
            # Ctrl-C, is told as from any other command.
            leaf = _only_leaf(group)
            if leaf is None:
                raise
            return _leaf_exit(leaf, io, args)
        except (ApiError, Unreachable) as exc:
            return _leaf_exit(exc, io, args)
        except KeyboardInterrupt:
            return getattr(args, "interrupted_exit", EXIT_INTERRUPTED)

    return run


def _only_leaf(group: BaseExceptionGroup) -> BaseException | None:
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    kinds = (ApiError, Unreachable, KeyboardInterrupt)
    found = [leaf for leaf in leaves if isinstance(leaf, kinds)]
    return found[0] if found and len(found) == len(leaves) else None


def _leaf_exit(leaf: BaseException, io: Io, args: argparse.Namespace) -> int:
    if isinstance(leaf, ApiError):
        io.error(leaf.describe())
        if leaf.status == 401:
            io.error(_TOKEN_HINT)
        return EXIT_ERROR
    if isinstance(leaf, NotTheApi):
        io.error(f"{leaf}; set {ENV_URL} to a supervisor's address")
        return EXIT_UNREACHABLE
    if isinstance(leaf, Unreachable):
        io.error(f"{leaf}; is `supervisor serve` running there? (set {ENV_URL} to its address)")
        return EXIT_UNREACHABLE
    return int(getattr(args, "interrupted_exit", EXIT_INTERRUPTED))


def is_terminal(io: Io) -> bool:
    isatty = getattr(io.out, "isatty", None)
    return bool(isatty and isatty())


def run_live(client: Client, run: Any) -> int:
    """Run a live command (``_live``) on trio, with its own async client to the same server."""
    code: int = trio.run(_live.with_api, client.base_url, client.token, run)
    return code


def table_time(ts: object) -> str:
    """An ISO-8601 UTC timestamp, to the second, for tables."""
    if not isinstance(ts, str) or not ts:
        return "-"
    return ts[:19].replace("T", " ") + "Z"


def print_table(io: Io, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [[str(h) for h in headers], *[["-" if c is None or c == "" else str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        io.print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
