"""The route of the event stream: job events (the webhook's payloads) as server-sent events, resumable with
``Last-Event-ID``, with keep-alives that also find a reader that stopped reading."""

from __future__ import annotations

from typing import Any

import trio
from quart import Response, request

from ..core import Supervisor
from ..domain import ValidationError
from ..observe import EVENT_NAMES, GAP, LAST_EVENT_ID, StreamEnded, StreamEvent, Subscription
from ._parse import bool_query
from ._route_table import RouteTable, error, text_answer

EVENT_ROUTES = RouteTable()

# How long a browser's EventSource waits before it reconnects after a dropped connection.
SSE_RETRY_MS = 2000
# A keep-alive comment, padded: a reader that reads nothing (a CLI suspended with Ctrl-Z) is seen only once its
# kernel's receive buffer is full -- until then its kernel takes every byte for it -- and then the edge cuts the
# write that stalls (HttpLimits.write_stall_timeout_s), freeing its slot. 16 KiB a keep-alive fill the two kernels'
# usual buffers in about a dozen keep-alives (13 s at a 1 s keep-alive, measured; about three minutes at the 15 s
# default), at about 1 KiB/s per idle reader.
KEEPALIVE = b":" + b" " * (16 * 1024) + b"keep-alive\n\n"


@EVENT_ROUTES.get(
    "/api/events",
    "events",
    auth="read",
    description=(
        "text/event-stream. Each event: `id: <boot_id>-<n>` (numbered per boot), `event: <name>`, and one `data:` "
        "line of JSON, the webhook's body with `event_id` = the id. `: keep-alive` comments every "
        "PODCAST_JOB_EVENTS_KEEPALIVE_SECONDS while idle. Resume with the `Last-Event-ID` header: every later event "
        f"still held is sent once, in order; when some may be missing (pushed out of the replay ring, or the id is "
        f"another boot's) a `{GAP}` event without an id comes first, with "
        '`{"reason": "evicted" | "restarted", "last_event_id", "boot_id", "oldest_event_id"}`. A reader whose queue '
        "(PODCAST_JOB_EVENTS_CLIENT_BUFFER_EVENTS) fills up is disconnected."
    ),
    parameters=(
        {
            "name": "job",
            "in": "query",
            "style": "form",
            "explode": True,
            "description": "only this job's events (repeatable: any of them)",
            "schema": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 200}},
        },
        {
            "name": "kind",
            "in": "query",
            "style": "form",
            "explode": True,
            "description": "only events of this name (repeatable: any of them)",
            "schema": {"type": "array", "items": {"enum": list(EVENT_NAMES)}},
        },
        {
            "name": "backlog",
            "in": "query",
            "description": "without Last-Event-ID: begin with every event still held (default: new ones only)",
            "schema": {"type": "boolean", "default": False},
        },
        {
            "name": "follow",
            "in": "query",
            "description": "false: send what is held (backlog or resume) and end the stream",
            "schema": {"type": "boolean", "default": True},
        },
        {
            "name": LAST_EVENT_ID,
            "in": "header",
            "description": "the id of the last event received: resume after it",
            "schema": {"type": "string", "pattern": "^[^\\r\\n]{1,200}-[0-9]{1,18}$"},
        },
    ),
    responses={
        "200": text_answer(
            "the stream (it ends at the server's shutdown, or with follow=false)", content_type="text/event-stream"
        ),
        "422": error(
            "an unknown kind or query parameter, a bad boolean, or a Last-Event-ID that is not an id of this "
            "stream or is later than its last event; error.field names it"
        ),
        "503": error("every event-stream slot is taken (PODCAST_JOB_EVENTS_MAX_CLIENTS): try again later"),
    },
)
async def events(supervisor: Supervisor) -> Any:
    """A server-sent-events stream of job events (the webhook's payloads), resumable."""
    for name in request.args:
        if name not in ("job", "kind", "backlog", "follow"):
            raise ValidationError(f"unknown query parameter {name!r}", field=name)
    for name in ("backlog", "follow"):
        if len(request.args.getlist(name)) > 1:
            raise ValidationError(f"query parameter {name!r} given more than once", field=name)
    subscription = supervisor.subscribe_events(
        last_event_id=request.headers.get(LAST_EVENT_ID),
        jobs=request.args.getlist("job"),
        kinds=request.args.getlist("kind"),
        backlog=bool_query("backlog", default=False),
        follow=bool_query("follow", default=True),
    )
    # A reader dropped for not reading is usually stuck in a write of ours (it stopped reading, the socket is full):
    # only cancelling its request ends that write and closes the connection. This handler runs in the request's own
    # task (quart-trio), whose parent nursery is the request's: cancelling it ends exactly this request.
    # (tests/api/test_api_events.py holds this to a real client that stops reading.)
    parent = trio.lowlevel.current_task().parent_nursery
    if parent is not None:
        subscription.on_drop = parent.cancel_scope.cancel
    response = Response(
        _sse_body(subscription, supervisor.config.events_keepalive_s),
        status=200,
        content_type="text/event-stream; charset=utf-8",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
    response.timeout = None  # the stream is long-lived; its bounds are the reader's queue and the keep-alives
    return response


async def _sse_body(subscription: Subscription, keepalive_s: float) -> Any:
    """The stream's bytes: a first line at once (so the client has the answer's head), then each event as
    ``id``/``event``/``data`` lines, and a ``: keep-alive`` comment after each ``keepalive_s`` without one."""
    try:
        yield f"retry: {SSE_RETRY_MS}\n: stream open\n\n".encode()
        if subscription.gap is not None:
            yield _sse_message(None, GAP, subscription.gap.data())
        while True:
            try:
                item = await subscription.next(keepalive_s)
            except StreamEnded:
                return
            yield KEEPALIVE if item is None else _sse_event(item)
    finally:
        subscription.close()


def _sse_event(item: StreamEvent) -> bytes:
    return _sse_message(item.id, item.name, item.data)


def _sse_message(event_id: str | None, name: str, data: bytes) -> bytes:
    # The payload is compact JSON: one line, so one data: field.
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\n".encode() + b"data: " + data + b"\n\n"
