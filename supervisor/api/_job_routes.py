"""The routes of jobs: enqueue one or a batch, act on a selection in bulk, list, show, cancel, retry, prune, and the
operator's reconcile. Each reads the request (``_parse``), calls the core and shapes the answer."""

from __future__ import annotations

import dataclasses
from typing import Any

from quart import current_app

from ..core import Supervisor
from ..domain import (
    CURSOR_PATTERN,
    DEFAULT_LIST_LIMIT,
    FILTER_NAMES,
    IDEMPOTENCY_KEY_HEADER,
    KEY_SCHEMA,
    MAX_LIST_LIMIT,
    REPLAYED_HEADER,
    SCHEDULE_QUERY,
    Job,
    JobStatus,
    to_iso,
)
from ..registry import EnqueueResult
from ._parse import (
    MAX_BATCH_BODY_BYTES,
    bool_query,
    caller_name,
    idempotency_key,
    int_query,
    json_body,
    parse_batch,
    parse_bulk,
    parse_job,
    parse_page,
    parse_schedule,
    query,
    query_with_params,
)
from ._route_table import INVALID, NOT_FOUND, RouteTable, anchored, error, json_answer, ref

JOB_ROUTES = RouteTable()

_TIME = {"type": "string", "format": "date-time"}
# The list's filters beside status, kind and the key (JobFilter); param.NAME (a declared param's value) as well.
FILTER_PARAMETERS = (
    {"name": "reason", "in": "query", "schema": {"type": "string"}, "description": "the error or outcome reason"},
    {"name": "host", "in": "query", "schema": {"type": "string"}, "description": "the host that ran it"},
    {"name": "since", "in": "query", "schema": _TIME, "description": "created at or after (with its UTC offset)"},
    {"name": "until", "in": "query", "schema": _TIME, "description": "created before"},
    {"name": "ended_since", "in": "query", "schema": _TIME, "description": "ended at or after"},
)

_LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT}


# An enqueue's Idempotency-Key (ADR 0016): a retry with the key answers the first answer, and makes no job.
_KEY_HEADER = {
    "name": IDEMPOTENCY_KEY_HEADER,
    "in": "header",
    "description": (
        "the client's name for this request (1-255 printable ASCII characters): a retry with the same key and the "
        "same request answers what the first was answered, with `Idempotent-Replayed: true`, and makes no job; with "
        "another request it is a 422 (`idempotency_key_reused`). Kept PODCAST_JOB_IDEMPOTENCY_TTL_SECONDS"
    ),
    "schema": KEY_SCHEMA,
}
_REPLAYED = {REPLAYED_HEADER: {"schema": {"const": "true"}, "description": "present on a replay: nothing was written"}}


def _enqueue_answers(accepted: dict[str, Any], invalid: str) -> dict[str, dict[str, Any]]:
    return {
        "202": {**accepted, "headers": _REPLAYED},
        "400": error(f"the body is not valid JSON, or the {IDEMPOTENCY_KEY_HEADER} header is not a key"),
        "422": error(f"{invalid}; or the {IDEMPOTENCY_KEY_HEADER} was sent with another request"),
    }


def _replayed(results: list[EnqueueResult]) -> dict[str, str]:
    return {REPLAYED_HEADER: "true"} if results and all(r.replayed is not None for r in results) else {}


@JOB_ROUTES.post(
    "/api/jobs",
    "enqueue",
    auth="enqueue",
    body="EnqueueRequest",
    over_registry=True,
    parameters=(
        _KEY_HEADER,
        {
            "name": "schedule",
            "in": "query",
            "schema": {"type": "string", "pattern": SCHEDULE_QUERY.pattern},
            "description": "the schedule whose tick this is (docs/operations.md, Periodic runs), recorded on the row: "
            "NAME/PERIOD_S, and /if_idle to skip the tick (200, skipped) while a job of it is queued or running",
        },
    ),
    responses={
        **_enqueue_answers(
            json_answer(ref("EnqueueResponse"), "queued (or coalesced into a queued job), or a key's replay"),
            "unknown kind, or a missing, unknown or mistyped param; error.field names it",
        ),
        "200": json_answer(ref("EnqueueResponse"), "an if_idle tick skipped: the schedule's job queued or running"),
    },
)
async def enqueue(supervisor: Supervisor) -> Any:
    """Enqueue a job of a kind with its params."""
    key = idempotency_key()
    schedule = parse_schedule(query(("schedule",)).get("schedule"))
    job = parse_job(await json_body())
    result = await supervisor.enqueue(job.kind, job.params, idempotency_key=key, by=caller_name(), schedule=schedule)
    if result.skipped:
        return {**_enqueued(result), "skipped": True, "schedule": result.job.schedule}, 200
    return _enqueued(result), 202, _replayed([result])


@JOB_ROUTES.post(
    "/api/jobs/batch",
    "enqueueBatch",
    auth="enqueue",
    body="BatchRequest",
    over_registry=True,
    parameters=(_KEY_HEADER,),
    responses={
        **_enqueue_answers(
            json_answer(ref("BatchResponse"), "every job queued (or coalesced), in request order, or a key's replay"),
            "an element is invalid; error.field names it (jobs[3].params.seconds); nothing stored",
        ),
        "413": error("the body is larger than 1 MiB"),
    },
)
async def enqueue_batch(supervisor: Supervisor) -> Any:
    """Enqueue up to 1,000 jobs at once: all validated first, all stored or none."""
    key = idempotency_key()
    requests = parse_batch(await json_body(MAX_BATCH_BODY_BYTES))
    results = await supervisor.enqueue_many(requests, idempotency_key=key, by=caller_name())
    answers = [(r.receipt.job_id, str(r.receipt.status), r.receipt.coalesced) for r in results]
    jobs = [{"job_id": job_id, "status": status, "coalesced": coalesced} for job_id, status, coalesced in answers]
    return {"jobs": jobs}, 202, _replayed(results)


@JOB_ROUTES.post(
    "/api/jobs/bulk",
    "bulkAction",
    auth="operator",
    body="BulkRequest",
    over_registry=True,
    responses={
        "200": json_answer(ref("BulkAnswer"), "a dry run's selection, or what the action did to each of its jobs"),
        "404": NOT_FOUND,
        "422": INVALID,
    },
)
async def bulk_action(supervisor: Supervisor) -> Any:
    """Cancel or retry every job a filter selects: a dry run answers the selection, the action acts on it once."""
    request = parse_bulk(await json_body(), supervisor.kinds)
    answer = await supervisor.bulk_action(request, by=caller_name())
    return {**dataclasses.asdict(answer), "expires_at": to_iso(answer.expires_at)}


@JOB_ROUTES.get(
    "/api/jobs",
    "listJobs",
    auth="read",
    over_registry=True,
    parameters=(
        {"name": "status", "in": "query", "schema": {"enum": [s.value for s in JobStatus]}},
        # Any text: rows of a kind since removed from the kinds file can still be listed.
        {"name": "kind", "in": "query", "schema": {"type": "string"}},
        {"name": "limit", "in": "query", "schema": {**_LIMIT, "default": DEFAULT_LIST_LIMIT}},
        {
            "name": "cursor",
            "in": "query",
            "schema": {"type": "string", "pattern": anchored(CURSOR_PATTERN.pattern)},
            "description": "next_cursor of the previous page; pages stay stable while jobs are added",
        },
        {
            "name": "idempotency_key",
            "in": "query",
            "schema": KEY_SCHEMA,
            "description": "only the jobs an enqueue with this Idempotency-Key answered, while the key is kept",
        },
        *FILTER_PARAMETERS,
    ),
    responses={"200": json_answer(ref("JobList"), "one page"), "422": INVALID},
)
async def list_jobs(supervisor: Supervisor) -> Any:
    """List jobs, newest first, one page at a time."""
    page = parse_page(query_with_params((*FILTER_NAMES, "limit", "cursor")), supervisor.kinds)
    # A page's rows are read and encoded a few pages at a time (HttpLimits.max_page_builds): the encoding holds the
    # event loop, and hundreds of them queued at once kept heartbeats and /api/health waiting behind them.
    async with current_app.extensions["supervisor.page_builds"]:
        jobs, next_cursor = await supervisor.list_jobs(page)
        return current_app.json.response({"jobs": [_row(job) for job in jobs], "next_cursor": next_cursor})


@JOB_ROUTES.get(
    "/api/jobs/{job_id}",
    "showJob",
    auth="read",
    over_registry=True,
    # The job_id converter refuses the fixed routes' names: /api/jobs/reconcile is the reconcile route for every
    # method (a fixed path outranks a template), so a GET there is a 405, never a lookup of a job called that.
    converters={"job_id": "job_id"},
    responses={
        "200": json_answer(ref("Job"), "the row"),
        "404": NOT_FOUND,
        "405": error("job_id names a fixed route (reconcile, batch, prune), which takes only POST"),
    },
)
async def show_job(supervisor: Supervisor, job_id: str) -> Any:
    """One job's row, with the jobs enqueued as retries of it."""
    job, retries = await supervisor.show(job_id)
    return {**_row(job), "retried_by": retries}


@JOB_ROUTES.post(
    "/api/jobs/{job_id}/cancel",
    "cancelJob",
    auth="operator",
    over_registry=True,
    responses={"200": json_answer(ref("Job"), "the row after the cancel"), "404": NOT_FOUND},
)
async def cancel_job(supervisor: Supervisor, job_id: str) -> Any:
    """Cancel a job (idempotent; a terminal job is returned unchanged)."""
    return _row(await supervisor.cancel(job_id, by=caller_name()))


@JOB_ROUTES.post(
    "/api/jobs/{job_id}/retry",
    "retryJob",
    auth="operator",
    over_registry=True,
    responses={
        "202": json_answer(ref("EnqueueResponse"), "the new job (or the identical queued one)"),
        "404": NOT_FOUND,
        "409": error(
            "the job has not finished (error.message names its state), or its kind or params are no longer "
            "what the kinds file declares (error.field names which)"
        ),
    },
)
async def retry_job(supervisor: Supervisor, job_id: str) -> Any:
    """Enqueue a finished job's kind and params again as a new job whose retry_of names it."""
    return _enqueued(await supervisor.retry(job_id, by=caller_name())), 202


@JOB_ROUTES.post(
    "/api/jobs/prune",
    "pruneJobs",
    auth="operator",
    over_registry=True,
    parameters=(
        {
            "name": "dry_run",
            "in": "query",
            "schema": {"enum": ["true", "false"], "default": "false"},
            "description": "true: only list what would go; nothing is removed",
        },
        {
            "name": "limit",
            "in": "query",
            "schema": {**_LIMIT, "default": MAX_LIST_LIMIT},
            "description": "at most this many jobs in one call (limit_reached: call again for more)",
        },
    ),
    responses={"200": json_answer(ref("PruneReport"), "what went (or, in a dry run, would go)"), "422": INVALID},
)
async def prune_jobs(supervisor: Supervisor) -> Any:
    """Remove finished jobs past the retention now (rows, logs, state records), oldest first."""
    given = query(("dry_run", "limit"))
    dry_run = bool_query("dry_run", default=False)
    limit = int_query(given, "limit", MAX_LIST_LIMIT)
    assert limit is not None
    gone = await supervisor.prune(dry_run=dry_run, limit=limit)
    return {
        "dry_run": dry_run,
        "pruned": len(gone),
        "limit_reached": len(gone) == limit,
        "retention": supervisor.retention(),
        "jobs": [
            {"job_id": j.job_id, "kind": j.kind, "status": str(j.status), "ended_at": to_iso(j.ended_at)} for j in gone
        ],
    }


@JOB_ROUTES.post(
    "/api/jobs/reconcile",
    "reconcile",
    auth="operator",
    over_registry=True,
    responses={"200": json_answer(ref("ReconcileReport"), "what was done to each running row")},
)
async def reconcile(supervisor: Supervisor) -> Any:
    """Operator reconcile: may mark a live job past the wall-clock window stale."""
    report = await supervisor.operator_reconcile()
    return {"updated": report.updated, "details": [dataclasses.asdict(d) for d in report.details]}


def _enqueued(result: EnqueueResult) -> dict[str, Any]:
    """An enqueue's 202 payload (also a retry's): what it answered (a replay: what the first request was answered)."""
    answer = result.receipt
    return {
        "job_id": answer.job_id,
        "status": str(answer.status),
        "queue_position": answer.queue_position,
        "coalesced": answer.coalesced,
    }


def _row(job: Job) -> dict[str, Any]:
    """A row as callers see it: registry fields without the token hash, ``queue_position`` only when queued."""
    return job.public()
