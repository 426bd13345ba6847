"""References that cannot drift (ADR 0015 §5): what ``docs/`` and the code's comments name exists.

- every file path a page names in backticks (``core/_boot.py``, ``tests/longrun/chaos.py``, ``deploy/...``) is a file or
  directory of the repository (a path may be written from any package root: it is matched as a suffix);
- every ADR a page or a comment names (``ADR 0019``, ``ADR-0012``) has its record in ``docs/adr/``;
- every results file kept in ``bench/results/`` is cited by a page;
- a comment that points into a page (``docs/operations.md § Pausing``) names one of its headings, and a comment
  names the decision it upholds, never an issue number ("issue 36" says nothing once the tracker is gone; the
  migrations, written once, keep theirs);
- the registry's tables named in the data layout of ``docs/architecture.md`` are the tables its migrations make,
  and every backend of the contract suite is named where the page says which pass it;
- every ``Class.attribute`` the nursery tree of ``docs/architecture.md`` draws is an attribute of a class of
  ``supervisor``.
Each check is shown to fail on a reference that does not exist.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import supervisor

ROOT = Path(__file__).resolve().parents[1]
# The pages that describe the code as it is: the guides and the index of the decision records. A record itself is
# dated: what it names is as it was then (its "Since ..." notes say what moved since).
PAGES = sorted(
    [*ROOT.glob("docs/*.md"), ROOT / "docs" / "adr" / "README.md", ROOT / "README.md", ROOT / "bench" / "README.md"]
)
TOKEN = re.compile(r"`([\w./-]+)(?:::([\w*]+)[^`]*)?`")  # a test file may name a test: `tests/x.py::test_*`
# In the code: a path in a docstring's ``literal`` or `name`, or a repository path written bare in a comment.
CODE_TOKEN = re.compile(
    r"``([\w./-]+)``|`([\w./-]+)`|(?<![\w/.])((?:docs|bench|tests|scripts|deploy|compose|tools)/[\w./-]+)"
)
CODE = sorted([*ROOT.glob("supervisor/**/*.py"), *ROOT.glob("pipeline_runner/**/*.py")])
ROOTS = {
    "supervisor", "pipeline_runner", "tests", "bench", "docs", "tools", "scripts", "compose", "deploy", ".ci", "core",
    "registry", "api", "cli", "domain", "execution", "observe", "sqlite", "postgres", "migrations", "adr",
}  # fmt: skip
EXTENSIONS = (".py", ".md", ".sql", ".toml", ".sh", ".yml", ".yaml", ".service", ".txt", ".json", ".example", ".png")
ADR = re.compile(r"\bADR[ -](\d{4})\b")


def path_of(token: str) -> str | None:
    """The repository path a backticked token names (``core/_boot.py``, ``core/_rules.judge``: a module and a name
    in it), or None when it names no file of ours (a MIME type, ``failed/exit_code_5``, a deployed machine's path)."""
    if "/" not in token or token.startswith(("/", "./", "../")) or any(c in token for c in "<*{") or "NNNN" in token:
        return None
    if token.split("/", 1)[0] not in ROOTS and not token.endswith(EXTENSIONS):
        return None
    return token.rstrip("/")


def _has_test(text: str, pattern: str) -> bool:
    """A test function (or class) whose name matches ``pattern`` (``*``, or a name cut after ``_``: anything) is in
    ``text``."""
    name = ".*".join(re.escape(part) for part in pattern.split("*"))
    end = "" if pattern.endswith(("*", "_")) else r"\b"
    return re.search(rf"^\s*(?:async def|def|class) {name}{end}", text, re.M) is not None


def _defines(text: str, name: str) -> bool:
    word = re.escape(name)
    return re.search(rf"^\s*(?:async def|def|class) {word}\b|^\s*{word}\s*[:=]", text, re.M) is not None


def _repository_files() -> dict[str, str]:
    skip = {".git", ".venv", ".venv-bench", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
    found = {}
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if parts and not (set(parts) & skip):
            text = path.read_text(errors="replace") if path.suffix == ".py" else ""
            found["/".join(parts)] = text
    return found


def missing_paths(pages: list[Path], files: dict[str, str], token: re.Pattern[str] = TOKEN) -> list[str]:
    """The tokens ``token`` finds in ``pages`` that name no file (or no name in it); ``files``: each repository path
    and the text of its Python files."""

    def at(path: str) -> list[str]:
        return [f for f in files if f == path or f.endswith("/" + path)]

    missing = []
    for page in pages:
        for match in token.finditer(page.read_text()):
            named = next(group for group in match.groups() if group).rstrip(".,;:)")
            path = path_of(named)
            if path is None:
                continue
            if at(path):
                test = match.group(2) if token is TOKEN else None
                if test is not None and not any(_has_test(files[f], test) for f in at(path)):
                    missing.append(f"{page.name}: {named}::{test}")
                continue
            head, _, last = path.rpartition("/")
            module, _, attribute = last.partition(".")
            modules = at(f"{head}/{module}.py") if attribute else []
            if not any(_defines(files[f], attribute.split(".")[-1]) for f in modules):
                missing.append(f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name}: {named}")
    return missing


def missing_adrs(texts: dict[str, str], records: set[str]) -> list[str]:
    named = [(where, number) for where, text in texts.items() for number in ADR.findall(text)]
    return sorted(f"{where}: ADR {number}" for where, number in named if number not in records)


def test_every_path_a_page_names_exists() -> None:
    assert missing_paths(PAGES, _repository_files()) == []


def test_every_results_file_kept_is_cited_by_a_page() -> None:
    """Raw results stay committed while a page cites them (git keeps the rest): a run's file is cited or removed."""
    cited = "\n".join(page.read_text() for page in PAGES)
    kept = sorted(path.name for path in (ROOT / "bench" / "results").glob("*.json"))
    assert [name for name in kept if name not in cited] == []


def test_the_performance_page_is_one_current_page() -> None:
    """Under 400 lines: the figures of now and what closes the misses; how to run the benchmarks is
    ``bench/README.md``, and the history is git's."""
    assert len((ROOT / "docs" / "performance.md").read_text().splitlines()) < 400


def test_every_path_a_comment_names_exists() -> None:
    assert missing_paths(CODE, _repository_files(), CODE_TOKEN) == []


def test_every_adr_a_page_or_a_comment_names_exists() -> None:
    records = {path.name[:4] for path in (ROOT / "docs" / "adr").glob("[0-9][0-9][0-9][0-9]-*.md")}
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in PAGES}
    texts |= {str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "supervisor").rglob("*.py"))}
    assert missing_adrs(texts, records) == []


SECTION = re.compile(r"(docs/[\w./-]+\.md) § ")
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")
CODE_AND_TOOLING = [
    *CODE, *ROOT.glob("tools/*.py"), *ROOT.glob("scripts/*.sh"), *ROOT.glob("compose/*.yml"), ROOT / "Makefile",
    ROOT / ".ci" / "run",
]  # fmt: skip


def missing_sections(texts: dict[str, str], pages: dict[str, str]) -> list[str]:
    """Each ``docs/x.md § Heading`` in ``texts`` whose page has no heading the text after the ``§`` begins with."""
    missing = []
    for where, text in texts.items():
        for match in SECTION.finditer(text):
            page = pages.get(match.group(1))
            headings = re.findall(r"^#+ (.+?)\s*$", page or "", re.M)
            after = re.sub(r"\s*\n\s*(?:#\s*)?", " ", text[match.end() : match.end() + 200])
            if not any(after.startswith(heading) for heading in headings):
                missing.append(f"{where}: {match.group(1)} § {after[:30]}")
    return missing


def issue_numbers(texts: dict[str, str]) -> list[str]:
    return [f"{where}: {found}" for where, text in texts.items() for found in ISSUE.findall(text)]


def test_every_section_a_comment_points_to_is_a_heading_of_its_page() -> None:
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in CODE_AND_TOOLING}
    pages = {str(p.relative_to(ROOT)): p.read_text() for p in ROOT.glob("docs/*.md")}
    assert missing_sections(texts, pages) == []


def test_the_code_names_decisions_not_issue_numbers() -> None:
    assert issue_numbers({str(p.relative_to(ROOT)): p.read_text() for p in CODE_AND_TOOLING}) == []


def _classes() -> dict[str, list[type]]:
    for module in pkgutil.walk_packages(supervisor.__path__, "supervisor."):
        if not module.name.endswith((".shepherd", ".__main__")):
            importlib.import_module(module.name)
    found: dict[str, list[type]] = {}
    for module in list(__import__("sys").modules.values()):
        if getattr(module, "__name__", "").startswith("supervisor"):
            for name, value in vars(module).items():
                if inspect.isclass(value) and value.__module__.startswith("supervisor"):
                    found.setdefault(name, []).append(value)
    return found


def tree_names(page: str) -> list[str]:
    """``Class.attribute`` in the nursery tree's drawing (the first code block under "The nursery tree")."""
    block = page.split("## The nursery tree", 1)[1].split("```", 2)[1]
    return re.findall(r"[├└]── ([A-Z]\w*\.\w+)", block)


def missing_tree_tasks(names: list[str], classes: dict[str, list[type]]) -> list[str]:
    missing = []
    for name in names:
        cls, attr = name.split(".", 1)
        if not any(hasattr(c, attr) for c in classes.get(cls, [])):
            missing.append(name)
    return missing


def test_every_task_the_nursery_tree_draws_is_in_the_code() -> None:
    names = tree_names((ROOT / "docs" / "architecture.md").read_text())
    assert len(names) >= 10, names  # the drawing was found
    assert missing_tree_tasks(names, _classes()) == []


def registry_tables_named(page: str) -> set[str]:
    """The tables the data layout of ``docs/architecture.md`` names for the registry."""
    entry = page.split("jobs.sqlite3 (+ -wal, -shm)", 1)[1].split("tables:", 1)[1].split("\n    jobs/", 1)[0]
    return {name for name in re.findall(r"\b([a-z_]+)\b", re.sub(r"\([^)]*\)", "", entry))}


def registry_tables_made() -> set[str]:
    """The tables the SQLite registry's migrations make, and its version tables (made by the code that migrates)."""
    migrations = (ROOT / "supervisor" / "registry" / "sqlite" / "migrations").glob("*.sql")
    made = {m for path in migrations for m in re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", path.read_text())}
    return made | {"schema_version", "schema_migrations"}


def test_the_registry_tables_the_data_layout_names_are_the_tables_made() -> None:
    assert registry_tables_named((ROOT / "docs" / "architecture.md").read_text()) == registry_tables_made()


def test_every_backend_of_the_contract_suite_is_named_where_the_page_says_they_pass_it() -> None:
    # The suite's backends, read from its helpers (another test package's module; a module named ``registry`` may
    # be another one on this path).
    helpers = (ROOT / "tests" / "registry" / "registry_helpers.py").read_text()
    backends = set(re.findall(r'^\s*"(\w+)": Backend\(', helpers, re.M))
    page = (ROOT / "docs" / "architecture.md").read_text()
    sentence = page.split("pass one contract suite", 1)[1].split("\n\n", 1)[0]
    named = {"sqlite": "SQLite", "memory": "in-memory", "postgres": "PostgreSQL", "pgbouncer": "pgbouncer"}
    assert backends == set(named)
    assert [backend for backend, words in named.items() if words not in sentence] == []


def test_the_checks_fail_on_references_that_do_not_exist(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    files = {"supervisor/core/_boot.py": "async def until_recorded(w): ...", "tests/t.py": "def test_one_thing(): ..."}
    page.write_text("`core/_nothing.py` `core/_boot.py` `core/_boot.until_recorded` `core/_boot.gone`")
    assert missing_paths([page], files) == ["page.md: core/_nothing.py", "page.md: core/_boot.gone"]
    page.write_text("`tests/t.py::test_one_thing` `tests/t.py::test_on*` `tests/t.py::test_one_` `tests/t.py::test_2`")
    assert missing_paths([page], files) == ["page.md: tests/t.py::test_2"]
    assert missing_adrs({"page": "ADR 9999 and ADR 0001"}, {"0001"}) == ["page: ADR 9999"]
    pages = {"docs/ops.md": "# Ops\n\n## The queue's watch\n"}
    code = "# see docs/ops.md § The queue's\n    # watch. And docs/ops.md § Pausing -- gone, and docs/no.md § Ops."
    assert missing_sections({"c.py": code}, pages) == [
        "c.py: docs/ops.md § Pausing -- gone, and docs/no.m",
        "c.py: docs/no.md § Ops.",
    ]
    found = issue_numbers({"c.py": "# the fix of issue 36 (ADR 0012 §9); Issue 9's"})
    assert found == ["c.py: issue 36", "c.py: Issue 9"]
    assert missing_tree_tasks(["Drainer.run", "Drainer.no_such_task"], _classes()) == ["Drainer.no_such_task"]
