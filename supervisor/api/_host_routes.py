"""The routes of the fleet's hosts: list them, forget one that will never come back, drain and undrain one."""

from __future__ import annotations

from typing import Any

from ..core import Supervisor
from ._parse import caller_name
from ._route_table import RouteTable, error, json_answer, ref

HOST_ROUTES = RouteTable()


@HOST_ROUTES.get("/api/hosts", "listHosts", auth="read", responses={"200": json_answer(ref("Hosts"), "the hosts")})
async def hosts(supervisor: Supervisor) -> Any:
    """The fleet's hosts (live or silent) and its leader."""
    return await supervisor.hosts()


@HOST_ROUTES.post(
    "/api/hosts/{host_id}/forget",
    "forgetHost",
    auth="operator",
    responses={
        "200": json_answer(ref("ForgetHostResult"), "what was ended"),
        "404": error("no host with that id"),
        "409": error("the host holds a live lease, or is this supervisor"),
    },
)
async def forget_host(supervisor: Supervisor, host_id: str) -> Any:
    """A host that will never come back: its running jobs end orphan_host_forgotten, slots freed."""
    return await supervisor.forget_host(host_id)


_DRAIN = {
    "200": json_answer(ref("DrainHostResult"), "the host's drain now"),
    "404": error("no host with that id has registered"),
}


@HOST_ROUTES.post("/api/hosts/{host_id}/drain", "drainHost", auth="operator", over_registry=True, responses=_DRAIN)
async def drain_host(supervisor: Supervisor, host_id: str) -> Any:
    """The host starts nothing new; its running jobs run to their end under its watch; it hands the lead over."""
    return await supervisor.drain_host(host_id, True, caller_name())


@HOST_ROUTES.post("/api/hosts/{host_id}/undrain", "undrainHost", auth="operator", over_registry=True, responses=_DRAIN)
async def undrain_host(supervisor: Supervisor, host_id: str) -> Any:
    """The host promotes again."""
    return await supervisor.drain_host(host_id, False, caller_name())
