"""References that cannot drift (ADR 0015 §5): what ``docs/`` and the code's comments name exists.

- every file path a page names in backticks (``core/_boot.py``, ``tests/longrun/chaos.py``, ``deploy/...``) is a file or
  directory of the repository (a path may be written from any package root: it is matched as a suffix);
- every ADR a page or a comment names (``ADR 0019``, ``ADR-0012``) has its record in ``docs/adr/``;
- every results file kept in ``bench/results/`` is cited by a page;
- a comment that points into a page (``docs/operations.md § Pausing``) names one of its headings, and a comment,
  a page or a test names the decision it upholds, never an issue number (a tracker's number says nothing once the
  tracker is gone; the migrations, written once, keep theirs, and so do the results files, which are data);
- the registry's tables named in the data layout of ``docs/architecture.md`` are the tables its migrations make,
  and every backend of the contract suite is named where the page says which pass it;
- every ``Class.attribute`` the nursery tree of ``docs/architecture.md`` draws is an attribute of a class of
  ``supervisor``; every name the page writes as code (``JobLedger.stop_for``, ``core._rules.judge``, ``hold``), and
  every ``Class.method`` its drawings write bare, is in the code; its event bus drawing names each subscriber a
  built boot's bus has, and no other; its nursery tree and ``Supervisor``'s docstring draw every task
  ``Supervisor.start`` starts, in its order; every private module its module map names is there;
- every ``supervisor.x`` / ``pipeline_runner.x`` name a page writes is in the code.
Each check is shown to fail on a reference that does not exist.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import pkgutil
import re
from pathlib import Path
from typing import Any

import pytest
import trio

import supervisor
from supervisor import Config, KindCatalog, MemoryRegistry, Supervisor
from supervisor.core import run_job_nursery
from supervisor.execution.memory import MemoryExecutor
from supervisor.observe import EventBus, Metrics

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
ISSUE = re.compile(r"\b[Ii]ssues?:? #?\d+")  # a tracker's number, in a sentence or a record's header
CODE_AND_TOOLING = [
    *CODE, *ROOT.glob("tools/*.py"), *ROOT.glob("scripts/*.sh"), *ROOT.glob("compose/*.yml"), ROOT / "Makefile",
    ROOT / ".ci" / "run", *ROOT.glob("bench/*.py"),
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
    """From the code, the tooling, the pages and the tests (but this file, whose examples point nowhere)."""
    named = [p for p in [*CODE_AND_TOOLING, *DOCS_AND_TESTS] if p != Path(__file__).resolve()]
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in named}
    pages = {str(p.relative_to(ROOT)): p.read_text() for p in ROOT.glob("docs/*.md")}
    assert missing_sections(texts, pages) == []


# The pages (and what renders one: the performance page's template), and the tests: a test says what it holds.
DOCS_AND_TESTS = [
    *ROOT.glob("docs/**/*.md"), *ROOT.glob("docs/**/*.yml"), ROOT / "README.md", *ROOT.glob("bench/*.md"),
    *ROOT.glob("tests/**/*.py"),
]  # fmt: skip


def test_the_code_names_decisions_not_issue_numbers() -> None:
    assert issue_numbers({str(p.relative_to(ROOT)): p.read_text() for p in CODE_AND_TOOLING}) == []


def test_the_docs_and_the_tests_name_decisions_not_issue_numbers() -> None:
    assert len(DOCS_AND_TESTS) > 100  # the pages and the tests were found
    assert issue_numbers({str(p.relative_to(ROOT)): p.read_text() for p in DOCS_AND_TESTS}) == []


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


NAME = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\w*\))?`")  # `judge`, `Boot.ledger`, `core._rules.judge()`
FENCE = re.compile(r"^```\w*\n(.*?)^```", re.M | re.S)
DRAWN = re.compile(r"(?<![\w./`])([A-Z]\w*(?:\.[a-z_]\w*)+)")  # `Class.method` written bare in a drawing


def drawn_names(page: str) -> list[str]:
    """The names of the code a page draws: each code-formatted name (a paths' token is the path check's), and each
    ``Class.method`` its fenced drawings write."""
    names = NAME.findall(page)
    for block in FENCE.findall(page):
        names += DRAWN.findall(block)
    return list(dict.fromkeys(names))


def _has_attribute(cls: type, attribute: str) -> bool:
    """A class attribute, method or field of ``cls``, or an attribute its methods assign (``self.events = ...``)."""
    if hasattr(cls, attribute) or any(attribute in getattr(k, "__annotations__", {}) for k in cls.__mro__):
        return True
    try:
        return re.search(rf"\bself\.{attribute}\s*[:=]", inspect.getsource(cls)) is not None
    except (OSError, TypeError):
        return False


def missing_names(names: list[str], classes: dict[str, list[type]], code: str) -> list[str]:
    """The names in ``names`` the code does not have: ``Class.attribute`` an attribute of a class of ``supervisor``
    (the rest of a chain, a word of the code); ``module.name`` (``core._rules.judge``, ``trio.sleep_until``) a name
    of a module loaded whose name ends so; a word, a word of ``code``; else written in ``code`` as it is (an event's
    name, ``job.transition``; a label, ``ps.job_id``)."""
    words = set(re.findall(r"\w+", code))
    modules = {name: module for name, module in __import__("sys").modules.items() if module is not None}

    def walk(found: object, rest: list[str]) -> bool:
        for at, part in enumerate(rest):
            if inspect.isclass(found) and not hasattr(found, part):  # an instance's attribute: the rest, words
                return _has_attribute(found, part) and all(later in words for later in rest[at + 1 :])
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True

    def resolves(parts: list[str]) -> bool:
        if parts[0] in classes:
            return any(walk(cls, parts[1:]) for cls in classes[parts[0]])
        for cut in range(len(parts) - 1, 0, -1):
            head = ".".join(parts[:cut])
            named = [module for name, module in modules.items() if name == head or name.endswith("." + head)]
            if any(walk(module, parts[cut:]) for module in named):
                return True
        return False

    missing = []
    for name in names:
        parts = name.split(".")
        if len(parts) == 1:
            known = name in words
        else:
            known = resolves(parts) or re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", code) is not None
        if not known:
            missing.append(name)
    return missing


def missing_dotted(names: list[str]) -> list[str]:
    """Of ``names``, each ``supervisor.x.y`` / ``pipeline_runner.x.y`` that is not a module, or a name in one (a
    class's attribute too)."""
    missing = []
    for name in names:
        if not name.startswith(("supervisor.", "pipeline_runner.")):
            continue
        parts, found = name.split("."), None
        for cut in range(len(parts), 0, -1):
            try:
                found = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for at, part in enumerate(parts[cut:]):
                if inspect.isclass(found) and not hasattr(found, part):
                    found = found if _has_attribute(found, part) and at == len(parts[cut:]) - 1 else None
                    break
                found = getattr(found, part, None)
            break
        if found is None:
            missing.append(name)
    return missing


def test_every_module_name_a_page_writes_is_in_the_code() -> None:
    """``supervisor.core.Supervisor``, ``pipeline_runner.testing.run_in_process``: on every page, not just the
    architecture's."""
    prefixes = ("supervisor.", "pipeline_runner.")
    named = [n for page in PAGES for n in drawn_names(page.read_text()) if n.startswith(prefixes)]
    assert len(named) >= 5, named  # such names were found
    missing = {page.relative_to(ROOT).as_posix(): missing_dotted(drawn_names(page.read_text())) for page in PAGES}
    assert {page: names for page, names in missing.items() if names} == {}


def _code_text() -> str:
    return "\n".join(p.read_text() for p in [*CODE, *ROOT.glob("tools/*.py"), *ROOT.glob("bench/*.py")])


def test_every_name_the_architecture_page_draws_is_in_the_code() -> None:
    """What ``docs/architecture.md`` names (its drawings, tables and prose) cannot drift from the code: a method gone
    or renamed is named nowhere."""
    names = drawn_names((ROOT / "docs" / "architecture.md").read_text())
    assert len(names) >= 100, names  # the names were found
    assert missing_names(names, _classes(), _code_text()) == []


def module_map_names(page: str) -> dict[str, set[str]]:
    """Each package of the module map of ``docs/architecture.md`` and the private modules (``_registry``) its entry
    names."""
    block = page.split("## Module map", 1)[1].split("```", 2)[1]
    entries = re.findall(r"^  (\w+)/ +(.*(?:\n {4,}.*)*)", block, re.M)
    return {package: set(re.findall(r"(?<![\w.])(_[a-z]\w*)\b", entry)) for package, entry in entries}


def missing_modules(named: dict[str, set[str]], root: Path) -> list[str]:
    """``package/_module`` for each module named that is no module (or folder) of ``package`` under ``root``."""
    missing = []
    for package, modules in sorted(named.items()):
        found = {p.stem for p in (root / package).rglob("*.py")} | {p.name for p in (root / package).rglob("*/")}
        missing += [f"{package}/{module}" for module in sorted(modules - found)]
    return missing


def test_every_module_the_module_map_names_is_there() -> None:
    named = module_map_names((ROOT / "docs" / "architecture.md").read_text())
    assert {"domain", "registry", "execution", "core", "observe", "api", "cli"} <= set(named)  # the map was found
    assert missing_modules(named, ROOT / "supervisor") == []


def bus_subscribers_drawn(page: str) -> set[str]:
    """The subscribers the event seam's drawing hangs under ``Supervisor.events``."""
    block = page.split("Supervisor.events (EventBus)", 1)[1].split("```", 1)[0]
    return set(re.findall(r"[├└]── (\w+(?:\.\w+)?)", block))


def subscriber_name(subscriber: object) -> str:
    """``Class.method`` for a bound method, a function's own name."""
    owner = getattr(subscriber, "__self__", None)
    name = getattr(subscriber, "__name__", repr(subscriber))
    return f"{type(owner).__name__}.{name}" if owner is not None else name


async def test_the_event_bus_drawing_names_every_subscriber_of_a_boot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every subscriber a boot's bus is given while the boot is built is drawn, and nothing else: one subscribed
    inside a constructor too (the drawing says where)."""
    subscribed: set[str] = set()
    subscribe = EventBus.subscribe

    def noted(bus: EventBus, subscriber: Any) -> None:
        subscribed.add(subscriber_name(subscriber))
        subscribe(bus, subscriber)

    monkeypatch.setattr(EventBus, "subscribe", noted)
    async with trio.open_nursery() as machine:
        config = Config(data_dir=tmp_path, bind_port=0)
        Supervisor(config, KindCatalog({}), MemoryRegistry(), executor=MemoryExecutor({}, machine), standalone=True)
        machine.cancel_scope.cancel()
    assert "log_event" in subscribed  # the subscriptions were seen
    drawn = bus_subscribers_drawn((ROOT / "docs" / "architecture.md").read_text())
    assert drawn == subscribed


def test_the_core_s_wiring_names_every_protocol_a_part_takes() -> None:
    """Each protocol of ``core/_ports.py`` (what one part offers another) is named in docs/architecture.md § The core's
    wiring, and the section names none that is not there."""
    ports = ast.parse((ROOT / "supervisor" / "core" / "_ports.py").read_text())
    protocols = {node.name for node in ports.body if isinstance(node, ast.ClassDef)}
    assert len(protocols) >= 8, protocols  # the protocols were found
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("### The core's wiring", 1)[1].split("\n#", 1)[0]
    named = {name.split(".")[0] for name in re.findall(r"`([A-Z]\w*(?:\.\w+)?)`", section)}
    assert protocols - named == set()


class _RecordingRoot:
    """Stands for the root nursery given to ``Supervisor.start``: notes each task asked of it and starts none (the job
    nursery it asks for is a real one)."""

    def __init__(self, job_nursery: trio.Nursery) -> None:
        self.job_nursery = job_nursery
        self.tasks: list[Any] = []

    async def start(self, task: Any, *args: Any) -> Any:
        self.tasks.append(task)
        return self.job_nursery if task is run_job_nursery else None


def task_part(task: Any) -> str:
    """The class whose task it is (``Fleet.run`` is the ``Fleet``'s: each part's task is its own method), or the
    function's own name (``run_job_nursery``)."""
    task = getattr(task, "func", task)  # a functools.partial: its function's
    owner = getattr(task, "__self__", None)
    return type(owner).__name__ if owner is not None else task.__name__


def drawn_in_order(parts: list[str], drawing: str) -> list[str]:
    """The parts ``drawing`` does not name, or names out of ``parts``' order (each at its first mention)."""
    at = {part: drawing.find(part) for part in parts}
    missing = [part for part in parts if at[part] < 0]
    named = [part for part in parts if at[part] >= 0]
    return missing + [f"{a} after {b}" for a, b in itertools.pairwise(named) if at[a] > at[b]]


async def test_the_tasks_a_boot_starts_are_drawn_in_its_order(tmp_path: Path) -> None:
    """The nursery tree of ``docs/architecture.md`` and the tree of ``Supervisor``'s docstring draw every task the
    boot's tree starts (``Supervisor.start``), in the order it starts them: neither can leave one out again."""
    async with trio.open_nursery() as machine:
        config = Config(data_dir=tmp_path, bind_port=0)
        supervisor = Supervisor(config, KindCatalog({}), MemoryRegistry(), executor=MemoryExecutor({}, machine))
        root = _RecordingRoot(machine)
        await supervisor.start(root)  # type: ignore[arg-type]
        machine.cancel_scope.cancel()
    parts = [task_part(task) for task in root.tasks]
    assert len(parts) >= 8 and "Fleet" in parts, parts  # the tasks were seen
    page = (ROOT / "docs" / "architecture.md").read_text()
    tree = page.split("## The nursery tree", 1)[1].split("```", 2)[1]
    children = re.findall(r"^    [├└]── (.+)", tree.split("└── root nursery", 1)[1], re.M)  # the root's own
    assert drawn_in_order(parts, "\n".join(children)) == []
    front_door = ast.get_docstring(ast.parse((ROOT / "supervisor" / "core" / "_supervisor.py").read_text())) or ""
    assert drawn_in_order([part for part in parts if part != "run_job_nursery"], front_door) == []


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
    tracker = "issue"  # written apart, or this file would hold what it checks for
    found = issue_numbers({"c.py": f"# the fix of {tracker} 36 (ADR 0012 §9); {tracker.title()} 9's, {tracker}s 3"})
    assert found == [f"c.py: {tracker} 36", f"c.py: {tracker.title()} 9", f"c.py: {tracker}s 3"]
    assert issue_numbers({"0001.md": f"- {tracker.title()}: #27 (a fleet)"}) == [f"0001.md: {tracker.title()}: #27"]
    assert missing_tree_tasks(["Drainer.run", "Drainer.no_such_task"], _classes()) == ["Drainer.no_such_task"]
    drawing = (
        "the monitors (`adopt`, `stall_stop_done`), reconcile (`JobLedger.stop_for_stall`, `core._rules.judge`)\n"
        "```\n├── Drainer.run   Fleet._silent_host_rounds, Boot.run_in_tree_gone(work)  trio.sleep_until\n```\n"
    )
    names = drawn_names(drawing)
    assert names[:4] == ["adopt", "stall_stop_done", "JobLedger.stop_for_stall", "core._rules.judge"]
    assert missing_names(names, _classes(), "def adopt(): ...") == [
        "stall_stop_done", "JobLedger.stop_for_stall", "Boot.run_in_tree_gone",
    ]  # fmt: skip
    assert missing_dotted(["supervisor.core.Supervisor.enqueue", "supervisor._core.Supervisor", "Drainer.run"]) == [
        "supervisor._core.Supervisor"
    ]
    assert missing_dotted(["supervisor.core.Supervisor.gone", "pipeline_runner.testing.run_in_process"]) == [
        "supervisor.core.Supervisor.gone"
    ]
    bus = "Supervisor.events (EventBus)\n  ├── log_event   lines\n  └── WebhookSender.wake   rings\n```"
    assert bus_subscribers_drawn(bus) == {"log_event", "WebhookSender.wake"}
    assert subscriber_name(Metrics().on_event) == "Metrics.on_event"
    assert drawn_in_order(["Fleet", "Drainer", "Heartbeats"], "├── Drainer.run\n├── Fleet.run") == [
        "Heartbeats", "Fleet after Drainer",
    ]  # fmt: skip
    module_map = "## Module map\n```\n  core/    _drain (Drainer), _gone\n           _boot\ntools/x.py  _nothing\n```"
    assert module_map_names(module_map) == {"core": {"_drain", "_gone", "_boot"}}
    assert missing_modules(module_map_names(module_map), ROOT / "supervisor") == ["core/_gone"]
