"""Every route of the control API, each declared once beside its handler (``_route_table``).

A handler only translates: it reads the request (``_parse``), calls the core, and shapes the answer. Each takes the
``Supervisor`` first and the path's parameters by name; its one-line docstring is the route's summary.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4
from quart import Response, current_app, request
from werkzeug.routing import BaseConverter

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
    KindCatalog,
    Unauthorized,
    ValidationError,
    to_iso,
)
from ..observe import EVENT_NAMES, GAP, LAST_EVENT_ID, StreamEnded, StreamEvent, Subscription
from ..registry import EnqueueResult
from . import _openapi
from ._parse import (
    MAX_BATCH_BODY_BYTES,
    bearer_token,
    bool_query,
    caller_name,
    idempotency_key,
    int_query,
    json_body,
    parse_batch,
    parse_bulk,
    parse_job,
    parse_page,
    parse_progress,
    parse_schedule,
    query,
    query_with_params,
)
from ._route_table import INVALID, NOT_FOUND, RouteTable, error, json_answer, ref, text_answer

ROUTES = RouteTable()
_TIME = {"type": "string", "format": "date-time"}
# The list's filters beside status, kind and the key (JobFilter); param.NAME (a declared param's value) as well.
FILTER_PARAMETERS = (
    {"name": "reason", "in": "query", "schema": {"type": "string"}, "description": "the error or outcome reason"},
    {"name": "host", "in": "query", "schema": {"type": "string"}, "description": "the host that ran it"},
    {"name": "since", "in": "query", "schema": _TIME, "description": "created at or after (with its UTC offset)"},
    {"name": "until", "in": "query", "schema": _TIME, "description": "created before"},
    {"name": "ended_since", "in": "query", "schema": _TIME, "description": "ended at or after"},
)

MISSING_JOB_TOKEN = "missing job token (Authorization: Bearer $PODCAST_JOB_TOKEN)"
# How long a browser's EventSource waits before it reconnects after a dropped connection.
SSE_RETRY_MS = 2000
# A keep-alive comment, padded: a reader that reads nothing (a CLI suspended with Ctrl-Z) is seen only once its
# kernel's receive buffer is full -- until then its kernel takes every byte for it -- and then the edge cuts the
# write that stalls (HttpLimits.write_stall_timeout_s), freeing its slot. 16 KiB a keep-alive fill the two kernels'
# usual buffers in about a dozen keep-alives (13 s at a 1 s keep-alive, measured; about three minutes at the 15 s
# default), at about 1 KiB/s per idle reader.
KEEPALIVE = b":" + b" " * (16 * 1024) + b"keep-alive\n\n"

# A byte count in a query string: at most 12 ASCII digits (what the server parses).
_BYTE_COUNT = {"type": "integer", "minimum": 0, "maximum": 10**12 - 1}
_LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT}


@ROUTES.get("/api/health", "health", auth="public", responses={"200": json_answer(ref("Health"), "the server is up")})
async def health(supervisor: Supervisor) -> Any:
    """Liveness of the server, and what is degraded."""
    state = await supervisor.health()
    degraded = dict(state.degraded)
    http = current_app.extensions.get("supervisor.http_condition")
    condition = http.condition() if http is not None else None
    if condition is not None:
        degraded["http"] = condition
    body: dict[str, Any] = {
        "status": "degraded" if degraded else "ok",
        "boot_id": state.boot_id,
        "exec_mode": state.exec_mode,
        "paused": state.paused,
        "host_id": state.host_id,
        "leader": state.leader,
    }
    if degraded:
        body["degraded"] = degraded
    return body


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


@ROUTES.post(
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


@ROUTES.post(
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


@ROUTES.post(
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


@ROUTES.get(
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
            "schema": {"type": "string", "pattern": _openapi.anchored(CURSOR_PATTERN.pattern)},
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


@ROUTES.get(
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


@ROUTES.post(
    "/api/jobs/{job_id}/cancel",
    "cancelJob",
    auth="operator",
    over_registry=True,
    responses={"200": json_answer(ref("Job"), "the row after the cancel"), "404": NOT_FOUND},
)
async def cancel_job(supervisor: Supervisor, job_id: str) -> Any:
    """Cancel a job (idempotent; a terminal job is returned unchanged)."""
    return _row(await supervisor.cancel(job_id, by=caller_name()))


@ROUTES.post(
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


@ROUTES.post(
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


@ROUTES.post(
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


@ROUTES.get("/api/hosts", "listHosts", auth="read", responses={"200": json_answer(ref("Hosts"), "the hosts")})
async def hosts(supervisor: Supervisor) -> Any:
    """The fleet's hosts (live or silent) and its leader."""
    return await supervisor.hosts()


@ROUTES.post(
    "/api/hosts/{host_id}/forget",
    "forgetHost",
    auth="operator",
    responses={
        "200": json_answer(ref("ForgetHostResult"), "what was ended"),
        "404": error("no host with that id"),
        "409": error("the host holds a live lease, or is this supervisor"),
    },
)
async def forget_host(supervisor: Supervisor, host_id: str) -> Any:
    """A host that will never come back: its running jobs end orphan_host_forgotten, slots freed."""
    return await supervisor.forget_host(host_id)


_DRAIN = {
    "200": json_answer(ref("DrainHostResult"), "the host's drain now"),
    "404": error("no host with that id has registered"),
}


@ROUTES.post("/api/hosts/{host_id}/drain", "drainHost", auth="operator", over_registry=True, responses=_DRAIN)
async def drain_host(supervisor: Supervisor, host_id: str) -> Any:
    """The host starts nothing new; its running jobs run to their end under its watch; it hands the lead over."""
    return await supervisor.drain_host(host_id, True, caller_name())


@ROUTES.post("/api/hosts/{host_id}/undrain", "undrainHost", auth="operator", over_registry=True, responses=_DRAIN)
async def undrain_host(supervisor: Supervisor, host_id: str) -> Any:
    """The host promotes again."""
    return await supervisor.drain_host(host_id, False, caller_name())


_QUEUE_STATE = {"200": json_answer(ref("QueueState"), "the queue")}


@ROUTES.get("/api/queue", "queueState", auth="read", over_registry=True, responses=_QUEUE_STATE)
async def queue(supervisor: Supervisor) -> Any:
    """The queue's state."""
    return dataclasses.asdict(await supervisor.queue_state())


@ROUTES.post("/api/queue/pause", "pauseQueue", auth="operator", over_registry=True, responses=_QUEUE_STATE)
async def pause(supervisor: Supervisor) -> Any:
    """Pause promotion (creates the pause flag file); running jobs continue."""
    return dataclasses.asdict(await supervisor.pause())


@ROUTES.post(
    "/api/queue/resume",
    "resumeQueue",
    auth="operator",
    over_registry=True,
    responses={**_QUEUE_STATE, "409": error("the pause flag cannot be removed (the message names it)")},
)
async def resume(supervisor: Supervisor) -> Any:
    """Resume promotion (removes the pause flag file) and drain."""
    return dataclasses.asdict(await supervisor.resume())


@ROUTES.get(
    "/api/jobs/{job_id}/log",
    "jobLog",
    auth="read",
    over_registry=True,
    parameters=(
        {
            "name": "window",
            "in": "query",
            # An exploded form object is sent as its properties, `?tail_bytes=N` or `?offset=N`: the one way
            # OpenAPI has to say that two query parameters exclude each other (maxProperties).
            "style": "form",
            "explode": True,
            "description": (
                "which bytes: `tail_bytes=N`, the last N; or `offset=N`, from byte N on (the log is append-only, so "
                "an offset stays valid while it grows). Not both; neither: the whole log."
            ),
            "schema": {
                "type": "object",
                "additionalProperties": False,
                "maxProperties": 1,
                "properties": {"tail_bytes": _BYTE_COUNT, "offset": _BYTE_COUNT},
            },
        },
        {
            "name": "attempt",
            "in": "query",
            "description": (
                "which attempt's log (1 to the row's `attempts`; each attempt of a resubmitted job has its own): "
                "default, the latest; one the job never had is a 404. A follower reads each attempt to its end "
                "before the next"
            ),
            "schema": {"type": "integer", "minimum": 1, "maximum": 10**12 - 1},
        },
    ),
    responses={"200": text_answer("the log bytes as the job wrote them"), "404": NOT_FOUND, "422": INVALID},
)
async def job_log(supervisor: Supervisor, job_id: str) -> Any:
    """A job's log: whole, its last tail_bytes, or from byte offset on (to follow it)."""
    given = query(("tail_bytes", "offset", "attempt"))
    tail_bytes = int_query(given, "tail_bytes", None)
    offset = int_query(given, "offset", None)
    attempt = int_query(given, "attempt", None)
    if tail_bytes is not None and offset is not None:
        raise ValidationError("give tail_bytes or offset, not both", field="offset")
    piece = await supervisor.log_slice(job_id, tail_bytes=tail_bytes, offset=offset, attempt=attempt)
    # Bytes as written: a job's output need not be valid UTF-8, and re-encoding would shift offsets. Sent a chunk
    # at a time with its length announced: a request holds one chunk in memory, not a 50 MiB log.
    response = Response(piece.chunks(), status=200, content_type="text/plain; charset=utf-8")
    response.content_length = piece.end - piece.start
    return response


@ROUTES.post(
    "/api/jobs/{job_id}/heartbeat",
    "heartbeat",
    auth="job",
    body="Heartbeat",
    over_registry=True,
    responses={
        "204": {"description": "taken: written within 50 ms, and before the next read of the job"},
        "401": error("the token is not this job's, or no job has this id (or it no longer runs)"),
        "422": INVALID,
    },
)
async def heartbeat(supervisor: Supervisor, job_id: str) -> Any:
    """A running job's heartbeat, authenticated with that job's own token."""
    token = bearer_token()
    if token is None:
        raise Unauthorized(MISSING_JOB_TOKEN)

    async def progress() -> Any:
        return parse_progress(await json_body())

    # The token is checked before the body is read (the core's first step), the beat taken after (ADR 0018).
    await supervisor.heartbeat(job_id, token, progress)
    return "", 204


@ROUTES.get(
    "/api/events",
    "events",
    auth="read",
    description=(
        "text/event-stream. Each event: `id: <boot_id>-<n>` (numbered per boot), `event: <name>`, and one `data:` "
        "line of JSON, the webhook's body with `event_id` = the id. `: keep-alive` comments every "
        "PODCAST_JOB_EVENTS_KEEPALIVE_SECONDS while idle. Resume with the `Last-Event-ID` header: every later event "
        f"still held is sent once, in order; when some may be missing (pushed out of the replay ring, or the id is "
        f"another boot's) a `{GAP}` event without an id comes first, with "
        '`{"reason": "evicted" | "restarted", "last_event_id", "boot_id", "oldest_event_id"}`. A reader whose queue '
        "(PODCAST_JOB_EVENTS_CLIENT_BUFFER_EVENTS) fills up is disconnected."
    ),
    parameters=(
        {
            "name": "job",
            "in": "query",
            "style": "form",
            "explode": True,
            "description": "only this job's events (repeatable: any of them)",
            "schema": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 200}},
        },
        {
            "name": "kind",
            "in": "query",
            "style": "form",
            "explode": True,
            "description": "only events of this name (repeatable: any of them)",
            "schema": {"type": "array", "items": {"enum": list(EVENT_NAMES)}},
        },
        {
            "name": "backlog",
            "in": "query",
            "description": "without Last-Event-ID: begin with every event still held (default: new ones only)",
            "schema": {"type": "boolean", "default": False},
        },
        {
            "name": "follow",
            "in": "query",
            "description": "false: send what is held (backlog or resume) and end the stream",
            "schema": {"type": "boolean", "default": True},
        },
        {
            "name": LAST_EVENT_ID,
            "in": "header",
            "description": "the id of the last event received: resume after it",
            "schema": {"type": "string", "pattern": "^[^\\r\\n]{1,200}-[0-9]{1,18}$"},
        },
    ),
    responses={
        "200": text_answer(
            "the stream (it ends at the server's shutdown, or with follow=false)", content_type="text/event-stream"
        ),
        "422": error(
            "an unknown kind or query parameter, a bad boolean, or a Last-Event-ID that is not an id of this "
            "stream or is later than its last event; error.field names it"
        ),
        "503": error("every event-stream slot is taken (PODCAST_JOB_EVENTS_MAX_CLIENTS): try again later"),
    },
)
async def events(supervisor: Supervisor) -> Any:
    """A server-sent-events stream of job events (the webhook's payloads), resumable."""
    for name in request.args:
        if name not in ("job", "kind", "backlog", "follow"):
            raise ValidationError(f"unknown query parameter {name!r}", field=name)
    for name in ("backlog", "follow"):
        if len(request.args.getlist(name)) > 1:
            raise ValidationError(f"query parameter {name!r} given more than once", field=name)
    subscription = supervisor.subscribe_events(
        last_event_id=request.headers.get(LAST_EVENT_ID),
        jobs=request.args.getlist("job"),
        kinds=request.args.getlist("kind"),
        backlog=bool_query("backlog", default=False),
        follow=bool_query("follow", default=True),
    )
    # A reader dropped for not reading is usually stuck in a write of ours (it stopped reading, the socket is full):
    # only cancelling its request ends that write and closes the connection. This handler runs in the request's own
    # task (quart-trio), whose parent nursery is the request's: cancelling it ends exactly this request.
    # (tests/api/test_api_events.py holds this to a real client that stops reading.)
    parent = trio.lowlevel.current_task().parent_nursery
    if parent is not None:
        subscription.on_drop = parent.cancel_scope.cancel
    response = Response(
        _sse_body(subscription, supervisor.config.events_keepalive_s),
        status=200,
        content_type="text/event-stream; charset=utf-8",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
    response.timeout = None  # the stream is long-lived; its bounds are the reader's queue and the keep-alives
    return response


@ROUTES.get(
    "/api/openapi.json",
    "openapi",
    auth="read",
    responses={"200": {"description": "OpenAPI 3.1", "content": {"application/json": {}}}},
)
async def openapi(supervisor: Supervisor) -> Any:
    """This API's OpenAPI document."""
    return openapi_document(supervisor.kinds)


@ROUTES.get(
    "/metrics",
    "metrics",
    auth="public",
    responses={"200": text_answer("Prometheus text format 0.0.4")},
)
async def metrics(supervisor: Supervisor) -> Any:
    """Prometheus metrics."""
    return Response(await supervisor.render_metrics(), status=200, content_type=CONTENT_TYPE_PLAIN_0_0_4)


# The fixed routes under /api/jobs/. A fixed path outranks a template, so no job id is one of these names: the
# app's job_id converter refuses them, and showJob's parameter says so.
JOBS_SUBROUTES = ROUTES.fixed_segments("/api/jobs/")
# The scope each route needs of an API token (None: reachable without one: the probes, health and metrics, and the
# job's own heartbeat, which authenticates with the job token instead).
SCOPE_OF = ROUTES.scopes()
PUBLIC_ENDPOINTS = frozenset(endpoint for endpoint, scope in SCOPE_OF.items() if scope is None)


class JobIdConverter(BaseConverter):
    """The job id of ``/api/jobs/<job_id>``: one path segment, never a fixed route's name (``reconcile``, ``batch``).

    A fixed path outranks a template, in OpenAPI as in the document: ``/api/jobs/reconcile`` is the reconcile route
    for every method. Without this, ``GET /api/jobs/reconcile`` matched ``GET /api/jobs/<job_id>`` (404, "no such
    job") and ``OPTIONS`` advertised that GET; now it is a 405 whose ``Allow`` says POST. (Job ids are uuid hex: none
    is lost.)
    """

    regex = rf"(?!(?:{'|'.join(map(re.escape, JOBS_SUBROUTES))})$)[^/]+"


# The converters the declarations name (``converters=``), which the app installs.
CONVERTERS: dict[str, type[BaseConverter]] = {"job_id": JobIdConverter}


def openapi_document(kinds: KindCatalog) -> dict[str, Any]:
    """A fresh OpenAPI document of these routes for a server running ``kinds`` (callers may change theirs)."""
    path_schemas = {"job_id": {"type": "string", "minLength": 1, "not": {"enum": list(JOBS_SUBROUTES)}}}
    return _openapi.document(kinds, ROUTES.paths(path_schemas))


def routes_table() -> str:
    """The route table of ``docs/api.md`` (``tools/doc_tables.py`` writes it there; a test holds the page to it)."""
    return ROUTES.markdown()


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


async def _sse_body(subscription: Subscription, keepalive_s: float) -> Any:
    """The stream's bytes: a first line at once (so the client has the answer's head), then each event as
    ``id``/``event``/``data`` lines, and a ``: keep-alive`` comment after each ``keepalive_s`` without one."""
    try:
        yield f"retry: {SSE_RETRY_MS}\n: stream open\n\n".encode()
        if subscription.gap is not None:
            yield _sse_message(None, GAP, subscription.gap.data())
        while True:
            try:
                item = await subscription.next(keepalive_s)
            except StreamEnded:
                return
            yield KEEPALIVE if item is None else _sse_event(item)
    finally:
        subscription.close()


def _sse_event(item: StreamEvent) -> bytes:
    return _sse_message(item.id, item.name, item.data)


def _sse_message(event_id: str | None, name: str, data: bytes) -> bytes:
    # The payload is compact JSON: one line, so one data: field.
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\n".encode() + b"data: " + data + b"\n\n"
