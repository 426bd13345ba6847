"""Every route of the control API, each declared once beside its handler (``_route_table``), one module per
resource (``_health_routes``, ``_job_routes``, ``_host_routes``, ``_queue_routes``, ``_log_heartbeat_routes``,
``_event_routes``), joined here in one table (``ROUTES``) with the routes of what the server says of itself: its
OpenAPI document, made from that table, and its metrics.

A handler only translates: it reads the request (``_parse``), calls the core, and shapes the answer. Each takes the
``Supervisor`` first and the path's parameters by name; its one-line docstring is the route's summary.
"""

from __future__ import annotations

import re
from typing import Any

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4
from quart import Response
from werkzeug.routing import BaseConverter

from ..core import Supervisor
from ..domain import KindCatalog
from . import _openapi
from ._event_routes import EVENT_ROUTES
from ._health_routes import HEALTH_ROUTES
from ._host_routes import HOST_ROUTES
from ._job_routes import JOB_ROUTES
from ._log_heartbeat_routes import LOG_HEARTBEAT_ROUTES
from ._queue_routes import QUEUE_ROUTES
from ._route_table import RouteTable, text_answer

SERVER_ROUTES = RouteTable()


@SERVER_ROUTES.get(
    "/api/openapi.json",
    "openapi",
    auth="read",
    responses={"200": {"description": "OpenAPI 3.1", "content": {"application/json": {}}}},
)
async def openapi(supervisor: Supervisor) -> Any:
    """This API's OpenAPI document."""
    return openapi_document(supervisor.kinds)


@SERVER_ROUTES.get(
    "/metrics",
    "metrics",
    auth="public",
    responses={"200": text_answer("Prometheus text format 0.0.4")},
)
async def metrics(supervisor: Supervisor) -> Any:
    """Prometheus metrics."""
    return Response(await supervisor.render_metrics(), status=200, content_type=CONTENT_TYPE_PLAIN_0_0_4)


# In the order of the route table of docs/api.md and of the OpenAPI document's paths.
ROUTES = RouteTable.joined(
    HEALTH_ROUTES, JOB_ROUTES, HOST_ROUTES, QUEUE_ROUTES, LOG_HEARTBEAT_ROUTES, EVENT_ROUTES, SERVER_ROUTES
)

# The fixed routes under /api/jobs/. A fixed path outranks a template, so no job id is one of these names: the
# app's job_id converter refuses them, and showJob's parameter says so.
JOBS_SUBROUTES = ROUTES.fixed_segments("/api/jobs/")
# The scope each route needs of an API token (None: reachable without one: the probes, health and metrics, and the
# job's own heartbeat, which authenticates with the job token instead).
SCOPE_OF = ROUTES.scopes()
PUBLIC_ENDPOINTS = frozenset(endpoint for endpoint, scope in SCOPE_OF.items() if scope is None)


class JobIdConverter(BaseConverter):
    """The job id of ``/api/jobs/<job_id>``: one path segment, never a fixed route's name (``reconcile``, ``batch``).

    A fixed path outranks a template, in OpenAPI as in the document: ``/api/jobs/reconcile`` is the reconcile route
    for every method. Without this, ``GET /api/jobs/reconcile`` matched ``GET /api/jobs/<job_id>`` (404, "no such
    job") and ``OPTIONS`` advertised that GET; now it is a 405 whose ``Allow`` says POST. (Job ids are uuid hex: none
    is lost.)
    """

    regex = rf"(?!(?:{'|'.join(map(re.escape, JOBS_SUBROUTES))})$)[^/]+"


# The converters the declarations name (``converters=``), which the app installs.
CONVERTERS: dict[str, type[BaseConverter]] = {"job_id": JobIdConverter}


def openapi_document(kinds: KindCatalog) -> dict[str, Any]:
    """A fresh OpenAPI document of these routes for a server running ``kinds`` (callers may change theirs)."""
    path_schemas = {"job_id": {"type": "string", "minLength": 1, "not": {"enum": list(JOBS_SUBROUTES)}}}
    return _openapi.document(kinds, ROUTES.paths(path_schemas))


def routes_table() -> str:
    """The route table of ``docs/api.md`` (``tools/doc_tables.py`` writes it there; a test holds the page to it)."""
    return ROUTES.markdown()
