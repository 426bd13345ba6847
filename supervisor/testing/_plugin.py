"""The pytest plugin (entry point ``pytest11``): the ``supervisor_scenario`` fixture, and virtual time for every test
that uses it (pytest-trio's ``trio`` marker with a runner on a ``MockClock`` with autojump, unless the test brings
a clock of its own)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from ._scenario import Scenario, open_scenario

FIXTURE = "supervisor_scenario"


def run_in_virtual_time(fn: Callable[[], Any], *, clock: trio.abc.Clock | None = None, instruments: Any = ()) -> Any:
    """pytest-trio's runner for a scenario's test: its own clock if it asked for one, else autojumping virtual time."""
    chosen = clock if clock is not None else trio.testing.MockClock(autojump_threshold=0)
    return trio.run(fn, clock=chosen, instruments=instruments)


@pytest.hookimpl(tryfirst=True)  # before pytest-trio's trio_mode marks the test with the plain trio.run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("trio"):
        return  # without pytest-trio an async test does not run at all: pytest says so itself
    for item in items:
        if FIXTURE in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.trio(run=run_in_virtual_time))


@pytest.fixture
async def supervisor_scenario(tmp_path: Path) -> AsyncIterator[Scenario]:
    """A scenario (``supervisor.testing.Scenario``) whose files go under the test's ``tmp_path``; ``await
    supervisor_scenario.start(kinds=...)`` starts its first boot."""
    async with open_scenario(tmp_path / "scenario") as scenario:
        yield scenario
