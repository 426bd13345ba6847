"""Command line: ``pipeline-runner run ...`` and ``pipeline-runner enrich``. See docs/pipeline-runner.md."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import trio

from ._config import (
    PROCESSING_LOOP_BUDGET_ENV,
    PROCESSING_LOOP_BUDGET_KEY,
    HeartbeatConfig,
    RunnerConfig,
    TransportTimeouts,
    load_config_file,
    resolve_processing_loop_budget_s,
    to_decimal,
    to_float,
    to_int,
)
from ._enrich import EnrichRun
from ._errors import ConfigError
from ._events import EventSink, configure_logging
from ._exit_codes import EXIT_CRASH, EXIT_USAGE
from ._heartbeat import Heartbeat
from ._run import REASON_TERMINATED, PipelineRun, RunOutcome, StopSignal

log = logging.getLogger("pipeline_runner")

ENV_DATA_DIR = "PODCAST_JOB_DATA_DIR"
ENV_JOB_ID = "PODCAST_JOB_ID"
ENV_TOKEN = "PODCAST_JOB_TOKEN"
ENV_HEARTBEAT_URL = "PODCAST_JOB_HEARTBEAT_URL"


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", type=Path, help=f"corpus root (default: ${ENV_DATA_DIR}, then cwd)")
    common.add_argument("--job-id", help=f"job id (default: ${ENV_JOB_ID})")
    common.add_argument("--config", type=Path, help="TOML config file")
    # Taken as text on purpose: a malformed budget falls back to the default (ADR-150 D1), not to exit 2.
    common.add_argument("--processing-loop-budget-seconds", dest="processing_loop_budget", metavar="S")
    common.add_argument("--episode-budget-seconds", dest="episode_budget_s", metavar="S")
    common.add_argument("--stop-grace-seconds", dest="stop_grace_s", metavar="S")
    common.add_argument("--connect-timeout-seconds", dest="connect_s", metavar="S")
    common.add_argument("--read-timeout-seconds", dest="read_s", metavar="S")
    common.add_argument("--write-timeout-seconds", dest="write_s", metavar="S")
    common.add_argument("--pool-timeout-seconds", dest="pool_s", metavar="S")
    common.add_argument("--heartbeat-interval-seconds", dest="heartbeat_interval_s", metavar="S")
    common.add_argument("--heartbeat-timeout-seconds", dest="heartbeat_timeout_s", metavar="S")
    common.add_argument("--heartbeat-min-gap-seconds", dest="heartbeat_min_gap_s", metavar="S")
    common.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    parser = argparse.ArgumentParser(prog="pipeline-runner", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", parents=[common], help="fetch feeds and write episodes into the corpus")
    run.add_argument("--feed", action="append", default=[], required=True, help="RSS feed URL (repeatable)")
    run.add_argument("--max-episodes", dest="max_episodes", metavar="N")
    run.add_argument("--workers", dest="workers", metavar="N")
    run.add_argument("--transcribe-url", dest="transcribe_url", metavar="URL")
    run.add_argument("--transcribe-usd-per-audio-minute", dest="transcribe_usd_per_audio_minute")
    run.add_argument("--cost-cap-usd", dest="cost_cap_usd", metavar="USD")
    run.add_argument("--poison-threshold", dest="poison_threshold", metavar="N")
    run.add_argument("--max-enclosure-bytes", dest="max_enclosure_bytes", metavar="N")
    run.add_argument("--max-feed-bytes", dest="max_feed_bytes", metavar="N")
    sub.add_parser("enrich", parents=[common], help="index the whole corpus")
    return parser


# attribute name -> (config-file key, converter). Flags use the same attribute names as dests.
_SETTINGS: dict[str, tuple[str, Any]] = {
    "episode_budget_s": ("episode_budget_seconds", to_float),
    "stop_grace_s": ("stop_grace_seconds", to_float),
    "connect_s": ("connect_timeout_seconds", to_float),
    "read_s": ("read_timeout_seconds", to_float),
    "write_s": ("write_timeout_seconds", to_float),
    "pool_s": ("pool_timeout_seconds", to_float),
    "heartbeat_interval_s": ("heartbeat_interval_seconds", to_float),
    "heartbeat_timeout_s": ("heartbeat_timeout_seconds", to_float),
    "heartbeat_min_gap_s": ("heartbeat_min_gap_seconds", to_float),
    "max_episodes": ("max_episodes", to_int),
    "workers": ("workers", to_int),
    "transcribe_url": ("transcribe_url", lambda _name, raw: str(raw)),
    "transcribe_usd_per_audio_minute": ("transcribe_usd_per_audio_minute", to_decimal),
    "cost_cap_usd": ("cost_cap_usd", to_decimal),
    "poison_threshold": ("poison_threshold", to_int),
    "max_enclosure_bytes": ("max_enclosure_bytes", to_int),
    "max_feed_bytes": ("max_feed_bytes", to_int),
}


def build_config(args: argparse.Namespace, environ: Mapping[str, str]) -> RunnerConfig:
    """Layer flag > environment > config file > default into a validated RunnerConfig."""
    file_values = load_config_file(args.config) if args.config is not None else {}
    chosen: dict[str, Any] = {}
    for attr, (file_key, convert) in _SETTINGS.items():
        raw = getattr(args, attr, None)
        if raw is None and file_key in file_values:
            raw = file_values[file_key]
        if raw is not None:
            chosen[attr] = convert(file_key, raw)
    timeouts = TransportTimeouts(
        **{k: chosen.pop(k) for k in ("connect_s", "read_s", "write_s", "pool_s") if k in chosen}
    )
    heartbeat = HeartbeatConfig(
        url=environ.get(ENV_HEARTBEAT_URL) or None,
        token=environ.get(ENV_TOKEN),
        **{k.removeprefix("heartbeat_"): chosen.pop(k) for k in list(chosen) if k.startswith("heartbeat_")},
    )
    budget_s = resolve_processing_loop_budget_s(
        flag=args.processing_loop_budget,
        env=environ.get(PROCESSING_LOOP_BUDGET_ENV),
        file_value=file_values.get(PROCESSING_LOOP_BUDGET_KEY),
        file_has_key=PROCESSING_LOOP_BUDGET_KEY in file_values,
    )
    data_dir = args.data_dir or (Path(environ[ENV_DATA_DIR]) if environ.get(ENV_DATA_DIR) else Path.cwd())
    job_id = args.job_id or environ.get(ENV_JOB_ID) or _local_job_id()
    return RunnerConfig(
        data_dir=data_dir.absolute(),
        job_id=job_id,
        feeds=tuple(getattr(args, "feed", ())),
        processing_loop_budget_s=budget_s,
        transport=timeouts,
        heartbeat=heartbeat,
        **chosen,
    )


def _local_job_id() -> str:
    # Outside the supervisor there is no job id; a unique one keeps manifests of manual runs apart.
    return f"local-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}"


async def _watch_signals(stop: StopSignal, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()
        async for signum in signals:
            log.warning("received %s", signal.Signals(signum).name)
            stop.request(REASON_TERMINATED)


async def amain(
    command: str,
    config: RunnerConfig,
    *,
    events: EventSink | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    stop: StopSignal | None = None,
    watch_signals: bool = True,
) -> RunOutcome:
    """The whole process minus argument parsing. ``pipeline_runner.testing`` runs it in-process: a scripted
    ``transport`` (feeds, enclosures, provider and heartbeats alike), its own ``stop`` for a SIGTERM in virtual time,
    and no signal watcher (the process's signals are the test runner's)."""
    events = events or EventSink(config.job_id)
    heartbeat = Heartbeat(config.heartbeat, transport=transport)
    stop = stop or StopSignal()
    # The services (event writer, heartbeat) outlive the run so the last events and the final beat go
    # out; they are drained rather than cancelled. On an exception they are cancelled with everything.
    async with trio.open_nursery() as services:
        await services.start(events.run)
        await services.start(heartbeat.run)
        try:
            async with trio.open_nursery() as guard:
                if watch_signals:
                    await guard.start(_watch_signals, stop)
                job = (
                    PipelineRun(config, events=events, heartbeat=heartbeat, stop=stop, transport=transport)
                    if command == "run"
                    else EnrichRun(config, events=events, heartbeat=heartbeat, stop=stop)
                )
                outcome = await job.run()
                guard.cancel_scope.cancel()
        finally:
            heartbeat.stop()
            events.close()
    return outcome


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, os.environ.get("PODCAST_JOB_ID"))
    # httpx logs every request at INFO: a heartbeat every few seconds would bury the job's own log.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        config = build_config(args, os.environ)
    except ConfigError as exc:
        log.error("configuration error: %s", exc)
        sys.exit(EXIT_USAGE)
    try:
        outcome = trio.run(amain, args.command, config)
    except BaseException:
        log.exception("pipeline-runner crashed")
        sys.exit(EXIT_CRASH)
    sys.exit(outcome.exit_code)
