"""Following jobs as they run: ``logs`` prints a job's log (and, with --follow, what comes, attempt by attempt),
``events`` the event stream, ``wait`` waits for jobs' ends and exits with their outcome (``_live``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..domain import JobStatus
from ..observe import EVENT_NAMES
from . import _live
from ._args import add_client_verb, job_id_arg, non_negative_arg, timeout_arg
from ._client import Client
from ._command import EXIT_OK, Io, is_terminal, run_live

# logs --follow: poll quickly while output flows, back off to at most FOLLOW_MAX_INTERVAL_S while it is quiet.
FOLLOW_MIN_INTERVAL_S = 0.2
FOLLOW_MAX_INTERVAL_S = 2.0


def cmd_logs(client: Client, args: argparse.Namespace, io: Io) -> int:
    if not args.follow:
        io.write_bytes(client.log(args.job_id, tail_bytes=args.tail_bytes))
        return EXIT_OK
    # Follow by attempt and byte offset: each attempt of a resubmitted job has its own log, append-only, so what was
    # printed never changes under us; an attempt is read to its end before the next (docs/operations.md § Logs: one
    # offset kept across attempts printed the next one from the wrong place).
    attempt, offset, first = 1, 0, True
    interval = FOLLOW_MIN_INTERVAL_S
    while True:
        # The row before the read: once it is terminal, or a later attempt has begun, this attempt's output is
        # complete and one more read takes the rest of it.
        row = client.get_job(args.job_id)
        status, attempts = JobStatus(row["status"]), max(int(row["attempts"]), 1)
        if first and args.tail_bytes is not None:
            attempt = attempts  # the last bytes of the latest attempt, then on from there
        chunk = client.log(args.job_id, offset=offset, attempt=attempt)
        shown = chunk[-args.tail_bytes :] if first and args.tail_bytes is not None else chunk
        first = False
        if shown:
            io.write_bytes(shown)
        offset += len(chunk)
        if attempt < attempts:
            attempt, offset = attempt + 1, 0  # this attempt has ended, and its log was read to its end
            io.err.write(f"job {args.job_id}: attempt {attempt}\n")
            continue
        if status.is_terminal:
            io.err.write(f"job {args.job_id} is {status}\n")
            return EXIT_OK
        interval = FOLLOW_MIN_INTERVAL_S if chunk else min(interval * 2, FOLLOW_MAX_INTERVAL_S)
        time.sleep(interval)


def cmd_events(client: Client, args: argparse.Namespace, io: Io) -> int:
    args.interrupted_exit = EXIT_OK  # Ctrl-C is how --follow ends
    out = _live.Output(io.out, live=False, err=io.err)
    return run_live(
        client,
        lambda api: _live.run_events(
            api, out, follow=args.follow, jobs=args.job or (), kinds=args.kind or (), as_json=args.json
        ),
    )


def cmd_wait(client: Client, args: argparse.Namespace, io: Io) -> int:
    out = _live.Output(io.out, live=is_terminal(io) and not args.json, quiet=args.json, err=io.err)
    return run_live(
        client, lambda api: _live.run_wait(api, out, args.job_ids, timeout_s=args.timeout, as_json=args.json)
    )


def add_follow_verbs(verbs: Any) -> None:
    """logs, events, wait."""
    p = add_client_verb(verbs, "logs", cmd_logs, "print a job's log", json_flag=False)
    p.add_argument("job_id", type=job_id_arg)
    p.add_argument("--tail-bytes", type=non_negative_arg, metavar="N", help="only the last N bytes")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    p = add_client_verb(
        verbs, "events", cmd_events, "print job events: those the server holds, then new ones with --follow"
    )
    p.add_argument("-f", "--follow", action="store_true", help="keep printing events as they happen; Ctrl-C quits")
    p.add_argument("--job", action="append", metavar="JOB_ID", help="only this job's events (repeatable)")
    p.add_argument("--kind", action="append", choices=list(EVENT_NAMES), help="only events of this name (repeatable)")
    p = add_client_verb(
        verbs,
        "wait",
        cmd_wait,
        "wait until every JOB_ID has ended; the exit code is the outcome "
        "(0 succeeded, 10 failed, 11 cancelled, 12 stale, 124 timed out; several jobs: the worst)",
    )
    p.add_argument("job_ids", nargs="+", metavar="JOB_ID", type=job_id_arg)
    p.add_argument("--timeout", type=timeout_arg, metavar="S", help="give up after S seconds (exit 124)")
