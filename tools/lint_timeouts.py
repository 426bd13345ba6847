#!/usr/bin/env python3
"""Timeout lint (ADR-150 D6): every outbound httpx call must carry an explicit ``timeout=``.

Usage: ``python tools/lint_timeouts.py PATH [PATH ...]`` -- files or directories (searched for
``*.py``). Prints ``file:line:col: message`` for each offender and exits 1 if there is any, 0 if
none, 2 on bad usage. A path that does not exist is reported on stderr and skipped, so the lint
can run before a package has any code.

What is checked, by AST, per file (the heuristic is deliberately simple):

1. Client constructions: ``httpx.Client(...)`` and ``httpx.AsyncClient(...)`` (also under
   ``import httpx as h`` or ``from httpx import AsyncClient``).
2. Module-level request functions: ``httpx.get/post/put/patch/delete/head/options/request/stream(...)``.
3. Method calls ``.get/.post/.put/.patch/.delete/.head/.options/.request/.stream/.build_request``
   on a *known client*: a name or dotted attribute (``client``, ``self._client``) that anywhere in
   the file is assigned from a client construction (``=``, annotated ``=``, ``with ... as``) or
   annotated with an httpx client type (variables, function parameters, and class-body
   attributes, which count as ``self.<name>``). Tracking is per file, not per scope.
4. ``.send(request)`` on a known client: httpx's ``send`` takes no ``timeout=``; the timeout
   travels on the request. So ``send`` passes only when its first argument is a name assigned
   (anywhere in the file) from ``<client>.build_request(..., timeout=...)``.

"Explicit" means a ``timeout=`` keyword that is not the literal ``None`` (which disables every
timeout). A ``**kwargs`` splat does not count: the point is that a reader can see the bound.
Calls on objects the heuristic cannot see are not checked; keep clients in annotated names.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

CLIENT_CLASSES = frozenset({"Client", "AsyncClient"})
MODULE_FUNCTIONS = frozenset({"get", "post", "put", "patch", "delete", "head", "options", "request", "stream"})
CLIENT_METHODS = MODULE_FUNCTIONS | {"build_request"}


@dataclass(frozen=True)
class Offence:
    path: Path
    line: int
    col: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.message}"


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _has_explicit_timeout(call: ast.Call) -> bool:
    for kw in call.keywords:
        if kw.arg == "timeout":
            return not (isinstance(kw.value, ast.Constant) and kw.value.value is None)
    return False


class _FileChecker:
    def __init__(self, path: Path, tree: ast.Module) -> None:
        self.path = path
        self.tree = tree
        self.module_aliases: set[str] = set()  # names bound to the httpx module
        self.class_aliases: set[str] = set()  # names bound to httpx.Client / httpx.AsyncClient
        self.function_aliases: dict[str, str] = {}  # local name -> httpx function name
        self.clients: set[str] = set()
        self.timed_requests: set[str] = set()

    # -- name resolution --------------------------------------------------------------------------

    def _collect_imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "httpx":
                        self.module_aliases.add(alias.asname or "httpx")
            elif isinstance(node, ast.ImportFrom) and node.module == "httpx":
                for alias in node.names:
                    local = alias.asname or alias.name
                    if alias.name in CLIENT_CLASSES:
                        self.class_aliases.add(local)
                    elif alias.name in MODULE_FUNCTIONS:
                        self.function_aliases[local] = alias.name

    def _is_client_class(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.class_aliases
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return node.value.id in self.module_aliases and node.attr in CLIENT_CLASSES
        return False

    def _is_client_construction(self, node: ast.expr | None) -> bool:
        return isinstance(node, ast.Call) and self._is_client_class(node.func)

    def _annotation_is_client(self, annotation: ast.expr | None) -> bool:
        if annotation is None:
            return False
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return False
        # `httpx.AsyncClient | None`, `Optional[httpx.Client]`, ...: any mention counts.
        return any(self._is_client_class(n) for n in ast.walk(annotation) if isinstance(n, ast.expr))

    def _collect_clients(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and self._is_client_construction(node.value):
                for target in node.targets:
                    self._add_client(target)
            elif isinstance(node, ast.AnnAssign) and (
                self._is_client_construction(node.value) or self._annotation_is_client(node.annotation)
            ):
                self._add_client(node.target)
            elif isinstance(node, ast.With | ast.AsyncWith):
                for item in node.items:
                    if item.optional_vars is not None and self._is_client_construction(item.context_expr):
                        self._add_client(item.optional_vars)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                    if self._annotation_is_client(arg.annotation):
                        self.clients.add(arg.arg)
            elif isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if (
                        isinstance(stmt, ast.AnnAssign)
                        and isinstance(stmt.target, ast.Name)
                        and self._annotation_is_client(stmt.annotation)
                    ):
                        self.clients.add(f"self.{stmt.target.id}")

    def _add_client(self, target: ast.expr) -> None:
        name = _dotted(target)
        if name is not None:
            self.clients.add(name)

    def _collect_timed_requests(self) -> None:
        for node in ast.walk(self.tree):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "build_request"
                and _has_explicit_timeout(node.value)
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.timed_requests.add(target.id)

    # -- the check --------------------------------------------------------------------------------

    def check(self) -> Iterator[Offence]:
        self._collect_imports()
        if not (self.module_aliases or self.class_aliases or self.function_aliases):
            return
        self._collect_clients()
        self._collect_timed_requests()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                message = self._offence(node)
                if message:
                    yield Offence(self.path, node.lineno, node.col_offset + 1, message)

    def _offence(self, call: ast.Call) -> str | None:
        func = call.func
        if self._is_client_class(func):
            class_name = func.attr if isinstance(func, ast.Attribute) else _dotted(func)
            what = f"httpx.{class_name}(...)"
            return None if _has_explicit_timeout(call) else f"{what} without an explicit timeout="
        if isinstance(func, ast.Name) and func.id in self.function_aliases:
            name = self.function_aliases[func.id]
            return None if _has_explicit_timeout(call) else f"httpx.{name}(...) without an explicit timeout="
        if not isinstance(func, ast.Attribute):
            return None
        receiver = _dotted(func.value)
        if receiver in self.module_aliases and func.attr in MODULE_FUNCTIONS:
            return None if _has_explicit_timeout(call) else f"httpx.{func.attr}(...) without an explicit timeout="
        if receiver in self.clients:
            if func.attr in CLIENT_METHODS and not _has_explicit_timeout(call):
                return f"{receiver}.{func.attr}(...) without an explicit timeout="
            if func.attr == "send":
                first = call.args[0] if call.args else None
                if not (isinstance(first, ast.Name) and first.id in self.timed_requests):
                    return (
                        f"{receiver}.send(...) of a request not built by build_request(..., timeout=...) in this file"
                    )
        return None


def check_source(source: str, path: Path = Path("<string>")) -> list[Offence]:
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        return [Offence(path, exc.lineno or 0, exc.offset or 0, f"cannot parse: {exc.msg}")]
    return list(_FileChecker(path, tree).check())


def iter_python_files(paths: Iterable[Path]) -> Iterator[Path]:
    for path in paths:
        if not path.exists():
            print(f"lint_timeouts: {path} does not exist; skipped", file=sys.stderr)
        elif path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if ".venv" not in p.parts)
        else:
            yield path


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or any(a in {"-h", "--help"} for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    offences: list[Offence] = []
    checked = 0
    for file in iter_python_files(Path(a) for a in args):
        checked += 1
        offences.extend(check_source(file.read_text(encoding="utf-8"), file))
    for offence in offences:
        print(offence)
    print(f"lint_timeouts: {checked} files checked, {len(offences)} offenders", file=sys.stderr)
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main())
