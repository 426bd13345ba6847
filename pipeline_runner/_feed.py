"""Feeds to episodes: RSS 2.0, RSS 1.0 and Atom, read as podcast apps read them. See docs/adr/0003-feed-parsing.md.

``parse_feed`` is CPU-bound and runs off the event loop. The XML layer (``_feed_xml``) is defused
and tolerant; this module decides what is an episode, which of its media is the episode's audio,
and what identifies it across runs.

Identity (the corpus key is ``sha256(identity)[:32]``), in order, the first that applies:

1. ``guid`` -- the item's ``<guid>`` (Atom: ``<id>``), as written. A GUID is trusted even when the
   enclosure's host, path or tracking prefix changes.
2. ``link`` -- for an item without one, its ``<link>``, when no other item of the feed has the same
   link and it is not the channel's own link (many feeds point every item at the show's homepage).
3. ``enclosure`` -- else its chosen enclosure URL reduced to host and path: no scheme, no ``www.``,
   tracking prefixes (``dts.podtrac.com/redirect.mp3/``, ``chtbl.com/track/<id>/``, ...) removed, and
   the query dropped unless two items of the feed differ only in it (``download?id=1``/``?id=2``).

Title plus date is deliberately not an identity: every episode has an enclosure, so step 3 always
applies, and titles are edited after publication far more often than files move.

Within one feed, items with the same identity are one episode: the first in document order.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from typing import Final, Literal

from ._errors import FeedParseError
from ._feed_values import (
    OCTET_STREAM,
    clean_title,
    declared_type,
    enclosure_identity,
    file_name,
    guess_type,
    media_class,
    parse_duration_s,
    parse_published,
    same_location,
)
from ._feed_xml import (
    MAX_ITEMS,
    EncodingError,
    HostileError,
    MalformedError,
    NotAFeedError,
    RawEnclosure,
    RawFeed,
    RawItem,
    read_feed,
)

log = logging.getLogger(__name__)

IdentitySource = Literal["guid", "link", "enclosure"]


@dataclasses.dataclass(frozen=True, slots=True)
class Episode:
    feed_url: str
    guid: str  # the identity: the item's GUID, or the derived identity named by ``guid_source``
    title: str
    enclosure_url: str
    enclosure_type: str  # as declared, else guessed from the file extension, else application/octet-stream
    duration_s: float | None
    guid_source: IdentitySource = "guid"
    published: str | None = None  # ISO 8601 UTC


@dataclasses.dataclass(frozen=True, slots=True)
class Feed:
    url: str
    title: str
    episodes: tuple[Episode, ...]
    moved_to: str | None = None  # <redirect><newLocation> or itunes:new-feed-url, when it names another URL


def parse_feed(feed_url: str, document: bytes, *, base_url: str | None = None) -> Feed:
    """Parse a feed document fetched from ``feed_url``.

    ``base_url`` is where the document really came from (the URL after HTTP redirects); relative
    URLs without an ``xml:base`` resolve against it. Raises ``FeedParseError`` naming what is wrong.
    """
    base = base_url or feed_url
    try:
        raw = read_feed(document, base)
    except HostileError as exc:
        raise FeedParseError(feed_url, f"hostile XML: {exc}") from exc
    except MalformedError as exc:
        raise FeedParseError(feed_url, f"malformed XML: {exc}") from exc
    except EncodingError as exc:
        raise FeedParseError(feed_url, str(exc)) from exc
    except NotAFeedError as exc:
        raise FeedParseError(feed_url, f"not an RSS or Atom feed (root element <{exc.root}>)") from exc
    return _build(feed_url, base, raw)


def _build(feed_url: str, base: str, raw: RawFeed) -> Feed:
    if raw.truncated:
        log.warning("feed %s: more than %d items; only the first %d are read", feed_url, MAX_ITEMS, MAX_ITEMS)
    channel_link = raw.text.get("link", "")
    candidates = [_candidate(feed_url, item) for item in raw.items]
    episodes = [c for c in candidates if c is not None]
    if len(episodes) < len(raw.items):
        log.info("feed %s: %d items without usable audio or video", feed_url, len(raw.items) - len(episodes))
    identified = _assign_identities(episodes, channel_link)
    unique: list[Episode] = []
    seen: set[str] = set()
    for episode in identified:
        if episode.guid in seen:
            log.info("feed %s: duplicate item %r (%s); the first one is kept", feed_url, episode.guid, episode.title)
            continue
        seen.add(episode.guid)
        unique.append(episode)
    moved_to = raw.text.get("moved_to") or None
    if moved_to is not None and (same_location(moved_to, feed_url) or same_location(moved_to, base)):
        moved_to = None  # many feeds name themselves in itunes:new-feed-url
    return Feed(
        url=feed_url,
        title=clean_title(raw.text.get("title")) or feed_url,
        episodes=tuple(unique),
        moved_to=moved_to,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Candidate:
    episode: Episode  # guid is "" until identities are assigned
    link: str


def _candidate(feed_url: str, item: RawItem) -> _Candidate | None:
    chosen = choose_enclosure(item.enclosures)
    if chosen is None:
        return None
    enclosure, media_type = chosen
    assert enclosure.url is not None
    title = clean_title(item.text.get("title")) or file_name(enclosure.url) or enclosure.url
    duration = parse_duration_s(item.text.get("duration"))
    if duration is None:
        duration = parse_duration_s(enclosure.duration)
    published = parse_published(item.text.get("published")) or parse_published(item.text.get("updated"))
    episode = Episode(
        feed_url=feed_url,
        guid=item.text.get("guid", "").strip(),
        title=title,
        enclosure_url=enclosure.url,
        enclosure_type=media_type,
        duration_s=duration,
        published=published,
    )
    return _Candidate(episode=episode, link=item.text.get("link", "").strip())


# Audio first, then video, then a file of unknown type (a podcast's "download.php?id=3"). Never an image.
_PREFERENCE: Final = {"audio": 0, "video": 1, "unknown": 2}


def choose_enclosure(enclosures: list[RawEnclosure]) -> tuple[RawEnclosure, str] | None:
    """The item's episode media and its type: the best class, then ``isDefault``, then document order."""
    best: tuple[int, int, int] | None = None
    chosen: tuple[RawEnclosure, str] | None = None
    for position, enclosure in enumerate(enclosures):
        if enclosure.url is None:
            continue
        media_type = declared_type(enclosure.type) or guess_type(enclosure.url)
        rank = _PREFERENCE.get(media_class(media_type, enclosure.medium))
        if rank is None:
            continue
        key = (rank, 0 if enclosure.is_default else 1, position)
        if best is None or key < best:
            best = key
            chosen = (enclosure, media_type or OCTET_STREAM)
    return chosen


def _assign_identities(candidates: list[_Candidate], channel_link: str) -> list[Episode]:
    """Give every guid-less episode its derived identity (see the module docstring)."""
    links = Counter(c.link for c in candidates if c.link and not c.episode.guid)
    split = [None if c.episode.guid else enclosure_identity(c.episode.enclosure_url) for c in candidates]
    queries: dict[str, set[str]] = {}  # identity without the query -> the queries seen with it
    for path, query in filter(None, split):
        queries.setdefault(path, set()).add(query)
    result: list[Episode] = []
    for c, identity_parts in zip(candidates, split, strict=True):
        episode = c.episode
        if identity_parts is None:
            result.append(episode)
        elif c.link and links[c.link] == 1 and not (channel_link and same_location(c.link, channel_link)):
            result.append(dataclasses.replace(episode, guid=c.link, guid_source="link"))
        else:
            path, query = identity_parts
            # Two items whose files differ only in the query: then the query is what names the file.
            identity = f"{path}?{query}" if query and len(queries[path]) > 1 else path
            result.append(dataclasses.replace(episode, guid=identity, guid_source="enclosure"))
    return result
