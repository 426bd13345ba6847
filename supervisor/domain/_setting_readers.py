"""How a setting is declared (``Setting``) and how its raw value (a string from the environment, or a TOML value) is
read into ``Config`` fields: the readers the declarations of ``_settings`` name (``Num``, ``Choice``, ``Custom``
and the functions it wraps), and the ``Loader`` that collects what they fall back from (a WARNING) and what has no
fallback (one ``ConfigError``).

Rules (ADR-0002, INV-MALFORMED-NEVER-UNBOUNDED): a malformed number falls back to its default with a WARNING naming
the variable, never to "unbounded"; a value below its floor is raised to the floor, with a WARNING; a setting with
no safe fallback is a problem, reported with every other one.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ._errors import ConfigError
from ._signing import webhook_signing_key

DATABASE_URL_SCHEMES = ("postgresql://", "postgres://")
_HOST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# Docker object names: a network or a named volume.
_DOCKER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def redacted_url(url: str) -> str:
    """``url`` without its password: what logs, errors and ``check-config`` may show."""
    try:
        parts = urllib.parse.urlsplit(url)
        password = parts.password
    except ValueError:
        return "(an unparsable URL)"
    if password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


MAX_TOKEN_FILE_BYTES = 4096


def read_token_file(path: Path) -> str:
    """The operator token held in ``path`` (surrounding white space dropped). Blocking: call it off the loop.

    An unreadable or empty file is a ``ConfigError``: never a silent fallback to "no token" (an open API).
    """
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"cannot read the API token file {path}: {exc.strerror or exc}"]) from exc
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise ConfigError([f"the API token file {path} is larger than {MAX_TOKEN_FILE_BYTES} bytes"])
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError([f"the API token file {path} is not UTF-8 text"]) from None
    if not token:
        raise ConfigError([f"the API token file {path} is empty"])
    if any(ch.isspace() or not ch.isprintable() for ch in token):
        raise ConfigError([f"the API token file {path} holds more than one printable word"])
    return token


def parse_bind(text: str) -> tuple[str, int]:
    """Parse ``host:port`` (``[v6]:port`` for IPv6) into its parts."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError("expected HOST:PORT")
    host = host.removeprefix("[").removesuffix("]")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} is out of range")
    return host, port


@dataclass
class Loader:
    """Collects WARNING-level fallbacks and hard errors while settings are read."""

    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class Reader(Protocol):
    """How a raw value (a string from the environment, or a TOML value) becomes ``Config`` fields: ``where`` names
    it in a message; ``values`` are the fields read so far (a setting may depend on an earlier one). ``KEEP`` keeps
    the default (a fallback or a problem was recorded on the loader)."""

    @property
    def rule(self) -> str: ...

    def __call__(self, loader: Loader, where: str, raw: object, default: Any, values: dict[str, Any]) -> Any: ...


KEEP = object()  # a reader's answer: keep the default (a fallback or a problem was recorded)


@dataclass(frozen=True)
class Num:
    """A number; ``off``: ``<= 0`` disables (None)."""

    integer: bool = False
    floor: float | None = None
    ceiling: float | None = None
    off: bool = False

    @property
    def rule(self) -> str:
        limits = (("floor", self.floor), ("ceiling", self.ceiling))
        bounds = ", ".join(f"{name} {_plain(value)}" for name, value in limits if value is not None)
        return "; ".join(part for part in (bounds, "`<= 0` disables" if self.off else "", self._junk) if part)

    @property
    def _junk(self) -> str:
        return "junk or not a whole number → default" if self.integer else "junk → default"

    def __call__(self, loader: Loader, where: str, raw: object, default: Any, values: dict[str, Any]) -> Any:
        try:
            if isinstance(raw, bool) or not isinstance(raw, int | float | str):
                raise ValueError("not a number")
            value = float(raw)
            if not math.isfinite(value) or (self.integer and value != int(value)):
                raise ValueError("not a finite number of its kind")
        except (TypeError, ValueError):
            # INV-MALFORMED-NEVER-UNBOUNDED: junk means the default, never "no limit".
            loader.warnings.append(f"{where}={raw!r} is not a valid number; using the default {default!r}")
            return default
        if self.off and value <= 0:
            return None
        if self.floor is not None and value < self.floor:
            loader.warnings.append(f"{where}={raw!r} is below the floor {self.floor!r}; using {self.floor!r}")
            value = self.floor
        if self.ceiling is not None and value > self.ceiling:
            loader.warnings.append(f"{where}={raw!r} is above the ceiling {self.ceiling!r}; using {self.ceiling!r}")
            value = self.ceiling
        return int(value) if self.integer else float(value)


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of words, case-insensitive. No fallback: guessing an exec mode would run jobs where the
    operator did not choose, and a mistyped stall action must not quietly leave stalled jobs running."""

    words: tuple[str, ...]

    @property
    def rule(self) -> str:
        return f"not {'/'.join(f'`{w}`' for w in self.words)} → **error**"

    def __call__(self, loader: Loader, where: str, raw: object, default: Any, values: dict[str, Any]) -> Any:
        word = str(raw).lower()
        if word in self.words:
            return word
        loader.problems.append(f"{where}={raw!r}: must be one of {', '.join(self.words)}")
        return KEEP


@dataclass(frozen=True)
class Custom:
    """A setting read by a function of its own; its rule (its fallback, or its error) is declared with it."""

    read: Callable[[Loader, str, object, dict[str, Any]], Any]
    rule: str = ""

    def __call__(self, loader: Loader, where: str, raw: object, default: Any, values: dict[str, Any]) -> Any:
        return self.read(loader, where, raw, values)


@dataclass(frozen=True)
class Setting:
    """One setting: ``attr`` its ``Config`` field (``bind`` sets two), ``env`` its variable, ``read`` how its raw
    value is read, ``default`` how the table shows its default, ``rule`` its fallback or error (None: the reader's),
    ``help`` what it means."""

    attr: str
    env: str
    read: Reader
    default: str
    help: str
    rule: str | None = None

    @property
    def toml(self) -> str:
        """Its key in a ``--config`` TOML file."""
        return self.attr

    @property
    def rule_text(self) -> str:
        return self.rule if self.rule is not None else self.read.rule


def _plain(value: float) -> str:
    return f"{value:g}"


def _text(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> str | None:
    text = str(raw).strip()
    return text or None


def _path(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Path:
    return Path(str(raw))


TEXT = Custom(_text, "—")
PATH = Custom(_path, "—")


def _bind(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    try:
        values["bind_host"], values["bind_port"] = parse_bind(str(raw))
    except ValueError as exc:
        loader.problems.append(f"{where}={raw!r}: {exc}")
    return KEEP


def _token_file(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    if values.get("api_token"):
        # Two sources would leave an operator guessing which one the server uses.
        loader.problems.append(f"{where}: set either PODCAST_JOB_API_TOKEN or PODCAST_JOB_API_TOKEN_FILE, not both")
        return KEEP
    path = Path(str(raw))
    try:
        values["api_token"] = read_token_file(path)
    except ConfigError as exc:
        loader.problems.extend(f"{where}: {problem}" for problem in exc.problems)
        return KEEP
    return path


def _run_dir(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    word = str(raw)
    if word.lower() in ("auto", "off"):
        return word.lower()
    if Path(word).is_absolute():
        return word
    loader.problems.append(f"{where}={raw!r}: must be auto, off or an absolute path")
    return KEEP


def _postgres_url(loader: Loader, where: str, raw: object, why: str) -> Any:
    url = str(raw)
    if url.startswith(DATABASE_URL_SCHEMES):
        return url
    shown = redacted_url(url) if "://" in url else "(not a URL)"
    loader.problems.append(f"{where}={shown!r}: must be a postgresql:// URL{why}")
    return KEEP


def _database_url(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    # Guessing would put the queue somewhere the operator did not choose: SQLite is chosen by leaving it unset.
    return _postgres_url(loader, where, raw, " (unset, the registry is SQLite in the data dir)")


def _listen_url(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    return _postgres_url(loader, where, raw, "")


def _http_url(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    url = str(raw).strip()
    if url.startswith(("http://", "https://")):
        return url
    loader.problems.append(f"{where}={raw!r}: must be an http:// or https:// URL")
    return KEEP


def _webhook_secret(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    secret = str(raw).strip()
    try:
        webhook_signing_key(secret)
    except ValueError as exc:
        # Never the value itself: the secret stays out of every message (check-config prints "(set)").
        loader.problems.append(f"{where}: {exc}")
        return KEEP
    return secret or None


def _heartbeat_url(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    url = str(raw).strip()
    if re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", url):
        return url.rstrip("/")
    loader.problems.append(
        f"{where}={raw!r}: must be an http:// or https:// URL with a host, e.g. http://supervisor:8000"
    )
    return KEEP


def _docker_image(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    image = str(raw).strip()
    if image and not any(ch.isspace() for ch in image):
        return image
    # An empty image name would make every docker job fail to start; a default image is no better a guess.
    loader.problems.append(f"{where}={raw!r}: must be an image reference, e.g. name:tag")
    return KEEP


def _docker_network(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    network = str(raw).strip()
    if _DOCKER_NAME.fullmatch(network):
        return network
    loader.problems.append(f"{where}={raw!r}: must be a Docker network name")
    return KEEP


def _docker_volume(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    volume = str(raw).strip()
    if volume.startswith("/") or _DOCKER_NAME.fullmatch(volume):
        return volume
    loader.problems.append(f"{where}={raw!r}: must be a volume name or an absolute host path")
    return KEEP


def _boolean(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    word = str(raw).lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    loader.problems.append(f"{where}={raw!r}: must be true or false")
    return KEEP


def _host_id(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    word = str(raw)
    if _HOST_ID.fullmatch(word):
        return word
    # No fallback: another host's name, or a made-up one, would judge or orphan the wrong jobs.
    loader.problems.append(f"{where}={raw!r}: a host id is 1-64 letters, digits, '.', '_' or '-'")
    return KEEP


def _host_max_concurrent(loader: Loader, where: str, raw: object, values: dict[str, Any]) -> Any:
    text = str(raw).strip()
    if text.isdigit() and int(text) >= 1:
        return int(text)
    # No fallback: "no cap of its own" is not what an operator who set one meant.
    loader.problems.append(f"{where}={raw!r}: must be a whole number of jobs, at least 1")
    return KEEP


# The readers of their own, as the declarations name them.
BIND = Custom(_bind)
BOOLEAN = Custom(_boolean)
DATABASE_URL = Custom(_database_url)
DOCKER_IMAGE = Custom(_docker_image)
DOCKER_NETWORK = Custom(_docker_network)
DOCKER_VOLUME = Custom(_docker_volume)
HEARTBEAT_URL = Custom(_heartbeat_url)
HOST_ID = Custom(_host_id)
HOST_MAX_CONCURRENT = Custom(_host_max_concurrent)
HTTP_URL = Custom(_http_url)
LISTEN_URL = Custom(_listen_url)
RUN_DIR = Custom(_run_dir)
TOKEN_FILE = Custom(_token_file)
WEBHOOK_SECRET = Custom(_webhook_secret)
