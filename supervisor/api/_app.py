"""The HTTP control API: a quart-trio app that only translates requests into calls on the core.

It holds no rule of supervision; every decision lives in the core (``core.Supervisor``). What lives here is HTTP only:
authentication, registering the routes (each declared once, beside its handler, in ``_routes``), and turning the
one error tree of ``_errors.py`` into JSON
answers, generically (``RequestError.http_status``/``code``/``field``), so a new error class needs no code here.

Every answer carries an ``X-Request-Id``; an unexpected error is logged with that id and answered with a bare 500
that names it, never with a traceback.
"""

from __future__ import annotations

import functools
import re
import secrets
from typing import Any, Protocol

import trio
from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..core import Supervisor
from ..domain import (
    ApiToken,
    Credentials,
    Forbidden,
    InsufficientScope,
    RegistryError,
    RegistryUnavailable,
    RequestError,
    Unauthorized,
    hash_token,
    scope_allows,
)
from ..observe import enter_request, get_logger
from ._limits import HttpLimits
from ._parse import MAX_BATCH_BODY_BYTES, bearer_token
from ._route_table import Handler
from ._routes import CONVERTERS, ROUTES, SCOPE_OF

log = get_logger()

REQUEST_ID_HEADER = "X-Request-Id"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

# Names for werkzeug's HTTP errors where the generic snake_case of the class name would read badly.
_HTTP_CODES = {400: "bad_request", 413: "body_too_large", 415: "unsupported_media_type"}


# How long a client is told to wait before retrying a request the registry could not take (a full disk, a lock).
UNAVAILABLE_RETRY_AFTER_S = 5
_UNAVAILABLE_RETRY_AFTER = {"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)}


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


def _job_of_request() -> dict[str, str]:
    """The job a request is about (its route's ``job_id``), for its log lines: every line about a job names it."""
    job_id = (request.view_args or {}).get("job_id")
    return {"job_id": job_id} if isinstance(job_id, str) else {}


def _log_refusal(exc: RequestError) -> None:
    """A request refused for its credentials, whatever its method (docs/log-events.md): who, if known, else which
    token by the start of its digest (never the token), so that a client left with a stale one can be found."""
    caller = g.get("caller")
    token = bearer_token()
    log.warning(
        "api_request_refused",
        method=request.method,
        path=request.path,
        status=exc.http_status,
        code=exc.code,
        why=str(exc),
        by=caller.name if caller is not None else None,
        token_digest=hash_token(token)[:12] if token is not None else None,
        request_id=g.get("request_id"),
        **_job_of_request(),
    )


def _error_body(code: str, message: str, field: str | None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field, "request_id": g.get("request_id")}}


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class HttpCondition(Protocol):
    def condition(self) -> str | None: ...


def create_app(
    supervisor: Supervisor,
    credentials: Credentials | ApiToken | None = None,
    *,
    limits: HttpLimits | None = None,
    edge: HttpCondition | None = None,
) -> QuartTrio:
    """The app over ``supervisor``; ``credentials``: the tokens in force (re-read on SIGHUP by the server; an
    ``ApiToken`` alone: only that operator token; None: the config's operator token, no named tokens); ``limits``: the
    body and response timeouts (``HttpLimits``' defaults unless given); ``edge``: the HTTP server's own condition, for
    ``/api/health``. Every request goes through its routes: Quart
    is the only dispatcher, hypercorn's h11 the only parser."""
    app = _configured_app(supervisor, limits if limits is not None else HttpLimits(), edge)
    if credentials is None:
        credentials = ApiToken.from_config(supervisor.config)
    tokens = credentials if isinstance(credentials, Credentials) else Credentials(credentials)
    # -- every request: who sent it (before), what it was answered (after), its log lines' scope (at its end) --
    app.before_request(functools.partial(authenticate, tokens))
    app.after_request(tag_response)
    app.teardown_request(close_log_scope)
    # -- every error, as the JSON error body: ours, werkzeug's HTTP errors, and any other (a bare 500) --
    app.errorhandler(RequestError)(request_error)
    app.errorhandler(HTTPException)(http_error)
    app.errorhandler(Exception)(unexpected)
    # -- routes: each declared once, beside its handler (_routes.ROUTES) --
    for route in ROUTES:
        app.add_url_rule(route.rule, route.endpoint, _view(route.handler, supervisor), methods=[route.method])
    return app


def _configured_app(supervisor: Supervisor, limits: HttpLimits, edge: HttpCondition | None) -> QuartTrio:
    """A Quart app with the API's converters, body limits and timeouts, and what its routes share (``extensions``)."""
    # No static folder: the route map is exactly the API, which the auth and OpenAPI tests walk.
    app = QuartTrio(__name__, static_folder=None)
    app.url_map.converters.update(CONVERTERS)
    # The stack's own cap is the largest route's (a batch); _json_body holds every other route to MAX_BODY_BYTES.
    app.config["MAX_CONTENT_LENGTH"] = MAX_BATCH_BODY_BYTES
    app.config["BODY_TIMEOUT"] = limits.body_timeout_s
    app.config["RESPONSE_TIMEOUT"] = limits.response_timeout_s
    # Errors are answered by our handlers, never re-raised into the server (not even under TESTING).
    app.config["PROPAGATE_EXCEPTIONS"] = False
    app.extensions["supervisor.metrics_registry"] = supervisor.metrics_registry
    # The HTTP server's own condition, which /api/health adds to the core's (None: served by hand, as in tests).
    app.extensions["supervisor.http_condition"] = edge
    # List pages built at once (HttpLimits.max_page_builds): many never keep a heartbeat or health behind them.
    app.extensions["supervisor.page_builds"] = trio.CapacityLimiter(limits.max_page_builds)
    return app


async def authenticate(tokens: Credentials) -> None:
    """Before every request: its id and log scope; a request from a web page refused; the caller identified by its
    bearer token among ``tokens``, and refused unless its scope is at least the route's."""
    g.request_id = secrets.token_hex(8)
    g.log_scope = enter_request(g.request_id)  # every line written for this request names it (and its token)
    if request.method not in _SAFE_METHODS and "Origin" in request.headers:
        # Browsers send Origin on every cross-site POST, and a bodyless POST (pause, reconcile) needs no CORS
        # preflight: without this, any web page could drive a token-less loopback supervisor. The CLI, the
        # runner's heartbeats and scripts send no Origin.
        raise Forbidden("requests from a web page are refused; use the CLI or an HTTP client")
    if request.routing_exception is not None:
        return  # an unknown route or method answers 404/405: the route map is public (openapi.json)
    needed = SCOPE_OF.get(request.endpoint or "")
    if needed is None:
        return  # the probes, and the heartbeat (which checks the job's own token)
    if request.method == "OPTIONS":
        needed = "read"  # which methods a route takes (Allow) changes nothing: any valid token may ask
    # INV-LEAST-SCOPE (ADR 0017): a token of at least the route's declared scope, or nothing runs.
    caller = tokens.identify(bearer_token())
    if caller is None:
        raise Unauthorized("missing, unknown or revoked API token (Authorization: Bearer <token>)")
    g.caller = caller
    g.log_scope.by = caller.name
    if not scope_allows(caller.scope, needed):
        raise InsufficientScope(caller.name, caller.scope, needed)


async def tag_response(response: Response) -> Response:
    """After every request: its id on the answer, a state-changing one logged with who sent it, and no sniffing."""
    if "request_id" in g:
        response.headers[REQUEST_ID_HEADER] = g.request_id
    if request.method not in _SAFE_METHODS and SCOPE_OF.get(request.endpoint or "") is not None:
        # INV-ACTION-ATTRIBUTED (ADR 0017): every state-changing request says who sent it, never the token.
        caller = g.get("caller")
        log.info(
            "api_request",
            method=request.method,
            path=request.path,
            status=response.status_code,
            by=caller.name if caller is not None else None,
            request_id=g.get("request_id"),
            **_job_of_request(),
        )
    # A job's log is served as text/plain; a browser must never sniff it into HTML.
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


async def close_log_scope(_exc: BaseException | None) -> None:
    scope = g.get("log_scope")
    if scope is not None:
        scope.open = False  # what the request started and outlives it no longer names it


async def request_error(exc: RequestError) -> Any:
    """One of the error tree's: its status, code, message and field; a refused credential logged."""
    if isinstance(exc, (Unauthorized, Forbidden)):
        _log_refusal(exc)
    headers = {}
    if isinstance(exc, InsufficientScope):
        # RFC 6750 section 3: the scope the request needs, for a client to read.
        headers["WWW-Authenticate"] = f'Bearer error="insufficient_scope", scope="{exc.needed}"'
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(exc.retry_after_s)
    return _error_body(exc.code, str(exc), exc.field), exc.http_status, headers


async def http_error(exc: HTTPException) -> Any:
    """One of werkzeug's (404, 405 with its Allow, 413, ...), as our error body."""
    status = exc.code or 500
    code = _HTTP_CODES.get(status, _snake(type(exc).__name__))
    headers = {}
    valid = getattr(exc, "valid_methods", None)
    if valid:
        headers["Allow"] = ", ".join(valid)
    too_large = f"the body is larger than {MAX_BATCH_BODY_BYTES} bytes"
    message = too_large if status == 413 else exc.description or exc.name
    return _error_body(code, message, None), status, headers


async def unexpected(exc: Exception) -> Any:
    """Any other: a registry that cannot take the request is a 503 to retry; anything else a bare 500 naming the
    request id, its traceback only in our log."""
    request_id = g.get("request_id") or secrets.token_hex(8)
    g.request_id = request_id
    if isinstance(exc, RegistryError):
        # Storage full, locked or unreadable: the caller may retry; the detail stays in our log.
        _log_registry_failure(exc, request_id, request.method, request.path)
        return _error_body("unavailable", _unavailable_message(request_id), None), 503, _UNAVAILABLE_RETRY_AFTER
    log.exception("request_failed", request_id=request_id, method=request.method, path=request.path)
    return _error_body("internal_error", f"internal server error (request id {request_id})", None), 500


def _view(handler: Handler, supervisor: Supervisor) -> Handler:
    """``handler`` as the app's view: the supervisor first, then the path's parameters."""

    @functools.wraps(handler)
    async def view(**path_args: str) -> Any:
        return await handler(supervisor, **path_args)

    return view
