"""The config file, value by value (issue #16: mutation testing of retry_engine.config).

Expected values come from SPEC (R4, R6, R10, B2), the shipped config's comments
(environment overrides, paths relative to the file) and STYLE (errors carry a
stable code, the bad value and the valid ones), never from the code under test.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from retry_engine.config import (
    ENV_CHECKPOINT,
    ENV_LAKE,
    ENV_MASTER,
    EngineConfig,
    EngineSection,
    GroupConfig,
    error_class_name,
    load_config,
    minimum_retention_hours,
    minimum_retention_ms,
    parse_config,
    parse_retention_hours,
    resolve_path,
)
from retry_engine.errors import ConfigError


def config_error(data: dict[str, object]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value


# -- B2: the backoff read from the file --------------------------------------------------------------------


def test_b2_exponential_backoff_from_the_file_starts_at_initial_and_stops_at_max() -> None:
    """B2: ``min(initial * multiplier**(level-1), max)``: 2 s, 4 s, 8 s, 16 s, then 30 s for good."""
    cfg = parse_config({"groups": {"g": {"backoff": {"policy": "exponential", "initial": "2s", "multiplier": 2.0,
                                                     "max": "30s"}}}})
    group = cfg.group("g")
    assert group is not None
    policy = cfg.policy(group)
    assert policy.first_level == 1
    assert [policy.delay_ms(level) for level in range(1, 8)] == [2000, 4000, 8000, 16000, 30000, 30000, 30000]


def test_b2_r4_levels_backoff_defaults_to_the_engines_levels_and_rocketmqs_first_level() -> None:
    """R4/R5: without ``levels`` a group uses engine.message_delay_level, first retry at level 3."""
    cfg = parse_config({"engine": {"message_delay_level": "1s 2s 3s 4s"}, "groups": {"g": {}}})
    group = cfg.group("g")
    assert group is not None
    policy = cfg.policy(group)
    assert policy.first_level == 3 and [policy.delay_ms(n) for n in (1, 2, 3, 4, 9)] == [1000, 2000, 3000, 4000, 4000]


# -- R6, R10: groups -----------------------------------------------------------------------------------------


def test_r6_r10_group_defaults_are_rocketmqs() -> None:
    """Seed 002: SubscriptionGroupConfig defaults retryQueueNums 1 and retryMaxTimes 16."""
    cfg = parse_config({"groups": {"known": {}}})
    assert cfg.group("known") == GroupConfig(retry_queue_nums=1, retry_max_times=16)
    assert cfg.group("other") == cfg.group_defaults == GroupConfig(retry_queue_nums=1, retry_max_times=16)


@pytest.mark.parametrize(
    ("name", "spelled"),
    [("builtins.ValueError", "ValueError"), ("__main__.Bad", "Bad"), ("ValueError", "ValueError"),
     ("myapp.errors.InvalidOrder", "myapp.errors.InvalidOrder"), ("builtins.", "builtins."), ("__main__.", "__main__.")],
)
def test_b3_error_class_spelling(name: str, spelled: str) -> None:
    """README (Errors that are not retried): builtins.X is X, so is __main__.X; any other module is kept."""
    assert error_class_name(name) == spelled


# -- errors: code, bad value, valid values ----------------------------------------------------------------------------


def test_an_unknown_key_lists_the_valid_keys_of_its_own_section() -> None:
    """STYLE 4: unknown keys are rejected and the valid ones named, those of the section the key is in."""
    engine_keys = ", ".join(sorted(EngineSection.model_fields))
    assert str(config_error({"engine": {"triger_interval": "1s"}})) == (
        f"[INVALID_CONFIG] <config>: unknown key 'engine.triger_interval'; valid keys here: {engine_keys}"
    )
    assert str(config_error({"groups": {"g": {"non_retryable": {"patterns": []}}}})) == (
        "[INVALID_CONFIG] <config>: unknown key 'groups.g.non_retryable.patterns'; "
        "valid keys here: error_classes, error_patterns"
    )
    assert str(config_error({"groups": {"g": {"retry_max_timez": 1}}})) == (
        "[INVALID_CONFIG] <config>: unknown key 'groups.g.retry_max_timez'; "
        "valid keys here: backoff, non_retryable, retry_max_times, retry_queue_nums"
    )
    assert str(config_error({"grups": {}})).startswith("[INVALID_CONFIG] <config>: unknown key 'grups'; valid keys here: dlq, engine, group_defaults, groups, maintenance")


def test_an_unknown_key_of_an_exponential_backoff_lists_the_exponential_keys() -> None:
    """B2: the section of ``{policy = "exponential", ...}`` is the exponential backoff's, not the group's."""
    assert str(config_error({"groups": {"g": {"backoff": {"policy": "exponential", "inital": "1s"}}}})) == (
        "[INVALID_CONFIG] <config>: unknown key 'groups.g.backoff.exponential.inital'; "
        "valid keys here: initial, max, multiplier, policy"
    )
    assert str(config_error({"group_defaults": {"backoff": {"levels": "1s", "firstlevel": 1}}})) == (
        "[INVALID_CONFIG] <config>: unknown key 'group_defaults.backoff.levels.firstlevel'; "
        "valid keys here: first_level, levels, policy"
    )


def test_every_bad_value_is_named_with_what_was_given() -> None:
    assert str(config_error({"engine": {"shuffle_partitions": 0, "max_body_bytes": 0}})) == (
        "[INVALID_CONFIG] <config>: engine.shuffle_partitions: Input should be greater than or equal to 1 (got 0); "
        "engine.max_body_bytes: Input should be greater than or equal to 1 (got 0)"
    )
    # A rule over the whole file has no key: "config", and nothing to show as given.
    assert str(config_error({"maintenance": {"retention": "1h"}})).startswith(
        "[INVALID_CONFIG] <config>: config: Value error, [maintenance] retention '1h' is shorter than the 2h"
    )
    assert str(config_error({"maintenance": {"retention": "1h"}})).endswith("Use '2h' or more")


def test_a_validators_own_error_keeps_its_code_and_message() -> None:
    """STYLE 5: a stable code: [storage]'s own INVALID_STORAGE_OPTION is not turned into INVALID_CONFIG."""
    error = config_error({"storage": "abc"})
    assert error.code == "INVALID_STORAGE_OPTION"
    assert str(error) == (
        "[INVALID_STORAGE_OPTION] <config>: [storage] must be a table of delta-rs storage options (key = value), "
        "got a str"
    )


def test_r4_a_bad_delay_string_names_the_token_and_its_position() -> None:
    error = config_error({"engine": {"message_delay_level": "1s 7q"}})
    assert error.code == "INVALID_DELAY_LEVEL"
    assert str(error) == (
        "[INVALID_DELAY_LEVEL] <config>: level 2 of '1s 7q': bad delay token '7q': expected a positive integer "
        "followed by one of ms, s, m, h, d (e.g. '10s')"
    )


def test_an_unknown_table_names_the_tables() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({}).table_path("dlqs")
    assert str(info.value) == (
        "[INVALID_CONFIG] unknown table 'dlqs'; tables are consume_results, messages, retry, dlq, quarantine, "
        "outcomes, metrics, progress, redrive_audit, redrive_tasks"
    )


def test_a_table_path_override_wins_over_the_lake() -> None:
    cfg = parse_config({"engine": {"lake": "/lake"}, "tables": {"dlq": "/elsewhere/dead"}})
    assert (cfg.table_path("dlq"), cfg.table_path("retry")) == ("/elsewhere/dead", os.path.join("/lake", "retry"))


# -- the file, the environment and --lake -------------------------------------------------------------------------


def test_relative_paths_in_a_file_are_its_folders_and_other_values_are_kept(tmp_path: Path) -> None:
    """conf/retry-engine.toml: relative lake, checkpoint and [tables] paths are relative to the file's folder."""
    conf = tmp_path / "conf" / "engine.toml"
    conf.parent.mkdir()
    conf.write_text('[engine]\nlake = "lake"\ncheckpoint = "ck"\nmaster = "local[1]"\n[tables]\ndlq = "d/dlq"\n')
    cfg = load_config(conf, env={})
    assert (cfg.engine.lake, cfg.engine.checkpoint, cfg.engine.master, cfg.tables.dlq) == (
        str(tmp_path / "conf" / "lake"), str(tmp_path / "conf" / "ck"), "local[1]", str(tmp_path / "conf" / "d" / "dlq"))


def test_a_table_path_that_is_not_text_is_a_config_error_naming_it(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("[tables]\ndlq = 5\n")
    with pytest.raises(ConfigError) as info:
        load_config(conf, env={})
    assert str(info.value) == f"[INVALID_CONFIG] {conf}: tables.dlq: Input should be a valid string (got 5)"


def test_environment_overrides_lake_checkpoint_and_master(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """conf/retry-engine.toml: RETRY_ENGINE_LAKE, RETRY_ENGINE_CHECKPOINT, RETRY_ENGINE_MASTER override the file;
    paths from the environment are the working directory's ("~" expanded), the master URL is kept as given."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    conf = tmp_path / "c.toml"
    conf.write_text('[engine]\nlake = "/file-lake"\ncheckpoint = "/file-ck"\nmaster = "local[1]"\n')
    env = {ENV_LAKE: "~/lake", ENV_CHECKPOINT: "~/ck", ENV_MASTER: "~/not-a-path"}
    cfg = load_config(conf, env=env)
    assert (cfg.engine.lake, cfg.checkpoint_path, cfg.engine.master) == (
        str(tmp_path / "home" / "lake"), str(tmp_path / "home" / "ck"), "~/not-a-path")
    # --lake wins over both.
    assert load_config(conf, env=env, lake="~/cli").engine.lake == str(tmp_path / "home" / "cli")
    # An empty variable is no override.
    assert load_config(conf, env={ENV_CHECKPOINT: ""}).checkpoint_path == "/file-ck"
    # One override leaves the file's other [engine] settings as they are.
    cfg = load_config(conf, env={ENV_LAKE: "/env-lake"})
    assert (cfg.engine.lake, cfg.engine.checkpoint, cfg.engine.master) == ("/env-lake", "/file-ck", "local[1]")


def test_the_process_environment_is_read_when_none_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_CHECKPOINT, str(tmp_path / "from-env"))
    conf = tmp_path / "c.toml"
    conf.write_text("")
    assert load_config(conf).checkpoint_path == str(tmp_path / "from-env")


def test_without_a_file_the_defaults_are_used_and_errors_say_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = load_config(env={})
    assert cfg == EngineConfig() and cfg.engine.lake == "./data/lake"
    with pytest.raises(ConfigError) as info:
        load_config(env={ENV_LAKE: " "})
    assert str(info.value).startswith("[INVALID_CONFIG] <defaults>: engine.lake: Value error, lake is empty")


def test_the_default_file_is_read_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "retry-engine.toml").write_text('[engine]\nmaster = "local[3]"\nshuffle_partitions = 0\n')
    with pytest.raises(ConfigError) as info:
        load_config(env={})
    assert str(info.value) == (
        "[INVALID_CONFIG] conf/retry-engine.toml: engine.shuffle_partitions: Input should be greater than or equal "
        "to 1 (got 0)"
    )


@pytest.mark.parametrize(
    ("make", "code", "message"),
    [
        (lambda p: p / "missing.toml", "CONFIG_NOT_FOUND", "config file {p} does not exist"),
        (lambda p: p, "CONFIG_NOT_FOUND", "config file {p} is a folder; give the TOML file"),
    ],
)
def test_a_config_file_that_cannot_be_read_is_named(tmp_path: Path, make: object, code: str, message: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.code == code and str(info.value) == f"[{code}] " + message.format(p=path)


def test_a_config_file_that_is_not_toml_is_named(tmp_path: Path) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text("[engine\n")
    with pytest.raises(ConfigError) as info:
        load_config(conf, env={})
    assert info.value.code == "CONFIG_NOT_TOML"
    assert str(info.value).startswith(f"[CONFIG_NOT_TOML] {conf} is not valid TOML: ")


def test_a_backoff_cap_of_many_years_still_means_no_cap(tmp_path: Path) -> None:
    """A delay, like a delay level, is not bounded by the settings' 100 years: a cap past them is a way to
    say "no cap" (its due times past the calendar are quarantined, DUE_AT_OUT_OF_RANGE)."""
    conf = tmp_path / "c.toml"
    conf.write_text('[groups.G.backoff]\npolicy = "exponential"\nmax = "999999d"\n')
    assert load_config(conf, env={}).groups["G"].backoff.max == "999999d"  # type: ignore[union-attr]


@pytest.mark.parametrize("huge", ["initial", "max"])
def test_an_exponential_delay_past_the_calendar_still_retries_and_caps(huge: str) -> None:
    """(found by a review) initial or max of 10**30 days overflowed the float arithmetic: every failure of the group
    was quarantined as DECIDE_FAILED, even its first 1 s retry. Held at the calendar: a cap past it is no cap,
    and an initial delay past it waits the cap (default 1h), as min(initial * multiplier**n, max) says."""
    from retry_engine.core.delays import CALENDAR_MS

    backoff = {"policy": "exponential", huge: "1" + "0" * 30 + "d"}
    config = parse_config({"groups": {"G": {"backoff": backoff}}})
    policy = config.policy(config.group("G"))  # type: ignore[arg-type]
    if huge == "max":
        assert [policy.delay_ms(n) for n in (1, 2, 3)] == [1_000, 2_000, 4_000] and policy.delay_ms(99) == CALENDAR_MS
    else:
        assert policy.delay_ms(1) == policy.delay_ms(99) == 3_600_000


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"\xff\xfe[engine]\n", "is not valid TOML: not UTF-8 text"),
        (b"engine = 5\n", "engine must be a table ([engine] with keys), got int 5"),
        (b'engine = "abc"\n', "engine must be a table ([engine] with keys), got str 'abc'"),
        (b'engine = [["lake", "/x"]]\n', "engine must be a table ([engine] with keys), got list"),
        (b'[engine]\ndedup_window = "1000000d"\n', "is longer than 36500d"),
        (b'[engine]\nlease_timeout = "99999999999999999999d"\n', "is longer than 36500d"),
        (b'[dlq]\nresolved_retention = "1000000d"\n', "is longer than 36500d"),
        # Found by a review: accepted, and they changed what the engine does.
        (b'[groups.G.backoff]\npolicy = "exponential"\nmultiplier = inf\n', "multiplier: Input should be a finite number"),
        (b'[engine]\ncheckpoint = "   "\n', "checkpoint is blank"),
        (b'[engine]\nlease_timeout = "1ms"\n', "'1ms' is shorter than 5s"),
        (b'[engine]\nlease_timeout = "4999ms"\n', "is shorter than 5s"),
    ],
)
def test_hostile_config_files_are_one_clear_error(tmp_path: Path, text: bytes, message: str) -> None:
    """Hostile input (the config file): not UTF-8, a section that is no table, durations past any time
    (they overflowed where added to a time): a ConfigError naming the file, never a traceback."""
    conf = tmp_path / "hostile.toml"
    conf.write_bytes(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(conf, env={})


@pytest.mark.parametrize(
    ("value", "base", "resolved"),
    [
        ("  ", "/base", "  "),  # blank: left for the lake check to refuse
        ("s3://bucket/lake", "/base", "s3://bucket/lake"),
        ("file:///srv/lake", "/base", "file:///srv/lake"),
        ("rel/x", None, "rel/x"),
        ("/abs/x", "/base", "/abs/x"),
        ("rel/../x", "/base", "/base/x"),
        ("~/x", "/base", "HOME/x"),
    ],
)
def test_resolve_path(value: str, base: str | None, resolved: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_path(value, base) == resolved.replace("HOME", str(tmp_path))


# -- [maintenance] retention ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "hours"),
    [("0", 0), (" 0 ", 0), ("0h", 0), ("0d", 0), ("2d", 48), ("7d", 168), ("5h", 5), ("876000h", 876000),
     ("36500d", 876000)],
)
def test_retention_in_whole_hours(text: str, hours: int) -> None:
    assert parse_retention_hours(text) == hours


def test_retention_errors_name_the_setting_the_value_and_the_limit() -> None:
    with pytest.raises(ConfigError) as info:
        parse_retention_hours("7D")
    assert info.value.code == "INVALID_RETENTION"
    assert str(info.value) == (
        "[INVALID_RETENTION] retention '7D' is not a retention: give a whole number of hours or days such as '7d' "
        "or '168h' (Delta vacuums in whole hours; no minutes, fractions or signs)"
    )
    with pytest.raises(ConfigError) as info:
        parse_retention_hours("876001h", name="--retention")
    assert info.value.code == "INVALID_RETENTION"
    assert str(info.value) == (
        "[INVALID_RETENTION] --retention '876001h' is 876001 hours, more than the 876000 (100 years) allowed"
    )


def test_the_retention_floor_in_milliseconds() -> None:
    """The floor is the longest trigger (trigger or progress flush) plus the shortest maintenance period."""
    default = parse_config({})
    assert minimum_retention_ms(default.engine, default.maintenance) == 5_000 + 3_600_000  # 5 s flush + 1 h
    by_batches = parse_config({"engine": {"trigger_interval": "1m"}, "maintenance": {"every_batches": 10}})
    assert minimum_retention_ms(by_batches.engine, by_batches.maintenance) == 60_000 + 10 * 60_000
    off = parse_config({"engine": {"trigger_interval": "2m"}, "maintenance": {"engine_tables": False}})
    assert minimum_retention_ms(off.engine, off.maintenance) == 120_000
    assert minimum_retention_hours(off.engine, off.maintenance) == 1  # rounded up to whole hours
    exact = parse_config({"engine": {"trigger_interval": "30m", "progress_flush_interval": "30m"},
                          "maintenance": {"interval": "off", "every_batches": 1}})
    assert minimum_retention_hours(exact.engine, exact.maintenance) == 1  # exactly 1 h stays 1 h
