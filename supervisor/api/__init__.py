"""The HTTP control API: the quart-trio app (``create_app``: HTTP only, every rule is the core's), how it is served
(``serve_http``: hypercorn's trio worker), the edge of hypercorn's connections (``_edge``: the fixes of its defects,
no parser of its own), and the OpenAPI document."""

from ._app import (
    MAX_BATCH_BODY_BYTES,
    MAX_BODY_BYTES,
    PUBLIC_ENDPOINTS,
    REQUEST_ID_HEADER,
    create_app,
)
from ._edge import EdgeH11Protocol, EdgeTCPServer
from ._limits import HttpLimits
from ._openapi import JOBS_SUBROUTES, openapi_document
from ._serve import bind_socket, public_base_url, serve_http

__all__ = [
    "JOBS_SUBROUTES",
    "MAX_BATCH_BODY_BYTES",
    "MAX_BODY_BYTES",
    "PUBLIC_ENDPOINTS",
    "REQUEST_ID_HEADER",
    "EdgeH11Protocol",
    "EdgeTCPServer",
    "HttpLimits",
    "bind_socket",
    "create_app",
    "openapi_document",
    "public_base_url",
    "serve_http",
]
