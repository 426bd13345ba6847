"""`supervisor check-config`: prints the effective configuration, or names every invalid setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor", *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    import os

    base = {k: v for k, v in os.environ.items() if not k.startswith(("PODCAST_", "PODCAST_PIPELINE"))}
    base["PODCAST_JOB_DATA_DIR"] = str(tmp_path)
    return base


def test_prints_the_effective_configuration(env: dict[str, str]) -> None:
    env["PODCAST_JOB_MAX_CONCURRENT"] = "4"
    env["PODCAST_JOB_API_TOKEN"] = "hunter2"
    done = _run("check-config", "--json", env=env)
    assert done.returncode == 0, done.stderr
    effective = json.loads(done.stdout)
    assert effective["max_concurrent"] == 4
    assert effective["kinds"] == ["enrichment", "pipeline"]
    assert effective["api_token"] == "(set)"
    assert "hunter2" not in done.stdout + done.stderr
    assert effective["run_dir"] == "auto"
    assert effective["run_dir_path"].startswith(f"/dev/shm/podcast-supervisor-{os.geteuid()}/")


def test_a_fallback_is_a_warning_naming_the_variable_and_still_exits_0(env: dict[str, str]) -> None:
    env["PODCAST_JOB_SWEEP_SECONDS"] = "often"
    done = _run("check-config", env=env)
    assert done.returncode == 0
    assert "PODCAST_JOB_SWEEP_SECONDS" in done.stderr
    assert "sweep_interval_s" in done.stdout and "30.0" in done.stdout


def test_invalid_settings_exit_nonzero_naming_each(env: dict[str, str], tmp_path: Path) -> None:
    env["PODCAST_PIPELINE_EXEC_MODE"] = "k8s"
    env["PODCAST_JOB_BIND"] = "localhost"
    done = _run("check-config", env=env)
    assert done.returncode == 3
    assert "PODCAST_PIPELINE_EXEC_MODE" in done.stderr
    assert "PODCAST_JOB_BIND" in done.stderr


def test_a_broken_kinds_file_is_named(env: dict[str, str], tmp_path: Path) -> None:
    kinds = tmp_path / "kinds.toml"
    kinds.write_text('[kinds.x]\nargv = ["echo", "{missing}"]\n')
    env["PODCAST_JOB_KINDS_FILE"] = str(kinds)
    done = _run("check-config", env=env)
    assert done.returncode == 3
    assert "PODCAST_JOB_KINDS_FILE" in done.stderr and "{missing}" in done.stderr


def test_serve_refuses_a_non_loopback_bind_without_a_token(env: dict[str, str]) -> None:
    env["PODCAST_JOB_BIND"] = "0.0.0.0:0"
    done = _run("serve", env=env)
    assert done.returncode == 3
    assert "PODCAST_JOB_API_TOKEN" in done.stderr


def test_the_tokens_file_is_shown_resolved_and_a_broken_one_is_named(env: dict[str, str], tmp_path: Path) -> None:
    done = _run("check-config", "--json", env=env)
    assert done.returncode == 0, done.stderr
    effective = json.loads(done.stdout)
    assert (effective["api_tokens_file"], effective["api_tokens"]) == (str(tmp_path / ".viewer" / "api-tokens.toml"), 0)
    (tmp_path / "tokens.toml").write_text('[tokens."a"]\nscope = "root"\n')
    env["PODCAST_JOB_API_TOKENS_FILE"] = str(tmp_path / "tokens.toml")
    done = _run("check-config", env=env)
    assert done.returncode == 3
    assert "PODCAST_JOB_API_TOKENS_FILE" in done.stderr and "token 'a'" in done.stderr
