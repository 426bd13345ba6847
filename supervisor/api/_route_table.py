"""How a route of the control API is declared: once, beside its handler, with what the OpenAPI document says of it.

A declaration names the method, the path (an OpenAPI template, ``/api/jobs/{job_id}``), who may call it (``auth``:
the scope an API token needs, ``read``, ``enqueue`` or ``operator``; or ``job``, the job's own token; or ``public``),
its parameters, body and answers. From the table of declarations follow the app's route map (``create_app``), the
routes that need no API token, the OpenAPI document's ``paths`` (``openapi_document``) and the route table of
``docs/api.md`` (``tools/doc_tables.py``): none of them lists a route of its own.

What every route of a kind answers is added here, not written per route: a route that takes an API token may
answer 401, and 403 to a token of too small a scope (above ``read``); every POST answers 403 to a web page (an
``Origin`` header); a route with a JSON body answers 400, 413
and 415; a route over the registry answers 503 with ``Retry-After`` when the registry cannot take the request.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ..domain import SCOPES, Scope

# Who may call a route: an API token of at least this scope (once the server has any token), the job's own token,
# or anyone (the probes). Every route says which: there is no default.
Auth = Literal["read", "enqueue", "operator", "job", "public"]
Handler = Callable[..., Awaitable[Any]]


def anchored(pattern: str) -> str:
    """A Python ``fullmatch`` pattern as a JSON Schema pattern (which matches anywhere unless anchored)."""
    return f"^(?:{pattern})$"


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def json_answer(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def error(description: str) -> dict[str, Any]:
    return json_answer(ref("Error"), description)


def text_answer(description: str, content_type: str = "text/plain") -> dict[str, Any]:
    return {"description": description, "content": {content_type: {"schema": {"type": "string"}}}}


UNAUTHORIZED = error("missing, unknown or revoked API token")
CROSS_ORIGIN = error("the request carries an Origin header (a web page sent it)")
FORBIDDEN = {
    **error(
        "the request carries an Origin header (a web page sent it), or the token's scope is too small "
        "(error.code insufficient_scope; the message and WWW-Authenticate name the scope needed)"
    ),
    "headers": {
        "WWW-Authenticate": {
            "schema": {"type": "string"},
            "description": 'on insufficient_scope: Bearer error="insufficient_scope", scope="<the scope needed>"',
        }
    },
}
NOT_FOUND = error("no job with that id")
INVALID = error("a field or query value is invalid; error.field names it")
# A registry that cannot take the request (its disk full, its file locked past the busy timeout, read-only or
# removed) is a 503 with Retry-After, never a 500 and never a lost write.
UNAVAILABLE = {
    **error("the registry cannot take the request now; nothing was changed: retry after Retry-After seconds"),
    "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds to wait before a retry"}},
}
_BODY_ANSWERS = {
    "400": error("the body is not valid JSON"),
    "413": error("the body is too large"),
    "415": error("the body is not application/json"),
}
_SECURITY: dict[str, list[dict[str, list[str]]]] = {
    **{scope: [{"apiToken": [scope]}] for scope in SCOPES},  # the scope the route needs
    "job": [{"jobToken": []}],
    "public": [],
}
_PARAM = re.compile(r"\{([^{}]+)\}")


@dataclass(frozen=True)
class Route:
    """One route: how it is reached, who may call it, and what it takes and answers (OpenAPI objects)."""

    method: Literal["GET", "POST"]
    path: str
    operation_id: str
    handler: Handler
    auth: Auth
    parameters: tuple[dict[str, Any], ...] = ()
    body: str | None = None  # the schema (components/schemas) of its JSON body
    responses: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    over_registry: bool = False
    description: str | None = None
    # A path parameter matched by a werkzeug converter of the app's other than the default (one segment).
    converters: Mapping[str, str] = field(default_factory=dict)

    @property
    def scope(self) -> Scope | None:
        """The scope an API token needs (None: the route takes no API token)."""
        return self.auth if self.auth in SCOPES else None

    @property
    def endpoint(self) -> str:
        """The app's name for the route (its handler's)."""
        return self.handler.__name__

    @property
    def summary(self) -> str:
        """The handler's one-line docstring."""
        return (self.handler.__doc__ or "").strip()

    @property
    def rule(self) -> str:
        """The path as a werkzeug rule: ``{job_id}`` becomes ``<job_id>`` (or ``<conv:job_id>``)."""

        def werkzeug(match: re.Match[str]) -> str:
            name = match.group(1)
            converter = self.converters.get(name)
            return f"<{converter}:{name}>" if converter else f"<{name}>"

        return _PARAM.sub(werkzeug, self.path)

    @property
    def path_parameters(self) -> tuple[str, ...]:
        return tuple(_PARAM.findall(self.path))

    def clashes_with(self, other: Route) -> bool:
        """The two are one route declared twice: the same method and path, the same endpoint or operation id."""
        same_route = (self.method, self.path) == (other.method, other.path)
        return same_route or self.endpoint == other.endpoint or self.operation_id == other.operation_id

    def answers(self) -> dict[str, dict[str, Any]]:
        """Its responses, with those every route of its kind gives (see the module's docstring)."""
        out: dict[str, dict[str, Any]] = {}
        if self.body is not None:
            out.update(_BODY_ANSWERS)
        if self.scope is not None:
            out["401"] = UNAUTHORIZED
        if self.scope not in (None, "read"):
            out["403"] = FORBIDDEN
        elif self.method == "POST":
            out["403"] = CROSS_ORIGIN
        if self.over_registry:
            out["503"] = UNAVAILABLE
        out.update(self.responses)  # a route's own description of a status wins
        return dict(sorted(out.items()))

    def operation(self, path_schemas: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
        """The OpenAPI operation object; ``path_schemas``: the schema of a path parameter, by its converter."""
        op: dict[str, Any] = {"operationId": self.operation_id, "summary": self.summary}
        if self.description:
            op["description"] = self.description
        op["security"] = _SECURITY[self.auth]
        parameters = [
            {
                "name": name,
                "in": "path",
                "required": True,
                "schema": path_schemas.get(self.converters.get(name, ""), {"type": "string", "minLength": 1}),
            }
            for name in self.path_parameters
        ]
        parameters += [dict(p) for p in self.parameters]
        if parameters:
            op["parameters"] = parameters
        if self.body is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref(self.body)}}}
        op["responses"] = self.answers()
        return op


class RouteTable:
    """The declarations, in order; ``get``/``post`` declare the handler they decorate."""

    def __init__(self) -> None:
        self._routes: list[Route] = []

    @classmethod
    def joined(cls, *tables: RouteTable) -> RouteTable:
        """One table of the routes of ``tables``, in their order (each resource's routes are declared in a module of
        their own); a route declared in two of them is refused as within one."""
        table = cls()
        for route in itertools.chain.from_iterable(tables):
            table._add(route)
        return table

    def __iter__(self) -> Iterator[Route]:
        return iter(self._routes)

    def get(self, path: str, operation_id: str, *, auth: Auth, **declared: Any) -> Callable[[Handler], Handler]:
        return self._declare("GET", path, operation_id, {"auth": auth, **declared})

    def post(self, path: str, operation_id: str, *, auth: Auth, **declared: Any) -> Callable[[Handler], Handler]:
        return self._declare("POST", path, operation_id, {"auth": auth, **declared})

    def _declare(
        self, method: Literal["GET", "POST"], path: str, operation_id: str, declared: dict[str, Any]
    ) -> Callable[[Handler], Handler]:
        def add(handler: Handler) -> Handler:
            route = Route(method, path, operation_id, handler, **declared)
            if route.auth not in get_args(Auth):
                raise TypeError(f"{method} {path}: auth {route.auth!r} is not one of {get_args(Auth)}")
            if not route.summary or "\n" in route.summary:
                raise TypeError(f"{handler.__name__}: a route's handler needs a one-line docstring (its summary)")
            self._add(route)
            return handler

        return add

    def _add(self, route: Route) -> None:
        if any(route.clashes_with(r) for r in self._routes):
            raise TypeError(f"{route.method} {route.path} ({route.operation_id}) is declared twice")
        self._routes.append(route)

    def scopes(self) -> dict[str, Scope | None]:
        """Each endpoint's scope (None: it takes no API token: the probes, and the heartbeat, which takes the job's)."""
        return {r.endpoint: r.scope for r in self._routes}

    def fixed_segments(self, prefix: str) -> tuple[str, ...]:
        """The names of the fixed routes one segment below ``prefix`` (``/api/jobs/``: batch, prune, reconcile)."""
        names = {r.path[len(prefix) :] for r in self._routes if r.path.startswith(prefix)}
        return tuple(sorted(n for n in names if n and "/" not in n and "{" not in n))

    def markdown(self) -> str:
        """The route table of ``docs/api.md``: each route, who may call it, what it takes and answers."""
        who: dict[str, str] = {scope: f"`{scope}` token" for scope in SCOPES}
        who.update({"job": "the job's token", "public": "anyone"})
        lines = ["| route | does | who | takes | answers |", "|---|---|---|---|---|"]
        for route in self._routes:
            takes = [f"`{route.body}` body"] if route.body else []
            takes += [f"{_names(p)} ({p['in']})" for p in route.parameters]
            answers = route.answers()
            success = [
                f"{code} {_shape(answer)}{answer['description']}" for code, answer in answers.items() if code < "300"
            ]
            errors = ", ".join(code for code in answers if code >= "300")
            cells = [
                f"`{route.method} {route.path}`",
                route.summary.replace("|", "\\|"),
                who[route.auth],
                ", ".join(takes) or "—",
                "; ".join(success) + (f"; else {errors}" if errors else ""),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def paths(self, path_schemas: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """The OpenAPI document's ``paths``."""
        out: dict[str, dict[str, Any]] = {}
        for route in self._routes:
            out.setdefault(route.path, {})[route.method.lower()] = route.operation(path_schemas)
        return out


def _shape(answer: Mapping[str, Any]) -> str:
    """The schema an answer's JSON body has, as ``Name``: (or what else it is), for the route table."""
    for content_type, media in answer.get("content", {}).items():
        target = media.get("schema", {}).get("$ref", "")
        if target:
            return f"`{target.rsplit('/', 1)[1]}`: "
        return f"`{content_type}`: "
    return ""


def _names(parameter: Mapping[str, Any]) -> str:
    """A parameter's name; an exploded form object is sent as its properties, one of which may be given."""
    properties = parameter["schema"].get("properties") if parameter.get("explode") else None
    if properties:
        return " or ".join(f"`{name}`" for name in properties)
    return f"`{parameter['name']}`"
