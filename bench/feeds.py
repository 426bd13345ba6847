"""Feed parsing benchmark: a generated 20 MB feed of 10,000 items, and 100 small feeds.

Usage: make bench   (or .venv/bin/python bench/feeds.py [--runs N] [--no-write] [--smoke] [--compare])

What is measured, and how:
- parse time: wall-clock seconds of ``parse_feed`` on a document already in memory (fetching is not
  measured), median of ``--runs`` runs (default 5, at least 3) with min-max;
- extra memory: the peak resident set size during the parses minus the resident size just before
  them (the document itself already loaded), in a fresh child process per data set, so earlier work
  cannot hide a peak; and, in another child, the tracemalloc peak of Python allocations (tracemalloc
  slows the parse, so it is never timed).

Target (ADR 0003): the 20 MB feed parsed in under 2 s with under 200 MB extra memory. The results are added to
the results file named by ``--results`` (``make bench`` names its run's; alone: bench/results/<UTC date>-feeds.json)
unless ``--no-write``; bench/report.py renders them. ``--smoke`` runs tiny data sets and writes nothing unless
``--results`` names a file (the test suite runs it so this script cannot rot). ``--compare`` also measures
podcastparser and feedparser when they are importable (they are not dependencies: install
them into a scratch venv) and checks them against tests/runner/feeds/expected.json; see
docs/adr/0003-feed-parsing.md.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline_runner import parse_feed  # noqa: E402

TARGET_S = 2.0
TARGET_EXTRA_MB = 200.0
_WORDS = [
    *("the", "of", "and", "a", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are", "as", "with"),
    *("his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "word", "but", "not", "what"),
    *("all", "were", "we", "when", "your", "can", "said", "there", "use", "an", "each", "which", "she", "do", "how"),
    *("their", "if", "will", "up", "other", "about", "out", "many", "then", "them", "these", "so", "some", "her"),
]


# -- the data sets ----------------------------------------------------------------------------------


def generate_feed(items: int, target_bytes: int, seed: int = 13) -> bytes:
    """A deterministic RSS 2.0 podcast feed shaped like real ones: iTunes tags, HTML show notes twice."""
    rnd = random.Random(seed)
    head = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<rss version="2.0" '
        'xmlns:itunes="http://www.itunes.com/dtds/podcast-1.0.dtd" '
        'xmlns:content="http://purl.org/rss/1.0/modules/content/" xmlns:atom="http://www.w3.org/2005/Atom">\n'
        "<channel>\n<title>Generated Show</title>\n<link>https://show.example.org/</link>\n"
        '<atom:link href="https://feeds.example.org/show.xml" rel="self" type="application/rss+xml"/>\n'
        "<description>A feed generated for the benchmark.</description>\n<itunes:author>Bench</itunes:author>\n"
    )
    tail = "</channel>\n</rss>\n"
    per_item = max(600, (target_bytes - len(head) - len(tail)) // items)
    parts = [head]
    for i in range(items):
        title = " ".join(rnd.choices(_WORDS, k=6)).capitalize()
        core = (
            f"<item>\n<title>{i}: {title} &amp; more</title>\n"
            f'<guid isPermaLink="false">bench-{i:07d}</guid>\n<link>https://show.example.org/episodes/{i}</link>\n'
            f"<pubDate>{_rfc822(i)}</pubDate>\n"
            f"<itunes:duration>{i % 3}:{i % 60:02d}:{(i * 7) % 60:02d}</itunes:duration>\n"
            f"<itunes:episode>{i + 1}</itunes:episode>\n<itunes:explicit>false</itunes:explicit>\n"
            f'<enclosure url="https://media.example.org/show/{i}.mp3" length="{20_000_000 + i}" type="audio/mpeg"/>\n'
        )
        budget = max(0, (per_item - len(core) - 120) // 2)
        text = " ".join(rnd.choices(_WORDS, k=budget // 4 + 1))[:budget]
        parts.append(
            core + f"<description><![CDATA[<p>{text}</p>]]></description>\n"
            f"<content:encoded>&lt;p&gt;{text}&lt;/p&gt;</content:encoded>\n</item>\n"
        )
    parts.append(tail)
    return "".join(parts).encode("utf-8")


def _rfc822(i: int) -> str:
    day = datetime(2010, 1, 1, tzinfo=UTC).timestamp() + i * 86400
    return datetime.fromtimestamp(day, UTC).strftime("%a, %d %b %Y %H:%M:%S +0000")


def generate_flood(target_bytes: int) -> bytes:
    """The worst shape within the size cap: minimal guid-less items, as many as fit (the reader keeps 25,000)."""
    parts, size, i = [b'<rss version="2.0"><channel><title>flood</title>'], 60, 0
    while size < target_bytes:
        parts.append(b'<item><enclosure url="https://media.example.org/f/%d.mp3"/></item>' % i)
        size += len(parts[-1])
        i += 1
    parts.append(b"</channel></rss>")
    return b"".join(parts)


def data_sets(smoke: bool) -> dict[str, list[bytes]]:
    if smoke:
        return {"big": [generate_feed(200, 400_000)], "small": [generate_feed(20, 40_000, seed=s) for s in range(5)]}
    return {
        "big": [generate_feed(10_000, 20_000_000)],
        "small": [generate_feed(50, 100_000, seed=s) for s in range(100)],
        "flood": [generate_flood(20_000_000)],
    }


_LABELS = {"big": "20 MB, 10,000 items", "flood": "20 MB of minimal items (worst case)"}


# -- the measurement (in a child process) -----------------------------------------------------------


def _status_bytes(field: str) -> int:
    """VmRSS (resident now) or VmHWM (peak resident) of this process, from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def _reset_peak() -> None:
    """Make VmHWM the current RSS (Linux >= 4.0), so reading the documents cannot hide the parse's peak."""
    Path("/proc/self/clear_refs").write_text("5")


def _parser(name: str) -> Callable[[str, bytes], int]:
    """A function parsing one document and returning its episode count, for ``name``."""
    if name == "pipeline_runner":
        return lambda url, doc: len(parse_feed(url, doc).episodes)
    if name == "podcastparser":
        import podcastparser

        return lambda url, doc: len(podcastparser.parse(url, io.BytesIO(doc))["episodes"])
    if name == "feedparser":
        import feedparser

        return lambda url, doc: len(feedparser.parse(io.BytesIO(doc)).entries)
    raise ValueError(name)


def child(parser: str, paths: Sequence[str], runs: int, trace: bool) -> dict[str, Any]:
    documents = [Path(p).read_bytes() for p in paths]
    parse = _parser(parser)
    _reset_peak()
    before = _status_bytes("VmRSS")
    if trace:
        tracemalloc.start()
    times, episodes = [], 0
    for _ in range(1 if trace else runs):
        t0 = time.perf_counter()
        episodes = sum(parse(f"https://feeds.example.org/{i}.xml", doc) for i, doc in enumerate(documents))
        times.append(time.perf_counter() - t0)
    result: dict[str, Any] = {"episodes": episodes, "bytes": sum(map(len, documents))}
    if trace:
        result["traced_peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
    else:
        result |= {"times_s": times, "extra_rss_mb": max(0, _status_bytes("VmHWM") - before) / 1e6}
    return result


def measure(parser: str, documents: list[bytes], runs: int, trace: bool, tmp: Path) -> dict[str, Any]:
    paths = []
    for i, doc in enumerate(documents):
        path = tmp / f"feed-{i}.xml"
        if not path.exists():
            path.write_bytes(doc)
        paths.append(str(path))
    spec = json.dumps({"parser": parser, "paths": paths, "runs": runs, "trace": trace})
    out = subprocess.run(
        [sys.executable, __file__, "--child", spec], check=True, capture_output=True, text=True, timeout=900
    )
    result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return result


def bench(parser: str, sets: dict[str, list[bytes]], runs: int, trace: bool) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name, documents in sets.items():
        with tempfile.TemporaryDirectory() as tmp:
            result = measure(parser, documents, runs, trace=False, tmp=Path(tmp))
            if trace:
                result |= measure(parser, documents, 1, trace=True, tmp=Path(tmp))
        result["feeds"] = len(documents)
        results[name] = result
    return results


# -- reporting --------------------------------------------------------------------------------------


def summary(result: dict[str, Any]) -> str:
    times = result["times_s"]
    traced = f", tracemalloc peak {result['traced_peak_mb']:.1f} MB" if "traced_peak_mb" in result else ""
    return (
        f"{result['feeds']} feed(s), {result['bytes'] / 1e6:.1f} MB, {result['episodes']} episodes: "
        f"median {statistics.median(times):.3f} s (min {min(times):.3f}, max {max(times):.3f}, {len(times)} runs), "
        f"extra RSS {result['extra_rss_mb']:.1f} MB{traced}"
    )


def verdict(big: dict[str, Any]) -> str:
    ok = statistics.median(big["times_s"]) < TARGET_S and big["extra_rss_mb"] < TARGET_EXTRA_MB
    return "PASS" if ok else "FAIL"


Results = dict[str, dict[str, Any]]


def section(results: Results, others: dict[str, Results], runs: int, smoke: bool = False) -> Any:
    """The results as a scenario of the results file (bench/results.py), the table derived from it."""
    sys.path.insert(0, str(REPO / "bench"))
    from results import Column, Measure, Section, Value  # only here: the --child processes import nothing more

    out = Section(
        "Feed parsing: parse_feed on documents in memory",
        key="feeds",
        script="bench/feeds.py",
        params={"runs": runs, "parsers": ["pipeline_runner", *others], "smoke": smoke},
    )
    table = out.table(
        "feeds",
        [
            Column("data_set", "data set", "left"),
            Column("parser", "parser", "left"),
            Column("time", "median (min-max)"),
            Column("extra_rss", "extra RSS"),
            Column("traced_peak", "tracemalloc peak"),
        ],
    )
    for parser, per_set in {"pipeline_runner": results, **others}.items():
        for name, r in per_set.items():
            label = _LABELS.get(name, f"{r['feeds']} small feeds ({r['bytes'] / 1e6:.1f} MB)")
            if smoke:
                label = f"{name}: {r['feeds']} feed(s) ({r['bytes'] / 1e6:.1f} MB)"
            table.add(
                f"{name}:{parser}",
                label,
                parser,
                Measure.of(r["times_s"], "s"),
                Value(r["extra_rss_mb"], "MB", 1),
                Value(r["traced_peak_mb"], "MB", 1) if "traced_peak_mb" in r else "—",
            )
    big = results["big"]
    median_s = statistics.median(big["times_s"])
    out.target(
        median_s < TARGET_S,
        f"{_LABELS['big']} feed parsed in {median_s:.2f} s (target < {TARGET_S:.0f} s)",
        key="big_feed_time",
        value=median_s,
        op="<",
        threshold=TARGET_S,
        unit="s",
    )
    out.target(
        big["extra_rss_mb"] < TARGET_EXTRA_MB,
        f"{_LABELS['big']} feed: {big['extra_rss_mb']:.1f} MB extra memory (target < {TARGET_EXTRA_MB:.0f} MB)",
        key="big_feed_memory",
        value=big["extra_rss_mb"],
        op="<",
        threshold=TARGET_EXTRA_MB,
        unit="MB",
    )
    out.notes.append(
        "extra RSS = peak resident size during the parses minus the size before them, in a fresh process; the "
        "tracemalloc peak is Python's allocations, in another (never timed)"
    )
    return out


def write(results: Results, others: dict[str, Results], runs: int, path: Path, smoke: bool = False) -> None:
    """Add the scenario to the results file at ``path`` (made, with the machine and versions, when missing)."""
    sys.path.insert(0, str(REPO / "bench"))
    from _common import git_revision, machine, versions
    from results import add_sections, run_header

    header = run_header("feeds", label=None, smoke=smoke, runs=runs)
    header.update(machine=machine(), versions=versions(), revision=git_revision())
    add_sections(path, [section(results, others, runs, smoke)], header)
    print(f"results: {path}")


# -- the fixture comparison (--compare) -------------------------------------------------------------


def compare_fixtures(parser: str) -> dict[str, int]:
    """How a library's output matches tests/runner/feeds/expected.json (same enclosure choice for all)."""
    from pipeline_runner._feed_values import declared_type, guess_type, media_class, parse_duration_s

    logging.disable(logging.WARNING)  # the libraries log every undeclared prefix and odd date

    def choose(candidates: list[tuple[str | None, str | None]]) -> str | None:
        for wanted in ("audio", "video", "unknown"):
            for url, kind in candidates:
                if url and media_class(declared_type(kind) or guess_type(url)) == wanted:
                    return url
        return None

    def read(name: str, doc: bytes) -> list[dict[str, Any]]:
        url = expected["base"] + name
        if parser == "podcastparser":
            import podcastparser

            return [
                {
                    "identity": e.get("guid"),
                    "title": e.get("title"),
                    "enclosure_url": choose([(x["url"], x["mime_type"]) for x in e["enclosures"]]),
                    "duration_s": float(e["total_time"]) if e.get("total_time") else None,
                }
                for e in podcastparser.parse(url, io.BytesIO(doc))["episodes"]
            ]
        import feedparser

        parsed = feedparser.parse(io.BytesIO(doc), response_headers={"content-location": url})
        found = []
        for e in parsed.entries:
            links = [(x.get("href"), x.get("type")) for x in e.get("links", []) if x.get("rel") == "enclosure"]
            media = [(x.get("url"), x.get("type")) for x in e.get("media_content", [])]
            enclosure = choose(links + media)
            if enclosure is not None:
                found.append(
                    {
                        "identity": e.get("id"),
                        "title": e.get("title"),
                        "enclosure_url": enclosure,
                        "duration_s": parse_duration_s(e.get("itunes_duration")),
                    }
                )
        return found

    feeds_dir = REPO / "tests" / "runner" / "feeds"
    expected = json.loads((feeds_dir / "expected.json").read_text(encoding="utf-8"))
    fields = ("feeds_rejected", "episodes", "found", "same_identity", "title", "url", "duration", "extra")
    score = dict.fromkeys(fields, 0)
    for name, spec in expected["feeds"].items():
        wanted = spec["episodes"]
        score["episodes"] += len(wanted)
        try:
            got = read(name, (feeds_dir / name).read_bytes())
        except Exception:
            score["feeds_rejected"] += 1
            continue
        for want in wanted:
            same = [g for g in got if g["identity"] == want["identity"]]
            # A library may turn a GUID into a URL (isPermaLink) or derive another identity: match on the file.
            near = same or [g for g in got if g["enclosure_url"] == want["enclosure_url"]]
            if not near:
                continue
            g = near[0]
            score["found"] += 1
            score["same_identity"] += bool(same)
            score["title"] += g["title"] == want["title"]
            score["url"] += g["enclosure_url"] == want["enclosure_url"]
            score["duration"] += g["duration_s"] == want["duration_s"]
        score["extra"] += max(0, len(got) - len(wanted))
    return score


# -- main -------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per data set (at least 3)")
    parser.add_argument("--no-write", action="store_true", help="print only; write no results file")
    parser.add_argument(
        "--results",
        type=Path,
        help="add the results to this file (`make bench`: its run's file; default bench/results/<UTC date>-feeds.json)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny data sets, no targets, no writing (for tests)")
    parser.add_argument("--compare", action="store_true", help="also podcastparser and feedparser, if importable")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(child(spec["parser"], spec["paths"], spec["runs"], spec["trace"])))
        return 0
    runs = max(3, args.runs)
    sets = data_sets(args.smoke)
    results = bench("pipeline_runner", sets, runs, trace=not args.smoke)
    for name, result in results.items():
        print(f"pipeline_runner  {name:5}  {summary(result)}")
    others: dict[str, dict[str, dict[str, Any]]] = {}
    if args.compare:
        for library in ("podcastparser", "feedparser"):
            try:
                __import__(library)
            except ImportError:
                print(f"{library}: not installed; skipped")
                continue
            # Not the flood: the libraries have no item bound and would take minutes on it.
            compared = {name: documents for name, documents in sets.items() if name != "flood"}
            others[library] = bench(library, compared, runs, trace=not args.smoke)
            for name, result in others[library].items():
                print(f"{library:16} {name:5}  {summary(result)}")
            print(f"{library:16} fixtures  {compare_fixtures(library)}")
    if args.smoke:
        if args.results is not None and not args.no_write:  # the smoke test of `make bench`'s results file
            write(results, others, runs, args.results, smoke=True)
        return 0
    print(f"20 MB feed: {verdict(results['big'])} (target < {TARGET_S} s, < {TARGET_EXTRA_MB:.0f} MB extra)")
    if not args.no_write:
        sys.path.insert(0, str(REPO / "bench"))
        from results import default_path

        write(results, others, runs, args.results or default_path("feeds"))
    return 0 if verdict(results["big"]) == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
