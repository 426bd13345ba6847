"""The settings are declared once (supervisor/domain/_settings.py): the loader, the TOML keys and the settings
page's table (docs/settings.md) all come from that declaration, so none of them can drift from the others."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from supervisor.domain import SETTINGS, Config, ConfigError, load_config, settings_table

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import doc_tables  # noqa: E402 - tools/ is not a package

NUMBERS = [s for s in SETTINGS if type(s.read).__name__ == "Num"]
CHOICES = [s for s in SETTINGS if type(s.read).__name__ == "Choice"]


def test_the_settings_page_shows_the_declared_settings() -> None:
    page = doc_tables.SETTINGS.page.read_text()
    stale = "docs/settings.md is stale: run .venv/bin/python tools/doc_tables.py"
    assert doc_tables.SETTINGS.rendered(page) == page, stale
    for setting in SETTINGS:
        assert f"`{setting.env}` (`{setting.toml}`)" in settings_table()


def test_every_config_field_is_set_by_a_declared_setting() -> None:
    set_by_settings = {s.attr for s in SETTINGS} - {"bind"} | {"bind_host", "bind_port"}
    assert {f.name for f in dataclasses.fields(Config)} == set_by_settings
    assert len({s.env for s in SETTINGS}) == len(SETTINGS), "one variable per setting"


@pytest.mark.parametrize("setting", NUMBERS, ids=lambda s: s.env)
def test_the_default_a_number_shows_is_the_one_in_force(setting) -> None:  # type: ignore[no-untyped-def]
    shown = re.match(r"`(-?[0-9.]+)`", setting.default)
    assert shown is not None, f"{setting.env}: a number's default is shown first, in backticks"
    assert float(shown.group(1)) == getattr(Config(), setting.attr)


@pytest.mark.parametrize("setting", NUMBERS, ids=lambda s: s.env)
def test_junk_in_any_number_falls_back_to_its_default_naming_it_INV_MALFORMED_NEVER_UNBOUNDED(  # type: ignore[no-untyped-def]
    setting,
) -> None:
    config, warnings = load_config({setting.env: "lots"})
    assert getattr(config, setting.attr) == getattr(Config(), setting.attr)
    assert any(setting.env in w for w in warnings)


@pytest.mark.parametrize("setting", CHOICES, ids=lambda s: s.env)
def test_a_word_outside_a_choice_is_an_error_naming_it(setting) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as caught:
        load_config({setting.env: "maybe"})
    assert setting.env in str(caught.value)
    for word in setting.read.words:
        config, _ = load_config({setting.env: word.upper()})
        assert getattr(config, setting.attr) == word


@pytest.mark.parametrize("setting", NUMBERS, ids=lambda s: s.env)
def test_each_number_is_read_from_its_toml_key_and_the_environment_wins(  # type: ignore[no-untyped-def]
    setting, tmp_path: Path
) -> None:
    file = tmp_path / "supervisor.toml"
    file.write_text(f"[supervisor]\n{setting.toml} = 77777\n")
    from_file, _ = load_config({}, config_file=file)
    assert getattr(from_file, setting.attr) != getattr(Config(), setting.attr)
    from_env, _ = load_config({setting.env: str(getattr(Config(), setting.attr))}, config_file=file)
    assert getattr(from_env, setting.attr) == getattr(Config(), setting.attr)


def below_floor(setting) -> float | None:  # type: ignore[no-untyped-def]
    """A value under ``setting``'s floor that is of its kind and would not turn it off (None: there is none)."""
    below = setting.read.floor - 1 if setting.read.integer else setting.read.floor / 2
    return None if below < 0 or below >= setting.read.floor or (setting.read.off and below <= 0) else below


FLOORED = [s for s in NUMBERS if s.read.floor is not None and below_floor(s) is not None]


@pytest.mark.parametrize("setting", FLOORED, ids=lambda s: s.env)
def test_a_number_below_its_floor_is_the_floor_and_says_so(setting) -> None:  # type: ignore[no-untyped-def]
    """E.g. PODCAST_JOB_IDEMPOTENCY_TTL_SECONDS=60 keeps keys an hour (ADR 0016: a floor of 1 h, not 'no key')."""
    assert "PODCAST_JOB_IDEMPOTENCY_TTL_SECONDS" in {s.env for s in FLOORED}
    below = below_floor(setting)
    config, warnings = load_config({setting.env: str(below)})
    assert getattr(config, setting.attr) == setting.read.floor
    assert any(setting.env in w and "floor" in w for w in warnings)
