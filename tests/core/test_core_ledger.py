"""The core's one shared mutable state (``JobLedger``) and its wiring in one place (ADR 0015 §5).

The ledger's verbs are what INV-RUNNING-MEANS-SPAWNED-OR-SPAWNING rests on: a promotion under way is seen by a read
that overlaps it, a held start is ``being_started`` until it is handed or released, and a monitor's release never
drops a later adoption's entry. The wiring check reads the code: nothing is wired by assigning to another object's
attribute after it was built.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from supervisor.core import JobLedger
from supervisor.execution import JobHandle

ROOT = Path(__file__).resolve().parents[2]


class Handle:
    """A stand-in for an executor's handle: the ledger only keeps it."""


def handle() -> JobHandle:
    return Handle()  # type: ignore[return-value]


def test_INV_RUNNING_MEANS_SPAWNED_OR_SPAWNING_a_read_overlapping_a_promotion_sees_it() -> None:
    ledger = JobLedger()
    before = ledger.promotion_mark()
    with ledger.promoting():
        assert ledger.promotion_under_way()
        during = ledger.promotion_mark()
    after = ledger.promotion_mark()
    assert not ledger.promotion_under_way()
    assert during[0] > 0  # a read that began during it knows
    assert after[1] != before[1]  # a read that began before it and ended after it knows too
    with pytest.raises(RuntimeError), ledger.promoting():
        raise RuntimeError("a promotion cut short")
    assert not ledger.promotion_under_way()  # however it ends


def test_a_held_start_is_being_started_until_handed_or_released() -> None:
    ledger = JobLedger()
    ledger.hold(["a", "b"])
    assert ledger.being_started("a") and ledger.being_started("b") and "a" in ledger
    entry = ledger.handed("a", handle())
    assert not ledger.being_started("a") and ledger.entry("a") is entry and entry.handle is not None
    ledger.release("b")
    assert not ledger.being_started("b") and "b" not in ledger
    assert ledger.job_ids() == {"a"} and len(ledger) == 1


def test_a_monitor_releasing_its_entry_never_drops_a_later_adoption_of_the_job() -> None:
    ledger = JobLedger()
    first = ledger.adopt("j", handle())
    assert first is not None
    assert ledger.adopt("j", handle()) is None  # watched already: that entry stays the authority
    ledger.release("j", first)
    second = ledger.adopt("j", handle())
    assert second is not None
    ledger.release("j", first)  # the first monitor, late: not its entry any more
    assert ledger.entry("j") is second


def test_a_stall_stop_is_marked_once_and_done_once() -> None:
    ledger = JobLedger()
    assert ledger.stop_for("j", "stall")
    assert not ledger.stop_for("j", "deadline")  # the first reason stands
    assert ledger.stopping_for("j") == "stall"
    ledger.stop_done("j")
    assert ledger.stopping_for("j") is None


def _late_wiring(path: Path, base: Path = ROOT) -> list[str]:
    """``x.y.z = ...`` (an attribute of an attribute assigned): wiring after construction."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute):
                found.append(f"{path.relative_to(base)}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_the_boot_is_put_together_in_constructors_only() -> None:
    """``Supervisor.__init__`` and the root build every part with what it uses: no attribute of a part is assigned
    after it was made (``boot.may_promote = ...`` was)."""
    places = [ROOT / "supervisor" / "core" / "_supervisor.py", ROOT / "supervisor" / "_root.py"]
    assert [line for place in places for line in _late_wiring(place)] == []


def test_the_wiring_check_sees_a_late_assignment(tmp_path: Path) -> None:
    """The check can fail."""
    fake = tmp_path / "_supervisor.py"
    fake.write_text("class S:\n    def __init__(self, boot):\n        self.boot = boot\n        self.boot.x = 1\n")
    assert _late_wiring(fake, tmp_path) == ["_supervisor.py:4: self.boot.x"]
