"""The routes of the queue: its state, and the operator's pause and resume of promotion."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..core import Supervisor
from ._route_table import RouteTable, error, json_answer, ref

QUEUE_ROUTES = RouteTable()

_QUEUE_STATE = {"200": json_answer(ref("QueueState"), "the queue")}


@QUEUE_ROUTES.get("/api/queue", "queueState", auth="read", over_registry=True, responses=_QUEUE_STATE)
async def queue(supervisor: Supervisor) -> Any:
    """The queue's state."""
    return dataclasses.asdict(await supervisor.queue_state())


@QUEUE_ROUTES.post("/api/queue/pause", "pauseQueue", auth="operator", over_registry=True, responses=_QUEUE_STATE)
async def pause(supervisor: Supervisor) -> Any:
    """Pause promotion (creates the pause flag file); running jobs continue."""
    return dataclasses.asdict(await supervisor.pause())


@QUEUE_ROUTES.post(
    "/api/queue/resume",
    "resumeQueue",
    auth="operator",
    over_registry=True,
    responses={**_QUEUE_STATE, "409": error("the pause flag cannot be removed (the message names it)")},
)
async def resume(supervisor: Supervisor) -> Any:
    """Resume promotion (removes the pause flag file) and drain."""
    return dataclasses.asdict(await supervisor.resume())
