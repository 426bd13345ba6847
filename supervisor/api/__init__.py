"""The HTTP control API: the quart-trio app (``create_app``: HTTP only, every rule is the core's), how it is served
(``serve_http``: hypercorn's trio worker), the edge of hypercorn's connections (``_edge``: the fixes of its defects,
no parser of its own), and the OpenAPI document."""

from ._app import MAX_BATCH_BODY_BYTES, MAX_BODY_BYTES, PUBLIC_ENDPOINTS, REQUEST_ID_HEADER, FastRoutes, create_app
from ._openapi import JOBS_SUBROUTES, openapi_document
from ._serve import GRACEFUL_TIMEOUT_S, KEEP_ALIVE_TIMEOUT_S, MAX_HEAD_BYTES, bind_socket, public_base_url, serve_http

__all__ = [
    "GRACEFUL_TIMEOUT_S",
    "JOBS_SUBROUTES",
    "KEEP_ALIVE_TIMEOUT_S",
    "MAX_BATCH_BODY_BYTES",
    "MAX_BODY_BYTES",
    "MAX_HEAD_BYTES",
    "PUBLIC_ENDPOINTS",
    "REQUEST_ID_HEADER",
    "FastRoutes",
    "bind_socket",
    "create_app",
    "openapi_document",
    "public_base_url",
    "serve_http",
]
