"""Feed parsing without the network: every fixture feed against its expectations, the value readers,
the identity rules, and the safety rules (INV-FEED-DEFUSED) -- the runner's own path is in
test_runner_feeds_realworld.py."""

from __future__ import annotations

import pytest
from feed_helpers import BASE, EXPECTED, FEEDS_DIR, expected_episodes, fixture
from hypothesis import example, given, settings
from hypothesis import strategies as st
from runner_helpers import BILLION_LAUGHS

from pipeline_runner import FeedParseError, parse_feed
from pipeline_runner import _feed_xml as feed_xml
from pipeline_runner._feed import choose_enclosure
from pipeline_runner._feed_values import (
    clean_title,
    enclosure_identity,
    parse_duration_s,
    parse_published,
)
from pipeline_runner._feed_xml import RawEnclosure


def episodes_as_dicts(name: str) -> list[dict[str, object]]:
    feed = parse_feed(BASE + name, fixture(name))
    return [
        {
            "identity": e.guid,
            "source": e.guid_source,
            "title": e.title,
            "enclosure_url": e.enclosure_url,
            "type": e.enclosure_type,
            "duration_s": e.duration_s,
            "published": e.published,
        }
        for e in feed.episodes
    ]


@pytest.mark.parametrize("name", sorted(EXPECTED["feeds"]))
def test_fixture_feed_gives_exactly_the_expected_episodes(name: str) -> None:
    """Which items are episodes, in which order, with which identity, title, enclosure, type, duration, date."""
    assert episodes_as_dicts(name) == expected_episodes(name)
    feed = parse_feed(BASE + name, fixture(name))
    assert feed.title == EXPECTED["feeds"][name]["title"]
    assert feed.moved_to == EXPECTED["feeds"][name]["moved_to"]


def test_every_fixture_has_expectations_and_every_numbered_case_a_fixture() -> None:
    on_disk = {p.name for p in FEEDS_DIR.glob("*.xml")}
    assert on_disk == set(EXPECTED["feeds"])
    cases = {spec["case"].split(":")[0] for spec in EXPECTED["feeds"].values()}
    assert {str(n) for n in range(1, 10)} <= cases


# -- case by case, the points a reader would check first ------------------------------------------


def test_undeclared_prefixes_do_not_reject_the_feed() -> None:
    """Case 1: the whole feed used to fail with 'unbound prefix'."""
    durations = [e.duration_s for e in parse_feed(BASE + "x", fixture("01-undeclared-prefixes.xml")).episodes]
    assert durations == [750.0, 3600.0, 3605.0]


def test_relative_urls_resolve_against_the_final_url_when_there_is_no_xml_base() -> None:
    """Case 2: the base is where the document came from after redirects, not the URL asked for."""
    feed = parse_feed(
        "https://old.example.org/feed.xml", fixture("02-relative-no-base.xml"), base_url="https://new.example.org/x/f"
    )
    assert [e.enclosure_url for e in feed.episodes] == [
        "https://new.example.org/x/episodes/five.mp3",
        "https://new.example.org/shared/six.mp3",
    ]
    assert {e.feed_url for e in feed.episodes} == {"https://old.example.org/feed.xml"}


def test_an_image_is_never_the_episode() -> None:
    """Case 5: the image-only item is not an episode; items with audio get the audio, else the video."""
    episodes = parse_feed(BASE + "x", fixture("05-image-first.xml")).episodes
    assert [e.guid for e in episodes] == ["images-1", "images-2", "images-4", "images-5"]
    assert all(not e.enclosure_type.startswith("image/") for e in episodes)


def test_atom_feed_is_read() -> None:
    """Case 6: used to be 'not an RSS document'."""
    feed = parse_feed(BASE + "06-atom.xml", fixture("06-atom.xml"))
    assert feed.title == "Atom Hour"
    assert [e.enclosure_url for e in feed.episodes] == [
        "https://media.example.org/atom/one.mp3",
        "https://media.example.org/atom/two.ogg",
    ]


@pytest.mark.parametrize(
    ("document", "moved_to"),
    [
        (b"<rss><redirect><newLocation> https://n.example/f </newLocation></redirect></rss>", "https://n.example/f"),
        (b"<redirect><newLocation>https://n.example/f</newLocation></redirect>", "https://n.example/f"),
        (b"<rss><channel><itunes:new-feed-url>/moved/here.xml</itunes:new-feed-url></channel></rss>",
         "https://feeds.example.org/moved/here.xml"),
        # Naming itself (scheme, www. and a trailing slash aside) is not a move.
        (b"<rss><channel><itunes:new-feed-url>http://www.feeds.example.org/fixtures/self/</itunes:new-feed-url>"
         b"</channel></rss>", None),
        (b"<rss><channel><itunes:new-feed-url>ftp://n.example/f</itunes:new-feed-url></channel></rss>", None),
    ],
)
def test_declared_moves(document: bytes, moved_to: str | None) -> None:
    """Case 7: the parse reports where the feed says it moved; the runner follows (see the realworld tests)."""
    assert parse_feed(BASE + "self", document).moved_to == moved_to


def test_a_changed_enclosure_host_keeps_the_identity_of_an_item_with_a_guid() -> None:
    """Case 8: the GUID is the identity whatever the enclosure; guid-less items survive prefixes and https."""
    before = parse_feed(BASE + "cdn", fixture("08-cdn-before.xml")).episodes
    after = parse_feed(BASE + "cdn", fixture("08-cdn-after.xml")).episodes
    assert [e.enclosure_url for e in before] != [e.enclosure_url for e in after]
    assert [(e.guid, e.guid_source) for e in before] == [(e.guid, e.guid_source) for e in after] == [
        ("cdn-hopper-1", "guid"),
        ("media.example.org/hopper/2.mp3", "enclosure"),
    ]


@pytest.mark.parametrize(
    ("url", "identity"),
    [
        ("https://media.example.org/a/1.mp3", "media.example.org/a/1.mp3"),
        ("http://www.Media.Example.org/a/1.mp3?utm_source=x#t=10", "media.example.org/a/1.mp3"),
        ("https://dts.podtrac.com/redirect.mp3/media.example.org/a/1.mp3", "media.example.org/a/1.mp3"),
        ("https://chtbl.com/track/9Z9Z/traffic.example.net/a/1.mp3", "traffic.example.net/a/1.mp3"),
        ("https://pdst.fm/e/dts.podtrac.com/redirect.mp3/media.example.org/a/1.mp3", "media.example.org/a/1.mp3"),
        # A file whose name looks like a domain is still the file.
        ("https://media.example.org/a/episode.ogg", "media.example.org/a/episode.ogg"),
        ("https://media.example.org/v1.2/file.mp3", "media.example.org/v1.2/file.mp3"),
    ],
)
def test_enclosure_identity(url: str, identity: str) -> None:
    assert enclosure_identity(url)[0] == identity


def test_a_link_shared_by_items_or_pointing_at_the_homepage_is_not_an_identity() -> None:
    """Case 8: many feeds give every item the show's homepage as <link>; that would make them one episode."""
    sources = {e.title: e.guid_source for e in parse_feed(BASE + "g", fixture("08-guidless.xml")).episodes}
    assert sources == {
        "Has its own page": "link",
        "Links to the homepage, behind a measurement prefix": "enclosure",
        "Shares a page with the next one, behind two prefixes": "enclosure",
        "Shares a page with the previous one, plain http and www": "enclosure",
        "Download script, first": "enclosure",
        "Download script, second": "enclosure",
    }


def test_duplicate_guids_in_one_feed_are_one_episode_the_first() -> None:
    episodes = parse_feed(BASE + "d", fixture("12-duplicate-guids.xml")).episodes
    assert [(e.guid, e.enclosure_url) for e in episodes] == [
        ("twice-1", "https://media.example.org/twice/1.mp3"),
        ("twice-2", "https://media.example.org/twice/2.mp3"),
    ]


# -- the value readers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("1:02:03", 3723.0),
        ("62:03", 3723.0),
        ("3723", 3723.0),
        ("01:02:03.500", 3723.5),
        ("0:00:07,25", 7.25),
        (" 45:00 ", 2700.0),
        ("", None),
        ("   ", None),
        (None, None),
        ("0", None),  # zero means "unknown" in real feeds
        ("00:00:00", None),
        ("1:2:3:4", None),
        ("-5", None),
        ("x", None),
        ("1h02m", None),
        ("nan", None),
        ("99999999999", None),  # longer than a month: a typo or milliseconds
    ],
)
def test_parse_duration(raw: str | None, seconds: float | None) -> None:
    assert parse_duration_s(raw) == seconds


@pytest.mark.parametrize(
    ("raw", "iso"),
    [
        ("Tue, 05 Mar 2024 10:30:00 +0000", "2024-03-05T10:30:00+00:00"),
        ("Fri, 05 Mar 2024 10:30:00 GMT", "2024-03-05T10:30:00+00:00"),  # wrong weekday
        ("Tuesday, 05 March 2024 10:30:00 -0500", "2024-03-05T15:30:00+00:00"),
        ("Tue, 5 Sept 2024 10:30:00 +0000", "2024-09-05T10:30:00+00:00"),
        ("Tue, 5 Mar 2024 10:30 +01:00", "2024-03-05T09:30:00+00:00"),
        ("Tue, 05 Mar 2024 10:30:00 PST", "2024-03-05T18:30:00+00:00"),
        ("Tue, 05 Mar 2024 10:30:00 GMT+2", "2024-03-05T08:30:00+00:00"),
        ("Tue, 05 Mar 2024 10:30:00 UTC-05:30", "2024-03-05T16:00:00+00:00"),
        ("Tue, 05 Mar 2024 10:30:00 CEST", "2024-03-05T10:30:00+00:00"),  # an unknown zone name is read as UTC
        ("Tue,05 Mar 2024 10:30:00 Z", "2024-03-05T10:30:00+00:00"),
        ("05 Mar 24 10:30:00 +0000", "2024-03-05T10:30:00+00:00"),
        ("05 Mar 2024", "2024-03-05T00:00:00+00:00"),
        ("2024-03-05T10:30:00Z", "2024-03-05T10:30:00+00:00"),
        ("2024-03-05T10:30:00.250+0200", "2024-03-05T08:30:00.250000+00:00"),
        ("2024-03-05 10:30:00", "2024-03-05T10:30:00+00:00"),
        ("2024-03-05", "2024-03-05T00:00:00+00:00"),
        ("last Tuesday-ish", None),
        ("2024-13-45", None),
        ("Tue, 45 Foo 2024", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_published(raw: str | None, iso: str | None) -> None:
    assert parse_published(raw) == iso


@pytest.mark.parametrize(
    ("raw", "title"),
    [
        ("Q&amp;A", "Q&A"),
        ("It&#8217;s &#x2603;", "It\u2019s \u2603"),
        ("AT&T &notice", "AT&T &notice"),  # only complete references are decoded
        ("&notanentity;", "&notanentity;"),
        ("  many\n   spaces\t", "many spaces"),
        (None, ""),
    ],
)
def test_clean_title(raw: str | None, title: str) -> None:
    assert clean_title(raw) == title


def test_choose_enclosure_prefers_audio_then_video_then_untyped_never_image_or_other() -> None:
    def pick(*candidates: tuple[str, str | None]) -> str | None:
        chosen = choose_enclosure([RawEnclosure(url=url, type=kind) for url, kind in candidates])
        return None if chosen is None else chosen[0].url

    assert pick(("https://h/c.jpg", "image/jpeg"), ("https://h/v.mp4", "video/mp4"), ("https://h/a", "audio/mpeg")) == (
        "https://h/a"
    )
    assert pick(("https://h/c.jpg", None), ("https://h/v.mp4", None)) == "https://h/v.mp4"
    assert pick(("https://h/notes.pdf", None), ("https://h/get?id=1", None)) == "https://h/get?id=1"
    assert pick(("https://h/c.jpg", None), ("https://h/notes.html", "text/html")) is None


# -- safety (INV-FEED-DEFUSED) and failures ---------------------------------------------------------

EXTERNAL_DTD = b'<?xml version="1.0"?><!DOCTYPE rss SYSTEM "http://127.0.0.1:9/evil.dtd"><rss><channel/></rss>'
PARAMETER_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE r [<!ENTITY % p SYSTEM "file:///etc/passwd"> %p;]><rss><channel/></rss>"""
# A DOCTYPE hidden behind a malformation that the repair pass fixes: the repaired document is defused too.
DOCTYPE_AFTER_JUNK = b"""  \n<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]>
<rss><channel><title>&lol2; & co</title></channel></rss>"""


@pytest.mark.parametrize("document", [BILLION_LAUGHS, EXTERNAL_DTD, PARAMETER_ENTITY, DOCTYPE_AFTER_JUNK])
def test_inv_feed_defused_any_dtd_is_refused_even_after_repair(document: bytes) -> None:
    with pytest.raises(FeedParseError) as caught:
        parse_feed(BASE + "hostile", document)
    assert caught.value.reason == "hostile XML: document type declarations are refused"


def test_absurd_nesting_is_refused_before_it_costs_anything() -> None:
    document = b"<rss><channel>" + b"<x>" * 600 + b"</x>" * 600 + b"</channel></rss>"
    with pytest.raises(FeedParseError) as caught:
        parse_feed(BASE + "deep", document)
    assert caught.value.reason == "hostile XML: elements nested deeper than 512 levels are refused"


def test_what_one_document_can_make_the_reader_keep_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_ITEMS items (the first: feeds list newest first) and MAX_ENCLOSURES_PER_ITEM candidates per item."""
    monkeypatch.setattr(feed_xml, "MAX_ITEMS", 3)
    monkeypatch.setattr(feed_xml, "MAX_ENCLOSURES_PER_ITEM", 2)
    images = '<enclosure url="https://h/c.jpg" type="image/jpeg"/>' * 2
    items = "".join(
        f'<item><guid>g{i}</guid>{images}<enclosure url="https://h/{i}.mp3"/></item>' for i in range(5)
    )
    items = f'<item><guid>first</guid><enclosure url="https://h/first.mp3"/></item>{items}'
    document = f"<rss><channel>{items}<unclosed></channel></rss>".encode()  # the rest is never read
    feed = parse_feed(BASE + "many", document)
    assert [e.guid for e in feed.episodes] == ["first"]  # g0 and g1 have only images in their first two


def test_an_undeclared_entity_is_text_not_an_expansion() -> None:
    doc = b'<rss><channel><item><title>&xxe; &amp;lol;</title><enclosure url="https://h/a.mp3"/></item></channel></rss>'
    [episode] = parse_feed(BASE + "x", doc).episodes
    assert episode.title == "&xxe; &lol;"


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (b"<rss><channel><title>oops</channel>", "malformed XML: mismatched tag: line 1, column "),
        (b"", "malformed XML: no element found"),
        (b'<?xml version="1.0" encoding="x-no-such-codec"?><rss/>', "unknown encoding: x-no-such-codec"),
        (b'<?xml version="1.0" encoding="\x00TF-8"?><rss/>', "unknown encoding: TF-8"),  # expat stops at the NUL
        (b"<html><body>Moved</body></html>", "not an RSS or Atom feed (root element <html>)"),
    ],
)
def test_bad_documents_fail_with_a_clear_reason(document: bytes, reason: str) -> None:
    with pytest.raises(FeedParseError) as caught:
        parse_feed(BASE + "bad", document)
    assert caught.value.reason.startswith(reason)


@settings(max_examples=300, deadline=None, derandomize=True)
@example(name="01-undeclared-prefixes.xml", cut=30, junk=b"\x00")  # a damaged encoding declaration
@given(
    name=st.sampled_from(sorted(EXPECTED["feeds"])),
    cut=st.integers(min_value=0, max_value=4000),
    junk=st.binary(max_size=12),
)
def test_a_damaged_feed_fails_alone_never_with_an_unexpected_exception(name: str, cut: int, junk: bytes) -> None:
    """One feed's failure never fails the others: whatever the bytes, parse_feed returns or raises FeedParseError."""
    document = fixture(name)
    damaged = document[:cut] + junk + document[cut + len(junk) :]
    try:
        parse_feed(BASE + name, damaged)
    except FeedParseError:
        pass
