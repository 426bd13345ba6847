"""The corpus on disk. It is the ledger (ADR-150 D4): what is in it, complete, is done.

Layout under ``<data>/corpus/``::

    episodes/<key>/episode.json      metadata (guid, feed_url, title, sizes, cost)
    episodes/<key>/audio.bin         the enclosure, as downloaded
    episodes/<key>/transcript.json   only when a transcription provider is configured
    episodes/<key>/COMPLETE          the completion marker, written last
    .tmp/<job_id>.<owner>.<random>/  staging directories (one per episode attempt); <owner> names the process
                                     that made it (``_staging``), so that the next run can remove those of a
                                     killed run once their owner is provably gone
    .poison.json                     the poison-pill memo: failures per episode key, across runs
    .poison.json.lock                its lock file (flock), held across each read-modify-rename; never removed
    .runs/<job_id>/run.json          the run manifest
    index.json                       written by ``enrich``

``<key>`` is the first 32 hex digits of the SHA-256 of the episode GUID, so a GUID with any
characters in it maps to a safe directory name and the same GUID is the same episode in any feed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import trio

from . import _fs, _staging

log = logging.getLogger(__name__)

MARKER_NAME: Final = "COMPLETE"
EPISODE_META_NAME: Final = "episode.json"
AUDIO_NAME: Final = "audio.bin"
TRANSCRIPT_NAME: Final = "transcript.json"


def episode_key(guid: str) -> str:
    return hashlib.sha256(guid.encode("utf-8")).hexdigest()[:32]


class Corpus:
    def __init__(self, root: Path, *, proc: Path = _staging.PROC) -> None:
        self.root = root
        self._proc = proc  # where /proc is; tests point it at a fake one
        self._owner: _staging.ProcessIdentity | None = None
        self._owner_known = False
        self.episodes_dir = root / "episodes"
        self.staging_root = root / ".tmp"
        self.poison_path = root / ".poison.json"
        self.runs_dir = root / ".runs"
        self.index_path = root / "index.json"

    async def ensure_layout(self) -> None:
        def make() -> None:
            for d in (self.episodes_dir, self.staging_root, self.runs_dir):
                d.mkdir(parents=True, exist_ok=True)

        await _fs.run_blocking(make)

    def episode_dir(self, key: str) -> Path:
        return self.episodes_dir / key

    async def is_complete(self, key: str) -> bool:
        # ADR-150 D4: an episode is present only when its completion marker exists; a directory without
        # one is a crash mid-write and is redone.
        return await _fs.run_blocking((self.episode_dir(key) / MARKER_NAME).exists)

    async def owner(self) -> _staging.ProcessIdentity | None:
        """This process's identity, which its staging directories are named with; None when it cannot be read."""
        if not self._owner_known:
            self._owner = await _fs.run_blocking(_staging.read_own_identity, self._proc)
            self._owner_known = True
            if self._owner is None:
                log.warning(
                    "cannot read this process's identity from %s (boot id, pid start time, PID namespace): its "
                    "staging directories carry no owner, and no run will remove them if it is killed",
                    self._proc,
                )
        return self._owner

    async def new_staging_dir(self, job_id: str) -> Path:
        path = self.staging_root / _staging.staging_name(job_id, await self.owner())
        await _fs.run_blocking(lambda: path.mkdir(parents=True))
        return path

    async def remove_dead_staging(self) -> _staging.SweepReport | None:
        """Remove the staging directories of runs that are provably gone (killed runs leave theirs behind).

        Never one whose owner may be alive or cannot be looked up (kept, and logged), never by age. Returns None
        when this process cannot read its own identity, so cannot compare others' with it: then nothing is removed.
        """
        me = await self.owner()
        if me is None:
            return None
        report = await _fs.run_blocking(_staging.sweep, self.staging_root, me, self._proc)
        if report.error is not None:
            log.warning("staging directories not cleaned: %s", report.error)
        for name, why in report.removed:
            log.info("removed staging directory %s: %s", name, why)
        for name, why in report.not_removable:
            log.warning("could not remove staging directory %s (%s); kept", name, why)
        for name, why in report.kept_alive:
            log.info("kept staging directory %s: %s", name, why)
        for name, why in report.kept_unknown:
            log.warning("kept staging directory %s: %s", name, why)
        if report.without_owner:
            shown = ", ".join(report.without_owner[:5]) + (", ..." if len(report.without_owner) > 5 else "")
            log.info(
                "left %d entries in %s alone: their names carry no owner (an older runner's staging directories?): %s",
                len(report.without_owner),
                self.staging_root,
                shown,
            )
        return report

    async def discard_staging(self, staging: Path) -> None:
        # Shielded: this runs on the cancellation path and must not itself be cancelled half-way.
        with trio.CancelScope(shield=True):
            await _fs.run_blocking(_fs.remove_tree, staging)

    async def commit_episode(self, staging: Path, key: str) -> None:
        """Move a fully written staging directory into place, then write the marker (ADR-150 D4).

        staging files fsynced -> staging dir fsynced -> any half-written old copy removed ->
        rename -> parent fsynced -> marker written and fsynced. A crash at any point leaves either
        no episode directory or one without a marker, and both are redone by the next run.
        """
        final = self.episode_dir(key)

        def commit() -> None:
            for child in staging.iterdir():
                with child.open("rb") as fh:
                    os.fsync(fh.fileno())
            _fs.fsync_dir(staging)
            if final.exists():
                # A previous attempt crashed between rename and marker: it is not present, replace it.
                _fs.remove_tree(final)
            os.replace(staging, final)
            _fs.fsync_dir(self.episodes_dir)
            _fs.write_bytes_durably(final / MARKER_NAME, b"")
            _fs.fsync_dir(final)

        # Shielded: once started, the commit finishes, so a cancel never leaves a torn rename.
        with trio.CancelScope(shield=True):
            await _fs.run_blocking(commit)

    async def complete_episodes(self) -> list[dict[str, Any]]:
        """Metadata of every complete episode, sorted by key. Incomplete directories are ignored."""

        def scan() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = []
            if not self.episodes_dir.is_dir():
                return found
            for d in sorted(self.episodes_dir.iterdir()):
                if not (d / MARKER_NAME).exists():
                    continue
                meta = _fs.read_json(d / EPISODE_META_NAME)
                if isinstance(meta, dict):
                    found.append({**meta, "key": d.name, "has_transcript": (d / TRANSCRIPT_NAME).exists()})
            return found

        return await _fs.run_blocking(scan)

    async def write_manifest(self, job_id: str, payload: dict[str, Any]) -> Path:
        path = self.runs_dir / job_id / "run.json"
        with trio.CancelScope(shield=True):
            await _fs.run_blocking(_fs.write_json_atomic, path, payload)
        return path

    async def write_index(self, payload: dict[str, Any]) -> None:
        await _fs.run_blocking(_fs.write_json_atomic, self.index_path, payload)


KILLED_MID_ATTEMPT = "attempt reported no outcome (process killed mid-episode?)"


def _count(entry: PoisonEntry | None) -> int:
    return entry.failures if entry else 0


@dataclasses.dataclass(frozen=True, slots=True)
class PoisonEntry:
    guid: str
    feed_url: str
    failures: int
    last_reason: str


class PoisonMemo:
    """Per-episode failure counts that survive runs and resubmissions (ADR-150 D4 hazard).

    Every update re-reads the file, changes one entry and renames a new file over it, all while holding
    a trio lock (workers of this run) and an exclusive ``flock`` on ``<memo>.lock`` (other runs on the same
    corpus), so no update is ever lost. Reads alone take no lock: the file is only ever replaced whole.
    """

    def __init__(self, path: Path, threshold: int) -> None:
        self._path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self.threshold = threshold
        self._lock = trio.Lock()
        self._entries: dict[str, PoisonEntry] = {}
        self._open: set[str] = set()  # keys whose attempt this process has begun and not yet reported

    async def load(self) -> None:
        self._entries = await _fs.run_blocking(self._read)

    def _read(self) -> dict[str, PoisonEntry]:
        try:
            raw = _fs.read_json(self._path)
        except ValueError:
            # Written atomically, so only a hand edit corrupts it; counting again from zero is bounded.
            log.error("poison memo %s is not valid JSON; starting from empty counts", self._path)
            raw = None
        entries: dict[str, PoisonEntry] = {}
        if isinstance(raw, dict):
            for key, value in raw.items():
                try:
                    entries[key] = PoisonEntry(
                        guid=str(value["guid"]),
                        feed_url=str(value["feed_url"]),
                        failures=int(value["failures"]),
                        last_reason=str(value["last_reason"]),
                    )
                except (KeyError, TypeError, ValueError):
                    continue
        return entries

    def _write(self, entries: dict[str, PoisonEntry]) -> None:
        _fs.write_json_atomic(self._path, {k: dataclasses.asdict(v) for k, v in sorted(entries.items())})

    def failures(self, key: str) -> int:
        entry = self._entries.get(key)
        return entry.failures if entry else 0

    def is_poisoned(self, key: str) -> bool:
        return self.failures(key) >= self.threshold

    def is_suspect(self, key: str) -> bool:
        """Its last attempt reported no outcome: it was in flight when a run was killed. It may have killed it, or
        been a bystander of the episode that did."""
        entry = self._entries.get(key)
        return entry is not None and entry.last_reason == KILLED_MID_ATTEMPT

    async def begin(self, key: str, *, guid: str, feed_url: str) -> int:
        """Count an attempt as a failure *before* it runs; returns the new count.

        An attempt that never reports an outcome (the process was SIGKILLed or OOM-killed mid-episode) therefore
        stays counted, so an episode that kills the whole process is poisoned too instead of looping forever.
        ``clear`` (success) or ``abandon`` (a planned stop, not the episode's fault) take it back.
        """
        self._open.add(key)
        return await self._change(key, lambda old: PoisonEntry(guid, feed_url, _count(old) + 1, KILLED_MID_ATTEMPT))

    async def record_failure(self, key: str, *, guid: str, feed_url: str, reason: str) -> int:
        """Record a failed attempt with its reason; an attempt already counted by ``begin`` is not counted twice."""
        begun = key in self._open
        self._open.discard(key)
        return await self._change(
            key, lambda old: PoisonEntry(guid, feed_url, _count(old) + (0 if begun else 1), reason)
        )

    async def abandon(self, key: str) -> None:
        """Take back a begun attempt that was stopped for a reason that is not the episode's (budget, cancel)."""
        if key not in self._open:
            return
        self._open.discard(key)

        def restore(old: PoisonEntry | None) -> PoisonEntry | None:
            if old is None or old.failures <= 1:
                return None
            return dataclasses.replace(old, failures=old.failures - 1)

        await self._change(key, restore)

    async def clear(self, key: str) -> None:
        """The episode succeeded: forget its failures."""
        self._open.discard(key)
        if key not in self._entries:
            return
        await self._change(key, lambda old: None)

    async def _change(self, key: str, change: Callable[[PoisonEntry | None], PoisonEntry | None]) -> int:
        """Re-read, change one entry (None removes it), write back atomically, under both locks; returns its count."""
        async with self._lock:
            # Shielded so that an outcome recorded at the moment a run stops is not lost.
            with trio.CancelScope(shield=True):

                def update() -> dict[str, PoisonEntry]:
                    # Held from the read to the rename: another run's update in between would be overwritten.
                    with _fs.exclusive_lock(self._lock_path):
                        entries = self._read()
                        new = change(entries.get(key))
                        if new is None:
                            entries.pop(key, None)
                        else:
                            entries[key] = new
                        self._write(entries)
                    return entries

                self._entries = await _fs.run_blocking(update)
        return self.failures(key)
