"""Fixtures for the SQLite backend's own tests (what the contract cannot say: its file, its schema and its
migrations, its connections, its group commit, several processes on one file)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from registry_helpers import WallClock

from supervisor.registry import SqliteRegistry


@pytest.fixture
def backend() -> str:
    """The contract fixtures (``registry``, ``open_registry``), if a test here asks for them: SQLite only."""
    return "sqlite"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "jobs.sqlite3"


@pytest.fixture
async def sqlite_registry(path: Path, clock: WallClock) -> AsyncIterator[SqliteRegistry]:
    reg = await SqliteRegistry.open(path, clock=clock, boot_id="boot-test")
    yield reg
    await reg.aclose()
