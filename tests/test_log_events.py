"""The log events are declared once (``supervisor/observe/_log_events.py``) and held to the code read statically
(``tools/log_scan.py``: an AST walk over ``supervisor/``): every event the code emits is declared, with the levels
and fields its call sites give it, and every declared event is emitted. ``docs/log-events.md`` shows the
declaration. Each check is shown to fail on a module that breaks it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.observe import LOG_EVENTS, EventName, log_events_table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import doc_tables  # noqa: E402 - tools/ is not a package
import log_scan  # noqa: E402

DECLARED = {event.name: event for event in LOG_EVENTS}
# The event bus's lines (``observe.log_event``) are named at run time from ``EventName``: `job.stalled` is written
# `job_stalled`, and a transition is `job_transition`.
BUS = {"job_transition" if e is EventName.TRANSITION else str(e).replace(".", "_") for e in EventName}


@pytest.fixture(scope="module")
def scan() -> log_scan.Scan:
    return log_scan.scan()


def test_every_call_site_names_its_event_readably(scan: log_scan.Scan) -> None:
    unreadable = "log calls whose event name the scan cannot read: use a constant (or teach tools/log_scan.py)"
    assert scan.unreadable == [], unreadable
    assert [site.split(":")[0] for site in scan.dynamic] == ["supervisor/observe/_events.py"] * len(scan.dynamic)


def test_every_emitted_event_is_declared_and_every_declared_one_is_emitted(scan: log_scan.Scan) -> None:
    emitted = set(scan.by_name()) | BUS
    undeclared = sorted(emitted - set(DECLARED))
    unused = sorted(set(DECLARED) - emitted)
    where = {name: scan.by_name()[name][0].site for name in undeclared if name in scan.by_name()}
    assert undeclared == [], f"emitted but not in supervisor/observe/_log_events.py: {where or undeclared}"
    assert unused == [], f"declared in supervisor/observe/_log_events.py but emitted nowhere: {unused}"


def test_the_catalogue_is_one_sorted_list_with_known_levels() -> None:
    names = [event.name for event in LOG_EVENTS]
    assert names == sorted(set(names)), "one entry per event, in alphabetical order"
    for event in LOG_EVENTS:
        assert event.levels <= set(log_scan.LEVELS.values()), event.name
        assert event.means.strip() and event.action.strip(), event.name


def test_each_event_is_declared_at_the_levels_and_with_the_fields_its_call_sites_give(scan: log_scan.Scan) -> None:
    wrong = []
    for name, emissions in scan.by_name().items():
        event = DECLARED.get(name)
        if event is None:
            continue  # the test above names it
        levels = set().union(*(e.levels for e in emissions))
        fields = set().union(*(e.fields for e in emissions))
        if levels != event.levels:
            wrong.append(f"{name}: written at {sorted(levels)}, declared {event.level}")
        if not fields <= event.field_names:
            wrong.append(f"{name}: fields {sorted(fields - event.field_names)} not declared")
        if not any(e.spread for e in emissions) and event.field_names - fields:
            wrong.append(f"{name}: declared fields {sorted(event.field_names - fields)} written nowhere")
    assert wrong == []


def test_every_line_about_a_job_names_it(scan: log_scan.Scan) -> None:
    """A declared ``job_id`` (or ``job_ids``) is on every line of that event: a call site that leaves it out fails
    (one that passes a mapping it cannot see is given the benefit of the doubt)."""
    missing = [
        f"{e.name} at {e.site}"
        for e in scan.emissions
        for key in ("job_id", "job_ids")
        if e.name in DECLARED and key in DECLARED[e.name].field_names and key not in e.fields and not e.spread
    ]
    assert missing == []
    about_jobs = {"job_id", "job_ids", "oldest_job_id", "newest_job_id"}
    for event in LOG_EVENTS:
        if event.name.startswith("job_") and event.name not in ("jobs_pruned",):
            assert event.field_names & about_jobs, f"{event.name} is about a job and names none"


def test_the_reference_page_shows_the_catalogue() -> None:
    page = doc_tables.LOG_EVENTS.page.read_text()
    stale = "docs/log-events.md is stale: run .venv/bin/python tools/doc_tables.py"
    assert doc_tables.LOG_EVENTS.rendered(page) == page, stale
    for event in LOG_EVENTS:
        assert f"`{event.name}`" in log_events_table()


def test_the_scan_finds_each_kind_of_call_site_and_fails_closed(tmp_path: Path) -> None:
    (tmp_path / "supervisor").mkdir()
    (tmp_path / "supervisor" / "m.py").write_text(
        textwrap.dedent("""
        log = get_logger()

        def fail(event, **fields):
            log.exception(event, **fields)

        class Outage:
            def __init__(self, event, **fields):
                self._event = event
            def failed(self):
                log.debug(self._event, error="e")

        def f(c, name):
            log.info("plain", job_id=1)
            (log.debug if c else log.warning)("either", why="w")
            what = "a" if c else "b"
            log.warning(f"{what}_stopped", job_id=2)
            fail("forwarded", job_id=3)
            Outage("kept", job_id=4)
            log.error(name.upper())
            level = log.info
            print({"event": "by_hand", "level": "warning", "dropped": 1})
    """)
    )
    found = log_scan.scan(tmp_path)
    by_name = {name: (sorted(set().union(*(e.levels for e in ems))), sorted(set().union(*(e.fields for e in ems))))
               for name, ems in found.by_name().items()}  # fmt: skip
    assert by_name == {
        "plain": (["info"], ["job_id"]),
        "either": (["debug", "warning"], ["why"]),
        "a_stopped": (["warning"], ["job_id"]),
        "b_stopped": (["warning"], ["job_id"]),
        "forwarded": (["error"], ["job_id"]),
        "kept": (["debug"], ["error", "job_id"]),
        "by_hand": (["warning"], ["dropped"]),
    }
    assert sorted(site.split(":")[1] for site in found.unreadable) == ["20", "21"]  # name.upper(); a level kept aside
