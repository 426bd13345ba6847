"""docs/testing.md's examples are tests: its code, copied into a file outside the project, run with plain pytest.

That is how a kind's author uses the kit: ``supervisor`` installed, pytest-trio beside it, no conftest and no
settings of this project. The run passes only if every example does, and the kit's fixture reached it through the
package's pytest plugin (the entry point), not through this project's conftest.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def examples() -> str:
    return "\n\n".join(re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S))


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
