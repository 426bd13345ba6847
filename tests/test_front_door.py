"""``Supervisor`` is the core's one surface (docs/architecture.md § The core's wiring): the HTTP layer, the root of
``supervisor serve`` (``supervisor/_root.py``) and the scenario kit use only its public methods and properties, never
a part behind it (no ``supervisor.heartbeats.take``, ``supervisor.fleet.leading``), and never set anything on it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = [*sorted((ROOT / "supervisor" / "api").glob("*.py")), ROOT / "supervisor" / "_root.py"]
CLIENTS += sorted((ROOT / "supervisor" / "testing").glob("*.py"))
NAMES = {"supervisor", "_supervisor", "sup"}  # how a client names its Supervisor (a variable or an attribute)


def surface() -> set[str]:
    """``Supervisor``'s public methods and properties: what its class declares, not what its constructor assigns."""
    return {
        name
        for name, value in inspect.getmembers(Supervisor)
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))
    }


def _names_a_supervisor(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in NAMES
    return isinstance(node, ast.Attribute) and node.attr in NAMES


def reaches_past(source: str, allowed: set[str], where: str) -> list[str]:
    """Each use in ``source`` of a ``supervisor.<name>`` that is not in ``allowed``, or that assigns to it."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _names_a_supervisor(node.value):
            if node.attr not in allowed:
                found.append((node.lineno, f"{where}:{node.lineno}: supervisor.{node.attr}"))
            elif isinstance(node.ctx, ast.Store | ast.Del):
                found.append((node.lineno, f"{where}:{node.lineno}: sets supervisor.{node.attr}"))
    return [said for _, said in sorted(found)]


def test_the_clients_of_the_core_use_only_the_supervisors_surface() -> None:
    allowed = surface()
    assert {"enqueue", "start", "heartbeat", "leading", "config"} <= allowed  # the surface was read
    found = [hit for path in CLIENTS for hit in reaches_past(path.read_text(), allowed, str(path.relative_to(ROOT)))]
    assert found == []


def test_the_parts_are_no_part_of_the_surface() -> None:
    """The parts are attributes a constructor assigns (a test's seam), so the check above refuses them."""
    assert not {"drainer", "monitors", "fleet", "heartbeats", "webhooks", "sweeper", "events", "boot"} & surface()


def test_the_check_fails_on_a_client_that_reaches_past_the_supervisor() -> None:
    allowed = surface()
    source = (
        "async def route(supervisor):\n"
        "    await supervisor.heartbeats.admit('j', 't')\n"
        "    supervisor.monitors.jitter = None\n"
        "    supervisor.start = None\n"
        "    return self._supervisor.fleet.leading, supervisor.leading\n"
    )
    assert reaches_past(source, allowed, "x.py") == [
        "x.py:2: supervisor.heartbeats",
        "x.py:3: supervisor.monitors",
        "x.py:4: sets supervisor.start",
        "x.py:5: supervisor.fleet",
    ]


def subscriptions_outside(root: Path, allowed: set[tuple[str, str]]) -> list[str]:
    """Each subscription to an event bus (``events.subscribe(...)``, ``bus.subscribe(...)``) under ``root`` made by a
    function whose (module, name) is not in ``allowed``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                called = node.func if isinstance(node, ast.Call) else None
                subscribes = isinstance(called, ast.Attribute) and called.attr == "subscribe" and _a_bus(called.value)
                if subscribes and (path.name, function.name) not in allowed:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {function.name}")
    return found


def _a_bus(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in {"events", "bus"}


def test_the_event_bus_listeners_are_declared_where_the_bus_is_built() -> None:
    """No part subscribes itself (a constructor that does hides a call back into the core): one method of
    ``Supervisor``, beside the bus's construction, declares them all (docs/architecture.md § The event seam)."""
    assert subscriptions_outside(ROOT / "supervisor" / "core", {("_supervisor.py", "_subscribe")}) == []
    assert subscriptions_outside(ROOT / "supervisor" / "core", set()) == ["_supervisor.py:" + _subscribe_line()]


def _subscribe_line() -> str:
    source = (ROOT / "supervisor" / "core" / "_supervisor.py").read_text()
    for node in ast.walk(ast.parse(source)):
        called = node.func if isinstance(node, ast.Call) else None
        if isinstance(called, ast.Attribute) and called.attr == "subscribe" and _a_bus(called.value):
            return f"{node.lineno}: _subscribe"
    return "none"
