"""How the control API is served: a listening socket bound before anything starts (so jobs know the heartbeat URL,
and port 0 works), and hypercorn's trio worker with the edge fixes (``_edge``) and bounded timeouts."""

from __future__ import annotations

import socket
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from ..core import Supervisor
from ..domain import ApiToken, Credentials
from . import _edge
from ._app import create_app
from ._limits import HttpLimits


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind and listen before the startup sweep, so the heartbeat URL (and port 0) is known to jobs it starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def public_base_url(host: str, port: int) -> str:
    reach = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    reach = f"[{reach}]" if ":" in reach else reach
    return f"http://{reach}:{port}"


def hypercorn_config(limits: HttpLimits) -> HypercornConfig:
    """hypercorn's settings for the control API (``bench/http_floor.py``'s floor serves with the same)."""
    hconfig = HypercornConfig()
    hconfig.graceful_timeout = limits.graceful_timeout_s
    hconfig.keep_alive_timeout = limits.keep_alive_timeout_s
    hconfig.h11_max_incomplete_size = limits.max_head_bytes
    hconfig.accesslog = None
    hconfig.errorlog = None
    return hconfig


async def serve_http(
    supervisor: Supervisor,
    credentials: Credentials | ApiToken,
    sock: socket.socket,
    shutdown: trio.Event,
    done: trio.Event,
    *,
    limits: HttpLimits | None = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the control API on ``sock`` with hypercorn's trio worker until ``shutdown``; ``done`` is set once the
    server has stopped (its graceful deadline included). ``started()`` once it listens. ``limits``: the timeouts
    and the head size (``HttpLimits``' defaults unless given)."""
    # How connections end (close after Connection: close / HTTP/1.0 / early answers, keep-alive timeout, the error
    # format of the protocol's own 400/431/501, writes to clients that stop reading) is fixed in _edge: see its
    # docstring for hypercorn's defects.
    _edge.install()
    limits = limits if limits is not None else HttpLimits()
    hconfig = hypercorn_config(limits)
    app = create_app(supervisor, credentials, limits=limits)
    try:
        await worker_serve(
            wrap_app(app, hconfig.wsgi_max_body_size, None),
            hconfig,
            sockets=Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[]),
            shutdown_trigger=shutdown.wait,
            task_status=task_status,
        )
    finally:
        done.set()
