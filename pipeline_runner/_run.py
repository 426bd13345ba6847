"""The pipeline run and the enrichment pass, and the three nested deadlines of ADR-150 D6.

The nursery tree of one ``run`` (the package layout follows it)::

    services nursery (_cli)            event writer, heartbeat -- drained at the end, not cancelled
    └── guard nursery (_cli)           signal watcher (SIGTERM/SIGINT -> stop "terminated")
        └── job scope                  processing_loop_budget_s (looser), cancels everything below
            ├── feed fetches           each under the episode budget and the transport timeouts
            └── workers nursery        `workers` tasks + the dispatcher (this task)
                └── episode scope      episode_budget_s (loose), one per episode
                    └── httpx call     TransportTimeouts (tight)

No worker can outlive the run (ADR-150 D1): workers are tasks of the workers nursery, and any
exception in the dispatcher or a worker cancels all of them before it propagates. A graceful stop
(cost cap, scheduling failure) cancels the dispatcher at once and puts a grace deadline on the
workers nursery -- "graceful shutdown is a deadline on the owning scope".
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal

import httpx
import trio

from . import _fs
from ._budget import CostLedger
from ._config import RunnerConfig
from ._corpus import AUDIO_NAME, EPISODE_META_NAME, TRANSCRIPT_NAME, Corpus, PoisonMemo, episode_key
from ._errors import EpisodeBudgetExceededError, EpisodeError, FeedError, FeedFetchError, TranscriptionError
from ._events import EventSink, utc_now_iso
from ._exit_codes import (
    EXIT_ALL_FEEDS_FAILED,
    EXIT_BUDGET_EXHAUSTED,
    EXIT_CRASH,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_TIME_BUDGET_EXHAUSTED,
    EXIT_TRANSIENT,
)
from ._feed import Episode, Feed, parse_feed
from ._feed_values import same_location
from ._heartbeat import Heartbeat
from ._http import HttpSources, open_client

log = logging.getLogger(__name__)

REASON_COMPLETED: Final = "completed"
REASON_BUDGET_EXHAUSTED: Final = "budget_exhausted"
REASON_TIME_BUDGET_EXHAUSTED: Final = "time_budget_exhausted"
REASON_SCHEDULING_FAILED: Final = "scheduling_failed"
REASON_TERMINATED: Final = "terminated"
REASON_CRASHED: Final = "crashed"
REASON_ALL_FEEDS_FAILED: Final = "all_feeds_failed"
REASON_ALL_FEEDS_UNAVAILABLE: Final = "all_feeds_unavailable"

EXIT_CODE_FOR_REASON: Final[dict[str, int]] = {
    REASON_COMPLETED: EXIT_OK,
    REASON_BUDGET_EXHAUSTED: EXIT_BUDGET_EXHAUSTED,
    REASON_TIME_BUDGET_EXHAUSTED: EXIT_TIME_BUDGET_EXHAUSTED,
    REASON_SCHEDULING_FAILED: EXIT_CRASH,
    REASON_TERMINATED: EXIT_TERMINATED,
    REASON_CRASHED: EXIT_CRASH,
    REASON_ALL_FEEDS_FAILED: EXIT_ALL_FEEDS_FAILED,
    REASON_ALL_FEEDS_UNAVAILABLE: EXIT_TRANSIENT,
}

# When the feed does not say how long an episode is, model it from its size at 128 kbit/s.
_ASSUMED_BYTES_PER_AUDIO_SECOND: Final = Decimal(16_000)
_MAX_LISTED_FAILURES: Final = 200
# A feed that declares a move is followed to its new address this many times per run at most.
MAX_FEED_MOVES: Final = 3


class StopSignal:
    """Why the run stops early; the first reason wins. Hooks react (cancel scopes), they never raise."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._hooks: list[Callable[[str], None]] = []

    def request(self, reason: str) -> None:
        if self.reason is not None:
            return
        log.warning("stopping the run: %s", reason)
        self.reason = reason
        for hook in list(self._hooks):
            hook(reason)

    def add_hook(self, hook: Callable[[str], None]) -> None:
        self._hooks.append(hook)
        if self.reason is not None:
            hook(self.reason)

    def remove_hook(self, hook: Callable[[str], None]) -> None:
        self._hooks.remove(hook)


@dataclasses.dataclass
class Counts:
    done: int = 0
    skipped: int = 0
    failed: int = 0
    poisoned: int = 0
    cancelled: int = 0


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    reason: str
    exit_code: int
    counts: Counts
    spend_usd: Decimal
    manifest_path: Path


_Refused = Literal["refused"]


class PipelineRun:
    """One ``pipeline-runner run``. Construct, then ``await run()`` exactly once."""

    def __init__(
        self,
        config: RunnerConfig,
        *,
        events: EventSink,
        heartbeat: Heartbeat,
        stop: StopSignal | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self.events = events
        self.heartbeat = heartbeat
        self.stop = stop or StopSignal()
        self._transport = transport
        self.corpus = Corpus(config.corpus_dir)
        self.memo = PoisonMemo(self.corpus.poison_path, config.poison_threshold)
        self.ledger = CostLedger(config.cost_cap_usd)
        self.counts = Counts()
        self.planned = 0
        self.feeds_ok = 0
        self.feeds_failed: list[dict[str, Any]] = []
        self.feeds_moved: list[dict[str, str]] = []
        self.failures: list[dict[str, Any]] = []
        self.poisoned: list[dict[str, Any]] = []
        self.in_flight: dict[str, Episode] = {}
        self._open = _OpenEpisodes()
        self._job_scope: trio.CancelScope | None = None
        self._dispatch_scope: trio.CancelScope | None = None
        self._workers_scope: trio.CancelScope | None = None
        self._sources_obj: HttpSources | None = None

    # -- the stop hook: how each stop reason reaches the scopes ------------------------------------

    def _on_stop(self, reason: str) -> None:
        if reason == REASON_TERMINATED:
            if self._job_scope is not None:
                self._job_scope.cancel()
            return
        # A graceful stop: take no more episodes now, and give the in-flight ones a grace deadline.
        if self._dispatch_scope is not None:
            self._dispatch_scope.cancel()
        if self._workers_scope is not None:
            grace_deadline = trio.current_time() + self.config.stop_grace_s
            self._workers_scope.deadline = min(self._workers_scope.deadline, grace_deadline)

    # -- the run ----------------------------------------------------------------------------------

    async def run(self) -> RunOutcome:
        started_at = utc_now_iso()
        budget_s = self.config.processing_loop_budget_s
        # ADR-150 D1: the job budget is a cancel scope around all the work; nothing below can escape it.
        job_deadline = trio.current_time() + budget_s if budget_s is not None else math.inf
        self.events.emit(
            "run_started",
            kind="run",
            feeds=list(self.config.feeds),
            max_episodes=self.config.max_episodes,
            processing_loop_budget_s=budget_s,
            cost_cap_usd=float(self.config.cost_cap_usd),
        )
        reason = REASON_CRASHED
        self.stop.add_hook(self._on_stop)
        try:
            await self.corpus.ensure_layout()
            # Before this run stages anything: what a killed run left behind goes, once its owner is provably gone.
            await self.corpus.remove_dead_staging()
            await self.memo.load()
            async with open_client(self.config.transport, transport=self._transport) as client:
                self._sources_obj = HttpSources(client, self.config.transport)
                with trio.CancelScope(deadline=job_deadline) as self._job_scope:
                    if self.stop.reason is None:
                        await self._process()
                if self._job_scope.cancelled_caught:
                    self.stop.request(REASON_TIME_BUDGET_EXHAUSTED)
            reason = self.stop.reason or REASON_COMPLETED
            if reason == REASON_COMPLETED and self.feeds_failed and not self.feeds_ok:
                # Every feed failed: a run that did nothing must not be recorded as a success. When every failure
                # may pass by itself (unreachable, timeout, 5xx, 429), it is "try again later", not a failure.
                transient = all(failed["transient"] for failed in self.feeds_failed)
                reason = REASON_ALL_FEEDS_UNAVAILABLE if transient else REASON_ALL_FEEDS_FAILED
        finally:
            self._sources_obj = None
            self.stop.remove_hook(self._on_stop)
            manifest_path = await self._finalize(started_at, reason)
        return RunOutcome(
            reason=reason,
            exit_code=EXIT_CODE_FOR_REASON[reason],
            counts=self.counts,
            spend_usd=self.ledger.spent_usd,
            manifest_path=manifest_path,
        )

    async def _process(self) -> None:
        self.heartbeat.set_stage("fetching_feeds")
        plan = await self._plan()
        self.planned = len(plan)
        self.heartbeat.set_total(len(plan))
        self.heartbeat.set_stage("processing")
        send, recv = trio.open_memory_channel[Episode](0)
        async with trio.open_nursery() as workers:
            self._workers_scope = workers.cancel_scope
            for index in range(self.config.workers):
                await workers.start(self._worker, recv.clone(), index)
            recv.close()
            async with send:
                with trio.CancelScope() as self._dispatch_scope:
                    if self.stop.reason is None:
                        await self._dispatch(send, plan)
            # Leaving `async with send` closed the channel: workers finish what they hold and return.

    async def _plan(self) -> list[Episode]:
        plan: list[Episode] = []
        keys: set[str] = set()
        for url in self.config.feeds:
            try:
                # A feed served one byte at a time beats every read timeout; the episode budget bounds it
                # (one budget for the feed, its moves included).
                with trio.fail_after(self.config.episode_budget_s):
                    feed = await self._read_feed(url)
            except trio.TooSlowError:
                # A server too slow for the budget (dripping, overloaded) is a timeout: it may pass.
                budget = self.config.episode_budget_s
                self._feed_failed(FeedFetchError(url, f"over the {budget} s budget", transient=True))
                continue
            except FeedError as exc:
                self._feed_failed(exc)
                continue
            self.feeds_ok += 1
            for episode in feed.episodes:
                key = episode_key(episode.guid)
                if key not in keys:
                    keys.add(key)
                    plan.append(episode)
        if self.config.max_episodes is not None:
            plan = plan[: self.config.max_episodes]
        return plan

    async def _read_feed(self, url: str) -> Feed:
        """Fetch and parse one configured feed, following the moves it declares (at most MAX_FEED_MOVES).

        Each move is reported (``feed_moved``) so that an operator can update the job's feed URL. A
        move back to an address already read this run ends the chain there. When the new address fails,
        the old document's episodes are used if it has any; otherwise the feed fails, naming the move.
        """
        feed = await self._fetch_and_parse(url)
        visited = [url]
        while feed.moved_to is not None:
            target = feed.moved_to
            if any(same_location(target, seen) for seen in visited):
                log.warning("feed %s: %s moves back to %s; staying at %s", url, feed.url, target, feed.url)
                break
            if len(visited) > MAX_FEED_MOVES:
                if feed.episodes:
                    log.warning("feed %s: moved %d times; not following %s this run", url, MAX_FEED_MOVES, target)
                    break
                raise FeedFetchError(url, f"moved more than {MAX_FEED_MOVES} times (last to {target})")
            self.feeds_moved.append({"feed_url": url, "from_url": feed.url, "to_url": target})
            self.events.emit("feed_moved", feed_url=url, from_url=feed.url, to_url=target)
            visited.append(target)
            try:
                moved = await self._fetch_and_parse(target)
            except FeedError as exc:
                if not feed.episodes:
                    raise type(exc)(url, f"moved to {target}: {exc.reason}", transient=exc.transient) from exc
                log.warning("feed %s: its new address failed (%s); using the episodes of %s", url, exc, feed.url)
                break
            feed = moved
        return feed

    async def _fetch_and_parse(self, url: str) -> Feed:
        document = await self._sources.fetch_feed(url, max_bytes=self.config.max_feed_bytes)
        return await _fs.run_blocking(functools.partial(parse_feed, url, document.body, base_url=document.final_url))

    def _feed_failed(self, exc: FeedError) -> None:
        log.warning("%s", exc)
        self.feeds_failed.append({"feed_url": exc.feed_url, "reason": exc.reason, "transient": exc.transient})
        self.events.emit("feed_failed", feed_url=exc.feed_url, reason=exc.reason, transient=exc.transient)

    async def _dispatch(self, send: trio.MemorySendChannel[Episode], plan: list[Episode]) -> None:
        # Suspects first (in flight when a run was killed), each alone; then the rest, concurrently.
        plan = sorted(plan, key=lambda episode: not self.memo.is_suspect(episode_key(episode.guid)))
        for episode in plan:
            if self.stop.reason is not None:
                return
            key = episode_key(episode.guid)
            if await self.corpus.is_complete(key):
                self.counts.skipped += 1
                self.events.emit("episode_skipped", **_ids(episode, key), reason="present")
                self.heartbeat.advance()
                continue
            if self.memo.is_poisoned(key):
                # ADR-150 D4: a deterministically fatal episode is skipped, so resubmission cannot loop.
                self.counts.poisoned += 1
                failures = self.memo.failures(key)
                self.poisoned.append({**_ids(episode, key), "failures": failures})
                self.events.emit("episode_skipped", **_ids(episode, key), reason="poisoned", failures=failures)
                self.heartbeat.advance()
                continue
            # ADR-150 D2: scheduling is defended, not just work -- a failure to hand out stops submission.
            try:
                if self.memo.is_suspect(key):
                    await self._hand_out_alone(send, episode)
                else:
                    await self._hand_out_counted(send, episode)
            except Exception as exc:
                log.error("could not hand out episode %s: %r; stopping submission", episode.guid, exc)
                self.stop.request(REASON_SCHEDULING_FAILED)
                return

    async def _hand_out(self, send: trio.MemorySendChannel[Episode], episode: Episode) -> None:
        await send.send(episode)

    async def _hand_out_counted(self, send: trio.MemorySendChannel[Episode], episode: Episode) -> None:
        self._open.opened()
        try:
            await self._hand_out(send, episode)
        except BaseException:
            self._open.closed()  # never reached a worker
            raise

    async def _hand_out_alone(self, send: trio.MemorySendChannel[Episode], episode: Episode) -> None:
        """A suspect runs with no other episode in flight, from its start to its end (INV-POISON-ATTRIBUTED).

        A process that is killed counts an attempt against every episode in flight (each was counted before it
        ran): the one that killed it and any bystander. Alone, a kill is this episode's alone: an innocent bystander
        of one crash is cleared by its next, solitary run, and only an episode that kills the run by itself
        reaches the poison threshold.
        """
        await self._open.wait_none()
        await self._hand_out_counted(send, episode)
        await self._open.wait_none()

    async def _worker(
        self,
        recv: trio.MemoryReceiveChannel[Episode],
        index: int,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        async with recv:
            async for episode in recv:
                try:
                    await self._run_episode(episode)
                finally:
                    self._open.closed()

    async def _run_episode(self, episode: Episode) -> None:
        key = episode_key(episode.guid)
        self.in_flight[key] = episode
        # ADR-150 D4: the attempt is counted before it runs, so one that kills the whole process still counts.
        await self.memo.begin(key, guid=episode.guid, feed_url=episode.feed_url)
        # Whatever happens below, an exception that is not an EpisodeError (a bug) propagates and
        # cancels the whole workers nursery; Cancelled leaves the key in in_flight, counted at the end.
        try:
            # ADR-150 D6: the episode budget (loose) -- cancels only this episode.
            with trio.move_on_after(self.config.episode_budget_s) as episode_scope:
                result = await self._episode_work(episode, key)
            if episode_scope.cancelled_caught:
                raise EpisodeBudgetExceededError(f"episode over its {self.config.episode_budget_s} s budget")
        except EpisodeError as exc:
            failures = await self.memo.record_failure(
                key, guid=episode.guid, feed_url=episode.feed_url, reason=exc.reason
            )
            del self.in_flight[key]
            self.counts.failed += 1
            if len(self.failures) < _MAX_LISTED_FAILURES:
                self.failures.append({**_ids(episode, key), "reason": exc.reason, "failures": failures})
            self.events.emit("episode_failed", **_ids(episode, key), reason=exc.reason, failures=failures)
            self.heartbeat.advance()
            return
        except BaseException:
            # Stopped from outside (job budget, cost-cap grace, SIGTERM) or a bug: not this episode's failure.
            await self.memo.abandon(key)
            raise
        del self.in_flight[key]
        if result == "refused":
            await self.memo.abandon(key)
            self.counts.cancelled += 1
            self.events.emit("episode_cancelled", **_ids(episode, key), reason=REASON_BUDGET_EXHAUSTED)
            return
        await self.memo.clear(key)
        self.counts.done += 1
        self.events.emit("episode_done", **_ids(episode, key), **result)
        self.heartbeat.advance()

    async def _episode_work(self, episode: Episode, key: str) -> dict[str, Any] | _Refused:
        staging = await self.corpus.new_staging_dir(self.config.job_id)
        committed = False
        try:
            audio_bytes = await self._sources.download(
                episode.enclosure_url, staging / AUDIO_NAME, max_bytes=self.config.max_enclosure_bytes
            )
            meta: dict[str, Any] = {
                "guid": episode.guid,
                "guid_source": episode.guid_source,
                "feed_url": episode.feed_url,
                "title": episode.title,
                "enclosure_url": episode.enclosure_url,
                "enclosure_type": episode.enclosure_type,
                "duration_s": episode.duration_s,
                "published": episode.published,
                "audio_bytes": audio_bytes,
                "cost_usd": None,
                "job_id": self.config.job_id,
                "written_at": utc_now_iso(),
            }
            if self.config.transcribe_url is not None:
                transcript = await self._transcribe(episode, staging, audio_bytes, meta)
                if transcript is None:
                    return "refused"
                await _fs.run_blocking(_fs.write_json_atomic, staging / TRANSCRIPT_NAME, transcript)
            await _fs.run_blocking(_fs.write_json_atomic, staging / EPISODE_META_NAME, meta)
            await self.corpus.commit_episode(staging, key)
            committed = True
            return {"audio_bytes": audio_bytes, "cost_usd": meta["cost_usd"]}
        finally:
            if not committed:
                await self.corpus.discard_staging(staging)

    async def _transcribe(
        self, episode: Episode, staging: Path, audio_bytes: int, meta: dict[str, Any]
    ) -> dict[str, Any] | None:
        assert self.config.transcribe_url is not None
        if episode.duration_s is not None:
            audio_s = Decimal(repr(episode.duration_s))
        else:
            audio_s = Decimal(audio_bytes) / _ASSUMED_BYTES_PER_AUDIO_SECOND
        cost = audio_s / 60 * self.config.transcribe_usd_per_audio_minute
        # ADR-150 D5: claim before spending; a refused claim is a planned stop, not an exception.
        reservation = self.ledger.try_reserve(cost)
        if reservation is None:
            self.stop.request(REASON_BUDGET_EXHAUSTED)
            return None
        try:
            transcript = await self._sources.transcribe(
                self.config.transcribe_url, staging / AUDIO_NAME, metadata={"guid": episode.guid}
            )
        except TranscriptionError:
            self.ledger.release(reservation)  # the provider refused: modelled as not billed
            raise
        except BaseException:
            # Cancelled mid-call: the provider may have billed it, so the cap counts it.
            self.ledger.commit(reservation)
            raise
        self.ledger.commit(reservation)
        meta["cost_usd"] = float(cost)
        return transcript

    @property
    def _sources(self) -> HttpSources:
        # Set in run() for exactly the lifetime of the HTTP client; workers only exist inside it.
        assert self._sources_obj is not None
        return self._sources_obj

    async def _finalize(self, started_at: str, reason: str) -> Path:
        self.heartbeat.set_stage("finalizing")
        for key, episode in sorted(self.in_flight.items()):
            self.counts.cancelled += 1
            self.events.emit("episode_cancelled", **_ids(episode, key), reason=reason)
        self.in_flight.clear()
        return await publish_outcome(
            self.corpus,
            self.events,
            self.heartbeat,
            self.config,
            kind="run",
            started_at=started_at,
            reason=reason,
            counts=self.counts,
            spend_usd=self.ledger.spent_usd,
            extra={
                "planned": self.planned,
                "feeds": {"ok": self.feeds_ok, "failed": self.feeds_failed, "moved": self.feeds_moved},
                "failures": self.failures,
                "poisoned": self.poisoned,
            },
        )


class _OpenEpisodes:
    """How many episodes are handed out and not yet ended; ``wait_none`` returns once there are none."""

    def __init__(self) -> None:
        self.count = 0
        self._none = trio.Event()
        self._none.set()

    def opened(self) -> None:
        self.count += 1
        if self._none.is_set():
            self._none = trio.Event()

    def closed(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._none.set()

    async def wait_none(self) -> None:
        await self._none.wait()


def _ids(episode: Episode, key: str) -> dict[str, str]:
    return {"guid": episode.guid, "key": key, "feed_url": episode.feed_url}


async def publish_outcome(
    corpus: Corpus,
    events: EventSink,
    heartbeat: Heartbeat,
    config: RunnerConfig,
    *,
    kind: str,
    started_at: str,
    reason: str,
    counts: Any,
    spend_usd: Decimal,
    extra: dict[str, Any],
) -> Path:
    """The end of every run, `run` or `enrich`: the manifest (atomic, best effort), `run_finished`, last stage."""
    exit_code = EXIT_CODE_FOR_REASON[reason]
    manifest: dict[str, Any] = {
        "job_id": config.job_id,
        "kind": kind,
        "started_at": started_at,
        "ended_at": utc_now_iso(),
        "reason": reason,
        "exit_code": exit_code,
        "counts": dataclasses.asdict(counts),
        "spend_usd": float(spend_usd),
        "cost_cap_usd": float(config.cost_cap_usd),
        "processing_loop_budget_s": config.processing_loop_budget_s,
        **extra,
    }
    path = await _write_manifest_best_effort(corpus, config.job_id, manifest)
    events.emit(
        "run_finished",
        kind=kind,
        reason=reason,
        exit_code=exit_code,
        counts=dataclasses.asdict(counts),
        spend_usd=float(spend_usd),
        manifest=str(path),
    )
    heartbeat.set_stage("finished")
    return path


async def _write_manifest_best_effort(corpus: Corpus, job_id: str, manifest: dict[str, Any]) -> Path:
    try:
        return await corpus.write_manifest(job_id, manifest)
    except OSError as exc:
        # Finalization runs on the crash path too: a full disk must not mask the original error.
        log.error("could not write the run manifest: %s", exc)
        return corpus.runs_dir / job_id / "run.json"
