"""Scenarios against the real supervisor in virtual time: for the people who write job kinds, alert rules and
runbooks, and for this project's own tests (``docs/testing.md``).

A scenario runs the production core (``Supervisor.start``: the same ``Supervisor``, drainer, monitors, sweeper, absence
judge, queue watch, heartbeat writer and webhook outbox) on the in-memory registry and a scripted executor, under
``trio.testing.MockClock``: hours of it take well under a second. Its kinds are read from a kinds file by the loader
``supervisor serve`` uses; the operator's verbs are the calls the API makes. With ``supervisor`` and ``pytest-trio``
installed, pytest gives every test the ``supervisor_scenario`` fixture (this package's pytest plugin); elsewhere,
``open_scenario(data_dir)`` makes one in any Trio code running on a ``MockClock``.

The errors a scenario may catch are re-exported here: what the API answers with (``RequestError`` and its kinds,
``JobNotFound``, ``Conflict``, ``ValidationError``, ``SelectionNotFound``), a refused kinds file or config
(``KindsFileError``, ``ConfigError``), a registry that does not answer (``RegistryError``, ``RegistryUnavailable``),
and the kit's own (``ScenarioError``, ``ScenarioTimeout``); all are ``SupervisorError``.
"""

from ..core import BulkAnswer, ReconcileReport
from ..domain import (
    ConfigError,
    Conflict,
    Job,
    JobNotFound,
    KindsFileError,
    RegistryError,
    RegistryUnavailable,
    RequestError,
    SelectionNotFound,
    SupervisorError,
    ValidationError,
)
from ._executor import BeatSink, Script, ScriptedExecutor
from ._record import Transition
from ._scenario import SCENARIO_EPOCH, WEBHOOK_URL, Scenario, ScenarioError, ScenarioTimeout, open_scenario

__all__ = [
    "SCENARIO_EPOCH",
    "WEBHOOK_URL",
    "BeatSink",
    "BulkAnswer",
    "ConfigError",
    "Conflict",
    "Job",
    "JobNotFound",
    "KindsFileError",
    "ReconcileReport",
    "RegistryError",
    "RegistryUnavailable",
    "RequestError",
    "Scenario",
    "ScenarioError",
    "ScenarioTimeout",
    "Script",
    "ScriptedExecutor",
    "SelectionNotFound",
    "SupervisorError",
    "Transition",
    "ValidationError",
    "open_scenario",
]
