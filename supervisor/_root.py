"""``supervisor serve``: the root of the nursery tree.

    watching nursery (run_supervisor)
    ├── signal watcher          from the boot's first moment (and what the entry held before): SIGTERM/SIGINT ->
    │                           shutdown event; SIGHUP -> re-read the API token files
    ├── start abandoner         a shutdown before serving cancels the start (a registry lock can hold it 10 s)
    └── registry runtime        (PostgreSQL) trio-asyncio's loop, under which asyncpg runs: open around all of it
        root nursery (_serve_boot)
        ├── job nursery         one monitor task per running job (its own or adopted), and the shepherd's reader
        ├── fleet               this host's lease on the registry, renewed every third of it; the fleet's lead
        ├── drainer             drains when woken (an enqueue, a job's end, a cancel), many wakes making one drain
        ├── wake-ups            (PostgreSQL) LISTEN: other hosts' enqueues, cancels of this host's jobs, the pause
        ├── webhook sender      (the leader only) delivers the outbox to PODCAST_JOB_WEBHOOK_URL, in order, with
        │                       backoff
        ├── check-in            this process's presence every 0.5 s: a gap (a freeze) never ages a job
        ├── sweeper             startup sweep (before serving), then reconcile -> drain every sweep_interval_s
        ├── heartbeat writer    the beats the HTTP server took, written to the registry within 50 ms (ADR 0018)
        ├── HTTP server         hypercorn's trio worker serving the quart-trio app (and the event streams, which
        │                       end at shutdown before the graceful deadline)
        └── watchdog            (under systemd with WatchdogSec) WATCHDOG=1 while the sweeper keeps sweeping

Every child is started with ``await nursery.start(...)``; nothing is spawned outside this tree. Shutdown stops
the HTTP server gracefully (a short deadline), then cancels the rest: monitors stop watching, jobs keep running,
and the next boot reconciles them.
"""

from __future__ import annotations

import functools
import gc
import secrets
import signal
from collections.abc import Callable, Sequence
from typing import Any

import trio

from .api import HttpLimits, bind_socket, public_base_url, serve_http
from .core import DataDirLock, Supervisor
from .domain import (
    ApiToken,
    Config,
    ConfigError,
    Credentials,
    KindCatalog,
    RegistryError,
    RegistryLocked,
    RegistryNotOpened,
    SteadyWallClock,
    redacted_url,
)
from .observe import Notifier, get_logger, run_watchdog
from .registry import Registry, open_registry, registry_runtime

log = get_logger()


async def _watch_signals(
    shutdown: trio.Event,
    credentials: Credentials,
    held_signals: Callable[[], Sequence[int]],
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """SIGTERM/SIGINT: shut down. SIGHUP: re-read the operator token file and the named tokens file (a failed read
    keeps what is in force). The first task of a boot: those the command's entry held through the imports
    (``held_signals``) are acted on first, as if they came now."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        task_status.started()
        for early in held_signals():  # taken once our receiver is in place: none is lost between the two
            await _on_signal(early, shutdown, credentials, held=True)
        async for signum in signals:
            await _on_signal(signum, shutdown, credentials, held=False)


async def _on_signal(signum: int, shutdown: trio.Event, credentials: Credentials, *, held: bool) -> None:
    if signum == signal.SIGHUP:
        await _reload_token(credentials.operator)
        await _reload_named_tokens(credentials)
        return
    # ``held``: it came before the boot could hear it (the imports, the settings' reading), and waited for it.
    log.info("shutdown_requested", signal=signal.Signals(signum).name, **({"held": True} if held else {}))
    shutdown.set()


class _Start:
    """A boot's start, abandoned when a stop is asked for before it serves: opening a SQLite registry whose lock
    another process holds waits up to the busy timeout. Once serving, a stop is the graceful shutdown's. Passed as
    the boot's ``task_status``: its ``started`` marks the end of the start; ``boot_id`` is set once chosen."""

    def __init__(self, task_status: Any) -> None:
        self.scope = trio.CancelScope()
        self.serving = False
        self.boot_id: str | None = None
        self._task_status = task_status

    def started(self, value: object = None) -> None:
        self.serving = True
        self._task_status.started(value)

    async def abandon_on(self, shutdown: trio.Event, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await shutdown.wait()
        if not self.serving:
            self.scope.cancel()


async def _reload_token(api_token: ApiToken) -> None:
    try:
        reloaded = await trio.to_thread.run_sync(api_token.reload)
    except ConfigError as exc:
        log.error("api_token_reload_failed", error=str(exc), kept="the token in force")
        return
    if reloaded:
        log.info("api_token_reloaded", path=str(api_token.path))
    elif api_token.current is not None:
        log.info("api_token_reload_ignored", why="the token comes from PODCAST_JOB_API_TOKEN, not a file")


async def _reload_named_tokens(credentials: Credentials) -> None:
    path = credentials.tokens_file.path if credentials.tokens_file is not None else None
    try:
        count = await trio.to_thread.run_sync(credentials.load)
    except ConfigError as exc:
        log.error("api_tokens_reload_failed", path=str(path), error=str(exc), kept=f"{credentials.named} tokens")
        return
    if credentials.removed:
        # Fail closed: the named tokens are gone with their file; only the operator token (if set) still opens the API.
        log.warning("api_tokens_file_removed", path=str(path), kept="no named token; the API still needs a token")
        return
    log.info("api_tokens_reloaded", path=str(path), tokens=count, required=credentials.required)


async def run_supervisor(
    config: Config,
    kinds: KindCatalog,
    *,
    shutdown: trio.Event | None = None,
    freeze_heap: bool = False,
    http_limits: HttpLimits | None = None,
    credentials: Credentials | None = None,
    held_signals: Callable[[], Sequence[int]] | None = None,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the supervisor until ``shutdown`` is set (or SIGTERM/SIGINT). ``started()`` gives the ``Supervisor``.
    ``credentials``: the API's tokens, loaded (None: the config's, read here; a file that cannot be read raises
    ``ConfigError`` before anything starts).

    ``freeze_heap`` (``supervisor serve``, which owns its process): once serving, what startup built is moved out
    of the garbage collector's sight (``gc.freeze``). ``http_limits``: the HTTP server's timeouts (defaults unless
    given). ``held_signals``: what the process's entry held before this boot could hear it (``supervisor serve``:
    ``_entry.HeldSignals.take``), acted on first.
    """
    if shutdown is None:
        shutdown = trio.Event()
    if credentials is None:
        credentials = Credentials.from_config(config)
        await trio.to_thread.run_sync(credentials.load)
    async with trio.open_nursery() as watching:
        # Heard from the first moment of the boot: a SIGHUP while starting never ends the process, a SIGTERM/SIGINT
        # ends the start (docs/operations.md § Running).
        await watching.start(_watch_signals, shutdown, credentials, held_signals or tuple)
        start = _Start(task_status)
        await watching.start(start.abandon_on, shutdown)
        try:
            with start.scope:
                # The registry's runtime outlives every use of the registry: its aclose (in run_with_registry's
                # finally) included.
                async with registry_runtime(config):
                    await _run_with_registry(
                        config, kinds, credentials, shutdown=shutdown, freeze_heap=freeze_heap,
                        http_limits=http_limits, start=start,
                    )  # fmt: skip
        finally:
            # The last line of a boot that served, or that a stop ended before it did (one whose start failed ends
            # with its error instead).
            if start.serving:
                log.info("supervisor_stopped", boot_id=start.boot_id)
            elif start.scope.cancelled_caught:
                log.info("supervisor_stopped", boot_id=start.boot_id, before="serving")
        watching.cancel_scope.cancel()


async def _run_with_registry(
    config: Config,
    kinds: KindCatalog,
    credentials: Credentials,
    *,
    shutdown: trio.Event,
    freeze_heap: bool,
    http_limits: HttpLimits | None,
    start: _Start,
) -> None:
    limits = http_limits if http_limits is not None else HttpLimits()
    boot_id = start.boot_id = secrets.token_hex(16)
    # Events are written with each change only when something will send them (a webhook).
    # One wall clock for every timestamp and rule of this boot, moved by the monotonic clock: a step of the system
    # clock fires no rule and skips no backoff (ADR 0010).
    clock = SteadyWallClock()
    try:
        registry = await open_registry(config, boot_id=boot_id, outbox=config.webhook_url is not None, clock=clock)
    except RegistryNotOpened:
        raise  # its own kind kept (SchemaNotHonoured: its own exit code)
    except RegistryError as exc:
        # A lock another process holds is a moment's, not the configuration's: said apart (its own exit code).
        raise RegistryNotOpened(str(exc), temporary=isinstance(exc, RegistryLocked)) from exc
    try:
        # The data dir's lock, held to the end of this process: the boot it names is proved gone (ADR 0012 §9). Taken
        # once the registry is open: a registry that cannot be opened leaves the data dir as it found it.
        succession = await trio.to_thread.run_sync(DataDirLock.take, config.viewer_dir, boot_id)
    except BaseException:
        with trio.CancelScope(shield=True):
            await registry.aclose()
        raise
    try:
        await _serve_boot(
            config, kinds, credentials, boot_id, clock, registry, succession.succeeds, shutdown=shutdown,
            freeze_heap=freeze_heap, limits=limits, start=start,
        )  # fmt: skip
    finally:
        succession.release()


def _say_started(supervisor: Supervisor, url: str) -> None:
    config = supervisor.config
    log.info(
        "supervisor_started",
        url=url,
        heartbeat_base_url=supervisor.heartbeat_base_url,
        boot_id=supervisor.boot_id,
        exec_mode=supervisor.exec_mode,
        data_dir=str(supervisor.data_dir),
        max_concurrent=config.max_concurrent,
        registry=redacted_url(config.database_url) if config.database_url else str(config.registry_path),
        # Behind a transaction pooler there is no LISTEN (unless elsewhere): the fleet moves by its sweeps.
        database_pooler=config.database_pooler if config.database_url else None,
        database_listen=redacted_url(config.database_listen_url) if config.database_listen_url else None,
        host_id=config.host_id,
        leader=supervisor.leading,
    )


def _freeze_the_startup_heap() -> None:
    """Modules, the app and its routes, the kinds: they live as long as the process. Out of the collector's sight, a
    full collection scans only what came since; over the startup heap it was a 25-45 ms stop of the event loop every
    few seconds under load (docs/performance.md: enqueue, promotion tails). Startup's garbage is collected first, or it
    would be kept forever."""
    gc.collect()
    gc.freeze()


async def _serve_boot(
    config: Config,
    kinds: KindCatalog,
    credentials: Credentials,
    boot_id: str,
    clock: SteadyWallClock,
    registry: Registry,
    succeeds: str | None,
    *,
    shutdown: trio.Event,
    freeze_heap: bool,
    limits: HttpLimits,
    start: _Start,
) -> None:
    # Bound first: the port is known before the boot's parts are made, so jobs get a heartbeat URL from the start.
    sock = bind_socket(config.bind_host, config.bind_port)
    try:
        host, port = sock.getsockname()[:2]
        url = public_base_url(host, port)
        supervisor = Supervisor(
            config, kinds, registry, boot_id=boot_id, wall_clock=clock, succeeds=succeeds,
            # How jobs reach us: from a container, our loopback address is the container's own, so it may be set.
            heartbeat_base_url=config.heartbeat_base_url or url,
        )  # fmt: skip
    except BaseException:
        sock.close()
        raise
    http_done = trio.Event()
    notifier = Notifier()  # systemd's notify socket, when run by systemd (Type=notify)
    try:
        async with trio.open_nursery() as root:
            await supervisor.start(root)  # the core's tasks, in order (Supervisor.start)
            serve = functools.partial(serve_http, limits=limits)
            await root.start(serve, supervisor, credentials, sock, shutdown, http_done)
            _say_started(supervisor, url)
            if freeze_heap:
                _freeze_the_startup_heap()
            notifier.send(f"READY=1\nSTATUS=serving on {supervisor.heartbeat_base_url}")
            if notifier.watchdog_interval_s is not None:
                await root.start(run_watchdog, notifier, lambda: supervisor.last_sweep_done, config.sweep_interval_s)
            start.started(supervisor)
            await shutdown.wait()
            notifier.send("STOPPING=1")
            # Event streams never end by themselves: end them now, so their connections finish like any other
            # request instead of holding the graceful stop until its deadline.
            supervisor.end_event_streams()
            # Graceful shutdown is a deadline on the owning scope.
            with trio.move_on_after(limits.graceful_timeout_s + 2):
                await http_done.wait()
            root.cancel_scope.cancel()
    finally:
        sock.close()
        with trio.CancelScope(shield=True):
            await supervisor.executor.aclose()
            await registry.aclose()
