"""The routes of what a running job writes: its log, read by callers (whole, its tail, or from an offset), and its
heartbeats, posted by the job itself with its own token."""

from __future__ import annotations

from typing import Any

from quart import Response

from ..core import Supervisor
from ..domain import Unauthorized, ValidationError
from ._parse import bearer_token, int_query, json_body, parse_progress, query
from ._route_table import INVALID, NOT_FOUND, RouteTable, error, text_answer

LOG_HEARTBEAT_ROUTES = RouteTable()

MISSING_JOB_TOKEN = "missing job token (Authorization: Bearer $PODCAST_JOB_TOKEN)"
# A byte count in a query string: at most 12 ASCII digits (what the server parses).
_BYTE_COUNT = {"type": "integer", "minimum": 0, "maximum": 10**12 - 1}


@LOG_HEARTBEAT_ROUTES.get(
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


@LOG_HEARTBEAT_ROUTES.post(
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
