"""The job supervisor: one Trio nursery tree owning the control API, the sweeper and one monitor per job.

What an embedder needs, from one place:

- ``run_supervisor(config, kinds)``: the whole server, the root of the nursery tree (``supervisor serve``);
- ``Supervisor``: the core over a ``Registry`` and an ``Executor``, for a nursery of your own;
- ``create_app(supervisor)``: the HTTP control API (a quart-trio app) over a ``Supervisor``;
- ``Config`` / ``load_config``, ``KindCatalog`` / ``load_kinds``: validated settings and job kinds;
- ``Job``, ``JobStatus`` and the error tree (``SupervisorError`` and below).

The parts, one package each, mirror the nursery tree: ``domain`` (the vocabulary), ``registry`` (the single source
of truth), ``execution`` (how jobs run), ``core`` (the rules and their tasks), ``observe`` (events, webhook,
metrics, logs, systemd), ``api`` (HTTP), ``cli`` (the terminal). ``run_supervisor`` and ``create_app`` are imported
on first use: a CLI client never loads the HTTP server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core import Supervisor
from .domain import (
    BodyTooLarge,
    Config,
    ConfigError,
    Conflict,
    ExecutorUnavailable,
    Forbidden,
    HostForgotten,
    HostNotFound,
    IllegalTransition,
    Job,
    JobKind,
    JobNotFound,
    JobStatus,
    KindCatalog,
    KindsFileError,
    MalformedRequest,
    RegistryDamaged,
    RegistryError,
    RegistryNotOpened,
    RegistryUnavailable,
    RequestError,
    SpawnError,
    StartOutcomeUnknown,
    SupervisorError,
    Unauthorized,
    UnsupportedMediaType,
    ValidationError,
    load_config,
    load_kinds,
)
from .domain._model import ExitStatus, IdentityRecord, Liveness
from .execution import Executor
from .registry import (
    MemoryRegistry,
    PostgresRegistry,
    Registry,
    SqliteRegistry,
    migrate_registry,
    open_registry,
    registry_runtime,
)

if TYPE_CHECKING:
    from ._root import run_supervisor
    from .api._app import create_app

__all__ = [
    "BodyTooLarge",
    "Config",
    "ConfigError",
    "Conflict",
    "Executor",
    "ExecutorUnavailable",
    "ExitStatus",
    "Forbidden",
    "HostForgotten",
    "HostNotFound",
    "IdentityRecord",
    "IllegalTransition",
    "Job",
    "JobKind",
    "JobNotFound",
    "JobStatus",
    "KindCatalog",
    "KindsFileError",
    "Liveness",
    "MalformedRequest",
    "MemoryRegistry",
    "PostgresRegistry",
    "Registry",
    "RegistryDamaged",
    "RegistryError",
    "RegistryNotOpened",
    "RegistryUnavailable",
    "RequestError",
    "SpawnError",
    "SqliteRegistry",
    "StartOutcomeUnknown",
    "Supervisor",
    "SupervisorError",
    "Unauthorized",
    "UnsupportedMediaType",
    "ValidationError",
    "create_app",
    "load_config",
    "load_kinds",
    "migrate_registry",
    "open_registry",
    "registry_runtime",
    "run_supervisor",
]


def __getattr__(name: str) -> Any:
    if name == "run_supervisor":
        from ._root import run_supervisor

        return run_supervisor
    if name == "create_app":
        from .api._app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
