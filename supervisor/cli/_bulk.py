"""``cancel --all`` and ``retry --all``: the jobs the filters select, a dry run first, a confirmation above
``BULK_CONFIRM_ABOVE`` of them, then the action on exactly the dry run's jobs.
"""

from __future__ import annotations

import argparse
import sys

from ..domain import JobStatus
from ._client import ApiError, Client
from ._command import EXIT_ERROR, EXIT_OK, EXIT_USAGE, Io, is_terminal
from ._filters import add_filter_arguments, filter_refused, filters_of

# A bulk action on more jobs than this asks first on a terminal; without one, it needs --yes.
BULK_CONFIRM_ABOVE = 10


def add_bulk_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--all", action="store_true", help="every job the filters select (a dry run first, then once each)")
    p.add_argument("--status", choices=[s.value for s in JobStatus])
    p.add_argument("--kind")
    add_filter_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="only say which jobs it would act on")
    p.add_argument("--yes", action="store_true", help=f"act on more than {BULK_CONFIRM_ABOVE} jobs without asking")


def cmd_bulk(client: Client, args: argparse.Namespace, io: Io, action: str) -> int:
    """``cancel --all`` / ``retry --all``: a dry run of the filters, a confirmation above ``BULK_CONFIRM_ABOVE``
    jobs, then the action on exactly the dry run's jobs (sent again on a lost answer: each job is acted on once)."""
    try:
        filters = filters_of(args)
    except ValueError as exc:
        io.error(str(exc))
        return EXIT_USAGE
    filters |= {k: v for k, v in (("status", args.status), ("kind", args.kind)) if v is not None}
    try:
        dry = client.bulk(action, filters=filters, dry_run=True)
    except ApiError as exc:
        return filter_refused(exc, io)
    if args.dry_run or not dry["count"]:
        if args.json:
            io.json(dry)
        else:
            io.print(f"{action} would act on {dry['count']} job(s){':' if dry['count'] else ''}")
            for job_id in dry["job_ids"]:
                io.print(f"  {job_id}")
        return EXIT_OK
    if dry["count"] > BULK_CONFIRM_ABOVE and not args.yes:
        if not is_terminal(io) or not sys.stdin.isatty():
            io.error(f"{action} of {dry['count']} jobs: give --yes to act without a terminal to confirm on")
            return EXIT_USAGE
        io.out.write(f"{action} {dry['count']} job(s)? [y/N] ")
        io.out.flush()
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            io.print("nothing done")
            return EXIT_ERROR
    done = client.bulk(action, selection=dry["selection"])
    if args.json:
        io.json(done)
    else:
        outcomes = ", ".join(f"{what} {n}" for what, n in sorted(done["outcomes"].items()))
        io.print(f"{action}: {done['count']} job(s): {outcomes}")
        for job_id, result in sorted(done["results"].items()):
            if result.startswith("refused"):
                io.print(f"  {job_id}  {result}")
    return EXIT_ERROR if any(r.startswith("refused") for r in done["results"].values()) else EXIT_OK


def bulk_or_usage(client: Client, args: argparse.Namespace, io: Io, action: str) -> int:
    if args.all and args.job_id is not None:
        io.error(f"{action}: give a JOB_ID or --all with filters, not both")
        return EXIT_USAGE
    if not args.all:
        io.error(f"{action}: give a JOB_ID, or --all with filters (--status, --kind, --reason, --param, --since, ...)")
        return EXIT_USAGE
    return cmd_bulk(client, args, io, action)
