"""The values inside a feed, read leniently: durations, dates, media types, URLs, titles, identities.

Every function here is pure and total: garbage in gives ``None`` (or a documented default), never an
exception, because one odd value must not cost a whole feed its episodes. See docs/adr/0003-feed-parsing.md.
"""

from __future__ import annotations

import html
import html.entities
import math
import posixpath
import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_tz
from typing import Final
from urllib.parse import unquote, urljoin, urlsplit

# -- durations --------------------------------------------------------------------------------------

# ``SS``, ``MM:SS`` or ``HH:MM:SS``, each with an optional fraction on the last part (``01:02:03.500``).
_DURATION = re.compile(r"(\d{1,12})(?::(\d{1,12}))?(?::(\d{1,12}))?(?:[.,](\d{1,9}))?")
# Longer than a month is a typo or milliseconds; the cost model then estimates from the size instead.
MAX_DURATION_S: Final = 31 * 24 * 3600.0


def parse_duration_s(raw: str | None) -> float | None:
    """``itunes:duration`` (or Media RSS ``duration``) as seconds; None when absent, zero or garbage.

    ``"1:02:03"`` and ``"62:03"`` and ``"3723"`` are all 3723.0; ``"01:02:03.500"`` is 3723.5. Zero is
    None: in real feeds it means "unknown", and a zero would make the transcription look free.
    """
    if raw is None:
        return None
    match = _DURATION.fullmatch(raw.strip())
    if match is None:
        return None
    seconds = 0.0
    for part in match.group(1, 2, 3):
        if part is not None:
            seconds = seconds * 60 + int(part)
    if match.group(4):
        seconds += float("0." + match.group(4))
    if not (0 < seconds <= MAX_DURATION_S) or not math.isfinite(seconds):
        return None
    return seconds


# -- dates ------------------------------------------------------------------------------------------

# Long month and day names, and "Sept": parsedate_tz knows only the three-letter forms.
_LONG_NAMES = re.compile(
    r"\b(january|february|march|april|june|july|august|september|sept|october|november|december"
    r"|monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b",
    re.IGNORECASE,
)
# "+02:00" -> "+0200" and "GMT+2" / "UTC-05:30" -> "+0200" / "-0530": RFC 822 wants four digits.
_COLON_OFFSET = re.compile(r"([+-])(\d\d):(\d\d)$")
_NAMED_OFFSET = re.compile(r"\b(?:GMT|UTC|UT)\s*([+-])(\d{1,2})(?::?(\d\d))?$", re.IGNORECASE)


def parse_published(raw: str | None) -> str | None:
    """A feed date (RFC 822 ``pubDate``, ISO 8601 Atom dates, and their common broken forms) as ISO 8601 UTC.

    Accepted beyond the standards: full day and month names, a missing or wrong weekday, a missing
    time or seconds, ``+02:00`` / ``GMT+2`` offsets, ``Z`` after an RFC date. An unknown zone name
    is read as UTC. Anything else is None: a bad date never costs an episode.
    """
    if raw is None:
        return None
    text = " ".join(raw.split())
    if not text:
        return None
    parsed = _parse_iso(text)
    if parsed is None:
        parsed = _parse_rfc822(text)
    if parsed is None:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC).isoformat()
    except (OverflowError, ValueError):
        return None


def _parse_iso(text: str) -> datetime | None:
    candidate = text
    if len(candidate) >= 10 and candidate[4:5] == "-" and candidate[:4].isdigit():
        candidate = re.sub(r"([+-]\d\d)(\d\d)$", r"\1:\2", candidate)  # "+0200" -> "+02:00"
        try:
            return datetime.fromisoformat(candidate.replace("z", "Z"))
        except ValueError:
            return None
    return None


def _parsedate(text: str) -> tuple[int, int, int, int, int, int, int | None] | None:
    """(year, month, day, hour, minute, second, UTC offset in seconds or None) from ``parsedate_tz``."""
    try:
        fields = parsedate_tz(text)
    except (TypeError, ValueError, IndexError):
        return None
    if fields is None:
        return None
    return (fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], fields[9])


def _parse_rfc822(text: str) -> datetime | None:
    text = _LONG_NAMES.sub(lambda m: m.group(1)[:3], text)
    text = text.replace(",", ", ").replace("  ", " ")
    text = _NAMED_OFFSET.sub(lambda m: f"{m.group(1)}{int(m.group(2)):02d}{m.group(3) or '00'}", text)
    text = _COLON_OFFSET.sub(r"\1\2\3", text)
    if text.endswith(("Z", "z")) and not text.endswith(("GMT", "UTC")):
        text = text[:-1].rstrip() + " +0000"
    fields = _parsedate(text)
    if fields is None:
        fields = _parsedate(text + " 00:00:00")  # a date without a time: midnight
    if fields is None:
        return None
    year, month, day, hour, minute, second, offset = fields
    try:
        naive = datetime(year, month, day, hour, minute, second)
    except (ValueError, OverflowError):
        return None
    if offset is None:
        return naive
    try:
        return (naive - timedelta(seconds=offset)).replace(tzinfo=UTC)
    except OverflowError:
        return None


# -- media types ------------------------------------------------------------------------------------

OCTET_STREAM: Final = "application/octet-stream"

# A small fixed table, not ``mimetypes``: that one also reads the host's /etc/mime.types, and the
# recorded type must not depend on the machine.
_TYPE_BY_EXTENSION: Final = {
    ".mp3": "audio/mpeg",
    ".m4a": "audio/mp4",
    ".m4b": "audio/mp4",
    ".aac": "audio/aac",
    ".oga": "audio/ogg",
    ".ogg": "audio/ogg",
    ".opus": "audio/opus",
    ".flac": "audio/flac",
    ".wav": "audio/wav",
    ".mp4": "video/mp4",
    ".m4v": "video/x-m4v",
    ".mov": "video/quicktime",
    ".webm": "video/webm",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".pdf": "application/pdf",
    ".vtt": "text/vtt",
    ".srt": "application/x-subrip",
}


def declared_type(raw: str | None) -> str | None:
    """A ``type=`` attribute as a bare lower-case media type (parameters dropped); None when unusable."""
    if raw is None:
        return None
    value = raw.split(";", 1)[0].strip().lower()
    return value if "/" in value and " " not in value else None


def guess_type(url: str) -> str | None:
    """The media type implied by the URL's file extension, from a fixed table; None when unknown."""
    try:
        path = urlsplit(url).path
    except ValueError:
        return None
    return _TYPE_BY_EXTENSION.get(posixpath.splitext(path)[1].lower())


def media_class(media_type: str | None, medium: str | None = None) -> str:
    """``audio``, ``video``, ``image``, ``unknown`` (octet-stream or nothing to go on) or ``other``."""
    if media_type is None or media_type == OCTET_STREAM:
        if medium in ("audio", "video", "image"):
            return medium
        return "unknown"
    major = media_type.split("/", 1)[0]
    if major in ("audio", "video", "image"):
        return major
    if media_type == "application/ogg":
        return "audio"
    return "other"


# -- URLs -------------------------------------------------------------------------------------------


# An absolute http(s) URL with a host: the common case, answered without urljoin (a quarter of the parse time).
_ABSOLUTE_HTTP = re.compile(r"https?://[^/?#\s@\[\]]+(?:[/?#]\S*)?", re.IGNORECASE)


def resolve_url(base: str | None, raw: str | None) -> str | None:
    """``raw`` stripped of surrounding whitespace and resolved against ``base``; None unless http(s)."""
    if raw is None:
        return None
    value = raw.strip()
    if not value:
        return None
    if _ABSOLUTE_HTTP.fullmatch(value):
        return value
    try:
        absolute = urljoin(base, value) if base else value
        parts = urlsplit(absolute)
    except ValueError:  # e.g. an unbalanced "[" in the host
        return None
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        return None
    return absolute


def join_base(base: str | None, raw: str) -> str | None:
    """An ``xml:base`` value resolved against the inherited base (which may be unknown)."""
    value = raw.strip()
    try:
        return urljoin(base, value) if base else value
    except ValueError:
        return base


def same_location(a: str, b: str) -> bool:
    """Two URLs name the same resource for the purpose of "has this feed moved?": scheme, case of the
    host, a trailing slash and a ``www.`` prefix do not count."""
    return _location(a) == _location(b)


def _location(url: str) -> str:
    try:
        parts = urlsplit(url.strip())
        host = (parts.hostname or "").removeprefix("www.")
        port = f":{parts.port}" if parts.port not in (None, 80, 443) else ""
    except ValueError:
        return url.strip()
    query = f"?{parts.query}" if parts.query else ""
    return f"{host}{port}{parts.path.rstrip('/')}{query}"


def file_name(url: str) -> str:
    """The last path segment of a URL, percent-decoded; "" when the path ends in a slash."""
    try:
        path = urlsplit(url).path
    except ValueError:
        return ""
    return unquote(path.rsplit("/", 1)[-1]).strip()


# -- titles -----------------------------------------------------------------------------------------


_REFERENCE = re.compile(r"&(?:#([0-9]{1,7})|#[xX]([0-9A-Fa-f]{1,6})|([A-Za-z][A-Za-z0-9]{0,31}));")


def _unescape(match: re.Match[str]) -> str:
    decimal, hexadecimal, name = match.groups()
    if name is not None:
        return html.entities.html5.get(name + ";", match.group(0))
    code = int(decimal) if decimal is not None else int(hexadecimal, 16)
    return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else match.group(0)


def clean_title(raw: str | None) -> str:
    """Whitespace collapsed, and HTML entities decoded: feeds escape them twice (``&amp;amp;``).

    Only complete references (with the ``;``) are decoded, unlike ``html.unescape``, which would read
    "&notice" as "¬ice".
    """
    if not raw:
        return ""
    text = _REFERENCE.sub(_unescape, raw) if "&" in raw else raw
    return " ".join(text.split())


# -- identity of guid-less items --------------------------------------------------------------------

# A path segment that is a host name: the real location inside a tracking prefix such as
# ``dts.podtrac.com/redirect.mp3/<host>/<path>`` or ``chtbl.com/track/<id>/<host>/<path>``.
_HOST_SEGMENT = re.compile(r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,24}", re.IGNORECASE)
# File extensions that look like top-level domains; such a segment is a file, not a host.
_NOT_TLDS: Final = frozenset(
    {"aac", "ogg", "oga", "opus", "wav", "flac", "mov", "webm", "php", "html", "htm", "aspx", "asp", "jsp", "cgi"}
    | {"xml", "json", "rss", "atom", "txt", "pdf", "jpeg", "png", "gif"}
)


def enclosure_identity(url: str) -> tuple[str, str]:
    """The stable part of an enclosure URL, as (host without ``www.`` + path after tracking prefixes, query).

    Scheme and fragment are left out, and the caller adds the query only when it is needed to tell
    two files apart, so a feed that adds a measurement prefix, switches to https or appends a
    cache-buster keeps its episodes' identity. A new host is a new identity: with nothing else to go
    on, two hosts may serve different files.
    """
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
    except ValueError:
        return url, ""
    segments = parts.path.split("/")
    # Strip nested prefixes: a segment (not the last) that looks like a host starts the real location.
    index = 1
    while index < len(segments) - 1:
        segment = segments[index]
        if _HOST_SEGMENT.fullmatch(segment) and segment.rsplit(".", 1)[1].lower() not in _NOT_TLDS:
            host = segment.lower()
            segments = ["", *segments[index + 1 :]]
            index = 1
            continue
        index += 1
    return host.removeprefix("www.") + "/".join(segments), parts.query
