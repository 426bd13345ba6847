"""The OpenAPI 3.1 document of the control API (served at ``/api/openapi.json``).

Written by hand, as data, rather than generated from the app: the tests walk the app's route map and compare it
with ``paths`` here, and compare the ``Job`` schema with ``Job.public()``, so the two cannot drift apart silently.

The document is a contract a fuzzer can hold the server to (schemathesis runs in ``make test``): what it calls
valid the server accepts, and what it calls invalid the server refuses. So the value rules are not restated here
but taken from the code that enforces them (the cursor and number patterns, the string limits), and the enqueue
body is built from the server's own kinds: one schema per kind, with exactly that kind's params.
"""

from __future__ import annotations

import copy
from typing import Any

from ..core import MAX_BATCH, MAX_STAGE_LEN, MAX_UNITS
from ..domain._kinds import _ASCII_FLOAT, _ASCII_INT, MAX_FLOAT, MAX_STR_PARAM_LEN, JobKind, KindCatalog
from ..domain._model import JobStatus
from ..domain._settings import EXEC_MODES
from ..observe import EVENT_NAMES, GAP, LAST_EVENT_ID
from ..registry import CURSOR_PATTERN, MAX_LIST_LIMIT

API_VERSION = "1"

_STATUSES = [s.value for s in JobStatus]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


def _anchored(pattern: str) -> str:
    """A Python ``fullmatch`` pattern as a JSON Schema pattern (which matches anywhere unless anchored)."""
    return f"^(?:{pattern})$"


# A str param: no NUL, not starting with '-' (the empty string is a value too).
_STR_PARAM = "^(?:[^\\x00-][^\\x00]*)?$"
# A bool param given as a string: true or false in any case (JSON Schema patterns have no inline flags).
_BOOL_TEXT = "^(?:[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"

_TS = {"type": ["string", "null"], "format": "date-time", "description": "ISO-8601, UTC"}
_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_STR = {"type": ["string", "null"]}

_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "field", "request_id"],
                "properties": {
                    "code": {"type": "string", "description": "stable machine-readable name, e.g. validation_error"},
                    "message": {"type": "string"},
                    "field": {**_NULLABLE_STR, "description": "the offending field, e.g. params.seconds"},
                    "request_id": {"type": "string", "description": "also in the X-Request-Id header"},
                },
            }
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "boot_id", "exec_mode", "paused", "host_id", "leader"],
        "properties": {
            "host_id": {"type": "string", "description": "this supervisor's host (PODCAST_JOB_HOST_ID)"},
            "leader": {"type": "boolean", "description": "this host leads the fleet (runs the webhook sender)"},
            "status": {
                "enum": ["ok", "degraded"],
                "description": "degraded: a part named in `degraded` does not work fully; the server still answers",
            },
            "boot_id": {"type": "string"},
            "exec_mode": {"enum": list(EXEC_MODES)},
            "paused": {"type": ["boolean", "null"], "description": "null when the registry could not be read"},
            "degraded": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "present only when degraded: each part (`registry`: its writes fail, so nothing new "
                "is accepted; reads, running jobs and their slots go on; `engine`: the Docker engine does not answer, "
                "so no job is started and running ones keep their slots) and why",
            },
        },
    },
    "Host": {
        "type": "object",
        "required": ["host_id", "boot_id", "started_at", "last_seen_at", "lease_expires_at", "live", "leader"],
        "properties": {
            "host_id": {"type": "string"},
            "boot_id": {"type": "string"},
            "started_at": {"type": "string", "format": "date-time"},
            "last_seen_at": {"type": "string", "format": "date-time", "description": "its last lease renewal"},
            "lease_expires_at": {"type": "string", "format": "date-time"},
            "live": {
                "type": "boolean",
                "description": "its lease had not expired at the registry's clock (the database server's) as of this "
                "read: its jobs are its own to judge",
            },
            "leader": {"type": "boolean"},
        },
    },
    "Hosts": {
        "type": "object",
        "required": ["hosts", "leader"],
        "properties": {
            "hosts": {"type": "array", "items": _ref("Host")},
            "leader": {**_NULLABLE_STR, "description": "the live leader's host id; null: none now"},
        },
    },
    "ForgetHostResult": {
        "type": "object",
        "required": ["host_id", "jobs_ended"],
        "properties": {
            "host_id": {"type": "string"},
            "jobs_ended": {
                "type": "array",
                "items": {"type": "string"},
                "description": "its running jobs, ended orphan_host_forgotten (resubmitted while attempts remain)",
            },
        },
    },
    "BatchRequest": {
        "type": "object",
        "required": ["jobs"],
        "additionalProperties": False,
        "properties": {
            "jobs": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": _ref("EnqueueRequest")},
        },
    },
    "BatchResponse": {
        "type": "object",
        "required": ["jobs"],
        "properties": {
            "jobs": {
                "type": "array",
                "description": "one entry per request element, in order",
                "items": {
                    "type": "object",
                    "required": ["job_id", "status", "coalesced"],
                    "properties": {
                        "job_id": {"type": "string"},
                        "status": {"enum": _STATUSES},
                        "coalesced": {"type": "boolean"},
                    },
                },
            }
        },
    },
    "EnqueueResponse": {
        "type": "object",
        "required": ["job_id", "status", "queue_position", "coalesced"],
        "properties": {
            "job_id": {"type": "string"},
            "status": {"enum": _STATUSES},
            "queue_position": {**_NULLABLE_INT, "description": "1-based; null once the job left the queue"},
            "coalesced": {"type": "boolean", "description": "true: an identical queued job was returned"},
        },
    },
    "PruneReport": {
        "type": "object",
        "required": ["dry_run", "pruned", "limit_reached", "retention", "jobs"],
        "properties": {
            "dry_run": {"type": "boolean"},
            "pruned": {"type": "integer", "description": "how many jobs went (a dry run: would go)"},
            "limit_reached": {"type": "boolean", "description": "as many as the limit: more may be past the retention"},
            "retention": {
                "type": "object",
                "required": ["days", "max_jobs"],
                "description": "the retention in force (PODCAST_JOB_RETENTION_DAYS, PODCAST_JOB_RETENTION_MAX_JOBS); "
                "null: that rule is off",
                "properties": {"days": {"type": ["number", "null"]}, "max_jobs": _NULLABLE_INT},
            },
            "jobs": {
                "type": "array",
                "description": "oldest first",
                "items": {
                    "type": "object",
                    "required": ["job_id", "kind", "status", "ended_at"],
                    "properties": {
                        "job_id": {"type": "string"},
                        "kind": {"type": "string"},
                        "status": {"enum": _STATUSES},
                        "ended_at": {"type": "string", "format": "date-time"},
                    },
                },
            },
        },
    },
    "Job": {
        "type": "object",
        "description": "A registry row; never carries the job token.",
        "properties": {
            "job_id": {"type": "string"},
            "kind": {"type": "string"},
            "params": {"type": "object"},
            "argv": {"type": "array", "items": {"type": "string"}},
            "status": {"enum": _STATUSES},
            "error_reason": _NULLABLE_STR,
            "exit_code": _NULLABLE_INT,
            "created_at": {"type": "string", "format": "date-time"},
            "started_at": _TS,
            "ended_at": _TS,
            "attempts": {"type": "integer", "description": "its starts so far (one that never happened is none)"},
            "max_attempts": {"type": "integer", "description": "the starts its kind allowed when it was enqueued"},
            "next_attempt_at": {
                **_TS,
                "description": "a resubmitted job waiting out its backoff: when it may run; null: at once",
            },
            "history": {
                "type": "array",
                "description": "each earlier attempt it was resubmitted after, oldest first",
                "items": _ref("Attempt"),
            },
            "cancel_requested": {"type": "boolean"},
            "boot_id": _NULLABLE_STR,
            "host_id": {
                **_NULLABLE_STR,
                "description": "the host whose supervisor promoted it (only that host judges its process); null: none "
                "recorded (queued, or promoted before hosts were)",
            },
            "pid": _NULLABLE_INT,
            "pid_start_time": _NULLABLE_INT,
            "kernel_boot_id": _NULLABLE_STR,
            "container_id": _NULLABLE_STR,
            "completed_units": {"type": "integer", "description": "the progress watermark"},
            "total_units": _NULLABLE_INT,
            "stage": _NULLABLE_STR,
            "last_heartbeat_at": _TS,
            "last_progress_at": _TS,
            "log_path": _NULLABLE_STR,
            "queue_position": {"type": "integer", "description": "present only while queued (1-based)"},
            "retry_of": {
                **_NULLABLE_STR,
                "description": "the finished job this one is an operator's retry of (POST /api/jobs/{job_id}/retry); "
                "null for any other job (an automatic resubmission keeps its own id)",
            },
            "retried_by": {
                "type": "array",
                "items": {"type": "string"},
                "description": "present only in showJob's answer: the jobs enqueued as retries of this one, oldest "
                "first",
            },
            "stalled": {
                "type": "boolean",
                "description": "the sweeper's judgement: no progress for PODCAST_JOB_PROGRESS_STALE_SECONDS",
            },
            "stalled_since": {**_TS, "description": "when the sweeper judged it stalled; null when not stalled"},
            "silent": {
                "type": "boolean",
                "description": "the sweeper's judgement: heartbeats stopped while the process lives",
            },
        },
    },
    "Attempt": {
        "type": "object",
        "required": ["attempt", "started_at", "ended_at", "status", "reason", "exit_code"],
        "properties": {
            "attempt": {"type": "integer", "description": "1 for the first start"},
            "started_at": _TS,
            "ended_at": {"type": "string", "format": "date-time"},
            "status": {"enum": _STATUSES, "description": "how this attempt ended"},
            "reason": _NULLABLE_STR,
            "exit_code": _NULLABLE_INT,
        },
    },
    "JobList": {
        "type": "object",
        "required": ["jobs", "next_cursor"],
        "properties": {
            "jobs": {"type": "array", "items": _ref("Job")},
            "next_cursor": {
                "type": ["string", "null"],
                "pattern": _anchored(CURSOR_PATTERN.pattern),
                "description": "pass as ?cursor= for the next page; null at the end",
            },
        },
    },
    "ReconcileReport": {
        "type": "object",
        "required": ["updated", "details"],
        "properties": {
            "updated": {"type": "integer"},
            "details": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["job_id", "action", "reason", "liveness", "prior_boot"],
                    "properties": {
                        "job_id": {"type": "string"},
                        "action": {
                            "type": "string",
                            "description": (
                                "failed | stale | cancelled | succeeded (finalized now), queued (resubmitted), "
                                "requeued (it never started), keep, untouched"
                            ),
                        },
                        "reason": {"type": "string"},
                        "liveness": {"type": ["string", "null"], "enum": ["alive", "dead", "unknown", None]},
                        "prior_boot": {"type": "boolean"},
                    },
                },
            },
        },
    },
    "QueueState": {
        "type": "object",
        "required": ["paused", "running", "queued", "max_concurrent"],
        "properties": {
            "paused": {"type": "boolean"},
            "running": {"type": "integer"},
            "queued": {"type": "integer"},
            "max_concurrent": {"type": "integer"},
        },
    },
    "Heartbeat": {
        "type": "object",
        "required": ["completed_units"],
        "additionalProperties": False,
        "properties": {
            "completed_units": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_UNITS,
                "description": "a watermark: last_progress_at moves only when it increases",
            },
            "total_units": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_UNITS},
            "stage": {
                "type": ["string", "null"],
                "maxLength": MAX_STAGE_LEN,
                "description": "valid Unicode text (no lone surrogate)",
            },
        },
    },
}

# A byte count in a query string: at most 12 ASCII digits (what the server parses).
_BYTE_COUNT = {"type": "integer", "minimum": 0, "maximum": 10**12 - 1}

_JOB_ID: dict[str, Any] = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1},
}
# The fixed routes under /api/jobs/ (a test holds this to the paths below). A fixed path outranks a template, so no
# job id is one of these names: the app's route converter refuses them, and showJob's parameter says so.
JOBS_SUBROUTES = ("batch", "prune", "reconcile")
_PUBLIC: list[dict[str, list[str]]] = []  # no API token
_JOB_TOKEN: list[dict[str, list[str]]] = [{"jobToken": []}]

_UNAUTHORIZED = _error("missing or wrong API token")
# Every POST: the server refuses one that carries an Origin header (see info.description).
_CROSS_ORIGIN = _error("the request carries an Origin header (a web page sent it)")
_NOT_FOUND = _error("no job with that id")
_INVALID = _error("a field or query value is invalid; error.field names it")

_PATHS: dict[str, Any] = {
    "/api/health": {
        "get": {
            "operationId": "health",
            "summary": "Liveness of the server.",
            "security": _PUBLIC,
            "responses": {"200": _json(_ref("Health"), "the server is up")},
        }
    },
    "/api/jobs": {
        "post": {
            "operationId": "enqueue",
            "summary": "Enqueue a job of a kind with its params.",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("EnqueueRequest")}}},
            "responses": {
                "202": _json(_ref("EnqueueResponse"), "queued (or coalesced into a queued job)"),
                "400": _error("the body is not valid JSON"),
                "401": _UNAUTHORIZED,
                "403": _CROSS_ORIGIN,
                "413": _error("the body is too large"),
                "415": _error("the body is not application/json"),
                "422": _error("unknown kind, or a missing, unknown or mistyped param; error.field names it"),
            },
        },
        "get": {
            "operationId": "listJobs",
            "summary": "List jobs, newest first, one page at a time.",
            "parameters": [
                {"name": "status", "in": "query", "schema": {"enum": _STATUSES}},
                {
                    "name": "kind",
                    "in": "query",
                    # Any text: rows of a kind since removed from the kinds file can still be listed.
                    "schema": {"type": "string"},
                },
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT, "default": 100},
                },
                {
                    "name": "cursor",
                    "in": "query",
                    "schema": {"type": "string", "pattern": _anchored(CURSOR_PATTERN.pattern)},
                    "description": "next_cursor of the previous page; pages stay stable while jobs are added",
                },
            ],
            "responses": {"200": _json(_ref("JobList"), "one page"), "401": _UNAUTHORIZED, "422": _INVALID},
        },
    },
    "/api/jobs/batch": {
        "post": {
            "operationId": "enqueueBatch",
            "summary": "Enqueue up to 1,000 jobs at once: all validated first, all stored or none.",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("BatchRequest")}}},
            "responses": {
                "202": _json(_ref("BatchResponse"), "every job queued (or coalesced), in request order"),
                "400": _error("the body is not valid JSON"),
                "401": _UNAUTHORIZED,
                "403": _CROSS_ORIGIN,
                "413": _error("the body is larger than 1 MiB"),
                "415": _error("the body is not application/json"),
                "422": _error("an element is invalid; error.field names it (jobs[3].params.seconds); nothing stored"),
            },
        },
    },
    "/api/jobs/{job_id}": {
        "get": {
            "operationId": "showJob",
            "summary": "One job's row.",
            # /api/jobs/reconcile is the reconcile route for every method (a fixed path outranks a template): a GET
            # there is a 405, never a lookup of a job called "reconcile". Likewise batch.
            "parameters": [{**_JOB_ID, "schema": {**_JOB_ID["schema"], "not": {"enum": list(JOBS_SUBROUTES)}}}],
            "responses": {
                "200": _json(_ref("Job"), "the row"),
                "401": _UNAUTHORIZED,
                "404": _NOT_FOUND,
                "405": _error("job_id names a fixed route (reconcile, batch, prune), which takes only POST"),
            },
        }
    },
    "/api/jobs/{job_id}/cancel": {
        "post": {
            "operationId": "cancelJob",
            "summary": "Cancel a job (idempotent; a terminal job is returned unchanged).",
            "parameters": [_JOB_ID],
            "responses": {
                "200": _json(_ref("Job"), "the row after the cancel"),
                "401": _UNAUTHORIZED,
                "403": _CROSS_ORIGIN,
                "404": _NOT_FOUND,
            },
        }
    },
    "/api/jobs/{job_id}/retry": {
        "post": {
            "operationId": "retryJob",
            "summary": "Enqueue a finished job's kind and params again as a new job whose retry_of names it.",
            "parameters": [_JOB_ID],
            "responses": {
                "202": _json(_ref("EnqueueResponse"), "the new job (or the identical queued one)"),
                "401": _UNAUTHORIZED,
                "403": _CROSS_ORIGIN,
                "404": _NOT_FOUND,
                "409": _error(
                    "the job has not finished (error.message names its state), or its kind or params are no longer "
                    "what the kinds file declares (error.field names which)"
                ),
            },
        }
    },
    "/api/jobs/prune": {
        "post": {
            "operationId": "pruneJobs",
            "summary": "Remove finished jobs past the retention now (rows, logs, state records), oldest first.",
            "parameters": [
                {
                    "name": "dry_run",
                    "in": "query",
                    "schema": {"enum": ["true", "false"], "default": "false"},
                    "description": "true: only list what would go; nothing is removed",
                },
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT, "default": MAX_LIST_LIMIT},
                    "description": "at most this many jobs in one call (limit_reached: call again for more)",
                },
            ],
            "responses": {
                "200": _json(_ref("PruneReport"), "what went (or, in a dry run, would go)"),
                "401": _UNAUTHORIZED,
                "403": _CROSS_ORIGIN,
                "422": _INVALID,
            },
        }
    },
    "/api/jobs/reconcile": {
        "post": {
            "operationId": "reconcile",
            "summary": "Operator reconcile: may mark a live job past the wall-clock window stale.",
            "responses": {
                "200": _json(_ref("ReconcileReport"), "what was done to each running row"),
                "401": _UNAUTHORIZED,
                "403": _CROSS_ORIGIN,
            },
        }
    },
    "/api/hosts": {
        "get": {
            "operationId": "listHosts",
            "summary": "The fleet's hosts (live or silent) and its leader.",
            "responses": {"200": _json(_ref("Hosts"), "the hosts"), "401": _UNAUTHORIZED},
        }
    },
    "/api/hosts/{host_id}/forget": {
        "post": {
            "operationId": "forgetHost",
            "summary": "A host that will never come back: its running jobs end orphan_host_forgotten, slots freed.",
            "parameters": [{"name": "host_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {
                "200": _json(_ref("ForgetHostResult"), "what was ended"),
                "401": _UNAUTHORIZED,
                "403": _CROSS_ORIGIN,
                "404": _error("no host with that id"),
                "409": _error("the host holds a live lease, or is this supervisor"),
            },
        }
    },
    "/api/queue": {
        "get": {
            "operationId": "queueState",
            "summary": "The queue's state.",
            "responses": {"200": _json(_ref("QueueState"), "the queue"), "401": _UNAUTHORIZED},
        }
    },
    "/api/queue/pause": {
        "post": {
            "operationId": "pauseQueue",
            "summary": "Pause promotion (creates the pause flag file); running jobs continue.",
            "responses": {"200": _json(_ref("QueueState"), "the queue"), "401": _UNAUTHORIZED, "403": _CROSS_ORIGIN},
        }
    },
    "/api/queue/resume": {
        "post": {
            "operationId": "resumeQueue",
            "summary": "Resume promotion (removes the pause flag file) and drain.",
            "responses": {"200": _json(_ref("QueueState"), "the queue"), "401": _UNAUTHORIZED, "403": _CROSS_ORIGIN},
        }
    },
    "/api/jobs/{job_id}/log": {
        "get": {
            "operationId": "jobLog",
            "summary": "A job's log: whole, its last tail_bytes, or from byte offset on (to follow it).",
            "parameters": [
                _JOB_ID,
                {
                    "name": "window",
                    "in": "query",
                    # An exploded form object is sent as its properties, `?tail_bytes=N` or `?offset=N`: the one
                    # way OpenAPI has to say that two query parameters exclude each other (maxProperties).
                    "style": "form",
                    "explode": True,
                    "description": (
                        "which bytes: `tail_bytes=N`, the last N; or `offset=N`, from byte N on (the log is "
                        "append-only, so an offset stays valid while it grows). Not both; neither: the whole log."
                    ),
                    "schema": {
                        "type": "object",
                        "additionalProperties": False,
                        "maxProperties": 1,
                        "properties": {"tail_bytes": _BYTE_COUNT, "offset": _BYTE_COUNT},
                    },
                },
            ],
            "responses": {
                "200": {
                    "description": "the log bytes as the job wrote them",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                "401": _UNAUTHORIZED,
                "404": _NOT_FOUND,
                "422": _INVALID,
            },
        }
    },
    "/api/jobs/{job_id}/heartbeat": {
        "post": {
            "operationId": "heartbeat",
            "summary": "A running job's heartbeat, authenticated with that job's own token.",
            "security": _JOB_TOKEN,
            "parameters": [_JOB_ID],
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("Heartbeat")}}},
            "responses": {
                "204": {"description": "recorded"},
                "400": _error("the body is not valid JSON"),
                "401": _error("the token is not this job's, or no job has this id"),
                "403": _CROSS_ORIGIN,
                "409": _error("the job is not running"),
                "413": _error("the body is too large"),
                "415": _error("the body is not application/json"),
                "422": _INVALID,
            },
        }
    },
    "/api/events": {
        "get": {
            "operationId": "events",
            "summary": "A server-sent-events stream of job events (the webhook's payloads), resumable.",
            "description": (
                "text/event-stream. Each event: `id: <boot_id>-<n>` (numbered per boot), `event: <name>`, and one "
                "`data:` line of JSON, the webhook's body with `event_id` = the id. `: keep-alive` comments every "
                "PODCAST_JOB_EVENTS_KEEPALIVE_SECONDS while idle. Resume with the `Last-Event-ID` header: every later "
                f"event still held is sent once, in order; when some may be missing (pushed out of the replay ring, "
                f"or the id is another boot's) a `{GAP}` event without an id comes first, with "
                '`{"reason": "evicted" | "restarted", "last_event_id", "boot_id", "oldest_event_id"}`. A reader whose '
                "queue (PODCAST_JOB_EVENTS_CLIENT_BUFFER_EVENTS) fills up is disconnected."
            ),
            "parameters": [
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
            ],
            "responses": {
                "200": {
                    "description": "the stream (it ends at the server's shutdown, or with follow=false)",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                "401": _UNAUTHORIZED,
                "422": _error(
                    "an unknown kind or query parameter, a bad boolean, or a Last-Event-ID that is not an id of this "
                    "stream or is later than its last event; error.field names it"
                ),
                "503": _error("every event-stream slot is taken (PODCAST_JOB_EVENTS_MAX_CLIENTS): try again later"),
            },
        }
    },
    "/api/openapi.json": {
        "get": {
            "operationId": "openapi",
            "summary": "This document.",
            "responses": {
                "200": {"description": "OpenAPI 3.1", "content": {"application/json": {}}},
                "401": _UNAUTHORIZED,
            },
        }
    },
    "/metrics": {
        "get": {
            "operationId": "metrics",
            "summary": "Prometheus metrics.",
            "security": _PUBLIC,
            "responses": {
                "200": {
                    "description": "Prometheus text format 0.0.4",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                }
            },
        }
    },
}

# Every route that reads or writes the registry: a registry that cannot take the request (its disk full, its file
# locked past the busy timeout, read-only or removed) is a 503 with Retry-After, never a 500 and never a lost write.
_UNAVAILABLE = {
    **_error("the registry cannot take the request now; nothing was changed: retry after Retry-After seconds"),
    "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds to wait before a retry"}},
}
for _path, _operations in _PATHS.items():
    if _path.startswith(("/api/jobs", "/api/queue")):
        for _operation in _operations.values():
            _operation["responses"].setdefault("503", _UNAVAILABLE)

_DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "Job supervisor control API",
        "version": API_VERSION,
        "description": (
            "Enqueue, inspect and cancel supervised pipeline jobs. Timestamps are ISO-8601 UTC. Errors are "
            '{"error": {"code", "message", "field", "request_id"}}. Every answer carries X-Request-Id. '
            "A POST carrying an Origin header (sent by a browser for a web page) is refused with 403 cross_origin."
        ),
    },
    # With PODCAST_JOB_API_TOKEN set, every operation without its own `security` needs the API token.
    "security": [{"apiToken": []}],
    "paths": _PATHS,
    "components": {
        "schemas": _SCHEMAS,
        "securitySchemes": {
            "apiToken": {"type": "http", "scheme": "bearer", "description": "PODCAST_JOB_API_TOKEN (when set)"},
            "jobToken": {"type": "http", "scheme": "bearer", "description": "the job's own PODCAST_JOB_TOKEN"},
        },
    },
}


def _param_schema(type_name: str) -> dict[str, Any]:
    """What ``JobKind.validate_params`` accepts for one param of ``type_name``: a JSON value, or a string in the
    exact spelling the server converts (the CLI sends every ``-p key=value`` as a string)."""
    if type_name == "str":
        return {
            "type": "string",
            "maxLength": MAX_STR_PARAM_LEN,
            "pattern": _STR_PARAM,
            "description": "valid Unicode text (no lone surrogate), without NUL, not starting with '-'",
        }
    typed, spelled = {
        "int": ({"type": "integer"}, _anchored(_ASCII_INT.pattern)),
        "float": ({"type": "number", "minimum": -MAX_FLOAT, "maximum": MAX_FLOAT}, _anchored(_ASCII_FLOAT.pattern)),
        "bool": ({"type": "boolean"}, _BOOL_TEXT),
    }[type_name]
    return {"oneOf": [typed, {"type": "string", "pattern": spelled}]}


def _enqueue_schema(kind: JobKind) -> dict[str, Any]:
    """The body that enqueues ``kind``: its name and exactly its declared params; those with a default optional."""
    properties: dict[str, Any] = {}
    for name, type_name in sorted(kind.params.items()):
        properties[name] = _param_schema(type_name)
        if name in kind.param_defaults:
            properties[name]["default"] = kind.param_defaults[name]
    required = sorted(set(kind.params) - set(kind.param_defaults))
    params = {"type": "object", "additionalProperties": False, "required": required, "properties": properties}
    if not required:
        # A kind that requires no param may omit params, or send null or {}.
        params["type"] = ["object", "null"]
    return {
        "title": kind.name,
        "type": "object",
        "additionalProperties": False,
        "required": ["kind", "params"] if required else ["kind"],
        "properties": {"kind": {"const": kind.name}, "params": params},
    }


def openapi_document(kinds: KindCatalog) -> dict[str, Any]:
    """A fresh document for a server running ``kinds`` (callers may change theirs).

    The enqueue body is one schema per kind: a kind the operator did not declare, or a param it does not take,
    is invalid in the document exactly as the server refuses it (422).
    """
    document = copy.deepcopy(_DOCUMENT)
    document["components"]["schemas"]["EnqueueRequest"] = {
        "description": "a kind declared by the operator (or built in), with that kind's params",
        "oneOf": [_enqueue_schema(kinds.get(name)) for name in kinds.names()],
    }
    return document
