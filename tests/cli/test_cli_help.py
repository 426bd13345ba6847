"""The CLI's help, version and shell completion, as an operator meets them."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cli import EXIT_OK, main
from supervisor.domain import RELEASE

REPO_ROOT = Path(__file__).resolve().parents[2]
# Every help the command prints, word for word, at a fixed width: a change to a verb, a flag or a help text shows in
# this file's diff. Written again by `python tests/cli/test_cli_help.py` after a change meant to show.
HELP_TEXTS = Path(__file__).with_name("help_texts.txt")
HELP_COLUMNS = "100"
VERBS = [
    "serve",
    "check-config",
    "enqueue",
    "jobs",
    "show",
    "cancel",
    "reconcile",
    "queue",
    "pause",
    "resume",
    "logs",
    "events",
    "wait",
    "completion",
    "token",
    "migrate",
    "retry",
    "prune",
    "hosts",
]


def run_main(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        code = main(list(argv), environ={}, stdout=out, stderr=io.StringIO())
    except SystemExit as exc:  # argparse's --help and --version
        code = int(exc.code or 0)
    return code, out.getvalue()


def help_texts() -> str:
    """``supervisor --help`` and each verb's ``--help``, in the order the command lists its verbs (COLUMNS set by the
    caller), and the version of Python whose argparse laid them out."""
    texts = [f"python {sys.version_info.major}.{sys.version_info.minor}\n"]
    for argv in ([], *([verb] for verb in listed_verbs())):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            main([*argv, "--help"], environ={})
        texts.append(f"== supervisor {' '.join([*argv, '--help'])}\n{out.getvalue()}")
    return "\n".join(texts)


def listed_verbs() -> list[str]:
    """The verbs ``supervisor --help`` lists, in its order."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"], environ={})
    found = re.search(r"\{([a-z,-]+)\}", out.getvalue())
    assert found is not None, out.getvalue()
    return found.group(1).split(",")


def test_every_verb_is_one_the_tests_know() -> None:
    assert sorted(listed_verbs()) == sorted(VERBS)


def test_every_help_reads_word_for_word_as_held(monkeypatch: pytest.MonkeyPatch) -> None:
    held = HELP_TEXTS.read_text()
    written_with = held.split("\n", 1)[0]
    if written_with != f"python {sys.version_info.major}.{sys.version_info.minor}":
        pytest.skip(f"argparse lays help out differently in another Python release than {written_with}'s")
    monkeypatch.setenv("COLUMNS", HELP_COLUMNS)
    assert help_texts() == held


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_s_help_ends_with_an_example(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([verb, "--help"], environ={})
    assert exited.value.code == 0
    text = capsys.readouterr().out
    example = text.split("example:\n", 1)[1]
    assert f"supervisor {verb}" in example or "supervisor --config" in example, text


def test_the_help_reads_as_plain_words(capsys: pytest.CaptureFixture[str]) -> None:
    """No reStructuredText literals, Markdown code spans or the code's own module names in any help (ADR 0017)."""
    texts = []
    for argv in ([], *([verb] for verb in VERBS)):
        with pytest.raises(SystemExit):
            main([*argv, "--help"], environ={})
        texts.append(capsys.readouterr().out)
    for text in texts:
        assert "``" not in text and "`" not in text, text
        assert not re.search(r"(?<![/\w])_[a-z]+\b|supervisor\.(?!toml)[a-z]", text), text
    # The top's paragraphs stay paragraphs: the exit codes start their own.
    assert "\nExit codes: 0 done" in texts[0]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"], environ={})
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"supervisor {RELEASE}\n"


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_prints_a_script_for_the_shell(shell: str) -> None:
    code, script = run_main("completion", shell)
    assert code == EXIT_OK
    assert "_python_argcomplete" in script and "supervisor" in script


def test_completion_completes_verbs_and_options_of_the_real_command(tmp_path: Path) -> None:
    """What the shell's completion function does: run the command with argcomplete's variables; read its answer."""
    line = "supervisor wa"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")},
        "PYTHONPATH": str(REPO_ROOT),
        "_ARGCOMPLETE": "1",
        "_ARGCOMPLETE_IFS": "\n",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(tmp_path / "completions"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "supervisor"], env=env, capture_output=True, timeout=60, check=False, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "completions").read_text().split("\n") == ["wait "]


def test_a_reader_that_goes_away_ends_the_command_quietly_with_141() -> None:
    """``supervisor ... | head -1``: before, a BrokenPipeError traceback on stderr; now exit 141 and nothing said."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")}, "PYTHONPATH": str(REPO_ROOT)}
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        done = subprocess.run(
            [sys.executable, "-m", "supervisor", "check-config", "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == b"", done.stderr.decode()
    assert done.returncode == 141


def test_check_config_warns_of_an_own_kind_that_a_reboot_fails_or_nothing_would_notice_hang(tmp_path: Path) -> None:
    kinds = tmp_path / "kinds.toml"
    kinds.write_text(
        '[kinds.fragile]\nargv = ["true"]\n'  # one attempt, no deadline, no heartbeats: both warnings
        '[kinds.half]\nargv = ["true"]\nmax_attempts = 3\nheartbeats = true\n'  # resubmits, but not on 137/143
        '[kinds.safe]\nargv = ["true"]\nmax_attempts = 3\nretry_on_exit_codes = [137, 143]\ndeadline_seconds = 60\n'
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PODCAST_")},
        "PYTHONPATH": str(REPO_ROOT),
        "PODCAST_JOB_KINDS_FILE": str(kinds),
        "PODCAST_JOB_DATA_DIR": str(tmp_path / "data"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "check-config"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning: kind")]
    assert [line.split("'")[1] for line in warned] == ["fragile", "fragile", "half"]
    assert "max_attempts = 1" in warned[0] and "deadline_seconds" in warned[1] and "137 and 143" in warned[2]


if __name__ == "__main__":
    os.environ["COLUMNS"] = HELP_COLUMNS
    HELP_TEXTS.write_text(help_texts())
