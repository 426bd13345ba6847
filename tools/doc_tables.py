"""Write the tables of the docs that are generated from declarations in the code, so neither can drift:

- the settings table of ``docs/settings.md``, from the settings' declarations (``supervisor/domain/_settings.py``,
  which joins those of ``_execution_fleet_settings.py``);
- the route table of ``docs/api.md``, from the routes' declarations (each resource's module, joined in
  ``supervisor/api/_routes.py``);
- the log events of ``docs/log-events.md``, from their catalogue (``supervisor/observe/_log_events.py``).

Usage: .venv/bin/python tools/doc_tables.py [--check]

Each table sits between two markers on its page; everything else on the page is left as it is. ``--check``: exit 1
when a page differs from the declarations (tests/config/test_settings.py and tests/api/test_api_openapi.py do the
same in ``make test``, and tests/test_log_events.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.api import routes_table
from supervisor.domain import settings_table
from supervisor.observe import log_events_table

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Table:
    page: Path
    source: str
    render: Callable[[], str]

    @property
    def begin(self) -> str:
        name = self.render.__name__.removesuffix("_table")
        return f"<!-- {name}: generated from {self.source} by tools/doc_tables.py; edit there -->\n"

    @property
    def end(self) -> str:
        return f"<!-- end of {self.render.__name__.removesuffix('_table')} -->\n"

    def rendered(self, page: str) -> str:
        """``page`` with the table between the markers made from the declarations."""
        head, rest = page.split(self.begin, 1)
        _, tail = rest.split(self.end, 1)
        return f"{head}{self.begin}{self.render()}\n{self.end}{tail}"


SETTINGS = Table(ROOT / "docs" / "settings.md", "supervisor/domain/_settings.py", settings_table)
ROUTES = Table(ROOT / "docs" / "api.md", "supervisor/api/_routes.py", routes_table)
LOG_EVENTS = Table(ROOT / "docs" / "log-events.md", "supervisor/observe/_log_events.py", log_events_table)
TABLES = (SETTINGS, ROUTES, LOG_EVENTS)


def main(argv: list[str]) -> int:
    stale = 0
    for table in TABLES:
        page = table.page.read_text()
        new = table.rendered(page)
        if new == page:
            continue
        if "--check" in argv:
            print(f"{table.page} differs from {table.source}: run tools/doc_tables.py", file=sys.stderr)
            stale = 1
        else:
            table.page.write_text(new)
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
