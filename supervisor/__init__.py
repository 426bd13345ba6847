"""The job supervisor: one Trio nursery tree owning the control API, the sweeper and one monitor per job."""

from ._registry import SqliteRegistry
from .domain._config import Config, load_config
from .domain._errors import (
    BodyTooLarge,
    ConfigError,
    Conflict,
    Forbidden,
    IllegalTransition,
    JobNotFound,
    KindsFileError,
    MalformedRequest,
    RegistryError,
    RequestError,
    SpawnError,
    SupervisorError,
    Unauthorized,
    UnsupportedMediaType,
    ValidationError,
)
from .domain._kinds import JobKind, KindCatalog, load_kinds
from .domain._model import Job, JobStatus
from .execution._identity import Liveness, ProcessIdentity

__all__ = [
    "BodyTooLarge",
    "Config",
    "ConfigError",
    "Conflict",
    "Forbidden",
    "IllegalTransition",
    "Job",
    "JobKind",
    "JobNotFound",
    "JobStatus",
    "KindCatalog",
    "KindsFileError",
    "Liveness",
    "MalformedRequest",
    "ProcessIdentity",
    "RegistryError",
    "RequestError",
    "SpawnError",
    "SqliteRegistry",
    "SupervisorError",
    "Unauthorized",
    "UnsupportedMediaType",
    "ValidationError",
    "load_config",
    "load_kinds",
]
