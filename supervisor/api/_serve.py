"""How the control API is served: a listening socket bound before anything starts (so jobs know the heartbeat URL,
and port 0 works), and hypercorn's trio worker with the edge fixes (``_edge``) and bounded timeouts."""

from __future__ import annotations

import functools
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import hypercorn.trio.run
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.utils import wrap_app

from ..core import Supervisor
from ..domain import ApiToken, Credentials
from ..observe import get_logger
from . import _edge
from ._app import create_app
from ._limits import HttpLimits

log = get_logger()


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


def hypercorn_config(limits: HttpLimits, edge: _edge.EdgeState | None = None) -> HypercornConfig:
    """hypercorn's settings for the control API (``bench/http_floor.py``'s floor serves with the same), carrying the
    edge's state (``edge``; a new one from ``limits`` unless given)."""
    hconfig = _edge.EdgeConfig(edge if edge is not None else _edge.EdgeState(limits))
    hconfig.graceful_timeout = limits.graceful_timeout_s
    hconfig.keep_alive_timeout = limits.keep_alive_timeout_s
    hconfig.h11_max_incomplete_size = limits.max_head_bytes
    hconfig.accesslog = None
    hconfig.errorlog = None
    return hconfig


# The HTTP server is a supervised child: ended by itself (anything but the shutdown), it is started again after this
# long, doubled at each failure in a row up to the most; a run that served this long resets the delay.
RESTART_MIN_S = 0.1
RESTART_MAX_S = 5.0
RESTART_RESET_AFTER_S = 30.0


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
    server has stopped (its graceful deadline included). ``started()`` once it listens. ``limits``: the timeouts,
    the head size and the edge's bounds (``HttpLimits``' defaults unless given).

    Error boundary: the server is a supervised child. If it ends for any reason but the shutdown (a defect of the
    HTTP stack that escaped the connections' own boundary), it is started again on the same socket after
    ``RESTART_MIN_S`` (doubling while it keeps failing, at most ``RESTART_MAX_S``), with an ERROR
    ``http_server_restarted`` and ``podcast_http_server_restarts_total``; connections made meanwhile wait in the
    socket's backlog. Nothing else depends on this task: the monitors, the sweeper and the heartbeat writer are its
    siblings in the root nursery, and keep every job watched throughout. A failure before it first listens (a bad
    config) is raised: there is nothing to restart."""
    # How connections end (close after Connection: close / HTTP/1.0 / early answers, keep-alive timeout, the error
    # format of the protocol's own 400/431/501, writes to clients that stop reading, a connection's own error, the
    # connection and unsent-bytes bounds) is fixed in _edge: see its docstring for hypercorn's defects.
    _edge.install()
    limits = limits if limits is not None else HttpLimits()
    edge = _edge.EdgeState(limits)
    supervisor.metrics_registry.register(edge)
    hconfig = hypercorn_config(limits, edge)
    app = create_app(supervisor, credentials, limits=limits, edge=edge)
    try:
        await _serve_until_shutdown(
            functools.partial(_serve_once, app, hconfig, sock, shutdown), edge, shutdown, task_status
        )
    finally:
        done.set()


async def _serve_once(
    app: Any, hconfig: HypercornConfig, sock: socket.socket, shutdown: trio.Event, *, task_status: Any
) -> None:
    """One run of hypercorn's trio worker on ``sock``, until ``shutdown`` or until it ends by itself."""
    # A duplicate of the listening socket for each run: serve_listeners closes what it is given, and the socket
    # (with its backlog) must outlive every run.
    listener = sock.dup()
    try:
        await hypercorn.trio.run.worker_serve(
            wrap_app(app, hconfig.wsgi_max_body_size, None),
            hconfig,
            sockets=Sockets(secure_sockets=[], insecure_sockets=[listener], quic_sockets=[]),
            shutdown_trigger=shutdown.wait,
            task_status=task_status,
        )
    finally:
        listener.close()


async def _serve_until_shutdown(
    serve_once: Callable[..., Awaitable[None]], edge: _edge.EdgeState, shutdown: trio.Event, task_status: Any
) -> None:
    """``serve_once`` run again and again until ``shutdown``: the supervised restart loop (``serve_http``'s error
    boundary). ``task_status.started()`` once the first run listens; a failure before that is raised."""
    started = False
    delay_s = RESTART_MIN_S
    while True:
        began = trio.current_time()
        failure: Exception | None = None
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_once)
                if not started:
                    task_status.started()
                    started = True
                edge.serving = True
        except Exception as exc:
            if not started:
                raise
            failure = exc
        finally:
            edge.serving = False
        if shutdown.is_set():
            return
        if trio.current_time() - began >= RESTART_RESET_AFTER_S:
            delay_s = RESTART_MIN_S
        _say_restarted(edge, failure, delay_s)
        with trio.move_on_after(delay_s):
            await shutdown.wait()  # a stop asked during the backoff ends it at once
        if shutdown.is_set():
            return
        delay_s = min(delay_s * 2, RESTART_MAX_S)


def _say_restarted(edge: _edge.EdgeState, failure: Exception | None, delay_s: float) -> None:
    """The restart counted (``/api/health`` degraded for a while, the metric) and logged as an ERROR."""
    edge.restarted(failure)
    log.error(
        "http_server_restarted",
        error=f"{type(failure).__name__}: {failure}" if failure is not None else "it returned",
        restart_in_s=delay_s,
        restarts=edge.server_restarts,
        effect="requests wait in the socket's backlog meanwhile; every job stays watched",
        exc_info=failure,
    )
