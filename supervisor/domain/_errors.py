"""The supervisor's one error tree, named by whose fault an error is.

    SupervisorError                 root; never raised itself
    ├── ConfigError                 the operator's settings are invalid and cannot fall back
    ├── KindsFileError              the operator's job-kinds file is invalid
    ├── RequestError                the caller asked for something invalid (maps to HTTP 4xx)
    │   ├── MalformedRequest        the body is not the JSON the route takes (400)
    │   ├── InvalidHeader           a request header is missing its form, or given twice (400; names the header)
    │   ├── Forbidden               a cross-origin (browser) request to change state (403)
    │   │   └── InsufficientScope   a valid API token whose scope is too small for the route (403; names the scope)
    │   ├── UnsupportedMediaType    a body that is not application/json (415)
    │   ├── BodyTooLarge            a body over the route's limit (413)
    │   ├── ValidationError         a field is missing, unknown or mistyped (422; names the field)
    │   │   └── IdempotencyKeyReused  an idempotency key sent again with another request (422)
    │   ├── JobNotFound             no job has that id (404)
    │   ├── HostNotFound            no host of the fleet has that id (404)
    │   ├── SelectionNotFound       no live bulk selection has that token (404; expired, or never made)
    │   ├── Unauthorized            missing or wrong credentials (401)
    │   ├── Conflict                the job's state does not allow it (409)
    │   └── TooManyStreams          every event-stream slot is taken (503; not the caller's fault: retry later)
    ├── IllegalTransition           a state change the lifecycle forbids: a bug in the caller, not bad input
    ├── RegistryError               the registry could not be read or written (storage, lock timeout)
    │   ├── RegistryUnavailable     a write cannot be made now (a full disk, a lock held too long): retried, 503
    │   │   └── RegistryLocked      another process held the file's lock past the busy timeout (a backup, a shell)
    │   ├── RegistryDamaged         the file is not a registry (damaged): never opened for writing, never changed
    │   └── RegistryNotOpened       the registry could not be opened at start (damaged, newer, unreachable, ...)
    │       └── SchemaNotHonoured   a newer release contracted the schema: this release cannot run on it (exit 5)
    ├── SpawnError                  a job's process could not be started
    │   └── ShepherdLost            (execution/subprocess.py) this boot's shepherd went away before a job's exit
    ├── ExecutorUnavailable         no job can be started now (the engine does not answer); nothing of it runs
    ├── StartOutcomeUnknown         a start was asked and not answered in time: the job may run or never will
    ├── HostForgotten               an operator forgot this boot of the host: its lease is never renewed again
    ├── Unwatchable                 (execution/_base.py) a job that can no longer be watched: its row keeps its slot
    ├── ScenarioError               (supervisor.testing) a scenario used out of order, or not in virtual time
    │   └── ScenarioTimeout         (supervisor.testing) what a scenario waited for did not come within its bound
    ├── ApiError                    (CLI client, _client.py) the server answered with an error
    └── Unreachable                 (CLI client, _client.py) no usable answer from the server
        └── NotTheApi               (CLI client) an answer came, but not this API's (another shape, an HTML page)

Errors carry their message built in ``__init__`` so that every raise site reads the same way.
"""

from __future__ import annotations


class SupervisorError(Exception):
    """Root of every error the supervisor raises on purpose."""


class ConfigError(SupervisorError):
    """One or more settings are invalid and have no safe fallback.

    ``problems`` lists every invalid setting, so an operator fixes them all in one go.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid configuration: " + "; ".join(self.problems))


class KindsFileError(SupervisorError):
    """The job-kinds file cannot be used; the message names the kind and the key."""


class RequestError(SupervisorError):
    """The caller's request is invalid. ``code`` is a stable machine-readable name."""

    code = "bad_request"
    http_status = 400
    retry_after_s: int | None = None  # a busy server's answer: when to ask again (Retry-After)

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class MalformedRequest(RequestError):
    """The body is not the JSON the route takes."""

    code = "malformed_json"


class InvalidHeader(RequestError):
    """A request header is not of the form its route takes, or is given more than once; ``field`` names it."""

    code = "invalid_header"


class Forbidden(RequestError):
    """A state-changing request sent by a browser on behalf of some web page."""

    code = "cross_origin"
    http_status = 403


class InsufficientScope(Forbidden):
    """A valid API token whose scope does not cover the route: the message names the scope needed (``needed``)."""

    code = "insufficient_scope"

    def __init__(self, name: str, have: str, needed: str) -> None:
        super().__init__(f"this request needs a token of scope {needed!r}; token {name!r} has scope {have!r}")
        self.needed = needed


class UnsupportedMediaType(RequestError):
    """A body that is not ``application/json``."""

    code = "unsupported_media_type"
    http_status = 415


class BodyTooLarge(RequestError):
    """A body larger than the route takes."""

    code = "body_too_large"
    http_status = 413


class ValidationError(RequestError):
    """A field is missing, unknown or mistyped; ``field`` names it."""

    code = "validation_error"
    http_status = 422


class IdempotencyKeyReused(ValidationError):
    """An idempotency key already names another request (another route, kind or params): nothing was written. A
    client reuses a key only to retry the very request it named."""

    code = "idempotency_key_reused"

    def __init__(self, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was sent with another request; a key may only retry the request it first named",
            field="Idempotency-Key",
        )


class JobNotFound(RequestError):
    """No job has the given id (or, with ``attempt``, the job never had that attempt)."""

    code = "not_found"
    http_status = 404

    def __init__(self, job_id: str, *, attempt: int | None = None, attempts: int = 0) -> None:
        self.job_id = job_id
        if attempt is None:
            super().__init__(f"no job with id {job_id!r}", field="job_id")
        else:
            super().__init__(f"job {job_id!r} has had {attempts} attempt(s), not {attempt}", field="attempt")


class Unauthorized(RequestError):
    """Credentials are missing or wrong."""

    code = "unauthorized"
    http_status = 401


class SelectionNotFound(RequestError):
    """No live bulk selection has the given token: it expired (an hour), or no dry run made it."""

    code = "not_found"
    http_status = 404

    def __init__(self, token: str) -> None:
        super().__init__(
            f"no bulk selection {token!r}: it expired or was never made (make a new dry run)", field="selection"
        )


class HostNotFound(RequestError):
    """No host of the fleet has the given id."""

    code = "not_found"
    http_status = 404

    def __init__(self, host_id: str) -> None:
        self.host_id = host_id
        super().__init__(f"no host with id {host_id!r}", field="host_id")


class Conflict(RequestError):
    """The request is well-formed but the current state (of a job, a host, the pause flag) does not allow it."""

    code = "conflict"
    http_status = 409


class TooManyStreams(RequestError):
    """Every event-stream slot is taken (``PODCAST_JOB_EVENTS_MAX_CLIENTS``): try again later."""

    code = "too_many_streams"
    http_status = 503
    retry_after_s = 2  # a slot frees as soon as a reader leaves: ask again soon


class IllegalTransition(SupervisorError):
    """A job state change the lifecycle does not allow (for example ``succeeded -> running``)."""

    def __init__(self, job_id: str, from_status: str, to_status: str) -> None:
        self.job_id = job_id
        self.from_status = from_status
        self.to_status = to_status
        super().__init__(f"job {job_id}: illegal transition {from_status} -> {to_status}")


class RegistryError(SupervisorError):
    """The registry could not complete an operation (storage error or lock timeout)."""


class RegistryUnavailable(RegistryError):
    """The registry cannot take writes now -- its disk is full, its file read-only, locked by another process past
    the busy timeout, or removed -- and made none: the same write may succeed later. A caller retries (the core) or
    answers 503 (the API); it never drops what it was recording."""


class RegistryLocked(RegistryUnavailable):
    """Another process held the registry's lock past the busy timeout (a backup, an operator's ``sqlite3`` shell): a
    temporary condition, nobody's configuration; the same call may succeed once it lets go."""


class RegistryDamaged(RegistryError):
    """The registry's file is not a database its backend can read (damaged, truncated, not one at all). It is neither
    opened for writing nor modified: the supervisor refuses to start on it."""


class RegistryNotOpened(RegistryError):
    """The registry could not be opened at start: its file damaged or its schema newer than this code, its data dir
    not a directory (or not one this user can make), its database unreachable or refusing these credentials. The
    operator's to fix; the message says what and where, and nothing was changed. ``temporary``: the registry was
    only locked by another process (``RegistryLocked``), no configuration is at fault: starting again later may
    succeed (``supervisor serve`` exits 75, not 3)."""

    def __init__(self, message: str, *, temporary: bool = False) -> None:
        super().__init__(message)
        self.temporary = temporary


class SchemaNotHonoured(RegistryNotOpened):
    """A newer release's contract migration was applied to the registry (docs/fleet.md § Upgrading a fleet): this
    release cannot run on the schema. ``serve`` says it in one line and exits 5, changing nothing."""


class SpawnError(SupervisorError):
    """A job's process could not be started; the message is the reason recorded on the row."""


class ExecutorUnavailable(SupervisorError):
    """The executor's engine could not make a start now (refused, timed out, answered a server error), and nothing of
    the job runs: the job is not at fault, and goes back to the head of the queue, the start not counted."""


class StartOutcomeUnknown(SupervisorError):
    """A start was asked of the executor and not answered within its bound (a shepherd that is stopped or swapped
    out, an engine whose start timed out and whose container could not be removed): the job may yet run, or never
    will. Never recorded as a failure: the row keeps its slot, running with its liveness unknown, until the executor's
    evidence says which (a start record or a container: adopted; provably none: back to the queue)."""


class HostForgotten(SupervisorError):
    """An operator forgot this boot of host ``host_id`` (its lease had expired): the registry refuses its lease from
    now on (INV-FORGET-IS-FENCED). Its rows were ended, perhaps resubmitted: none of them is its own any more. A new
    boot with the same host id may register."""

    def __init__(self, host_id: str, boot_id: str) -> None:
        self.host_id = host_id
        self.boot_id = boot_id
        super().__init__(
            f"host {host_id} (boot {boot_id}) was forgotten by an operator: its lease cannot be renewed; restart "
            "the supervisor to register a new boot"
        )
