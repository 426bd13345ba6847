"""The CLI's live commands, driven by the event stream: ``events``, ``wait`` and ``jobs --watch``.

On a terminal they draw with ``rich`` (a live view, redrawn on each event and once a second for the ages); otherwise
they print plain lines, one per change, for logs. Progress (units, stage) is not an event (heartbeats come by the
thousand): the views read the rows they show when an event says something changed, and again every
``PROGRESS_REFRESH_S`` for the progress bars — a refresh of what is on screen, never how an outcome is learnt.

``wait``'s exit code mirrors the outcome: 0 succeeded, 10 failed, 11 cancelled, 12 stale, 124 the timeout passed.
For several jobs, the worst in this order (best to worst): succeeded, cancelled (someone stopped it on purpose),
failed, stale (the supervisor could not tell how it ended: a human must look), and the timeout (some outcome is not
known yet). A resubmitted job goes back to ``queued`` and is followed across its attempts: only a terminal status
ends the wait for it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import trio
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ..domain import RESUBMITTED, JobStatus
from ._stream import GAP, Api, EventSource, Message

EXIT_SUCCEEDED = 0
EXIT_FAILED = 10
EXIT_CANCELLED = 11
EXIT_STALE = 12
EXIT_TIMEOUT = 124
OUTCOME_EXIT = {
    "succeeded": EXIT_SUCCEEDED,
    "failed": EXIT_FAILED,
    "cancelled": EXIT_CANCELLED,
    "stale": EXIT_STALE,
}
# Best to worst (see the module docstring).
SEVERITY = (EXIT_SUCCEEDED, EXIT_CANCELLED, EXIT_FAILED, EXIT_STALE, EXIT_TIMEOUT)
PROGRESS_REFRESH_S = 2.0  # the progress bars of a live view (display only)
PLAIN_PROGRESS_REFRESH_S = 10.0  # a plain log's progress lines, at most this often per job
REDRAW_S = 1.0  # ages on screen tick once a second
WATCH_REFRESH_S = 5.0  # jobs --watch: the table is re-read this often even without events
EVENTS_SHOWN = 6  # jobs --watch: the last few events under the table


def worst(codes: Sequence[int]) -> int:
    return max(codes, key=SEVERITY.index) if codes else EXIT_SUCCEEDED


def _parse_ts(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _age(text: object, now: datetime) -> str:
    ts = _parse_ts(text)
    if ts is None:
        return "-"
    seconds = max(0, int((now - ts).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _units(job: Mapping[str, Any]) -> str:
    done, total = job.get("completed_units") or 0, job.get("total_units")
    return f"{done}/{total}" if total is not None else str(done)


def _flags(job: Mapping[str, Any]) -> list[str]:
    return [name for name in ("stalled", "silent") if job.get(name)]


def _attempt(job: Mapping[str, Any]) -> str:
    attempts, most = job.get("attempts") or 0, job.get("max_attempts") or 1
    return f"attempt {attempts}/{most}" if most > 1 and attempts > 1 else ""


def _progress_cells(job: Mapping[str, Any], now: datetime) -> tuple[RenderableType, str, str]:
    """(bar, elapsed, progress age) of a row."""
    done, total = job.get("completed_units") or 0, job.get("total_units")
    bar: RenderableType
    if total:
        bar = Group(ProgressBar(total=float(total), completed=float(min(done, total)), width=20))
    else:
        bar = Text("-" if not done else f"{done} units", style="dim")
    status = job.get("status")
    if status == "running":
        elapsed = _age(job.get("started_at"), now)
        progress_age = _age(job.get("last_progress_at") or job.get("started_at"), now)
    else:
        elapsed, progress_age = ("-", "-")
    return bar, elapsed, progress_age


_STATUS_STYLE = {
    "queued": "cyan",
    "running": "blue",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "yellow",
    "stale": "magenta",
}


def _status_text(job: Mapping[str, Any]) -> Text:
    status = str(job.get("status"))
    text = Text(status, style=_STATUS_STYLE.get(status, ""))
    if status == "queued" and job.get("queue_position"):
        text.append(f" #{job['queue_position']}", style="dim")
    for flag in _flags(job):
        text.append(f" {flag.upper()}", style="bold red" if flag == "stalled" else "bold yellow")
    return text



def kinds_text(queue: Mapping[str, Any]) -> str:
    """Each kind's running (of its max_running) and queued jobs, as the queue state gives them: ``pipeline 2/2 +3``."""
    parts = []
    for kind, load in sorted((queue.get("kinds") or {}).items()):
        limit = load.get("max_running")
        parts.append(f"{kind} {load.get('running')}{f'/{limit}' if limit is not None else ''} +{load.get('queued')}")
    return ", ".join(parts)

class Output:
    """Where a live command writes: a rich console over ``out``, live on a terminal."""

    def __init__(self, out: TextIO, *, live: bool, quiet: bool = False, err: TextIO | None = None) -> None:
        self.out = out
        self.err = err if err is not None else sys.stderr  # what the command says on the way (busy, reconnecting)
        self.live = live
        self.quiet = quiet  # --json: only the final answer, no lines on the way
        self.console = Console(file=out, force_terminal=live, highlight=False, soft_wrap=not live)

    def line(self, text: str) -> None:
        print(text, file=self.out, flush=True)


def _now() -> datetime:
    return datetime.now(UTC)


# -- events ---------------------------------------------------------------------------------------------------


async def run_events(api: Api, out: Output, *, follow: bool, jobs: Sequence[str], kinds: Sequence[str],
                     as_json: bool) -> int:
    """``supervisor events``: what the server still holds (and, with ``follow``, what comes), one line each."""

    async def show(message: Message) -> bool:
        if as_json:
            if message.event == GAP:
                out.line(json.dumps({"event": GAP, **message.json()}, sort_keys=True))
            else:
                out.line("\n".join(message.data))
            return False
        if message.event == GAP:
            body = message.json()
            out.line(f"-- some events may be missing ({body.get('reason')}: last seen {body.get('last_event_id')})")
            return False
        body = message.json()
        job = body.get("job", {})
        change = (
            f"{body.get('previous_status') or '-'} -> {job.get('status')}"
            if message.event == "job.transition"
            else message.event
        )
        reason = f"  ({body['reason']})" if body.get("reason") else ""
        ts = str(body.get("ts", ""))[:19].replace("T", " ")
        out.line(f"{ts}Z  {job.get('job_id')}  {job.get('kind')}  {change}{reason}")
        return False

    def on_state(state: str) -> None:
        if state.startswith(("reconnecting", "busy")):
            print(f"supervisor events: {state}", file=out.err, flush=True)

    source = EventSource(api, jobs=jobs, kinds=kinds, backlog=True, follow=follow, on_state=on_state)
    await source.run(show)
    return 0


# -- wait -------------------------------------------------------------------------------------------------------


class WaitView:
    """The rows ``wait`` follows, and how they are shown."""

    def __init__(self, job_ids: Sequence[str], out: Output) -> None:
        self.order = list(dict.fromkeys(job_ids))
        self.rows: dict[str, dict[str, Any]] = {}
        self.out = out
        self.state = "connecting"
        self._printed: dict[str, tuple[Any, ...]] = {}
        self._progress: dict[str, tuple[Any, ...]] = {}
        self.started = trio.current_time()

    def pending(self) -> list[str]:
        return [j for j in self.order if not JobStatus(self.rows.get(j, {}).get("status", "queued")).is_terminal]

    def done(self) -> bool:
        return all(j in self.rows for j in self.order) and not self.pending()

    def update(self, job: Mapping[str, Any], *, progress_only: bool = False) -> None:
        job_id = str(job.get("job_id"))
        if job_id not in self.order:
            return
        self.rows[job_id] = dict(job)
        if not self.out.live and not self.out.quiet:
            self._plain(self.rows[job_id], progress_only=progress_only)

    def _plain(self, job: Mapping[str, Any], *, progress_only: bool) -> None:
        """One line per change of status, reason, flags or attempt; a progress line when a refresh finds progress."""
        job_id = str(job.get("job_id"))
        key = (job.get("status"), job.get("error_reason"), tuple(_flags(job)), job.get("attempts"))
        progress = (job.get("completed_units"), job.get("stage"))
        if self._printed.get(job_id) == key and not (progress_only and self._progress.get(job_id) != progress):
            return
        self._printed[job_id], self._progress[job_id] = key, progress
        parts = [f"{_now():%H:%M:%S}", job_id, str(job.get("kind")), str(job.get("status"))]
        if job.get("error_reason"):
            parts.append(f"({job['error_reason']})")
        if job.get("status") == "running":
            parts.append(f"units {_units(job)}")
            if job.get("stage"):
                parts.append(f"stage {job['stage']}")
        parts += [flag.upper() for flag in _flags(job)]
        if _attempt(job):
            parts.append(_attempt(job))
        self.out.line("  ".join(parts))

    def render(self) -> RenderableType:
        now = _now()
        table = Table(box=None, pad_edge=False, header_style="bold")
        for header in ("JOB", "KIND", "STATUS", "PROGRESS", "UNITS", "STAGE", "ELAPSED", "PROGRESS AGE", ""):
            table.add_column(header, no_wrap=True)
        for job_id in self.order:
            job = self.rows.get(job_id)
            if job is None:
                table.add_row(job_id, "", Text("...", style="dim"))
                continue
            bar, elapsed, progress_age = _progress_cells(job, now)
            reason = job.get("error_reason") or ""
            table.add_row(
                job_id,
                str(job.get("kind")),
                _status_text(job),
                bar,
                _units(job),
                str(job.get("stage") or "-"),
                elapsed,
                progress_age,
                Text(" ".join(x for x in (_attempt(job), reason) if x), style="dim"),
            )
        waited = int(trio.current_time() - self.started)
        pending = len(self.pending())
        what = f"waiting {waited}s for {pending} of {len(self.order)} job(s)" if pending else f"done after {waited}s"
        footer = Text(f"{what}; events: {self.state}", style="dim")
        return Group(table, footer)


def wait_result(view: WaitView, timed_out: bool) -> tuple[int, list[dict[str, Any]]]:
    codes, jobs = [], []
    for job_id in view.order:
        job = view.rows.get(job_id, {})
        status = str(job.get("status", "unknown"))
        code = OUTCOME_EXIT.get(status, EXIT_TIMEOUT)
        codes.append(code)
        jobs.append(
            {
                "job_id": job_id,
                "status": status,
                "error_reason": job.get("error_reason"),
                "exit_code": job.get("exit_code"),
                "attempts": job.get("attempts"),
                "outcome_exit": code,
            }
        )
    code = worst(codes)
    if timed_out and code != EXIT_TIMEOUT:  # cannot happen (a timeout leaves one pending), but say what it means
        code = EXIT_TIMEOUT
    return code, jobs


class WaitFollower:
    """How ``wait`` learns its jobs' ends from the event stream: each event updates its job's row; at the start, after
    each reconnect and after a gap, the pending rows are read again (a job may have ended while nobody listened); a
    refresher keeps the progress on screen current."""

    def __init__(self, api: Api, view: WaitView, out: Output) -> None:
        self.api = api
        self.view = view
        self.out = out
        self.source = EventSource(api, jobs=view.order, on_state=self.on_state)

    async def read_rows(self, ids: Sequence[str]) -> None:
        for job_id in ids:
            self.view.update(await self.api.job(job_id))

    async def on_connected(self) -> bool:
        # Once at the start and after each reconnect: a job may have ended while nobody listened.
        await self.read_rows(self.view.pending() if self.view.rows else self.view.order)
        return self.view.done()

    async def on_message(self, message: Message) -> bool:
        if message.event == GAP:
            await self.read_rows(self.view.pending())
        else:
            body = message.json()
            job = body.get("job", {})
            self.view.update(job)
            reason = str(body.get("reason") or "")
            if reason.startswith(RESUBMITTED) and not self.out.live and not self.out.quiet:
                self.out.line(f"{_now():%H:%M:%S}  {job.get('job_id')}  resubmitted, followed: {reason}")
        return self.view.done()

    def on_state(self, state: str) -> None:
        self.view.state = state
        if not self.out.live and state.startswith(("reconnecting", "busy")):
            print(f"supervisor wait: {state}", file=self.out.err, flush=True)

    async def refresh_progress(self) -> None:
        """The progress on screen (units, stage, ages): display only, never how the outcome is learnt."""
        interval = PROGRESS_REFRESH_S if self.out.live else PLAIN_PROGRESS_REFRESH_S
        while True:
            await trio.sleep(interval)
            for job_id in self.view.pending():
                if self.view.rows.get(job_id, {}).get("status") == "running":
                    try:
                        self.view.update(await self.api.job(job_id), progress_only=True)
                    except Exception:  # a refresh that fails shows the older row; the stream decides the outcome
                        pass

    async def follow(self, live: Live | None, timeout_s: float | None) -> bool:
        """Follow the stream until every job has ended; True if ``timeout_s`` passed first."""
        with trio.move_on_after(timeout_s if timeout_s is not None else float("inf")) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.refresh_progress)
                if live is not None:
                    nursery.start_soon(_redraw, live, self.view.render)
                await self.source.run(self.on_message, self.on_connected)
                nursery.cancel_scope.cancel()
        return scope.cancelled_caught


async def run_wait(api: Api, out: Output, job_ids: Sequence[str], *, timeout_s: float | None, as_json: bool) -> int:
    view = WaitView(job_ids, out)
    follower = WaitFollower(api, view, out)
    if out.live and not as_json:
        with Live(view.render(), console=out.console, auto_refresh=False, transient=False) as live:
            timed_out = await follower.follow(live, timeout_s)
            live.update(view.render(), refresh=True)
    else:
        timed_out = await follower.follow(None, timeout_s)
    code, jobs = wait_result(view, timed_out)
    _report_wait(out, view, code, jobs, timed_out=timed_out, timeout_s=timeout_s, as_json=as_json)
    return code


def _report_wait(
    out: Output,
    view: WaitView,
    code: int,
    jobs: list[dict[str, Any]],
    *,
    timed_out: bool,
    timeout_s: float | None,
    as_json: bool,
) -> None:
    """The wait's answer: with --json, every job's outcome and the exit code; on a timeout, the jobs still pending."""
    if as_json:
        out.line(json.dumps({"jobs": jobs, "exit_code": code, "timed_out": timed_out}, indent=2, sort_keys=True))
    if timed_out:
        print(
            f"supervisor wait: timed out after {timeout_s:g} s; still not finished: {', '.join(view.pending())}",
            file=out.err,
            flush=True,
        )


async def _redraw(live: Live, render: Callable[[], RenderableType]) -> None:
    while True:
        live.update(render(), refresh=True)
        await trio.sleep(REDRAW_S)


# -- jobs --watch -----------------------------------------------------------------------------------------------


class WatchView:
    def __init__(self, out: Output) -> None:
        self.out = out
        self.queue: dict[str, Any] = {}
        self.running: list[dict[str, Any]] = []
        self.recent: list[str] = []
        self.state = "connecting"
        self.updated: datetime | None = None
        self._last_plain = ""

    def render(self) -> RenderableType:
        now = _now()
        q = self.queue
        if q:
            paused = Text(" PAUSED ", style="bold white on red") if q.get("paused") else Text("active", style="green")
            head = Text.assemble(
                "queue ", paused, f"   running {q.get('running')}/{q.get('max_concurrent')}   queued {q.get('queued')}"
            )
            if kinds_text(q):
                head.append(f"   {kinds_text(q)}", style="dim")
        else:
            head = Text("queue ...")
        stalled = sum(1 for j in self.running if j.get("stalled"))
        silent = sum(1 for j in self.running if j.get("silent"))
        if stalled or silent:
            head.append(f"   {stalled} stalled, {silent} silent", style="bold red")
        table = Table(box=None, pad_edge=False, header_style="bold")
        for header in ("JOB", "KIND", "STATUS", "PROGRESS", "UNITS", "STAGE", "ELAPSED", "PROGRESS AGE"):
            table.add_column(header, no_wrap=True)
        for job in self.running:
            bar, elapsed, progress_age = _progress_cells(job, now)
            style = "red" if job.get("stalled") else ("yellow" if job.get("silent") else "")
            table.add_row(
                str(job.get("job_id")),
                str(job.get("kind")),
                _status_text(job),
                bar,
                _units(job),
                str(job.get("stage") or "-"),
                elapsed,
                progress_age,
                style=style,
            )
        if not self.running:
            table.add_row(Text("(no job running)", style="dim"))
        updated = f"{self.updated:%H:%M:%S}" if self.updated else "-"
        foot = Text(f"events: {self.state}   rows read {updated}   Ctrl-C to quit", style="dim")
        recent = Text("\n".join(self.recent[-EVENTS_SHOWN:]), style="dim")
        return Group(head, table, recent, foot)

    def plain(self) -> None:
        """Not a terminal: the table as text whenever it changed."""
        q = self.queue
        lines = [
            f"queue {'PAUSED' if q.get('paused') else 'active'}: running {q.get('running')}/{q.get('max_concurrent')},"
            f" queued {q.get('queued')}"
            + (f"; {kinds_text(q)}" if kinds_text(q) else "")
        ]
        for job in self.running:
            flags = " ".join(f.upper() for f in _flags(job))
            stage = job.get("stage") or "-"
            lines.append(f"  {job.get('job_id')}  {job.get('kind')}  units {_units(job)}  {stage} {flags}".rstrip())
        text = "\n".join(lines)
        if text != self._last_plain:
            self._last_plain = text
            self.out.line(f"-- {_now():%H:%M:%S}\n{text}")


class WatchFollower:
    """How ``jobs --watch`` keeps its table: the rows are read at each (re)connect, after events (a burst of them
    makes one read) and every ``WATCH_REFRESH_S``; each event also goes to the last few shown under the table."""

    def __init__(self, api: Api, view: WatchView, out: Output) -> None:
        self.api = api
        self.view = view
        self.out = out
        self.dirty = trio.Event()
        self.source = EventSource(api, on_state=self.on_state)

    async def read(self) -> None:
        self.view.queue = await self.api.queue()
        self.view.running = await self.api.running()
        self.view.updated = _now()
        if not self.out.live:
            self.view.plain()

    async def on_connected(self) -> bool:
        await self.read()
        return False

    async def on_message(self, message: Message) -> bool:
        if message.event != GAP:
            body = message.json()
            job = body.get("job", {})
            what = (
                f"{body.get('previous_status') or '-'} -> {job.get('status')}"
                if message.event == "job.transition"
                else message.event
            )
            self.view.recent.append(f"{_now():%H:%M:%S}  {job.get('job_id')}  {job.get('kind')}  {what}")
            del self.view.recent[:-EVENTS_SHOWN]
        self.dirty.set()
        return False

    def on_state(self, state: str) -> None:
        self.view.state = state

    async def reread(self) -> None:
        """Re-read the rows after events (many events in a burst make one read) and every WATCH_REFRESH_S."""
        while True:
            with trio.move_on_after(WATCH_REFRESH_S):
                await self.dirty.wait()
            self.dirty = trio.Event()
            try:
                await self.read()
            except Exception:  # the stream's reconnects say when the server is gone; the rows stay as last read
                pass

    async def follow(self, live: Live | None) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.reread)
            if live is not None:
                nursery.start_soon(_redraw, live, self.view.render)
            await self.source.run(self.on_message, self.on_connected)
            nursery.cancel_scope.cancel()


async def run_watch(api: Api, out: Output) -> int:
    view = WatchView(out)
    follower = WatchFollower(api, view, out)
    if out.live:
        with Live(view.render(), console=out.console, auto_refresh=False, screen=False) as live:
            await follower.follow(live)
    else:
        await follower.follow(None)
    return 0


async def with_api(url: str, token: str | None, run: Callable[[Api], Awaitable[int]]) -> int:
    api = Api(url, token)
    try:
        return await run(api)
    finally:
        with trio.CancelScope(shield=True):
            await api.aclose()
