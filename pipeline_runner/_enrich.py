"""``pipeline-runner enrich``: the corpus-wide pass. Reads every complete episode, writes ``index.json``.

It runs under the same job budget as ``run`` (ADR-150 D1) and writes the same kind of manifest.
"""

from __future__ import annotations

import math
from collections import defaultdict
from decimal import Decimal
from typing import Any

import trio

from ._config import RunnerConfig
from ._corpus import Corpus
from ._events import EventSink, utc_now_iso
from ._heartbeat import Heartbeat
from ._run import (
    EXIT_CODE_FOR_REASON,
    REASON_COMPLETED,
    REASON_CRASHED,
    REASON_TERMINATED,
    REASON_TIME_BUDGET_EXHAUSTED,
    Counts,
    RunOutcome,
    StopSignal,
    publish_outcome,
)


class EnrichRun:
    def __init__(
        self, config: RunnerConfig, *, events: EventSink, heartbeat: Heartbeat, stop: StopSignal | None = None
    ) -> None:
        self.config = config
        self.events = events
        self.heartbeat = heartbeat
        self.stop = stop or StopSignal()
        self.corpus = Corpus(config.corpus_dir)
        self.counts = Counts()
        self._job_scope: trio.CancelScope | None = None

    def _on_stop(self, reason: str) -> None:
        if reason == REASON_TERMINATED and self._job_scope is not None:
            self._job_scope.cancel()

    async def run(self) -> RunOutcome:
        started_at = utc_now_iso()
        budget_s = self.config.processing_loop_budget_s
        job_deadline = trio.current_time() + budget_s if budget_s is not None else math.inf
        self.events.emit("run_started", kind="enrich", processing_loop_budget_s=budget_s)
        reason = REASON_CRASHED
        self.stop.add_hook(self._on_stop)
        try:
            # ADR-150 D1: the job budget bounds the enrichment pass too.
            with trio.CancelScope(deadline=job_deadline) as self._job_scope:
                if self.stop.reason is None:
                    await self._enrich()
            if self._job_scope.cancelled_caught:
                self.stop.request(REASON_TIME_BUDGET_EXHAUSTED)
            reason = self.stop.reason or REASON_COMPLETED
        finally:
            self.stop.remove_hook(self._on_stop)
            path = await publish_outcome(
                self.corpus,
                self.events,
                self.heartbeat,
                self.config,
                kind="enrich",
                started_at=started_at,
                reason=reason,
                counts=self.counts,
                spend_usd=Decimal(0),
                extra={},
            )
        return RunOutcome(reason, EXIT_CODE_FOR_REASON[reason], self.counts, Decimal(0), path)

    async def _enrich(self) -> None:
        self.heartbeat.set_stage("enriching")
        episodes = await self.corpus.complete_episodes()
        self.heartbeat.set_total(len(episodes))
        feeds: dict[str, list[str]] = defaultdict(list)
        index_episodes: list[dict[str, Any]] = []
        for meta in episodes:
            feed_url = str(meta.get("feed_url", ""))
            feeds[feed_url].append(meta["key"])
            index_episodes.append(
                {
                    "key": meta["key"],
                    "guid": meta.get("guid"),
                    "title": meta.get("title"),
                    "feed_url": feed_url,
                    "duration_s": meta.get("duration_s"),
                    "audio_bytes": meta.get("audio_bytes"),
                    "has_transcript": meta["has_transcript"],
                }
            )
            self.counts.done += 1
        await self.corpus.write_index(
            {
                "generated_at": utc_now_iso(),
                "feeds": [{"feed_url": url, "episodes": keys} for url, keys in sorted(feeds.items())],
                "episodes": index_episodes,
            }
        )
        self.heartbeat.advance(len(episodes))
