"""Real-world feeds through the runner's real HTTP path: the fixture feeds served by the local server
(see feed_helpers.HostMap), the runner's own httpx client, the corpus on disk.

Each fixture test asserts which episodes the run processed -- by corpus key -- and, from each
episode's episode.json, its identity, title, enclosure URL, type and duration, and that the bytes
downloaded are the chosen enclosure's (never the cover image next to it).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import trio
from feed_helpers import (
    BASE,
    EXPECTED,
    HostMap,
    audio_body,
    expected_episodes,
    fixture,
    redirect,
    route,
    serve_enclosures,
    serve_feed,
)
from runner_helpers import HttpServer, respond, run_runner, runner_env

from pipeline_runner import (
    EXIT_ALL_FEEDS_FAILED,
    EXIT_OK,
    EventSink,
    Heartbeat,
    HeartbeatConfig,
    PipelineRun,
    RunnerConfig,
    RunOutcome,
    episode_key,
)

# The moved-feed and CDN fixtures are run by their own tests below: they are about several documents.
SINGLE_DOCUMENT_FIXTURES = sorted(n for n in EXPECTED["feeds"] if not n.startswith(("07-", "08-cdn-")))


async def run_feeds(
    server: HttpServer, data_dir: Path, feeds: list[str], job_id: str = "job-1", **settings: Any
) -> tuple[RunOutcome, PipelineRun]:
    config = RunnerConfig(
        data_dir=data_dir, job_id=job_id, feeds=tuple(feeds), workers=2, episode_budget_s=10.0, **settings
    )
    run = PipelineRun(
        config,
        events=EventSink(job_id, write_line=None),
        heartbeat=Heartbeat(HeartbeatConfig()),
        transport=HostMap(server.port),
    )
    with trio.fail_after(30):
        outcome = await run.run()
    return outcome, run


def corpus_episodes(data_dir: Path) -> dict[str, dict[str, Any]]:
    """Complete episodes in the corpus: key -> episode.json plus the downloaded bytes."""
    found: dict[str, dict[str, Any]] = {}
    for directory in sorted((data_dir / "corpus" / "episodes").iterdir()):
        if (directory / "COMPLETE").exists():
            meta = json.loads((directory / "episode.json").read_text())
            found[directory.name] = {**meta, "audio": (directory / "audio.bin").read_bytes()}
    return found


def events_named(run: PipelineRun, name: str) -> list[dict[str, Any]]:
    return [e for e in run.events.emitted if e["event"] == name]


def manifest(data_dir: Path, job_id: str = "job-1") -> dict[str, Any]:
    return json.loads((data_dir / "corpus" / ".runs" / job_id / "run.json").read_text())


@pytest.mark.parametrize("name", SINGLE_DOCUMENT_FIXTURES)
async def test_fixture_feed_through_the_runner(name: str, http_server: HttpServer, tmp_path: Path) -> None:
    expected = expected_episodes(name)
    serve_feed(http_server, BASE + name, fixture(name))
    serve_enclosures(http_server, [e["enclosure_url"] for e in expected])

    outcome, run = await run_feeds(http_server, tmp_path, [BASE + name])

    assert outcome.exit_code == EXIT_OK
    assert events_named(run, "feed_failed") == []
    assert (outcome.counts.done, outcome.counts.failed) == (len(expected), 0)
    stored = corpus_episodes(tmp_path)
    assert sorted(stored) == sorted(episode_key(e["identity"]) for e in expected)
    for want in expected:
        got = stored[episode_key(want["identity"])]
        assert {
            "identity": got["guid"],
            "source": got["guid_source"],
            "title": got["title"],
            "enclosure_url": got["enclosure_url"],
            "type": got["enclosure_type"],
            "duration_s": got["duration_s"],
            "published": got["published"],
        } == want
        assert got["feed_url"] == BASE + name
        assert got["audio"] == audio_body(want["enclosure_url"])


async def test_images_next_to_the_audio_are_never_downloaded(http_server: HttpServer, tmp_path: Path) -> None:
    """Case 5, on the wire: no request ever reaches an image or the PDF."""
    name = "05-image-first.xml"
    serve_feed(http_server, BASE + name, fixture(name))
    serve_enclosures(http_server, [e["enclosure_url"] for e in expected_episodes(name)])
    await run_feeds(http_server, tmp_path, [BASE + name])
    requested = {r.path for r in http_server.requests}
    assert not {p for p in requested if p.endswith((".jpg", ".png", ".pdf"))}
    assert route("https://media.example.org/images/1.mp3") in requested


async def test_relative_enclosures_resolve_against_the_url_after_http_redirects(
    http_server: HttpServer, tmp_path: Path
) -> None:
    """Case 2: the feed answers 301 to a new directory; its relative enclosures live there."""
    old, new = "https://feeds.example.org/old/feed.xml", "https://feeds.example.org/new/feed.xml"
    http_server.routes[route(old)] = redirect(new)
    serve_feed(http_server, new, fixture("02-relative-no-base.xml"))
    wanted = ["https://feeds.example.org/new/episodes/five.mp3", "https://feeds.example.org/shared/six.mp3"]
    serve_enclosures(http_server, wanted)

    outcome, _ = await run_feeds(http_server, tmp_path, [old])

    assert outcome.counts.done == 2
    assert sorted(e["enclosure_url"] for e in corpus_episodes(tmp_path).values()) == sorted(wanted)


async def test_a_moved_feed_is_followed_and_reported(http_server: HttpServer, tmp_path: Path) -> None:
    """Case 7: <redirect><newLocation>, then itunes:new-feed-url, then the final feed (which names itself)."""
    names = ["07-moved-redirect.xml", "07-moved-new-feed-url.xml", "07-moved-final.xml"]
    for name in names:
        serve_feed(http_server, BASE + name, fixture(name))
    expected = expected_episodes("07-moved-final.xml")
    serve_enclosures(http_server, [e["enclosure_url"] for e in expected])

    outcome, run = await run_feeds(http_server, tmp_path, [BASE + names[0]])

    moves = [
        {"feed_url": BASE + names[0], "from_url": BASE + names[0], "to_url": BASE + names[1]},
        {"feed_url": BASE + names[0], "from_url": BASE + names[1], "to_url": BASE + names[2]},
    ]
    assert [{k: e[k] for k in ("feed_url", "from_url", "to_url")} for e in events_named(run, "feed_moved")] == moves
    assert manifest(tmp_path)["feeds"] == {"ok": 1, "failed": [], "moved": moves}
    assert outcome.exit_code == EXIT_OK and outcome.counts.done == 2
    stored = corpus_episodes(tmp_path)
    assert sorted(stored) == sorted(episode_key(e["identity"]) for e in expected)
    assert {e["feed_url"] for e in stored.values()} == {BASE + names[2]}
    assert [r.path for r in http_server.requests if r.path.endswith(".xml")] == [route(BASE + n) for n in names]


def rss_moving_to(target: str | None, *guids: str) -> bytes:
    move = f"<itunes:new-feed-url>{target}</itunes:new-feed-url>" if target else ""
    items = "".join(
        f'<item><guid>{g}</guid><enclosure url="https://media.example.org/m/{g}.mp3" type="audio/mpeg"/></item>'
        for g in guids
    )
    return f'<rss version="2.0"><channel><title>t</title>{move}{items}</channel></rss>'.encode()


async def test_a_move_back_to_an_address_already_read_stops_there(http_server: HttpServer, tmp_path: Path) -> None:
    a, b = "https://feeds.example.org/a.xml", "https://feeds.example.org/b.xml"
    serve_feed(http_server, a, rss_moving_to(b, "from-a"))
    serve_feed(http_server, b, rss_moving_to("http://www.feeds.example.org/a.xml/", "from-b"))
    serve_enclosures(http_server, ["https://media.example.org/m/from-b.mp3"])

    outcome, run = await run_feeds(http_server, tmp_path, [a])

    assert [(e["from_url"], e["to_url"]) for e in events_named(run, "feed_moved")] == [(a, b)]
    assert [e["guid"] for e in events_named(run, "episode_done")] == ["from-b"]
    assert outcome.exit_code == EXIT_OK
    assert len(http_server.requests_to(route(a))) == 1


async def test_a_chain_of_moves_is_bounded(http_server: HttpServer, tmp_path: Path) -> None:
    """At most MAX_FEED_MOVES (3) moves per run; a feed still moving after that, with no episodes, fails."""
    chain = [f"https://feeds.example.org/hop{i}.xml" for i in range(6)]
    for here, there in itertools.pairwise(chain):
        serve_feed(http_server, here, f"<rss><redirect><newLocation>{there}</newLocation></redirect></rss>".encode())

    outcome, run = await run_feeds(http_server, tmp_path, [chain[0]])

    assert [e["to_url"] for e in events_named(run, "feed_moved")] == chain[1:4]
    [failed] = events_named(run, "feed_failed")
    assert failed["feed_url"] == chain[0]
    assert failed["reason"] == f"moved more than 3 times (last to {chain[4]})"
    assert outcome.exit_code == EXIT_ALL_FEEDS_FAILED
    assert not http_server.requests_to(route(chain[4]))


async def test_a_failing_new_address_falls_back_to_the_old_episodes_or_fails_the_feed_naming_the_move(
    http_server: HttpServer, tmp_path: Path
) -> None:
    """One feed's failure never fails the others; a broken move costs nothing when the old feed still has episodes."""
    kept, gone = "https://feeds.example.org/kept.xml", "https://feeds.example.org/gone.xml"
    nowhere = "https://feeds.example.org/nowhere.xml"
    serve_feed(http_server, kept, rss_moving_to(nowhere, "still-here"))
    serve_feed(http_server, gone, f"<rss><redirect><newLocation>{nowhere}</newLocation></redirect></rss>".encode())
    http_server.routes[route(nowhere)] = respond(404, b"no")
    serve_enclosures(http_server, ["https://media.example.org/m/still-here.mp3"])

    outcome, run = await run_feeds(http_server, tmp_path, [kept, gone])

    assert [e["guid"] for e in events_named(run, "episode_done")] == ["still-here"]
    assert [(e["feed_url"], e["reason"]) for e in events_named(run, "feed_failed")] == [
        (gone, f"moved to {nowhere}: HTTP 404")
    ]
    assert len(events_named(run, "feed_moved")) == 2
    assert outcome.exit_code == EXIT_OK
    assert manifest(tmp_path)["feeds"]["ok"] == 1


async def test_the_size_cap_holds_at_the_new_address_too(http_server: HttpServer, tmp_path: Path) -> None:
    old, new = "https://feeds.example.org/small.xml", "https://feeds.example.org/huge.xml"
    serve_feed(http_server, old, f"<rss><redirect><newLocation>{new}</newLocation></redirect></rss>".encode())
    serve_feed(http_server, new, b"<rss>" + b" " * 5000 + b"</rss>")

    outcome, run = await run_feeds(http_server, tmp_path, [old], max_feed_bytes=1000)

    [failed] = events_named(run, "feed_failed")
    assert failed["reason"] == f"moved to {new}: Content-Length 5011 over the 1000-byte limit"
    assert outcome.exit_code == EXIT_ALL_FEEDS_FAILED


async def test_a_new_cdn_does_not_make_old_episodes_new(http_server: HttpServer, tmp_path: Path) -> None:
    """Case 8: the GUID item moved host; the guid-less one got a tracking prefix, https and a cache-buster."""
    url = BASE + "cdn-hopper.xml"
    before = expected_episodes("08-cdn-before.xml")
    after = expected_episodes("08-cdn-after.xml")
    serve_feed(http_server, url, fixture("08-cdn-before.xml"))
    serve_enclosures(http_server, [e["enclosure_url"] for e in before + after])
    first, _ = await run_feeds(http_server, tmp_path, [url], job_id="job-1")
    assert first.counts.done == 2

    serve_feed(http_server, url, fixture("08-cdn-after.xml"))
    second, run = await run_feeds(http_server, tmp_path, [url], job_id="job-2")

    assert (second.counts.done, second.counts.skipped) == (0, 2)
    assert {e["key"] for e in events_named(run, "episode_skipped")} == {episode_key(e["identity"]) for e in before}
    assert not any(http_server.requests_to(route(e["enclosure_url"])) for e in after)


@pytest.mark.e2e
async def test_feed_moved_reaches_stdout_and_run_json_of_the_real_process(
    http_server: HttpServer, tmp_path: Path
) -> None:
    s = http_server
    s.routes["/old"] = respond(200, rss_moving_to(s.url("/new")))
    body = f'<rss><channel><item><guid>g</guid><enclosure url="{s.url("/a.mp3")}"/></item></channel></rss>'
    s.routes["/new"] = respond(200, body.encode())
    s.routes["/a.mp3"] = respond(200, b"A" * 100)

    result = await run_runner(["run", "--feed", s.url("/old")], runner_env(tmp_path), cwd=tmp_path)

    assert result.returncode == EXIT_OK, result.stderr
    [moved] = result.of("feed_moved")
    assert (moved["feed_url"], moved["from_url"], moved["to_url"]) == (s.url("/old"), s.url("/old"), s.url("/new"))
    assert manifest(tmp_path)["feeds"]["moved"] == [
        {"feed_url": s.url("/old"), "from_url": s.url("/old"), "to_url": s.url("/new")}
    ]
    assert [e["guid"] for e in result.of("episode_done")] == ["g"]
