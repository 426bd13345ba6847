"""docs/testing.md's examples are tests: its code, copied into a file outside the project, run with plain pytest;
and a scenario repeats exactly, so each example runs three times here with the same webhooks and log lines.

That is how a kind's author uses the kit: ``supervisor`` installed, pytest-trio beside it, no conftest and no
settings of this project. The run passes only if every example does, and the kit's fixture reached it through the
package's pytest plugin (the entry point), not through this project's conftest. ``runbook_scenarios.py`` (a kind's
author's scenarios, with only the names the page documents) is run the same way.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import supervisor.testing
from supervisor.testing import Scenario, open_scenario

HERE = Path(__file__).resolve().parent
PAGE = HERE.parents[1] / "docs" / "testing.md"
RUNBOOK = HERE / "runbook_scenarios.py"
RUNS = 3


def examples() -> str:
    return "\n\n".join(re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S))


def test_the_page_has_the_four_incidents_and_a_runbook() -> None:
    names = re.findall(r"^async def (test_\w+)", examples(), re.M)
    assert len(names) == 6, names
    assert "test_a_hung_job_is_stopped_under_stall_action_terminate" in names


def plain_pytest(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_runbook.py").write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PODCAST_"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", "test_runbook.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


@pytest.mark.e2e
def test_the_examples_pass_with_plain_pytest_outside_the_project(tmp_path: Path) -> None:
    done = plain_pytest(tmp_path, examples())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 passed" in done.stdout, done.stdout


@pytest.mark.e2e
def test_the_runbook_scenarios_pass_with_plain_pytest_outside_the_project(tmp_path: Path) -> None:
    done = plain_pytest(tmp_path, RUNBOOK.read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 passed" in done.stdout, done.stdout


def test_the_runbook_scenarios_use_only_documented_names() -> None:
    """What the runbook's scenarios use of the kit (its imports, ``sc.<name>``, ``Scenario.<name>``) is on the page,
    and exported."""
    tree = ast.parse(RUNBOOK.read_text())
    page = PAGE.read_text()
    used = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "supervisor.testing"
        for alias in node.names
    }
    assert used <= set(supervisor.testing.__all__)
    verbs = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("sc", "Scenario")
    }
    assert verbs, "the check must see the scenarios' calls"
    missing = sorted(name for name in used | verbs if f"`{name}" not in page and f".{name}(" not in page)
    assert not missing, f"used by the runbook but not on docs/testing.md: {missing}"


def load_examples(tmp_path: Path) -> Any:
    path = tmp_path / "page_examples.py"
    path.write_text(examples())
    spec = importlib.util.spec_from_file_location("page_examples", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_once(data_dir: Path, test: Callable[[Scenario], Awaitable[None]]) -> str:
    """One run of an example, as its own test run: what it leaves seen (webhooks, log lines), its data dir's path
    written DATA (it differs from run to run)."""

    async def main() -> str:
        async with open_scenario(data_dir) as sc:
            await test(sc)
            return json.dumps([sc.webhooks(), sc.log()], sort_keys=True, default=str)

    seen: str = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return seen.replace(str(data_dir), "DATA")


@pytest.mark.parametrize("name", re.findall(r"^async def (test_\w+)", examples(), re.M))
def test_each_example_repeats_exactly(tmp_path: Path, name: str) -> None:
    test = getattr(load_examples(tmp_path), name)
    runs = [run_once(tmp_path / f"run-{n}", test) for n in range(RUNS)]
    assert all(run == runs[0] for run in runs), f"{name}: the runs differ"
    assert '"job.transition"' in runs[0]  # the fingerprint holds what happened
