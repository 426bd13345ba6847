"""The Docker engine as the docker executor speaks to it: its client (``make_client``: pinned API version, no I/O at
construction, sockets closed at once when the engine is down), its errors (``ENGINE_ERRORS``, ``engine_trouble``),
whether it answers now (``EngineHealth``: one episode per outage, ADR 0005 §8), and a job's call asked again while it
does not (``Outage``).
"""

from __future__ import annotations

import math
import socket
import threading
import time
from typing import Any

import docker
import requests
import urllib3
from docker.errors import APIError, DockerException
from docker.transport.unixconn import UnixHTTPAdapter, UnixHTTPConnection, UnixHTTPConnectionPool

from ..domain import utc_now
from ..observe import get_logger
from ._base import ExecutorFault

log = get_logger()

# The engine API version this mode speaks (Docker 20.10 and later). Pinned, so that creating a client does no I/O:
# with "auto" the SDK asks the engine at construction, and an unreachable engine would fail the supervisor's start.
API_VERSION = "1.41"
API_TIMEOUT_S = 10.0  # every call but a wait slice (and a stop, which adds its grace period); docker_timeout_s
RETRY_MIN_S = 0.5  # an unreachable engine is asked again after this, doubling up to RETRY_MAX_S
RETRY_MAX_S = 5.0
MAX_CALLS = 16  # SDK calls at once (a wait slice holds its own limiter)
MAX_WAITS = 256  # wait slices at once (one per watched job; beyond it a job waits its turn for a thread)
# Engine trouble ends with a start made, or with a call answered once no call has failed for this long: longer than
# any retry's wait (5 s for a job's calls, 10 s for the drainer's), so that an engine answering some calls and failing
# others (its containers listed, never made) is one episode, not a WARNING and an INFO every few seconds.
RECOVERED_AFTER_S = 15.0
HTTP_SERVER_ERROR = 500

# What an unreachable, failing or slow engine raises: the SDK's own errors, and raw requests errors (with a pinned
# API version the SDK lets them through unwrapped).
ENGINE_ERRORS = (DockerException, requests.exceptions.RequestException)


def describe_error(exc: BaseException) -> str:
    """One line naming what went wrong with the engine."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:300]


def engine_trouble(exc: BaseException) -> bool:
    """Whether an engine error says the engine does not work now (refused, timed out, a server error), rather than
    that it answered this one call with a refusal of its own (a 4xx: no such image, a name taken, no such container)."""
    if isinstance(exc, APIError):
        return exc.status_code is None or exc.status_code >= HTTP_SERVER_ERROR
    return isinstance(exc, ENGINE_ERRORS)


def never_reached(exc: BaseException) -> bool:
    """The request provably never reached the engine: its socket refused the connection, or was not there."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        item = todo.pop()
        if id(item) in seen or not isinstance(item, BaseException):
            continue
        seen.add(id(item))
        if isinstance(item, ConnectionRefusedError | FileNotFoundError | urllib3.exceptions.NewConnectionError):
            return True
        todo.extend([*item.args, item.__cause__, item.__context__])
    return False


class EngineHealth:
    """Whether the engine answers now, whichever part of the executor asked it last (ADR 0005 §8).

    One WARNING (``docker_engine_unavailable``) when a call first fails with engine trouble, one INFO
    (``docker_engine_reachable``) when it is over: an outage is one episode, not a line per probe, per sweep or per
    job. It is over when a start is made, or when a call is answered after ``RECOVERED_AFTER_S`` without a failure:
    an engine may answer some calls while it fails others (a ping, a list), and a WARNING and an INFO at each of its
    answers would be a line per probe again. Thread-safe: the evidence is gathered in a worker thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.fault: ExecutorFault | None = None
        self._last_failure = -math.inf  # time.monotonic(): the evidence's thread has no Trio clock

    def failed(self, exc: BaseException, *, call: str) -> None:
        reason = describe_error(exc)
        with self._lock:
            first = self.fault is None
            since = utc_now() if self.fault is None else self.fault.since
            count = 1 if self.fault is None else self.fault.failed_calls + 1
            self.fault = ExecutorFault(since, reason, count)
            self._last_failure = time.monotonic()
        if first:
            log.warning("docker_engine_unavailable", call=call, error=reason, liveness="unknown", starts="held")

    def answered(self, *, start: bool = False) -> None:
        with self._lock:
            fault = self.fault
            if fault is None or (not start and time.monotonic() - self._last_failure < RECOVERED_AFTER_S):
                return
            self.fault = None
        down_s = (utc_now() - fault.since).total_seconds()
        log.info("docker_engine_reachable", failed_calls=fault.failed_calls, down_s=round(down_s, 3))

    def judge(self, exc: BaseException, *, call: str) -> None:
        """After a failed call: engine trouble, or an answer (a 4xx is the engine working)."""
        if engine_trouble(exc):
            self.failed(exc, call=call)
        else:
            self.answered()


class _ClosingUnixConnection(UnixHTTPConnection):  # type: ignore[misc]
    """The SDK's unix-socket connection leaves its socket open when ``connect`` fails (the engine is down): it is
    then closed by the garbage collector, at any time, with a ResourceWarning. This one closes it at once."""

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_socket)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _ClosingUnixPool(UnixHTTPConnectionPool):  # type: ignore[misc]
    def _new_conn(self) -> _ClosingUnixConnection:
        return _ClosingUnixConnection(self.base_url, self.socket_path, self.timeout)


class _ClosingUnixAdapter(UnixHTTPAdapter):  # type: ignore[misc]
    def get_connection(self, url: str, proxies: Any = None) -> _ClosingUnixPool:
        with self.pools.lock:
            pool = self.pools.get(url)
            if pool is None:
                pool = _ClosingUnixPool(url, self.socket_path, self.timeout, maxsize=self.max_pool_size)
                self.pools[url] = pool
            return pool


def make_client(*, timeout: float = API_TIMEOUT_S, max_pool_size: int = MAX_CALLS + MAX_WAITS) -> docker.APIClient:
    """A low-level client for the engine named by ``DOCKER_HOST`` (default: the local unix socket). No I/O.

    ``max_pool_size``: the connections kept for reuse; by default as many as the executor's threads can hold at once.
    A smaller pool still opens one per concurrent call, then closes what it cannot keep, with a urllib3 WARNING
    ("connection pool is full") per connection: with more jobs watched than it keeps, every wait slice did."""
    client = docker.APIClient(
        version=API_VERSION, timeout=timeout, max_pool_size=max_pool_size, **docker.utils.kwargs_from_env()
    )
    current = client.adapters.get("http+docker://")
    if isinstance(current, UnixHTTPAdapter):
        client.mount(
            "http+docker://",
            _ClosingUnixAdapter(f"http+unix://{current.socket_path}", timeout, max_pool_size=max_pool_size),
        )
        current.close()
    return client


class Outage:
    """One job's call asked again while the engine does not answer: after 0.5 s, doubling to 5 s. The episode itself
    is said once by ``EngineHealth``; each job says it only at DEBUG (its first failure of the episode)."""

    def __init__(self, event: str, **fields: object) -> None:
        self._event = event
        self._fields = fields
        self.failing = False
        self.delay = RETRY_MIN_S

    def failed(self, exc: BaseException) -> float:
        if not self.failing:
            log.debug(self._event, **self._fields, error=describe_error(exc), liveness="unknown")
            self.failing = True
        delay, self.delay = self.delay, min(self.delay * 2, RETRY_MAX_S)
        return delay

    def recovered(self) -> None:
        self.failing = False
        self.delay = RETRY_MIN_S
