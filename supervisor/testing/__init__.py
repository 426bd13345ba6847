"""Scenarios against the real supervisor in virtual time: for the people who write job kinds, alert rules and
runbooks, and for this project's own tests (``docs/testing.md``).

A scenario runs the production core (``core.start_tree``: the same ``Supervisor``, drainer, monitors, sweeper, absence
judge, queue watch, heartbeat writer and webhook outbox) on the in-memory registry and a scripted executor, under
``trio.testing.MockClock``: hours of it take well under a second. With ``supervisor`` and ``pytest-trio`` installed,
pytest gives every test the ``supervisor_scenario`` fixture (this package's pytest plugin); elsewhere,
``open_scenario(data_dir)`` makes one in any Trio code running on a ``MockClock``.
"""

from ._executor import BeatSink, Script, ScriptedExecutor
from ._scenario import SCENARIO_EPOCH, WEBHOOK_URL, Scenario, ScenarioError, open_scenario

__all__ = [
    "SCENARIO_EPOCH",
    "WEBHOOK_URL",
    "BeatSink",
    "Scenario",
    "ScenarioError",
    "Script",
    "ScriptedExecutor",
    "open_scenario",
]
