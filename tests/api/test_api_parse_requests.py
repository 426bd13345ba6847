"""Wire shapes become domain values at the edge (``api/_parse.py``): a job's kind is a string and its params an
object before the core sees them (``JobRequest``), and a bulk action's body is read there too, so that nothing in
``domain/`` reads a request's JSON."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from supervisor.api import parse_batch, parse_bulk, parse_job
from supervisor.domain import BulkRequest, JobFilter, JobRequest, ValidationError

DOMAIN = Path(__file__).resolve().parents[2] / "supervisor" / "domain"


def test_a_job_request_is_a_kind_name_and_an_object_of_params() -> None:
    assert parse_job({"kind": "sleep", "params": {"seconds": 1}}) == JobRequest("sleep", {"seconds": 1})
    assert parse_job({"kind": "fail"}) == JobRequest("fail", None)
    assert parse_job({"kind": "fail", "params": None}) == JobRequest("fail", None)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": 7}, "kind"),
        ({"kind": None}, "kind"),
        ({"kind": ["sleep"]}, "kind"),
        ({"kind": "sleep", "params": [1]}, "params"),
        ({"kind": "sleep", "params": "seconds=1"}, "params"),
        ({"params": {}}, "kind"),
        ({"kind": "sleep", "priority": 1}, "priority"),
        ([], "body"),
    ],
)
def test_a_job_request_of_another_shape_is_refused_at_the_edge_naming_the_field(body: object, field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_job(body)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("job", "field", "said"),
    [
        ({"kind": 7}, "jobs[1].kind", "jobs[1].kind must be a kind's name"),
        ({"kind": "sleep", "params": [1]}, "jobs[1].params", "jobs[1].params must be an object"),
        ({"kind": "sleep", "when": 1}, "jobs[1].when", "jobs[1]: unknown field 'when'"),
        ({"params": {}}, "jobs[1].kind", "jobs[1]: missing field 'kind'"),
        ("sleep", "jobs[1]", "jobs[1] must be an object"),
    ],
)
def test_a_batch_names_the_element_and_the_field_it_refuses(job: object, field: str, said: str) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_batch({"jobs": [{"kind": "sleep"}, job]})
    assert (refused.value.field, str(refused.value)[: len(said)]) == (field, said)


def test_a_batch_is_its_job_requests_in_order() -> None:
    body = {"jobs": [{"kind": "a"}, {"kind": "b", "params": {"n": 2}}]}
    assert parse_batch(body) == [JobRequest("a"), JobRequest("b", {"n": 2})]


def test_a_bulk_action_is_read_at_the_edge() -> None:
    dry = parse_bulk({"action": "retry", "dry_run": True, "filter": {"status": "failed", "param.n": 2}})
    assert dry == BulkRequest("retry", JobFilter.parse({"status": "failed", "param.n": "2"}), None, True)
    assert parse_bulk({"action": "cancel", "selection": "a" * 32}) == BulkRequest("cancel", selection="a" * 32)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": 1, "selection": "a" * 32}, "action"),
        ({"action": "retry", "dry_run": "yes", "filter": {}}, "dry_run"),
        ({"action": "retry", "selection": 5}, "selection"),
        ({"action": "retry", "dry_run": True, "filter": []}, "filter"),
        ({"action": "retry", "dry_run": True, "filter": {"param.n": [1]}}, "filter.param.n"),
        ({"action": "retry", "dry_run": True, "filter": {"status": "lost"}}, "filter.status"),
        ({"action": "retry", "selection": "a" * 32, "why": "x"}, "why"),
        ("retry", "body"),
    ],
)
def test_a_bulk_action_of_another_shape_is_refused_naming_the_field(body: object, field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_bulk(body)
    assert refused.value.field == field


def json_reads(source: str) -> list[str]:
    """Each ``json.loads`` / ``json.load`` call in ``source``: a read of JSON text."""
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)]
    return [
        ast.unparse(call.func)
        for call in calls
        if isinstance(call.func, ast.Attribute)
        and call.func.attr in ("loads", "load")
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "json"
    ]


def test_nothing_in_the_domain_reads_json() -> None:
    """The domain takes values; reading a body (or a stored text) is the edge's, or the part that stores it."""
    assert {path.name: json_reads(path.read_text()) for path in DOMAIN.glob("*.py")} == {
        path.name: [] for path in DOMAIN.glob("*.py")
    }
    assert json_reads("import json\njson.loads(text)\nother.loads(x)\n") == ["json.loads"]  # the rule can fail
