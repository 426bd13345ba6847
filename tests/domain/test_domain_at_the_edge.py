"""The domain is the vocabulary the edge parses into, not an edge itself: no module of ``supervisor/domain/`` reads
JSON. The API reads a body (``api/_parse.py``) into a ``JobRequest``, whose kind is a string and whose params a
mapping, before the core sees them."""

from __future__ import annotations

import ast
import typing
from collections.abc import Mapping
from pathlib import Path

from supervisor.domain import JobRequest

ROOT = Path(__file__).resolve().parents[2]
JSON_READERS = frozenset({"load", "loads", "JSONDecoder"})


def _json_reads(package: Path) -> list[str]:
    """Each use of the json module's readers in ``package`` (``json.loads(...)``, ``from json import load``)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "json":
                name = node.attr
            elif isinstance(node, ast.ImportFrom) and node.module == "json":
                name = next((a.name for a in node.names if a.name in JSON_READERS), "")
            else:
                continue
            if name in JSON_READERS:
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}: json.{name}")
    return found


def test_no_module_of_the_domain_reads_json() -> None:
    assert _json_reads(ROOT / "supervisor" / "domain") == []


def test_the_json_check_sees_a_read(tmp_path: Path) -> None:
    package = tmp_path / "domain"
    package.mkdir()
    (package / "_a.py").write_text("import json\n\nx = json.dumps({})\ny = json.loads('{}')\n")
    (package / "_b.py").write_text("from json import dumps, load\n")
    assert _json_reads(package) == ["domain/_a.py:4: json.loads", "domain/_b.py:1: json.load"]


def test_a_job_request_is_a_kinds_name_and_a_mapping_of_params() -> None:
    hints = typing.get_type_hints(JobRequest)
    assert hints["kind"] is str
    assert hints["params"] == Mapping[str, object] | None
