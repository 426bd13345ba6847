"""The XML layer of feed parsing: bytes in, the raw fields of a feed out. Defused, streaming, tolerant.

Safety (INV-FEED-DEFUSED, ADR 0003): the only XML parser is defusedxml's expat SAX driver with
``forbid_dtd``: a document type declaration of any kind ends the parse (no entity expansion, no
external entity, no external DTD), and defusedxml also refuses entity declarations and external
references should expat ever reach one. The tolerant "repair" pass below never runs after a hostile
document: it only rewrites bytes of a document that failed as malformed, and the repaired bytes go
through the same defused parser again.

Tolerance (what real feeds need, ADR 0003):

- namespace processing is off, so a prefix nobody declared (``itunes:duration`` without
  ``xmlns:itunes``) is no error. This reader resolves prefixes itself: a declared prefix whose URI is
  a known namespace gets that namespace's usual name (so ``it:duration`` with the iTunes URI is
  ``itunes:duration``); an undeclared or unknown one keeps its own name. Names are matched in lower case;
- encodings: a BOM, a declared non-UTF-8 encoding (transcoded with Python's codecs, so multi-byte
  ones like Shift_JIS work), ISO-8859-1 read as windows-1252 as browsers do;
- a malformed document gets one repair pass: undeclared HTML entities (``&nbsp;``) become character
  references, a bare ``&`` becomes ``&amp;``, control characters are dropped, bytes that are not
  UTF-8 are read as windows-1252. If the repaired document still fails, the original error is reported;
- ``xml:base`` is honoured on every element, and URLs are resolved against it (or the feed's final URL).

It streams: memory is the document plus the fields kept per item, never a tree of the whole feed.
"""

from __future__ import annotations

import codecs
import dataclasses
import html.entities
import io
import re
import xml.sax
import xml.sax.handler
from typing import Final

import defusedxml
import defusedxml.expatreader

from ._feed_values import join_base, resolve_url

# -- what the reader hands back ---------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class RawEnclosure:
    """One media candidate of an item: ``<enclosure>``, ``<media:content>`` or Atom ``<link rel="enclosure">``."""

    url: str | None  # resolved against xml:base / the feed URL; None when not a usable http(s) URL
    type: str | None  # the type= attribute as written
    medium: str | None = None  # Media RSS medium= ("audio", "video", "image", ...)
    duration: str | None = None  # Media RSS duration= (seconds)
    is_default: bool = False  # Media RSS isDefault="true"


@dataclasses.dataclass(slots=True)
class RawItem:
    """The fields of one ``<item>`` / ``<entry>`` as written (text stripped of nothing yet)."""

    text: dict[str, str] = dataclasses.field(default_factory=dict)  # title, guid, link, published, updated, duration
    enclosures: list[RawEnclosure] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class RawFeed:
    root: str  # "rss", "rdf:rdf", "atom:feed" or "redirect"
    text: dict[str, str] = dataclasses.field(default_factory=dict)  # title, link, moved_to
    items: list[RawItem] = dataclasses.field(default_factory=list)
    truncated: bool = False  # MAX_ITEMS items were read and the rest of the document was not


class NotAFeedError(Exception):
    """The document is well-formed XML but its root element is not a feed's."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.root = root


class MalformedError(Exception):
    """The document is not well-formed XML, even after the repair pass."""


class _TooDeepError(Exception):
    """Raised inside the parse at an element nested deeper than MAX_DEPTH."""


class HostileError(Exception):
    """A DTD, an entity declaration or an external reference (INV-FEED-DEFUSED), or absurd nesting."""


class EncodingError(Exception):
    """The declared encoding is unknown to Python (or to expat); the message is the reason."""


# -- names ------------------------------------------------------------------------------------------

# Namespace URIs as written in the wild (scheme, "www.", case and trailing slash vary) -> usual prefix.
_KNOWN_NAMESPACES: Final = {
    "itunes.com/dtds/podcast-1.0.dtd": "itunes",
    "search.yahoo.com/mrss": "media",
    "w3.org/2005/atom": "atom",
    "podcastindex.org/namespace/1.0": "podcast",
    "github.com/podcastindex-org/podcast-namespace/blob/main/docs/1.0.md": "podcast",
    "purl.org/rss/1.0/modules/content": "content",
    "purl.org/dc/elements/1.1": "dc",
    "w3.org/1999/02/22-rdf-syntax-ns#": "rdf",
    "google.com/schemas/play-podcasts/1.0": "googleplay",
    # RSS 1.0's and Userland's RSS 2.0 default namespaces carry plain RSS element names.
    "purl.org/rss/1.0": "",
    "backend.userland.com/rss2": "",
}
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*://")


def _namespace_name(uri: str, prefix: str) -> str:
    key = _SCHEME.sub("", uri.strip().lower()).removeprefix("www.").rstrip("/")
    return _KNOWN_NAMESPACES.get(key, prefix)


# What each element of an item means. Text fields keep their first non-empty value.
_ITEM_TEXT: Final = {
    "title": "title",
    "atom:title": "title",
    "guid": "guid",
    "atom:id": "guid",
    "link": "link",
    "pubdate": "published",
    "atom:published": "published",
    "dc:date": "updated",
    "atom:updated": "updated",
    "itunes:duration": "duration",
}
_CHANNEL_TEXT: Final = {
    "title": "title",
    "atom:title": "title",
    "link": "link",
    "itunes:new-feed-url": "moved_to",
}
_URL_FIELDS: Final = frozenset({"link", "moved_to"})
_ROOTS: Final = frozenset({"rss", "rdf:rdf", "atom:feed", "redirect"})
_CHANNELS: Final = frozenset({"channel", "atom:feed"})
_ITEM_PARENTS: Final = {"item": frozenset({"channel", "rdf:rdf"}), "atom:entry": frozenset({"atom:feed"})}

# Bounds on what one document can make the reader keep (the feed size cap bounds the bytes, these the
# objects): 20 MB of minimal items would otherwise be ~400,000 episodes and seconds of work. Feeds list
# newest first, so the first items are the ones kept. A real podcast's media alternatives fit in 32.
MAX_ITEMS: Final = 25_000
MAX_ENCLOSURES_PER_ITEM: Final = 32
# Feeds nest a dozen levels (XHTML content a few more); 20 MB of nested elements would cost seconds.
MAX_DEPTH: Final = 512


class _Enough(Exception):
    """Raised inside the parse once MAX_ITEMS items are read; the rest of the document is not read."""


class _Reader(xml.sax.handler.ContentHandler):
    """SAX handler: keeps a stack of element names, xml:base values and prefix scopes, and the fields."""

    def __init__(self, base_url: str | None) -> None:
        super().__init__()
        self.feed: RawFeed | None = None
        self._names: list[str] = []
        self._bases: list[str | None] = [base_url]
        # Prefix -> namespace names, innermost last; and per element depth, the prefixes it declared.
        # Stacks, not a copied dict per scope: deep nesting with declarations stays linear.
        self._prefixes: dict[str, list[str]] = {}
        self._declared: list[tuple[int, list[str]]] = []
        self._cache: dict[str, str] = {}
        self._item: RawItem | None = None
        self._item_depth = -1
        self._capture: list[str] | None = None
        self._capture_depth = -1
        self._capture_target: dict[str, str] = {}
        self._capture_field = ""

    # -- names

    def _push_scope(self, depth: int, declarations: dict[str, str]) -> None:
        for prefix, uri in declarations.items():
            self._prefixes.setdefault(prefix, []).append(_namespace_name(uri, prefix))
        self._declared.append((depth, list(declarations)))
        self._cache.clear()

    def _pop_scope(self, depth: int) -> None:
        if self._declared and self._declared[-1][0] == depth:
            for prefix in self._declared.pop()[1]:
                self._prefixes[prefix].pop()
            self._cache.clear()

    def _canonical(self, raw: str) -> str:
        name = self._cache.get(raw)
        if name is None:
            prefix, _, local = raw.rpartition(":")
            # An undeclared prefix keeps its own name: that is how "itunes:" without xmlns is read.
            bound = self._prefixes.get(prefix)
            namespace = bound[-1] if bound else prefix
            name = f"{namespace}:{local}".lower() if namespace else local.lower()
            self._cache[raw] = name
        return name

    # -- SAX events

    def startElement(self, name: str, attrs: xml.sax.xmlreader.AttributesImpl) -> None:
        depth = len(self._names)
        if depth >= MAX_DEPTH:
            raise _TooDeepError
        if attrs:
            declarations = {
                key[6:] if key.startswith("xmlns:") else "": value
                for key, value in attrs.items()
                if key.startswith("xmlns") and (len(key) == 5 or key[5] == ":")
            }
            if declarations:
                self._push_scope(depth, declarations)
        canonical = self._canonical(name)
        base = self._bases[-1]
        xml_base = attrs.get("xml:base")
        if xml_base is not None:
            base = join_base(base, xml_base)
        parent = self._names[-1] if self._names else ""
        self._names.append(canonical)
        self._bases.append(base)
        if depth == 0:
            self._start_root(canonical, depth)
            return
        item = self._item
        if item is not None:
            relative = depth - self._item_depth
            if relative == 1:
                self._item_child(item, canonical, attrs, base, depth)
            elif relative == 2 and canonical == "media:content" and parent == "media:group":
                self._add_enclosure(item, _media_content(attrs, base))
            return
        parents = _ITEM_PARENTS.get(canonical)
        if parents is not None and parent in parents:
            self._item = RawItem()
            self._item_depth = depth
            about = attrs.get("rdf:about")  # RSS 1.0 names its items by URI
            if about:
                self._item.text["guid"] = about
        elif parent in _CHANNELS and canonical in _CHANNEL_TEXT:
            assert self.feed is not None
            self._start_capture(self.feed.text, _CHANNEL_TEXT[canonical], depth)
        elif canonical == "newlocation" and parent == "redirect":
            assert self.feed is not None
            self._start_capture(self.feed.text, "moved_to", depth)

    def _start_root(self, canonical: str, depth: int) -> None:
        if canonical == "feed":
            # <feed> without the Atom namespace: read it as Atom all the same.
            self._push_scope(depth, {"": "http://www.w3.org/2005/Atom"})
            canonical = self._names[-1] = "atom:feed"
        if canonical not in _ROOTS:
            raise NotAFeedError(canonical)
        self.feed = RawFeed(root=canonical)

    def _item_child(
        self, item: RawItem, name: str, attrs: xml.sax.xmlreader.AttributesImpl, base: str | None, depth: int
    ) -> None:
        field = _ITEM_TEXT.get(name)
        if field is not None:
            self._start_capture(item.text, field, depth)
        elif name == "enclosure":
            self._add_enclosure(item, RawEnclosure(url=resolve_url(base, attrs.get("url")), type=attrs.get("type")))
        elif name == "media:content":
            self._add_enclosure(item, _media_content(attrs, base))
        elif name == "atom:link":
            rel = (attrs.get("rel") or "alternate").strip().lower()
            if rel == "enclosure":
                enclosure = RawEnclosure(url=resolve_url(base, attrs.get("href")), type=attrs.get("type"))
                self._add_enclosure(item, enclosure)
            elif rel == "alternate" and "link" not in item.text:
                url = resolve_url(base, attrs.get("href"))
                if url is not None:
                    item.text["link"] = url

    @staticmethod
    def _add_enclosure(item: RawItem, enclosure: RawEnclosure) -> None:
        if len(item.enclosures) < MAX_ENCLOSURES_PER_ITEM:
            item.enclosures.append(enclosure)

    def _start_capture(self, target: dict[str, str], field: str, depth: int) -> None:
        if target.get(field, "").strip():
            return  # first non-empty value wins
        self._capture = []
        self._capture_depth = depth
        self._capture_target = target
        self._capture_field = field

    def characters(self, content: str) -> None:
        if self._capture is not None:
            self._capture.append(content)

    def endElement(self, name: str) -> None:
        depth = len(self._names) - 1
        if self._capture is not None and depth == self._capture_depth:
            text = "".join(self._capture)
            if self._capture_field in _URL_FIELDS:
                text = resolve_url(self._bases[-1], text) or ""
            self._capture_target[self._capture_field] = text
            self._capture = None
        if self._item is not None and depth == self._item_depth:
            assert self.feed is not None
            self.feed.items.append(self._item)
            self._item = None
            if len(self.feed.items) >= MAX_ITEMS:
                self.feed.truncated = True
                raise _Enough
        self._names.pop()
        self._bases.pop()
        self._pop_scope(depth)


def _media_content(attrs: xml.sax.xmlreader.AttributesImpl, base: str | None) -> RawEnclosure:
    return RawEnclosure(
        url=resolve_url(base, attrs.get("url")),
        type=attrs.get("type"),
        medium=(attrs.get("medium") or "").strip().lower() or None,
        duration=attrs.get("duration"),
        is_default=(attrs.get("isDefault") or "").strip().lower() == "true",
    )


# -- encodings --------------------------------------------------------------------------------------

_UTF8_BOM: Final = b"\xef\xbb\xbf"
_DECLARED_ENCODING = re.compile(rb"""^<\?xml[^>]*?\sencoding\s*=\s*["']([A-Za-z0-9._:-]{1,40})["']""")
# Read as UTF-8 (a superset) or, for ISO-8859-1, as windows-1252 (what browsers do, and what such feeds mean).
_AS_UTF8: Final = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})
_AS_CP1252: Final = frozenset({"iso-8859-1", "iso8859-1", "latin-1", "latin1", "l1"})


def to_utf8(document: bytes) -> bytes:
    """The document as UTF-8 bytes with no BOM and no leading whitespace, its declaration saying UTF-8."""
    if document.startswith((b"\xff\xfe", b"\xfe\xff", b"<\x00?\x00", b"\x00<\x00?")):
        encoding = "utf-16" if document[:2] in (b"\xff\xfe", b"\xfe\xff") else _utf16_without_bom(document)
        return _redeclare(document.decode(encoding, errors="replace").lstrip("\ufeff"))
    data = document.removeprefix(_UTF8_BOM).lstrip()
    match = _DECLARED_ENCODING.match(data[:400])
    if match is None:
        return data
    declared = match.group(1).decode("ascii").lower()
    if declared in _AS_UTF8:
        return data
    encoding = "windows-1252" if declared in _AS_CP1252 else declared
    try:
        codecs.lookup(encoding)
    except LookupError as exc:
        raise EncodingError(f"unknown encoding: {declared}") from exc
    return _redeclare(data.decode(encoding, errors="replace"))


def _utf16_without_bom(document: bytes) -> str:
    return "utf-16-le" if document.startswith(b"<\x00") else "utf-16-be"


def _redeclare(text: str) -> bytes:
    text = text.lstrip()
    data = text.encode("utf-8")
    match = _DECLARED_ENCODING.match(data[:400])
    if match is not None:
        data = data[: match.start(1)] + b"UTF-8" + data[match.end(1) :]
    return data


# -- repair -----------------------------------------------------------------------------------------

_XML_ENTITIES: Final = frozenset({b"amp", b"lt", b"gt", b"quot", b"apos"})
_AMPERSAND = re.compile(rb"&(#[0-9]{1,7};|#[xX][0-9A-Fa-f]{1,6};|[A-Za-z][A-Za-z0-9]{0,31};)?")
_CONTROL_CHARACTERS = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _fix_ampersand(match: re.Match[bytes]) -> bytes:
    reference = match.group(1)
    if reference is None:
        return b"&amp;"  # a bare "&" (Tom & Jerry, ?a=1&b=2)
    if reference.startswith(b"#"):
        return match.group(0)
    name = reference[:-1]
    if name in _XML_ENTITIES:
        return match.group(0)
    text = html.entities.html5.get(name.decode("ascii") + ";")
    if text is None:
        return b"&amp;" + reference  # unknown: keep it as the literal text it was
    return b"".join(b"&#%d;" % ord(char) for char in text)


def repair(data: bytes) -> bytes:
    """The mechanical fixes for the malformations real feeds carry most. Never adds markup."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        data = data.decode("windows-1252", errors="replace").encode("utf-8")
    data = _CONTROL_CHARACTERS.sub(b"", data)
    return _AMPERSAND.sub(_fix_ampersand, data)


# -- parsing ----------------------------------------------------------------------------------------


def _parse_once(data: bytes, base_url: str | None) -> RawFeed:
    reader = _Reader(base_url)
    # INV-FEED-DEFUSED: defusedxml's expat driver, DTDs refused outright; namespace processing off.
    parser = defusedxml.expatreader.create_parser(forbid_dtd=True, forbid_entities=True, forbid_external=True)
    parser.setContentHandler(reader)
    source = xml.sax.xmlreader.InputSource()
    source.setByteStream(io.BytesIO(data))
    try:
        parser.parse(source)
    except _Enough:
        pass
    except _TooDeepError as exc:
        raise HostileError(f"elements nested deeper than {MAX_DEPTH} levels are refused") from exc
    except defusedxml.DTDForbidden as exc:
        raise HostileError("document type declarations are refused") from exc
    except defusedxml.EntitiesForbidden as exc:
        raise HostileError("entity declarations are refused") from exc
    except defusedxml.DefusedXmlException as exc:
        raise HostileError(f"{type(exc).__name__}: {exc}") from exc
    except LookupError as exc:
        # A declaration the pre-pass did not recognise (damaged, odd quoting) reaches expat, which asks
        # Python's codecs and gets "unknown encoding".
        raise EncodingError(str(exc)) from exc
    except ValueError as exc:
        if "encoding" not in str(exc):  # "multi-byte encodings are not supported"; anything else is a bug
            raise
        raise EncodingError(str(exc)) from exc
    assert reader.feed is not None  # expat reports a document without a root element as malformed
    return reader.feed


def _describe(exc: xml.sax.SAXParseException) -> str:
    return f"{exc.getMessage()}: line {exc.getLineNumber()}, column {exc.getColumnNumber()}"


def read_feed(document: bytes, base_url: str | None) -> RawFeed:
    """Parse ``document``; raises HostileError, MalformedError, EncodingError or NotAFeedError."""
    data = to_utf8(document)
    try:
        return _parse_once(data, base_url)
    except xml.sax.SAXParseException as first:
        repaired = repair(data)
        if repaired == data:
            raise MalformedError(_describe(first)) from first
        try:
            return _parse_once(repaired, base_url)
        except xml.sax.SAXParseException:
            # The repair did not help: the original error is the one that describes the document.
            raise MalformedError(_describe(first)) from first
