"""Each package's public surface is its ``__init__``'s ``__all__``, and it is what an embedder and the tests use.

As httpx's ``test_exported_members``: every name in ``__all__`` exists, every public name an ``__init__`` binds is
in its ``__all__``, and no test imports a private module (``supervisor.core._drain``): a test reaches a part through
its public module, so that the parts stay free to rearrange their insides.
"""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

import supervisor

PACKAGES = [
    "supervisor",
    "supervisor.domain",
    "supervisor.registry",
    "supervisor.registry.sqlite",
    "supervisor.registry.postgres",
    "supervisor.execution",
    "supervisor.core",
    "supervisor.observe",
    "supervisor.api",
    "supervisor.cli",
]
TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("name", PACKAGES)
def test_all_names_exist_and_every_public_name_is_in_all(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(set(exported), key=exported.index), "duplicates in __all__"
    for member in exported:
        assert getattr(module, member) is not None, member
    # What the package itself defines and binds publicly (a name imported for its own use, Config or Mapping, is not
    # the package's to export).
    bound = {
        attr
        for attr, value in vars(module).items()
        if not attr.startswith("_")
        and not isinstance(value, types.ModuleType)
        and str(getattr(value, "__module__", "")).startswith(name)
    }
    assert bound <= set(exported), f"public names missing from {name}.__all__: {sorted(bound - set(exported))}"


def test_an_embedder_finds_everything_at_the_top() -> None:
    needed = {
        "Supervisor",
        "run_supervisor",
        "create_app",
        "Config",
        "load_config",
        "Executor",
        "Registry",
        "SqliteRegistry",
        "open_registry",
        "Job",
        "JobStatus",
        "KindCatalog",
        "load_kinds",
        "SupervisorError",
        "RegistryError",
        "RequestError",
    }
    assert needed <= set(supervisor.__all__)
    assert callable(supervisor.run_supervisor) and callable(supervisor.create_app)


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for module in names:
            parts = module.split(".")
            if parts[0] == "supervisor" and any(part.startswith("_") for part in parts[1:]):
                found.append(f"{path.relative_to(TESTS)}:{node.lineno}: {module}")
    return found


def test_no_test_imports_a_private_module() -> None:
    offenders = [line for path in sorted(TESTS.rglob("*.py")) for line in _private_imports(path)]
    assert offenders == []
