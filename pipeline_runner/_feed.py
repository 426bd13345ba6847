"""RSS parsing with defusedxml: malformed or hostile XML fails that feed with a clear reason."""

from __future__ import annotations

import dataclasses
import logging
import math
from xml.etree.ElementTree import Element, ParseError

import defusedxml
import defusedxml.ElementTree

from ._errors import FeedParseError

log = logging.getLogger(__name__)

_ITUNES_NS = "{http://www.itunes.com/dtds/podcast-1.0.dtd}"


@dataclasses.dataclass(frozen=True, slots=True)
class Episode:
    feed_url: str
    guid: str
    title: str
    enclosure_url: str
    enclosure_type: str | None
    duration_s: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class Feed:
    url: str
    title: str
    episodes: tuple[Episode, ...]


def parse_feed(feed_url: str, document: bytes) -> Feed:
    """Parse an RSS 2.0 document. CPU-bound; callers run it off the event loop.

    DTDs are refused outright (``forbid_dtd``): a podcast feed has no use for one and it is the door
    for entity-expansion and external-entity attacks.
    """
    try:
        root = defusedxml.ElementTree.fromstring(document, forbid_dtd=True)
    except defusedxml.DTDForbidden as exc:
        raise FeedParseError(feed_url, "hostile XML: document type declarations are refused") from exc
    except defusedxml.EntitiesForbidden as exc:
        raise FeedParseError(feed_url, "hostile XML: entity declarations are refused") from exc
    except defusedxml.DefusedXmlException as exc:
        raise FeedParseError(feed_url, f"hostile XML: {exc}") from exc
    except ParseError as exc:
        raise FeedParseError(feed_url, f"malformed XML: {exc}") from exc
    channel = root.find("channel")
    if root.tag != "rss" or channel is None:
        raise FeedParseError(feed_url, f"not an RSS document (root element <{root.tag}>)")
    episodes: list[Episode] = []
    seen: set[str] = set()
    for item in channel.findall("item"):
        episode = _parse_item(feed_url, item)
        if episode is None or episode.guid in seen:
            continue
        seen.add(episode.guid)
        episodes.append(episode)
    return Feed(url=feed_url, title=_text(channel, "title") or feed_url, episodes=tuple(episodes))


def _parse_item(feed_url: str, item: Element) -> Episode | None:
    enclosure = item.find("enclosure")
    url = enclosure.get("url") if enclosure is not None else None
    if enclosure is None or not url or not url.startswith(("http://", "https://")):
        log.info("feed %s: item %r has no usable enclosure; not an episode", feed_url, _text(item, "title"))
        return None
    # RSS allows items without a GUID; the enclosure URL is then the most stable identity there is.
    guid = _text(item, "guid") or url
    return Episode(
        feed_url=feed_url,
        guid=guid,
        title=_text(item, "title") or guid,
        enclosure_url=url,
        enclosure_type=enclosure.get("type"),
        duration_s=parse_duration_s(_text(item, f"{_ITUNES_NS}duration")),
    )


def _text(element: Element, tag: str) -> str:
    found = element.find(tag)
    return (found.text or "").strip() if found is not None else ""


def parse_duration_s(raw: str) -> float | None:
    """``itunes:duration`` as seconds: ``SS``, ``MM:SS`` or ``HH:MM:SS``; None when absent or garbage."""
    if not raw:
        return None
    try:
        parts = [float(p) for p in raw.split(":")]
    except ValueError:
        return None
    if not 1 <= len(parts) <= 3 or any(p < 0 or not math.isfinite(p) for p in parts):
        return None
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + part
    return seconds
