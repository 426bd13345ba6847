"""The one error tree, as ``domain/_errors.py``'s docstring draws it, is the tree the code defines: every
class under ``SupervisorError`` anywhere in ``supervisor`` is drawn, under its own base, and nothing drawn is gone."""

from __future__ import annotations

import importlib
import pkgutil
import re

import supervisor
from supervisor import SupervisorError

BRANCH = re.compile(r"^(?P<indent>[│ ]*)[├└]── (?P<name>\w+)")


def drawn_tree(doc: str) -> dict[str, str]:
    """Each class the docstring draws, and the class it is drawn under."""
    parents: dict[str, str] = {}
    stack = ["SupervisorError"]
    for line in doc.splitlines():
        match = BRANCH.match(line[4:] if line.startswith("    ") else line)
        if match is None:
            continue
        depth = len(match["indent"]) // 4
        del stack[depth + 1 :]
        parents[match["name"]] = stack[depth]
        stack.append(match["name"])
    return parents


def defined_tree() -> dict[str, str]:
    for module in pkgutil.walk_packages(supervisor.__path__, "supervisor."):
        if module.name.endswith((".shepherd", ".__main__")):
            continue  # run as scripts, never imported: they define no error of the tree
        importlib.import_module(module.name)
    found: dict[str, str] = {}
    todo = [SupervisorError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("supervisor."):
                found[sub.__name__] = cls.__name__
                todo.append(sub)
    return found


def test_the_error_tree_drawn_is_the_tree_defined() -> None:
    from supervisor.domain import _errors

    assert _errors.__doc__ is not None
    assert drawn_tree(_errors.__doc__) == defined_tree()


def test_the_drawing_is_read_as_a_tree() -> None:
    """The check can fail: a class drawn under the wrong base is seen."""
    doc = """
    SupervisorError
    ├── RegistryError       x
    │   └── RegistryDamaged x
    └── SpawnError          x
        └── ShepherdLost    x
"""
    assert drawn_tree(doc) == {
        "RegistryError": "SupervisorError",
        "RegistryDamaged": "RegistryError",
        "SpawnError": "SupervisorError",
        "ShepherdLost": "SpawnError",
    }
    misdrawn = doc.replace("        └── ShepherdLost", "    └── ShepherdLost")
    assert drawn_tree(misdrawn)["ShepherdLost"] == "SupervisorError"
