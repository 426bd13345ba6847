"""A standard client generator (openapi-python-client, pinned in constraints.txt) makes a whole typed client from the
live document (``GET /api/openapi.json`` of a real served app): no warning, no model dropped, a module for every
operation, and every request body a model of its own -- one per kind for the enqueue, one per shape for the bulk body.
The generated client then enqueues through the live server with its own typed model.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from api_support import MakeLive

pytestmark = pytest.mark.e2e

GENERATE_S = 120.0
PACKAGE = "job_client"


def folded(name: str) -> str:
    """A name as the generator's class or module name comes to, without case or separators."""
    return name.replace("_", "").replace("-", "").lower()


def ref_name(schema: dict[str, Any]) -> str:
    return str(schema["$ref"]).removeprefix("#/components/schemas/")


def body_annotation(module: Path) -> set[str]:
    """The names in the annotation of ``body`` of a generated operation module's ``_get_kwargs``."""
    tree = ast.parse(module.read_text())
    [kwargs] = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "_get_kwargs"]
    [body] = [arg for arg in kwargs.args.args + kwargs.args.kwonlyargs if arg.arg == "body"]
    assert body.annotation is not None
    return {node.id for node in ast.walk(body.annotation) if isinstance(node, ast.Name)}


async def test_a_generated_client_has_every_operation_and_every_body_typed(make_live: MakeLive, tmp_path: Path) -> None:
    live = await make_live()
    async with httpx.AsyncClient(timeout=10.0) as http:
        doc = (await http.get(f"{live.url}/api/openapi.json")).json()
    config = tmp_path / "generator.json"
    # No post hooks: the generator's own formatting run (ruff) is no part of what the document gives a client.
    config.write_text(json.dumps({"post_hooks": [], "package_name_override": PACKAGE}))
    out = tmp_path / PACKAGE
    argv = [sys.executable, "-m", "openapi_python_client", "generate", "--url", f"{live.url}/api/openapi.json",
            "--meta", "none", "--config", str(config), "--output-path", str(out)]  # fmt: skip
    with trio.fail_after(GENERATE_S):
        done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False, cwd=tmp_path)
    said = (done.stdout + done.stderr).decode()
    assert done.returncode == 0, said
    assert "Warning" not in said and "Unable to process" not in said, said

    # A model for every object schema: none dropped.
    models = {folded(path.stem): path for path in (out / "models").glob("*.py") if path.stem != "__init__"}
    schemas: dict[str, Any] = doc["components"]["schemas"]
    objects = [name for name, schema in schemas.items() if "object" in schema.get("type", ())]
    assert objects and sorted(name for name in objects if folded(name) not in models) == []

    # A module for every operation, and each JSON body typed by the models the document names for it.
    operations = [op for item in doc["paths"].values() for op in item.values() if "operationId" in op]
    modules = {folded(path.stem): path for path in (out / "api").rglob("*.py") if path.stem != "__init__"}
    assert sorted(op["operationId"] for op in operations if folded(op["operationId"]) not in modules) == []
    bodies = []
    for op in operations:
        body = op.get("requestBody", {}).get("content", {}).get("application/json")
        if body is None:
            continue
        bodies.append(op["operationId"])
        named = schemas[ref_name(body["schema"])]
        expected = [ref_name(branch) for branch in named["oneOf"]] if "oneOf" in named else [ref_name(body["schema"])]
        typed = {folded(name) for name in body_annotation(modules[folded(op["operationId"])])}
        assert typed == {folded(name) for name in expected}, op["operationId"]
    assert {"enqueue", "enqueueBatch", "bulkAction", "heartbeat"} <= set(bodies)
    kinds = {schemas[ref_name(branch)]["properties"]["kind"]["const"] for branch in schemas["EnqueueRequest"]["oneOf"]}
    assert {"pipeline", "enrichment", "echo"} <= kinds
    assert {folded(ref_name(branch)) for branch in schemas["BulkRequest"]["oneOf"]} <= set(models)

    # And the client works: a typed enqueue through the live server, answered and parsed.
    echo = next(ref_name(b) for b in schemas["EnqueueRequest"]["oneOf"] if ref_name(b).endswith("echo"))
    model = models[folded(echo)].stem
    script = f"""
import importlib, sys
from {PACKAGE} import Client
from {PACKAGE}.api.default import enqueue
module = importlib.import_module("{PACKAGE}.models.{model}")
body = next(getattr(module, name) for name in dir(module) if name.lower() == "{model}".replace("_", ""))
answer = enqueue.sync_detailed(client=Client(base_url="{live.url}"), body=body.from_dict(
    {{"kind": "echo", "params": {{"text": "hi"}}}}))
print(answer.status_code, answer.parsed.job_id)
"""
    with trio.fail_after(GENERATE_S):
        ran = await trio.run_process([sys.executable, "-c", script], capture_stdout=True, capture_stderr=True,
                                     check=False, cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr.decode()
    status, job_id = ran.stdout.decode().split()
    assert status == "202"
    assert (await live.supervisor.get(job_id)).params == {"text": "hi"}
