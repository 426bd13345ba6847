"""The supervisor's import map: its packages form layers, and no package imports one above it (so there is no cycle
among them). ``pipeline_runner`` never imports ``supervisor`` (they talk over HTTP and exit codes only). And no class
of either grows past what a newcomer can read at once."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first: a package may import only those before it. (``__init__`` and ``__main__``, the surfaces, may import
# anything.)
# ``testing`` (the scenario kit) sits on the core, beside the API: nothing of production imports it.
LAYERS = ("domain", "registry", "observe", "execution", "core", "testing", "api", "_root", "cli", "_entry")


def _imports(package_root: Path) -> Iterator[tuple[Path, str, str]]:
    """(file, its top-level package, the top-level package it imports) for every import inside ``package_root``."""
    for path in sorted(package_root.rglob("*.py")):
        parts = path.relative_to(package_root).parts
        own = parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, own, alias.name
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    yield path, own, node.module or ""
                    continue
                base = list(parts[:-1])[: len(parts) - node.level] if node.level > 1 else list(parts[:-1])
                target = [*base, *(node.module or "").split(".")]
                target = [t for t in target if t]
                if target:
                    yield path, own, f"{package_root.name}.{'.'.join(target)}"
                else:
                    yield from ((path, own, f"{package_root.name}.{a.name}") for a in node.names)


def _layer_violations(package_root: Path) -> list[str]:
    package = package_root.name
    bad = []
    for path, own, imported in _imports(package_root):
        if not imported.startswith(f"{package}."):
            continue
        target = imported.split(".")[1]
        if own in ("__init__", "__main__") or own == target or target not in LAYERS or own not in LAYERS:
            continue
        if LAYERS.index(target) > LAYERS.index(own):
            bad.append(f"{path.relative_to(package_root.parent)}: {own} imports {target}, a layer above it")
    return bad


def test_no_supervisor_package_imports_a_layer_above_it() -> None:
    assert _layer_violations(ROOT / "supervisor") == []


def test_every_supervisor_package_has_its_layer() -> None:
    packages = {
        p.name.removesuffix(".py")
        for p in (ROOT / "supervisor").iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py")
    }
    assert packages - {"__init__", "__main__"} == set(LAYERS)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The check can fail: a registry module that imports the core is named."""
    fake = tmp_path / "supervisor"
    (fake / "registry").mkdir(parents=True)
    (fake / "registry" / "_x.py").write_text("from ..core import Supervisor\n")
    found = [(own, imported) for _, own, imported in _imports(fake)]
    assert found == [("registry", "supervisor.core")]
    assert _layer_violations(fake) == ["supervisor/registry/_x.py: registry imports core, a layer above it"]


def test_the_runner_never_imports_the_supervisor() -> None:
    names = [imported for _, _, imported in _imports(ROOT / "pipeline_runner")]
    assert names, "the walk found the runner's imports"
    assert not [n for n in names if n == "supervisor" or n.startswith("supervisor.")]


MAX_CLASS_LINES = 400


def _long_classes(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    found.append(f"{path.relative_to(root.parent)}: {node.name} ({lines} lines)")
    return found


def test_no_class_is_over_400_lines() -> None:
    assert _long_classes(ROOT / "supervisor") + _long_classes(ROOT / "pipeline_runner") == []


def test_the_class_size_check_sees_a_long_class(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "big.py").write_text("class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    assert _long_classes(package) == [f"pkg/big.py: Big ({MAX_CLASS_LINES + 1} lines)"]
