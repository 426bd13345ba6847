"""A page request is made at the edge from the wire's text and cannot be built out of bounds."""

from __future__ import annotations

import pytest

from supervisor.domain import MAX_LIST_LIMIT, JobStatus, PageRequest, ValidationError


def test_the_wire_text_becomes_typed_values() -> None:
    page = PageRequest.parse(status="queued", kind="pipeline", limit=5, cursor="42", idempotency_key="k")
    assert page == PageRequest(JobStatus.QUEUED, "pipeline", 5, 42, "k")


@pytest.mark.parametrize(
    ("built", "field"),
    [
        (lambda: PageRequest(limit=0), "limit"),
        (lambda: PageRequest(limit=MAX_LIST_LIMIT + 1), "limit"),
        (lambda: PageRequest(before=-1), "cursor"),
        (lambda: PageRequest(before=10**18), "cursor"),
        (lambda: PageRequest(idempotency_key=""), "idempotency_key"),
        (lambda: PageRequest.parse(status="QUEUED"), "status"),
        (lambda: PageRequest.parse(cursor="1_0"), "cursor"),
    ],
)
def test_out_of_bounds_is_a_validation_error_naming_the_field(built: object, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        built()  # type: ignore[operator]
    assert err.value.field == field
