"""What an HTTP request costs on this machine with nothing behind it: the floor under scenario 6's heartbeats.

Usage: .venv/bin/python bench/http_floor.py hypercorn|trio

Serves on 127.0.0.1 (a free port, printed as ``PORT <n>`` once it listens) until SIGTERM, answering every request
``204 No Content`` without looking at it:

- ``hypercorn``: an empty ASGI app on hypercorn's trio worker, stock classes and stock config (access log off, as
  the supervisor's). This is the server the supervisor runs on, with none of the supervisor's work: what each of its
  heartbeats costs at the least, and the most heartbeats per second one event loop can take on this machine.
- ``trio``: trio's own sockets and a few lines that find the end of each request, no HTTP library. Not a server
  anyone should run (it checks nothing); it shows what trio's scheduling and the socket calls cost, so the share of
  the HTTP library is the difference.

``footprint.py`` runs the same load generator against both and against the supervisor, in the same run.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import trio

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
    servers = {"hypercorn": serve_hypercorn, "trio": serve_trio}
    if len(sys.argv) != 2 or sys.argv[1] not in servers:
        print(__doc__, file=sys.stderr)
        return 2
    trio.run(servers[sys.argv[1]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
