"""The OpenAPI 3.1 document of the control API (served at ``/api/openapi.json``): its ``paths`` made from the route
table (``_routes``: each route declared once, beside its handler), its fixed schemas written as data
(``_openapi_schemas``; the tests compare the ``Job`` schema with ``Job.public()``, so the two cannot drift apart
silently), and its enqueue body built here, per kind.

The document is a contract a fuzzer can hold the server to (schemathesis runs in ``make test``): what it calls
valid the server accepts, and what it calls invalid the server refuses. So the value rules are not restated here
but taken from the code that enforces them (the cursor and number patterns, the string limits), and the enqueue
body is built from the server's own kinds: one schema per kind, with exactly that kind's params.
"""

from __future__ import annotations

import copy
from typing import Any

from ..domain import (
    ASCII_FLOAT,
    INT64_MAX,
    INT64_MIN,
    INT_TEXT,
    MAX_FLOAT,
    MAX_STR_PARAM_LEN,
    URL_PATTERN,
    JobKind,
    KindCatalog,
    ParamRule,
)
from ._openapi_schemas import SCHEMAS
from ._route_table import anchored, ref

API_VERSION = "1"

# A str param: no NUL, not starting with '-' (the empty string is a value too).
_STR_PARAM = "^(?:[^\\x00-][^\\x00]*)?$"
# A bool param given as a string: true or false in any case (JSON Schema patterns have no inline flags).
_BOOL_TEXT = "^(?:[Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee])$"

_DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "Job supervisor control API",
        "version": API_VERSION,
        "description": (
            "Enqueue, inspect and cancel supervised pipeline jobs. Timestamps are ISO-8601 UTC. Errors are "
            '{"error": {"code", "message", "field", "request_id"}}. Every answer carries X-Request-Id. '
            "A POST carrying an Origin header (sent by a browser for a web page) is refused with 403 cross_origin."
        ),
    },
    # With PODCAST_JOB_API_TOKEN set, every operation without its own `security` needs the API token.
    "security": [{"apiToken": []}],
    "components": {
        "schemas": SCHEMAS,
        "securitySchemes": {
            "apiToken": {"type": "http", "scheme": "bearer", "description": "PODCAST_JOB_API_TOKEN (when set)"},
            "jobToken": {"type": "http", "scheme": "bearer", "description": "the job's own PODCAST_JOB_TOKEN"},
        },
    },
}


def _param_schema(type_name: str, rule: ParamRule | None = None) -> dict[str, Any]:
    """What ``JobKind.validate_params`` accepts for one param of ``type_name`` and its ``rule``: a JSON value, or a
    string in the exact spelling the server converts (the CLI sends every ``-p key=value`` as a string)."""
    rule = rule if rule is not None else ParamRule()
    if type_name == "str":
        schema: dict[str, Any] = {
            "type": "string",
            "maxLength": min(MAX_STR_PARAM_LEN, rule.max_length or MAX_STR_PARAM_LEN),
            "pattern": _STR_PARAM,
            "description": "valid Unicode text (no lone surrogate), without NUL, not starting with '-'",
        }
        if rule.choices is not None:
            schema["enum"] = list(rule.choices)
        if rule.format == "url":
            schema["allOf"] = [{"pattern": anchored(URL_PATTERN)}]
            schema["description"] += "; an http or https URL with a host"
        return schema
    if type_name == "int":
        typed: dict[str, Any] = {"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX}
        if rule.min is not None:
            typed["minimum"] = rule.min
        if rule.max is not None:
            typed["maximum"] = rule.max
        if rule.choices is not None:
            typed["enum"] = list(rule.choices)
        spelled = rule.int_pattern() if rule != ParamRule() else INT_TEXT.pattern
        return {"oneOf": [typed, {"type": "string", "pattern": anchored(spelled)}]}
    if type_name == "float":
        # A bound on a float given as text is checked after conversion; a pattern cannot state it.
        number = {"type": "number", "minimum": rule.min if rule.min is not None else -MAX_FLOAT}
        number["maximum"] = rule.max if rule.max is not None else MAX_FLOAT
        return {"oneOf": [number, {"type": "string", "pattern": anchored(ASCII_FLOAT.pattern)}]}
    return {"oneOf": [{"type": "boolean"}, {"type": "string", "pattern": _BOOL_TEXT}]}


def _enqueue_schemas(kind: JobKind, request: str, params_name: str) -> dict[str, dict[str, Any]]:
    """The body that enqueues ``kind`` (named ``request``): its name and exactly its declared params (the schema
    ``params_name``); those with a default optional."""
    properties: dict[str, Any] = {}
    for name, type_name in sorted(kind.params.items()):
        properties[name] = _param_schema(type_name, kind.param_rules.get(name))
        if name in kind.param_defaults:
            properties[name]["default"] = kind.param_defaults[name]
    required = sorted(set(kind.params) - set(kind.param_defaults))
    params = {"type": "object", "additionalProperties": False, "required": required, "properties": properties}
    # A kind that requires no param may omit params, or send null or {}.
    params_ref = ref(params_name) if required else {"oneOf": [ref(params_name), {"type": "null"}]}
    body = {  # no title: a generator would name its class by it, past the unique names below
        "type": "object",
        "additionalProperties": False,
        "required": ["kind", "params"] if required else ["kind"],
        "properties": {"kind": {"const": kind.name}, "params": params_ref},
    }
    return {request: body, params_name: params}


def _folded(name: str) -> str:
    """What a client generator's class (and module) name of ``name`` comes to, whatever its case and separators:
    ``Enqueue_my-kind`` and ``Enqueue_my_Kind`` are one ``EnqueueMyKind``."""
    return name.replace("_", "").replace("-", "").lower()


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``, ... : the first whose folded form no schema has yet (taken: added)."""
    chosen, n = name, 1
    while _folded(chosen) in taken:
        n += 1
        chosen = f"{name}_{n}"
    taken.add(_folded(chosen))
    return chosen


def document(kinds: KindCatalog, paths: dict[str, Any]) -> dict[str, Any]:
    """A fresh document of ``paths`` (the route table's) for a server running ``kinds``.

    The enqueue body is one schema per kind (``Enqueue_<kind>``, its params ``Enqueue_<kind>_params``): a kind the
    operator did not declare, or a param it does not take, is invalid in the document exactly as the server refuses
    it (422). Every schema is named once, and no two names come to one class name in a generated client.
    """
    document = copy.deepcopy(_DOCUMENT)
    document["paths"] = copy.deepcopy(paths)
    schemas = document["components"]["schemas"]
    taken = {_folded(name) for name in [*schemas, "EnqueueRequest"]}
    branches = []
    for name in kinds.names():
        request = _unique(f"Enqueue_{name}", taken)
        params_name = _unique(f"{request}_params", taken)
        schemas.update(_enqueue_schemas(kinds.get(name), request, params_name))
        # A generator names a param's own model (its choices: an enum) after it: no later kind may come to that name.
        taken.update(_folded(f"{params_name}_{param}") for param in kinds.get(name).params)
        branches.append(ref(request))
    schemas["EnqueueRequest"] = {
        "description": "a kind declared by the operator (or built in), with that kind's params",
        "oneOf": branches,
    }
    return document
