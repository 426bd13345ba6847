"""The health route: is the server up, and what is degraded (the core's parts, and the HTTP server's own)."""

from __future__ import annotations

from typing import Any

from quart import current_app

from ..core import Supervisor
from ._route_table import RouteTable, json_answer, ref

HEALTH_ROUTES = RouteTable()


@HEALTH_ROUTES.get(
    "/api/health", "health", auth="public", responses={"200": json_answer(ref("Health"), "the server is up")}
)
async def health(supervisor: Supervisor) -> Any:
    """Liveness of the server, and what is degraded."""
    state = await supervisor.health()
    degraded = dict(state.degraded)
    http = current_app.extensions.get("supervisor.http_condition")
    condition = http.condition() if http is not None else None
    if condition is not None:
        degraded["http"] = condition
    body: dict[str, Any] = {
        "status": "degraded" if degraded else "ok",
        "boot_id": state.boot_id,
        "exec_mode": state.exec_mode,
        "paused": state.paused,
        "host_id": state.host_id,
        "leader": state.leader,
    }
    if degraded:
        body["degraded"] = degraded
    return body
