"""What every verb group's parser uses: how a verb is added (its help, its --json, its example at the end of its
--help) and the types of the arguments, each a usage error that names what is wrong.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from ..domain import key_problem
from ._command import ClientCommand, run_client


def idempotency_key_arg(text: str) -> str:
    problem = key_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"an idempotency key {problem}")
    return text


def job_id_arg(text: str) -> str:
    """A job id as an argument: 1 to 200 printable ASCII characters, no space (the server's ids are 32 hex digits):
    anything else is a usage error naming it, never a URL the HTTP client refuses with a traceback."""
    if not re.fullmatch(r"[!-~]{1,200}", text):
        shown = repr(text[:40]) + ("…" if len(text) > 40 else "")
        raise argparse.ArgumentTypeError(f"a job id is 1-200 printable characters without spaces, not {shown}")
    return text


def param_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, value


def non_negative_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def positive_arg(text: str) -> int:
    value = non_negative_arg(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a positive integer, got 0")
    return value


def timeout_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


# Each verb's example, shown at the end of its --help.
EXAMPLES = {
    "serve": "  PODCAST_JOB_DATA_DIR=./var supervisor serve\n  supervisor --config /etc/podcast/supervisor.toml serve",
    "check-config": "  supervisor check-config\n  supervisor --config supervisor.toml check-config --json",
    "migrate": (
        "  PODCAST_JOB_DATABASE_URL=postgresql://supervisor@db/jobs PODCAST_JOB_DATABASE_AUTO_MIGRATE=false \\\n"
        "    supervisor migrate"
    ),
    "enqueue": (
        "  supervisor enqueue pipeline -p feed=https://example.org/feed.xml -p max_episodes=5\n"
        "  supervisor enqueue --from-file jobs.ndjson --json"
    ),
    "jobs": "  supervisor jobs --status running\n  supervisor jobs --watch        # live; Ctrl-C quits (exit 0)",
    "show": "  supervisor show 4969cb37d2f8447e9734ed35bf48539b",
    "cancel": "  supervisor cancel 4969cb37d2f8447e9734ed35bf48539b",
    "retry": (
        "  supervisor retry 4969cb37d2f8447e9734ed35bf48539b   # prints the new job's id\n"
        '  supervisor wait "$(supervisor retry JOB_ID --json | jq -r .job_id)"'
    ),
    "reconcile": "  supervisor reconcile --json",
    "prune": (
        "  supervisor prune --dry-run               # the finished jobs past the retention, oldest first\n"
        "  supervisor prune                         # remove them now, with their logs"
    ),
    "queue": "  supervisor queue",
    "hosts": (
        "  supervisor hosts                        # every host of the fleet: live or SILENT, and the leader\n"
        "  supervisor hosts forget web-2           # a host that will never come back: its running jobs end\n"
        "  supervisor hosts drain web-2            # nothing new starts there; its jobs run to their end\n"
        "  supervisor hosts wait-drained web-2 --timeout 3600 && systemctl stop ...   # then stop it\n"
        "  supervisor hosts undrain web-2          # back in service"
    ),
    "pause": "  supervisor pause",
    "resume": "  supervisor resume",
    "logs": "  supervisor logs 4969cb37d2f8447e9734ed35bf48539b --follow\n  supervisor logs JOB_ID --tail-bytes 4096",
    "events": (
        "  supervisor events                       # the recent events the server holds\n"
        "  supervisor events --follow --kind job.stalled --kind job.silent\n"
        "  supervisor events -f --job JOB_ID --json"
    ),
    "wait": (
        "  supervisor wait JOB_ID                  # exit 0 succeeded, 10 failed, 11 cancelled, 12 stale\n"
        '  supervisor wait JOB_A JOB_B --timeout 3600 || echo "worst outcome: $?"   # 124: timed out'
    ),
    "token": (
        "  supervisor token add ci-bot --scope enqueue > ci-bot.token   # the token, once; kept as a digest\n"
        "  supervisor token list\n"
        "  supervisor token revoke ci-bot && kill -HUP \"$(pidof -s supervisor)\""
    ),
    "completion": (
        "  supervisor completion bash > /etc/bash_completion.d/supervisor\n"
        '  supervisor completion zsh > "${fpath[1]}/_supervisor"'
    ),
}


def epilog(name: str) -> str:
    return "example:\n" + EXAMPLES[name]


def add_local_verb(verbs: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    """Add a verb to the command's subparsers (``verbs``): its help, and its example at the end of its --help."""
    p: argparse.ArgumentParser = verbs.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=epilog(name),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return p


def add_client_verb(
    verbs: Any, name: str, command: ClientCommand, help_text: str, *, json_flag: bool = True
) -> argparse.ArgumentParser:
    """Add a verb that talks to the server: ``command`` run by ``run_client``, with --json unless ``json_flag`` is
    False."""
    p = add_local_verb(verbs, name, help_text)
    if json_flag:
        p.add_argument("--json", action="store_true", help="print the server's JSON answer")
    p.set_defaults(func=run_client(command))
    return p
