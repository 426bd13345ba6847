"""The queue's verbs: ``queue`` shows its state, ``pause`` and ``resume`` stop and restart promotion, ``reconcile``
and ``prune`` do the sweeper's upkeep now.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from . import _live
from ._args import add_client_verb
from ._client import Client
from ._command import EXIT_OK, Io, print_table, table_time


def _show_queue(io: Io, state: Mapping[str, Any], as_json: bool) -> None:
    if as_json:
        io.json(state)
        return
    paused = "paused" if state["paused"] else "active"
    io.print(f"queue {paused}: {state['running']} running (max {state['max_concurrent']}), {state['queued']} queued")
    if _live.kinds_text(state):
        io.print(f"by kind (running[/max_running] +queued): {_live.kinds_text(state)}")
    # The queue's watch (docs/operations.md § The queue's watch), as of the server's last sweep: what holds it, and
    # whether it is stuck.
    for reason, since in sorted((state.get("held") or {}).items()):
        io.print(f"held by {reason} since {since}")
    stuck = state.get("stuck")
    if stuck:
        io.print(
            f"STUCK since {stuck['since']}: {stuck['reason']} (oldest job waiting {state.get('oldest_queued_age_s')} s)"
        )


def cmd_queue(client: Client, args: argparse.Namespace, io: Io) -> int:
    _show_queue(io, client.queue(), args.json)
    return EXIT_OK


def cmd_pause(client: Client, args: argparse.Namespace, io: Io) -> int:
    _show_queue(io, client.pause(), args.json)
    return EXIT_OK


def cmd_resume(client: Client, args: argparse.Namespace, io: Io) -> int:
    _show_queue(io, client.resume(), args.json)
    return EXIT_OK


def cmd_reconcile(client: Client, args: argparse.Namespace, io: Io) -> int:
    report = client.reconcile()
    if args.json:
        io.json(report)
        return EXIT_OK
    io.print(f"reconciled: {report['updated']} row(s) updated")
    if report["details"]:
        rows = [(d["job_id"], d["action"], d["reason"], d["liveness"], d["prior_boot"]) for d in report["details"]]
        print_table(io, ("JOB_ID", "ACTION", "REASON", "LIVENESS", "PRIOR_BOOT"), rows)
    return EXIT_OK


def _retention(retention: Mapping[str, Any]) -> str:
    rules = []
    if retention.get("days") is not None:
        rules.append(f"ended more than {retention['days']:g} day(s) ago")
    if retention.get("max_jobs") is not None:
        rules.append(f"past the newest {retention['max_jobs']} finished")
    return " or ".join(rules)


def cmd_prune(client: Client, args: argparse.Namespace, io: Io) -> int:
    """``prune --dry-run``: the finished jobs past the retention, oldest first; ``prune``: remove them now, a batch
    at a time until none is left (the sweeper does the same, a small batch a minute)."""
    answers = [client.prune(dry_run=args.dry_run)]
    while not args.dry_run and answers[-1]["limit_reached"]:
        answers.append(client.prune(dry_run=False))
    if args.json:
        last = answers[-1]
        io.json({**last, "pruned": sum(a["pruned"] for a in answers), "jobs": [j for a in answers for j in a["jobs"]]})
        return EXIT_OK
    retention = answers[0]["retention"]
    if retention["days"] is None and retention["max_jobs"] is None:
        io.print(
            "retention is off (PODCAST_JOB_RETENTION_DAYS and PODCAST_JOB_RETENTION_MAX_JOBS are 0): nothing is pruned"
        )
        return EXIT_OK
    jobs = [job for answer in answers for job in answer["jobs"]]
    if args.dry_run:
        if jobs:
            print_table(
                io,
                ("JOB_ID", "KIND", "STATUS", "ENDED"),
                [(j["job_id"], j["kind"], j["status"], table_time(j["ended_at"])) for j in jobs],
            )
        more = " (the oldest ones; more are due)" if answers[0]["limit_reached"] else ""
        io.print(f"{len(jobs)} finished job(s) would go{more}: {_retention(retention)}")
    else:
        io.print(f"pruned {len(jobs)} finished job(s) with their logs: {_retention(retention)}")
    return EXIT_OK


def add_queue_verbs(verbs: Any) -> None:
    """reconcile, prune, queue."""
    add_client_verb(
        verbs, "reconcile", cmd_reconcile, "operator reconcile: may mark live jobs past the wall-clock window stale"
    )
    p = add_client_verb(
        verbs,
        "prune",
        cmd_prune,
        "remove the finished jobs past the retention now, with their logs (PODCAST_JOB_RETENTION_DAYS, "
        "PODCAST_JOB_RETENTION_MAX_JOBS; the sweeper does it a batch a minute)",
    )
    p.add_argument("--dry-run", action="store_true", help="only list what would go; remove nothing")
    add_client_verb(verbs, "queue", cmd_queue, "show the queue's state")


def add_promotion_verbs(verbs: Any) -> None:
    """pause, resume."""
    add_client_verb(verbs, "pause", cmd_pause, "pause promotion (running jobs continue)")
    add_client_verb(verbs, "resume", cmd_resume, "resume promotion")
