"""``supervisor enqueue``: one job of a kind, every job of an NDJSON file (in batches, each keyed by the file's
content), or a schedule's tick (one job per period, fleet-wide); each sent again on a lost answer under its
Idempotency-Key (ADR 0016).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
import sys
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from ..domain import RequestError, Schedule, SupervisorError, parse_period, parse_tick
from ._args import add_client_verb, idempotency_key_arg, param_arg
from ._client import RETRY_ATTEMPTS, ApiError, Client, Unreachable, with_retries
from ._command import EXIT_ERROR, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, Io

BATCH_SIZE = 1000  # the server's limit for one POST /api/jobs/batch


def _read_job_lines(source: str, io: Io) -> list[tuple[int, dict[str, Any]]] | None:
    """(line number, job) for every non-blank NDJSON line of ``source`` (a path, or - for stdin); None after
    printing what is wrong with the first bad line."""
    try:
        if source == "-":
            text = sys.stdin.read()
        else:
            with open(source, encoding="utf-8") as fh:
                text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        io.error(f"--from-file {source}: {exc}")
        return None
    jobs: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            io.error(f"--from-file {source}, line {number}: not JSON: {exc}")
            return None
        if not isinstance(item, dict) or "kind" not in item:
            io.error(f'--from-file {source}, line {number}: expected an object {{"kind": ..., "params": {{...}}}}')
            return None
        jobs.append((number, item))
    if not jobs:
        io.error(f"--from-file {source}: no job in it")
        return None
    return jobs


def _file_key(jobs: Sequence[tuple[int, dict[str, Any]]]) -> str:
    """The Idempotency-Key of a file's jobs given none: from their content (ADR 0016). The same file sent again (a
    rerun after an interruption, a timer that fires twice) stores none of its batches twice while the keys live
    (``PODCAST_JOB_IDEMPOTENCY_TTL_SECONDS``, 24 h by default); the jobs of another file are another key."""
    content = json.dumps([item for _, item in jobs], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return f"file-{hashlib.sha256(content.encode()).hexdigest()[:48]}"


def _enqueue_from_file(client: Client, args: argparse.Namespace, io: Io) -> int:
    jobs = _read_job_lines(args.from_file, io)
    if jobs is None:
        return EXIT_USAGE
    answers: list[dict[str, Any]] = []
    key = args.idempotency_key or _file_key(jobs)
    batches = (len(jobs) + BATCH_SIZE - 1) // BATCH_SIZE
    for start in range(0, len(jobs), BATCH_SIZE):
        chunk = jobs[start : start + BATCH_SIZE]
        # One key per batch: a rerun of the same file (or with the same --idempotency-key) stores none twice.
        batch_key = f"{key}.{start // BATCH_SIZE}" if len(jobs) > BATCH_SIZE else key
        try:
            send = functools.partial(client.enqueue_batch, [item for _, item in chunk], idempotency_key=batch_key)
            answer = with_retries(send, on_retry=_retrying(io, batch_key))
        except (ApiError, Unreachable) as exc:
            where = re.match(r"jobs\[(\d+)\]", exc.field or "") if isinstance(exc, ApiError) else None
            line = f"line {chunk[int(where.group(1))][0]}: " if where else ""
            why = exc.describe() if isinstance(exc, ApiError) else str(exc)
            done = start // BATCH_SIZE
            stored = (
                f"; batches 1-{done} of {batches} ({len(answers)} jobs, lines {jobs[0][0]}-{jobs[start - 1][0]}) were "
                f"stored; run the same command again to store the rest: its batches are keyed by the file's content "
                f"({key}), so none is stored twice"
                if answers
                else "; nothing was stored"
            )
            io.error(f"{line}{why}{stored}")
            return EXIT_UNREACHABLE if isinstance(exc, Unreachable) else EXIT_ERROR
        answers.extend(answer["jobs"])
    if args.json:
        io.json({"jobs": answers})
    else:
        for answer in answers:
            io.print(f"{answer['job_id']}  {'coalesced' if answer['coalesced'] else answer['status']}")
    return EXIT_OK


def _invocation_key() -> str:
    """The Idempotency-Key of an enqueue given none: one per invocation, so that its own retries make no second job."""
    return f"cli-{uuid.uuid4().hex}"


def _retrying(io: Io, key: str) -> Callable[[SupervisorError, int, float], None]:
    def say(error: SupervisorError, attempt: int, wait_s: float) -> None:
        why = error.describe() if isinstance(error, ApiError) else str(error)
        io.note(
            f"supervisor: {why}; sending it again in {wait_s:g} s with Idempotency-Key {key} "
            f"(attempt {attempt} of {RETRY_ATTEMPTS})"
        )

    return say


def cmd_enqueue(client: Client, args: argparse.Namespace, io: Io) -> int:
    if args.from_file is not None:
        if args.kind is not None or args.param:
            io.error("give KIND [-p ...] or --from-file, not both")
            return EXIT_USAGE
        return _enqueue_from_file(client, args, io)
    if args.kind is None:
        io.error("give a KIND, or --from-file FILE")
        return EXIT_USAGE
    params: dict[str, str] = {}
    for key, value in args.param or []:
        if key in params:
            io.error(f"-p {key} given twice")
            return EXIT_USAGE
        # Sent as a string: the server converts it to the kind's declared int/float/bool, or names the field.
        params[key] = value
    schedule: Schedule | None = None
    if args.schedule is not None or args.every is not None or args.if_idle or args.tick is not None:
        try:
            schedule, key = _schedule(args)
        except (ValueError, RequestError) as exc:
            io.error(str(exc))
            return EXIT_USAGE
    else:
        key = args.idempotency_key or _invocation_key()
    query = schedule.query if schedule is not None else None
    answer = with_retries(
        lambda: client.enqueue(args.kind, params, idempotency_key=key, schedule=query), on_retry=_retrying(io, key)
    )
    if args.json:
        io.json(answer)
    elif answer.get("skipped"):
        io.print(f"skipped: schedule {answer['schedule']} has job {answer['job_id']} {answer['status']} (--if-idle)")
    elif answer["coalesced"]:
        io.print(f"{answer['job_id']}  coalesced into the identical queued job (position {answer['queue_position']})")
    elif answer["status"] == "queued":
        io.print(f"{answer['job_id']}  queued (position {answer['queue_position']})")
    else:
        io.print(f"{answer['job_id']}  {answer['status']}")
    return EXIT_OK


def _schedule(args: argparse.Namespace) -> tuple[Schedule, str]:
    """--schedule NAME --every PERIOD [--if-idle] [--tick TIME] as a ``Schedule`` and its tick's key, every argument
    checked here (the period's bounds, the tick's form and range, its period's start a time): a usage error names
    what is wrong, before anything is sent."""
    if args.schedule is None or args.every is None:
        raise ValueError("--schedule NAME and --every PERIOD go together (and --if-idle, --tick with them)")
    if args.idempotency_key is not None:
        raise ValueError("a schedule's tick is its key: give --schedule or --idempotency-key, not both")
    schedule = Schedule(args.schedule, parse_period(args.every), args.if_idle)
    at = parse_tick(args.tick) if args.tick is not None else datetime.now(UTC)
    # The tick names the request: every timer or host firing within one period makes one job, fleet-wide.
    return schedule, schedule.key(schedule.tick(at))


def add_enqueue_verb(verbs: Any) -> None:
    """enqueue: one job, an NDJSON file of them, or a schedule's tick."""
    p = add_client_verb(verbs, "enqueue", cmd_enqueue, "enqueue a job of KIND, or every job of an NDJSON file")
    p.add_argument("kind", nargs="?")
    p.add_argument(
        "--from-file",
        metavar="FILE",
        help='one {"kind": ..., "params": {...}} per line (- for stdin); sent in batches of 1000, each all or nothing',
    )
    p.add_argument(
        "-p", "--param", type=param_arg, action="append", metavar="KEY=VALUE", help="a param of the kind (repeatable)"
    )
    p.add_argument(
        "--idempotency-key",
        type=idempotency_key_arg,
        metavar="KEY",
        help="this request's name (1-255 printable ASCII): the same KEY with the same request never makes a second "
        "job, and answers what it answered (default: a new key per invocation, kept across its own retries; with "
        "--from-file, KEY.N names its Nth batch of 1000)",
    )
    p.add_argument("--schedule", metavar="NAME", help="a schedule's tick (a systemd timer's): one job per period")
    p.add_argument("--every", metavar="PERIOD", help="the schedule's period: 15m, 1h, 1d (at least a minute)")
    p.add_argument("--tick", metavar="TIME", help="the tick to enqueue (default: now, floored to the period, UTC)")
    p.add_argument(
        "--if-idle", action="store_true", help="skip the tick (exit 0) while a job of the schedule is queued or running"
    )
