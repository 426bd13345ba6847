"""The supervisor stays readable in one sitting: no module of it over 600 lines, no function over 60 (a class:
``tests/test_import_map.py``). A step of a long function is a function of its own with a name that says what
it does."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def _too_long(package: Path) -> list[str]:
    """The modules over ``MAX_MODULE_LINES`` lines and the functions over ``MAX_FUNCTION_LINES`` in ``package``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(package.parent)
        if len(text.splitlines()) > MAX_MODULE_LINES:
            found.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno}: {node.name} ({lines} lines)")
    return found


def test_no_module_of_the_supervisor_is_over_600_lines_nor_a_function_over_60() -> None:
    assert _too_long(ROOT / "supervisor") == []


def test_the_length_check_sees_a_long_module_and_a_long_function(tmp_path: Path) -> None:
    package = tmp_path / "api"
    package.mkdir()
    (package / "_long.py").write_text("x = 1\n" * MAX_MODULE_LINES + "def f():\n" + "    y = 1\n" * MAX_FUNCTION_LINES)
    assert _too_long(package) == [
        f"api/_long.py: {MAX_MODULE_LINES + 1 + MAX_FUNCTION_LINES} lines",
        f"api/_long.py:{MAX_MODULE_LINES + 1}: f ({MAX_FUNCTION_LINES + 1} lines)",
    ]
