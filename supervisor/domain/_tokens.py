"""Who may call the control API: named tokens with a scope (ADR 0017), and the operator token.

A scope is what a token may do; each includes the ones before it:

- ``read``: every GET route (jobs, a job, its log, the queue, hosts, events, the OpenAPI document);
- ``enqueue``: ``read``, and adding jobs (``POST /api/jobs``, ``POST /api/jobs/batch``);
- ``operator``: everything (cancel, retry, pause, resume, reconcile, prune, forget a host).

Named tokens live in one TOML file (``PODCAST_JOB_API_TOKENS_FILE``, by default ``<data>/.viewer/api-tokens.toml``),
which holds each token's name, scope, creation time and SHA-256 digest: never a token. ``supervisor token add``
prints a new token once and stores its digest; a running server reads the file at start and on SIGHUP, and a file it
cannot read or parse keeps the tokens in force. The operator token (``PODCAST_JOB_API_TOKEN``/``_FILE``) acts as
the name ``operator``.

Once any token exists (the operator token is set, or the tokens file does), every route but the probes and the
heartbeat needs one. Before that, on a loopback address only, the API is open and its callers are ``anonymous``.
"""

from __future__ import annotations

import fcntl
import hmac
import os
import re
import secrets
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from ._config import ApiToken, Config
from ._errors import ConfigError
from ._model import from_iso, hash_token, to_iso

Scope = Literal["read", "enqueue", "operator"]
# In order: each scope includes those before it.
SCOPES: tuple[Scope, ...] = ("read", "enqueue", "operator")
# The names the supervisor itself writes in a row's enqueued_by/cancelled_by: no token may take one.
OPERATOR = "operator"  # the operator token (PODCAST_JOB_API_TOKEN)
ANONYMOUS = "anonymous"  # a caller of a server that has no token at all (loopback only)
SUPERVISOR = "supervisor"  # the supervisor itself (a kind's ``then`` follow-up)
RESERVED_NAMES = frozenset({OPERATOR, ANONYMOUS, SUPERVISOR})
NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
TOKEN_PREFIX = "pjs_"
_HEADER = (
    "# Named API tokens of this supervisor: digests only, never a token.\n"
    "# Changed by `supervisor token add|revoke`; a running supervisor applies it on SIGHUP.\n"
)


def _problem(text: str) -> ConfigError:
    return ConfigError([text])


def scope_allows(have: Scope, need: Scope) -> bool:
    """A token of scope ``have`` may call a route that needs ``need``."""
    return SCOPES.index(have) >= SCOPES.index(need)


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a token (None: it can)."""
    if not NAME_PATTERN.fullmatch(name):
        return "a token's name is 1-64 characters of letters, digits, '.', '_' or '-'"
    if name in RESERVED_NAMES:
        return f"{name!r} is the supervisor's own name for {_RESERVED_WHY[name]}; choose another"
    return None


_RESERVED_WHY = {
    OPERATOR: "the operator token",
    ANONYMOUS: "a caller without a token",
    SUPERVISOR: "itself",
}


def digest(token: str) -> str:
    """What the file keeps of a token: its SHA-256 (a token is 256 random bits, not a password: no slow hash)."""
    return hash_token(token)


@dataclass(frozen=True)
class NamedToken:
    """One entry of the tokens file."""

    name: str
    scope: Scope
    sha256: str
    created_at: datetime


@dataclass(frozen=True)
class Caller:
    """Who made a request: a token's name (or ``operator``, ``anonymous``) and its scope."""

    name: str
    scope: Scope


class TokenFile:
    """The tokens file: read by the server, changed by ``supervisor token`` (under a lock, written whole to a new file
    with mode 0600 and renamed over the old one, so that a reader never sees half of it). Blocking."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> dict[str, NamedToken]:
        """The tokens by name (none when the file does not exist); ``ConfigError`` naming the file and the problem."""
        try:
            with self.path.open("rb") as fh:
                data = tomllib.load(fh)
        except (FileNotFoundError, NotADirectoryError):
            return {}  # no file there (a data dir that is not a directory is the registry's to report)
        except OSError as exc:
            raise _problem(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise _problem(f"{self.path}: not valid TOML: {exc}") from None
        return _entries(self.path, data)

    def add(self, name: str, scope: str, now: datetime) -> str:
        """Add a token named ``name`` of ``scope``; return the token (the only time it exists in clear)."""
        problem = name_problem(name)
        if problem is not None:
            raise _problem(f"token name {name!r}: {problem}")
        if scope not in SCOPES:
            raise _problem(f"scope {scope!r} is not one of {', '.join(SCOPES)}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._locked():
            tokens = self.read()
            if name in tokens:
                raise _problem(f"a token named {name!r} exists already (revoke it first to replace it)")
            tokens[name] = NamedToken(name, scope, digest(token), now)
            self._write(tokens)
        return token

    def revoke(self, name: str) -> NamedToken:
        """Remove the token named ``name``; ``ConfigError`` if there is none."""
        with self._locked():
            tokens = self.read()
            if name not in tokens:
                known = ", ".join(sorted(tokens)) or "none"
                raise _problem(f"no token named {name!r} (tokens: {known})")
            gone = tokens.pop(name)
            self._write(tokens)
        return gone

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # Two `token add` at once must not both read, then one overwrite the other's token.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, tokens: Mapping[str, NamedToken]) -> None:
        lines = [_HEADER]
        for entry in sorted(tokens.values(), key=lambda t: t.name):
            lines.append(
                f'\n[tokens."{entry.name}"]\nscope = "{entry.scope}"\nsha256 = "{entry.sha256}"\n'
                f'created_at = "{to_iso(entry.created_at)}"\n'
            )
        tmp = self.path.with_name(f".{self.path.name}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as fh:
                fh.write("".join(lines))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _entries(path: Path, data: Mapping[str, object]) -> dict[str, NamedToken]:
    unknown = sorted(set(data) - {"tokens"})
    if unknown:
        raise _problem(f"{path}: unknown key {unknown[0]!r} (expected [tokens.NAME] tables)")
    table = data.get("tokens", {})
    if not isinstance(table, dict):
        raise _problem(f"{path}: tokens must be a table of [tokens.NAME]")
    out: dict[str, NamedToken] = {}
    for name, entry in table.items():
        where = f"{path}: token {name!r}"
        if not NAME_PATTERN.fullmatch(name) or name in RESERVED_NAMES:
            raise _problem(f"{where}: {name_problem(name)}")
        if not isinstance(entry, dict) or set(entry) != {"scope", "sha256", "created_at"}:
            raise _problem(f"{where}: must hold exactly scope, sha256 and created_at")
        scope, sha, created = entry["scope"], entry["sha256"], entry["created_at"]
        if scope not in SCOPES:
            raise _problem(f"{where}: scope {scope!r} is not one of {', '.join(SCOPES)}")
        if not isinstance(sha, str) or not _DIGEST.fullmatch(sha):
            raise _problem(f"{where}: sha256 must be 64 lowercase hex digits")
        try:
            created_at = from_iso(str(created))
        except ValueError:
            raise _problem(f"{where}: created_at {created!r} is not an ISO 8601 time") from None
        out[name] = NamedToken(name, scope, sha, created_at)
    return out


class Credentials:
    """The tokens the API takes now: the operator token (fixed, or re-read from its file) and the named tokens,
    re-read from their file on SIGHUP (``reload``). A reload that fails keeps what is in force: a broken edit must
    never open the API, nor lock its callers out."""

    def __init__(self, operator: ApiToken, tokens_file: TokenFile | None = None) -> None:
        self.operator = operator
        self.tokens_file = tokens_file
        self._by_digest: dict[str, NamedToken] = {}
        self._file_seen = False
        self.removed = False  # the last load found the file gone after it had existed

    @classmethod
    def from_config(cls, config: Config) -> Credentials:
        """The operator token and the tokens file ``config`` names (not read yet: ``load``)."""
        return cls(ApiToken.from_config(config), TokenFile(config.tokens_path))

    def load(self) -> int:
        """Read the tokens file (blocking); how many tokens it holds. ``ConfigError`` leaves the tokens as they were.
        A file removed since it was read holds none: every named token is revoked, and the API stays closed."""
        if self.tokens_file is None:
            return 0
        tokens = self.tokens_file.read()
        self._by_digest = {t.sha256: t for t in tokens.values()}
        exists = self.tokens_file.exists()
        self.removed = self._file_seen and not exists
        self._file_seen = self._file_seen or exists
        return len(tokens)

    @property
    def required(self) -> bool:
        """A token is needed: the operator token is set, or the tokens file has existed since this server started
        (even if emptied or removed since)."""
        return self.operator.current is not None or self._file_seen

    @property
    def named(self) -> int:
        return len(self._by_digest)

    def identify(self, token: str | None) -> Caller | None:
        """Who ``token`` is (None: no such token). Without any token configured, everyone is ``anonymous``."""
        if not self.required:
            return Caller(ANONYMOUS, "operator")
        if token is None:
            return None
        # Constant-time against the operator token; a named token is found by its digest (a lookup that cannot be
        # timed into a token without a SHA-256 preimage).
        operator = self.operator.current
        if operator is not None and hmac.compare_digest(token.encode(), operator.encode()):
            return Caller(OPERATOR, "operator")
        found = self._by_digest.get(digest(token))
        return Caller(found.name, found.scope) if found is not None else None
