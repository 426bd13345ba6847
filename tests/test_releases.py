"""Releases (docs/fleet.md § Upgrading a fleet): the version is one value (the code's RELEASE, pyproject's version,
``supervisor --version``), CHANGELOG.md has an entry with an Upgrading section for each release, and releases.toml
names each release's commit: the one that set RELEASE to it, which has that version in both places."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from supervisor.domain import RELEASE

ROOT = Path(__file__).resolve().parents[1]
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
RELEASE_FILE = "supervisor/domain/_release.py"


def releases() -> list[dict[str, str]]:
    return list(tomllib.loads((ROOT / "releases.toml").read_text())["release"])


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout.strip()


def release_commit(version: str) -> str:
    """The commit that set RELEASE to ``version`` (the oldest that added that line)."""
    found = git("log", "--format=%H", f"-SRELEASE = \"{version}\"", "--", RELEASE_FILE).split()
    assert found, f"no commit set RELEASE to {version}"
    return found[-1]


def test_the_version_is_one_semantic_value_everywhere() -> None:
    assert SEMVER.fullmatch(RELEASE), RELEASE
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == RELEASE
    shown = subprocess.run([sys.executable, "-m", "supervisor", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert shown.stdout.strip() == f"supervisor {RELEASE}"


def test_each_release_has_a_changelog_entry_with_an_upgrading_section_newest_first() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (\S+)", changelog, re.MULTILINE)
    recorded = [r["version"] for r in releases()]
    # The code's own release heads the page while it is not cut yet ("unreleased"), and is not recorded.
    upcoming = [] if RELEASE in recorded else [RELEASE]
    assert [h for h in headings if SEMVER.fullmatch(h)] == upcoming + list(reversed(recorded))
    for section in re.split(r"^## ", changelog, flags=re.MULTILINE)[1:]:
        assert "**Upgrading" in section, section.splitlines()[0]


def test_the_code_is_the_newest_release_or_past_it() -> None:
    """Between two cuts the code keeps the last release's version (the next cut changes it and adds its entry)."""
    newest = releases()[-1]["version"]
    assert tuple(map(int, RELEASE.split("."))) >= tuple(map(int, newest.split(".")))


@pytest.mark.parametrize("release", releases(), ids=lambda r: r["version"])
def test_each_release_is_a_commit_of_this_repository_with_its_version(release: dict[str, str]) -> None:
    if git("rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("a shallow clone has not the history")
    commit = release_commit(release["version"])
    if release["commit"]:
        assert release["commit"] == commit
    assert f'RELEASE = "{release["version"]}"' in git("show", f"{commit}:{RELEASE_FILE}")
    assert f'version = "{release["version"]}"' in git("show", f"{commit}:pyproject.toml")
