"""Reading a request: its bearer token, its JSON body and its query string, each refused with the error that names
what is wrong (415, 413, 400, or a 422 naming the field), and the wire shapes the core takes as typed values
(``parse_progress``: a heartbeat's body; ``parse_job``, ``parse_batch``: one job, a batch's jobs; ``parse_bulk``: a
bulk action)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from quart import g, request

from ..domain import (
    DEFAULT_LIST_LIMIT,
    IDEMPOTENCY_KEY_HEADER,
    MAX_BATCH,
    MAX_STAGE_LEN,
    MAX_UNITS,
    PARAM_PREFIX,
    BodyTooLarge,
    BulkRequest,
    InvalidHeader,
    JobFilter,
    JobRequest,
    KindCatalog,
    MalformedRequest,
    PageRequest,
    Progress,
    RequestKey,
    Schedule,
    UnsupportedMediaType,
    ValidationError,
)

# A job request is a kind and a few short params; anything near this size is a mistake or an attack.
MAX_BODY_BYTES = 64 * 1024
# A batch holds up to 1,000 job requests; the stack refuses anything larger before a route sees it.
MAX_BATCH_BODY_BYTES = 1024 * 1024


def parse_progress(body: object) -> Progress:
    """A heartbeat's body (``Heartbeat`` in the OpenAPI document) as a ``Progress``: unknown fields and out-of-range
    values are a 422 naming the field."""
    if not isinstance(body, Mapping):
        raise ValidationError("body must be a JSON object", field="body")
    unknown = sorted(set(body) - {"completed_units", "total_units", "stage"})
    if unknown:
        raise ValidationError(f"unknown field {unknown[0]!r}", field=unknown[0])
    completed = body.get("completed_units")
    if not _is_unit_count(completed):
        raise ValidationError(f"completed_units must be an integer from 0 to {MAX_UNITS}", field="completed_units")
    total = body.get("total_units")
    if total is not None and not _is_unit_count(total):
        raise ValidationError(f"total_units must be an integer from 0 to {MAX_UNITS}, or null", field="total_units")
    stage = body.get("stage")
    if stage is not None and (not isinstance(stage, str) or len(stage) > MAX_STAGE_LEN or not _is_utf8(stage)):
        raise ValidationError(f"stage must be a text of at most {MAX_STAGE_LEN} characters", field="stage")
    return Progress(completed, total, stage)


def parse_job(body: object, where: str = "") -> JobRequest:
    """One job's object (``EnqueueRequest``, an element of a batch): ``kind``, a string, and ``params``, an object
    or null, nothing else; anything else is a 422 naming the field (``kind``; ``jobs[3].params`` when ``where`` is
    ``jobs[3].``). Which kinds exist and what their params must be is the core's to check."""
    fields = envelope(body, allowed=("kind", "params"), required=("kind",), where=where)
    kind, params = fields["kind"], fields.get("params")
    if not isinstance(kind, str):
        raise ValidationError(f"{where}kind must be a kind's name (a string), not {kind!r}", field=f"{where}kind")
    if params is not None and not isinstance(params, dict):
        raise ValidationError(f"{where}params must be an object", field=f"{where}params")
    return JobRequest(kind, params)


def parse_bulk(body: object, kinds: KindCatalog | None = None) -> BulkRequest:
    """A bulk action's body (``BulkRequest``): its action, and a dry run's filter (the list's filters, as in its
    query; a param's value may be its JSON value too) or a selection; anything else is a 422 naming the field."""
    if not isinstance(body, Mapping):
        raise ValidationError("the body must be a JSON object", field="body")
    unknown = sorted(set(body) - {"action", "filter", "selection", "dry_run"})
    if unknown:
        raise ValidationError(f"unknown field {unknown[0]!r}", field=unknown[0])
    action, dry_run, selection = body.get("action"), body.get("dry_run", False), body.get("selection")
    if not isinstance(action, str):
        raise ValidationError("action must be a string", field="action")
    if not isinstance(dry_run, bool):
        raise ValidationError("dry_run must be true or false", field="dry_run")
    if selection is not None and not isinstance(selection, str):
        raise ValidationError("selection must be a string", field="selection")
    raw = body.get("filter")
    wanted: JobFilter | None = None
    if raw is not None:
        if not isinstance(raw, Mapping):
            raise ValidationError("filter must be an object of the list's filters", field="filter")
        texts: dict[str, str] = {}
        for name, value in raw.items():
            # A filter's value is its text, as in the list's query; a param's may be its JSON value too.
            if str(name).startswith(PARAM_PREFIX) and not isinstance(value, str):
                if not isinstance(value, bool | int | float):
                    raise ValidationError(f"filter.{name} must be a string or a number", field=f"filter.{name}")
                value = json.dumps(value)
            if not isinstance(value, str):
                raise ValidationError(f"filter.{name} must be a string", field=f"filter.{name}")
            texts[str(name)] = value
        try:
            wanted = JobFilter.parse(texts, kinds)
        except ValidationError as exc:
            field = f"filter.{exc.field}" if exc.field else "filter"
            raise ValidationError(f"filter: {exc}", field=field) from None
    return BulkRequest(action, wanted, selection, dry_run)


def parse_batch(body: object) -> list[JobRequest]:
    """A batch's body (``BatchRequest``): ``{"jobs": [...]}``, 1 to ``MAX_BATCH`` objects of ``kind`` and
    ``params``, as ``JobRequest``s (``parse_job``); anything else is a 422 naming the field (``jobs``,
    ``jobs[3].priority``)."""
    items = envelope(body, allowed=("jobs",), required=("jobs",))["jobs"]
    if not isinstance(items, list) or not items:
        raise ValidationError("jobs must be a non-empty list", field="jobs")
    if len(items) > MAX_BATCH:
        raise ValidationError(f"at most {MAX_BATCH} jobs in one batch, not {len(items)}", field="jobs")
    requests = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ValidationError(f"jobs[{index}] must be an object with kind and params", field=f"jobs[{index}]")
        requests.append(parse_job(dict(item), where=f"jobs[{index}]."))
    return requests


def _is_unit_count(value: object) -> TypeGuard[int]:
    """A heartbeat's unit count: a JSON integer (not a bool) from 0 to MAX_UNITS."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_UNITS


def _is_utf8(text: str) -> bool:
    """False for a lone surrogate: valid JSON ("\\ud800"), but no UTF-8 to store."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def bearer_token() -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def caller_name() -> str | None:
    """Who sent this request (a token's name, ``operator`` or ``anonymous``), as the app's authentication found."""
    caller = g.get("caller")
    return caller.name if caller is not None else None


def idempotency_key() -> RequestKey | None:
    """The request's ``Idempotency-Key`` (None: none sent); one that is empty, too long, not printable ASCII or sent
    twice is a 400 naming the header."""
    values = request.headers.getlist(IDEMPOTENCY_KEY_HEADER)
    if not values:
        return None
    if len(values) > 1:
        raise InvalidHeader(
            f"{IDEMPOTENCY_KEY_HEADER} given {len(values)} times; send it once", field=IDEMPOTENCY_KEY_HEADER
        )
    return RequestKey.parse(values[0])


async def json_body(max_bytes: int = MAX_BODY_BYTES) -> Any:
    """The request body parsed as JSON; raises the 415/413/400 errors. Its shape is the caller's to check."""
    _check_json_head(request.mimetype, request.content_length, max_bytes)
    raw = await request.get_data(cache=False, as_text=False)
    assert isinstance(raw, bytes)
    if len(raw) > max_bytes:  # a chunked body announces no length
        raise BodyTooLarge(f"the body is larger than {max_bytes} bytes")
    return _parse_json(raw)


def _check_json_head(mimetype: str, content_length: int | None, max_bytes: int) -> None:
    """What the head of a request with a JSON body must say: the 415 and (for an announced length) 413 errors."""
    if mimetype != "application/json":
        # A JSON content type cannot be sent cross-origin without a CORS preflight this server never answers,
        # so a web page cannot post to a loopback supervisor that runs without a token.
        raise UnsupportedMediaType(f"the body must be application/json, not {mimetype or 'unset'!r}")
    if content_length is not None and content_length > max_bytes:
        raise BodyTooLarge(f"the body is larger than {max_bytes} bytes")


def _parse_json(raw: bytes) -> Any:
    """A body's bytes parsed as JSON (no NaN/Infinity); raises the 400 naming ``body``."""
    try:
        # json.loads(raw, parse_constant=...) step by step, with one decoder instead of a new one per call.
        return _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"the body is not valid JSON: {exc}", field="body") from None
    except RecursionError:
        # json's decoder recurses per nesting level: a body of a thousand '[' exhausts the stack.
        raise MalformedRequest("the body is nested too deeply", field="body") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def envelope(body: Any, allowed: Iterable[str], required: Iterable[str] = (), where: str = "") -> dict[str, Any]:
    """A parsed body that must be a JSON object with only ``allowed`` keys and every ``required`` one; raises the
    422 naming the field (after ``where``, the object's own place: ``jobs[3].``)."""
    if not isinstance(body, dict):
        raise ValidationError("the body must be a JSON object", field="body")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        said = f"{where[:-1]}: " if where else ""
        raise ValidationError(f"{said}unknown field {unknown[0]!r}", field=f"{where}{unknown[0]}")
    for name in required:
        if name not in body:
            said = f"{where[:-1]}: " if where else ""
            raise ValidationError(f"{said}missing field {name!r}", field=f"{where}{name}")
    return body


def query(allowed: Iterable[str]) -> dict[str, str]:
    """The query string as single values; an unknown or repeated name is a 422 naming it (typos never pass)."""
    out: dict[str, str] = {}
    for name in request.args:
        values = request.args.getlist(name)
        if name not in allowed:
            raise ValidationError(f"unknown query parameter {name!r}", field=name)
        if len(values) != 1:
            raise ValidationError(f"query parameter {name!r} given {len(values)} times", field=name)
        out[name] = values[0]
    return out


def int_query(query: Mapping[str, str], name: str, default: int | None) -> int | None:
    if name not in query:
        return default
    text = query[name]
    # ASCII digits only: re's \d (and int()) also take other scripts' digits and underscores.
    if not re.fullmatch(r"[0-9]{1,12}", text):
        raise ValidationError(f"{name} must be a non-negative integer, not {query[name]!r}", field=name)
    return int(text)


def parse_page(given: Mapping[str, str], kinds: KindCatalog | None = None) -> PageRequest:
    """The job list's query (the filter's names and ``param.NAME``, limit, cursor) as a page request; a 422 names
    the field. ``kinds``: what a ``param.NAME``'s value is compared as."""
    limit = int_query(given, "limit", DEFAULT_LIST_LIMIT)
    assert limit is not None
    filters = {name: text for name, text in given.items() if name not in ("limit", "cursor")}
    return PageRequest.parse(limit=limit, cursor=given.get("cursor"), kinds=kinds, **filters)


def parse_schedule(text: str | None) -> Schedule | None:
    """An enqueue's ``?schedule=NAME/PERIOD_S[/if_idle]`` as a ``Schedule``; None without one."""
    return Schedule.parse(text) if text is not None else None


def query_with_params(allowed: Iterable[str]) -> dict[str, str]:
    """``query``, where any ``param.NAME`` is allowed too (a filter on a declared param)."""
    names = [*allowed, *(name for name in request.args if name.startswith(PARAM_PREFIX))]
    return query(names)


def bool_query(name: str, *, default: bool) -> bool:
    text = request.args.get(name)
    if text is None:
        return default
    if text not in ("true", "false"):
        raise ValidationError(f"{name} must be true or false, not {text!r}", field=name)
    return text == "true"
