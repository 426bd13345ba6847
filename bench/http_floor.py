"""What an HTTP request costs on this machine with nothing behind it: the floor under scenario 6's heartbeats.

Usage: .venv/bin/python bench/http_floor.py quart|hypercorn|trio

Serves on 127.0.0.1 (a free port, printed as ``PORT <n>`` once it listens) until SIGTERM, answering every request
``204 No Content`` without looking at it:

- ``hypercorn``: an empty ASGI app on hypercorn's trio worker, stock classes and stock config (access log off, as
  the supervisor's). This is the server the supervisor runs on, with none of the supervisor's work: what each of its
  heartbeats costs at the least, and the most heartbeats per second one event loop can take on this machine.
- ``quart``: the stack's own floor under a heartbeat: a quart-trio app with one heartbeat-shaped route (``POST
  /api/jobs/<job_id>/heartbeat``: ``await request.get_json()``, answer 204), on hypercorn's trio worker with the
  supervisor's own server settings (``HttpLimits``' timeouts and head size, the ``_edge`` fixes). Everything a
  heartbeat costs beyond this is the supervisor's own work (token check, registry write, core).
- ``trio``: trio's own sockets and a few lines that find the end of each request, no HTTP library. Not a server
  anyone should run (it checks nothing); it shows what trio's scheduling and the socket calls cost, so the share of
  the HTTP library is the difference.

``footprint.py`` runs the same load generator against each and against the supervisor, in the same run.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

import trio

ROOT = str(Path(__file__).resolve().parents[1])  # the project, for the supervisor's own server settings
ANSWER = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n"
MAX_HEAD = 64 * 1024


async def empty_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def serve_hypercorn() -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, empty_app, config)
        print(f"PORT {binds[0].rsplit(':', 1)[1]}", flush=True)


async def serve_quart() -> None:
    from hypercorn.config import Sockets
    from hypercorn.trio.run import worker_serve
    from hypercorn.utils import wrap_app
    from quart import request
    from quart_trio import QuartTrio

    sys.path.insert(0, ROOT)
    from supervisor.api import _edge
    from supervisor.api._limits import HttpLimits
    from supervisor.api._serve import bind_socket, hypercorn_config

    limits = HttpLimits()
    app = QuartTrio(__name__, static_folder=None)
    app.config["BODY_TIMEOUT"] = limits.body_timeout_s
    app.config["RESPONSE_TIMEOUT"] = limits.response_timeout_s

    @app.post("/api/jobs/<job_id>/heartbeat")
    async def heartbeat(job_id: str) -> Any:
        await request.get_json()
        return "", 204

    # The supervisor's serve_http, with this app: the same server settings, the same socket options.
    _edge.install()
    config = hypercorn_config(limits)
    sock = bind_socket("127.0.0.1", 0)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    await worker_serve(
        wrap_app(app, config.wsgi_max_body_size, None),
        config,
        sockets=Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[]),
    )


async def answer_each(stream: trio.SocketStream) -> None:
    buf = b""
    while True:
        while b"\r\n\r\n" not in buf:
            data = await stream.receive_some(65536)
            if not data or len(buf) > MAX_HEAD:
                return
            buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            data = await stream.receive_some(65536)
            if not data:
                return
            rest += data
        buf = rest[length:]
        await stream.send_all(ANSWER)


async def serve_trio() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, answer_each, 0, host="127.0.0.1"))
        print(f"PORT {listeners[0].socket.getsockname()[1]}", flush=True)


def main() -> int:
    servers = {"quart": serve_quart, "hypercorn": serve_hypercorn, "trio": serve_trio}
    if len(sys.argv) != 2 or sys.argv[1] not in servers:
        print(__doc__, file=sys.stderr)
        return 2
    trio.run(servers[sys.argv[1]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
