"""The decision step on plain Arrow batches (R1, R2, R5-R7, R10, R14, B3, bad input)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from retry_engine.config import parse_config
from retry_engine.core.decide import BATCH_TS, POSITION, Decider, check_input_schema, new_msg_id
from retry_engine.errors import SchemaMismatchError
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import T0, Result, results_table

NOW = T0 + dt.timedelta(seconds=2)


def run(results: list[Result], config: dict[str, Any] | None = None, table: pa.Table | None = None) -> list[dict[str, Any]]:
    table = table if table is not None else results_table(results)
    n = table.num_rows
    table = table.append_column(POSITION, pa.array([f"p{i:04d}" for i in range(n)])).append_column(
        BATCH_TS, pa.array([NOW] * n, type=pa.timestamp("us", tz="UTC"))
    )
    out = Decider(parse_config(config or {}))(table.to_batches()[0])
    return out.to_pylist()


def test_r1_success_is_acknowledged_and_failures_retry() -> None:
    rows = run([
        Result.of().ok(),
        Result.of().failed(),
        Result.of().with_(status=None),
        Result.of().with_(status="EXCEPTION", error_class="NullPointerException"),
    ])
    assert [r["outcome"] for r in rows] == ["acknowledged", "retry", "retry", "retry"]


def test_r2_broadcasting_failure_is_a_recorded_drop() -> None:
    (row,) = run([Result.of().failed(message_model="BROADCASTING")])
    assert row["outcome"] == "dropped" and row["reason_code"] == "BROADCASTING_NOT_RETRIED"


def test_r3_r7_retry_message_copy_rules() -> None:
    src = Result.of("M-first").failed(reconsume_times=0)
    (row,) = run([src])
    v = src.values
    assert row["topic"] == "%RETRY%G" and row["retry_topic"] == "orders"
    assert row["msg_id"] != "M-first" and row["msg_id"] == new_msg_id("G", "M-first", "retry")
    assert row["origin_msg_id"] == "M-first" and row["reconsume_times"] == 1
    for name in ("tags", "keys", "body", "flag", "born_host"):
        assert row[name] == v[name], name
    assert row["born_timestamp"] == v["born_timestamp"]
    assert row["properties"] == [("color", "red")]
    assert row["delivery_key"] == "M-first:1"  # R14


def test_r14_a_redriven_message_keeps_its_redrive_count_in_the_delivery_key() -> None:
    """A re-drive resets reconsume times: without the count the key would repeat one already delivered."""
    redriven = Result.of("M-again").failed(properties=[("REDRIVE_COUNT", "2")], origin_msg_id="M-origin")
    odd = Result.of("M-odd").failed(properties=[("REDRIVE_COUNT", "many")])
    first, second = run([redriven, odd])
    assert first["delivery_key"] == "M-origin:1:r2" and second["delivery_key"] == "M-odd:1"


def test_r3_r7_origin_and_retry_topic_survive_later_retries() -> None:
    again = Result.of("M-retry-3", topic="%RETRY%G").failed(
        reconsume_times=3, origin_msg_id="M-first", retry_topic="orders"
    )
    (row,) = run([again])
    assert row["origin_msg_id"] == "M-first" and row["retry_topic"] == "orders"
    assert row["reconsume_times"] == 4 and row["delay_level"] == 6


def test_r5_levels_and_r8_due_time() -> None:
    rows = run([
        Result.of().failed(reconsume_times=0),
        Result.of().failed(delay_level_when_next_consume=1),
        Result.of().failed(delay_level_when_next_consume=40),
    ])
    assert [r["delay_level"] for r in rows] == [3, 1, 18]
    assert [r["schedule_queue_id"] for r in rows] == [2, 0, 17]
    assert rows[0]["scheduled_at"] == NOW and rows[0]["due_at"] == NOW + dt.timedelta(seconds=10)
    assert rows[2]["due_at"] == NOW + dt.timedelta(hours=2)


def test_r5_negative_level_goes_to_dlq() -> None:
    (row,) = run([Result.of("M9").failed(delay_level_when_next_consume=-1)])
    assert row["outcome"] == "dead_letter" and row["reason_code"] == "DLQ_REQUESTED"
    assert row["topic"] == "%DLQ%G" and row["reconsume_times"] == 1 and row["origin_msg_id"] == "M9"


def test_r6_attempt_limit_from_group_and_override() -> None:
    rows = run(
        [
            Result.of(group="g3").failed(reconsume_times=2),
            Result.of(group="g3").failed(reconsume_times=3),
            Result.of().failed(reconsume_times=15),
            Result.of().failed(reconsume_times=16),
            Result.of().failed(reconsume_times=1, max_reconsume_times=1),
        ],
        {"groups": {"g3": {"retry_max_times": 3}}},
    )
    assert [r["outcome"] for r in rows] == ["retry", "dead_letter", "retry", "dead_letter", "dead_letter"]
    assert rows[3]["reason_code"] == "MAX_RECONSUME_TIMES" and rows[3]["reconsume_times"] == 17


def test_r10_retry_disabled_and_unknown_group() -> None:
    cfg = {"engine": {"auto_create_groups": False}, "groups": {"off": {"retry_queue_nums": 0}}}
    rows = run([Result.of(group="off").failed(), Result.of(group="ghost").failed(), Result.of(group="ghost").ok()], cfg)
    assert rows[0]["outcome"] == "dropped" and rows[0]["reason_code"] == "RETRY_DISABLED"
    assert rows[1]["outcome"] == "quarantined" and rows[1]["reason_code"] == "SUBSCRIPTION_GROUP_NOT_EXIST"
    assert rows[2]["outcome"] == "acknowledged"


def test_b3_non_retryable_errors_go_straight_to_dlq() -> None:
    cfg = {"groups": {"G": {"non_retryable": {"error_classes": ["BadOrder"], "error_patterns": ["(?i)malformed"]}}}}
    rows = run(
        [
            Result.of().failed(error_class="BadOrder"),
            Result.of().failed(error_message="MALFORMED json at 3"),
            Result.of().failed(error_class="Timeout"),
        ],
        cfg,
    )
    assert [r["outcome"] for r in rows] == ["dead_letter", "dead_letter", "retry"]
    assert rows[0]["reason_code"] == "NON_RETRYABLE"


def test_b4_attempt_history_travels() -> None:
    prior = [{"reconsume_times": 0, "consumer_group": "G", "consumer_id": "a", "status": "RECONSUME_LATER",
              "error_class": "E0", "error_message": "first", "consumed_at": T0, "delay_level": 3}]
    (row,) = run([Result.of().failed(reconsume_times=1, attempts=prior, error_class="E1", error_message="second")])
    assert [a["error_class"] for a in row["attempts"]] == ["E0", "E1"]
    assert row["attempts"][1]["delay_level"] == 4 and row["error_message"] == "second"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"status": "MAYBE"}, "UNKNOWN_STATUS"),
        ({"msg_id": None}, "MISSING_MSG_ID"),
        ({"consumer_group": None}, "MISSING_GROUP"),
        ({"consumer_group": "../etc"}, "INVALID_GROUP_NAME"),
        ({"topic": "a b"}, "INVALID_TOPIC_NAME"),
        ({"message_model": "MULTICAST"}, "UNKNOWN_MESSAGE_MODEL"),
        ({"body": b"x" * 33}, "BODY_TOO_LARGE"),
        ({"reconsume_times": -2}, "INVALID_RECONSUME_TIMES"),
        ({"max_reconsume_times": -7}, "INVALID_MAX_RECONSUME_TIMES"),
    ],
)
def test_bad_input_is_quarantined_with_reason(change: dict[str, Any], code: str) -> None:
    rows = run([Result.of().with_(**change), Result.of().ok()], {"engine": {"max_body_bytes": 32}})
    assert rows[0]["outcome"] == "quarantined" and rows[0]["reason_code"] == code
    assert rows[0]["reason"] and rows[0]["raw"]
    assert rows[1]["outcome"] == "acknowledged"


def test_wrong_types_are_quarantined_per_row() -> None:
    loose = pa.schema([pa.field(f.name, pa.string() if f.name == "delay_level_when_next_consume" else f.type)
                       for f in CONSUME_RESULTS.arrow_schema])
    results = [Result.of().failed(delay_level_when_next_consume="2"), Result.of().failed(delay_level_when_next_consume="soon")]
    rows = run([], table=results_table(results, loose))
    assert rows[0]["outcome"] == "retry" and rows[0]["delay_level"] == 2
    assert rows[1]["outcome"] == "quarantined" and rows[1]["reason_code"] == "WRONG_TYPE"
    assert "delay_level_when_next_consume" in rows[1]["reason"] and "'soon'" in rows[1]["reason"]


def test_missing_required_column_is_a_startup_error() -> None:
    schema = pa.schema([f for f in CONSUME_RESULTS.arrow_schema if f.name != "status"])
    with pytest.raises(SchemaMismatchError, match="'status'"):
        check_input_schema(schema)


def test_decisions_are_deterministic() -> None:
    results = [Result.of().failed(), Result.of().ok(), Result.of().with_(status="??")]
    assert run(results) == run(results)


def test_a_retry_topic_that_is_no_topic_name_is_quarantined() -> None:
    """SPEC bad input: names are validated like RocketMQ's before they go near a path. The original topic
    (R3's ``retry_topic``) was copied unchecked onto the retry and the dead letter, and a re-drive writes to
    it; now it is checked as ``topic`` is (INVALID_TOPIC_NAME naming the column), blank meaning ``topic``."""
    rows = run([
        Result.of("M0").failed(retry_topic="../../x", reconsume_times=16),
        Result.of("M1").failed(retry_topic="a/b\x1b[2J"),
        Result.of("M2").with_(retry_topic="orders\n").ok(),
        Result.of("M3").failed(retry_topic="x" * (127 + len("%RETRY%") + 1)),
        Result.of("M4").failed(retry_topic="orders-v2"),
        Result.of("M5").failed(retry_topic=""),
        Result.of("M6").failed(retry_topic="%RETRY%G"),
        Result.of("M7").failed(retry_topic="   "),  # only spaces: no name, and not topic either
    ])
    assert [(r["outcome"], r["reason_code"]) for r in rows[:4]] == [("quarantined", "INVALID_TOPIC_NAME")] * 4
    assert (rows[7]["outcome"], rows[7]["reason_code"]) == ("quarantined", "INVALID_TOPIC_NAME")
    assert rows[0]["reason"] == "retry_topic '../../x' must match [%|a-zA-Z0-9_-]{1,127}"
    assert [(r["outcome"], r["retry_topic"]) for r in rows[4:7]] == [
        ("retry", "orders-v2"), ("retry", "orders"), ("retry", "%RETRY%G"),
    ]
