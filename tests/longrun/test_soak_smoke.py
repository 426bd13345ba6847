"""tests/longrun/soak.py cannot rot: its verdict rule, its CSV round trip, and a short real run against
`supervisor serve`.

The hour-long soak itself is `make soak` (results in bench/results/, shown in docs/performance.md); here the script
runs for seconds and writes its results file into a temp dir, never into the repository.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import trio

REPO_ROOT = Path(__file__).resolve().parents[2]
SOAK = Path(__file__).resolve().parent / "soak.py"
sys.path.insert(0, str(SOAK.parent))

import soak  # type: ignore[import-not-found]  # noqa: E402


def samples(fds: list[int], *, conns: list[int] | None = None, step_s: float = 5.0) -> list[soak.Sample]:
    """Samples with ``fds`` descriptors besides the registry's, and ``conns`` SQLite connections (1 by default)."""
    conns = conns or [1] * len(fds)
    return [
        soak.Sample(
            elapsed_s=i * step_s,
            fds=n + 2 * c + 1,  # a connection holds the file and its WAL; the shared-memory index is one per process
            registry_fds=2 * c + 1,
            registry_conns=c,
            threads=3,
            rss_kib=50_000,
            cpu_s=0.0,
            registry_bytes=4096,
            wal_bytes=0,
            jobs=i,
            rounds=i,
        )
        for i, (n, c) in enumerate(zip(fds, conns, strict=True))
    ]


def test_flat_but_noisy_descriptors_pass() -> None:
    noisy = [14, 19, 15, 14, 17, 14, 15, 19, 14, 15, 14, 18, 15, 14, 16, 15]  # jobs come and go
    (fds, conns, total, threads, rss, registry, wal) = soak.judge(samples(noisy), warmup_s=0, slack=soak.Slack())
    assert (fds.metric, fds.first, fds.last, fds.ok) == ("other_fds", 14.5, 15, True)  # medians of 4, not the peaks
    assert conns.ok and threads.ok and rss.ok
    # The registry grows with its rows, and the total includes the pool's descriptors: reported, not judged.
    assert not registry.judged and not wal.judged and not total.judged


def test_a_leak_of_two_descriptors_per_idle_gap_fails() -> None:
    leaking = [13 + 2 * (i // 4) for i in range(40)]  # the issue-8 curve: +2 every fourth sample
    fds = soak.judge(samples(leaking), warmup_s=0, slack=soak.Slack())[0]
    assert fds.growth > soak.Slack().fds
    assert not fds.ok


def test_sqlite_connections_may_step_up_to_the_pool_size_but_not_past_it() -> None:
    flat = [14] * 40
    pool_filling = [1] * 10 + [2] * 10 + [4] * 20  # lazily opened, then kept: not a leak
    assert all(t.ok for t in soak.judge(samples(flat, conns=pool_filling), warmup_s=0, slack=soak.Slack()))
    leaking = [1 + i // 4 for i in range(40)]  # one more connection every idle gap (as before the pool)
    conns = soak.judge(samples(flat, conns=leaking), warmup_s=0, slack=soak.Slack())[1]
    assert (conns.metric, conns.high, conns.ok) == ("registry_conns", 10, False)


def test_growth_during_warm_up_is_ignored() -> None:
    settling = [8, 11, 14, 17] + [17] * 12  # the pool and the thread cache fill up, then stay
    assert soak.judge(samples(settling), warmup_s=0, slack=soak.Slack())[0].ok is False
    assert soak.judge(samples(settling), warmup_s=20, slack=soak.Slack())[0].ok is True


def test_too_few_samples_cannot_be_judged() -> None:
    with pytest.raises(ValueError, match="at least 8"):
        soak.judge(samples([14] * 10), warmup_s=15, slack=soak.Slack())


def test_a_leaking_csv_fails_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "leak.csv"
    with path.open("w", newline="") as fh:
        out = csv.DictWriter(fh, fieldnames=soak.CSV_FIELDS)
        out.writeheader()
        for s in samples([13 + 2 * (i // 4) for i in range(40)]):
            out.writerow(vars(s))
    assert soak.main(["--from-csv", str(path)]) == 1
    assert "soak: FAIL" in capsys.readouterr().out


@pytest.mark.e2e
async def test_a_short_real_soak_passes(tmp_path: Path) -> None:
    # 15 s gives a handful of samples per quarter, taken while jobs and listings come and go: the trend slacks are
    # opened wide so that this checks the machinery (the rule itself is tested above); the pool bound stays as is.
    samples_csv = tmp_path / "soak.csv"
    with trio.fail_after(90):
        done = await trio.run_process(
            [
                sys.executable,
                str(SOAK),
                "--duration-s",
                "15",
                "--sample-s",
                "1",
                "--idle-gaps-s",
                "1",
                "--fd-slack",
                "40",
                "--thread-slack",
                "40",
                "--rss-slack-mib",
                "64",
                "--csv",
                str(samples_csv),
                "--results-dir",
                str(tmp_path / "results"),
            ],
            cwd=tmp_path,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert "soak: PASS" in out and " 0 errors" in out
    rows = soak.read_csv(samples_csv)
    assert len(rows) >= 10
    assert all(r.fds > r.registry_fds > 0 and r.threads > 0 and r.rss_kib > 0 for r in rows)
    assert 1 <= max(r.registry_conns for r in rows) <= soak.Slack().max_connections
    assert rows[-1].jobs >= 4 and rows[-1].registry_bytes > 0  # a round ran and the registry was written
    # The raw results as a dated JSON file: the options, the verdict per metric, the samples.
    [written] = (tmp_path / "results").glob("*-soak.json")
    data = json.loads(written.read_text())
    assert data["kind"] == "soak" and data["verdict"] == "PASS" and data["args"]["duration_s"] == 15
    assert {t["metric"] for t in data["trends"]} >= {"other_fds", "registry_conns", "threads", "rss_mib"}
    assert data["machine"]["nproc"] and data["versions"]["trio"] and data["revision"]["commit"]
    assert len(data["samples"]["rows"]) == len(rows) and data["samples"]["columns"] == soak.CSV_FIELDS
