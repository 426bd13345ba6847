"""Schemathesis against a live server: the control API holds to its own OpenAPI document under generated requests,
and no request leaves the server unsound: what fuzzing once found stays fixed.

schemathesis's engine (the runner behind ``schemathesis run``: coverage, fuzzing and stateful phases, every check)
runs in a worker thread against ``run_supervisor`` on port 0, served by this test's trio loop. Generation is seeded
and derandomized, with no example database and no schemathesis cache, so each run sends the same generated requests
(the server's own answers, such as job ids, differ). The run is bounded by its example counts, and a watchdog stops
it at FUZZ_BUDGET_S should the server stall.

The kinds are harmless stand-ins with the built-ins' names and params (``pipeline``, ``enrichment``) plus one of each
param type and one that sleeps briefly: the fuzzer enqueues thousands of jobs (batches included), and none may fetch
a feed. Afterwards the test stops promotion, waits for what runs to end, cancels what is still queued, and checks
that the server is sound: it serves, no slot is held, no connection is left half-closed, no descriptor is leaked.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import json
import os
import re
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import requests
import schemathesis
import trio
from api_support import API_TOKEN, Live, MakeLive, kinds_toml, poll_until, wait_terminal
from schemathesis.engine import events, from_schema

from supervisor.api import openapi_document
from supervisor.domain import IDEMPOTENCY_KEY_HEADER, PageRequest, key_problem

pytestmark = pytest.mark.e2e

FUZZ_KINDS: dict[str, dict[str, Any]] = {
    # The built-ins' names and params, doing nothing: the fuzzer's pipeline jobs must not fetch anything.
    "pipeline": {
        "argv": ["{python}", "-c", "pass", "{feed}", "{max_episodes}"],
        "params": {
            "feed": {"type": "str", "format": "url", "max_length": 2048},
            "max_episodes": {"type": "int", "default": 0, "min": 0, "max": 1_000_000},
        },
    },
    # Every rule the document can state exactly (ADR 0017): a range across zero, int and str choices, a length.
    # (A bounded float is not here: its text form, "2.5", cannot carry the bound in a pattern; see _openapi.)
    "ruled": {
        "argv": ["{python}", "-c", "pass", "{n}", "{pick}", "{mode}", "{note}"],
        "params": {
            "n": {"type": "int", "min": -50, "max": 1234},
            "pick": {"type": "int", "choices": [-2, 0, 7], "default": 0},
            "mode": {"type": "str", "choices": ["fast", "slow"]},
            "note": {"type": "str", "max_length": 8, "default": ""},
        },
    },
    "enrichment": {"argv": ["{python}", "-c", "pass"], "coalesce": True},
    # One param of each type, exiting at once.
    "quick": {
        "argv": ["{python}", "-c", "pass", "{n}", "{ratio}", "{flag}", "{name}"],
        "params": {"n": "int", "ratio": "float", "flag": "bool", "name": "str"},
    },
    # Sleeps briefly, so that cancels, logs and the queue meet running jobs too.
    "nap": {"argv": ["{python}", "-c", "import threading; threading.Event().wait(0.1)"]},
}

SEED = 20261130
# Examples per operation and phase. With the token this sends well over MIN_REQUESTS; without it, the answers are all
# 401 and fewer examples suffice.
MAX_EXAMPLES_WITH_TOKEN = 36  # the operations grew (hosts, drain, retry, prune, events): 36 each still sends well over
MAX_EXAMPLES_WITHOUT_TOKEN = 10
MIN_REQUESTS = 1000
# A bound, not a speed target: a run takes a fraction of it; a stalled server is stopped here and the test fails.
FUZZ_BUDGET_S = 60.0
# A request unanswered this long is a stall (the server stopped answering on a connection): the run stops there.
REQUEST_TIMEOUT_S = 5.0
# After the run, with promotion paused: every running job ends within this bound (none is stuck, no slot is held).
SETTLE_S = 20.0
# Descriptors the server may hold after the run beyond those it held before (the registry's pooled connections are
# not counted): none is expected; a little slack for what the stack may open lazily on first use.
FD_SLACK = 2
# How long the server may take to close its ends of connections its clients have closed.
CLOSE_S = 5.0
AUTH = {"Authorization": f"Bearer {API_TOKEN}"}
TIMEOUT = httpx.Timeout(10.0)


@pytest.fixture
def kinds_path(tmp_path: Path) -> Path:
    """Overrides conftest's: the live server runs only the harmless kinds above."""
    path = tmp_path / "fuzz-kinds.toml"
    path.write_text(kinds_toml(FUZZ_KINDS))
    return path


# -- running the engine (in a worker thread) -----------------------------------------------------------------------


@dataclasses.dataclass
class Exchange:
    method: str
    path: str
    status: int | None  # None: no answer (a network error, e.g. a timeout)


@dataclasses.dataclass
class FuzzRun:
    exchanges: list[Exchange] = dataclasses.field(default_factory=list)
    failures: dict[tuple[str, str, str], str] = dataclasses.field(default_factory=dict)  # (check, op, title) -> curl
    failure_count: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    checks_run: set[str] = dataclasses.field(default_factory=set)
    stop_reason: str = ""
    stalled: str | None = None  # the first request the server never answered, and the run stopped there
    keys_reused: int = 0  # valid requests refused only because their Idempotency-Key named another request

    def report(self) -> str:
        lines = [
            f"{len(self.exchanges)} requests, {len(self.failures)} distinct failures ({self.failure_count} in all), "
            f"{len(self.errors)} errors; stopped: {self.stop_reason}"
            + (f" (the server stopped answering: {self.stalled})" if self.stalled else "")
        ]
        lines += [
            f"  {check} | {op} | {title}\n    {curl}" for (check, op, title), curl in sorted(self.failures.items())
        ]
        lines += [f"  error: {error}" for error in self.errors]
        return "\n".join(lines)


def engine_config(base_url: str, *, max_examples: int, token: str | None) -> schemathesis.Config:
    config: dict[str, Any] = {
        "seed": SEED,
        "base-url": base_url,
        "workers": 1,
        "request-timeout": REQUEST_TIMEOUT_S,
        # No state carried between runs: same seed, same requests.
        "cache": {"enabled": False},
        "generation": {"mode": "all", "max-examples": max_examples, "deterministic": True, "database": "none"},
        # Every built-in check (max_response_time is a timing check: speed belongs in bench/, not here).
        "checks": {"enabled": True},
        "phases": {
            "examples": {"enabled": True},
            "coverage": {"enabled": True},
            "fuzzing": {"enabled": True},
            "stateful": {"enabled": True},
        },
    }
    if token is not None:
        # Through the document's security scheme, so that ignored_auth can also try each operation without it.
        config["auth"] = {"openapi": {"apiToken": {"bearer": token}}}
    return schemathesis.Config.from_dict(config)


def open_engine(base_url: str, *, max_examples: int, token: str | None) -> Any:
    """Load the served document (a blocking HTTP call: run in a thread) and return the engine's event stream."""
    config = engine_config(base_url, max_examples=max_examples, token=token)
    # The document itself is behind the token (it names the kinds); the run without a token still reads it.
    schema = schemathesis.openapi.from_url(f"{base_url}/api/openapi.json", config=config, headers=AUTH)
    # A key names one request: the fuzzer, which cannot know which keys it sent before, would send a key again with
    # another body and take the 422 (idempotency_key_reused) for a valid request refused. Each valid key it makes is
    # made unique here (an invalid one is left as it is, to be refused); the coverage phase sends its keys without
    # this hook, and ``_a_key_sent_again`` sets those answers aside. Replays and reuse are tested by
    # tests/api/test_api_idempotency.py.
    sent = itertools.count()

    @schema.hook("map_headers")
    def fresh_key(context: Any, headers: dict[str, Any] | None) -> dict[str, Any] | None:
        key = (headers or {}).get(IDEMPOTENCY_KEY_HEADER)
        if headers is not None and isinstance(key, str) and key_problem(key) is None:
            headers[IDEMPOTENCY_KEY_HEADER] = f"{key[:200]}~{next(sent)}"
        return headers

    if token is not None:
        # A request/response fuzzer cannot read a stream that never ends: with the token, the event stream answers
        # 200 and goes on. Its answers are tested by tests/api/test_api_events.py (every 4xx by field, resume, the
        # reader that stops reading); without the token it is fuzzed like every route (all 401).
        schema = schema.exclude(path=STREAMS)
    return from_schema(schema).execute()


def _a_key_sent_again(interaction: Any) -> bool:
    """The answer was the 422 of an Idempotency-Key that an earlier request of the run named (a state no document
    can describe: the coverage phase sends its keys as they are, without the ``fresh_key`` hook)."""
    response = interaction.response if interaction is not None else None
    if response is None or response.status_code != 422:
        return False
    try:
        return bool(json.loads(response.content)["error"]["code"] == "idempotency_key_reused")
    except (ValueError, KeyError, TypeError):
        return False


def consume(stream: Any) -> FuzzRun:
    """Drive the engine to its end (blocking: run in a thread), recording every exchange, failure and error."""
    run = FuzzRun()
    for event in stream:
        if isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            for interaction in recorder.interactions.values():
                response = interaction.response
                run.exchanges.append(
                    Exchange(
                        interaction.request.method,
                        urlsplit(interaction.request.uri).path,
                        response.status_code if response is not None else None,
                    )
                )
            for case_id, checks in recorder.checks.items():
                for check in checks:
                    run.checks_run.add(check.name)
                    interaction = recorder.interactions.get(case_id)
                    if check.failure_info is not None and _a_key_sent_again(interaction):
                        run.keys_reused += 1
                        continue
                    if check.failure_info is not None:
                        failure = check.failure_info.failure
                        run.failure_count += 1
                        key = (check.name, recorder.label, failure.title)
                        run.failures.setdefault(key, check.failure_info.code_sample.replace("\n", " ")[:500])
        elif isinstance(event, events.NonFatalError):
            if isinstance(event.value, requests.Timeout):
                # The server stopped answering on a connection (a defect fuzzing once found). Each stall costs a request
                # timeout, so the run stops at the first one.
                if run.stalled is None:
                    run.stalled = f"{event.label}: {event.info.code_sample or event.info.message}"
                stream.stop()
            else:
                run.errors.append(f"{event.label}: {event.info.title}: {event.info.message}"[:500])
        elif isinstance(event, events.FatalError):
            run.errors.append(f"fatal: {event.exception!r}")
        elif isinstance(event, events.EngineFinished):
            run.stop_reason = str(event.stop_reason)
    return run


async def fuzz(live: Live, *, max_examples: int, token: str | None) -> FuzzRun:
    """Run the engine against ``live`` in a worker thread, stopped by a watchdog if it overruns FUZZ_BUDGET_S."""
    stream = await trio.to_thread.run_sync(
        functools.partial(open_engine, live.url, max_examples=max_examples, token=token)
    )
    overran = threading.Event()

    async def watchdog(stop: Callable[[], None]) -> None:
        await trio.sleep(FUZZ_BUDGET_S)  # a deadline, not a wait for an event
        overran.set()
        stop()  # thread-safe: the engine stops before its next request

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watchdog, stream.stop)
        # The stop ends the run within one request timeout; the outer bound is a backstop.
        with trio.fail_after(FUZZ_BUDGET_S + 4 * REQUEST_TIMEOUT_S):
            run = await trio.to_thread.run_sync(consume, stream)
        nursery.cancel_scope.cancel()
    # The engine keeps one HTTP session per thread until it is collected: drop it, so its connections close now.
    del stream
    await trio.to_thread.run_sync(gc.collect)
    assert not overran.is_set(), f"the fuzz run did not finish within {FUZZ_BUDGET_S} s\n{run.report()}"
    return run


# -- the server's own state -----------------------------------------------------------------------------------------


def fd_targets() -> dict[int, str]:
    """This process's open descriptors and what each one is (a path, ``socket:[inode]``, ``pipe:[inode]``)."""
    targets = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            targets[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed since listed (the listing's own descriptor, for one)
    return targets


def tcp_sockets(port: int) -> dict[str, tuple[str, str]]:
    """inode -> (side, TCP state) of every connection to or from ``port`` on this machine; side is ``server`` when
    the local end is ``port`` (the listener is left out), ``client`` when the remote end is."""
    names = {"01": "ESTABLISHED", "04": "FIN_WAIT1", "05": "FIN_WAIT2", "06": "TIME_WAIT", "08": "CLOSE_WAIT"}
    sockets = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            next(fh)  # the header
            for line in fh:
                fields = line.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                if state == "0A":  # LISTEN
                    continue
                if int(local.rsplit(":", 1)[1], 16) == port:
                    sockets[inode] = ("server", names.get(state, state))
                elif int(remote.rsplit(":", 1)[1], 16) == port:
                    sockets[inode] = ("client", names.get(state, state))
    return sockets


def server_connections(port: int) -> Counter[str]:
    """The TCP states of the connections this process's server holds open on ``port``."""
    ours = {target[len("socket:[") : -1] for target in fd_targets().values() if target.startswith("socket:[")}
    return Counter(state for inode, (side, state) in tcp_sockets(port).items() if side == "server" and inode in ours)


def server_fds(live: Live) -> dict[int, str]:
    """The descriptors that are the server's own concern: without the registry's pooled connections (a bounded pool
    that grows on demand) and without the fuzzer's client sockets (it runs in this process too)."""
    port = server_port(live)
    clients = {inode for inode, (side, _) in tcp_sockets(port).items() if side == "client"}
    registry = str(live.supervisor.config.registry_path.resolve())
    return {
        fd: target
        for fd, target in fd_targets().items()
        if not target.startswith(registry) and target[len("socket:[") : -1] not in clients
    }


def server_port(live: Live) -> int:
    port = urlsplit(live.url).port
    assert port is not None
    return port


async def settle(live: Live) -> int:
    """Stop promotion and wait until nothing runs: every job that was running had a process, and it ended, so no slot
    stays held. Then cancel what the fuzzer left queued (batches of up to a thousand jobs: more than the run's time
    would drain). Returns how many queued jobs were cancelled."""
    sup = live.supervisor
    await sup.pause()

    async def nothing_running() -> bool | None:
        return True if not await sup.registry.running_jobs() else None

    try:
        await poll_until(nothing_running, limit_s=SETTLE_S)
    except trio.TooSlowError:
        # A running row that never ends holds a slot: a job stuck without a process, or one nobody watches.
        stuck = [(j.job_id, j.pid, j.kind, j.params) for j in await sup.registry.running_jobs()]
        raise AssertionError(f"jobs still running {SETTLE_S} s after the run: {stuck}") from None
    cancelled = 0
    with trio.fail_after(SETTLE_S):
        while queued := (await sup.list_jobs(PageRequest.parse(status="queued", limit=1000)))[0]:
            for job in queued:
                await sup.cancel(job.job_id)
            cancelled += len(queued)
    return cancelled


# schemathesis never sends requests to the operation that serves the document it loaded; the tests ask it directly.
SERVES_THE_DOCUMENT = ("GET", "/api/openapi.json")
STREAMS = "/api/events"


def documented_operations(live: Live, *, protected_only: bool = False) -> set[tuple[str, str]]:
    """(METHOD, path) of every documented operation, or of those that need the API token."""
    doc = openapi_document(live.supervisor.kinds)
    return {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        # An operation without its own `security` inherits the document's: the API token.
        if not protected_only or "security" not in op
    }


def operation_of(exchange: Exchange, paths: list[str]) -> str | None:
    """The documented path an exchange was for; a fixed path outranks a template, as in OpenAPI."""
    fixed = [p for p in paths if "{" not in p]
    if exchange.path in fixed:
        return exchange.path
    for path in paths:
        if "{" in path and re.fullmatch(re.sub(r"\{[^/]+\}", "[^/]+", path), exchange.path):
            return path
    return None


# -- the tests ------------------------------------------------------------------------------------------------------


# hypothesis warns when it builds the repr of a large generated body; schemathesis silences it in its stateful phase
# only, and filterwarnings = error would turn it into an engine error in the others.
LARGE_REPR = "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"


@pytest.mark.filterwarnings(LARGE_REPR)
async def test_fuzzing_with_the_token_finds_nothing_and_leaves_the_server_sound(make_live: MakeLive) -> None:
    live = await make_live(api_token=API_TOKEN, max_concurrent=1)
    documented = documented_operations(live)
    port = server_port(live)
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        assert (await client.get("/api/queue", headers=AUTH, timeout=TIMEOUT)).status_code == 200
    fds_before = server_fds(live)  # a server that has served requests, and has no job

    run = await fuzz(live, max_examples=MAX_EXAMPLES_WITH_TOKEN, token=API_TOKEN)
    print(run.report())

    assert not run.failures and not run.errors and not run.stalled, run.report()
    assert all(e.status is not None and e.status < 500 for e in run.exchanges)
    assert run.stop_reason == "completed", run.report()
    assert len(run.exchanges) >= MIN_REQUESTS
    # Every operation was exercised, with every check.
    paths = sorted({path for _, path in documented})
    exercised = {(e.method, operation_of(e, paths)) for e in run.exchanges}
    assert documented - {SERVES_THE_DOCUMENT, ("GET", STREAMS)} <= exercised, documented - exercised
    assert {
        "not_a_server_error",
        "status_code_conformance",
        "response_schema_conformance",
        "content_type_conformance",
        "negative_data_rejection",
        "positive_data_acceptance",
        "unsupported_method",
        "ignored_auth",
    } <= run.checks_run, run.checks_run

    # The server is sound afterwards: it serves, no job is stuck, no slot is held, nothing leaked.
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        health = await client.get("/api/health", timeout=TIMEOUT)
        assert health.status_code == 200
        accepted = (await client.get("/api/jobs?limit=1", headers=AUTH, timeout=TIMEOUT)).json()["jobs"]
        assert accepted, "the fuzzer enqueued no job: the kinds in the document are not reaching the server"
        left_queued = await settle(live)
        print(f"{left_queued} jobs left queued by the fuzzer, cancelled")
        queue = (await client.get("/api/queue", headers=AUTH, timeout=TIMEOUT)).json()
        assert queue["running"] == 0 and queue["queued"] == 0, queue
        # The one slot is free: a job enqueued now is promoted and runs to its end.
        assert (await client.post("/api/queue/resume", headers=AUTH, timeout=TIMEOUT)).status_code == 200
        # The fuzzer may have drained this very host (its id is the document's example): an operator's state, as the
        # pause is, undone the same way.
        host = live.supervisor.boot.host_id
        undrained = await client.post(f"/api/hosts/{host}/undrain", headers=AUTH, timeout=TIMEOUT)
        assert undrained.status_code == 200, undrained.text
        response = await client.post("/api/jobs", json={"kind": "enrichment"}, headers=AUTH, timeout=TIMEOUT)
        assert response.status_code == 202
        job = await wait_terminal(live.supervisor, response.json()["job_id"])
        assert job.status == "succeeded", job

    # Every client has closed its connections by now (the fuzzer's with its engine): the server closes its ends.
    async def connections_closed() -> bool | None:
        return True if not server_connections(port) else None

    with trio.move_on_after(CLOSE_S):
        await poll_until(connections_closed, limit_s=CLOSE_S)
    connections = server_connections(port)
    assert connections["CLOSE_WAIT"] == 0, f"server sockets in CLOSE-WAIT after the run: {connections}"
    after = server_fds(live)
    leaked = {fd: target for fd, target in after.items() if fds_before.get(fd) != target}
    assert len(leaked) <= FD_SLACK, f"descriptors the server holds beyond those before the run: {leaked}"


@pytest.mark.filterwarnings(LARGE_REPR)
async def test_without_the_token_every_protected_route_answers_401(make_live: MakeLive) -> None:
    live = await make_live(api_token=API_TOKEN)
    run = await fuzz(live, max_examples=MAX_EXAMPLES_WITHOUT_TOKEN, token=None)
    print(run.report())

    assert not run.failures and not run.errors and not run.stalled, run.report()
    protected = documented_operations(live, protected_only=True)
    paths = sorted({path for _, path in protected})
    answered: Counter[tuple[str, str]] = Counter()
    for exchange in run.exchanges:
        key = (exchange.method, operation_of(exchange, paths))
        if key in protected:
            assert exchange.status == 401, exchange
            answered[key] += 1
    assert set(answered) == protected - {SERVES_THE_DOCUMENT}, (answered, protected)
    async with httpx.AsyncClient(base_url=live.url, timeout=TIMEOUT) as client:
        assert (await client.get(SERVES_THE_DOCUMENT[1], timeout=TIMEOUT)).status_code == 401
        assert (await client.get(SERVES_THE_DOCUMENT[1], headers=AUTH, timeout=TIMEOUT)).status_code == 200
    jobs, _ = await live.supervisor.list_jobs(PageRequest.parse(limit=10))
    assert jobs == []  # nothing got through
