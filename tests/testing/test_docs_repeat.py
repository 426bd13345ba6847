"""A scenario repeats exactly: each of docs/testing.md's examples of the kit runs three times here, and shows the same
webhooks and log lines each time. And ``runbook_scenarios.py`` (a kind's author's scenarios, with only the names the
page documents) passes with plain pytest outside the project, as the page's examples do (``test_docs_examples.py``).

The page's sections after the kit's (the runner's deadlines, ``pipeline_runner.testing``) are not the kit's: their
examples are held by ``test_docs_examples.py``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from docs_testing_page import PAGE, examples, pytest_outside_the_project

import supervisor.testing
from supervisor.testing import Scenario, open_scenario

HERE = Path(__file__).resolve().parent
RUNBOOK = HERE / "runbook_scenarios.py"
RUNS = 3


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
    assert '"job.transition"' in runs[0]  # what is compared holds what happened


@pytest.mark.e2e
def test_the_runbook_scenarios_pass_with_plain_pytest_outside_the_project(tmp_path: Path) -> None:
    done = pytest_outside_the_project(tmp_path, RUNBOOK.read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 passed" in done.stdout, done.stdout


def test_the_runbook_scenarios_use_only_documented_names() -> None:
    """What the runbook's scenarios use of the kit (its imports, ``sc.<name>``, ``Scenario.<name>``) is exported and
    on the page."""
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
    assert {"start", "advance_until_ended", "transitions"} <= verbs  # the check sees the scenarios' calls
    missing = sorted(name for name in used | verbs if f"`{name}" not in page and f".{name}(" not in page)
    assert not missing, f"used by the runbook but not on docs/testing.md: {missing}"
