"""The public surface, and the one hard boundary: pipeline_runner never imports supervisor."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pipeline_runner

PACKAGE = Path(pipeline_runner.__file__).parent


def test_all_names_exist_and_are_public() -> None:
    assert sorted(pipeline_runner.__all__) == sorted(set(pipeline_runner.__all__))
    for name in pipeline_runner.__all__:
        assert hasattr(pipeline_runner, name), name
        assert not name.startswith("_")


def test_exit_codes_are_the_contract() -> None:
    codes = {
        name: getattr(pipeline_runner, name)
        for name in pipeline_runner.__all__
        if name.startswith("EXIT_") and name != "EXIT_CODES"
    }
    assert codes == {
        "EXIT_OK": 0,
        "EXIT_CRASH": 1,
        "EXIT_USAGE": 2,
        "EXIT_ALL_FEEDS_FAILED": 3,
        "EXIT_BUDGET_EXHAUSTED": 10,
        "EXIT_TIME_BUDGET_EXHAUSTED": 11,
        "EXIT_TRANSIENT": 75,
        "EXIT_TERMINATED": 143,
    }


def test_never_imports_supervisor() -> None:
    for file in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            assert not any(n == "supervisor" or n.startswith("supervisor.") for n in names), file


def test_python_dash_m_help_works() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline_runner", "run", "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=PACKAGE.parent,
    )
    assert proc.returncode == 0
    assert "--max-episodes" in proc.stdout and "--feed" in proc.stdout
