"""docs/testing.md's examples are tests: its code, copied into a file outside the project, run with plain pytest.

That is how a kind's author uses the kit: ``supervisor`` installed, pytest-trio beside it, no conftest and no
settings of this project. The run passes only if every example does, and the kit's fixture reached it through the
package's pytest plugin (the entry point), not through this project's conftest.

The page's last section, the runner's deadlines (``pipeline_runner.testing``), is a user's file of its own: a stage's
author tests the runner without the supervisor kit, with plain pytest-trio and its ``autojump_clock``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
RUNNER_SECTION = "## The runner's deadlines"


def _code(text: str) -> str:
    return "\n\n".join(re.findall(r"```python\n(.*?)```", text, re.S))


def _split_runner_section() -> tuple[str, str]:
    """(the page without the runner's section, the runner's section)."""
    page = PAGE.read_text()
    start = page.index(RUNNER_SECTION)
    end = page.find("\n## ", start + len(RUNNER_SECTION))
    end = len(page) if end < 0 else end
    return page[:start] + page[end:], page[start:end]


def examples() -> str:
    return _code(_split_runner_section()[0])


def runner_examples() -> str:
    return _code(_split_runner_section()[1])


def test_the_page_has_the_four_incidents() -> None:
    names = re.findall(r"^async def (test_\w+)", examples(), re.M)
    assert len(names) == 6, names  # and two of a kinds file's


@pytest.mark.e2e
def test_the_examples_pass_with_plain_pytest_outside_the_project(tmp_path: Path) -> None:
    (tmp_path / "test_runbook.py").write_text(examples())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PODCAST_"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", "test_runbook.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 passed" in done.stdout, done.stdout


def _pytest_outside_the_project(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_stage.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PODCAST_"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", "test_stage.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


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
    done = _pytest_outside_the_project(tmp_path, runner_examples())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout, done.stdout
