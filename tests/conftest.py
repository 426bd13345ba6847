"""Fixtures shared by every test package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor import SqliteRegistry


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[SqliteRegistry]:
    reg = SqliteRegistry(tmp_path / ".viewer" / "jobs.sqlite3")
    yield reg
    reg.close()
