"""The decision step on every value a column can hold (SPEC bad-input rule; issue #12 items 1-5, 18).

Expected values come from SPEC R5-R7 and the seeds (RocketMQ ``UtilAll.isBlank``,
Java ``Character.isWhitespace``), not from the code under test.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import unicodedata
from typing import Any

import pyarrow as pa
import pytest

from retry_engine.config import EngineConfig, parse_config
from retry_engine.core.decide import (
    BATCH_TS,
    NO_STATE_BUCKET,
    POSITION,
    Decider,
    blank_mask,
    is_blank,
)
from retry_engine.errors import ConfigError
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import T0, Result, hostile_array, results_table, with_unvalidated_group

NOW = T0 + dt.timedelta(seconds=2)
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
TS = pa.timestamp("us", tz="UTC")


def decide_table(
    table: pa.Table, config: dict[str, Any] | EngineConfig | None = None, *, batch_ts: dt.datetime = NOW
) -> pa.RecordBatch:
    n = table.num_rows
    table = table.append_column(POSITION, pa.array([f"p{i:04d}" for i in range(n)])).append_column(
        BATCH_TS, pa.array([batch_ts] * n, type=TS)
    )
    engine_config = config if isinstance(config, EngineConfig) else parse_config(config or {})
    return Decider(engine_config)(table.combine_chunks().to_batches()[0])


def run(results: list[Result], config: dict[str, Any] | EngineConfig | None = None, **kw: Any) -> list[dict[str, Any]]:
    return decide_table(results_table(results), config, **kw).to_pylist()


def with_value(table: pa.Table, column: str, row: int, value: pa.Array) -> pa.Table:
    """``table`` with ``column[row]`` replaced by the one value in ``value`` (same type as the column)."""
    col = table.column(column).combine_chunks()
    merged = pa.concat_arrays([col.slice(0, row), value, col.slice(row + 1)])
    return table.set_column(table.schema.get_field_index(column), table.schema.field(column), merged)


def invalid_utf8(data: bytes) -> pa.Array:
    """A one-value string array holding ``data`` unvalidated, as a Parquet file can."""
    binary = pa.array([data], pa.binary())
    return pa.Array.from_buffers(pa.string(), 1, binary.buffers())


def micros(us: int) -> pa.Array:
    return pa.array([us], pa.int64()).cast(TS)


# -- item 1: int32 edges --------------------------------------------------------------


def test_int32_edges_are_decided_without_overflow() -> None:
    """#12 item 1, R5/R6/R7: every int32 edge gets a decision; the one whose +1 does not exist is quarantined."""
    rows = run(
        [
            Result.of("RMAX").failed(reconsume_times=INT32_MAX),
            Result.of("RNEAR").failed(reconsume_times=INT32_MAX - 1),
            Result.of("RNEAR-MAX").failed(reconsume_times=INT32_MAX - 1, max_reconsume_times=INT32_MAX),
            Result.of("MAXMAX").failed(reconsume_times=5, max_reconsume_times=INT32_MAX),
            Result.of("MAXMIN").failed(max_reconsume_times=INT32_MIN),
            Result.of("LMAX").failed(delay_level_when_next_consume=INT32_MAX),
            Result.of("LMIN").failed(delay_level_when_next_consume=INT32_MIN),
            Result.of("QMAX").failed(queue_id=INT32_MAX, flag=INT32_MIN),
            Result.of("QMIN").failed(queue_id=INT32_MIN, flag=INT32_MAX),
            Result.of("EXP", group="exp").failed(reconsume_times=INT32_MAX - 1, max_reconsume_times=INT32_MAX),
        ],
        {"groups": {"exp": {"backoff": {"policy": "exponential", "initial": "1s", "max": "1h"}}}},
    )
    by = {r["consumed_msg_id"]: r for r in rows}
    assert by["RMAX"]["outcome"] == "quarantined" and by["RMAX"]["reason_code"] == "RECONSUME_TIMES_OVERFLOW"
    assert "2147483647" in by["RMAX"]["reason"] and json.loads(by["RMAX"]["raw"])["reconsume_times"] == INT32_MAX
    # R6: default limit 16 is long passed; the dead letter carries old + 1 (R7).
    assert (by["RNEAR"]["outcome"], by["RNEAR"]["reason_code"]) == ("dead_letter", "MAX_RECONSUME_TIMES")
    assert by["RNEAR"]["reconsume_times"] == INT32_MAX
    # R5: level 0 asks for 3 + reconsume_times, clamped to the top level 18.
    assert by["RNEAR-MAX"]["outcome"] == "retry" and by["RNEAR-MAX"]["delay_level"] == 18
    assert by["RNEAR-MAX"]["reconsume_times"] == INT32_MAX
    assert by["MAXMAX"]["outcome"] == "retry" and by["MAXMAX"]["delay_level"] == 3 + 5
    assert (by["MAXMIN"]["outcome"], by["MAXMIN"]["reason_code"]) == ("quarantined", "INVALID_MAX_RECONSUME_TIMES")
    assert by["LMAX"]["outcome"] == "retry" and by["LMAX"]["delay_level"] == 18
    assert by["LMAX"]["due_at"] == NOW + dt.timedelta(hours=2)
    assert (by["LMIN"]["outcome"], by["LMIN"]["reason_code"]) == ("dead_letter", "DLQ_REQUESTED")
    assert by["QMAX"]["outcome"] == "retry" and by["QMAX"]["flag"] == INT32_MIN  # R7: flag copied
    assert by["QMIN"]["outcome"] == "retry" and by["QMIN"]["flag"] == INT32_MAX
    assert by["EXP"]["outcome"] == "retry" and by["EXP"]["due_at"] == NOW + dt.timedelta(hours=1)


# -- item 1: timestamps at and past the edges ------------------------------------------


def test_far_timestamps_are_decided_or_quarantined_never_raise() -> None:
    """#12 item 1, bad-input rule: years 1 and 9999 are decided; a time Python cannot hold is quarantined."""
    year_20000_us = 568_000_000_000_000_000  # ~ year 19969: fits timestamp[us], not datetime
    latest = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
    earliest = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
    attempt = {"reconsume_times": 0, "consumer_group": "G", "consumer_id": "c", "status": "RECONSUME_LATER",
               "error_class": None, "error_message": None, "consumed_at": T0, "delay_level": 3}
    results = [
        Result.of("FUTURE").failed(store_timestamp=latest, consumed_at=latest, born_timestamp=latest),
        Result.of("PAST").failed(store_timestamp=earliest, consumed_at=earliest, born_timestamp=earliest),
        Result.of("BORN-OUT").failed(),
        Result.of("STORE-OUT").failed(),
        Result.of("CONSUMED-OUT").ok(),
        Result.of("ATTEMPT-OUT").failed(reconsume_times=1, attempts=[attempt, attempt]),
        Result.of("GOOD").failed(),
    ]
    table = results_table(results)
    table = with_value(table, "born_timestamp", 2, micros(year_20000_us))
    table = with_value(table, "store_timestamp", 3, micros(-year_20000_us))
    table = with_value(table, "consumed_at", 4, micros(year_20000_us))
    bad_attempts = pa.array([[attempt, {**attempt, "consumed_at": None}]], CONSUME_RESULTS["attempts"].type)
    flat = bad_attempts.flatten()
    field = flat.field("consumed_at")
    poisoned = pa.StructArray.from_arrays(
        [flat.field(f.name) if f.name != "consumed_at" else pa.concat_arrays([field.slice(0, 1), micros(-year_20000_us)])
         for f in flat.type],
        fields=list(flat.type),
    )
    table = with_value(table, "attempts", 5, pa.ListArray.from_arrays(pa.array([0, 2], pa.int32()), poisoned))
    rows = {r["consumed_msg_id"]: r for r in decide_table(table).to_pylist()}

    bucket_us = 10_000_000  # engine.state_bucket default 10s
    assert rows["FUTURE"]["outcome"] == "retry" and rows["FUTURE"]["born_timestamp"] == latest
    assert rows["FUTURE"]["bucket"] == 253_402_300_799_999_999 // bucket_us
    assert rows["PAST"]["outcome"] == "retry" and rows["PAST"]["born_timestamp"] == earliest
    assert rows["PAST"]["bucket"] == -62_135_596_800_000_000 // bucket_us
    for name, column in [("BORN-OUT", "born_timestamp"), ("STORE-OUT", "store_timestamp"),
                         ("CONSUMED-OUT", "consumed_at"), ("ATTEMPT-OUT", "attempts")]:
        row = rows[name]
        assert (row["outcome"], row["reason_code"]) == ("quarantined", "TIMESTAMP_OUT_OF_RANGE"), name
        assert f"column {column}" in row["reason"], row["reason"]
        assert row["bucket"] == NO_STATE_BUCKET
        raw = json.loads(row["raw"])
        assert raw["msg_id"] == name
    assert json.loads(rows["BORN-OUT"]["raw"])["born_timestamp"]["unrepresentable"] == year_20000_us
    assert json.loads(rows["ATTEMPT-OUT"]["raw"])["attempts"][1]["consumed_at"]["unrepresentable"] == -year_20000_us
    assert rows["GOOD"]["outcome"] == "retry"


def test_due_time_past_year_9999_is_quarantined() -> None:
    """#12 item 1: ``due_at = batch_ts + delay`` past datetime's range is quarantined, not an OverflowError."""
    late = dt.datetime(9999, 12, 31, 23, 0, tzinfo=dt.UTC)
    rows = run([Result.of("SOON").failed(), Result.of("LATER").failed(delay_level_when_next_consume=18)], batch_ts=late)
    assert rows[0]["outcome"] == "retry" and rows[0]["due_at"] == late + dt.timedelta(seconds=10)
    assert (rows[1]["outcome"], rows[1]["reason_code"]) == ("quarantined", "DUE_AT_OUT_OF_RANGE")
    assert "level 18" in rows[1]["reason"] and rows[1]["raw"]


# -- item 2: invalid UTF-8 ----------------------------------------------------------------


@pytest.mark.parametrize(
    "column",
    ["result_id", "consumer_group", "consumer_id", "message_model", "status", "error_class", "error_message",
     "msg_id", "topic", "tags", "keys", "born_host", "origin_msg_id", "retry_topic"],
)
def test_invalid_utf8_is_quarantined_naming_the_column(column: str) -> None:
    """#12 item 2: a string Python cannot decode quarantines its row (INVALID_UTF8); raw keeps the bytes."""
    bad = b"x\xff\xfe" + column.encode()
    table = results_table([Result.of("GOOD1").ok(), Result.of("BAD").failed(), Result.of("GOOD2").failed()])
    table = with_value(table, column, 1, invalid_utf8(bad))
    out = decide_table(table)
    out.validate(full=True)  # every string in the output is valid UTF-8
    good1, row, good2 = out.to_pylist()
    assert (good1["outcome"], good2["outcome"]) == ("acknowledged", "retry")
    assert (row["outcome"], row["reason_code"]) == ("quarantined", "INVALID_UTF8")
    assert f"column {column}" in row["reason"]
    raw = json.loads(row["raw"])
    assert base64.b64decode(raw[column]["invalid_utf8_base64"]) == bad


def test_invalid_utf8_inside_properties_and_attempts_is_quarantined() -> None:
    """#12 item 2: nested strings (a property value, an attempt's error) are checked too."""
    table = results_table([Result.of("P").failed(), Result.of("A").failed(), Result.of("OK").failed()])
    keys = pa.array(["color"], pa.string())
    props = pa.MapArray.from_arrays(pa.array([0, 1], pa.int32()), keys, invalid_utf8(b"r\xc3"))
    table = with_value(table, "properties", 0, props)
    attempt_type = CONSUME_RESULTS["attempts"].type.value_type
    one = pa.array([{"reconsume_times": 0, "consumer_group": "G", "error_message": "e"}], attempt_type)
    struct = pa.StructArray.from_arrays(
        [invalid_utf8(b"\xe2\x82") if f.name == "error_message" else one.field(f.name) for f in attempt_type],
        fields=list(attempt_type),
    )
    table = with_value(table, "attempts", 1, pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), struct))
    out = decide_table(table)
    out.validate(full=True)
    p, a, ok = out.to_pylist()
    assert (p["reason_code"], a["reason_code"], ok["outcome"]) == ("INVALID_UTF8", "INVALID_UTF8", "retry")
    assert "column properties" in p["reason"] and "column attempts" in a["reason"]
    assert json.loads(p["raw"])["properties"][0]["value"] == {"invalid_utf8_base64": base64.b64encode(b"r\xc3").decode()}


# -- item 3: the general rule -----------------------------------------------------------------


def date_table(results: list[Result], poison_rows: set[int]) -> pa.Table:
    """``consumed_at`` stored as a date (a type decide does not expect); poison rows hold the largest date32.

    A date past year 9999 cannot become a timestamp or a Python date, so
    deciding such a row raises where the code never anticipated it.
    """
    table = results_table(results)
    days = [2**31 - 1 if i in poison_rows else 20_000 for i in range(table.num_rows)]
    dates = pa.array(days, pa.int32()).cast(pa.date32())
    i = table.schema.get_field_index("consumed_at")
    return table.set_column(i, pa.field("consumed_at", pa.date32()), dates)


def test_a_row_that_raises_is_quarantined_alone_with_the_exception() -> None:
    """#12 item 3, bad-input rule: the rows whose decision raises are quarantined (DECIDE_FAILED); the rest decide."""
    results = [Result.of(f"M{i}").failed() if i % 3 else Result.of(f"M{i}").ok() for i in range(11)]
    poison = {2, 3, 9}
    table = date_table(results, poison)
    table = with_value(table, "consumer_group", 9, invalid_utf8(b"G\xff"))  # also unreadable
    out = decide_table(table)
    out.validate(full=True)
    rows = out.to_pylist()
    assert [r["source_position"] for r in rows] == [f"p{i:04d}" for i in range(11)]  # every row once, in order
    for i, row in enumerate(rows):
        if i in poison:
            assert (row["outcome"], row["reason_code"]) == ("quarantined", "DECIDE_FAILED"), i
            assert row["reason"].startswith("deciding this row raised OverflowError: days=2147483647"), row["reason"]
            assert row["bucket"] == NO_STATE_BUCKET and row["quarantined_at"] == NOW
            raw = json.loads(row["raw"])
            assert raw["consumed_at"] == {"unrepresentable": 2**31 - 1, "type": "date32[day]"}
            assert row["result_id"] == results[i].values["result_id"]
        else:
            assert row["outcome"] == ("acknowledged" if i % 3 == 0 else "retry"), i
            assert row["consumed_msg_id"] == f"M{i}"
    assert rows[2]["consumer_group"] == "G" and rows[2]["consumed_msg_id"] == "M2"
    # Its group cannot be read: the row keeps what can be, and raw keeps the bytes.
    assert rows[9]["consumer_group"] is None and rows[9]["route"] == ""
    assert base64.b64decode(json.loads(rows[9]["raw"])["consumer_group"]["invalid_utf8_base64"]) == b"G\xff"


# -- item 4: isBlank --------------------------------------------------------------------------------


def java_is_whitespace(cp: int) -> bool:
    """``Character.isWhitespace`` as its Javadoc defines it."""
    if cp in (0x00A0, 0x2007, 0x202F):
        return False
    if unicodedata.category(chr(cp)) in ("Zs", "Zl", "Zp"):
        return True
    return cp in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F)


def test_is_blank_is_rocketmqs_isblank_for_every_code_point() -> None:
    """#12 item 4, seeds ``UtilAll.isBlank``: blank = every char is Java whitespace, in Python and in Arrow."""
    points = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    expected = [java_is_whitespace(cp) for cp in points]
    singles = [chr(cp) for cp in points]
    assert [is_blank(s) for s in singles] == expected
    assert blank_mask(pa.array(singles)).to_pylist() == expected
    assert is_blank(None) and is_blank("") and is_blank(" \t\u3000\u2028") and not is_blank(" \u00a0 ")
    assert blank_mask(pa.array([None, "", " x ", "\n"])).to_pylist() == [True, True, False, True]


def test_whitespace_origin_id_is_blank_so_the_consumed_id_is_the_origin() -> None:
    """#12 item 4, R7: ``UtilAll.isBlank(originMsgId) ? msg.getMsgId() : originMsgId``."""
    rows = run([
        Result.of("M-ws").failed(origin_msg_id=" \t\u3000"),
        Result.of("M-nbsp").failed(origin_msg_id="\u00a0"),  # not Java whitespace: a (strange) id
        Result.of("  ").failed(),
        Result.of("M-g", group="\u2003").failed(),
        Result.of("M-t", topic="\n").failed(),
    ])
    assert rows[0]["origin_msg_id"] == "M-ws" and rows[0]["delivery_key"] == "M-ws:1"
    assert rows[1]["origin_msg_id"] == "\u00a0"
    assert [r["reason_code"] for r in rows[2:]] == ["MISSING_MSG_ID", "MISSING_GROUP", "MISSING_TOPIC"]


# -- item 5: buckets before 1970 ---------------------------------------------------------------------


def test_store_times_before_1970_get_a_real_floor_bucket() -> None:
    """#12 item 5, R8: a pre-1970 store time is scheduled in bucket floor(t / bucket), never the no-state sentinel."""
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    times = [epoch - dt.timedelta(seconds=2), epoch - dt.timedelta(milliseconds=500), epoch,
             epoch - dt.timedelta(days=365 * 1000)]
    rows = run([Result.of(f"S{i}").failed(store_timestamp=t) for i, t in enumerate(times)]
               + [Result.of("ACK").ok()], {"engine": {"state_bucket": "1s"}})
    us = [(t - epoch) // dt.timedelta(microseconds=1) for t in times]
    assert [r["outcome"] for r in rows] == ["retry"] * 4 + ["acknowledged"]
    assert [r["bucket"] for r in rows[:4]] == [-2, -1, 0, us[3] // 1_000_000]
    assert NO_STATE_BUCKET not in [r["bucket"] for r in rows[:4]] and rows[4]["bucket"] == NO_STATE_BUCKET
    # The smallest store time a column can hold still has a bucket above the sentinel (smallest bucket: 1 ms).
    assert -(2**63) // 1000 > NO_STATE_BUCKET
    # The issue's case with the default 10 s bucket: -2 s is in bucket -1, a real bucket.
    (default,) = run([Result.of("D").failed(store_timestamp=times[0])])
    assert default["bucket"] == -1 and default["bucket"] != NO_STATE_BUCKET


# -- item 18: what raw keeps ---------------------------------------------------------------------------


def test_body_too_large_raw_keeps_a_prefix_and_the_size() -> None:
    """#12 item 18, bad-input rule: a huge body is not copied into quarantine; its first 1 KiB and size are."""
    body = bytes(range(256)) * 40  # 10,240 bytes
    rows = run([Result.of("BIG").failed(body=body), Result.of("SMALL").with_(status="??", body=b"tiny")],
               {"engine": {"max_body_bytes": 2048}})
    assert rows[0]["reason_code"] == "BODY_TOO_LARGE"
    raw = json.loads(rows[0]["raw"])
    assert raw["body"] == {"base64": base64.b64encode(body[:1024]).decode(), "size": 10_240, "truncated": True}
    assert raw["msg_id"] == "BIG" and len(rows[0]["raw"]) < 3000
    # A body within the limit is kept whole.
    assert json.loads(rows[1]["raw"])["body"] == {"base64": base64.b64encode(b"tiny").decode()}


def test_unknown_group_quarantine_keeps_the_row_in_raw() -> None:
    """#12 item 18, R10: SUBSCRIPTION_GROUP_NOT_EXIST keeps the consume result in raw (it was null)."""
    (row,) = run([Result.of("U1", group="ghost").failed()], {"engine": {"auto_create_groups": False}})
    assert row["reason_code"] == "SUBSCRIPTION_GROUP_NOT_EXIST"
    raw = json.loads(row["raw"])
    assert raw["msg_id"] == "U1" and raw["consumer_group"] == "ghost" and raw[POSITION] == "p0000"


def test_a_decision_that_overflows_deep_inside_decide_quarantines_only_its_rows() -> None:
    """#12 item 3, R3: with retry_queue_nums = 2^32 a retry's queue id (hash % nums) can pass int32.

    Config loading refuses that value (see test_retry_queue_nums_is_a_java_int); given
    one anyway, nothing in decide anticipates it: building the output raises
    ArrowInvalid for those rows only. They are quarantined with the exception;
    their neighbours retry.
    """
    results = [Result.of(f"W{i}", group="wide").failed() for i in range(8)]
    config = with_unvalidated_group(parse_config({"groups": {"wide": {}}}), "wide", retry_queue_nums=2**32)
    rows = run(results, config)
    assert [r["consumed_msg_id"] for r in rows] == [f"W{i}" for i in range(8)]
    outcomes = {r["outcome"] for r in rows}
    assert outcomes == {"retry", "quarantined"}, outcomes
    for row in rows:
        if row["outcome"] == "retry":
            assert 0 <= row["queue_id"] <= INT32_MAX
        else:
            assert row["reason_code"] == "DECIDE_FAILED"
            assert row["reason"].startswith("deciding this row raised ArrowInvalid: Value ")
            assert int(row["reason"].split("Value ")[1].split()[0]) > INT32_MAX
            assert json.loads(row["raw"])["msg_id"] == row["consumed_msg_id"]


def test_raw_records_a_value_that_cannot_be_read_instead_of_failing() -> None:
    """Bad-input rule, #12 items 2-3: an unreadable value in an extra column still lets the row be quarantined.

    The row keeps its own reason (UNKNOWN_STATUS); its raw names what could not be read.
    """
    table = results_table([Result.of("Q").with_(status="??"), Result.of("OK").ok()])
    hostile = hostile_array([7, 8], extension="test.hostile", message="this value cannot be read")
    rows = decide_table(table.append_column("extra", hostile)).to_pylist()
    assert (rows[0]["reason_code"], rows[1]["outcome"]) == ("UNKNOWN_STATUS", "acknowledged")
    raw = json.loads(rows[0]["raw"])
    assert raw["msg_id"] == "Q"
    assert raw["extra"] == {"unreadable": "RuntimeError: this value cannot be read", "type": "extension<test.hostile<_HostileType>>"}


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**64])
def test_retry_queue_nums_is_a_java_int(value: int) -> None:
    """R10: RocketMQ's retryQueueNums is a Java int; a value outside int32 is a config error, not a row error."""
    with pytest.raises(ConfigError, match="retry_queue_nums"):
        parse_config({"groups": {"g": {"retry_queue_nums": value}}})
    for edge in (2**31 - 1, -(2**31)):
        assert parse_config({"groups": {"g": {"retry_queue_nums": edge}}}).groups["g"].retry_queue_nums == edge
