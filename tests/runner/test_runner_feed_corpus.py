"""Feed parsing (defusedxml), the crash-only corpus, the poison memo, the cost ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import trio
from runner_helpers import BILLION_LAUGHS, MALFORMED_XML, REPO_ROOT, rss

from pipeline_runner import Corpus, CostLedger, FeedParseError, PoisonMemo, episode_key, parse_feed
from pipeline_runner import _fs as runner_fs
from pipeline_runner._feed import parse_duration_s

EXTERNAL_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]><rss><channel><title>&x;</title></channel></rss>"""


def test_parse_feed_reads_episodes_in_order() -> None:
    doc = rss([("a", "http://h/a.mp3", "1:02:03"), ("b", "http://h/b.mp3", "90"), ("a", "http://h/dup", None)])
    feed = parse_feed("http://h/feed", doc)
    assert [(e.guid, e.enclosure_url, e.duration_s) for e in feed.episodes] == [
        ("a", "http://h/a.mp3", 3723.0),
        ("b", "http://h/b.mp3", 90.0),
    ]
    assert feed.title == "Test feed"


def test_items_without_enclosure_are_not_episodes_and_missing_guid_uses_the_enclosure() -> None:
    doc = (
        b'<rss version="2.0"><channel><title>t</title><item><title>text only</title></item>'
        b'<item><enclosure url="http://h/x.mp3"/></item></channel></rss>'
    )
    [episode] = parse_feed("u", doc).episodes
    # The derived identity of a guid-less item (ADR 0003): host and path of the enclosure, no scheme.
    assert (episode.guid, episode.guid_source) == ("h/x.mp3", "enclosure")


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (MALFORMED_XML, "malformed XML"),
        (BILLION_LAUGHS, "hostile XML"),
        (EXTERNAL_ENTITY, "hostile XML"),
        (b"<html><body>Moved</body></html>", "not an RSS or Atom feed (root element <html>)"),
        (b"", "malformed XML"),
    ],
)
def test_bad_feeds_fail_with_a_clear_reason(document: bytes, reason: str) -> None:
    with pytest.raises(FeedParseError) as caught:
        parse_feed("http://h/feed", document)
    assert reason in caught.value.reason


@pytest.mark.parametrize(("raw", "seconds"), [("", None), ("12", 12.0), ("1:30", 90.0), ("x", None), ("1:2:3:4", None)])
def test_parse_duration(raw: str, seconds: float | None) -> None:
    assert parse_duration_s(raw) == seconds


async def write_episode(corpus: Corpus, key: str, payload: bytes) -> None:
    staging = await corpus.new_staging_dir("job")
    (staging / "audio.bin").write_bytes(payload)
    (staging / "episode.json").write_text('{"guid": "g", "feed_url": "f"}')
    await corpus.commit_episode(staging, key)


async def test_commit_writes_marker_last_and_is_complete(tmp_path: Path) -> None:
    corpus = Corpus(tmp_path / "corpus")
    await corpus.ensure_layout()
    key = episode_key("g")
    assert not await corpus.is_complete(key)
    await write_episode(corpus, key, b"data")
    assert await corpus.is_complete(key)
    assert not list(corpus.staging_root.iterdir())
    assert [e["guid"] for e in await corpus.complete_episodes()] == ["g"]


async def test_crash_between_rename_and_marker_is_redone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ADR-150 D4 (the unverified load-bearing point): a half-written episode is not present."""
    corpus = Corpus(tmp_path / "corpus")
    await corpus.ensure_layout()
    key = episode_key("g")
    real_write = runner_fs.write_bytes_durably

    def crash_on_marker(path: Path, data: bytes) -> None:
        if path.name == "COMPLETE":
            raise OSError("power cut")
        real_write(path, data)

    monkeypatch.setattr(runner_fs, "write_bytes_durably", crash_on_marker)
    with pytest.raises(OSError, match="power cut"):
        await write_episode(corpus, key, b"torn")
    assert corpus.episode_dir(key).is_dir()  # renamed into place, but...
    assert not await corpus.is_complete(key)  # ...not present
    assert await corpus.complete_episodes() == []

    monkeypatch.setattr(runner_fs, "write_bytes_durably", real_write)
    await write_episode(corpus, key, b"whole")
    assert await corpus.is_complete(key)
    assert (corpus.episode_dir(key) / "audio.bin").read_bytes() == b"whole"


async def test_poison_memo_persists_across_instances(tmp_path: Path) -> None:
    path = tmp_path / ".poison.json"
    memo = PoisonMemo(path, threshold=2)
    await memo.load()
    assert await memo.record_failure("k", guid="g", feed_url="f", reason="r1") == 1
    again = PoisonMemo(path, threshold=2)
    await again.load()
    assert again.failures("k") == 1 and not again.is_poisoned("k")
    assert await again.record_failure("k", guid="g", feed_url="f", reason="r2") == 2
    assert again.is_poisoned("k")
    await again.clear("k")
    third = PoisonMemo(path, threshold=2)
    await third.load()
    assert third.failures("k") == 0


async def test_poison_memo_concurrent_failures_are_all_counted(tmp_path: Path) -> None:
    memo = PoisonMemo(tmp_path / ".poison.json", threshold=100)
    await memo.load()
    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(lambda: memo.record_failure("k", guid="g", feed_url="f", reason="r"))
    assert memo.failures("k") == 10


async def test_corrupt_poison_memo_starts_empty(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / ".poison.json").write_text("{not json")
    memo = PoisonMemo(tmp_path / ".poison.json", threshold=3)
    await memo.load()
    assert memo.failures("k") == 0


def test_cost_ledger_exactly_at_cap_and_last_dollar() -> None:
    ledger = CostLedger(Decimal("3.00"))
    first = ledger.try_reserve(Decimal("2.00"))
    assert first is not None
    assert ledger.try_reserve(Decimal("1.01")) is None
    last = ledger.try_reserve(Decimal("1.00"))  # exactly at the cap is allowed
    assert last is not None
    assert ledger.try_reserve(Decimal("0.01")) is None  # reserved, though not yet spent
    ledger.release(last)
    ledger.commit(first)
    assert (ledger.spent_usd, ledger.reserved_usd) == (Decimal("2.00"), Decimal(0))
    assert ledger.try_reserve(Decimal("1.00")) is not None


async def test_poison_memo_counts_an_attempt_before_it_runs(tmp_path: Path) -> None:
    """An attempt with no outcome stays counted; an outcome is never counted twice; a planned stop is no failure."""
    path = tmp_path / ".poison.json"
    memo = PoisonMemo(path, threshold=3)
    await memo.load()
    assert await memo.begin("killed", guid="g", feed_url="f") == 1
    crashed = PoisonMemo(path, threshold=3)  # the process died: a new run reads what was left
    await crashed.load()
    assert crashed.failures("killed") == 1
    assert await memo.begin("failed", guid="g", feed_url="f") == 1
    assert await memo.record_failure("failed", guid="g", feed_url="f", reason="HTTP 500") == 1
    await memo.begin("stopped", guid="g", feed_url="f")
    await memo.abandon("stopped")
    assert memo.failures("stopped") == 0
    await memo.begin("killed", guid="g", feed_url="f")
    await memo.clear("killed")
    reread = PoisonMemo(path, threshold=3)
    await reread.load()
    assert (reread.failures("killed"), reread.failures("failed"), reread.failures("stopped")) == (0, 1, 0)


# One process of the two below: set up, say "ready", wait for "go" (so both hammer at once), then count.
_HAMMER = """
import sys
from pathlib import Path

import trio

from pipeline_runner import PoisonMemo


async def hammer(path: Path, times: int) -> None:
    memo = PoisonMemo(path, threshold=10**9)
    await memo.load()
    for _ in range(times):
        await memo.record_failure("shared", guid="g", feed_url="f", reason="r")


print("ready", flush=True)
assert sys.stdin.readline() == "go\\n"
trio.run(hammer, Path(sys.argv[1]), int(sys.argv[2]))
"""


@pytest.mark.e2e
def test_two_processes_updating_the_memo_at_once_lose_no_count(tmp_path: Path) -> None:
    """Each update is read-modify-rename; without the flock around it, two runs interleave and lose counts."""
    path = tmp_path / "corpus" / ".poison.json"
    times = 300
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _HAMMER, str(path), str(times)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        for proc in procs:
            _, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr.decode()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    memo = json.loads(path.read_text())
    assert memo["shared"]["failures"] == 2 * times
    assert (tmp_path / "corpus" / ".poison.json.lock").exists()  # beside the memo, and left there
