"""docs/performance.md, rendered from results JSON files: one current page, never a log.

Usage: python bench/report.py [RESULTS.json ...] [--out docs/performance.md] [--plot PNG | --no-plot]
                              [--template bench/performance.template.md] [--results-dir bench/results]
       python bench/report.py --compare BEFORE.json AFTER.json [--out FILE]

With no file named, the page is rendered from the latest ``*-make-bench.json`` of ``--results-dir`` and that
directory's chaos and soak results. Named files are used instead: the last make-bench file is the run the page
shows; a feeds, outbox, exec-modes, fleet, pooler, heartbeats or migration file replaces that scenario; chaos and
soak files feed their sections.
With no file named, a single-scenario file newer than the latest make-bench file is used too (a scenario measured
alone since the last full run, such as ``bench/fleet.py``'s).

Prose lives in the template (``bench/performance.template.md``); every number comes from the JSON. A line of the
template that is a placeholder, ``{{name}}`` or ``{{name:argument}}``, is replaced:

- ``{{generated}}``: the note that the page is generated, and from which files;
- ``{{summary}}``: a few sentences from the run's figures: how fast, against what, on what machine;
- ``{{run}}``: the date, label, machine, speed probe, versions, peers and revision of the run shown;
- ``{{targets}}``: every target of the run with its figure, threshold and PASS/MISS;
- ``{{plot}}``: the plot (``make bench`` draws it with matplotlib from the bench venv; without matplotlib the
  existing PNG is kept and the page says so);
- ``{{scenario:KEY}}``: a scenario's tables, figures and notes (KEY: throughput, promotion, enqueue, detection,
  footprint, heartbeats, registry, feeds, outbox, exec_modes, fleet, pooler, migration);
- ``{{chaos}}``, ``{{soak}}``: the latest chaos run; the latest soak of each kind (and the latest one-hour soak of a
  kind whose latest soak was shorter);
- ``{{compare:BEFORE.json:AFTER.json}}``: a before/after table of two results files of ``--results-dir``;

``--compare BEFORE AFTER`` prints that before/after section alone (for an issue or a pull request), or writes it
to ``--out``. Only the standard library, and matplotlib for the plot.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import REPO, RESULTS_DIR, Measure, Section, Value, fmt_cell, read_json, sections_of

TEMPLATE = REPO / "bench" / "performance.template.md"
PAGE = REPO / "docs" / "performance.md"
PLOT_NAME = "bench-latest.png"
PLACEHOLDER = re.compile(r"^\{\{\s*([a-z_]+)(?::([^}]*))?\s*\}\}$")
SCENARIO_KINDS = ("make-bench", "feeds", "outbox", "exec-modes", "fleet", "pooler", "heartbeats", "migration")
QUART_FLOOR_4 = "quart-trio floor, 4 conns"  # the plot's bar of the stack's floor under the heartbeat guard's load


@dataclass
class Loaded:
    path: Path
    data: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.data.get("kind", "?"))

    @property
    def date(self) -> str:
        return str(self.data.get("date", ""))


@dataclass
class Inputs:
    run: Loaded | None = None
    scenarios: dict[str, tuple[Section, Loaded]] = field(default_factory=dict)
    chaos: list[Loaded] = field(default_factory=list)
    soak: list[Loaded] = field(default_factory=list)
    files: list[Loaded] = field(default_factory=list)


def load(paths: Iterable[Path]) -> Inputs:
    inputs = Inputs()
    loaded = sorted((Loaded(p, read_json(p)) for p in paths), key=lambda f: f.date)
    inputs.files = loaded
    runs = [f for f in loaded if f.kind == "make-bench"]
    inputs.run = runs[-1] if runs else next((f for f in reversed(loaded) if f.kind in SCENARIO_KINDS), None)
    ordered = ([inputs.run] if inputs.run else []) + [
        f for f in loaded if f.kind in SCENARIO_KINDS and f.kind != "make-bench" and f is not inputs.run
    ]
    for f in ordered:  # the run's scenarios first; a later single-scenario file replaces one
        for section in sections_of(f.data):
            inputs.scenarios[section.key] = (section, f)
    inputs.chaos = [f for f in loaded if f.kind == "chaos"]
    inputs.soak = [f for f in loaded if f.kind == "soak"]
    return inputs


def default_files(directory: Path) -> list[Path]:
    """The latest make-bench file of ``directory``, the latest single-scenario file of each kind that is newer (the
    names sort by date), and every chaos and soak file (the sections pick among them)."""
    files = [p for p in sorted(directory.glob("*.json")) if not _is_smoke(p)]
    runs = [p for p in files if p.name.endswith("-make-bench.json")]
    newer: list[Path] = []
    for kind in SCENARIO_KINDS[1:]:
        alone = [p for p in files if p.name.endswith(f"-{kind}.json") and (not runs or p.name > runs[-1].name)]
        newer += alone[-1:]
    rest = [p for p in files if p.name.endswith(("-chaos.json", "-soak.json"))]
    return runs[-1:] + newer + rest


def _is_smoke(path: Path) -> bool:
    try:
        return bool(read_json(path).get("smoke"))
    except (OSError, ValueError):
        return True


# -- the run's header -----------------------------------------------------------------------------------


def day(date: str) -> str:
    """``2026-12-01T15:46:00Z`` as ``2026-12-01 15:46 UTC``."""
    if len(date) <= 10:
        return date or "?"
    return date[:16].replace("T", " ") + " UTC"


def machine_text(data: dict[str, Any]) -> str:
    m = data.get("machine", {})
    parts = [str(m.get("cpu") or "?"), f"nproc {m.get('nproc') or '?'}"]
    if m.get("memory_gib"):
        parts.append(f"{m['memory_gib']:g} GiB of memory")
    if m.get("kernel"):
        parts.append(f"Linux {m['kernel']}")
    if m.get("tmp_filesystem"):
        parts.append(f"temp dir on {m['tmp_filesystem']}")
    return ", ".join(parts)


def revision_text(data: dict[str, Any]) -> str:
    rev = data.get("revision", {})
    modified = " (modified)" if rev.get("modified") else ""
    return f"supervisor/ at `{rev.get('supervisor', '?')}`{modified}, checkout {rev.get('commit', '?')}"


def run_block(inputs: Inputs) -> list[str]:
    if inputs.run is None:
        return ["_No make-bench results: run `make bench`._"]
    data = inputs.run.data
    lines = [
        "| | |",
        "|---|---|",
        f"| date | {day(data['date'])} |",
    ]
    if data.get("label"):
        lines.append(f"| label | {data['label']} |")
    lines.append(f"| results file | `bench/results/{inputs.run.path.name}` |")
    if data.get("source", "measured") != "measured":
        lines.append(f"| source | {data['source']} |")
    lines.append(f"| machine | {machine_text(data)} |")
    probe = data.get("machine", {}).get("speed_probe")
    if probe:
        lines.append(
            f"| speed probe | pure-Python work {probe['python_ms']:.1f} ms, start and reap `/bin/true` "
            f"{probe['spawn_us']:.0f} µs, a thread hand-off and back {probe['handoff_us']:.1f} µs |"
        )
    lines.append(f"| code | {revision_text(data)} |")
    versions = data.get("versions", {})
    lines.append("| versions | " + ", ".join(f"{k} {v}" for k, v in versions.items()) + " |")
    peers = data.get("peers", {})
    lines.append("| peers | " + "; ".join(f"{k}: {v}" for k, v in peers.items()) + " |")
    runs = data.get("runs")
    elapsed = data.get("elapsed_s")
    how = f"median of {runs} runs (min-max)" if runs else "see each table"
    lines.append(f"| figures | {how}" + (f"; bench/run.py took {elapsed / 60:.1f} min" if elapsed else "") + " |")
    if data.get("smoke"):
        lines += ["", "**A smoke run: tiny N, one run. Its figures say nothing about speed.**"]
    if data.get("notes"):
        lines += ["", *[f"- {note}" for note in data["notes"]]]
    return lines


def _cell(inputs: Inputs, scenario: str, table: str, row: str, column: str) -> Measure | Value | None:
    found = inputs.scenarios.get(scenario)
    t = found[0].get_table(table) if found else None
    r = t.row(row) if t else None
    cell = r.cells.get(column) if r else None
    return cell if isinstance(cell, Measure | Value) else None


def summary_block(inputs: Inputs) -> list[str]:
    """A few sentences that answer "how fast, against what, on what machine" from the run's figures."""
    if inputs.run is None:
        return []
    data = inputs.run.data
    lines = [f"**In short** (`make bench` of {day(data['date'])}, {machine_text(data)}):", ""]
    found = inputs.scenarios.get("throughput")
    if found is not None:
        n = found[0].params.get("jobs", "?")
        slots = found[0].params.get("slots", "?")
        batch = _cell(inputs, "throughput", "wall", "supervisor, batches of 100", "wall")
        ratio = _cell(inputs, "throughput", "wall", "supervisor, batches of 100", "x_xargs")
        post = _cell(inputs, "throughput", "wall", "supervisor, one POST per job", "wall")
        peers = [
            (name, _cell(inputs, "throughput", "wall", key, "wall"))
            for name, key in (
                ("xargs -P8", "xargs -P8"),
                ("task-spooler", "task-spooler -S 8"),
                ("GNU parallel", "GNU parallel -j8"),
                ("RQ's warm SimpleWorkers", "RQ, 8 SimpleWorkers"),
                ("RQ's fork-per-job Workers", "RQ, 8 fork-per-job Workers"),
            )
        ]
        if batch is not None and ratio is not None and post is not None:
            lines.append(
                f"- {n:,} jobs of `/bin/true` on {slots} slots: the supervisor takes {batch.median:.2f} s enqueued in "
                f"batches ({ratio.median:.2f} x `xargs -P8`) and {post.median:.2f} s with one POST per job; "
                + ", ".join(f"{name} {m.median:.2f} s" for name, m in peers if m is not None)
                + " (medians)."
            )
    beats = _cell(inputs, "heartbeats", "heartbeats", "supervisor", "rate")
    floor = _cell(inputs, "heartbeats", "floor", "hypercorn", "rate")
    rss = _cell(inputs, "footprint", "rss", "together", "running")
    promo = _cell(inputs, "promotion", "promotion", "exit_to_next_start", "p99")
    detect = _cell(inputs, "detection", "detection", "kill", "p99")
    facts = []
    if beats is not None:
        jobs = inputs.scenarios["heartbeats"][0].params.get("jobs", "?")
        facts.append(
            f"ingests {beats.median:,.0f} heartbeats/s with {jobs} jobs running"
            + (f" (hypercorn serving an empty app: {floor.median:,.0f} requests/s)" if floor is not None else "")
        )
    if rss is not None:
        facts.append(f"holds {inputs.scenarios['footprint'][0].params.get('jobs', '?')} running jobs in "
                     f"{rss.median:.1f} MiB (supervisor and shepherd)")  # fmt: skip
    if promo is not None:
        facts.append(f"starts the next queued job {promo.median:.1f} ms after an exit at p99")
    if detect is not None:
        facts.append(f"records a killed job {detect.median:.1f} ms after the kill at p99")
    if facts:
        lines.append("- The supervisor " + "; ".join(facts) + ".")
    verdicts = [(k, t) for k, (sec, _) in inputs.scenarios.items() for t in sec.targets]
    missed = [f"{k}/{t.key}" for k, t in verdicts if t.verdict == "MISS"]
    passed = sum(1 for _, t in verdicts if t.verdict == "PASS")
    if verdicts:
        lines.append(
            f"- Targets: {passed} PASS, {len(missed)} MISS" + (f" ({', '.join(missed)})" if missed else "") + "."
        )
    return lines if len(lines) > 2 else []


def targets_block(inputs: Inputs) -> list[str]:
    rows = ["| scenario | target: the figure, and what it is held to | verdict |", "|---|---|---|"]
    for key, (section, _) in inputs.scenarios.items():
        for t in section.targets:
            rows.append(f"| {key} | {t.text} | {f'**{t.verdict}**' if t.verdict == 'MISS' else t.verdict} |")
    return rows if len(rows) > 2 else ["_No targets in these results._"]


def _same_run(date: str, run_date: str) -> bool:
    """Whether a scenario's date falls within its run (``make bench`` takes minutes, not hours)."""
    try:
        a, b = (datetime.fromisoformat(d.replace("Z", "+00:00")) for d in (date, run_date))
    except ValueError:
        return False
    if len(date) <= 10 or len(run_date) <= 10:
        return False
    return abs((a - b).total_seconds()) <= 3600


def scenario_block(inputs: Inputs, key: str) -> list[str]:
    found = inputs.scenarios.get(key)
    if found is None:
        return [f"_No `{key}` results in the files rendered: run `make bench`._"]
    section, source = found
    lines = [f"_{section.title}; `{section.script}`"]
    if inputs.run is not None and source is not inputs.run:
        lines[0] += f", from `bench/results/{source.path.name}` ({machine_text(source.data)})"
    if inputs.run is not None and not _same_run(section.date, inputs.run.date):
        lines[0] += f", measured {day(section.date)}"
    lines[0] += "._"
    # Its targets' verdicts are in the page's table of targets, not repeated here.
    return [*lines, "", *section.markdown()]


# -- the plot -----------------------------------------------------------------------------------------------


def plot_data(inputs: Inputs) -> tuple[list[tuple[str, Measure]], list[tuple[str, Measure]], int]:
    """(jobs per second per tool, requests per second per server, jobs per run) from the run's tables."""
    tools: list[tuple[str, Measure]] = []
    n = 0
    found = inputs.scenarios.get("throughput")
    if found is not None:
        section, _ = found
        n = int(section.params.get("jobs", 0))
        wall = section.get_table("wall")
        for row in wall.rows if wall else []:
            cell = row.cells.get("wall")
            if isinstance(cell, Measure) and n and cell.median > 0:
                # jobs/s: the fastest run is the largest rate
                tools.append((str(row.cells.get("tool", row.key)), Measure(n / cell.median, n / cell.hi, n / cell.lo)))
    servers: list[tuple[str, Measure]] = []
    # The heartbeat guard first (4 jobs over 4 keep-alive connections, and the quart-trio floor under that load), then
    # the 500-job load and its bare floors.
    for key, label in (("heartbeats_4_jobs", "supervisor, 4 jobs, 4 conns"), ("heartbeats", None)):
        found = inputs.scenarios.get(key)
        if found is None:
            continue
        floor = found[0].get_table("floor")
        for row in floor.rows if floor else []:
            cell = row.cells.get("rate")
            if not isinstance(cell, Measure):
                continue
            name = str(row.cells.get("server", row.key))
            if label is not None:
                if name.startswith("supervisor"):
                    servers.append((label, cell))
                elif name.startswith("quart-trio"):
                    servers.append((QUART_FLOOR_4, cell))
                continue
            if name.startswith("supervisor"):
                jobs = found[0].params.get("jobs", "?")
                name = f"supervisor, {jobs} jobs, {found[0].params.get('connections', '?')} conns"
            servers.append((name, cell))
    return tools, servers, n


def draw_plot(inputs: Inputs, out: Path) -> str | None:
    """Draw the plot; None when done, else why not."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed here (`make bench` draws the plot with the bench venv's)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tools, servers, n = plot_data(inputs)
    found = inputs.scenarios.get("throughput")
    slots = found[0].params.get("slots", "?") if found else "?"
    if not tools and not servers:
        return "no throughput or heartbeat figures in these results"
    assert inputs.run is not None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    for ax, items, title, xlabel in (
        (axes[0], tools, f"{n:,} jobs of /bin/true on {slots} slots", "jobs per second (higher is better)"),
        (axes[1], servers, "heartbeats, the same load on bare servers", "requests per second (higher is better)"),
    ):
        names = [name for name, _ in items][::-1]
        medians = [m.median for _, m in items][::-1]
        errors = [[m.median - m.lo for _, m in items][::-1], [m.hi - m.median for _, m in items][::-1]]
        colors = ["tab:orange" if name.startswith("supervisor") else "tab:gray" for name in names]
        ax.barh(names, medians, xerr=errors, color=colors, capsize=3)
        for y, (value, above) in enumerate(zip(medians, errors[1], strict=True)):
            ax.annotate(f"  {value:,.0f}", (value + above, y), va="center", fontsize="small")
        ax.margins(x=0.15)
        ax.set_title(title, fontsize="medium")
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
    floor = dict(servers).get(QUART_FLOOR_4)
    guard = inputs.scenarios.get("heartbeats_4_jobs")
    # The share the run held itself to (its own target's threshold), drawn against the floor it measured.
    share = next((t.threshold for t in guard[0].targets if t.key == "heartbeats_floor_share"), None) if guard else None
    if floor is not None and share is not None:
        axes[1].axvline(
            share * floor.median,
            color="tab:red",
            linestyle="--",
            linewidth=0.8,
            label=f"target: {share:g} x quart floor (ADR 0015)",
        )
        axes[1].legend(loc="lower right", fontsize="small")
    data = inputs.run.data
    fig.suptitle(
        f"make bench {day(data['date'])}{' · ' + data['label'] if data.get('label') else ''} · "
        f"{data.get('machine', {}).get('cpu', '?')}, nproc {data.get('machine', {}).get('nproc', '?')} · "
        f"supervisor/ at {str(data.get('revision', {}).get('supervisor', '?')).split()[0]} · median, bars min-max",
        fontsize="small",
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return None


def plot_block(plot: Path | None, page: Path, why_not: str | None) -> list[str]:
    if plot is None:
        return []
    rel = Path(_relpath(plot, page.parent))
    if why_not is None:
        return [f"![throughput against the peers, and heartbeats against bare servers]({rel})"]
    if plot.exists():
        return [
            f"![throughput against the peers, and heartbeats against bare servers]({rel})",
            "",
            f"_The plot was not redrawn by this rendering ({why_not}): its title names the run it shows._",
        ]
    return [f"_No plot: {why_not}._"]


def _relpath(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(path.resolve(), start.resolve())


# -- chaos and soak -----------------------------------------------------------------------------------------


def chaos_block(inputs: Inputs) -> list[str]:
    """The latest chaos run of each exec mode (files older than docker chaos runs name no mode: subprocess)."""
    if not inputs.chaos:
        return ["_No chaos results in the files rendered: run `make chaos`._"]
    latest: dict[tuple[str, int], Loaded] = {}
    for f in inputs.chaos:  # per mode, and per fleet size: a 3-host run is not the lone host's latest
        latest[(f.data.get("mode", "subprocess"), int(f.data.get("args", {}).get("hosts", 1) or 1))] = f
    lines: list[str] = []
    for mode, hosts in sorted(latest):
        if lines:
            lines.append("")
        lines += chaos_run_block(mode if hosts == 1 else f"{mode}, {hosts} hosts", latest[(mode, hosts)])
    return lines


def chaos_run_block(mode: str, f: Loaded) -> list[str]:
    d = f.data
    a = d.get("args", {})
    elapsed = f", {d['elapsed_s']:.1f} s" if d.get("elapsed_s") is not None else ""
    if "outside_job_kills" in d:
        what = (
            f"{d.get('rows')} jobs on {a.get('slots')} slots ({mode} mode), the supervisor SIGKILLed "
            f"{d.get('supervisor_kills')} times and restarted, running jobs SIGKILLed from outside "
            f"{d['outside_job_kills']} times and resubmitted {d.get('resubmits')} times (seed {a.get('seed')})"
        )
    else:
        what = (
            f"{a.get('jobs')} jobs on {a.get('slots')} slots, the supervisor SIGKILLed {a.get('kills')} times and "
            f"restarted (seed {a.get('seed')})"
        )
    lines = [
        f"_`tests/longrun/chaos.py`, {day(d['date'])}, {machine_text(d)}; {revision_text(d)}; "
        f"`bench/results/{f.path.name}`._",
        "",
        f"- {what}{elapsed}. Verdict: **{d.get('verdict', '?')}**.",
    ]
    if d.get("source", "measured") != "measured":
        lines[-1] += f" ({d['source']}.)"
    # The checks passed are counted, the others named (docs/reliability.md says what each check is).
    checks = d.get("checks", [])
    passed = [c for c in checks if c["verdict"] == "PASS"]
    lines += [f"- checks: {len(passed)} of {len(checks)} PASS"]
    lines += [f"- **{c['verdict']}**: {c['name']}" for c in checks if c["verdict"] != "PASS"]
    outcomes = d.get("outcomes", [])
    if outcomes:
        ended = ", ".join(f"{o['status']}{'/' + o['reason'] if o.get('reason') else ''} {o['count']}" for o in outcomes)
        lines.append(f"- rows ended: {ended}")
    if d.get("notes"):
        lines += ["", *[f"- {note}" for note in d["notes"]]]
    return lines


def soak_variant(d: dict[str, Any]) -> str:
    a = d.get("args", {})
    return f"{a.get('exec_mode', 'subprocess')} mode" + (", webhooks on" if a.get("webhook") else "")


def shown_soaks(soaks: list[Loaded]) -> list[Loaded]:
    """The latest soak of each kind, and the latest one-hour soak of a kind whose latest was shorter."""
    shown: list[Loaded] = []
    for variant in sorted({soak_variant(f.data) for f in soaks}):
        same = [f for f in soaks if soak_variant(f.data) == variant]
        shown.append(same[-1])
        hours = [f for f in same if f.data.get("args", {}).get("duration_s", 0) >= 3600]
        if hours and hours[-1] is not same[-1]:
            shown.append(hours[-1])
    return sorted(shown, key=lambda f: f.date, reverse=True)


def soak_block(inputs: Inputs, page: Path) -> list[str]:
    if not inputs.soak:
        return ["_No soak results in the files rendered: run `make soak`._"]
    lines = [
        "| date | run | code | workload | descriptors (not the registry's) | SQLite connections | threads | RSS "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    plots = []
    for f in shown_soaks(inputs.soak):
        d = f.data
        trends = {t["metric"]: t for t in d.get("trends", [])}
        w = d.get("workload", {})

        def move(metric: str, unit: str = "", trends: dict[str, Any] = trends) -> str:
            t = trends.get(metric) or (trends.get("fds") if metric == "other_fds" else None)
            if t is None:
                return "—"
            return f"{t['first']:g} → {t['last']:g}{unit} ({t['verdict']})"

        conns = trends.get("registry_conns")
        conns_text = f"max {conns['max']:g} (bound {conns['limit']:g}: {conns['verdict']})" if conns else "—"
        workload = (
            f"{w.get('jobs', '?')} jobs, {w.get('idle_gaps', '?')} idle gaps, {w.get('errors', '?')} errors"
            if w
            else "—"
        )
        minutes = d.get("args", {}).get("duration_s", 0) / 60
        lines.append(
            f"| {day(d['date'])} | {minutes:g} min, {soak_variant(d)} | {d.get('revision', {}).get('commit', '?')} "
            f"| {workload} | {move('other_fds')} | {conns_text} | {move('threads')} | {move('rss_mib', ' MiB')} "
            f"| **{d.get('verdict', '?')}** |"
        )
        plot = d.get("plot")
        if plot and (REPO / plot).exists():
            plots.append((f"{soak_variant(d)}, {minutes:g} min, {day(d['date'])}", REPO / plot))
    lines += [
        "",
        "Each figure is the median of the first quarter → the last quarter of the samples after the warm-up; a "
        "trend fails past its slack (descriptors 4, threads 3, RSS 16 MiB by default), the SQLite connections past "
        "the pool's size. Machines, sources and notes: the results files (`bench/results/*-soak.json`).",
    ]
    bullets = []
    for f in shown_soaks(inputs.soak):
        when = day(f.data["date"])
        if f.data.get("source", "measured") != "measured":
            bullets.append(f"{when}: {f.data['source']} (`bench/results/{f.path.name}`); {machine_text(f.data)}")
        bullets += [f"{when}: {note}" for note in f.data.get("notes", [])]
        bullets += [f"{when}: **{problem}**" for problem in f.data.get("problems", [])]
    if bullets:
        lines += ["", *[f"- {b}" for b in bullets]]
    for title, path in plots:
        lines += ["", f"![{title}]({_relpath(path, page.parent)})"]
    return lines


# -- before and after ---------------------------------------------------------------------------------------


def compare_block(before: Loaded, after: Loaded) -> list[str]:
    b, a = before.data, after.data
    name_b = b.get("label") or before.path.name
    name_a = a.get("label") or after.path.name
    lines = [
        f"**Before: {name_b}. After: {name_a}.** Each figure is a median (min-max); the ratio is after ÷ before "
        "of the medians (below 1: smaller; for a rate, higher is better).",
        "",
        "| | before | after |",
        "|---|---|---|",
        f"| date | {day(b['date'])} | {day(a['date'])} |",
        f"| machine | {machine_text(b)} | {machine_text(a)} |",
    ]
    pb, pa = b.get("machine", {}).get("speed_probe"), a.get("machine", {}).get("speed_probe")
    if pb and pa:
        lines.append(
            f"| speed probe (Python ms / spawn µs / hand-off µs) | {pb['python_ms']:.1f} / {pb['spawn_us']:.0f} / "
            f"{pb['handoff_us']:.1f} | {pa['python_ms']:.1f} / {pa['spawn_us']:.0f} / {pa['handoff_us']:.1f} |"
        )
    lines += [
        f"| code | {revision_text(b)} | {revision_text(a)} |",
        f"| results file | `{before.path.name}` | `{after.path.name}` |",
        "",
        "| scenario | figure | before | after | after ÷ before |",
        "|---|---|---:|---:|---:|",
    ]
    before_sections = {s.key: s for s in sections_of(b)}
    for section in sections_of(a):
        old = before_sections.get(section.key)
        if old is None:
            continue
        for table in section.tables:
            old_table = old.get_table(table.key)
            if old_table is None:
                continue
            label_col = table.columns[0].key
            for row in table.rows:
                old_row = old_table.row(row.key)
                if old_row is None:
                    continue
                for col in table.columns:
                    new_cell, old_cell = row.cells.get(col.key), old_row.cells.get(col.key)
                    if not isinstance(new_cell, Measure | Value) or not isinstance(old_cell, Measure | Value):
                        continue
                    what = f"{fmt_cell(row.cells.get(label_col))} — {col.label}" if col.key != label_col else col.label
                    ratio = _ratio(old_cell, new_cell)
                    lines.append(f"| {section.key} | {what} | {old_cell.fmt()} | {new_cell.fmt()} | {ratio} |")
        for key, (label, m) in section.figures.items():
            if key in old.figures:
                o = old.figures[key][1]
                lines.append(f"| {section.key} | {label} | {o.fmt()} | {m.fmt()} | {_ratio(o, m)} |")
    differ = []
    for section in sections_of(a):
        old = before_sections.get(section.key)
        if old is not None:
            keys = sorted(k for k in {*old.params, *section.params} if old.params.get(k) != section.params.get(k))
            if keys:
                differ.append(f"{section.key} ({', '.join(keys)})")
    if differ:
        lines += ["", f"_Measured with other parameters in the two runs, so compare with care: {'; '.join(differ)}._"]
    targets_b = {(s.key, t.key): t for s in sections_of(b) for t in s.targets}
    rows = []
    for s in sections_of(a):
        for t in s.targets:
            old_t = targets_b.get((s.key, t.key))
            if old_t is not None:
                rows.append(f"| {s.key} | {t.key} | {old_t.verdict}: {old_t.text} | {t.verdict}: {t.text} |")
    if rows:
        lines += ["", "| scenario | target | before | after |", "|---|---|---|---|", *rows]
    return lines


def _ratio(before: Measure | Value, after: Measure | Value) -> str:
    if not before.median or math.isnan(before.median) or math.isnan(after.median):
        return "—"
    return f"{after.median / before.median:.2f}"


# -- the page -----------------------------------------------------------------------------------------------


def _results_file(name: str, results_dir: Path) -> Path:
    """``name`` in ``results_dir``, else in the repository's ``bench/results/``; a missing one is an error."""
    for directory in (results_dir, RESULTS_DIR):
        if (directory / name).is_file():
            return directory / name
    raise FileNotFoundError(f"results file {name} is in neither {results_dir} nor {RESULTS_DIR}")


def render(
    inputs: Inputs,
    template: str,
    *,
    page: Path,
    plot: Path | None,
    plot_why_not: str | None,
    results_dir: Path,
) -> str:
    out: list[str] = []
    for line in template.splitlines():
        match = PLACEHOLDER.match(line.strip())
        if match is None:
            out.append(line)
            continue
        name, arg = match.group(1), (match.group(2) or "").strip()
        if name == "generated":
            names = ", ".join(f"bench/results/{f.path.name}" for f in inputs.files) or "no results file"
            out.append(
                "<!-- Generated by bench/report.py from bench/performance.template.md and the results files "
                f"({names}). Edit the template, not this page: `make bench` renders it again. -->"
            )
        elif name == "summary":
            out += summary_block(inputs)
        elif name == "run":
            out += run_block(inputs)
        elif name == "targets":
            out += targets_block(inputs)
        elif name == "plot":
            out += plot_block(plot, page, plot_why_not)
        elif name == "scenario":
            out += scenario_block(inputs, arg)
        elif name == "chaos":
            out += chaos_block(inputs)
        elif name == "soak":
            out += soak_block(inputs, page)
        elif name == "compare":
            # Names in the results directory; the repository's own results files too, so that a page rendered from
            # other results (a smoke run's) keeps the before/after table the template holds.
            before, after = (_results_file(part.strip(), results_dir) for part in arg.split(":"))
            out += compare_block(Loaded(before, read_json(before)), Loaded(after, read_json(after)))
        else:
            raise ValueError(f"unknown placeholder {line.strip()!r} in the template")
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help="results files (default: the latest of --results-dir)")
    parser.add_argument("--out", type=Path, default=None, help=f"the page (default {PAGE.relative_to(REPO)})")
    parser.add_argument("--template", type=Path, default=TEMPLATE)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--plot", type=Path, default=None, help=f"the PNG (default: img/{PLOT_NAME} beside the page)")
    parser.add_argument("--no-plot", action="store_true", help="neither draw nor show the plot")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="a before/after section")
    args = parser.parse_args(argv)

    if args.compare:
        before, after = (Loaded(p, read_json(p)) for p in args.compare)
        text = "\n".join(["## Before and after", "", *compare_block(before, after)]) + "\n"
        if args.out is None:
            print(text, end="")
        else:
            args.out.write_text(text)
            print(f"wrote {args.out}")
        return 0

    files = args.files or default_files(args.results_dir)
    if not files:
        parser.error(f"no results file named, and none in {args.results_dir}")
    inputs = load(files)
    page: Path = args.out or PAGE
    plot: Path | None = None if args.no_plot else (args.plot or page.parent / "img" / PLOT_NAME)
    why_not = None if plot is None else draw_plot(inputs, plot)
    if why_not is not None:
        print(f"plot not drawn: {why_not}", file=sys.stderr)
    text = render(
        inputs,
        args.template.read_text(encoding="utf-8"),
        page=page,
        plot=plot,
        plot_why_not=why_not,
        results_dir=args.results_dir,
    )
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text, encoding="utf-8")
    print(f"wrote {page}" + (f" and {plot}" if plot is not None and why_not is None else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
