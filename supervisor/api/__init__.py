"""The HTTP control API: the quart-trio app (``create_app``: HTTP only, every rule is the core's), how it is served
(``serve_http``: hypercorn's trio worker), the edge of hypercorn's connections (``_edge``: the fixes of its defects,
no parser of its own), the route table (``ROUTES``: each route declared once, beside its handler) and the OpenAPI
document made from it."""

from ._app import REQUEST_ID_HEADER, create_app
from ._edge import EdgeH11Protocol, EdgeTCPServer
from ._limits import HttpLimits
from ._parse import MAX_BATCH_BODY_BYTES, MAX_BODY_BYTES, parse_batch, parse_bulk, parse_job, parse_page, parse_progress
from ._route_table import Route, RouteTable
from ._routes import CONVERTERS, JOBS_SUBROUTES, PUBLIC_ENDPOINTS, ROUTES, SCOPE_OF, openapi_document, routes_table
from ._serve import bind_socket, public_base_url, serve_http

__all__ = [
    "CONVERTERS",
    "JOBS_SUBROUTES",
    "MAX_BATCH_BODY_BYTES",
    "MAX_BODY_BYTES",
    "PUBLIC_ENDPOINTS",
    "REQUEST_ID_HEADER",
    "ROUTES",
    "SCOPE_OF",
    "EdgeH11Protocol",
    "EdgeTCPServer",
    "HttpLimits",
    "Route",
    "RouteTable",
    "bind_socket",
    "create_app",
    "openapi_document",
    "parse_batch",
    "parse_bulk",
    "parse_job",
    "parse_page",
    "parse_progress",
    "public_base_url",
    "routes_table",
    "serve_http",
]
