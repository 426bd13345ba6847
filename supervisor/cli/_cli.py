"""The supervisor's command line. serve, check-config, migrate and token work on this machine's settings and files;
the other commands talk HTTP to a running supervisor (PODCAST_JOB_URL, default http://127.0.0.1:8000), sending the
token in PODCAST_JOB_API_TOKEN or PODCAST_JOB_API_TOKEN_FILE: the operator token, or one made by supervisor token
add.

Exit codes: 0 done; 1 the server answered with an error (its message is printed); 2 usage; 3 configuration
(including a malformed PODCAST_JOB_URL); 4 the server could not be reached; 130 interrupted; 141 the reader of
its output went away. wait adds the outcome's: 10 failed, 11 cancelled, 12 stale, 124 the timeout passed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TextIO

from ..domain import RELEASE
from ._args import add_local_verb
from ._command import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_OK, Io
from ._enqueue import add_enqueue_verb
from ._follow import add_follow_verbs
from ._hosts import add_host_verbs
from ._jobs import add_job_verbs
from ._queue import add_promotion_verbs, add_queue_verbs
from ._server import add_server_verbs
from ._tokens import add_token_verb


def _version() -> str:
    """This code's release (docs/fleet.md § Upgrading a fleet), whatever an editable install's metadata says."""
    return RELEASE


def cmd_completion(args: argparse.Namespace) -> int:
    from argcomplete import shell_integration

    args.io.out.write(shell_integration.shellcode(["supervisor"], shell=args.shell))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="supervisor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--config", type=Path, default=None, help="a TOML file of settings (env vars win)")
    verbs = parser.add_subparsers(dest="command", required=True)
    # In the order --help lists them: the local verbs, the client verbs, completion.
    add_server_verbs(verbs)
    add_token_verb(verbs)
    add_enqueue_verb(verbs)
    add_job_verbs(verbs)
    add_queue_verbs(verbs)
    add_host_verbs(verbs)
    add_promotion_verbs(verbs)
    add_follow_verbs(verbs)
    p = add_local_verb(verbs, "completion", "print the shell completion script for bash or zsh")
    p.add_argument("shell", choices=("bash", "zsh"))
    p.set_defaults(func=cmd_completion)
    return parser


class HeldSignals(Protocol):
    """The signals the process's entry held through the imports (``supervisor._entry``, the layer above)."""

    def take(self) -> list[int]: ...

    def release(self) -> None: ...


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    held: HeldSignals | None = None,
) -> int:
    """Run one command. ``environ``/``stdout``/``stderr`` default to the process's (tests pass their own); ``held``:
    the signals the console script held until the command is known (None: nothing held)."""
    parser = build_parser()
    if argv is None:
        # Shell completion: a no-op unless the shell's completion function called us (it then prints and exits).
        import argcomplete

        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    args.io = Io(os.environ if environ is None else environ, stdout or sys.stdout, stderr or sys.stderr)
    try:
        args.held = held
        if held is not None and not getattr(args, "keeps_signals", False):
            held.release()  # a Ctrl-C or SIGTERM during the imports acts now, as it would have then
        code: int = args.func(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`supervisor jobs --json | head -1`): stop quietly, as a tool SIGPIPE stops does,
        # and point stdout at /dev/null so that the interpreter's last flush has nowhere to fail either.
        if stdout is None:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":
    raise SystemExit(main())
