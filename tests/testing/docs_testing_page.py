"""docs/testing.md's examples, as the suite reads and runs them: the kit's (the page less the runner's section) and
the runner's, each run with plain pytest outside the project as a reader would (``test_docs_examples.py``,
``test_docs_repeat.py``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
    """The scenario kit's examples."""
    return _code(_split_runner_section()[0])


def runner_examples() -> str:
    """The runner's deadlines' examples."""
    return _code(_split_runner_section()[1])


def pytest_outside_the_project(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` as a test file of its own in ``tmp_path``, run with plain pytest there (no project conftest, none of
    this run's PYTEST_ or PODCAST_ variables)."""
    (tmp_path / "test_from_the_page.py").write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PODCAST_"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0", "test_from_the_page.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
