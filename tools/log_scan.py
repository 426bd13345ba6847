"""Find, by reading the code (an AST walk, nothing imported or run), every log event ``supervisor/`` can emit: its
name, the levels and the fields each call site gives it. ``tests/test_log_events.py`` holds the catalogue of log
events (``supervisor/observe/_log_events.py``) to what this finds.

What counts as an emission:

- a call of a logger's level method (``log.info("name", ...)``, ``(log.debug if c else log.warning)("name", ...)``),
  a logger being any name bound to ``get_logger(...)``;
- a call of a *forwarder*: a function or class that passes one of its parameters on as the event's name
  (``log_failure(event, ...)``, ``boundary(step, ...)``, ``_Outage(event, ...)``, ``run_in_tree(work, step)``), found
  by the same walk, to any depth;
- a dict literal with the keys ``event`` and ``level`` (a line written by hand: ``log_lines_dropped``).

A name is read from a string constant, or an f-string whose parts are local names bound only to constants
(``what = "a" if c else "b"``). Anything else is reported as unreadable, so that the scan fails closed: a new kind of
call site is taught to it here, never silently skipped. ``DYNAMIC`` lists the one function whose event names are
made at run time from a declaration (the event bus's), which the test reads from that declaration.

Usage: .venv/bin/python tools/log_scan.py  (prints each event with its levels, fields and call sites)
"""

from __future__ import annotations

import ast
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEVELS = {"debug": "debug", "info": "info", "warning": "warning", "error": "error", "exception": "error",
          "critical": "critical"}  # fmt: skip
# Keywords that are no field of the line (structlog reads them).
NOT_FIELDS = {"exc_info", "stack_info"}
# (module, function): a log call whose event name is made at run time; the test names the declaration it comes from.
DYNAMIC = {("supervisor/observe/_events.py", "log_event")}


@dataclass
class Emission:
    name: str
    levels: set[str]
    fields: set[str]
    spread: bool  # the call passes fields the scan cannot see (``**mapping``)
    site: str  # path:line


@dataclass
class Scan:
    emissions: list[Emission] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # sites whose event name cannot be read
    dynamic: list[str] = field(default_factory=list)  # the DYNAMIC sites met

    def by_name(self) -> dict[str, list[Emission]]:
        found: dict[str, list[Emission]] = {}
        for emission in self.emissions:
            found.setdefault(emission.name, []).append(emission)
        return found


@dataclass(frozen=True)
class Forwarder:
    """A function (or class, through its ``__init__``) whose parameter ``param`` becomes an event's name."""

    callee: str  # the name it is called by
    index: int  # the parameter's position at a call (``self`` not counted)
    param: str
    own_params: frozenset[str]  # its named parameters: a caller's keyword of one of these is no field
    levels: frozenset[str]
    fields: frozenset[str]  # the fields the forwarder's own log call adds
    spread: bool


class _Module:
    def __init__(self, path: Path, root: Path) -> None:
        self.rel = path.relative_to(root).as_posix()
        self.tree = ast.parse(path.read_text(), filename=self.rel)
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.loggers = {
            target.id
            for node in ast.walk(self.tree)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and _callee(node.value.func) == "get_logger"
            for target in node.targets if isinstance(target, ast.Name)
        }  # fmt: skip

    def enclosing(self, node: ast.AST, kind: type | tuple[type, ...]) -> ast.AST | None:
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, kind):
                return node
        return None

    def site(self, node: ast.AST) -> str:
        return f"{self.rel}:{getattr(node, 'lineno', 0)}"


def _callee(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    return names[1:] if names and names[0] in ("self", "cls") else names


def _all_params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}


def _fields(call: ast.Call, skip: frozenset[str] = frozenset()) -> tuple[set[str], bool]:
    named = {k.arg for k in call.keywords if k.arg is not None} - NOT_FIELDS - skip
    return named, any(k.arg is None for k in call.keywords)


def _name_arg(call: ast.Call, index: int, param: str) -> ast.expr | None:
    if len(call.args) > index and not any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
        return call.args[index]
    return next((k.value for k in call.keywords if k.arg == param), None)


class _Resolver:
    """Reads an event name: a set of strings, a forwarder (the name is a parameter), or None (unreadable)."""

    def __init__(self, module: _Module) -> None:
        self.module = module

    def read(self, expr: ast.expr, at: ast.AST) -> set[str] | tuple[ast.AST, str] | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return {expr.value}
        fn = self.module.enclosing(at, (ast.FunctionDef, ast.AsyncFunctionDef))
        if isinstance(expr, ast.JoinedStr) and fn is not None:
            return self._joined(expr, fn)
        if isinstance(expr, ast.Name) and isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scope: ast.AST | None = fn
            while isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):  # a closure reads its outer's
                if expr.id in _params(scope):
                    return (scope, expr.id)
                local = self._local(expr.id, scope)
                if local is not None:
                    return local
                scope = self.module.enclosing(scope, (ast.FunctionDef, ast.AsyncFunctionDef))
            return None
        if (isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self"
                and fn is not None):  # fmt: skip
            cls = self.module.enclosing(fn, ast.ClassDef)
            return self._stored(expr.attr, cls) if isinstance(cls, ast.ClassDef) else None
        return None

    def _local(self, name: str, fn: ast.AST) -> set[str] | None:
        values: set[str] = set()
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                got = _constants(node.value)
                if got is None:
                    return None
                values |= got
        return values or None

    def _joined(self, expr: ast.JoinedStr, fn: ast.AST) -> set[str] | None:
        parts: list[set[str]] = []
        for value in expr.values:
            if isinstance(value, ast.Constant):
                parts.append({str(value.value)})
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                got = self._local(value.value.id, fn)
                if got is None:
                    return None
                parts.append(got)
            else:
                return None
        return {"".join(p) for p in itertools.product(*parts)}

    def _stored(self, attr: str, cls: ast.ClassDef) -> tuple[ast.AST, str] | None:
        """``self.attr`` set from a parameter of the class's ``__init__``: the class is the forwarder."""
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                for stmt in ast.walk(node):
                    if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name)):
                        continue
                    targets = any(isinstance(t, ast.Attribute) and t.attr == attr for t in stmt.targets)
                    if targets and stmt.value.id in _params(node):
                        return (cls, stmt.value.id)
        return None


def _constants(expr: ast.expr) -> set[str] | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.IfExp):
        body, orelse = _constants(expr.body), _constants(expr.orelse)
        return body | orelse if body is not None and orelse is not None else None
    return None


def _log_calls(module: _Module) -> Iterator[tuple[ast.Call | None, set[str], ast.AST]]:
    """Each use of a logger's level method: (the call, its levels, the node), the call None when it is not called
    where it is named (``level = log.warning if ... else log.info``)."""
    for node in ast.walk(module.tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in module.loggers and node.attr in LEVELS):  # fmt: skip
            continue
        parent = module.parent.get(node)
        if isinstance(parent, ast.Call) and parent.func is node:
            yield parent, {LEVELS[node.attr]}, node
        elif isinstance(parent, ast.IfExp) and isinstance(module.parent.get(parent), ast.Call):
            call = module.parent[parent]
            assert isinstance(call, ast.Call)
            if call.func is parent and node is parent.body:  # one record for the pair
                other = parent.orelse
                levels = {LEVELS[node.attr]}
                if isinstance(other, ast.Attribute) and other.attr in LEVELS:
                    levels.add(LEVELS[other.attr])
                yield call, levels, node
            elif call.func is not parent:
                yield None, {LEVELS[node.attr]}, node
        else:
            yield None, {LEVELS[node.attr]}, node


def scan(root: Path = ROOT) -> Scan:
    result = Scan()
    modules = [_Module(p, root) for p in sorted((root / "supervisor").rglob("*.py"))]
    forwarders: dict[str, Forwarder] = {}

    def record(module: _Module, call: ast.Call, expr: ast.expr, levels: set[str], fields: set[str],
               spread: bool) -> None:  # fmt: skip
        got = _Resolver(module).read(expr, call)
        if got is None:
            result.unreadable.append(module.site(call))
        elif isinstance(got, set):
            for name in got:
                result.emissions.append(Emission(name, set(levels), set(fields), spread, module.site(call)))
        else:
            owner, param = got
            if isinstance(owner, ast.ClassDef):
                init = next(n for n in owner.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
                callee, params, own = owner.name, _params(init), _all_params(init)
            else:
                assert isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef))
                callee, params, own = owner.name, _params(owner), _all_params(owner)
            # A spread of the forwarder's own ``**fields`` (or of ``self._fields``, kept from them) is what its
            # callers pass, which their call sites show.
            forwarded = all(isinstance(k.value, (ast.Name, ast.Attribute)) for k in call.keywords if k.arg is None)
            before = forwarders.get(callee)
            if before is not None:  # another of its log calls (``log_failure``: DEBUG or ERROR)
                levels, fields = levels | before.levels, fields | before.fields
            forwarders[callee] = Forwarder(callee, params.index(param), param, frozenset(own), frozenset(levels),
                                           frozenset(fields), spread and not forwarded)  # fmt: skip

    for module in modules:
        for call, levels, node in _log_calls(module):
            fn = module.enclosing(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            fn_name = getattr(fn, "name", None)
            if (module.rel, fn_name) in DYNAMIC:
                result.dynamic.append(module.site(node))
                continue
            if call is None or not (call.args or any(k.arg == "event" for k in call.keywords)):
                result.unreadable.append(module.site(node))
                continue
            name = call.args[0] if call.args else next(k.value for k in call.keywords if k.arg == "event")
            fields, spread = _fields(call)
            record(module, call, name, levels, fields, spread)
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Dict):
                keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)}
                event, level = keys.get("event"), keys.get("level")
                if isinstance(event, ast.Constant) and isinstance(level, ast.Constant):
                    fields = {str(k) for k in keys} - {"event", "level", "timestamp"}
                    result.emissions.append(Emission(event.value, {level.value}, fields, False, module.site(node)))

    # The forwarders' call sites, again until no forwarder changes (one may call another: ``_in_tree`` ->
    # ``run_in_tree`` -> ``boundary``; a later one may add a level to an earlier one).
    direct, unreadable = list(result.emissions), list(result.unreadable)
    while True:
        before = dict(forwarders)
        result.emissions, result.unreadable = list(direct), list(unreadable)
        for callee, fwd in before.items():
            for module in modules:
                for node in ast.walk(module.tree):
                    if not (isinstance(node, ast.Call) and _callee(node.func) == callee):
                        continue
                    arg = _name_arg(node, fwd.index, fwd.param)
                    if arg is None:
                        result.unreadable.append(module.site(node))
                        continue
                    fields, spread = _fields(node, fwd.own_params)
                    record(module, node, arg, set(fwd.levels), fields | fwd.fields, spread or fwd.spread)
        if forwarders == before:
            break
    return result


def main() -> int:
    found = scan()
    for name, emissions in sorted(found.by_name().items()):
        levels = sorted(set().union(*(e.levels for e in emissions)))
        fields = sorted(set().union(*(e.fields for e in emissions)))
        print(f"{name}  [{'/'.join(levels)}]  {', '.join(fields)}")
        for e in emissions:
            print(f"    {e.site}{'  (+ fields it cannot see)' if e.spread else ''}")
    for site in found.unreadable:
        print(f"UNREADABLE {site}", file=sys.stderr)
    return 1 if found.unreadable else 0


if __name__ == "__main__":
    sys.exit(main())
