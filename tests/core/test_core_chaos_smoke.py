"""The chaos run in miniature (bench/chaos.py --smoke): real supervisors SIGKILLed and restarted while jobs run.

The full run is `make chaos`; this keeps the script from rotting and checks its five promises on a small scale:
nothing lost, nothing run twice, never more than the slots at once, every exit 0 recorded as success, and every job
recorded as never started never ran (INV-IDENTITY-BEFORE-PROGRAM). Its results file goes to a temp dir.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHAOS = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


@pytest.mark.e2e
def test_chaos_smoke_keeps_every_promise(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(CHAOS), "--smoke", "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASS") == 5 and "FAIL" not in done.stdout
    # The raw results as a dated JSON file: every check's verdict, the outcomes, the machine.
    [written] = tmp_path.glob("*-chaos.json")
    data = json.loads(written.read_text())
    assert data["kind"] == "chaos" and data["verdict"] == "PASS" and data["args"]["jobs"] == 12
    assert [c["verdict"] for c in data["checks"]] == ["PASS"] * 5
    assert sum(o["count"] for o in data["outcomes"]) == 12 and data["machine"]["nproc"]
