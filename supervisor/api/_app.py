"""The HTTP control API: a quart-trio app that only translates requests into calls on the core.

It holds no rule of supervision; every decision lives in the core (``core.Supervisor``). What lives here is HTTP only:
authentication, parsing bodies and query strings, and turning the one error tree of ``_errors.py`` into JSON
answers, generically (``RequestError.http_status``/``code``/``field``), so a new error class needs no code here.

Every answer carries an ``X-Request-Id``; an unexpected error is logged with that id and answered with a bare 500
that names it, never with a traceback.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

import trio
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4
from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException
from werkzeug.routing import BaseConverter

from ..core import Supervisor
from ..domain._config import ApiToken
from ..domain._errors import (
    BodyTooLarge,
    Forbidden,
    MalformedRequest,
    RegistryError,
    RegistryUnavailable,
    RequestError,
    Unauthorized,
    UnsupportedMediaType,
    ValidationError,
)
from ..domain._model import Job, to_iso
from ..observe import GAP, LAST_EVENT_ID, StreamEnded, StreamEvent, Subscription
from ..observe._logging import get_logger
from ..registry import MAX_LIST_LIMIT, EnqueueResult
from ._limits import HttpLimits
from ._openapi import JOBS_SUBROUTES, openapi_document

log = get_logger()

# A job request is a kind and a few short params; anything near this size is a mistake or an attack.
MAX_BODY_BYTES = 64 * 1024
# A batch holds up to 1,000 job requests; the stack refuses anything larger before a route sees it.
MAX_BATCH_BODY_BYTES = 1024 * 1024
DEFAULT_LIST_LIMIT = 100

# Routes reachable without the API token: probes (health, metrics) and the job's own heartbeat, which
# authenticates with the job token instead. Everything else requires ``Authorization: Bearer <api token>``.
PUBLIC_ENDPOINTS = frozenset({"health", "metrics", "heartbeat"})

REQUEST_ID_HEADER = "X-Request-Id"
MISSING_JOB_TOKEN = "missing job token (Authorization: Bearer $PODCAST_JOB_TOKEN)"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# Names for werkzeug's HTTP errors where the generic snake_case of the class name would read badly.
_HTTP_CODES = {400: "bad_request", 413: "body_too_large", 415: "unsupported_media_type"}


def _bearer_token() -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


# How long a client is told to wait before retrying a request the registry could not take (a full disk, a lock).
RETRY_AFTER_S = 5
_RETRY_AFTER = {"Retry-After": str(RETRY_AFTER_S)}


def _unavailable_message(request_id: str) -> str:
    return f"the registry cannot take this request now; nothing was changed: try again (request id {request_id})"


def _log_registry_failure(exc: RegistryError, request_id: str, method: str, path: str) -> None:
    """A registry that cannot write says so once per episode (``registry_writes_failing``); each request it turns
    away is only a DEBUG line. Any other registry failure is an ERROR of its own."""
    fields = {"request_id": request_id, "method": method, "path": path, "error": str(exc)}
    if isinstance(exc, RegistryUnavailable):
        log.debug("request_failed", **fields)
    else:
        log.error("request_failed", **fields)


def _error_body(code: str, message: str, field: str | None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field, "request_id": g.get("request_id")}}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


async def _json_body(max_bytes: int = MAX_BODY_BYTES) -> Any:
    """The request body parsed as JSON; raises the 415/413/400 errors. Its shape is the caller's to check."""
    _check_json_head(request.mimetype, request.content_length, max_bytes)
    raw = await request.get_data(cache=False, as_text=False)
    assert isinstance(raw, bytes)
    if len(raw) > max_bytes:  # a chunked body announces no length
        raise BodyTooLarge(f"the body is larger than {max_bytes} bytes")
    return _parse_json(raw)


def _check_json_head(mimetype: str, content_length: int | None, max_bytes: int) -> None:
    """What the head of a request with a JSON body must say: the 415 and (for an announced length) 413 errors."""
    if mimetype != "application/json":
        # A JSON content type cannot be sent cross-origin without a CORS preflight this server never answers,
        # so a web page cannot post to a loopback supervisor that runs without a token.
        raise UnsupportedMediaType(f"the body must be application/json, not {mimetype or 'unset'!r}")
    if content_length is not None and content_length > max_bytes:
        raise BodyTooLarge(f"the body is larger than {max_bytes} bytes")


def _parse_json(raw: bytes) -> Any:
    """A body's bytes parsed as JSON (no NaN/Infinity); raises the 400 naming ``body``."""
    try:
        # json.loads(raw, parse_constant=...) step by step, with one decoder instead of a new one per call.
        return _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"the body is not valid JSON: {exc}", field="body") from None
    except RecursionError:
        # json's decoder recurses per nesting level: a body of a thousand '[' exhausts the stack.
        raise MalformedRequest("the body is nested too deeply", field="body") from None


def _envelope(body: Any, allowed: Iterable[str]) -> dict[str, Any]:
    """A parsed body that must be a JSON object with only ``allowed`` keys; raises the 422 naming the field."""
    if not isinstance(body, dict):
        raise ValidationError("the body must be a JSON object", field="body")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise ValidationError(f"unknown field {unknown[0]!r}", field=unknown[0])
    return body


def _check_api_token(given: str | None, expected: str | None) -> None:
    """The operator token check of every non-public route (``expected`` None: the server runs without one)."""
    if expected is None:
        return
    # Constant-time: the compare must not reveal how much of a guessed token is right.
    if given is None or not hmac.compare_digest(given.encode(), expected.encode()):
        raise Unauthorized("missing or wrong API token (Authorization: Bearer <PODCAST_JOB_API_TOKEN>)")


async def _enqueue_answer(supervisor: Supervisor, body: Any) -> dict[str, Any]:
    """``POST /api/jobs``: the body (parsed JSON) checked and enqueued; the 202's payload."""
    envelope = _envelope(body, ("kind", "params"))
    if "kind" not in envelope:
        raise ValidationError("missing field 'kind'", field="kind")
    return _enqueued(await supervisor.enqueue(envelope["kind"], envelope.get("params")))


def _enqueued(result: EnqueueResult) -> dict[str, Any]:
    """An enqueue's 202 payload (also a retry's)."""
    job = result.job
    return {
        "job_id": job.job_id,
        "status": str(job.status),
        "queue_position": job.queue_position,
        "coalesced": result.coalesced,
    }


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _query(allowed: Iterable[str]) -> dict[str, str]:
    """The query string as single values; an unknown or repeated name is a 422 naming it (typos never pass)."""
    out: dict[str, str] = {}
    for name in request.args:
        values = request.args.getlist(name)
        if name not in allowed:
            raise ValidationError(f"unknown query parameter {name!r}", field=name)
        if len(values) != 1:
            raise ValidationError(f"query parameter {name!r} given {len(values)} times", field=name)
        out[name] = values[0]
    return out


def _int_query(query: Mapping[str, str], name: str, default: int | None) -> int | None:
    if name not in query:
        return default
    text = query[name]
    # ASCII digits only: re's \d (and int()) also take other scripts' digits and underscores.
    if not re.fullmatch(r"[0-9]{1,12}", text):
        raise ValidationError(f"{name} must be a non-negative integer, not {query[name]!r}", field=name)
    return int(text)


class _JobIdConverter(BaseConverter):
    """The job id of ``/api/jobs/<job_id>``: one path segment, never a fixed route's name (``reconcile``, ``batch``).

    A fixed path outranks a template, in OpenAPI as in the document: ``/api/jobs/reconcile`` is the reconcile route
    for every method. Without this, ``GET /api/jobs/reconcile`` matched ``GET /api/jobs/<job_id>`` (404, "no such
    job") and ``OPTIONS`` advertised that GET; now it is a 405 whose ``Allow`` says POST. The names come from the
    document, which the tests hold to the route map. (Job ids are uuid hex: none is lost.)
    """

    regex = rf"(?!(?:{'|'.join(map(re.escape, JOBS_SUBROUTES))})$)[^/]+"


def create_app(
    supervisor: Supervisor,
    api_token: ApiToken | None = None,
    *,
    limits: HttpLimits | None = None,
) -> QuartTrio:
    """The app over ``supervisor``; ``api_token`` is the operator token in force (re-read on SIGHUP by the server);
    ``limits``: the body and response timeouts (``HttpLimits``' defaults unless given). Every request goes through
    its routes: Quart is the only dispatcher, hypercorn's h11 the only parser."""
    # No static folder: the route map is exactly the API, which the auth and OpenAPI tests walk.
    app = QuartTrio(__name__, static_folder=None)
    app.url_map.converters["job_id"] = _JobIdConverter
    # The stack's own cap is the largest route's (a batch); _json_body holds every other route to MAX_BODY_BYTES.
    app.config["MAX_CONTENT_LENGTH"] = MAX_BATCH_BODY_BYTES
    limits = limits if limits is not None else HttpLimits()
    app.config["BODY_TIMEOUT"] = limits.body_timeout_s
    app.config["RESPONSE_TIMEOUT"] = limits.response_timeout_s
    # Errors are answered by our handlers, never re-raised into the server (not even under TESTING).
    app.config["PROPAGATE_EXCEPTIONS"] = False
    app.extensions["supervisor.metrics_registry"] = supervisor.metrics.registry
    token_source = api_token if api_token is not None else ApiToken.from_config(supervisor.config)

    # -- every request ----------------------------------------------------------------------------------

    @app.before_request
    async def authenticate() -> None:
        g.request_id = secrets.token_hex(8)
        if request.method not in _SAFE_METHODS and "Origin" in request.headers:
            # Browsers send Origin on every cross-site POST, and a bodyless POST (pause, reconcile) needs no CORS
            # preflight: without this, any web page could drive a token-less loopback supervisor. The CLI, the
            # runner's heartbeats and scripts send no Origin.
            raise Forbidden("requests from a web page are refused; use the CLI or an HTTP client")
        expected = token_source.current
        if expected is None or request.routing_exception is not None:
            return  # an unknown route or method answers 404/405: the route map is public (openapi.json)
        if request.endpoint in PUBLIC_ENDPOINTS:
            return
        _check_api_token(_bearer_token(), expected)

    @app.after_request
    async def tag_response(response: Response) -> Response:
        if "request_id" in g:
            response.headers[REQUEST_ID_HEADER] = g.request_id
        # A job's log is served as text/plain; a browser must never sniff it into HTML.
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.errorhandler(RequestError)
    async def request_error(exc: RequestError) -> Any:
        return _error_body(exc.code, str(exc), exc.field), exc.http_status

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Any:
        status = exc.code or 500
        code = _HTTP_CODES.get(status, _snake(type(exc).__name__))
        headers = {}
        valid = getattr(exc, "valid_methods", None)
        if valid:
            headers["Allow"] = ", ".join(valid)
        too_large = f"the body is larger than {MAX_BATCH_BODY_BYTES} bytes"
        message = too_large if status == 413 else exc.description or exc.name
        return _error_body(code, message, None), status, headers

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception) -> Any:
        request_id = g.get("request_id") or secrets.token_hex(8)
        g.request_id = request_id
        if isinstance(exc, RegistryError):
            # Storage full, locked or unreadable: the caller may retry; the detail stays in our log.
            _log_registry_failure(exc, request_id, request.method, request.path)
            return _error_body("unavailable", _unavailable_message(request_id), None), 503, _RETRY_AFTER
        log.exception("request_failed", request_id=request_id, method=request.method, path=request.path)
        return _error_body("internal_error", f"internal server error (request id {request_id})", None), 500

    # -- routes ---------------------------------------------------------------------------------------

    @app.get("/api/health")
    async def health() -> Any:
        """Liveness of the server, and what is degraded."""
        state = await supervisor.health()
        body: dict[str, Any] = {
            "status": state.status,
            "boot_id": state.boot_id,
            "exec_mode": state.exec_mode,
            "paused": state.paused,
            "host_id": state.host_id,
            "leader": state.leader,
        }
        if state.degraded:
            body["degraded"] = state.degraded
        return body

    @app.post("/api/jobs")
    async def enqueue() -> Any:
        """Enqueue a job of a kind with its params."""
        return await _enqueue_answer(supervisor, await _json_body()), 202

    @app.post("/api/jobs/batch")
    async def enqueue_batch() -> Any:
        """Enqueue up to 1,000 jobs at once, all or nothing."""
        body = await _json_body(MAX_BATCH_BODY_BYTES)
        if not isinstance(body, dict):
            raise ValidationError("the body must be a JSON object", field="body")
        unknown = sorted(set(body) - {"jobs"})
        if unknown:
            raise ValidationError(f"unknown field {unknown[0]!r}", field=unknown[0])
        if "jobs" not in body:
            raise ValidationError("missing field 'jobs'", field="jobs")
        results = await supervisor.enqueue_many(body["jobs"])
        return {
            "jobs": [{"job_id": r.job.job_id, "status": str(r.job.status), "coalesced": r.coalesced} for r in results]
        }, 202

    @app.get("/api/jobs")
    async def list_jobs() -> Any:
        """List jobs, newest first, one page at a time."""
        query = _query(("status", "kind", "limit", "cursor"))
        limit = _int_query(query, "limit", DEFAULT_LIST_LIMIT)
        assert limit is not None
        jobs, next_cursor = await supervisor.list_jobs(
            status=query.get("status"), kind=query.get("kind"), limit=limit, cursor=query.get("cursor")
        )
        return {"jobs": [_row(job) for job in jobs], "next_cursor": next_cursor}

    @app.get("/api/jobs/<job_id:job_id>")
    async def show_job(job_id: str) -> Any:
        """One job's row, with the jobs enqueued as retries of it."""
        job, retries = await supervisor.show(job_id)
        return {**_row(job), "retried_by": retries}

    @app.post("/api/jobs/<job_id>/retry")
    async def retry_job(job_id: str) -> Any:
        """Enqueue a finished job's kind and params again, as a new job that names it (retry_of)."""
        return _enqueued(await supervisor.retry(job_id)), 202

    @app.post("/api/jobs/<job_id>/cancel")
    async def cancel_job(job_id: str) -> Any:
        """Cancel a job (idempotent)."""
        return _row(await supervisor.cancel(job_id))

    @app.post("/api/jobs/prune")
    async def prune_jobs() -> Any:
        """Remove finished jobs past the retention now, oldest first (dry_run=true: only list them)."""
        query = _query(("dry_run", "limit"))
        dry_run = _bool_query("dry_run", default=False)
        limit = _int_query(query, "limit", MAX_LIST_LIMIT)
        assert limit is not None
        gone = await supervisor.prune(dry_run=dry_run, limit=limit)
        return {
            "dry_run": dry_run,
            "pruned": len(gone),
            "limit_reached": len(gone) == limit,
            "retention": supervisor.retention(),
            "jobs": [
                {"job_id": j.job_id, "kind": j.kind, "status": str(j.status), "ended_at": to_iso(j.ended_at)}
                for j in gone
            ],
        }

    @app.post("/api/jobs/reconcile")
    async def reconcile() -> Any:
        """Operator reconcile: may mark a live job past the wall-clock window stale."""
        report = await supervisor.operator_reconcile()
        return {"updated": report.updated, "details": [dataclasses.asdict(d) for d in report.details]}

    @app.get("/api/hosts")
    async def hosts() -> Any:
        """The fleet's hosts (live or silent) and its leader."""
        return await supervisor.hosts()

    @app.post("/api/hosts/<host_id>/forget")
    async def forget_host(host_id: str) -> Any:
        """A host that will never come back: its running jobs end orphan_host_forgotten, their slots freed."""
        return await supervisor.forget_host(host_id)

    @app.get("/api/queue")
    async def queue() -> Any:
        """The queue's state."""
        return dataclasses.asdict(await supervisor.queue_state())

    @app.post("/api/queue/pause")
    async def pause() -> Any:
        """Pause promotion (creates the pause flag file)."""
        return dataclasses.asdict(await supervisor.pause())

    @app.post("/api/queue/resume")
    async def resume() -> Any:
        """Resume promotion (removes the pause flag file) and drain."""
        return dataclasses.asdict(await supervisor.resume())

    @app.get("/api/jobs/<job_id>/log")
    async def job_log(job_id: str) -> Any:
        """A job's log, whole, its last ``tail_bytes``, or from byte ``offset`` on."""
        query = _query(("tail_bytes", "offset"))
        tail_bytes = _int_query(query, "tail_bytes", None)
        offset = _int_query(query, "offset", None)
        if tail_bytes is not None and offset is not None:
            raise ValidationError("give tail_bytes or offset, not both", field="offset")
        piece = await supervisor.log_slice(job_id, tail_bytes=tail_bytes, offset=offset)
        # Bytes as written: a job's output need not be valid UTF-8, and re-encoding would shift offsets. Sent a
        # chunk at a time with its length announced: a request holds one chunk in memory, not a 50 MiB log.
        response = Response(piece.chunks(), status=200, content_type="text/plain; charset=utf-8")
        response.content_length = piece.end - piece.start
        return response

    @app.post("/api/jobs/<job_id>/heartbeat")
    async def heartbeat(job_id: str) -> Any:
        """A running job's heartbeat, authenticated with that job's own token."""
        token = _bearer_token()
        if token is None:
            raise Unauthorized(MISSING_JOB_TOKEN)
        # The core checks the token before it reads the body, then validates the body and that the job runs.
        await supervisor.heartbeat(job_id, token, _json_body)
        return "", 204

    @app.get("/api/events")
    async def events() -> Any:
        """A server-sent-events stream of job events, resumable with Last-Event-ID."""
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
            backlog=_bool_query("backlog", default=False),
            follow=_bool_query("follow", default=True),
        )
        # A reader dropped for not reading is usually stuck in a write of ours (it stopped reading, the socket is
        # full): only cancelling its request ends that write and closes the connection. This handler runs in the
        # request's own task (quart-trio), whose parent nursery is the request's: cancelling it ends exactly this
        # request. (tests/api/test_api_events.py holds this to a real client that stops reading.)
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

    @app.get("/api/openapi.json")
    async def openapi() -> Any:
        """This API's OpenAPI document."""
        return openapi_document(supervisor.kinds)

    @app.get("/metrics")
    async def metrics() -> Any:
        """Prometheus metrics."""
        return Response(await supervisor.render_metrics(), status=200, content_type=CONTENT_TYPE_PLAIN_0_0_4)

    return app


def _bool_query(name: str, *, default: bool) -> bool:
    text = request.args.get(name)
    if text is None:
        return default
    if text not in ("true", "false"):
        raise ValidationError(f"{name} must be true or false, not {text!r}", field=name)
    return text == "true"


# How long a browser's EventSource waits before it reconnects after a dropped connection.
SSE_RETRY_MS = 2000


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
            yield b": keep-alive\n\n" if item is None else _sse_event(item)
    finally:
        subscription.close()


def _sse_event(item: StreamEvent) -> bytes:
    return _sse_message(item.id, item.name, item.data)


def _sse_message(event_id: str | None, name: str, data: bytes) -> bytes:
    # The payload is compact JSON: one line, so one data: field.
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\n".encode() + b"data: " + data + b"\n\n"


def _row(job: Job) -> dict[str, Any]:
    """A row as callers see it: registry fields without the token hash, ``queue_position`` only when queued."""
    return job.public()
