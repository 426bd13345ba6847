"""The fleet chaos run's own judges (bench/chaos.py, issue 27) can fail: two leaders close together, and a lead taken
before the previous holder's lease ran out, are each reported; a handover the design allows is not.

The run itself (tests/core/test_core_chaos_smoke.py) passes when the supervisor is right, so these show that its
INV-ONE-LEADER checks would see the bug if there were one.
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType

from supervisor.registry import Host

CHAOS = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"
T0 = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)


def load_chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_chaos", CHAOS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_chaos", module)
    spec.loader.exec_module(module)
    return module


chaos = load_chaos()


def test_INV_ONE_LEADER_two_boots_saying_they_lead_within_the_margin_are_two_leaders() -> None:
    claims = [
        chaos.Claim("h1", "boot-a", sent=10.0, answered=10.05),
        chaos.Claim("h1", "boot-a", sent=10.1, answered=10.15),  # the same boot again: one leader
        chaos.Claim("h2", "boot-b", sent=10.2, answered=10.3),  # 0.3 s after h1 said so: the margin is 0.6 s
    ]
    found = chaos.overlapping_claims(claims, 0.6)
    assert len(found) == 2 and all("h1" in f and "h2" in f for f in found)  # each of h1's answers with h2's
    # A new boot of the same host is another leader too.
    assert chaos.overlapping_claims([claims[0], chaos.Claim("h1", "boot-c", 10.2, 10.3)], 0.6)


def test_INV_ONE_LEADER_a_handover_after_the_margin_is_not_two_leaders() -> None:
    claims = [chaos.Claim("h1", "boot-a", 10.0, 10.05), chaos.Claim("h2", "boot-b", 10.7, 10.75)]
    assert chaos.overlapping_claims(claims, 0.6) == []


def host(host_id: str, boot_id: str, since_s: float, expires_s: float) -> Host:
    since, expires = T0 + timedelta(seconds=since_s), T0 + timedelta(seconds=expires_s)
    return Host(host_id, boot_id, since, since, expires, as_of=since)


def test_INV_ONE_LEADER_a_lead_taken_before_the_holders_lease_ran_out_is_reported() -> None:
    early = [host("h1", "boot-a", 0, 3), host("h2", "boot-b", 2.5, 5.5)]
    [found] = chaos.leader_handovers(early)
    assert found.startswith("h2 (boot boot-b)")
    in_time = [host("h1", "boot-a", 0, 3), host("h2", "boot-b", 3.2, 6.2), host("h1", "boot-c", 6.5, 9.5)]
    assert chaos.leader_handovers(in_time) == []
