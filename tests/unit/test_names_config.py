from __future__ import annotations

from pathlib import Path

import pytest

from retry_engine.config import ENV_LAKE, ENV_MASTER, GroupConfig, load_config, parse_config
from retry_engine.core.names import dlq_topic, retry_topic, validate_group, validate_topic
from retry_engine.errors import ConfigError, InvalidNameError


def test_r3_per_group_topics() -> None:
    assert retry_topic("G1") == "%RETRY%G1"
    assert dlq_topic("G1") == "%DLQ%G1"


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "a b", "x" * 128, None, 5])
def test_invalid_topic_names_rejected(bad: object) -> None:
    with pytest.raises(InvalidNameError, match="INVALID_TOPIC_NAME"):
        validate_topic(bad)


def test_valid_names_pass() -> None:
    assert validate_group("%RETRY%g|x_y-1") == "%RETRY%g|x_y-1"
    assert validate_group("g" * 255) == "g" * 255 and validate_topic("t" * 127) == "t" * 127
    with pytest.raises(InvalidNameError, match="at most 255"):
        validate_group("g" * 256)


def test_invalid_names_say_what_they_are_and_what_is_valid() -> None:
    """SPEC (names validated like RocketMQ's): the message names the kind of name, the value and the characters."""
    with pytest.raises(InvalidNameError) as info:
        validate_group("a/b")
    assert str(info.value) == "[INVALID_GROUP_NAME] group name 'a/b' has characters outside [%|a-zA-Z0-9_-]"
    with pytest.raises(InvalidNameError) as info:
        validate_topic("")
    assert str(info.value) == "[INVALID_TOPIC_NAME] topic name is missing"
    with pytest.raises(InvalidNameError) as info:
        validate_topic(5)
    assert str(info.value) == "[INVALID_TOPIC_NAME] topic name must be a string, got int"
    with pytest.raises(InvalidNameError) as info:
        validate_group("g" * 300)
    # A long name is shown by its first 40 characters.
    assert str(info.value) == f"[INVALID_GROUP_NAME] group name {'g' * 40!r}... is 300 characters; at most 255 allowed"


def test_unknown_config_key_names_valid_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'engine.triger_interval'.*trigger_interval"):
        parse_config({"engine": {"triger_interval": "1s"}})


def test_group_config_validated() -> None:
    with pytest.raises(ConfigError, match="retry_max_times"):
        parse_config({"groups": {"g": {"retry_max_times": -3}}})
    with pytest.raises(ConfigError, match="not a valid regex"):
        parse_config({"groups": {"g": {"non_retryable": {"error_patterns": ["("]}}}})
    with pytest.raises(ConfigError, match="characters outside"):
        parse_config({"groups": {"a/b": {}}})


def test_r4_bad_delay_string_is_a_startup_error() -> None:
    with pytest.raises(ConfigError, match="'7q'"):
        parse_config({"engine": {"message_delay_level": "1s 7q"}})


def test_r10_unknown_group_only_when_auto_create_off() -> None:
    cfg = parse_config({"engine": {"auto_create_groups": False}, "groups": {"known": {"retry_max_times": 3}}})
    assert cfg.group("known") == GroupConfig(retry_max_times=3) and cfg.group("other") is None
    # Auto-created: the group defaults, RocketMQ's (seed 002: retryQueueNums 1, retryMaxTimes 16).
    assert parse_config({}).group("other") == GroupConfig(retry_queue_nums=1, retry_max_times=16)


def test_env_overrides_paths_and_master(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('[engine]\nlake = "/nowhere"\n')
    cfg = load_config(conf, env={ENV_LAKE: str(tmp_path / "lake"), ENV_MASTER: "spark://h:7077"})
    assert cfg.engine.master == "spark://h:7077"
    assert cfg.table_path("dlq") == str(tmp_path / "lake" / "dlq")


def test_shipped_config_file_is_valid() -> None:
    cfg = load_config(Path(__file__).parents[2] / "conf" / "retry-engine.toml", env={})
    # The values its comments promise: R4's default levels, the engine's 1 s clock, RocketMQ's 4 MiB body limit.
    assert cfg.engine.trigger_interval == "1s" and cfg.trigger_interval_ms == 1000
    assert cfg.engine.message_delay_level == "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
    assert cfg.engine.max_body_bytes == 4 * 1024 * 1024 and cfg.engine.auto_create_groups is True


def test_b2_custom_level_list_without_policy_key() -> None:
    cfg = parse_config({"groups": {"g": {"backoff": {"levels": "1s 2s", "first_level": 1}}}})
    group = cfg.group("g")
    assert group is not None
    policy = cfg.policy(group)
    assert policy.first_level == 1 and [policy.delay_ms(n) for n in (1, 2, 5)] == [1000, 2000, 2000]


def test_r14_delivery_key_adds_the_redrive_count_only_once_redriven() -> None:
    from retry_engine.core.names import delivery_key, redrive_count

    assert delivery_key("O", 3) == "O:3" and delivery_key("O", 0, 1) == "O:0:r1"
    assert [redrive_count(p) for p in (None, {}, {"REDRIVE_COUNT": "4"}, {"REDRIVE_COUNT": "-1"})] == [0, 0, 4, 0]


@pytest.mark.parametrize(
    ("value", "count"),
    [(None, 0), ("", 0), ("3", 3), ("007", 7), ("+2", 0), (" 2", 0), ("2 ", 0), ("²", 0), ("٣", 0),
     ("lots", 0), ("-1", 0), ("123456789", 123456789), ("1234567890", 0), ("9" * 5000, 0)],
)
def test_r14_one_rule_for_what_a_redrive_count_is(value: str | None, count: int) -> None:
    """Never raises: the property is a user's as much as the engine's (bad input must not stop a batch)."""
    from retry_engine.core.names import parse_redrive_count

    assert parse_redrive_count(value) == count
