"""Each package's public surface is its ``__init__``'s ``__all__``, and it is what an embedder and the tests use.

As httpx's ``test_exported_members``: every name in ``__all__`` exists, every public name an ``__init__`` binds is
in its ``__all__``, and no test imports a private module (``supervisor.core._drain``): a test reaches a part through
its public module, so that the parts stay free to rearrange their insides. The same rule holds inside
``supervisor``: a module imports another package's names from that package (``from ..domain import Job``), never
from its private modules; only a package's own modules (and its subpackages': ``registry.sqlite`` uses
``registry._registry``) use its private ones, and only the top's own modules use ``supervisor._root``.
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
    "supervisor.testing",
    "pipeline_runner.testing",
]
TESTS = Path(__file__).resolve().parent
SOURCE = TESTS.parent / "supervisor"


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


def imported_modules(path: Path, root: Path) -> list[tuple[int, list[str]]]:
    """Each ``from ... import`` of a module under ``root`` (its package: ``root.name``), resolved to absolute parts."""
    package = list(path.relative_to(root.parent).parts[:-1])  # a module's and an __init__'s package alike
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            above = package[: len(package) - node.level + 1] if node.level else []
            found.append((node.lineno, above + node.module.split(".")))
    return found


def reaches_into_another_package(importer: Path, module: list[str], root: Path) -> bool:
    """``module`` is private (a part after the top starts with ``_``) and not of the importer's own package."""
    private = [i for i, part in enumerate(module) if i > 0 and part.startswith("_")]
    if module[0] != root.name or not private:
        return False
    owner = module[: private[0]]  # the package whose private module it is
    importer_package = list(importer.relative_to(root.parent).parts[:-1])
    if len(owner) == 1:  # the top's own (_root, _entry): each subpackage below it is a package of its own
        return importer_package != owner
    return importer_package[: len(owner)] != owner


def private_imports_in(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root.parent)}:{line}: {'.'.join(module)}"
        for path in sorted(root.rglob("*.py"))
        for line, module in imported_modules(path, root)
        if reaches_into_another_package(path, module, root)
    ]


def test_no_module_imports_another_packages_private_module() -> None:
    assert private_imports_in(SOURCE) == []


def test_the_private_import_rule_can_fail(tmp_path: Path) -> None:
    root = tmp_path / "supervisor"
    (root / "core").mkdir(parents=True)
    (root / "domain").mkdir()
    (root / "core" / "_drain.py").write_text(
        "from ..domain._model import Job\nfrom ..domain import Job\nfrom ._boot import Boot\nfrom .._root import run\n"
    )
    (root / "_root.py").write_text("from .core._drain import Drainer\nfrom ._entry import main\n")
    assert private_imports_in(root) == [
        "supervisor/_root.py:1: supervisor.core._drain",
        "supervisor/core/_drain.py:1: supervisor.domain._model",
        "supervisor/core/_drain.py:4: supervisor._root",
    ]


def private_attributes_of(root: Path) -> set[str]:
    """The private attribute and method names the classes under ``root`` define (``self._conn``, ``def _start``)."""
    names: set[str] = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(item.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def private_reaches(tests: Path, private: set[str]) -> list[str]:
    """Each place a test touches one of ``private`` on anything but its own ``self`` (a class of the test's own
    defining the same name is told apart by the file that defines it)."""
    found = []
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        own = private_attributes_of_tree(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in private or node.attr in own:
                continue
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{path.relative_to(tests)}:{node.lineno}: {ast.unparse(node)}")
    return found


def private_attributes_of_tree(tree: ast.AST) -> set[str]:
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    }


def test_no_test_touches_a_private_attribute_of_the_supervisors() -> None:
    """A test drives a part through its public verbs, the parts ``Supervisor`` documents, or a seam documented as
    one (``ShepherdClient.disconnect``, ``DockerExecutor.wait_slice``, an executor's ``start``, ``Client(transport=)``).
    """
    assert private_reaches(TESTS, private_attributes_of(SOURCE)) == []


def test_the_private_attribute_rule_can_fail(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "class Mine:\n    def __init__(self):\n        self._own = 1\n\n"
        "def test(sup):\n    sup.drainer._start\n    Mine()._own\n    sup.drainer.start\n"
    )
    assert private_reaches(tmp_path, {"_start", "_own"}) == ["test_x.py:6: sup.drainer._start"]
