"""Every name check matches the whole value (SPEC bad-input rule; #12 item 15).

``re.match(r"^[...]+$")`` accepts ``"g\\n"``: ``$`` also matches just before a
final newline. Such a name passed the producer and consumer checks and was only
quarantined later. Each check below gets the same hostile values: trailing and
leading line breaks, a NUL, Unicode lookalikes of valid characters, and the
longest valid name next to one character more.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from retry_engine.clients.consumer import Consumer
from retry_engine.clients.dlq import Selection
from retry_engine.clients.producer import Producer
from retry_engine.config import parse_config
from retry_engine.core.decide import BATCH_TS, POSITION, Decider
from retry_engine.core.delays import parse_duration_ms
from retry_engine.core.names import (
    GROUP_MAX_LENGTH,
    TOPIC_MAX_LENGTH,
    parse_redrive_count,
    validate_group,
    validate_topic,
)
from retry_engine.errors import ConfigError, DelayLevelError, InvalidNameError
from retry_engine.ops.redrive import redrive
from tests.builders import T0, Result, results_table

# Line breaks Python's ``$`` (\n) or Java's ``$`` (\r\n, \r, \u2028, \u0085) let through at the end,
# a NUL, and lookalikes: Cyrillic o, fullwidth g, zero-width space, Arabic-Indic digit three.
HOSTILE_SUFFIXES = ["\n", "\r\n", "\r", "\u2028", "\u0085", "\x00", "\u200b", "\u0663"]
HOSTILE_NAMES = (
    [f"g{s}" for s in HOSTILE_SUFFIXES]
    + ["\ng", "\n", "g\nh", "\u043erders", "\uff47", "g\u200bh", " g", "g "]
)


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_group_and_topic_names_are_refused(name: str) -> None:
    """SPEC bad input: characters outside ``%|a-zA-Z0-9_-`` anywhere, a final newline included."""
    with pytest.raises(InvalidNameError, match=r"\[INVALID_GROUP_NAME\].*characters outside"):
        validate_group(name)
    with pytest.raises(InvalidNameError, match=r"\[INVALID_TOPIC_NAME\].*characters outside"):
        validate_topic(name)


def test_names_at_the_length_limit_pass_and_one_more_is_refused() -> None:
    """SPEC bad input (bounded length): RocketMQ's 127 for topics, 255 for groups."""
    assert validate_topic("t" * TOPIC_MAX_LENGTH) == "t" * TOPIC_MAX_LENGTH
    assert validate_group("g" * GROUP_MAX_LENGTH) == "g" * GROUP_MAX_LENGTH
    with pytest.raises(InvalidNameError, match=rf"\[INVALID_TOPIC_NAME\].*128 characters; at most {TOPIC_MAX_LENGTH}"):
        validate_topic("t" * (TOPIC_MAX_LENGTH + 1))
    with pytest.raises(InvalidNameError, match=rf"\[INVALID_GROUP_NAME\].*256 characters; at most {GROUP_MAX_LENGTH}"):
        validate_group("g" * (GROUP_MAX_LENGTH + 1))
    # A newline does not sneak in under the limit either.
    with pytest.raises(InvalidNameError, match=r"\[INVALID_TOPIC_NAME\]"):
        validate_topic("t" * (TOPIC_MAX_LENGTH - 1) + "\n")


@pytest.mark.parametrize("name", ["orders\n", "orders\r\n", "\norders", "orders\x00", "\u043erders"])
def test_producer_refuses_a_hostile_topic_before_writing(tmp_path: Path, name: str) -> None:
    """#12 item 15: the producer's check is the first one a name meets; nothing is written."""
    producer = Producer(str(tmp_path / "messages"))
    with pytest.raises(InvalidNameError, match=r"\[INVALID_TOPIC_NAME\]"):
        producer.send(name, b"x")
    if (tmp_path / "messages" / "_delta_log").exists():
        assert DeltaTable(str(tmp_path / "messages")).to_pyarrow_table().num_rows == 0


@pytest.mark.parametrize("name", ["G\n", "G\r\n", "\nG", "G\x00", "\uff27"])
def test_consumer_refuses_a_hostile_group_and_topic(name: str) -> None:
    """#12 item 15: the consumer checks its group and every subscribed topic, whole."""
    config = parse_config({})
    with pytest.raises(InvalidNameError, match=r"\[INVALID_GROUP_NAME\]"):
        Consumer(None, config, group=name)  # type: ignore[arg-type]
    with pytest.raises(InvalidNameError, match=r"\[INVALID_TOPIC_NAME\]"):
        Consumer(None, config, group="G").subscribe(name)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["g\n", "g\r\n", "\ng", "g\x00"])
def test_config_refuses_a_hostile_group_key(name: str) -> None:
    """#12 item 15: a ``[groups."g\\n"]`` table in the config is a startup error, not a group."""
    with pytest.raises(ConfigError, match="characters outside"):
        parse_config({"groups": {name: {}}})


def _decide(result: Result) -> dict[str, Any]:
    table = results_table([result])
    table = table.append_column(POSITION, pa.array(["p0"])).append_column(
        BATCH_TS, pa.array([T0 + dt.timedelta(seconds=2)], type=pa.timestamp("us", tz="UTC"))
    )
    rows: list[dict[str, Any]] = Decider(parse_config({}))(table.to_batches()[0]).to_pylist()
    return rows[0]


@pytest.mark.parametrize("name", ["G\n", "G\r\n", "\nG", "G\x00", "G\u2028", "\uff27"])
def test_decide_quarantines_hostile_names_in_consume_results(name: str) -> None:
    """SPEC bad input, #12 item 15: decide's Arrow check (RE2) matches the whole value too.

    RE2's ``$`` (unlike Python's and Java's) never matches before a final
    newline; the pattern says ``\\z`` so that holds whatever the engine.
    """
    group_row = _decide(Result.of().failed().with_(consumer_group=name))
    assert (group_row["outcome"], group_row["reason_code"]) == ("quarantined", "INVALID_GROUP_NAME")
    topic_row = _decide(Result.of().failed().with_(topic=name))
    assert (topic_row["outcome"], topic_row["reason_code"]) == ("quarantined", "INVALID_TOPIC_NAME")


@pytest.mark.parametrize("token", ["10s\n", "10s\r\n", "\n10s", "10s\x00", "1\u0660s"])
def test_delay_token_must_be_whole(token: str) -> None:
    """R4: a token is a positive integer plus a unit, nothing after it."""
    with pytest.raises(DelayLevelError, match="bad delay token"):
        parse_duration_ms(token, delay=True)


@pytest.mark.parametrize("value", ["3\n", "3\r\n", "\n3", "3\x00", "3\u2028"])
def test_redrive_count_with_a_line_break_is_not_a_count(value: str) -> None:
    """R14 / B5: only 1-9 ASCII digits, whole, are a re-drive count; anything else reads as 0."""
    assert parse_redrive_count(value) == 0


@pytest.mark.parametrize("redrive_id", ["fix-42\n", "fix-42\r\n", "\nfix-42", "fix-42\x00", "../fix", "x" * 65, 42])
def test_redrive_id_must_be_whole(redrive_id: object) -> None:
    """B5: an operator's re-drive id is checked whole before anything is read or moved."""
    with pytest.raises(ConfigError, match=r"\[INVALID_OPTION\] redrive id"):
        redrive(parse_config({}), Selection(group="G"), target="topic", redrive_id=redrive_id)  # type: ignore[arg-type]
