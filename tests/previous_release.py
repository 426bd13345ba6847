"""The previous release, installed from this repository's history into a venv of its own (docs/fleet.md § Upgrading
a fleet): what the fleet upgrade test runs beside the code of this tree.

``releases.toml`` names each release; its commit is the recorded one, or the commit that set
``supervisor/domain/_release.py``'s RELEASE to it (a release cannot record its own hash). The tree of that commit
(``git archive``) is installed with ``pip install -c constraints.txt`` into ``.venv/releases/<version>-<commit>/``,
kept between runs (make test pays once); concurrent runs take turns on a lock file.
"""

from __future__ import annotations

import fcntl
import io
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RELEASE_FILE = "supervisor/domain/_release.py"
INSTALL_TIMEOUT_S = 600  # a first install of every dependency, from pip's cache or its index


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True, timeout=60)
    return done.stdout.strip()


def releases() -> list[dict[str, str]]:
    return list(tomllib.loads((ROOT / "releases.toml").read_text())["release"])


def release_commit(version: str) -> str:
    """The commit of release ``version``: the one recorded, else the oldest that set RELEASE to it."""
    [release] = [r for r in releases() if r["version"] == version]
    if release["commit"]:
        return release["commit"]
    found = git("log", "--format=%H", f'-SRELEASE = "{version}"', "--", RELEASE_FILE).split()
    if not found:
        raise LookupError(f"no commit set RELEASE to {version}")
    return found[-1]


def previous_release(current: str) -> str:
    """The newest recorded release other than ``current`` (the code of this tree may be it, once cut)."""
    older = [r["version"] for r in releases() if r["version"] != current]
    if not older:
        raise LookupError("releases.toml records no release before this one")
    return older[-1]


def install(version: str) -> Path:
    """Release ``version`` installed in its own venv (made once, then reused): that venv's python."""
    commit = release_commit(version)
    home = ROOT / ".venv" / "releases" / f"{version}-{commit[:12]}"
    python = home / "venv" / "bin" / "python"
    home.parent.mkdir(parents=True, exist_ok=True)
    with (home.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / ".installed").exists():
            return python
        src = home / "src"
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", commit], check=True, capture_output=True, timeout=60
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(src, filter="data")
        subprocess.run([sys.executable, "-m", "venv", str(home / "venv")], check=True, timeout=120)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "-c", str(src / "constraints.txt"), str(src)],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
        )
        (home / ".installed").touch()
        return python


if __name__ == "__main__":  # python tests/previous_release.py 1.0.0: install it now
    print(install(sys.argv[1]))
