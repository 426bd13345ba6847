"""A small synchronous client of the control API, for the CLI.

Every request carries an explicit ``timeout=`` (``tools/lint_timeouts.py``): a CLI that hangs on a wedged server
is worse than one that says so. Failures come out as two errors, by whose fault they are:

    SupervisorError
    ├── ApiError        the server answered with an error (its code, message and field, and the HTTP status)
    └── Unreachable     no answer: refused, timed out, or not HTTP
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from ..domain import IDEMPOTENCY_KEY_HEADER, JobStatus, SupervisorError

DEFAULT_URL = "http://127.0.0.1:8000"
# Connecting to a local server is instant or refused; reconcile probes every running job, so reads get longer.
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 60.0


class ApiError(SupervisorError):
    """The server answered with an error; the message is the server's own."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        request_id: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.status = status
        self.code = code
        self.field = field
        self.request_id = request_id
        self.retry_after_s = retry_after_s  # a 503's Retry-After, in seconds
        super().__init__(message)

    def describe(self) -> str:
        """One line for a human: the message, then what a script or an operator may need."""
        extra = [f"HTTP {self.status}", self.code]
        if self.field:
            extra.append(f"field {self.field}")
        if self.request_id:
            extra.append(f"request id {self.request_id}")
        return f"{self} ({', '.join(extra)})"


class Unreachable(SupervisorError):
    """No usable answer from the server at all."""


class NotTheApi(Unreachable):
    """The server answered, but not as this API answers (another service at that address, a proxy's page, an answer
    of another shape): no usable answer, so told as an unreachable supervisor is (exit 4), in one line."""


class Answer(dict[str, Any]):
    """A JSON object the server answered (every object of it, nested ones too): a field it lacks is this API's
    answer missing, said as ``NotTheApi`` naming the field, never a ``KeyError`` in a command."""

    def __missing__(self, key: str) -> Any:
        raise NotTheApi(f"the server's answer has no field {key!r}, so not this API")


def parse_answer(content: bytes, what: str) -> Answer:
    """A JSON object of this API, its objects as ``Answer``; anything else is ``NotTheApi`` naming ``what``."""
    try:
        answer = json.loads(content, object_hook=Answer)
    except ValueError:
        raise NotTheApi(f"{what} answered something that is not JSON, so not this API") from None
    if not isinstance(answer, Answer):
        raise NotTheApi(f"{what} answered JSON that is not an object, so not this API")
    return answer


_STATUSES = frozenset(status.value for status in JobStatus)
# What each answer must hold for the commands that read it: field -> type (the API's own answers always do).
_SHAPES: dict[str, dict[str, type | tuple[type, ...]]] = {
    "job": {"job_id": str, "status": str, "kind": str},
    "enqueued": {"job_id": str, "status": str},
    "bulk": {"action": str, "selection": str, "count": int, "outcomes": dict, "results": dict},
    "page": {"jobs": list},  # a page of rows: each checked as a job
    "queue": {"paused": bool, "running": int, "queued": int, "max_concurrent": int},
    "reconcile": {"details": list},
    "hosts": {"hosts": list},
    "jobs": {"jobs": list},  # a batch's answers, a prune's jobs
    "health": {"status": str},
    "any": {},
}


def check_shape(answer: Answer, shape: str, what: str) -> Answer:
    """``answer`` as ``shape`` says (its fields' types, a job's status one of the API's), else ``NotTheApi``."""
    for name, kind in _SHAPES[shape].items():
        value = answer.get(name)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
            raise NotTheApi(f"{what} answered without a {name!r} of this API's type, so not this API")
    if shape in ("job", "enqueued") and answer["status"] not in _STATUSES:
        raise NotTheApi(f"{what} answered a job status {answer['status']!r} that this API has not, so not this API")
    if shape == "page":
        for row in answer["jobs"]:
            if not isinstance(row, Answer):
                raise NotTheApi(f"{what} answered a list of jobs that are not objects, so not this API")
            check_shape(row, "job", what)
    return answer


class Client:
    """The control API as method calls; each returns the decoded JSON answer (or the log's bytes)."""

    _http: httpx.Client

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: httpx.Timeout | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the supervisor URL must start with http:// or https://, not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout or httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # ``transport``: httpx's own seam, for a caller that needs other connections (a test's mock, no keep-alive).
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=self.timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int | None] | None = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        try:
            response = self._http.request(
                method,
                path,
                params={k: v for k, v in (params or {}).items() if v is not None},
                json=body,
                headers=headers,
                timeout=self.timeout,
            )
        except httpx.TimeoutException as exc:
            raise Unreachable(
                f"the supervisor at {self.base_url} did not answer in time ({type(exc).__name__})"
            ) from exc
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach the supervisor at {self.base_url}: {exc}") from exc
        if response.is_error:
            raise _api_error(response)
        return response

    def _json(self, method: str, path: str, *, shape: str = "any", **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        what = f"{self.base_url} ({method} {path})"
        return check_shape(parse_answer(response.content, what), shape, what)

    # -- the API ----------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/api/health", shape="health")

    def enqueue(
        self,
        kind: str,
        params: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        schedule: str | None = None,
    ) -> dict[str, Any]:
        """``schedule``: ``NAME/PERIOD_S[/if_idle]``, the tick's schedule (its key is the caller's to give)."""
        body = {"kind": kind, "params": dict(params)}
        query = {"schedule": schedule} if schedule is not None else None
        return self._json(
            "POST", "/api/jobs", shape="enqueued", body=body, headers=_keyed(idempotency_key), params=query
        )

    def enqueue_batch(self, jobs: list[dict[str, Any]], *, idempotency_key: str | None = None) -> dict[str, Any]:
        batch = {"jobs": jobs}
        return self._json("POST", "/api/jobs/batch", shape="jobs", body=batch, headers=_keyed(idempotency_key))

    def list_jobs(
        self,
        *,
        status: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        idempotency_key: str | None = None,
        filters: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A page of the list; ``filters``: the others by their query names (``reason``, ``since``, ``param.feed``)."""
        query = {"status": status, "kind": kind, "limit": limit, "cursor": cursor, "idempotency_key": idempotency_key}
        return self._json("GET", "/api/jobs", shape="page", params={**query, **(filters or {})})

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/api/jobs/{_segment(job_id)}", shape="job")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._json("POST", f"/api/jobs/{_segment(job_id)}/cancel", shape="job")

    def bulk(
        self,
        action: str,
        *,
        filters: Mapping[str, str] | None = None,
        selection: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """``POST /api/jobs/bulk``: a dry run of ``filters``, or the action on a dry run's ``selection`` (safe to
        send again: it acts on each job once)."""
        body: dict[str, Any] = {"action": action}
        if selection is not None:
            body["selection"] = selection
        else:
            body |= {"filter": dict(filters or {}), "dry_run": dry_run}
        return self._json("POST", "/api/jobs/bulk", shape="bulk", body=body)

    def retry(self, job_id: str) -> dict[str, Any]:
        return self._json("POST", f"/api/jobs/{_segment(job_id)}/retry", shape="enqueued")

    def prune(self, *, dry_run: bool, limit: int | None = None) -> dict[str, Any]:
        query = {"dry_run": "true" if dry_run else "false", "limit": limit}
        return self._json("POST", "/api/jobs/prune", shape="jobs", params=query)

    def reconcile(self) -> dict[str, Any]:
        return self._json("POST", "/api/jobs/reconcile", shape="reconcile")

    def queue(self) -> dict[str, Any]:
        return self._json("GET", "/api/queue", shape="queue")

    def hosts(self) -> dict[str, Any]:
        return self._json("GET", "/api/hosts", shape="hosts")

    def forget_host(self, host_id: str) -> dict[str, Any]:
        return self._json("POST", f"/api/hosts/{quote(host_id, safe='')}/forget")

    def drain_host(self, host_id: str) -> dict[str, Any]:
        return self._json("POST", f"/api/hosts/{quote(host_id, safe='')}/drain")

    def undrain_host(self, host_id: str) -> dict[str, Any]:
        return self._json("POST", f"/api/hosts/{quote(host_id, safe='')}/undrain")

    def pause(self) -> dict[str, Any]:
        return self._json("POST", "/api/queue/pause", shape="queue")

    def resume(self) -> dict[str, Any]:
        return self._json("POST", "/api/queue/resume", shape="queue")

    def log(
        self, job_id: str, *, tail_bytes: int | None = None, offset: int | None = None, attempt: int | None = None
    ) -> bytes:
        query = {"tail_bytes": tail_bytes, "offset": offset, "attempt": attempt}
        path = f"/api/jobs/{_segment(job_id)}/log"
        response = self._send("GET", path, params=query)
        if not response.headers.get("content-type", "").startswith("text/plain"):
            raise NotTheApi(f"{self.base_url} (GET {path}) answered a log that is not text/plain, so not this API")
        return response.content


def _keyed(idempotency_key: str | None) -> dict[str, str] | None:
    return {IDEMPOTENCY_KEY_HEADER: idempotency_key} if idempotency_key is not None else None


# A request the client may send again with its Idempotency-Key: this many times in all, waiting the Retry-After the
# server gives (at most MAX_RETRY_WAIT_S) or else these backoffs in turn. Bounded: about 4 s of waiting in all.
RETRY_ATTEMPTS = 4
RETRY_BACKOFF_S = (0.5, 1.0, 2.0)
MAX_RETRY_WAIT_S = 10.0
T = TypeVar("T")


def with_retries(
    call: Callable[[], T],
    *,
    on_retry: Callable[[SupervisorError, int, float], None] = lambda error, attempt, wait_s: None,
    sleep: Callable[[float], None] = time.sleep,
    attempts: int = RETRY_ATTEMPTS,
) -> T:
    """``call`` (a keyed enqueue), sent again after no answer (refused, reset, timed out) or a 503 (the registry
    could not take it), at most ``attempts`` times in all: safe only because its key makes every retry answer the
    first answer instead of a second job. ``on_retry(error, next attempt, wait)`` says so before each wait."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except (Unreachable, ApiError) as exc:
            if attempt == attempts or (isinstance(exc, ApiError) and exc.status != 503):
                raise
            backoff = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S)) - 1]
            wait_s = (
                min(exc.retry_after_s, MAX_RETRY_WAIT_S) if isinstance(exc, ApiError) and exc.retry_after_s else backoff
            )
            on_retry(exc, attempt + 1, wait_s)
            sleep(wait_s)
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def _segment(job_id: str) -> str:
    """A job id as one path segment: an id with a '/' must not address another route."""
    return quote(job_id, safe="")


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None


def _api_error(response: httpx.Response) -> ApiError:
    request_id = response.headers.get("X-Request-Id")
    try:
        error = response.json()["error"]
        return ApiError(
            response.status_code,
            str(error.get("code", "error")),
            str(error.get("message", "")),
            field=error.get("field"),
            request_id=error.get("request_id") or request_id,
            retry_after_s=_retry_after(response),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        # Not our error shape (a proxy in between, say): show the start of what came back.
        text = response.text.strip().splitlines()[0][:200] if response.text.strip() else response.reason_phrase
        return ApiError(
            response.status_code, "http_error", text, request_id=request_id, retry_after_s=_retry_after(response)
        )
