"""Job kinds: validated params, whole-element placeholders, and kinds-file errors that name the problem."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor import KindsFileError, ValidationError, load_kinds

SLEEP = """
[kinds.sleep]
argv = ["{python}", "-c", "import sys, threading; threading.Event().wait(float(sys.argv[1]))", "{seconds}"]
params = { seconds = "float" }
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kinds.toml"
    path.write_text(text)
    return path


def test_builtin_kinds() -> None:
    catalog = load_kinds(None)
    assert catalog.names() == ["enrichment", "pipeline"]
    assert catalog.get("pipeline").then == "enrichment"
    assert catalog.get("enrichment").coalesce
    assert catalog.get("pipeline").exit_reasons[10] == "budget_exhausted"
    assert catalog.get("pipeline").failure_reasons[3] == "all_feeds_failed"


def test_placeholders_are_replaced_whole(tmp_path: Path) -> None:
    kind = load_kinds(_write(tmp_path, SLEEP)).get("sleep")
    params = kind.validate_params({"seconds": "1.5"})
    assert params == {"seconds": 1.5}
    argv = kind.render_argv(params)
    assert argv[0] == sys.executable
    assert argv[-1] == "1.5"


def test_a_value_with_spaces_stays_one_argument(tmp_path: Path) -> None:
    text = '[kinds.echo]\nargv = ["echo", "{msg}"]\nparams = { msg = "str" }\n'
    kind = load_kinds(_write(tmp_path, text)).get("echo")
    assert kind.render_argv(kind.validate_params({"msg": "a b; rm -rf /"})) == ["echo", "a b; rm -rf /"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "params.seconds"),
        ({"seconds": 1, "extra": 2}, "params.extra"),
        ({"seconds": "soon"}, "params.seconds"),
        ({"seconds": True}, "params.seconds"),
        ({"seconds": float("nan")}, "params.seconds"),
        ([1], "params"),
    ],
)
def test_bad_params_name_the_field(tmp_path: Path, params: object, field: str) -> None:
    kind = load_kinds(_write(tmp_path, SLEEP)).get("sleep")
    with pytest.raises(ValidationError) as err:
        kind.validate_params(params)
    assert err.value.field == field


def test_str_params_cannot_smuggle_an_option() -> None:
    kind = load_kinds(None).get("pipeline")
    with pytest.raises(ValidationError) as err:
        kind.validate_params({"feed": "--help", "max_episodes": 1})
    assert err.value.field == "params.feed"


def test_unknown_kind_names_the_field() -> None:
    with pytest.raises(ValidationError) as err:
        load_kinds(None).get("rm")
    assert err.value.field == "kind"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[kinds.x]\nargv = ["echo", "--n={n}"]\nparams = { n = "int" }\n', "whole argv element"),
        ('[kinds.x]\nargv = ["echo", "{n}"]\n', "names no declared param"),
        ('[kinds.x]\nargv = ["echo"]\nparams = { n = "decimal" }\n', "has type 'decimal'"),
        ("[kinds.x]\nargv = []\n", "argv must be a non-empty list"),
        ('[kinds.x]\nargv = ["echo"]\nthen = "nothing"\n', "names no known kind"),
        ('[kinds.x]\nargv = ["echo"]\ncoalesse = true\n', "unknown key 'coalesse'"),
        ("[kinds.x\n", "not valid TOML"),
        ("[other]\nx = 1\n", "unknown top-level key"),
    ],
)
def test_kinds_file_errors_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(KindsFileError, match=message):
        load_kinds(_write(tmp_path, text))


def test_missing_kinds_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KindsFileError, match="cannot read"):
        load_kinds(tmp_path / "absent.toml")
