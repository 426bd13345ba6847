"""Settings: validated value objects; the job budget's ADR-150 D1 rules; precedence flag > env > file > default."""

from __future__ import annotations

import logging
from decimal import Decimal
from pathlib import Path

import pytest

from pipeline_runner import (
    DEFAULT_PROCESSING_LOOP_BUDGET_S,
    FEED_URL_MAX_LENGTH,
    MAX_EPISODES,
    ConfigError,
    RunnerConfig,
    TransportTimeouts,
    resolve_processing_loop_budget_s,
)
from pipeline_runner._cli import _parser, build_config


def test_default_is_four_hours() -> None:
    assert resolve_processing_loop_budget_s(flag=None, env=None) == 4 * 3600.0 == DEFAULT_PROCESSING_LOOP_BUDGET_S


@pytest.mark.parametrize(
    ("flag", "env", "file_value", "file_has_key", "expected"),
    [
        ("60", "120", 180, True, 60.0),
        (None, "120", 180, True, 120.0),
        (None, None, 180, True, 180.0),
        (None, None, 1.5, True, 1.5),
        (None, " 90 ", None, False, 90.0),
    ],
)
def test_precedence_flag_env_file_default(
    flag: str | None, env: str | None, file_value: object, file_has_key: bool, expected: float
) -> None:
    assert (
        resolve_processing_loop_budget_s(flag=flag, env=env, file_value=file_value, file_has_key=file_has_key)
        == expected
    )


@pytest.mark.parametrize(("flag", "env", "file_value"), [("0", None, None), (None, "-1", None), (None, None, 0)])
def test_explicit_non_positive_disables(flag: str | None, env: str | None, file_value: object) -> None:
    """ADR-150 D1: disabled only by an explicit <= 0."""
    assert (
        resolve_processing_loop_budget_s(flag=flag, env=env, file_value=file_value, file_has_key=file_value is not None)
        is None
    )


@pytest.mark.parametrize("raw", ["4h", "", "nan", "inf", "-inf", "1e999", "0x10", True, [1], None])
def test_malformed_falls_back_to_default_with_warning(raw: object, caplog: pytest.LogCaptureFixture) -> None:
    """ADR-150 D1: a malformed value falls back to the default, never to unbounded."""
    with caplog.at_level(logging.WARNING):
        got = resolve_processing_loop_budget_s(flag=None, env="60", file_value=raw, file_has_key=True)
        assert got == 60.0  # env wins over a malformed file value: the file is not the winning layer
        got = resolve_processing_loop_budget_s(flag=None, env=None, file_value=raw, file_has_key=True)
    assert got == DEFAULT_PROCESSING_LOOP_BUDGET_S
    assert any("malformed processing loop budget" in r.message for r in caplog.records)


def test_malformed_flag_does_not_fall_through_to_env_disable(caplog: pytest.LogCaptureFixture) -> None:
    assert resolve_processing_loop_budget_s(flag="4 hours", env="0") == DEFAULT_PROCESSING_LOOP_BUDGET_S


def build(args: list[str], env: dict[str, str]) -> RunnerConfig:
    return build_config(_parser().parse_args(args), env)


def test_budget_reachable_from_flag_env_and_file(tmp_path: Path) -> None:
    cfg_file = tmp_path / "r.toml"
    cfg_file.write_text("processing_loop_budget_seconds = 300\nworkers = 7\nread_timeout_seconds = 0.3\n")
    base = ["run", "--feed", "http://f", "--data-dir", str(tmp_path), "--job-id", "j"]
    env = {"PODCAST_PROCESSING_LOOP_BUDGET_SECONDS": "200"}
    assert build([*base, "--config", str(cfg_file)], {}).processing_loop_budget_s == 300.0
    assert build([*base, "--config", str(cfg_file)], env).processing_loop_budget_s == 200.0
    cfg = build([*base, "--config", str(cfg_file), "--processing-loop-budget-seconds", "100"], env)
    assert cfg.processing_loop_budget_s == 100.0
    assert cfg.workers == 7 and cfg.transport.read_s == 0.3
    assert build([*base, "--workers", "2", "--config", str(cfg_file)], {}).workers == 2


def test_contract_environment(tmp_path: Path) -> None:
    env = {
        "PODCAST_JOB_DATA_DIR": str(tmp_path),
        "PODCAST_JOB_ID": "job-42",
        "PODCAST_JOB_TOKEN": "secret",
        "PODCAST_JOB_HEARTBEAT_URL": "http://127.0.0.1:1/api/jobs/job-42/heartbeat",
    }
    cfg = build(["run", "--feed", "http://f", "--max-episodes", "3"], env)
    assert (cfg.data_dir, cfg.job_id, cfg.max_episodes) == (tmp_path, "job-42", 3)
    assert cfg.heartbeat.url == env["PODCAST_JOB_HEARTBEAT_URL"] and cfg.heartbeat.token == "secret"
    assert cfg.cost_cap_usd == Decimal("10.00")
    assert build(["enrich"], env).corpus_dir == tmp_path / "corpus"


@pytest.mark.parametrize(
    "args",
    [
        ["--workers", "0"],
        ["--workers", "two"],
        ["--cost-cap-usd", "NaN"],
        ["--cost-cap-usd", "-1"],
        ["--episode-budget-seconds", "0"],
        ["--read-timeout-seconds", "inf"],
        ["--transcribe-url", "file:///etc/passwd"],
        ["--job-id", "../escape"],
        ["--max-episodes", "-1"],
        ["--max-episodes", "all"],
    ],
)
def test_invalid_settings_are_config_errors(args: list[str], tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        build(["run", "--feed", "http://f", "--data-dir", str(tmp_path), *args], {})


def test_config_file_unknown_key_and_bad_toml(tmp_path: Path) -> None:
    for text in ("worker = 3\n", "workers = \n"):
        (tmp_path / "c.toml").write_text(text)
        with pytest.raises(ConfigError):
            build(["run", "--feed", "http://f", "--config", str(tmp_path / "c.toml")], {})


def test_value_objects_reject_nonsense() -> None:
    with pytest.raises(ConfigError):
        TransportTimeouts(read_s=float("nan"))
    with pytest.raises(ConfigError):
        RunnerConfig(data_dir=Path("/x"), job_id="j", processing_loop_budget_s=-5.0)
    timeout = TransportTimeouts(connect_s=1, read_s=2, write_s=3, pool_s=4).as_httpx()
    assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (1, 2, 3, 4)


def test_max_episodes_zero_means_all(tmp_path: Path) -> None:
    """`--max-episodes 0` asks for every episode (the supervisor's `pipeline` kind passes it by default)."""
    base = ["run", "--feed", "http://f", "--data-dir", str(tmp_path), "--job-id", "j"]
    assert build([*base, "--max-episodes", "0"], {}).max_episodes is None
    assert build(base, {}).max_episodes is None
    assert build([*base, "--max-episodes", "1"], {}).max_episodes == 1
    (tmp_path / "c.toml").write_text("max_episodes = 0\n")
    assert build([*base, "--config", str(tmp_path / "c.toml")], {}).max_episodes is None
    with pytest.raises(ConfigError, match=r"max_episodes must be 0 \(all episodes\) to 1000000, got -1"):
        RunnerConfig(data_dir=tmp_path, job_id="j", max_episodes=-1)
    assert RunnerConfig(data_dir=tmp_path, job_id="j", max_episodes=MAX_EPISODES).max_episodes == MAX_EPISODES
    with pytest.raises(ConfigError, match="got 1000001"):
        RunnerConfig(data_dir=tmp_path, job_id="j", max_episodes=MAX_EPISODES + 1)


@pytest.mark.parametrize("feed", ["notaurl", "ftp://example.org/f", "http://", "http:///path", "https://[::1"])
def test_a_feed_that_is_not_an_http_url_with_a_host_is_a_usage_error(tmp_path: Path, feed: str) -> None:
    with pytest.raises(ConfigError, match="not an http\\(s\\) URL with a host"):
        RunnerConfig(data_dir=tmp_path, job_id="j", feeds=(feed,))
    with pytest.raises(ConfigError, match="longer than 2048"):
        RunnerConfig(data_dir=tmp_path, job_id="j", feeds=("https://e.org/" + "a" * (FEED_URL_MAX_LENGTH - 13),))
    assert RunnerConfig(data_dir=tmp_path, job_id="j", feeds=("HTTPS://e.org/f",)).feeds == ("HTTPS://e.org/f",)
