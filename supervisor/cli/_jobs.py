"""The verbs of jobs: ``jobs`` lists them (or watches the running ones live), ``show`` shows one, ``cancel`` and
``retry`` act on one (or, with --all, on the jobs the filters select: ``_bulk``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from ..domain import JobStatus
from . import _live
from ._args import add_client_verb, idempotency_key_arg, job_id_arg, positive_arg
from ._bulk import add_bulk_arguments, bulk_or_usage
from ._client import ApiError, Client
from ._command import EXIT_OK, EXIT_USAGE, Io, is_terminal, print_table, run_live, table_time
from ._filters import add_filter_arguments, filter_refused, filters_of


def _progress(job: Mapping[str, Any]) -> str:
    done, total = job.get("completed_units") or 0, job.get("total_units")
    if total is None:
        return str(done) if done else "-"
    return f"{done}/{total}"


def cmd_jobs(client: Client, args: argparse.Namespace, io: Io) -> int:
    try:
        filters = filters_of(args)
    except ValueError as exc:
        io.error(str(exc))
        return EXIT_USAGE
    if args.watch:
        if args.json or args.cursor or args.status or args.kind or args.idempotency_key or filters:
            io.error(
                "--watch shows the running jobs and the queue: it takes no --json, --cursor and no filter (--status, "
                "--kind, --idempotency-key, --reason, --param, --since, --until, --ended-since, --host)"
            )
            return EXIT_USAGE
        args.interrupted_exit = EXIT_OK  # Ctrl-C is how a watch ends
        out = _live.Output(io.out, live=is_terminal(io), err=io.err)
        return run_live(client, lambda api: _live.run_watch(api, out))
    try:
        answer = client.list_jobs(
            status=args.status,
            kind=args.kind,
            limit=args.limit,
            cursor=args.cursor,
            idempotency_key=args.idempotency_key,
            filters=filters,
        )
    except ApiError as exc:
        return filter_refused(exc, io)
    if args.json:
        io.json(answer)
        return EXIT_OK
    rows = [
        (
            job["job_id"],
            job["kind"],
            job["status"],
            job.get("queue_position"),
            table_time(job["created_at"]),
            table_time(job["ended_at"]),
            _progress(job),
            job["error_reason"],
        )
        for job in answer["jobs"]
    ]
    print_table(io, ("JOB_ID", "KIND", "STATUS", "POS", "CREATED", "ENDED", "PROGRESS", "REASON"), rows)
    if answer["next_cursor"]:
        io.print(f"(more: supervisor jobs --cursor {answer['next_cursor']})")
    return EXIT_OK


def _show_job(io: Io, job: Mapping[str, Any]) -> None:
    for key in sorted(job):
        value = job[key]
        if key == "history" and isinstance(value, list):
            # One line per earlier attempt: how each one the job was resubmitted after ended.
            io.print(f"{key:18} {len(value)} earlier attempt(s)" if value else f"{key:18} -")
            for attempt in value:
                io.print(f"  #{attempt.get('attempt')}  {_attempt_line(attempt)}")
            continue
        if key == "retried_by" and isinstance(value, list):
            # The other side of retry_of: the operator's retries of this job, oldest first.
            io.print(f"{key:18} {', '.join(map(str, value)) if value else '-'}")
            continue
        if isinstance(value, dict | list):
            value = json.dumps(value, sort_keys=True)
        io.print(f"{key:18} {'-' if value is None else value}")


def _attempt_line(attempt: Mapping[str, Any]) -> str:
    code = attempt.get("exit_code")
    ended = f"{attempt.get('status')}/{attempt.get('reason') or '-'}" + ("" if code is None else f" (exit {code})")
    return f"{attempt.get('started_at') or '-'} .. {attempt.get('ended_at') or '-'}  {ended}"


def cmd_show(client: Client, args: argparse.Namespace, io: Io) -> int:
    job = client.get_job(args.job_id)
    if args.json:
        io.json(job)
    else:
        _show_job(io, job)
    return EXIT_OK


def cmd_cancel(client: Client, args: argparse.Namespace, io: Io) -> int:
    if args.all or args.job_id is None:
        return bulk_or_usage(client, args, io, "cancel")
    job = client.cancel(args.job_id)
    if args.json:
        io.json(job)
    elif job["status"] == "running":
        io.print(f"{job['job_id']}  running; cancel requested, stopping")
    else:
        io.print(f"{job['job_id']}  {job['status']}")
    return EXIT_OK


def cmd_retry(client: Client, args: argparse.Namespace, io: Io) -> int:
    if args.all or args.job_id is None:
        return bulk_or_usage(client, args, io, "retry")
    answer = client.retry(args.job_id)
    if args.json:
        io.json(answer)
    elif answer["coalesced"]:
        io.print(
            f"{answer['job_id']}  coalesced into the identical queued job (position {answer['queue_position']}); "
            f"it is not linked to {args.job_id}"
        )
    elif answer["status"] == "queued":
        io.print(f"{answer['job_id']}  queued (position {answer['queue_position']}), a retry of {args.job_id}")
    else:
        io.print(f"{answer['job_id']}  {answer['status']}, a retry of {args.job_id}")
    return EXIT_OK


def add_job_verbs(verbs: Any) -> None:
    """jobs, show, cancel, retry."""
    p = add_client_verb(verbs, "jobs", cmd_jobs, "list jobs, newest first; or watch the running ones live (--watch)")
    p.add_argument("--status", choices=[s.value for s in JobStatus])
    p.add_argument("--kind")
    p.add_argument("--limit", type=positive_arg, help="rows per page (server default 100, at most 1000)")
    p.add_argument("--cursor", help="continue after a previous page")
    p.add_argument(
        "--idempotency-key", type=idempotency_key_arg, metavar="KEY", help="only the jobs an enqueue with KEY answered"
    )
    add_filter_arguments(p)
    p.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="a live table of the running jobs and the queue, redrawn on each event; Ctrl-C quits (exit 0)",
    )
    p = add_client_verb(verbs, "show", cmd_show, "show one job")
    p.add_argument("job_id", type=job_id_arg)
    p = add_client_verb(verbs, "cancel", cmd_cancel, "cancel a job (idempotent), or --all the jobs the filters select")
    p.add_argument("job_id", type=job_id_arg, nargs="?")
    add_bulk_arguments(p)
    p = add_client_verb(
        verbs,
        "retry",
        cmd_retry,
        "enqueue a finished job's kind and params again as a new job (its retry_of names the old one; "
        "supervisor show lists a job's retries), or --all the finished jobs the filters select",
    )
    p.add_argument("job_id", type=job_id_arg, nargs="?")
    add_bulk_arguments(p)
