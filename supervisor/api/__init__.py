"""The HTTP control API: the quart-trio app, the edge of hypercorn's connections, the OpenAPI document."""

from ._openapi import openapi_document

__all__ = ["openapi_document"]
