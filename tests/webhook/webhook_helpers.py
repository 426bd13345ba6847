"""A real local webhook receiver (a small Trio HTTP/1.1 server on 127.0.0.1:0) and what tests need around it.

Its behaviour can be switched while it runs: answer 204, answer 500, redirect to itself (a loop), hang (never
answer), answer 204 slowly, or answer 200 with a huge body (streamed until the client stops reading).
Every request is recorded; tests wait for requests as events, never by sleeping.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from typing import Any, Literal

import h11
import trio

Behaviour = Literal["ok", "fail", "redirect", "hang", "slow", "huge"]
SECRET = "webhook-test-secret"
SLOW_S = 0.2  # how long a "slow" receiver takes to answer (below the tests' transport timeouts)
HUGE_BODY_BYTES = 1024**3  # what a "huge" answer announces; it sends until the client stops reading
_CHUNK = b"x" * 65536


@dataclasses.dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, Any]:
        payload: dict[str, Any] = json.loads(self.body)
        return payload

    def signed_by(self, secret: str) -> bool:
        """The documented verification: HMAC-SHA256 of the raw body, compared in constant time."""
        expected = "sha256=" + hmac.new(secret.encode(), self.body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, self.headers.get("x-podcast-signature", ""))


class Receiver:
    def __init__(self) -> None:
        self.behaviour: Behaviour = "ok"
        self.requests: list[Delivery] = []  # every attempt, whatever was answered
        self.accepted: list[Delivery] = []  # answered 2xx
        self.port = 0
        self.huge_sent: list[int] = []  # per "huge" answer: the body bytes the client let it send
        self._changed = trio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def events(self) -> list[dict[str, Any]]:
        """The accepted payloads, deduplicated on event_id (at-least-once delivery), in arrival order."""
        seen: dict[str, dict[str, Any]] = {}
        for delivery in self.accepted:
            payload = delivery.json()
            seen.setdefault(payload["event_id"], payload)
        return list(seen.values())

    async def wait_for(self, predicate: Any) -> None:
        while not predicate(self):
            await self._changed.wait()

    def _note(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _send_huge(self, stream: trio.SocketStream, conn: h11.Connection) -> None:
        """200 announcing HUGE_BODY_BYTES, then body until the client closes the connection (a client that read it
        all would hold a GiB): how much it let through is recorded."""
        headers = [("Content-Length", str(HUGE_BODY_BYTES))]
        await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
        self.huge_sent.append(0)
        self._note()
        try:
            while self.huge_sent[-1] < HUGE_BODY_BYTES:
                await stream.send_all(conn.send(h11.Data(data=_CHUNK)))
                self.huge_sent[-1] += len(_CHUNK)
        finally:
            self._note()

    async def handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                head: h11.Request | None = None
                body = bytearray()
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await stream.receive_some(65536)
                        if not data:
                            return
                        conn.receive_data(data)
                    elif isinstance(event, h11.Request):
                        head = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        break
                    else:
                        return
                assert head is not None
                delivery = Delivery({k.decode().lower(): v.decode() for k, v in head.headers}, bytes(body))
                self.requests.append(delivery)
                behaviour = self.behaviour
                if behaviour == "hang":
                    self._note()
                    await trio.sleep_forever()
                if behaviour == "slow":
                    await trio.sleep(SLOW_S)  # a receiver that takes its time, within the sender's bounds
                if behaviour in ("ok", "slow", "huge"):
                    self.accepted.append(delivery)
                if behaviour == "huge":
                    await self._send_huge(stream, conn)
                    return
                status, headers = {
                    "ok": (204, []),
                    "slow": (204, []),
                    "fail": (500, [("Content-Length", "0")]),
                    "redirect": (307, [("Location", self.url), ("Content-Length", "0")]),
                }[behaviour]
                await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)))
                await stream.send_all(conn.send(h11.EndOfMessage()))
                self._note()
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError, h11.LocalProtocolError):
            pass
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()


# Kinds for the webhook tests. `quiet` beats once (progress 1), goes quiet, beats again (progress 2), then exits 0.
_BEAT = (
    "def beat(units):\n"
    "    req = urllib.request.Request(os.environ['PODCAST_JOB_HEARTBEAT_URL'], method='POST',\n"
    "        data=json.dumps({'completed_units': units}).encode(),\n"
    "        headers={'Authorization': 'Bearer ' + os.environ['PODCAST_JOB_TOKEN'],"
    " 'Content-Type': 'application/json'})\n"
    "    urllib.request.urlopen(req, timeout=10).read()\n"
)
KINDS = f"""
[kinds.exit]
argv = ["{{python}}", "-c", "import sys; sys.exit(int(sys.argv[1]))", "{{code}}"]
params = {{ code = "int" }}

[kinds.sleep]
argv = ["{{python}}", "-c", "import sys, threading; threading.Event().wait(float(sys.argv[1]))", "{{seconds}}"]
params = {{ seconds = "float" }}

[kinds.quiet]
argv = ["{{python}}", "-c", '''
import json, os, sys, threading, urllib.request
{_BEAT}
beat(1)
threading.Event().wait(float(sys.argv[1]))
beat(2)
threading.Event().wait(1.0)
''', "{{quiet_s}}"]
params = {{ quiet_s = "float" }}
"""


def statuses(events: list[dict[str, Any]], job_id: str) -> list[str]:
    """A job's events in arrival order, as `job.transition:<status>` or the event's own name."""
    out = []
    for payload in events:
        if payload["job"]["job_id"] != job_id:
            continue
        name = payload["event"]
        out.append(f"{name}:{payload['job']['status']}" if name == "job.transition" else name)
    return out
