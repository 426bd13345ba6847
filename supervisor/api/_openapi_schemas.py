"""The fixed schemas of the OpenAPI document (``components.schemas``): every answer's and body's but the enqueue body,
which ``_openapi`` builds per kind. Written as data; the value rules are taken from the code that enforces them (the
cursor pattern, the progress limits, the statuses), and the tests compare the ``Job`` schema with ``Job.public()``."""

from __future__ import annotations

from typing import Any

from ..core import HOLD_REASONS
from ..domain import CURSOR_PATTERN, EXEC_MODES, KEY_SCHEMA, MAX_BATCH, MAX_STAGE_LEN, MAX_UNITS, JobStatus
from ._route_table import anchored, ref

_STATUSES = [s.value for s in JobStatus]

_TS = {"type": ["string", "null"], "format": "date-time", "description": "ISO-8601, UTC"}
_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_STR = {"type": ["string", "null"]}

SCHEMAS: dict[str, Any] = {
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
                "so no job is started and running ones keep their slots; `queue`: the queue is stuck, since when and "
                "why) and why",
            },
        },
    },
    "Host": {
        "type": "object",
        "required": [
            "host_id", "boot_id", "started_at", "last_seen_at", "lease_expires_at", "live", "leader", "release",
            "contract_level", "running_jobs", "drain",
        ],
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
            "release": {**_NULLABLE_STR, "description": "the release its boot runs (null: one before 1.0.0)"},
            "contract_level": {
                "type": ["integer", "null"],
                "description": "how many contract migrations its release knows (docs/fleet.md § Upgrading a fleet)",
            },
            "running_jobs": {"type": "integer", "description": "its running rows, fleet-wide count's share"},
            "drain": {
                "type": ["string", "null"],
                "enum": [None, "draining", "drained"],
                "description": "null: not drained; draining: drained, still running jobs or leading; drained: it "
                "holds nothing (it may be stopped)",
            },
        },
    },
    "DrainHostResult": {
        "type": "object",
        "required": ["host_id", "changed", "drain"],
        "properties": {
            "host_id": {"type": "string"},
            "changed": {"type": "boolean", "description": "false: it already was (or was not) drained"},
            "drain": {"type": ["string", "null"], "enum": [None, "draining", "drained"]},
        },
    },
    "Hosts": {
        "type": "object",
        "required": ["hosts", "leader"],
        "properties": {
            "hosts": {"type": "array", "items": ref("Host")},
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
            "jobs": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH, "items": ref("EnqueueRequest")},
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
            "skipped": {"type": "boolean", "description": "an if_idle tick skipped: job_id is the schedule's job"},
            "schedule": {"type": "string"},
        },
    },
    # Each object a schema of its own, named once, and each union a oneOf of references: a client generator makes one
    # typed model of each (an inline object inside a union it names twice, or drops).
    "BulkRequest": {
        "description": "a dry run of a filter (nothing is acted on), or the action on a dry run's selection",
        "oneOf": [ref("BulkDryRun"), ref("BulkAct")],
    },
    "BulkDryRun": {
        "type": "object",
        "required": ["action", "filter", "dry_run"],
        "additionalProperties": False,
        "properties": {
            "action": {"enum": ["cancel", "retry"]},
            "filter": ref("BulkFilter"),
            "dry_run": {"const": True},
        },
    },
    "BulkFilter": {
        "type": "object",
        "additionalProperties": False,
        "description": "the list's filters by their query names; param.NAME (a declared param's value) is taken too",
        "properties": {
            "status": {"enum": _STATUSES},
            "kind": {"type": "string"},
            "reason": {"type": "string"},
            "host": {"type": "string"},
            "since": {"type": "string", "format": "date-time"},
            "until": {"type": "string", "format": "date-time"},
            "ended_since": {"type": "string", "format": "date-time"},
            "idempotency_key": KEY_SCHEMA,
        },
    },
    "BulkAct": {
        "type": "object",
        "required": ["action", "selection"],
        "additionalProperties": False,
        "properties": {
            "action": {"enum": ["cancel", "retry"]},
            "selection": {
                "type": "string",
                "pattern": "^[A-Za-z0-9_-]{16,64}$",
                "description": "a dry run's selection: act on exactly its jobs, each once",
            },
        },
    },
    "BulkAnswer": {
        "type": "object",
        "required": ["action", "selection", "count", "expires_at", "dry_run"],
        "properties": {
            "action": {"enum": ["cancel", "retry"]},
            "selection": {"type": "string"},
            "count": {"type": "integer"},
            "expires_at": {"type": "string", "format": "date-time"},
            "dry_run": {"type": "boolean"},
            "job_ids": {"type": "array", "items": {"type": "string"}, "description": "a dry run's selection"},
            "results": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "each job's outcome: cancelled, cancel_requested, already_ended, retried, refused: why",
            },
            "new_job_ids": {"type": "object", "additionalProperties": {"type": "string"}},
            "outcomes": {"type": "object", "additionalProperties": {"type": "integer"}},
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
                "items": ref("Attempt"),
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
            "idempotency_key": {
                **_NULLABLE_STR,
                "description": "the Idempotency-Key of the enqueue that made this row (a kind's then follow-up: "
                "then/<parent job id>); null when it was made without one",
            },
            "enqueued_by": {
                **_NULLABLE_STR,
                "description": "who enqueued it: the API token's name (operator: the operator token; anonymous: a "
                "server without tokens; supervisor: a kind's then follow-up); null on rows older than the record",
            },
            "cancelled_by": {
                **_NULLABLE_STR,
                "description": "the name of the API token whose request cancelled it (the first); null when none did",
            },
            "schedule": {**_NULLABLE_STR, "description": "the schedule whose tick enqueued it; null for any other job"},
            "stop_reason": {
                **_NULLABLE_STR,
                "description": "why the supervisor itself began to stop this attempt (deadline: its kind's "
                "deadline_seconds passed; stall: stall_action = terminate), recorded before the signal; its end is "
                "that stop's, whichever boot records it. null when it began none",
            },
            "schedule_every_s": {
                "type": ["number", "null"],
                "description": "that schedule's period in seconds; null for any other job",
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
            "jobs": {"type": "array", "items": ref("Job")},
            "next_cursor": {
                "type": ["string", "null"],
                "pattern": anchored(CURSOR_PATTERN.pattern),
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
                    "required": ["job_id", "action", "reason", "liveness", "prior_boot", "still_running"],
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
                        "still_running": {
                            "type": "boolean",
                            "description": "marked stale while its process was verified alive: the slot is free, the "
                            "process runs on (stop it before any retry of the job)",
                        },
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
            "oldest_queued_age_s": {
                "type": ["number", "null"],
                "description": "how long the oldest job ready to run has waited, as of the last sweep (0: none waits; "
                "null before the first sweep)",
            },
            "last_promotion_at": {**_TS, "description": "this host's last promotion (its boot's start before any)"},
            "held": {
                "type": "object",
                "additionalProperties": {"type": "string", "format": "date-time"},
                "description": "each reason this host's promotion is held now, and since when: "
                + ", ".join(HOLD_REASONS),
            },
            "stuck": {
                "type": ["object", "null"],
                "required": ["reason", "since"],
                "properties": {"reason": {"type": "string"}, "since": {"type": "string", "format": "date-time"}},
                "description": "the queue stuck (PODCAST_JOB_QUEUE_STUCK_SECONDS; behind a pause, "
                "PODCAST_JOB_PAUSE_WARN_SECONDS) and why; null: it moves, is busy, or nothing waits",
            },
            "kinds": {
                "type": "object",
                "additionalProperties": {
                    "type": "object",
                    "required": ["running", "queued", "max_running"],
                    "properties": {
                        "running": {"type": "integer"},
                        "queued": {"type": "integer"},
                        "max_running": {"type": ["integer", "null"]},
                    },
                },
                "description": "each kind with jobs running or queued fleet-wide, or with a max_running of its own: "
                "its jobs, and its limit (null: none but max_concurrent)",
            },
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
