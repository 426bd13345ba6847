"""The job supervisor: one Trio nursery tree owning the control API, the sweeper and one monitor per job.

What an embedder needs, from one place:

- ``run_supervisor(config, kinds)``: the whole server, the root of the nursery tree (``supervisor serve``);
- ``Supervisor``: the core over a ``Registry`` and an ``Executor``, for a nursery of your own;
- ``create_app(supervisor)``: the HTTP control API (a quart-trio app) over a ``Supervisor``;
- ``Config`` / ``load_config``, ``KindCatalog`` / ``load_kinds``: validated settings and job kinds;
- ``Job``, ``JobStatus`` and the error tree (``SupervisorError`` and below).

The parts, one package each, mirror the nursery tree: ``domain`` (the vocabulary), ``registry`` (the single source
of truth), ``execution`` (how jobs run), ``core`` (the rules and their tasks), ``observe`` (events, webhook,
metrics, logs, systemd), ``api`` (HTTP), ``cli`` (the terminal). Every name is imported on first use (``_HOME``).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # not typing's: `import typing` alone is a tenth of the time to reach _entry's hold()
if TYPE_CHECKING:
    from typing import Any

    from ._root import run_supervisor
    from .api import create_app
    from .core import Supervisor
    from .domain import (
        BodyTooLarge,
        Config,
        ConfigError,
        Conflict,
        ExecutorUnavailable,
        ExitStatus,
        Forbidden,
        HostForgotten,
        HostNotFound,
        IdentityRecord,
        IllegalTransition,
        Job,
        JobKind,
        JobNotFound,
        JobStatus,
        KindCatalog,
        KindsFileError,
        Liveness,
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

# Where each public name lives. Imported on first use: ``import supervisor`` loads nothing, so that the command
# line's entry (``_entry``) holds the process's signals before the heavy imports, and a CLI client never loads the
# HTTP server.
_HOME = {
    ".core": ("Supervisor",),
    ".domain": (
        "BodyTooLarge", "Config", "ConfigError", "Conflict", "ExecutorUnavailable", "Forbidden", "HostForgotten",
        "HostNotFound", "IllegalTransition", "Job", "JobKind", "JobNotFound", "JobStatus", "KindCatalog",
        "KindsFileError", "MalformedRequest", "RegistryDamaged", "RegistryError", "RegistryNotOpened",
        "RegistryUnavailable", "RequestError", "SpawnError", "StartOutcomeUnknown", "SupervisorError", "Unauthorized",
        "UnsupportedMediaType", "ValidationError", "load_config", "load_kinds",
    ),
    ".domain._model": ("ExitStatus", "IdentityRecord", "Liveness"),
    ".execution": ("Executor",),
    ".registry": (
        "MemoryRegistry", "PostgresRegistry", "Registry", "SqliteRegistry", "migrate_registry", "open_registry",
        "registry_runtime",
    ),
    "._root": ("run_supervisor",),
    ".api._app": ("create_app",),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}

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
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once found, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
