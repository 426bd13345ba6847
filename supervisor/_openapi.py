"""The OpenAPI 3.1 document of the control API (served at ``/api/openapi.json``).

Written by hand, as data, rather than generated from the app: the tests walk the app's route map and compare it
with ``paths`` here, and compare the ``Job`` schema with ``Job.public()``, so the two cannot drift apart silently.
"""

from __future__ import annotations

import copy
from typing import Any

from ._core import MAX_BATCH
from ._kinds import MAX_STR_PARAM_LEN
from ._model import JobStatus
from ._registry import MAX_LIST_LIMIT

API_VERSION = "1"

_STATUSES = [s.value for s in JobStatus]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


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
        "required": ["status", "boot_id", "exec_mode", "paused"],
        "properties": {
            "status": {"const": "ok"},
            "boot_id": {"type": "string"},
            "exec_mode": {"enum": ["subprocess", "docker"]},
            "paused": {"type": "boolean"},
        },
    },
    "EnqueueRequest": {
        "type": "object",
        "required": ["kind"],
        "additionalProperties": False,
        "properties": {
            "kind": {"type": "string", "description": "a kind declared by the operator"},
            "params": {
                "type": "object",
                "description": "the kind's declared params; strings are converted to a declared int/float/bool",
                "additionalProperties": {
                    "oneOf": [
                        {"type": "string", "maxLength": MAX_STR_PARAM_LEN},
                        {"type": "integer"},
                        {"type": "number"},
                        {"type": "boolean"},
                    ]
                },
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
            "attempts": {"type": "integer"},
            "cancel_requested": {"type": "boolean"},
            "boot_id": _NULLABLE_STR,
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
    "JobList": {
        "type": "object",
        "required": ["jobs", "next_cursor"],
        "properties": {
            "jobs": {"type": "array", "items": _ref("Job")},
            "next_cursor": {**_NULLABLE_STR, "description": "pass as ?cursor= for the next page; null at the end"},
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
                        "action": {"type": "string", "description": "failed | stale (finalized now), keep, untouched"},
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
                "description": "a watermark: last_progress_at moves only when it increases",
            },
            "total_units": {"type": ["integer", "null"], "minimum": 0},
            "stage": {"type": ["string", "null"], "maxLength": 200},
        },
    },
}

_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
_PUBLIC: list[dict[str, list[str]]] = []  # no API token
_JOB_TOKEN: list[dict[str, list[str]]] = [{"jobToken": []}]

_UNAUTHORIZED = _error("missing or wrong API token")
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
                {"name": "kind", "in": "query", "schema": {"type": "string"}},
                {
                    "name": "limit",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT, "default": 100},
                },
                {
                    "name": "cursor",
                    "in": "query",
                    "schema": {"type": "string"},
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
            "parameters": [_JOB_ID],
            "responses": {"200": _json(_ref("Job"), "the row"), "401": _UNAUTHORIZED, "404": _NOT_FOUND},
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
                "404": _NOT_FOUND,
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
            "responses": {"200": _json(_ref("QueueState"), "the queue"), "401": _UNAUTHORIZED},
        }
    },
    "/api/queue/resume": {
        "post": {
            "operationId": "resumeQueue",
            "summary": "Resume promotion (removes the pause flag file) and drain.",
            "responses": {"200": _json(_ref("QueueState"), "the queue"), "401": _UNAUTHORIZED},
        }
    },
    "/api/jobs/{job_id}/log": {
        "get": {
            "operationId": "jobLog",
            "summary": "A job's log: whole, its last tail_bytes, or from byte offset on (to follow it).",
            "parameters": [
                _JOB_ID,
                {"name": "tail_bytes", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                {
                    "name": "offset",
                    "in": "query",
                    "schema": {"type": "integer", "minimum": 0},
                    "description": "bytes already read; the log is append-only. Not with tail_bytes.",
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
                "409": _error("the job is not running"),
                "413": _error("the body is too large"),
                "415": _error("the body is not application/json"),
                "422": _INVALID,
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


def openapi_document() -> dict[str, Any]:
    """A fresh copy of the document (callers may change theirs)."""
    return copy.deepcopy(_DOCUMENT)
