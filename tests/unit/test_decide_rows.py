"""Every column of every outcome row, and the edges of each rule (issue #16: mutation testing).

The other decide tests check the headline of each rule; mutations that change
a column nobody looked at, or move a boundary by one, survived them. Here the
expected rows are written out in full from SPEC (R1-R10, R14, B1, B3, B4, the
bad-input rule) and the seeds' RocketMQ code (``SendMessageProcessor``,
``DefaultMQPushConsumerImpl.getMaxReconsumeTimes``), never computed by decide.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from retry_engine.config import EngineConfig, parse_config
from retry_engine.core.decide import (
    BATCH_TS,
    NO_STATE_BUCKET,
    POSITION,
    UNDATED_BUCKET,
    Decider,
    cast_column,
    check_input_schema,
    decide,
    new_msg_id,
    new_msg_ids,
    truncate_error,
)
from retry_engine.errors import ConfigError, SchemaMismatchError
from retry_engine.schemas import CONSUME_RESULTS, WORK
from tests.builders import T0, Result, hostile_array, results_table

NOW = T0 + dt.timedelta(seconds=2)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
TS = pa.timestamp("us", tz="UTC")
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)


def with_clock(table: pa.Table, batch_ts: dt.datetime | None = NOW, ts_type: pa.DataType = TS) -> pa.RecordBatch:
    """``table`` as the engine hands it to decide: source positions p0000.. and the batch clock."""
    n = table.num_rows
    table = table.append_column(POSITION, pa.array([f"p{i:04d}" for i in range(n)])).append_column(
        BATCH_TS, pa.array([batch_ts] * n, type=ts_type)
    )
    return table.combine_chunks().to_batches()[0] if n else pa.RecordBatch.from_pylist([], schema=table.schema)


def run(
    results: list[Result], config: dict[str, Any] | EngineConfig | None = None, *, table: pa.Table | None = None,
    batch_ts: dt.datetime | None = NOW, ts_type: pa.DataType = TS,
) -> list[dict[str, Any]]:
    engine_config = config if isinstance(config, EngineConfig) else parse_config(config or {})
    batch = with_clock(table if table is not None else results_table(results), batch_ts, ts_type)
    return Decider(engine_config)(batch).to_pylist()


def bucket_of(t: dt.datetime, seconds: int = 10) -> int:
    """R8 keys the schedule state by store time: the floor of store time / bucket (default 10 s)."""
    return (t - EPOCH) // dt.timedelta(seconds=seconds)


def derived_id(group: str, msg_id: str, target: str) -> str:
    """The documented derivation of a retry's or dead letter's id (B1): sha1(group NUL id NUL target), 32 hex digits."""
    return hashlib.sha1(f"{group}\0{msg_id}\0{target}".encode()).hexdigest()[:32].upper()


NULL_ROW = {name: None for name in WORK.arrow_schema.names}


def copied(result: Result) -> dict[str, Any]:
    """The message columns every row decided one by one carries (R7's copy list)."""
    return {k: result.values[k] for k in ("tags", "keys", "body", "flag", "properties", "born_timestamp", "born_host")}


# -- the rows, column by column ---------------------------------------------------------------------------


def test_r3_r7_r8_b4_a_retry_row_column_by_column() -> None:
    src = Result.of("M-R").failed()
    (row,) = run([src])
    v = src.values
    assert row == {
        **NULL_ROW,
        "kind": "outcome",
        "route": "G",
        "bucket": bucket_of(v["store_timestamp"]),  # R8: keyed by when the consumed message was stored
        "msg_id": "DEF00ECA692641629F135925C80BD2EF",  # a new message (R7); golden: stable across releases (B1)
        "topic": "%RETRY%G",  # R3: the group's retry topic
        "tags": "TagA", "keys": "k1 k2", "body": b"body-M-R", "flag": 7, "properties": [("color", "red")],
        "born_timestamp": T0 - dt.timedelta(seconds=5), "born_host": "10.0.0.1:5000",  # R7: copied
        "queue_id": 0,  # retry_queue_nums = 1 (RocketMQ's default): one retry queue
        "reconsume_times": 1,
        "origin_msg_id": "M-R",
        "retry_topic": "orders",  # R3: the original topic travels as RETRY_TOPIC
        "attempts": [
            {"reconsume_times": 0, "consumer_group": "G", "consumer_id": "c1@host", "status": "RECONSUME_LATER",
             "error_class": "java.lang.RuntimeException", "error_message": "boom", "consumed_at": T0,
             "delay_level": 3}
        ],
        "consumer_group": "G",
        "delay_level": 3,  # R5: 3 + reconsumeTimes
        "schedule_queue_id": 2,  # R8: level - 1
        "scheduled_at": NOW,
        "due_at": NOW + dt.timedelta(seconds=10),  # level 3 of the default levels: 10 s
        "error_class": "java.lang.RuntimeException", "error_message": "boom",  # B4
        "delivery_key": "M-R:1",  # R14
        "source_result_id": v["result_id"],
        "result_id": v["result_id"],
        "source_position": "p0000",
        "outcome": "retry",
        "output_msg_id": "DEF00ECA692641629F135925C80BD2EF",
        "decided_at": NOW,
        "consumed_msg_id": "M-R",
        "consumed_reconsume_times": 0,
    }
    assert row["msg_id"] == derived_id("G", "M-R", "retry")


def test_r6_r7_r9_a_dead_letter_row_column_by_column() -> None:
    """R6: reconsumeTimes 16 >= the default 16 goes to %DLQ%G, queue 0 (RocketMQ: DLQ_NUMS_PER_GROUP = 1)."""
    src = Result.of("M-D").failed(reconsume_times=16, origin_msg_id="M-0", retry_topic="orders", topic="%RETRY%G")
    (row,) = run([src])
    v = src.values
    assert row == {
        **NULL_ROW,
        "kind": "outcome",
        "route": "G",
        "bucket": bucket_of(v["store_timestamp"]),  # dead letters meet their duplicates in the state (B1)
        "msg_id": "E42495FFE2ADA1C6EA305F0AC5EDDC6F",
        "topic": "%DLQ%G",
        "tags": "TagA", "keys": "k1 k2", "body": b"body-M-D", "flag": 7, "properties": [("color", "red")],
        "born_timestamp": T0 - dt.timedelta(seconds=5), "born_host": "10.0.0.1:5000",
        "store_timestamp": NOW,
        "queue_id": 0,
        "reconsume_times": 17,
        "origin_msg_id": "M-0",
        "retry_topic": "orders",
        "attempts": [
            {"reconsume_times": 16, "consumer_group": "G", "consumer_id": "c1@host", "status": "RECONSUME_LATER",
             "error_class": "java.lang.RuntimeException", "error_message": "boom", "consumed_at": T0,
             "delay_level": None}  # a dead letter waits for no level
        ],
        "consumer_group": "G",
        "error_class": "java.lang.RuntimeException", "error_message": "boom",
        "delivery_key": "M-0:17",
        "source_result_id": v["result_id"],
        "dead_lettered_at": NOW,
        "reason_code": "MAX_RECONSUME_TIMES",
        "reason": "reconsume_times 16 reached max_reconsume_times 16 (R6)",
        "result_id": v["result_id"],
        "source_position": "p0000",
        "outcome": "dead_letter",
        "output_msg_id": "E42495FFE2ADA1C6EA305F0AC5EDDC6F",
        "decided_at": NOW,
        "consumed_msg_id": "M-D",
        "consumed_origin_msg_id": "M-0",
        "consumed_reconsume_times": 16,
    }
    assert row["msg_id"] == derived_id("G", "M-D", "dlq")


def test_r1_r14_an_acknowledgement_row_column_by_column() -> None:
    """R1: a success is acknowledged: an outcome row only, no message copied, no state bucket."""
    named = Result.of("M-A").ok().with_(topic="%RETRY%G", retry_topic="orders", origin_msg_id="M-0", reconsume_times=2)
    unnamed = Result.of("M-B").ok().with_(result_id=None)
    fail = Result.of("M-F").failed()
    rows = run([named, unnamed, fail])
    assert rows[0] == {
        **NULL_ROW,
        "kind": "outcome", "route": "G", "bucket": NO_STATE_BUCKET,
        "result_id": named.values["result_id"], "source_position": "p0000", "decided_at": NOW,
        "consumer_group": "G", "retry_topic": "orders", "consumed_msg_id": "M-A", "consumed_origin_msg_id": "M-0",
        "consumed_reconsume_times": 2, "outcome": "acknowledged",
    }
    # A result without an id is named by its source position, so a replay names it the same way (B1).
    assert rows[1] == {
        **NULL_ROW,
        "kind": "outcome", "route": "G", "bucket": NO_STATE_BUCKET,
        "result_id": "pos:p0001", "source_position": "p0001", "decided_at": NOW,
        "consumer_group": "G", "retry_topic": "orders", "consumed_msg_id": "M-B",
        "consumed_reconsume_times": 0, "outcome": "acknowledged",
    }
    assert rows[2]["outcome"] == "retry"


def test_r2_r10_recorded_drops_column_by_column() -> None:
    cfg = {"groups": {"off": {"retry_queue_nums": 0}}}
    broadcast = Result.of("M-BC").failed(message_model="BROADCASTING")
    disabled = Result.of("M-OFF", group="off").with_(status="EXCEPTION", result_id=None)
    rows = run([broadcast, disabled], cfg)
    common = {**NULL_ROW, "kind": "outcome", "bucket": NO_STATE_BUCKET, "decided_at": NOW, "retry_topic": "orders",
              "consumed_reconsume_times": 0, "outcome": "dropped"}
    assert rows == [
        {**common, **copied(broadcast), "route": "G", "consumer_group": "G", "consumed_msg_id": "M-BC", "source_position": "p0000",
         "result_id": broadcast.values["result_id"], "reason_code": "BROADCASTING_NOT_RETRIED",
         "reason": "broadcasting consumption is not retried (R2)"},
        {**common, **copied(disabled), "route": "off", "consumer_group": "off", "consumed_msg_id": "M-OFF", "source_position": "p0001",
         "result_id": "pos:p0001", "reason_code": "RETRY_DISABLED",
         "reason": "group 'off' has retry_queue_nums=0 (R10)"},
    ]


def test_bad_input_a_quarantine_row_column_by_column() -> None:
    """Bad-input rule: the row keeps what identifies it, the reason, and the row as read."""
    src = Result.of("M-Q").with_(status="MAYBE", origin_msg_id="M-0", reconsume_times=4, retry_topic="orders",
                                 topic="%RETRY%G")
    (row,) = run([src])
    raw = json.loads(row.pop("raw"))
    assert row == {
        **{k: v for k, v in NULL_ROW.items() if k != "raw"},
        **copied(src),
        "kind": "outcome", "route": "G", "bucket": NO_STATE_BUCKET,
        "result_id": src.values["result_id"], "source_position": "p0000", "decided_at": NOW,
        "consumer_group": "G", "retry_topic": "orders", "consumed_msg_id": "M-Q", "consumed_origin_msg_id": "M-0",
        "consumed_reconsume_times": 4, "outcome": "quarantined", "msg_id": "M-Q", "quarantined_at": NOW,
        "reason_code": "UNKNOWN_STATUS",
        "reason": "status 'MAYBE' is not one of CONSUME_SUCCESS, RECONSUME_LATER, EXCEPTION or null",
    }
    assert raw["status"] == "MAYBE" and raw[POSITION] == "p0000" and BATCH_TS not in raw


def test_bad_input_raw_is_the_row_as_read_with_sorted_keys() -> None:
    """Bad-input rule (README: raw keeps the row exactly as read); golden text, keys sorted so it is stable."""
    src = Result.of("M-RAW").with_(
        status="??", properties=[("k", "v")], attempts=None, born_timestamp=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        store_timestamp=None, consumed_at=None,
    )
    (row,) = run([src])
    v = src.values
    expected = {
        "attempts": None, "body": {"base64": "Ym9keS1NLVJBVw=="}, "born_host": "10.0.0.1:5000",
        "born_timestamp": "2026-01-02T03:04:05+00:00", "consumed_at": None, "consumer_group": "G",
        "consumer_id": "c1@host", "delay_level_when_next_consume": 0, "error_class": "java.lang.RuntimeException",
        "error_message": "boom", "flag": 7, "keys": "k1 k2", "max_reconsume_times": -1, "message_model": "CLUSTERING",
        "msg_id": "M-RAW", "origin_msg_id": None, "properties": [["k", "v"]], "queue_id": 1, "reconsume_times": 0,
        "result_id": v["result_id"], "retry_topic": None, "status": "??", "store_timestamp": None, "tags": "TagA",
        "topic": "orders", POSITION: "p0000",
    }
    assert row["raw"] == json.dumps(expected, sort_keys=True)


def test_bad_input_raw_keeps_extra_columns_of_any_type() -> None:
    """Bad-input rule: bytes nested in an extra column are base64, other values their text."""
    import decimal

    table = results_table([Result.of("X").with_(status="??")])
    table = table.append_column("extra_bytes", pa.array([[b"\x00\x01"]], pa.list_(pa.binary())))
    table = table.append_column("extra_decimal", pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)))
    table = table.append_column("extra_time", pa.array([dt.time(1, 2, 3)], pa.time64("us")))
    (row,) = run([], table=table)
    raw = json.loads(row["raw"])
    assert raw["extra_bytes"] == [{"base64": "AAE="}]
    assert raw["extra_decimal"] == "1.50"
    assert raw["extra_time"] == "01:02:03"


# -- R6: the attempt limit ----------------------------------------------------------------------------------


def test_r6_a_consumers_max_reconsume_times_replaces_the_groups_even_upwards() -> None:
    """Seed 003 (SendMessageProcessor): ``maxReconsumeTimes = requestHeader.getMaxReconsumeTimes()`` replaces
    the group's retryMaxTimes for clients >= 3.4.9, so a consumer may raise the limit as well as lower it;
    seed 001 (getMaxReconsumeTimes): -1 means the default, any other value is used as is, 0 included."""
    cfg = {"groups": {"g3": {"retry_max_times": 3}}}
    rows = run(
        [
            Result.of(group="g3").failed(reconsume_times=4, max_reconsume_times=5),  # above the group's 3: retried
            Result.of(group="g3").failed(reconsume_times=5, max_reconsume_times=5),
            Result.of(group="g3").failed(reconsume_times=3, max_reconsume_times=-1),  # -1: the group's 3
            Result.of(group="g3").failed(reconsume_times=2, max_reconsume_times=None),  # null: the group's 3
            Result.of(group="g3").failed(reconsume_times=0, max_reconsume_times=0),  # 0: no retry at all
            Result.of(group="g3").failed(reconsume_times=2, max_reconsume_times=2),
        ],
        cfg,
    )
    assert [r["outcome"] for r in rows] == ["retry", "dead_letter", "dead_letter", "retry", "dead_letter", "dead_letter"]
    assert [r["reason"] for r in rows if r["outcome"] == "dead_letter"] == [
        "reconsume_times 5 reached max_reconsume_times 5 (R6)",
        "reconsume_times 3 reached max_reconsume_times 3 (R6)",
        "reconsume_times 0 reached max_reconsume_times 0 (R6)",
        "reconsume_times 2 reached max_reconsume_times 2 (R6)",
    ]


def test_r5_dlq_requested_and_b3_non_retryable_reasons() -> None:
    cfg = {"groups": {"G": {"non_retryable": {"error_classes": ["ValueError"], "error_patterns": ["Invalid[A-Z]"]}}}}
    rows = run(
        [
            Result.of().failed(delay_level_when_next_consume=-3),
            Result.of().failed(error_class="builtins.ValueError"),  # README: builtins.X is X
            Result.of().failed(error_class="myapp.errors.InvalidOrder", error_message="order 7"),
            Result.of().failed(error_class="Timeout", error_message="x" * 100 + " InvalidState"),
        ],
        cfg,
    )
    assert [(r["outcome"], r["reason_code"]) for r in rows] == [("dead_letter", "DLQ_REQUESTED")] + [
        ("dead_letter", "NON_RETRYABLE")
    ] * 3
    assert [r["reason"] for r in rows] == [
        "consumer asked for delay level -3 (< 0 = DLQ, R5)",
        "error class 'builtins.ValueError' is listed as non-retryable",
        # README: patterns are searched in the error class and the error message.
        "error 'myapp.errors.InvalidOrder' matches non-retryable pattern 'Invalid[A-Z]'",
        f"error {'x' * 80 + '...'!r} matches non-retryable pattern 'Invalid[A-Z]'",
    ]


def test_b3_a_pattern_is_matched_against_the_error_class_too() -> None:
    """README (Errors that are not retried): ``error_patterns`` are searched in the error class and the message."""
    cfg = {"groups": {"G": {"non_retryable": {"error_patterns": ["^com\\.acme\\."]}}}}
    rows = run(
        [
            Result.of().failed(error_class="com.acme.BadOrder", error_message="no details"),
            Result.of().failed(error_class="java.lang.RuntimeException", error_message="com.acme.down"),
            Result.of().failed(error_class="java.lang.RuntimeException", error_message="timeout"),
        ],
        cfg,
    )
    assert [r["outcome"] for r in rows] == ["dead_letter", "dead_letter", "retry"]


# -- R3: retry queues ---------------------------------------------------------------------------------------


def test_r3_retries_spread_over_every_retry_queue_of_the_group() -> None:
    """Seed 003: ``queueIdInt = random % retryQueueNums``: with 4 retry queues every queue is used, none outside.

    Ours is a hash of the retry's id instead of a random number, so a replay picks the
    same queue (B1); the golden value pins that choice across releases.
    """
    cfg = {"groups": {"G": {"retry_queue_nums": 4}}}
    rows = run([Result.of(f"Q{i}").failed() for i in range(40)] + [Result.of("M-R").failed()], cfg)
    queues = [r["queue_id"] for r in rows]
    assert set(queues) == {0, 1, 2, 3}
    assert queues[:40] == [int(derived_id("G", f"Q{i}", "retry")[:8], 16) % 4 for i in range(40)]
    # First 8 hex digits of the id DEF00ECA... as a number, mod 4: 0xDEF00ECA = 3740274378 = 4 * 935068594 + 2.
    assert rows[-1]["msg_id"] == "DEF00ECA692641629F135925C80BD2EF" and queues[-1] == 2


def test_b1_derived_ids_are_32_upper_case_hex_digits_stable_across_releases() -> None:
    """B1/B8: a replay, or an engine of a later release, derives the same id; RocketMQ's ids are 32 hex digits."""
    assert new_msg_id("G", "M-R", "retry") == "DEF00ECA692641629F135925C80BD2EF"
    assert new_msg_id("G", "M-D", "dlq") == "E42495FFE2ADA1C6EA305F0AC5EDDC6F"


def test_b1_column_wise_ids_equal_the_row_wise_ones_for_any_text() -> None:
    """B1: the failure path derives ids column-wise (new_msg_ids); for hostile ids (empty, NUL,
    multi-byte, long, sliced arrays) they equal new_msg_id's, and each head is the int of its
    first 8 hex digits (the retry queue, R2)."""
    consumed = ["M-R", "", "\x00", "a\x00b", "日本語", "\U0001f600", "x" * 5000, "7F0000011A2B3C4D", "é" * 9]
    groups = ["G", "%RETRY%a", "g|1", "G", "grp_-9", "G", "G", "G", "G"]
    targets = ["retry", "dlq"] * 4 + ["retry"]
    for lo in (0, 3):  # a slice: offsets that do not start at 0
        ids, heads = new_msg_ids(
            pa.array(["pad"] * lo + groups)[lo:], pa.array(["pad"] * lo + consumed)[lo:], pa.array(["pad"] * lo + targets)[lo:]
        )
        expected = [new_msg_id(g, c, t) for g, c, t in zip(groups, consumed, targets, strict=True)]
        assert ids.to_pylist() == expected
        assert heads.tolist() == [int(e[:8], 16) for e in expected]
    empty_ids, empty_heads = new_msg_ids(pa.array([], pa.string()), pa.array([], pa.string()), pa.array([], pa.string()))
    assert len(empty_ids) == 0 and len(empty_heads) == 0


def test_b2_each_group_gets_its_own_backoff_in_one_batch() -> None:
    """B2: a custom level list per group; two groups in one batch each wait by their own list."""
    cfg = {"groups": {"fast": {"backoff": {"levels": "1s 2s", "first_level": 1}},
                      "slow": {"backoff": {"policy": "exponential", "initial": "1m", "max": "1h"}},
                      "rocketmq": {}}}
    groups = ["fast", "slow", "rocketmq", "fast"]
    rows = run([Result.of(group=g).failed() for g in groups], cfg)
    # fast: level 1 of its list (1 s); slow: its initial 1 min; rocketmq: level 3 + 0 of the default levels (10 s).
    assert [(r["delay_level"], r["due_at"] - NOW) for r in rows] == [
        (1, dt.timedelta(seconds=1)), (1, dt.timedelta(minutes=1)), (3, dt.timedelta(seconds=10)),
        (1, dt.timedelta(seconds=1))]


# -- bad input: the boundaries ----------------------------------------------------------------------------------


def test_bad_input_reconsume_times_minus_one_is_invalid_and_zero_is_not() -> None:
    """Bad-input rule: reconsume_times counts deliveries and is never negative, -1 included (R7: +1 per retry)."""
    rows = run([Result.of().failed(reconsume_times=-1), Result.of().failed(reconsume_times=0)])
    assert (rows[0]["outcome"], rows[0]["reason_code"]) == ("quarantined", "INVALID_RECONSUME_TIMES")
    assert rows[0]["reason"] == "reconsume_times -1 is negative"
    assert rows[1]["outcome"] == "retry"


def test_bad_input_max_reconsume_times_minus_one_is_the_default_and_minus_two_invalid() -> None:
    """R6 (seed 001): -1 means "the default"; below it there is no meaning."""
    rows = run([Result.of().failed(max_reconsume_times=-2), Result.of().failed(max_reconsume_times=-1, reconsume_times=15)])
    assert (rows[0]["outcome"], rows[0]["reason_code"]) == ("quarantined", "INVALID_MAX_RECONSUME_TIMES")
    assert rows[0]["reason"] == "max_reconsume_times -2 is below -1 (-1 or null = group default)"
    assert rows[1]["outcome"] == "retry"  # 15 < the default 16


def test_bad_input_a_body_of_exactly_max_body_bytes_is_accepted() -> None:
    """SPEC: "body over the size limit" is bad input; a body of exactly the limit is not over it (RocketMQ:
    ``body.length > maxMessageSize``). Its raw, when quarantined for another reason, keeps it whole."""
    cfg = {"engine": {"max_body_bytes": 8}}
    rows = run(
        [Result.of().failed(body=b"12345678"), Result.of().failed(body=b"123456789"), Result.of().failed(body=None),
         Result.of("EXACT").with_(status="??", body=b"abcdefgh")],
        cfg,
    )
    assert [r["outcome"] for r in rows] == ["retry", "quarantined", "retry", "quarantined"]
    assert rows[1]["reason"] == "body is 9 bytes; the limit (engine.max_body_bytes) is 8"
    assert json.loads(rows[3]["raw"])["body"] == {"base64": "YWJjZGVmZ2g="}


@pytest.mark.parametrize(
    ("change", "code", "reason"),
    [
        ({"msg_id": " "}, "MISSING_MSG_ID", "msg_id is missing (null, empty or whitespace)"),
        ({"topic": ""}, "MISSING_TOPIC", "topic is missing (null, empty or whitespace)"),
        ({"consumer_group": "../etc"}, "INVALID_GROUP_NAME", "consumer_group '../etc' must match [%|a-zA-Z0-9_-]{1,255}"),
        ({"topic": "a b"}, "INVALID_TOPIC_NAME", "topic 'a b' must match [%|a-zA-Z0-9_-]{1,127}"),
        ({"message_model": "MULTICAST"}, "UNKNOWN_MESSAGE_MODEL",
         "message_model 'MULTICAST' is not one of CLUSTERING, BROADCASTING or null"),
        ({"status": "s" * 80}, "UNKNOWN_STATUS",
         f"status {'s' * 80!r} is not one of CONSUME_SUCCESS, RECONSUME_LATER, EXCEPTION or null"),
        ({"status": "s" * 81}, "UNKNOWN_STATUS",  # a long value is shown cut to 80 characters
         f"status {'s' * 80 + '...'!r} is not one of CONSUME_SUCCESS, RECONSUME_LATER, EXCEPTION or null"),
        ({"reconsume_times": INT32_MAX}, "RECONSUME_TIMES_OVERFLOW",
         "reconsume_times 2147483647 is the int32 maximum: the next message would need reconsume_times 2147483648 "
         "(R7), which the column cannot hold"),
    ],
)
def test_bad_input_reasons_name_the_value_and_what_is_valid(change: dict[str, Any], code: str, reason: str) -> None:
    (row,) = run([Result.of().failed().with_(**change)])
    assert (row["outcome"], row["reason_code"], row["reason"]) == ("quarantined", code, reason)


def test_r3_a_retry_of_a_group_with_a_long_name_is_retried_again() -> None:
    """R3, R6: a group of 128-255 characters (a valid group) had one retry; its retry's failure, consumed
    from %RETRY%G, was quarantined for a topic over 134 characters: no second retry and no dead letter."""
    group = "g" * 255
    carried, = run([Result.of().failed().with_(consumer_group=group, topic=f"%RETRY%{group}", retry_topic=f"%RETRY%{group}",
                                               reconsume_times=2)])
    assert (carried["outcome"], carried["reconsume_times"]) == ("retry", 3)  # its original topic carried as it was
    retried, too_long, plain = run([
        Result.of().failed().with_(consumer_group=group, topic=f"%RETRY%{group}", reconsume_times=1),
        Result.of().failed().with_(consumer_group=group, topic=f"%RETRY%{group}x", reconsume_times=1),
        Result.of().failed().with_(topic="t" * 135),
    ])
    assert (retried["outcome"], retried["reconsume_times"]) == ("retry", 2)
    assert (too_long["outcome"], too_long["reason_code"]) == ("quarantined", "INVALID_TOPIC_NAME")
    assert too_long["reason"].endswith("must match [%|a-zA-Z0-9_-]{1,262}")
    assert (plain["outcome"], plain["reason_code"]) == ("quarantined", "INVALID_TOPIC_NAME")
    assert plain["reason"].endswith("must match [%|a-zA-Z0-9_-]{1,127}")


@pytest.mark.parametrize("group", ["%RETRY%billing", "%DLQ%billing", "%RETRY%"])
def test_r3_a_group_named_like_a_retry_or_dead_letter_topic_is_quarantined(group: str) -> None:
    """Its retries went to %RETRY%%RETRY%billing, which no Consumer of this package subscribes (it refuses
    such a group): delivered to nobody. The config refuses a [groups] section of such a name too."""
    (row,) = run([Result.of().failed().with_(consumer_group=group)])
    assert (row["outcome"], row["reason_code"]) == ("quarantined", "INVALID_GROUP_NAME")
    assert "may not start with %RETRY% or %DLQ%" in row["reason"]
    with pytest.raises(ConfigError, match="may not start with %RETRY% or %DLQ%.*remove the section; re-drive its dead letters with --to topic"):
        parse_config({"groups": {group: {"retry_max_times": 3}}})


def test_bad_input_a_missing_group_has_an_empty_route_and_every_problem_is_named() -> None:
    """Bad-input rule: the first problem is the code, the reason lists all of them."""
    (row,) = run([Result.of().with_(consumer_group=None, status="??")])
    assert (row["route"], row["consumer_group"], row["reason_code"]) == ("", None, "MISSING_GROUP")
    assert row["reason"] == (
        "consumer_group is missing (null, empty or whitespace); "
        "status '??' is not one of CONSUME_SUCCESS, RECONSUME_LATER, EXCEPTION or null"
    )


def test_rocketmq_name_lengths_group_255_topic_127_plus_retry_prefix() -> None:
    """SPEC (names validated like RocketMQ's TopicValidator): a group has at most 255 characters and a topic
    127; the topic column also holds %RETRY%G for a retry (README), so it allows len('%RETRY%') more."""
    rows = run([
        Result.of(group="g" * 255).failed(), Result.of(group="g" * 256).failed(),
        Result.of(topic="t" * 134).failed(), Result.of(topic="t" * 135).failed(),
    ])
    assert [r["reason_code"] for r in rows] == [None, "INVALID_GROUP_NAME", None, "INVALID_TOPIC_NAME"]


# -- B4: error context --------------------------------------------------------------------------------------------


def test_b4_error_messages_are_cut_to_2000_characters() -> None:
    """B4: the error travels with the message, cut to 2,000 characters (1,997 and "...") like the Consumer cuts it."""
    assert truncate_error(None) is None
    assert truncate_error("e" * 2000) == "e" * 2000
    assert truncate_error("e" * 2001) == "e" * 1997 + "..."
    (row,) = run([Result.of().failed(error_message="m" * 5000)])
    assert row["error_message"] == "m" * 1997 + "..." and len(row["error_message"]) == 2000
    assert row["attempts"][-1]["error_message"] == "m" * 1997 + "..."


def test_b4_the_attempt_records_the_status_the_consumer_reported() -> None:
    rows = run([Result.of().with_(status="EXCEPTION"), Result.of().with_(status=None)])
    assert [r["attempts"][-1]["status"] for r in rows] == ["EXCEPTION", None]  # R1: null is a failure too


# -- R8: the state bucket ----------------------------------------------------------------------------------------


def test_r8_the_bucket_is_the_store_time_then_born_then_consumed_then_the_undated_bucket() -> None:
    """R8 keys by store time; a result without one falls back to the next best time, never to null."""
    store, born, consumed = T0 - dt.timedelta(hours=3), T0 - dt.timedelta(hours=2), T0 - dt.timedelta(hours=1)
    rows = run([
        Result.of().failed(store_timestamp=store, born_timestamp=born, consumed_at=consumed),
        Result.of().failed(store_timestamp=None, born_timestamp=born, consumed_at=consumed),
        Result.of().failed(store_timestamp=None, born_timestamp=None, consumed_at=consumed),
        Result.of().failed(store_timestamp=None, born_timestamp=None, consumed_at=None),
    ])
    assert [r["outcome"] for r in rows] == ["retry"] * 4
    assert [r["bucket"] for r in rows] == [bucket_of(store), bucket_of(born), bucket_of(consumed), UNDATED_BUCKET]


def test_b1_copies_of_a_failure_without_any_time_share_a_key_whatever_the_batch_clock() -> None:
    """B1: the schedule stage dedups a copy against what its key remembers; an undated failure's key was
    its batch clock's bucket, so a copy decided a bucket later met an empty key and became a second retry
    (found by the engine's property test, 1 s buckets, the copy 0.98 s after the first)."""
    undated = Result.of("U").failed(store_timestamp=None, born_timestamp=None, consumed_at=None)
    first = run([undated], batch_ts=NOW)
    later = run([undated], batch_ts=NOW + dt.timedelta(hours=1, milliseconds=3))
    assert [r["outcome"] for r in first + later] == ["retry", "retry"]
    assert first[0]["bucket"] == later[0]["bucket"] == UNDATED_BUCKET


# -- the batch as a whole ----------------------------------------------------------------------------------------


def test_b1_a_mixed_batch_is_decided_in_one_pass_in_input_order() -> None:
    """decide itself (not only the row-by-row fallback) returns acks and failures in input order."""
    results = [Result.of("A0").ok(), Result.of("F1").failed(), Result.of("A2").ok(), Result.of("Q3").with_(status="?")]
    out = decide(with_clock(results_table(results)), Decider(parse_config({})))
    assert out.schema == WORK.arrow_schema
    assert out.column("consumed_msg_id").to_pylist() == ["A0", "F1", "A2", "Q3"]
    assert out.column("outcome").to_pylist() == ["acknowledged", "retry", "acknowledged", "quarantined"]


def test_b1_in_order_false_gives_the_same_rows_grouped_by_path() -> None:
    """``in_order=False`` (the engine's decide task, which splits rows without state at once) returns
    exactly the rows of the ordered decision, acknowledgements first, each group in input order."""
    results = [Result.of("A0").ok(), Result.of("F1").failed(), Result.of("A2").ok(), Result.of("Q3").with_(status="?"),
               Result.of("F4").failed(), Result.of("A5").ok()]
    batch = with_clock(results_table(results))
    decider = Decider(parse_config({}))
    ordered = decide(batch, decider)
    grouped = decider(batch, in_order=False)
    assert grouped.schema == WORK.arrow_schema
    assert grouped.column("consumed_msg_id").to_pylist() == ["A0", "A2", "A5", "F1", "F4", "Q3"]
    by_position = grouped.take(pc.sort_indices(grouped.column("source_position")))
    assert by_position.to_pylist() == ordered.to_pylist()
    only_acks = with_clock(results_table([Result.of("A0").ok(), Result.of("A1").ok()]))
    assert decider(only_acks, in_order=False).to_pylist() == decide(only_acks, decider).to_pylist()


def test_an_empty_batch_decides_to_no_rows() -> None:
    table = results_table([])
    out = decide(with_clock(table), Decider(parse_config({})))
    assert out.num_rows == 0 and out.schema == WORK.arrow_schema


def test_only_the_required_columns_are_needed() -> None:
    """Optional columns may be absent from the consume-result table (read as null)."""
    table = pa.table({"consumer_group": ["G", "G"], "msg_id": ["M1", "M2"], "topic": ["orders"] * 2,
                      "status": ["RECONSUME_LATER", "CONSUME_SUCCESS"]})
    rows = run([], table=table)
    assert [r["outcome"] for r in rows] == ["retry", "acknowledged"]
    assert rows[0]["result_id"] == "pos:p0000" and rows[0]["reconsume_times"] == 1 and rows[0]["bucket"] == UNDATED_BUCKET


def test_an_empty_result_id_or_retry_topic_falls_back_alike_for_acks_and_failures() -> None:
    """"" reads like a missing value whatever the status: result_id becomes the source position
    and retry_topic the topic, for an acknowledgement (R1) as for a retry (R3)."""
    table = pa.table({"consumer_group": ["G", "G", "G"], "msg_id": ["A0", "F1", "A2"], "topic": ["orders"] * 3,
                      "status": ["CONSUME_SUCCESS", "RECONSUME_LATER", "CONSUME_SUCCESS"],
                      "result_id": ["", "", "r2"], "retry_topic": ["", "", "%RETRY%G"]})
    rows = run([], table=table)
    assert [r["outcome"] for r in rows] == ["acknowledged", "retry", "acknowledged"]
    assert [r["result_id"] for r in rows] == ["pos:p0000", "pos:p0001", "r2"]
    assert [r["retry_topic"] for r in rows] == ["orders", "orders", "%RETRY%G"]


def test_a_batch_clock_without_time_zone_is_utc() -> None:
    """The engine stamps the batch with Spark's current_timestamp; a clock read without a zone means UTC."""
    naive = NOW.replace(tzinfo=None)
    rows = run([Result.of().ok(), Result.of().failed()], batch_ts=naive, ts_type=pa.timestamp("us"))
    assert [r["decided_at"] for r in rows] == [NOW, NOW]
    assert rows[1]["due_at"] == NOW + dt.timedelta(seconds=10)


def test_missing_required_column_is_a_startup_error_naming_it() -> None:
    schema = pa.schema([f for f in CONSUME_RESULTS.arrow_schema if f.name not in ("status", "topic")])
    with pytest.raises(SchemaMismatchError) as info:
        check_input_schema(schema)
    assert info.value.code == "CONSUME_RESULTS_COLUMN_MISSING"
    assert str(info.value) == (
        "[CONSUME_RESULTS_COLUMN_MISSING] consume-result table has no column 'topic' "
        f"(required: consumer_group, msg_id, topic, status; found: {', '.join(schema.names)})"
    )


# -- wrong types -------------------------------------------------------------------------------------------------


def test_wrong_types_are_checked_value_by_value_nulls_included() -> None:
    """Bad-input rule: a value that does not fit its column is WRONG_TYPE; a null fits every column."""
    loose = pa.schema([pa.field(f.name, pa.int64() if f.name == "reconsume_times" else
                                pa.string() if f.name == "delay_level_when_next_consume" else f.type)
                       for f in CONSUME_RESULTS.arrow_schema])
    results = [
        Result.of("N").failed(delay_level_when_next_consume=None, reconsume_times=None),
        Result.of("TWO").failed(delay_level_when_next_consume="2", reconsume_times=1),
        Result.of("BIG").failed(delay_level_when_next_consume="0", reconsume_times=2**40),
        Result.of("SOON").failed(delay_level_when_next_consume="soon"),
    ]
    # decide itself, not the row-by-row fallback (which would hide a batch that raises).
    rows = decide(with_clock(results_table(results, loose)), Decider(parse_config({}))).to_pylist()
    assert [(r["outcome"], r["delay_level"]) for r in rows[:2]] == [("retry", 3), ("retry", 2)]
    assert (rows[2]["reason_code"], rows[3]["reason_code"]) == ("WRONG_TYPE", "WRONG_TYPE")
    assert rows[2]["reason"] == "column reconsume_times: 1099511627776 is not a valid int32"
    assert rows[3]["reason"] == "column delay_level_when_next_consume: 'soon' is not a valid int32"


# -- DECIDE_FAILED ----------------------------------------------------------------------------------------------------


def poisoned(results: list[Result], poison: set[int], schema: pa.Schema = CONSUME_RESULTS.arrow_schema) -> pa.Table:
    """``consumed_at`` as date32, the poison rows holding the largest date: deciding them raises OverflowError."""
    table = results_table(results, schema)
    days = [INT32_MAX if i in poison else 20_000 for i in range(table.num_rows)]
    i = table.schema.get_field_index("consumed_at")
    return table.set_column(i, pa.field("consumed_at", pa.date32()), pa.array(days, pa.int32()).cast(pa.date32()))


def test_bad_input_a_row_that_raises_keeps_what_can_be_read(caplog: pytest.LogCaptureFixture) -> None:
    """Bad-input rule: DECIDE_FAILED keeps the row's ids, topic and count; it is logged with group, id and position."""
    src = Result.of("M-X").failed(reconsume_times=5, origin_msg_id="M-0", retry_topic="orders", topic="%RETRY%G")
    with caplog.at_level(logging.WARNING, logger="retry_engine.core.decide"):
        (row,) = run([], table=poisoned([src], {0}))
    reason = row["reason"]
    assert reason.startswith("deciding this row raised OverflowError: ")
    assert {k: row[k] for k in row if k != "raw"} == {
        **{k: v for k, v in NULL_ROW.items() if k != "raw"},
        "kind": "outcome", "route": "G", "bucket": NO_STATE_BUCKET, "result_id": src.values["result_id"],
        "source_position": "p0000", "decided_at": NOW, "consumer_group": "G", "retry_topic": "orders",
        "consumed_msg_id": "M-X", "consumed_origin_msg_id": "M-0", "consumed_reconsume_times": 5,
        "outcome": "quarantined", "reason_code": "DECIDE_FAILED", "reason": reason, "quarantined_at": NOW,
        "msg_id": "M-X",
    }
    messages = [r.getMessage() for r in caplog.records]
    assert f"group G msg_id M-X (source position p0000) quarantined: DECIDE_FAILED: {reason}" in messages
    error = reason.removeprefix("deciding this row raised OverflowError: ")
    assert f"deciding 1 rows raised OverflowError: {error}; deciding them apart to quarantine the rows that raise" in messages


def test_bad_input_a_row_that_raises_without_a_retry_topic_keeps_its_topic_and_a_naive_clock_is_utc() -> None:
    src = Result.of("M-Y").failed()
    (row,) = run([], table=poisoned([src], {0}), batch_ts=NOW.replace(tzinfo=None), ts_type=pa.timestamp("us"))
    assert (row["reason_code"], row["retry_topic"], row["decided_at"], row["quarantined_at"]) == (
        "DECIDE_FAILED", "orders", NOW, NOW)


@pytest.mark.parametrize(
    ("value", "kept"),
    [(INT32_MIN - 1, None), (INT32_MIN, INT32_MIN), (-100, -100), (5, 5), (INT32_MAX, INT32_MAX), (INT32_MAX + 1, None)],
)
def test_bad_input_a_row_that_raises_keeps_its_reconsume_times_only_if_it_fits(value: int, kept: int | None) -> None:
    """Bad-input rule: consumed_reconsume_times is an int32 column; a value outside it is not copied."""
    loose = pa.schema([pa.field(f.name, pa.int64()) if f.name == "reconsume_times" else f
                       for f in CONSUME_RESULTS.arrow_schema])
    (row,) = run([], table=poisoned([Result.of("M-Z").failed(reconsume_times=value)], {0}, loose))
    assert (row["reason_code"], row["consumed_reconsume_times"]) == ("DECIDE_FAILED", kept)


def test_bad_input_a_row_that_raises_keeps_only_values_of_the_right_type() -> None:
    loose = pa.schema([pa.field(f.name, pa.string()) if f.name == "reconsume_times" else f
                       for f in CONSUME_RESULTS.arrow_schema])
    (row,) = run([], table=poisoned([Result.of("M-S").failed(reconsume_times="7")], {0}, loose))
    assert (row["reason_code"], row["consumed_reconsume_times"], row["consumed_msg_id"]) == ("DECIDE_FAILED", None, "M-S")


def test_bad_input_a_value_its_column_cannot_hold_exactly_is_wrong_type() -> None:
    """Bad-input rule: a nanosecond store time is not silently cut to microseconds; a number is no body."""
    fields = {"store_timestamp": pa.timestamp("ns", tz="UTC"), "body": pa.int64()}
    loose = pa.schema([pa.field(f.name, fields.get(f.name, f.type)) for f in CONSUME_RESULTS.arrow_schema])
    base = dt.datetime(2026, 11, 22, 11, 59, 56, tzinfo=dt.UTC)
    table = results_table([Result.of("NS").failed(body=None), Result.of("US").failed(body=None),
                           Result.of("NUM").failed(body=5)], loose)
    ns = pa.array([(base - EPOCH) // dt.timedelta(microseconds=1) * 1000 + d for d in (1, 0, 0)], pa.int64())
    table = table.set_column(table.schema.get_field_index("store_timestamp"), loose.field("store_timestamp"),
                             ns.cast(pa.timestamp("ns", tz="UTC")))
    rows = decide(with_clock(table), Decider(parse_config({}))).to_pylist()
    assert [(r["outcome"], r["reason_code"]) for r in rows] == [
        ("quarantined", "WRONG_TYPE"), ("retry", None), ("quarantined", "WRONG_TYPE")]
    assert rows[1]["bucket"] == bucket_of(base)
    assert rows[2]["reason"] == "column body: 5 is not a valid binary"


def test_a_store_time_written_as_text_without_a_zone_is_utc() -> None:
    """Another writer's store times as text: with a zone as given, without one UTC (it was WRONG_TYPE
    when no value of the batch had a zone, and null in the tables status and the DLQ console read);
    text that is no time stays WRONG_TYPE."""
    loose = pa.schema([pa.field(f.name, pa.string() if f.name == "store_timestamp" else f.type)
                       for f in CONSUME_RESULTS.arrow_schema])
    base = dt.datetime(2026, 11, 22, 11, 59, 56, tzinfo=dt.UTC)
    for texts in (["2026-11-22 11:59:56", "2026-11-22T11:59:56.000000"], ["2026-11-22 11:59:56", "2026-11-22T17:29:56+05:30"]):
        table = results_table([Result.of("A").failed(), Result.of("B").failed(), Result.of("C").failed()])
        column = pa.array([*texts, "soon"], pa.string())
        table = table.set_column(table.schema.get_field_index("store_timestamp"), loose.field("store_timestamp"), column)
        rows = decide(with_clock(table), Decider(parse_config({}))).to_pylist()
        assert [(r["outcome"], r["reason_code"]) for r in rows] == [("retry", None), ("retry", None), ("quarantined", "WRONG_TYPE")]
        assert rows[0]["bucket"] == rows[1]["bucket"] == bucket_of(base)


def test_an_attempts_time_written_as_text_is_read_as_a_top_level_one_and_a_bad_one_stays_its_rows() -> None:
    """Nested times as text: without a zone UTC, as a top-level column's (it was WRONG_TYPE); a value that
    is no time quarantines its own row only (a cast of one value must not read the other rows')."""
    attempts = CONSUME_RESULTS.arrow_schema.field("attempts").type
    loose = pa.list_(pa.struct([(f.name, pa.string() if f.name == "consumed_at" else f.type) for f in attempts.value_type]))
    texts = ["2026-11-22T11:59:56Z", "2026-11-22 11:59:56", "soon"]
    table = results_table([Result.of(f"A{i}").failed() for i in range(3)])
    column = pa.array([[{"reconsume_times": 0, "consumer_group": "G", "consumed_at": t}] for t in texts], loose)
    table = table.set_column(table.schema.get_field_index("attempts"), pa.field("attempts", loose), column)
    rows = decide(with_clock(table), Decider(parse_config({}))).to_pylist()
    assert [(r["outcome"], r["reason_code"]) for r in rows] == [("retry", None), ("retry", None), ("quarantined", "WRONG_TYPE")]
    cast, wrong = cast_column(column, attempts)
    assert wrong == [2] and cast[0].as_py()[0]["consumed_at"] == cast[1].as_py()[0]["consumed_at"] == dt.datetime(
        2026, 11, 22, 11, 59, 56, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    "texts",
    [["0000-01-01 00:00:00"], ["0000-01-01 00:00:00", "2026-11-22T11:59:56Z", "soon"], ["10000-01-01 00:00:00", None]],
)
def test_text_that_reads_as_a_time_outside_years_1_to_9999_is_no_time_alone_or_mixed(texts: list[str | None]) -> None:
    """A review of the zoneless-text fix: year 0 without a zone cast whole (Arrow holds it) and then
    crashed `dlq list` (Python cannot), and mixed with other values the per-value cast raised OverflowError.
    Such a value is now null and named, whichever way the column is cast."""
    cast, wrong = cast_column(pa.array(texts, pa.string()), pa.timestamp("us", "UTC"))
    assert wrong == [i for i, t in enumerate(texts) if t is not None and not t.startswith("2026")]
    values = cast.to_pylist()  # raised OverflowError for a year-0 value
    assert all(values[i] is None for i in wrong)
    assert [v for v in values if v is not None] == (
        [dt.datetime(2026, 11, 22, 11, 59, 56, tzinfo=dt.UTC)] if len(texts) == 3 else [])
    # The same inside attempts (a list of structs): the nested value was cast and then raised on reading.
    attempts = CONSUME_RESULTS.arrow_schema.field("attempts").type
    loose = pa.list_(pa.struct([(f.name, pa.string() if f.name == "consumed_at" else f.type) for f in attempts.value_type]))
    nested = pa.array([[{"reconsume_times": 0, "consumer_group": "G", "consumed_at": t}] for t in texts], loose)
    cast, wrong = cast_column(nested, attempts)
    assert wrong == [i for i, t in enumerate(texts) if t is not None and not t.startswith("2026")]
    assert len(cast.to_pylist()) == len(texts) and all(cast[i].as_py() is None for i in wrong)


def test_bad_input_a_time_outside_python_in_the_attempts_of_a_single_row() -> None:
    """Bad-input rule: an attempt time past year 9999 is TIMESTAMP_OUT_OF_RANGE, in a batch of one row too."""
    attempt_type = CONSUME_RESULTS["attempts"].type
    year_20000_us = 568_024_531_200_000_000
    attempts = pa.array([[{"reconsume_times": 0, "consumer_group": "G", "consumed_at": None}]], attempt_type)
    struct = attempts.values
    at = pa.array([year_20000_us], pa.int64()).cast(TS)
    struct = pa.StructArray.from_arrays(
        [at if f.name == "consumed_at" else struct.field(f.name) for f in attempt_type.value_type],
        fields=list(attempt_type.value_type),
    )
    table = results_table([Result.of("ONE").failed(reconsume_times=1)])
    table = table.set_column(table.schema.get_field_index("attempts"), table.schema.field("attempts"),
                             pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), struct))
    (row,) = decide(with_clock(table), Decider(parse_config({}))).to_pylist()
    assert (row["outcome"], row["reason_code"]) == ("quarantined", "TIMESTAMP_OUT_OF_RANGE")
    assert row["reason"] == f"column attempts: {year_20000_us} us since 1970 is outside years 1-9999 (no clock reads that)"


def unvalidated(data: bytes) -> pa.Array:
    binary = pa.array([data], pa.binary())
    return pa.Array.from_buffers(pa.string(), 1, binary.buffers())


def test_bad_input_invalid_utf8_keeps_its_text_escaped_in_the_columns() -> None:
    """Bad-input rule: the quarantine row stays readable: the bad bytes are shown escaped, raw keeps them."""
    table = results_table([Result.of("x").failed()])
    i = table.schema.get_field_index("msg_id")
    table = table.set_column(i, table.schema.field("msg_id"), unvalidated(b"M\xff\xfe"))
    (row,) = decide(with_clock(table), Decider(parse_config({}))).to_pylist()
    assert (row["reason_code"], row["consumed_msg_id"], row["msg_id"]) == ("INVALID_UTF8", "M\\xff\\xfe", "M\\xff\\xfe")
    assert row["reason"] == "column msg_id: b'M\\xff\\xfe' is not valid UTF-8"


def test_bad_input_raw_records_an_unreadable_value_whose_error_cannot_be_encoded() -> None:
    """Bad-input rule: whatever the row holds, raw records it: the lone surrogate is escaped, not an error."""
    table = results_table([Result.of("Q").with_(status="??")])
    hostile = hostile_array([1], extension="test.hostile-surrogate", message="cannot read \udcff here")
    (row,) = run([], table=table.append_column("extra", hostile))
    assert json.loads(row["raw"])["extra"] == {
        "unreadable": "RuntimeError: cannot read \\udcff here", "type": "extension<test.hostile-surrogate<_HostileType>>"}


def test_bad_input_raw_keeps_bytes_nested_beside_invalid_utf8() -> None:
    """Bad-input rule: a nested value that cannot be read whole is recorded field by field, bytes as base64."""
    item = pa.struct([pa.field("b", pa.binary()), pa.field("s", pa.string())])
    struct = pa.StructArray.from_arrays([pa.array([b"\x01"], pa.binary()), unvalidated(b"\xff")], fields=list(item))
    extra = pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), struct)
    table = results_table([Result.of("N").with_(status="??")]).append_column("extra", extra)
    table = table.append_column("extra_struct", struct)
    (row,) = run([], table=table)
    raw = json.loads(row["raw"])
    assert raw["extra"] == [{"b": {"base64": "AQ=="}, "s": {"invalid_utf8_base64": "/w=="}}]
    assert raw["extra_struct"] == {"b": {"base64": "AQ=="}, "s": {"invalid_utf8_base64": "/w=="}}


def test_r8_a_delay_past_year_9999_names_the_level_the_group_and_the_fix() -> None:
    late = dt.datetime(9999, 12, 31, 23, 0, tzinfo=dt.UTC)
    (row,) = run([Result.of().failed(delay_level_when_next_consume=18)], batch_ts=late)
    assert (row["outcome"], row["reason_code"]) == ("quarantined", "DUE_AT_OUT_OF_RANGE")
    assert row["reason"] == "delay level 18 of group 'G' waits 7200000 ms: due after year 9999; fix the group's backoff"
