"""deploy/'s systemd units pass ``systemd-analyze verify`` (their ExecStart pointed at this venv's supervisor, as an
install at /opt/podcast would have it), and the feed's timer and service agree on what makes a run safe."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
INSTALLED = "/opt/podcast/.venv/bin/supervisor"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    here = str(Path(sys.executable).parent / "supervisor")
    units = {
        "podcast-supervisor.service": "podcast-supervisor.service",
        "podcast-feed@.service": "podcast-feed@example.service",
        "podcast-feed@.timer": "podcast-feed@example.timer",
    }
    if shutil.which("vmalert") == "/usr/bin/vmalert":  # Debian's victoria-metrics package (the unit names it)
        units["alerting/podcast-vmalert.service"] = "podcast-vmalert.service"
    for source, name in units.items():
        (tmp_path / name).write_text((DEPLOY / source).read_text().replace(INSTALLED, here))
    done = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / name) for name in units.values())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_feeds_timer_catches_up_and_its_service_keys_the_tick_and_skips_while_busy() -> None:
    timer = (DEPLOY / "podcast-feed@.timer").read_text()
    service = (DEPLOY / "podcast-feed@.service").read_text()
    assert "Persistent=true" in timer and "RandomizedDelaySec=" in timer and "OnCalendar=hourly" in timer
    assert "--schedule %i --every 1h --if-idle" in service  # the timer's period, one job per tick
