"""The HTTP control API: the quart-trio app, the edge of hypercorn's connections, the OpenAPI document."""

from ._openapi import JOBS_SUBROUTES, openapi_document

__all__ = ["JOBS_SUBROUTES", "openapi_document"]
