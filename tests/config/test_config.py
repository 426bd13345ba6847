"""Configuration: INV-MALFORMED-NEVER-UNBOUNDED, floors, and errors that name every bad setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor import ConfigError, load_config
from supervisor.domain import config_from


def test_defaults() -> None:
    config, warnings = load_config({})
    assert warnings == []
    assert config.bind == "127.0.0.1:8000"
    assert config.max_concurrent == 1
    assert config.sweep_interval_s == 30.0
    assert config.stale_after_s == 86400.0
    assert config.progress_stale_after_s == 1800.0
    assert config.exec_mode == "subprocess"
    assert (config.docker_image, config.docker_network, config.docker_data_volume) == (
        "podcast-job-supervisor:local",
        None,
        None,
    )
    assert config.heartbeat_base_url is None
    assert config.webhook_timeout_s == 5.0
    assert config.log_max_bytes == 50 * 1024 * 1024
    assert config.registry_path == Path("var/.viewer/jobs.sqlite3")
    assert config.pause_flag_path == Path("var/.viewer/jobs.paused")


@pytest.mark.parametrize(
    ("var", "attr", "junk"),
    [
        ("PODCAST_JOB_MAX_CONCURRENT", "max_concurrent", "lots"),
        ("PODCAST_JOB_MAX_CONCURRENT", "max_concurrent", "2.5"),
        ("PODCAST_JOB_SWEEP_SECONDS", "sweep_interval_s", "nan"),
        ("PODCAST_JOB_STALE_SECONDS", "stale_after_s", "1 day"),
        ("PODCAST_JOB_STALE_SECONDS", "stale_after_s", "inf"),
        ("PODCAST_JOB_PROGRESS_STALE_SECONDS", "progress_stale_after_s", "30m"),
        ("PODCAST_JOB_WEBHOOK_TIMEOUT_SEC", "webhook_timeout_s", "fast"),
        ("PODCAST_JOB_LOG_MAX_BYTES", "log_max_bytes", "50MiB"),
        ("PODCAST_JOB_SILENT_SECONDS", "silent_after_s", "a minute"),
        ("PODCAST_JOB_WEBHOOK_OUTBOX_MAX_EVENTS", "webhook_outbox_max_events", "many"),
        ("PODCAST_JOB_WEBHOOK_OUTBOX_MAX_AGE_SECONDS", "webhook_outbox_max_age_s", "1w"),
        ("PODCAST_JOB_EVENTS_REPLAY_EVENTS", "events_replay_events", "all"),
        ("PODCAST_JOB_EVENTS_CLIENT_BUFFER_EVENTS", "events_client_buffer_events", "1e400"),
        ("PODCAST_JOB_EVENTS_MAX_CLIENTS", "events_max_clients", "some"),
        ("PODCAST_JOB_EVENTS_KEEPALIVE_SECONDS", "events_keepalive_s", "15s"),
        ("PODCAST_JOB_RETENTION_DAYS", "retention_days", "a month"),
        ("PODCAST_JOB_RETENTION_MAX_JOBS", "retention_max_jobs", "1e5.5"),
        ("PODCAST_JOB_RETENTION_MAX_JOBS", "retention_max_jobs", "100.5"),
    ],
)
def test_malformed_number_falls_back_to_default_naming_the_variable_INV_MALFORMED_NEVER_UNBOUNDED(
    var: str, attr: str, junk: str
) -> None:
    config, warnings = load_config({var: junk})
    assert getattr(config, attr) == getattr(load_config({})[0], attr)
    assert len(warnings) == 1
    assert var in warnings[0]


@pytest.mark.parametrize(
    ("var", "attr", "value", "expected"),
    [
        ("PODCAST_JOB_WEBHOOK_TIMEOUT_SEC", "webhook_timeout_s", "0.01", 0.5),
        ("PODCAST_JOB_MAX_CONCURRENT", "max_concurrent", "0", 1),
        ("PODCAST_JOB_MAX_CONCURRENT", "max_concurrent", "-3", 1),
        ("PODCAST_JOB_SWEEP_SECONDS", "sweep_interval_s", "0", 1.0),
        ("PODCAST_JOB_LOG_MAX_BYTES", "log_max_bytes", "10", 4096),
        ("PODCAST_JOB_SILENT_SECONDS", "silent_after_s", "0.2", 1.0),
        ("PODCAST_JOB_WEBHOOK_OUTBOX_MAX_EVENTS", "webhook_outbox_max_events", "0", 1),
        ("PODCAST_JOB_WEBHOOK_OUTBOX_MAX_AGE_SECONDS", "webhook_outbox_max_age_s", "5", 60.0),
        ("PODCAST_JOB_EVENTS_REPLAY_EVENTS", "events_replay_events", "0", 1),
        ("PODCAST_JOB_EVENTS_CLIENT_BUFFER_EVENTS", "events_client_buffer_events", "-5", 1),
        ("PODCAST_JOB_EVENTS_MAX_CLIENTS", "events_max_clients", "0", 1),
        ("PODCAST_JOB_EVENTS_KEEPALIVE_SECONDS", "events_keepalive_s", "0.1", 1.0),
    ],
)
def test_values_below_a_floor_are_raised_to_it(var: str, attr: str, value: str, expected: float) -> None:
    config, warnings = load_config({var: value})
    assert getattr(config, attr) == expected
    assert var in warnings[0]


def test_the_event_stream_settings_default_and_the_keepalive_has_a_ceiling() -> None:
    config, _ = load_config({})
    assert (
        config.events_replay_events,
        config.events_client_buffer_events,
        config.events_max_clients,
        config.events_keepalive_s,
    ) == (1000, 2048, 64, 15.0)
    # A keep-alive rarer than a minute would look like a dead connection to a client (the CLI waits 90 s).
    config, warnings = load_config({"PODCAST_JOB_EVENTS_KEEPALIVE_SECONDS": "600"})
    assert config.events_keepalive_s == 60.0
    assert "PODCAST_JOB_EVENTS_KEEPALIVE_SECONDS" in warnings[0] and "ceiling" in warnings[0]


def test_stale_window_is_disabled_only_by_an_explicit_zero_or_negative() -> None:
    assert load_config({"PODCAST_JOB_STALE_SECONDS": "0"})[0].stale_after_s is None
    assert load_config({"PODCAST_JOB_STALE_SECONDS": "-1"})[0].stale_after_s is None
    assert load_config({"PODCAST_JOB_STALE_SECONDS": ""})[0].stale_after_s == 86400.0
    assert load_config({"PODCAST_JOB_STALE_SECONDS": "600"})[0].stale_after_s == 600.0


def test_retention_defaults_and_is_disabled_only_by_an_explicit_zero_or_negative(tmp_path: Path) -> None:
    config, warnings = load_config({})
    assert (config.retention_days, config.retention_max_jobs, warnings) == (30.0, 100_000, [])
    off = {"PODCAST_JOB_RETENTION_DAYS": "0", "PODCAST_JOB_RETENTION_MAX_JOBS": "-1"}
    assert (load_config(off)[0].retention_days, load_config(off)[0].retention_max_jobs) == (None, None)
    config, _ = load_config({"PODCAST_JOB_RETENTION_DAYS": "7.5", "PODCAST_JOB_RETENTION_MAX_JOBS": "500"})
    assert (config.retention_days, config.retention_max_jobs) == (7.5, 500)
    path = tmp_path / "supervisor.toml"
    path.write_text("retention_days = 90\nretention_max_jobs = 0\n")
    config, _ = load_config({}, config_file=path)
    assert (config.retention_days, config.retention_max_jobs) == (90.0, None)


def test_invalid_settings_without_fallback_are_all_named() -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"PODCAST_PIPELINE_EXEC_MODE": "kubernetes", "PODCAST_JOB_BIND": "nowhere"})
    text = str(err.value)
    assert "PODCAST_PIPELINE_EXEC_MODE" in text
    assert "PODCAST_JOB_BIND" in text
    assert len(err.value.problems) == 2


def test_toml_file_is_read_and_environment_wins(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.toml"
    path.write_text('max_concurrent = 3\nexec_mode = "docker"\nbind = "127.0.0.1:9000"\n')
    config, _ = load_config({"PODCAST_JOB_MAX_CONCURRENT": "5"}, config_file=path)
    assert config.max_concurrent == 5
    assert config.exec_mode == "docker"
    assert config.bind_port == 9000


def test_unknown_toml_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "supervisor.toml"
    path.write_text("max_concurent = 3\n")
    with pytest.raises(ConfigError, match="max_concurent"):
        load_config({}, config_file=path)


def test_an_unknown_variable_with_the_settings_prefix_is_named_with_the_setting_it_most_likely_meant() -> None:
    """A typo in a variable's name must not pass unseen while the default it meant to change stays in force; the
    variables that are no setting of the server (the CLI's address, a job's own, the tests') are no typo."""
    config, warnings = load_config(
        {
            "PODCAST_JOB_MAX_CONCURENT": "4",
            "PODCAST_JOB_SWEEP_INTERVAL_SECONDS": "5",
            "PODCAST_JOB_FOO": "1",
            "PODCAST_JOB_URL": "http://127.0.0.1:8000",
            "PODCAST_JOB_ID": "j",
            "PODCAST_JOB_TEST_DATABASE_URL": "postgresql://x/y",
            "PODCAST_JOB_BIND": "127.0.0.1:8001",
        }
    )
    assert (config.max_concurrent, config.sweep_interval_s, config.bind_port) == (1, 30.0, 8001)  # ignored, read
    assert warnings == [
        "PODCAST_JOB_FOO is not a setting: ignored",
        "PODCAST_JOB_MAX_CONCURENT is not a setting (did you mean PODCAST_JOB_MAX_CONCURRENT?): ignored",
        "PODCAST_JOB_SWEEP_INTERVAL_SECONDS is not a setting (did you mean PODCAST_JOB_SWEEP_SECONDS?): ignored",
    ]


def test_the_api_token_is_never_described() -> None:
    config, _ = load_config({"PODCAST_JOB_API_TOKEN": "s3cret"})
    assert "s3cret" not in repr(config)
    assert "s3cret" not in str(config.describe())


def test_api_token_from_a_file_stays_out_of_the_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  s3cret-token \n")
    config, warnings = load_config({"PODCAST_JOB_API_TOKEN_FILE": str(token_file)})
    assert warnings == []
    assert (config.api_token, config.api_token_file) == ("s3cret-token", token_file)
    described = config.describe()
    assert described["api_token"] == "(set)" and described["api_token_file"] == str(token_file)
    assert "s3cret-token" not in repr(config)


@pytest.mark.parametrize(
    ("content", "why"),
    [(None, "cannot read"), ("", "empty"), ("\n  \n", "empty"), ("two words", "more than one"), (b"\xff", "UTF-8")],
)
def test_an_unusable_token_file_is_an_error_naming_the_variable_never_an_open_api(
    tmp_path: Path, content: str | bytes | None, why: str
) -> None:
    token_file = tmp_path / "token"
    if isinstance(content, bytes):
        token_file.write_bytes(content)
    elif content is not None:
        token_file.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_config({"PODCAST_JOB_API_TOKEN_FILE": str(token_file)})
    [problem] = err.value.problems
    assert problem.startswith("PODCAST_JOB_API_TOKEN_FILE") and why in problem


def test_token_and_token_file_together_is_an_error(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("a")
    with pytest.raises(ConfigError, match="not both"):
        load_config({"PODCAST_JOB_API_TOKEN_FILE": str(token_file), "PODCAST_JOB_API_TOKEN": "b"})


def test_docker_settings_are_read_and_the_heartbeat_url_loses_its_trailing_slash() -> None:
    config, warnings = load_config(
        {
            "PODCAST_PIPELINE_EXEC_MODE": "docker",
            "PODCAST_JOB_DOCKER_IMAGE": "registry.example/podcast:1.2",
            "PODCAST_JOB_DOCKER_NETWORK": "podcast_default",
            "PODCAST_JOB_DOCKER_DATA_VOLUME": "podcast_corpus",
            "PODCAST_JOB_HEARTBEAT_BASE_URL": "http://supervisor:8000/",
        }
    )
    assert warnings == []
    assert (config.exec_mode, config.docker_image, config.docker_network) == (
        "docker",
        "registry.example/podcast:1.2",
        "podcast_default",
    )
    assert (config.docker_data_volume, config.heartbeat_base_url) == ("podcast_corpus", "http://supervisor:8000")
    assert load_config({"PODCAST_JOB_DOCKER_DATA_VOLUME": "/srv/podcast"})[0].docker_data_volume == "/srv/podcast"


def test_docker_settings_without_a_safe_fallback_are_errors_naming_each() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(
            {
                "PODCAST_JOB_DOCKER_IMAGE": "two words",
                "PODCAST_JOB_DOCKER_NETWORK": "no/such net",
                "PODCAST_JOB_DOCKER_DATA_VOLUME": "relative/path",
                "PODCAST_JOB_HEARTBEAT_BASE_URL": "supervisor:8000",
            }
        )
    names = ["IMAGE", "NETWORK", "DATA_VOLUME", "HEARTBEAT_BASE_URL"]
    assert len(err.value.problems) == 4
    for name, problem in zip(names, err.value.problems, strict=True):
        assert name in problem


def test_docker_mode_without_a_heartbeat_url_warns_unless_jobs_share_the_hosts_network() -> None:
    _, warnings = load_config({"PODCAST_PIPELINE_EXEC_MODE": "docker"})
    assert len(warnings) == 1 and "PODCAST_JOB_HEARTBEAT_BASE_URL" in warnings[0]
    assert load_config({"PODCAST_PIPELINE_EXEC_MODE": "docker", "PODCAST_JOB_DOCKER_NETWORK": "host"})[1] == []
def test_absence_and_webhook_defaults_and_settings() -> None:
    config, warnings = load_config({})
    assert (config.silent_after_s, config.stall_action, config.webhook_secret) == (60.0, "alert", None)
    assert (config.webhook_outbox_max_events, config.webhook_outbox_max_age_s) == (10_000, 7 * 86400.0)
    config, warnings = load_config(
        {"PODCAST_JOB_STALL_ACTION": "Terminate", "PODCAST_JOB_SILENT_SECONDS": "0", "PODCAST_JOB_WEBHOOK_SECRET": "s3"}
    )
    assert (config.stall_action, config.silent_after_s, config.webhook_secret) == ("terminate", None, "s3")
    assert warnings == []
    # The secret is never printed, like the API token.
    assert config.describe()["webhook_secret"] == "(set)"
    assert "s3" not in repr(config)


def test_an_unknown_stall_action_is_an_error_not_a_fallback() -> None:
    with pytest.raises(ConfigError) as err:
        load_config({"PODCAST_JOB_STALL_ACTION": "termiante"})
    assert "PODCAST_JOB_STALL_ACTION='termiante'" in str(err.value)


def test_the_run_directory_is_auto_off_or_an_absolute_path_and_nothing_else(tmp_path: Path) -> None:
    config, _ = load_config({"PODCAST_JOB_DATA_DIR": str(tmp_path / "a")})
    assert config.run_dir == "auto"
    dirs = config.run_dirs()
    assert dirs is not None  # this machine has /dev/shm
    run, private = dirs
    assert private == Path(f"/dev/shm/podcast-supervisor-{os.geteuid()}") and run.parent == private
    other, _ = load_config({"PODCAST_JOB_DATA_DIR": str(tmp_path / "b")})
    assert other.run_dirs() != dirs  # one run directory per data dir
    assert load_config({"PODCAST_JOB_RUN_DIR": "OFF"})[0].run_dirs() is None
    explicit, _ = load_config({"PODCAST_JOB_RUN_DIR": "/run/podcast"})
    assert explicit.run_dirs() == (Path("/run/podcast"), Path("/run/podcast"))
    with pytest.raises(ConfigError) as err:
        load_config({"PODCAST_JOB_RUN_DIR": "run/here"})
    assert "PODCAST_JOB_RUN_DIR='run/here': must be auto, off or an absolute path" in str(err.value)
    traced, _ = load_config({"PODCAST_JOB_SHEPHERD_TRACE_FILE": "/tmp/trace.ndjson"})
    assert traced.shepherd_trace_file == Path("/tmp/trace.ndjson")


# -- the registry: SQLite by default, PostgreSQL by URL (ADR 0012) ---------------------------------------------


def test_sqlite_is_the_default_and_a_postgresql_url_selects_postgresql() -> None:
    config, _ = load_config({})
    assert (config.database_url, config.database_timeout_s, config.database_auto_migrate) == (None, 10.0, True)
    config, warnings = load_config(
        {
            "PODCAST_JOB_DATABASE_URL": "postgresql://app@db.example:5432/jobs",
            "PODCAST_JOB_DATABASE_TIMEOUT_SECONDS": "2.5",
            "PODCAST_JOB_DATABASE_AUTO_MIGRATE": "off",
        }
    )
    assert warnings == []
    assert (config.database_url, config.database_timeout_s, config.database_auto_migrate) == (
        "postgresql://app@db.example:5432/jobs",
        2.5,
        False,
    )
    assert load_config({"PODCAST_JOB_DATABASE_URL": "postgres://h/db"})[0].database_url == "postgres://h/db"


@pytest.mark.parametrize("url", ["sqlite:///var/jobs.sqlite3", "mysql://u:pw@h/db", "db.example:5432", "http://h/db"])
def test_a_database_url_of_another_kind_is_an_error_naming_the_setting(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({"PODCAST_JOB_DATABASE_URL": url})
    [problem] = caught.value.problems
    assert problem.startswith("PODCAST_JOB_DATABASE_URL=") and "must be a postgresql:// URL" in problem
    assert "pw" not in problem  # a password never shows, not even in a refused URL


def test_the_database_password_is_never_described_and_other_settings_are_checked() -> None:
    config, _ = load_config({"PODCAST_JOB_DATABASE_URL": "postgresql://app:s3cret@db.example/jobs"})
    assert config.describe()["database_url"] == "postgresql://app:***@db.example/jobs"
    assert "s3cret" not in repr(config)
    with pytest.raises(ConfigError, match="PODCAST_JOB_DATABASE_AUTO_MIGRATE='maybe': must be true or false"):
        load_config({"PODCAST_JOB_DATABASE_AUTO_MIGRATE": "maybe"})
    config, warnings = load_config({"PODCAST_JOB_DATABASE_TIMEOUT_SECONDS": "0"})
    assert config.database_timeout_s == 0.1 and "PODCAST_JOB_DATABASE_TIMEOUT_SECONDS" in warnings[0]


def test_a_transaction_pooler_is_named_explicitly_and_anything_else_is_an_error_naming_the_setting() -> None:
    assert load_config({})[0].database_pooler == "none"
    assert load_config({"PODCAST_JOB_DATABASE_POOLER": "Transaction"})[0].database_pooler == "transaction"
    assert load_config({"PODCAST_JOB_DATABASE_POOLER": "none"})[0].database_pooler == "none"
    for wrong in ("pgbouncer", "session", "yes"):
        with pytest.raises(ConfigError) as caught:
            load_config({"PODCAST_JOB_DATABASE_POOLER": wrong})
        assert caught.value.problems == [f"PODCAST_JOB_DATABASE_POOLER={wrong!r}: must be one of none, transaction"]


def test_a_listen_url_is_a_postgresql_url_beside_a_database_url_never_shown_with_its_password() -> None:
    config, _ = load_config(
        {
            "PODCAST_JOB_DATABASE_URL": "postgresql://app:pw@bouncer:6432/jobs",
            "PODCAST_JOB_DATABASE_POOLER": "transaction",
            "PODCAST_JOB_DATABASE_LISTEN_URL": "postgresql://app:s3cret@db:5432/jobs",
        }
    )
    assert config.database_listen_url == "postgresql://app:s3cret@db:5432/jobs"
    assert config.describe()["database_listen_url"] == "postgresql://app:***@db:5432/jobs"
    assert "s3cret" not in repr(config)
    with pytest.raises(ConfigError) as caught:
        load_config({"PODCAST_JOB_DATABASE_URL": "postgresql://h/db", "PODCAST_JOB_DATABASE_LISTEN_URL": "db:5432"})
    assert caught.value.problems == ["PODCAST_JOB_DATABASE_LISTEN_URL='(not a URL)': must be a postgresql:// URL"]
    with pytest.raises(ConfigError) as caught:
        load_config({"PODCAST_JOB_DATABASE_LISTEN_URL": "postgresql://h/db"})
    [problem] = caught.value.problems
    assert problem.startswith("PODCAST_JOB_DATABASE_LISTEN_URL is set without PODCAST_JOB_DATABASE_URL")


def test_a_host_cap_is_a_whole_number_or_an_error_naming_it_never_no_cap() -> None:
    config, _ = load_config({"PODCAST_JOB_HOST_MAX_CONCURRENT": "2"})
    assert config.host_max_concurrent == 2
    assert load_config({})[0].host_max_concurrent is None
    for junk in ("0", "-1", "two", "1.5"):
        with pytest.raises(ConfigError, match="PODCAST_JOB_HOST_MAX_CONCURRENT"):
            load_config({"PODCAST_JOB_HOST_MAX_CONCURRENT": junk})


def test_a_host_id_that_could_name_anything_is_an_error() -> None:
    assert load_config({"PODCAST_JOB_HOST_ID": "web-2.example"})[0].host_id == "web-2.example"
    for junk in ("web 2", "-web", "a/b", "x" * 65):
        with pytest.raises(ConfigError, match="PODCAST_JOB_HOST_ID"):
            load_config({"PODCAST_JOB_HOST_ID": junk})


# -- a config from values, with no environment (embedders, the scenario kit) ------------------------------------


def test_config_from_reads_each_value_as_a_config_files_value() -> None:
    config = config_from({"max_concurrent": 3, "stall_action": "terminate", "data_dir": "/tmp/x"})
    assert (config.max_concurrent, config.stall_action, str(config.data_dir)) == (3, "terminate", "/tmp/x")


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"max_concurrent": 0}, "max_concurrent"),  # a file falls back to 1 with a WARNING; a caller gets an error
        ({"stall_action": "explode"}, "stall_action"),
        ({"no_such": 1}, "no_such: no such setting"),
    ],
)
def test_config_from_refuses_what_a_file_would_fall_back_from(values: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        config_from(values)
