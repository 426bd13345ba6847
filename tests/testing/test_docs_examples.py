"""docs/testing.md's examples are tests: its code, copied into a file outside the project, run with plain pytest.

That is how a kind's author uses the kit: ``supervisor`` installed, pytest-trio beside it, no conftest and no
settings of this project. The run passes only if every example does, and the kit's fixture reached it through the
package's pytest plugin (the entry point), not through this project's conftest.

The page's last section, the runner's deadlines (``pipeline_runner.testing``), is a user's file of its own: a stage's
author tests the runner without the supervisor kit, with plain pytest-trio and its ``autojump_clock``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from docs_testing_page import examples, pytest_outside_the_project, runner_examples


def test_the_page_has_the_four_incidents() -> None:
    names = re.findall(r"^async def (test_\w+)", examples(), re.M)
    assert len(names) == 6, names  # and two of a kinds file's


@pytest.mark.e2e
def test_the_examples_pass_with_plain_pytest_outside_the_project(tmp_path: Path) -> None:
    done = pytest_outside_the_project(tmp_path, examples())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 passed" in done.stdout, done.stdout


def test_the_runner_section_has_one_example_per_deadline_level_and_the_cost_cap() -> None:
    code = runner_examples()
    names = re.findall(r"^async def (test_\w+)", code, re.M)
    assert len(names) == 4, names
    # Only documented names: the runner's package and its testing module, by their public surface.
    imported = set(re.findall(r"^from (pipeline_runner\S*) import", code, re.M))
    assert imported == {"pipeline_runner", "pipeline_runner.testing"}
    assert not re.search(r"^\s*(from|import) supervisor", code, re.M)


@pytest.mark.e2e
def test_the_runner_examples_pass_with_plain_pytest_outside_the_project(tmp_path: Path) -> None:
    done = pytest_outside_the_project(tmp_path, runner_examples())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout, done.stdout
