"""``run_in_process``: the runner's whole process minus the process, on a scripted network, in virtual time.

It parses the command line and the environment as ``python -m pipeline_runner`` does (so a usage error is exit 2
here too), then runs the same ``amain`` tree -- services, job scope, workers, episode scopes, httpx calls -- with
every HTTP request, heartbeats included, going to the given transport. Blocking file I/O runs inline for the
duration, so that on a ``trio.testing.MockClock`` virtual time moves only while the run waits on a server or a
deadline, and the elapsed time is exactly what the deadlines say.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import trio

from .. import _fs
from .._cli import ENV_DATA_DIR, ENV_HEARTBEAT_URL, ENV_JOB_ID, ENV_TOKEN, _parser, amain, build_config
from .._config import RunnerConfig
from .._corpus import Corpus
from .._errors import ConfigError
from .._events import EventSink
from .._exit_codes import EXIT_CRASH, EXIT_USAGE
from .._run import REASON_TERMINATED, StopSignal
from ._transport import ScriptedTransport

HEARTBEAT_URL = "http://supervisor.test/heartbeat"
"""Where an in-process run sends its heartbeats (``PODCAST_JOB_HEARTBEAT_URL``); answered 204 unless scripted."""


@dataclasses.dataclass(frozen=True, slots=True)
class Beat:
    """One heartbeat the run sent, ``at_s`` virtual seconds after it started."""

    at_s: float
    completed_units: int
    total_units: int | None
    stage: str


@dataclasses.dataclass(frozen=True, slots=True)
class Sent:
    """One request the run made (heartbeats apart), ``at_s`` virtual seconds after it started."""

    at_s: float
    method: str
    url: str


@dataclasses.dataclass(frozen=True)
class InProcessRun:
    """What one run did: its exit code, and what the process would have printed, sent and written."""

    exit_code: int
    reason: str | None  # run.json's reason; None when nothing ran (a usage error) or the run crashed
    elapsed_s: float  # virtual seconds from the start to the exit
    events: list[dict[str, Any]]  # the JSON-lines events, in order, as printed on stdout
    event_times_s: list[float]  # when each of them was emitted, in virtual seconds from the start
    heartbeats: list[Beat]
    requests: list[Sent]
    manifest: dict[str, Any] | None  # run.json
    corpus: dict[str, dict[str, Any]]  # the complete episodes after the run: guid -> episode.json
    error: Exception | None = None  # what crashed the run (exit 1), or the usage error (exit 2)

    def named(self, event: str) -> list[dict[str, Any]]:
        """The events called ``event``, in order."""
        return [record for record in self.events if record["event"] == event]

    def times_of(self, event: str) -> list[float]:
        """When each event called ``event`` was emitted, in virtual seconds from the start."""
        return [at for record, at in zip(self.events, self.event_times_s, strict=True) if record["event"] == event]


class _TimedEvents(EventSink):
    def __init__(self, job_id: str, origin: float) -> None:
        super().__init__(job_id, write_line=None)
        self.times_s: list[float] = []
        self._origin = origin

    def emit(self, event: str, **fields: Any) -> None:
        self.times_s.append(trio.current_time() - self._origin)
        super().emit(event, **fields)


class _Recording(httpx.AsyncBaseTransport):
    """Everything the run sends goes through here: heartbeats are recorded (and answered 204 unless the script
    routes the heartbeat URL), every other request is recorded and passed to the script."""

    def __init__(self, script: httpx.AsyncBaseTransport, origin: float) -> None:
        self._script = script
        self._origin = origin
        self.beats: list[Beat] = []
        self.requests: list[Sent] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        at_s = trio.current_time() - self._origin
        if str(request.url) == HEARTBEAT_URL:
            body = json.loads(await request.aread())
            self.beats.append(Beat(at_s, body["completed_units"], body["total_units"], body["stage"]))
            if not (isinstance(self._script, ScriptedTransport) and self._script.has_route(HEARTBEAT_URL)):
                return httpx.Response(204)
        else:
            self.requests.append(Sent(at_s, request.method, str(request.url)))
        return await self._script.handle_async_request(request)


async def _sigterm_at(stop: StopSignal, deadline: float) -> None:
    await trio.sleep_until(deadline)
    stop.request(REASON_TERMINATED)


async def run_in_process(
    *args: str,
    transport: httpx.AsyncBaseTransport,
    data_dir: Path,
    job_id: str = "scripted-job",
    env: Mapping[str, str] | None = None,
    sigterm_at_s: float | None = None,
) -> InProcessRun:
    """Run ``pipeline-runner *args`` (``"run", "--feed", url, ...`` or ``"enrich"``) inside the calling task.

    ``transport`` answers every request (a :class:`ScriptedTransport`, or any ``httpx.AsyncBaseTransport``).
    The environment is ``env`` over the job contract's variables (``PODCAST_JOB_DATA_DIR=data_dir``,
    ``PODCAST_JOB_ID=job_id``, ``PODCAST_JOB_HEARTBEAT_URL=HEARTBEAT_URL``), never the test process's own.
    ``sigterm_at_s``: the run receives SIGTERM that many virtual seconds after it starts. Run it on a
    ``trio.testing.MockClock`` (autojump): hours of deadlines then take milliseconds.
    """
    environ = _job_environ(data_dir, job_id, env)
    origin = trio.current_time()
    try:
        parsed = _parser().parse_args(list(args))
        config = build_config(parsed, environ)
    except SystemExit as exc:  # argparse's usage error; it printed its one line on stderr
        return _nothing_ran(int(exc.code or 0), None)
    except ConfigError as exc:
        return _nothing_ran(EXIT_USAGE, exc)
    events = _TimedEvents(config.job_id, origin)
    recording = _Recording(transport, origin)
    with _fs.blocking_inline():
        sigterm_at = None if sigterm_at_s is None else origin + sigterm_at_s
        reason, exit_code, error = await _run(parsed.command, config, events, recording, sigterm_at)
        elapsed_s = trio.current_time() - origin
        corpus = Corpus(config.corpus_dir)
        complete = await corpus.complete_episodes()
        manifest = _fs.read_json(corpus.runs_dir / config.job_id / "run.json")
    return InProcessRun(
        exit_code=exit_code,
        reason=reason,
        elapsed_s=elapsed_s,
        events=events.emitted,
        event_times_s=events.times_s,
        heartbeats=recording.beats,
        requests=recording.requests,
        manifest=manifest,
        corpus={meta["guid"]: meta for meta in complete},
        error=error,
    )


def _job_environ(data_dir: Path, job_id: str, env: Mapping[str, str] | None) -> dict[str, str]:
    """The job contract's variables, ``env`` over them; never the test process's own environment."""
    return {
        ENV_DATA_DIR: str(data_dir),
        ENV_JOB_ID: job_id,
        ENV_HEARTBEAT_URL: HEARTBEAT_URL,
        ENV_TOKEN: "scripted-token",
        **(env or {}),
    }


async def _run(
    command: str, config: RunnerConfig, events: _TimedEvents, recording: _Recording, sigterm_at: float | None
) -> tuple[str | None, int, Exception | None]:
    """The runner's own ``amain``, with SIGTERM delivered at ``sigterm_at`` (virtual time) if given: its reason, its
    exit code, and the exception it raised (the process would log it and exit 1: ``pipeline_runner._cli.main``)."""
    stop = StopSignal()
    async with trio.open_nursery() as nursery:
        if sigterm_at is not None:
            nursery.start_soon(_sigterm_at, stop, sigterm_at)
        try:
            outcome = await amain(command, config, events=events, transport=recording, stop=stop, watch_signals=False)
        except Exception as exc:
            return None, EXIT_CRASH, exc
        finally:
            nursery.cancel_scope.cancel()
    return outcome.reason, outcome.exit_code, None


def _nothing_ran(exit_code: int, error: Exception | None) -> InProcessRun:
    return InProcessRun(exit_code, None, 0.0, [], [], [], [], None, {}, error)
