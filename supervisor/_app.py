"""The HTTP control API: a quart-trio app that only translates requests into calls on the core.

It holds no rule of supervision; every decision lives in ``_core.Supervisor``.
"""

from __future__ import annotations

from typing import Any

from quart_trio import QuartTrio

from ._core import Supervisor


def create_app(supervisor: Supervisor) -> QuartTrio:
    app = QuartTrio(__name__)

    @app.get("/api/health")
    async def health() -> Any:
        return {
            "status": "ok",
            "boot_id": supervisor.boot_id,
            "exec_mode": supervisor.config.exec_mode,
            "paused": await supervisor.is_paused(),
        }

    return app
