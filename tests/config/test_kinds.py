"""Job kinds: validated params (optional ones filled with their defaults), whole-element placeholders, and kinds-file
errors that name the kind and the problem."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor import KindsFileError, ValidationError, load_kinds
from supervisor.domain import JobKind, coalesce_key

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


def test_both_runner_kinds_are_resubmitted_on_a_transient_failure_or_an_outside_kill_polite_or_not() -> None:
    catalog = load_kinds(None)
    pipeline, enrichment = catalog.get("pipeline"), catalog.get("enrichment")
    assert (pipeline.max_attempts, pipeline.retry_on_exit_codes) == (3, frozenset({75, 137, 143}))
    assert (pipeline.retry_backoff_s, pipeline.retry_backoff_max_s) == (60.0, 3600.0)
    assert (enrichment.max_attempts, enrichment.retry_on_exit_codes) == (3, frozenset({75, 137, 143}))
    assert pipeline.failure_reasons[143] == enrichment.failure_reasons[143] == "terminated"
    # Its last attempt runs without an episode that killed the earlier ones: the memo's threshold is one below.
    argv = pipeline.render_argv(pipeline.validate_params({"feed": "https://e.org/f"}))
    assert argv[-2:] == ["--poison-threshold", str(pipeline.max_attempts - 1)]
    assert pipeline.failure_reasons[75] == "all_feeds_unavailable"


def test_the_pipeline_runs_every_episode_unless_told_otherwise() -> None:
    pipeline = load_kinds(None).get("pipeline")
    params = pipeline.validate_params({"feed": "https://example.org/feed.xml"})
    assert params == {"feed": "https://example.org/feed.xml", "max_episodes": 0}
    assert pipeline.render_argv(params)[-4:-2] == ["--max-episodes", "0"]
    assert pipeline.validate_params({"feed": "http://f", "max_episodes": "3"})["max_episodes"] == 3
    with pytest.raises(ValidationError) as err:
        pipeline.validate_params({"max_episodes": 3})
    assert err.value.field == "params.feed"


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


# -- braces in argv: a whole element {name} is a placeholder, {{ and }} are literal braces, the rest as written ----


def _kind_of(tmp_path: Path, argv: list[str], params: str = "{}") -> JobKind:
    # json.dumps of a list of ASCII strings is a valid TOML array.
    return load_kinds(_write(tmp_path, f"[kinds.x]\nargv = {json.dumps(argv)}\nparams = {params}\n")).get("x")


def test_shell_code_with_braces_is_declared_and_run_as_written(tmp_path: Path) -> None:
    kind = _kind_of(tmp_path, ["sh", "-c", "echo ${HOME}"])
    argv = kind.render_argv(kind.validate_params({}))
    assert argv == ["sh", "-c", "echo ${HOME}"]
    done = subprocess.run(argv, capture_output=True, text=True, env={"HOME": "/home/q"}, timeout=30, check=True)
    assert done.stdout == "/home/q\n"


def test_a_python_f_string_is_declared_and_run_as_written(tmp_path: Path) -> None:
    code = "import sys; n = int(sys.argv[1]); print(f'{n} x {n!r} = {n * n:>4}')"
    kind = _kind_of(tmp_path, ["{python}", "-c", code, "{n}"], '{ n = "int" }')
    argv = kind.render_argv(kind.validate_params({"n": 3}))
    assert argv == [sys.executable, "-c", code, "3"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout == "3 x 3 =    9\n"


@pytest.mark.parametrize(
    ("element", "rendered"),
    [
        ("{{x}}", "{x}"),  # a whole element that must literally be {x}
        ("{{python}}", "{python}"),
        ("{{n}}", "{n}"),  # n is a declared param: doubled, it is text
        ("a{{b}}c", "a{b}c"),
        ("{{{{", "{{"),
        ("}}{{", "}{"),
        ("{{{x}}}", "{{x}}"),  # {{ then a lone { ... }} then a lone }: each lone brace kept
        ("--n={n}", "--n={n}"),  # not a placeholder: part of a longer element, kept as written
        ("{}", "{}"),  # find -exec's {} and xargs -I{}: kept
        ("{ n }", "{ n }"),
        ("{1x}", "{1x}"),
        ("${a:-${b}}", "${a:-${b}"),  # its }} is a literal }: such code must double its braces again
        ("${a:-${b}}}}", "${a:-${b}}"),
    ],
)
def test_doubled_braces_are_one_literal_brace_and_other_brace_text_is_kept(
    tmp_path: Path, element: str, rendered: str
) -> None:
    kind = _kind_of(tmp_path, ["echo", element, "{n}"], '{ n = "int" }')
    assert kind.argv == ("echo", element, "{n}")  # the kind keeps the element as declared
    assert kind.render_argv(kind.validate_params({"n": 7})) == ["echo", rendered, "7"]


@pytest.mark.parametrize("element", ["{n}", "{python3}", "{HOME}", "{seconds}"])
def test_a_whole_element_placeholder_naming_no_param_is_refused_naming_kind_and_element(
    tmp_path: Path, element: str
) -> None:
    with pytest.raises(KindsFileError) as err:
        _kind_of(tmp_path, ["echo", "--x", element], '{ secs = "float" }')
    name = element[1:-1]
    assert f"kind 'x': argv element '{element}' is a placeholder that names no declared param" in str(err.value)
    assert f"write '{{{{{name}}}}}' for the literal text {element}" in str(err.value)


def test_python_is_a_placeholder_only_as_a_whole_element(tmp_path: Path) -> None:
    kind = _kind_of(tmp_path, ["{python}", "-c", "pass", "x{python}"])
    assert kind.render_argv({}, python="/usr/bin/python3") == ["/usr/bin/python3", "-c", "pass", "x{python}"]


# -- optional params with defaults -----------------------------------------------------------------------------

FETCH = """
[kinds.fetch]
argv = ["fetch", "{feed}", "{limit}", "{ratio}", "{loud}", "{label}"]
coalesce = true

[kinds.fetch.params]
feed = "str"
limit = { type = "int", default = 0 }
ratio = { type = "float", default = 1 }
loud = { type = "bool", default = false }
label = { type = "str" }
"""


def test_an_omitted_param_with_a_default_gets_it(tmp_path: Path) -> None:
    kind = load_kinds(_write(tmp_path, FETCH)).get("fetch")
    assert kind.params == {"feed": "str", "limit": "int", "ratio": "float", "loud": "bool", "label": "str"}
    # The default is stored as a value of its type (the TOML integer 1 of a float param is 1.0).
    assert kind.param_defaults == {"limit": 0, "ratio": 1.0, "loud": False}
    params = kind.validate_params({"feed": "a", "label": "x"})
    assert params == {"feed": "a", "limit": 0, "ratio": 1.0, "loud": False, "label": "x"}
    assert kind.render_argv(params) == ["fetch", "a", "0", "1.0", "false", "x"]


def test_a_given_param_with_a_default_is_validated_as_any_other(tmp_path: Path) -> None:
    kind = load_kinds(_write(tmp_path, FETCH)).get("fetch")
    given = kind.validate_params({"feed": "a", "label": "x", "limit": "5", "ratio": 0.5, "loud": "true"})
    assert given == {"feed": "a", "limit": 5, "ratio": 0.5, "loud": True, "label": "x"}
    for bad in ({"limit": "many"}, {"limit": None}, {"ratio": "nan"}, {"loud": 1}):
        with pytest.raises(ValidationError) as err:
            kind.validate_params({"feed": "a", "label": "x", **bad})
        assert err.value.field == f"params.{next(iter(bad))}"


@pytest.mark.parametrize("missing", ["feed", "label"])
def test_a_param_without_a_default_is_still_required(tmp_path: Path, missing: str) -> None:
    kind = load_kinds(_write(tmp_path, FETCH)).get("fetch")
    params: dict[str, object] = {"feed": "a", "label": "x"}
    del params[missing]
    with pytest.raises(ValidationError, match=f"missing param '{missing}'") as err:
        kind.validate_params(params)
    assert err.value.field == f"params.{missing}"


def test_the_coalescing_key_sees_the_defaults(tmp_path: Path) -> None:
    kind = load_kinds(_write(tmp_path, FETCH)).get("fetch")

    def key(params: dict[str, object]) -> str:
        return coalesce_key(kind.name, kind.validate_params(params))

    # Omitting a param and sending its default are the same job ...
    assert key({"feed": "a", "label": "x"}) == key({"feed": "a", "label": "x", "limit": 0, "loud": "false"})
    # ... and sending another value is another job.
    assert key({"feed": "a", "label": "x"}) != key({"feed": "a", "label": "x", "limit": 3})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ('{ n = { type = "int", default = "many" } }', "kind 'x': the default of param 'n' must be int: got 'many'"),
        ('{ n = { type = "int", default = 1.5 } }', "kind 'x': the default of param 'n' must be int: got 1.5"),
        ('{ n = { type = "float", default = inf } }', "kind 'x': the default of param 'n' must be float: not finite"),
        ('{ n = { type = "bool", default = 0 } }', "kind 'x': the default of param 'n' must be bool: got 0"),
        ('{ n = { type = "str", default = "-v" } }', "kind 'x': the default of param 'n' must be str: must not start"),
        ('{ n = { type = "str", default = 3 } }', "kind 'x': the default of param 'n' must be str: got int"),
        ('{ n = { default = 3 } }', "kind 'x': param 'n': a param table needs a type"),
        ('{ n = { type = "decimal", default = 3 } }', "kind 'x': param 'n' has type 'decimal'"),
        ('{ n = { type = "int", defualt = 3 } }', "kind 'x': param 'n': unknown key 'defualt' "),
        ('{ n = { type = "int", minimum = 0, maxx = 9 } }', "kind 'x': param 'n': unknown keys 'maxx', 'minimum' "),
        ('{ n = { type = "int", min = 9, max = 0 } }', "kind 'x': param 'n': min (9) is above max (0)"),
        ('{ n = { type = "int", min = 1.5 } }', "kind 'x': param 'n': min of an int param must be a whole number"),
        ('{ n = { type = "float", max = nan } }', "kind 'x': param 'n': max of a float param must be a finite"),
        ('{ n = { type = "bool", min = 0 } }', "param 'n': min is not a rule of a bool param (its rules: none"),
        ('{ n = { type = "str", min = 0 } }', "kind 'x': param 'n': min is not a rule of a str param"),
        ('{ n = { type = "int", format = "url" } }', "kind 'x': param 'n': format is not a rule of an int"[:-6]),
        ('{ n = { type = "float", choices = [1.0] } }', "kind 'x': param 'n': choices is not a rule of a float"),
        ('{ n = { type = "str", format = "email" } }', "kind 'x': param 'n': format 'email' is not known (known: url)"),
        ('{ n = { type = "str", max_length = 0 } }', "kind 'x': param 'n': max_length must be a whole number"),
        ('{ n = { type = "str", choices = [] } }', "kind 'x': param 'n': choices must be a non-empty list"),
        ('{ n = { type = "str", choices = ["a", "a"] } }', "kind 'x': param 'n': choices names 'a' twice"),
        ('{ n = { type = "int", choices = ["a"] } }', "kind 'x': param 'n': a choice param 'n' must be int: got 'a'"),
        ('{ n = { type = "int", choices = [5], max = 3 } }', "kind 'x': param 'n': choice 5 must be at most 3, got 5"),
        ('{ n = { type = "int", default = 10, max = 3 } }', "kind 'x': param 'n': the default must be at most 3"),
        ('{ n = { type = "str", default = "x", format = "url" } }', "param 'n': the default must be an http or https"),
        ('{ n = { type = "int", max = 9223372036854775808 } }', "must be a whole number (64-bit)"),
        ("{ n = 3 }", "kind 'x': param 'n' has type 3"),
        ('"n"', "kind 'x': params must be a table"),
    ],
)
def test_a_bad_param_declaration_names_the_kind_the_param_and_the_problem(
    tmp_path: Path, params: str, message: str
) -> None:
    with pytest.raises(KindsFileError) as err:
        load_kinds(_write(tmp_path, f'[kinds.x]\nargv = ["echo", "{{n}}"]\nparams = {params}\n'))
    assert message in str(err.value)


# -- resubmission settings ----------------------------------------------------------------------------------------


def test_a_kind_that_declares_no_resubmission_settings_is_never_resubmitted(tmp_path: Path) -> None:
    kind = load_kinds(_write(tmp_path, SLEEP)).get("sleep")
    assert kind.max_attempts == 1
    assert (kind.retry_backoff_s, kind.retry_backoff_max_s) == (60.0, 3600.0)
    assert kind.retry_on_exit_codes == frozenset()


def test_resubmission_settings_are_read_as_declared(tmp_path: Path) -> None:
    text = SLEEP + (
        "max_attempts = 5\nretry_backoff_seconds = 2\nretry_backoff_max_seconds = 30.5\n"
        "retry_on_exit_codes = [75, 1, 255]\nexit_reasons = { 10 = 'budget_exhausted' }\n"
    )
    kind = load_kinds(_write(tmp_path, text)).get("sleep")
    assert kind.max_attempts == 5
    assert (kind.retry_backoff_s, kind.retry_backoff_max_s) == (2.0, 30.5)
    assert isinstance(kind.retry_backoff_s, float)
    assert kind.retry_on_exit_codes == frozenset({1, 75, 255})


@pytest.mark.parametrize(
    ("settings", "attr", "value"),
    [
        ("max_attempts = 100", "max_attempts", 100),
        ("retry_backoff_seconds = 0.001", "retry_backoff_s", 0.001),
        ("retry_backoff_seconds = 3600", "retry_backoff_s", 3600.0),  # equal to the default cap: allowed
        ("retry_backoff_seconds = 7200\nretry_backoff_max_seconds = 7200", "retry_backoff_s", 7200.0),
        ("retry_backoff_max_seconds = 31536000", "retry_backoff_max_s", 31536000.0),
    ],
)
def test_resubmission_settings_at_their_bounds_are_accepted(
    tmp_path: Path, settings: str, attr: str, value: object
) -> None:
    kind = load_kinds(_write(tmp_path, SLEEP + settings + "\n")).get("sleep")
    assert getattr(kind, attr) == value


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ("max_attempts = 0", "max_attempts must be a whole number from 1 (never resubmit) to 100, not 0"),
        ("max_attempts = -1", "max_attempts must be a whole number from 1 (never resubmit) to 100, not -1"),
        ("max_attempts = 101", "max_attempts must be a whole number from 1 (never resubmit) to 100, not 101"),
        ("max_attempts = 99999999999999999999", "max_attempts must be a whole number from 1"),
        ("max_attempts = 2.0", "max_attempts must be a whole number from 1 (never resubmit) to 100, not 2.0"),
        ("max_attempts = true", "max_attempts must be a whole number from 1 (never resubmit) to 100, not True"),
        ('max_attempts = "3"', "max_attempts must be a whole number from 1 (never resubmit) to 100, not '3'"),
        ("retry_backoff_seconds = 0", "retry_backoff_seconds must be a number of seconds above 0 and at most"),
        ("retry_backoff_seconds = -5", "retry_backoff_seconds must be a number of seconds above 0"),
        ("retry_backoff_seconds = nan", "retry_backoff_seconds must be a number of seconds above 0"),
        ("retry_backoff_seconds = inf", "retry_backoff_seconds must be a number of seconds above 0"),
        ("retry_backoff_seconds = 1e400", "retry_backoff_seconds must be a number of seconds above 0"),
        ("retry_backoff_seconds = 99999999999999999999999", "retry_backoff_seconds must be a number of seconds"),
        ("retry_backoff_seconds = true", "retry_backoff_seconds must be a number of seconds above 0"),
        ('retry_backoff_seconds = "60"', "retry_backoff_seconds must be a number of seconds above 0"),
        ("retry_backoff_max_seconds = 0", "retry_backoff_max_seconds must be a number of seconds above 0"),
        ("retry_backoff_max_seconds = inf", "retry_backoff_max_seconds must be a number of seconds above 0"),
        (
            "retry_backoff_max_seconds = 31536001",
            "retry_backoff_max_seconds must be a number of seconds above 0 and at most 31536000 (a year), not 31536001",
        ),
        (
            "retry_backoff_seconds = 10\nretry_backoff_max_seconds = 5",
            "retry_backoff_max_seconds (5) must be at least retry_backoff_seconds (10)",
        ),
        (
            "retry_backoff_seconds = 7200",
            "retry_backoff_max_seconds (3600, the default) must be at least retry_backoff_seconds (7200)",
        ),
        ("retry_on_exit_codes = 75", "retry_on_exit_codes must be a list of exit codes (1 to 255), not 75"),
        ("retry_on_exit_codes = [0]", "retry_on_exit_codes cannot name exit code 0"),
        ("retry_on_exit_codes = [256]", "retry_on_exit_codes: 256 is not an exit code (1 to 255)"),
        ("retry_on_exit_codes = [-1]", "retry_on_exit_codes: -1 is not an exit code (1 to 255)"),
        ('retry_on_exit_codes = ["75"]', "retry_on_exit_codes: '75' is not an exit code (1 to 255)"),
        ("retry_on_exit_codes = [true]", "retry_on_exit_codes: True is not an exit code (1 to 255)"),
        ("retry_on_exit_codes = [75.0]", "retry_on_exit_codes: 75.0 is not an exit code (1 to 255)"),
        ("retry_on_exit_codes = [75, 1, 75]", "retry_on_exit_codes names exit code 75 twice"),
        (
            "retry_on_exit_codes = [75, 10]\nexit_reasons = { 10 = 'budget_exhausted' }",
            "exit code 10 is in both retry_on_exit_codes and exit_reasons",
        ),
        ("retry_on_exits = [75]", "unknown key 'retry_on_exits'"),
        ("retry_backoff_s = 5", "unknown key 'retry_backoff_s'"),
    ],
)
def test_a_bad_resubmission_setting_names_the_kind_and_the_key(tmp_path: Path, settings: str, message: str) -> None:
    with pytest.raises(KindsFileError) as err:
        load_kinds(_write(tmp_path, SLEEP + settings + "\n"))
    assert f"kind 'sleep': {message}" in str(err.value)


def test_a_retry_code_may_also_be_a_named_failure(tmp_path: Path) -> None:
    # The name is what the job ends with once its attempts are spent.
    text = SLEEP + "max_attempts = 2\nretry_on_exit_codes = [3]\nfailure_reasons = { 3 = 'all_feeds_failed' }\n"
    kind = load_kinds(_write(tmp_path, text)).get("sleep")
    assert (kind.retry_on_exit_codes, kind.failure_reasons) == (frozenset({3}), {3: "all_feeds_failed"})


def test_missing_kinds_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KindsFileError, match="cannot read"):
        load_kinds(tmp_path / "absent.toml")


# -- param rules (ADR 0017) ---------------------------------------------------------------------------------------

RULED = """
[kinds.ruled]
argv = ["echo", "{n}", "{ratio}", "{mode}", "{url}", "{note}", "{level}"]
[kinds.ruled.params]
n = { type = "int", min = 0, max = 10000 }
ratio = { type = "float", min = 0.5, max = 2 }
mode = { type = "str", choices = ["fast", "slow"] }
url = { type = "str", format = "url" }
note = { type = "str", max_length = 5, default = "" }
level = { type = "int", choices = [1, 3], default = 1 }
"""
GOOD = {"n": 0, "ratio": 0.5, "mode": "fast", "url": "http://e.org"}


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("n", -1, "must be at least 0, got -1"),
        ("n", "-1", "must be at least 0, got -1"),
        ("n", 10001, "must be at most 10000, got 10001"),
        ("n", "10001", "must be at most 10000, got 10001"),
        ("n", 2**63, "beyond a 64-bit integer"),
        ("n", -(2**63) - 1, "beyond a 64-bit integer"),
        ("n", 99999999999999999999999, "beyond a 64-bit integer"),
        ("n", "99999999999999999999999", "at most 18 digits"),
        ("n", "007", "no leading zero"),
        ("ratio", 0.49, "must be at least 0.5, got 0.49"),
        ("ratio", "2.01", "must be at most 2.0, got 2.01"),
        ("mode", "medium", "must be one of 'fast', 'slow', got 'medium'"),
        ("mode", "Fast", "must be one of 'fast', 'slow', got 'Fast'"),
        ("url", "notaurl", "must be an http or https URL with a host, got 'notaurl'"),
        ("url", "ftp://e.org/f", "must be an http or https URL with a host"),
        ("url", "http://", "must be an http or https URL with a host"),
        ("url", "http:///x", "must be an http or https URL with a host"),
        ("url", "http://e.org/a b", "must be an http or https URL with a host"),
        ("url", "http://e.org:123456/", "must be an http or https URL with a host"),
        ("note", "sixsix", "must be at most 5 characters, got 6"),
        ("level", 2, "must be one of 1, 3, got 2"),
        ("level", "2", "must be one of 1, 3, got 2"),
    ],
)
def test_a_param_that_breaks_its_rule_is_refused_naming_the_field_and_the_rule(
    tmp_path: Path, name: str, value: object, why: str
) -> None:
    kind = load_kinds(_write(tmp_path, RULED)).get("ruled")
    with pytest.raises(ValidationError) as err:
        kind.validate_params({**GOOD, name: value})
    assert err.value.field == f"params.{name}"
    assert why in str(err.value)


@pytest.mark.parametrize(
    ("name", "value", "kept"),
    [
        ("n", 10000, 10000),
        ("n", "+10000", 10000),
        ("n", "-0", 0),
        ("ratio", "2", 2.0),
        ("ratio", 2, 2.0),
        ("mode", "slow", "slow"),
        ("url", "HTTPS://user@[::1]:8080/feed.xml?a=1#x", "HTTPS://user@[::1]:8080/feed.xml?a=1#x"),
        ("url", "https://xn--bcher-kva.example/f", "https://xn--bcher-kva.example/f"),
        ("note", "fives", "fives"),
        ("level", "3", 3),
    ],
)
def test_a_param_at_the_edge_of_its_rule_is_taken(tmp_path: Path, name: str, value: object, kept: object) -> None:
    kind = load_kinds(_write(tmp_path, RULED)).get("ruled")
    assert kind.validate_params({**GOOD, name: value})[name] == kept


def test_the_pipeline_kind_declares_what_the_runner_checks() -> None:
    """A pipeline job the runner would refuse (exit 2) is refused at enqueue instead (ADR 0017)."""
    pipeline = load_kinds(None).get("pipeline")
    feed = "https://e.org/f"
    for bad in (
        {"feed": "notaurl"},
        {"feed": feed, "max_episodes": -3},
        {"feed": feed, "max_episodes": 1_000_001},
        {"feed": "https://e.org/" + "a" * 2048},
    ):
        with pytest.raises(ValidationError):
            pipeline.validate_params(bad)
    assert pipeline.validate_params({"feed": "https://e.org/f", "max_episodes": 1_000_000})["max_episodes"] == 10**6
    assert pipeline.failure_reasons[2] == "invalid_params"
    assert 2 not in pipeline.retry_on_exit_codes


# -- bounds per kind --------------------------------------------------------------------------------------------


def test_max_running_is_read_as_declared_and_none_by_default(tmp_path: Path) -> None:
    kinds = load_kinds(_write(tmp_path, SLEEP + "max_running = 2\n"))
    assert kinds.get("sleep").max_running == 2
    assert kinds.running_limits() == {"sleep": 2}  # the built-ins declare none
    assert load_kinds(_write(tmp_path, SLEEP)).get("sleep").max_running is None


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "true", '"2"', "10001"])
def test_a_bad_max_running_names_the_kind_and_the_key(tmp_path: Path, value: str) -> None:
    with pytest.raises(KindsFileError, match=r"kind 'sleep': max_running must be a whole number from 1"):
        load_kinds(_write(tmp_path, SLEEP + f"max_running = {value}\n"))


def test_deadline_seconds_is_read_as_declared_and_none_by_default(tmp_path: Path) -> None:
    kinds = load_kinds(_write(tmp_path, SLEEP + "deadline_seconds = 90.5\n"))
    assert kinds.get("sleep").deadline_s == 90.5 and kinds.deadlines() == {"sleep": 90.5}
    assert load_kinds(_write(tmp_path, SLEEP)).get("sleep").deadline_s is None


@pytest.mark.parametrize("value", ["0", "-5", "true", '"60"', "nan", "inf"])
def test_a_bad_deadline_names_the_kind_and_the_key(tmp_path: Path, value: str) -> None:
    with pytest.raises(KindsFileError, match=r"kind 'sleep': deadline_seconds must be a number of seconds above 0"):
        load_kinds(_write(tmp_path, SLEEP + f"deadline_seconds = {value}\n"))
