"""Write the settings table of docs/operations.md from the settings' declarations (supervisor/domain/_settings.py).

Usage: .venv/bin/python tools/settings_table.py [--check]

The table sits between two markers on the page; everything else on the page is left as it is. ``--check``: exit 1
when the page differs from the declarations (tests/config/test_settings.py does the same in ``make test``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.domain import settings_table

PAGE = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
BEGIN = "<!-- settings: generated from supervisor/domain/_settings.py by tools/settings_table.py; edit there -->\n"
END = "<!-- end of settings -->\n"


def rendered(page: str) -> str:
    """``page`` with the table between the markers made from the declarations."""
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}{settings_table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    page = PAGE.read_text()
    new = rendered(page)
    if "--check" in argv:
        if new != page:
            print(f"{PAGE} differs from the settings' declarations: run tools/settings_table.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
