"""One running engine fed hostile rows between good ones (SPEC bad-input rule; issue #12 items 1-5, 18).

A single streaming run over one consume-result table holding int32 edges,
timestamps at and past Python's range, invalid UTF-8, rows whose decision
raises, a pre-1970 store time and oversized bodies, plus good rows before and
after; then one assertion block per item. Expected outcomes follow SPEC
R1-R10 and the seeds, not the code under test.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from retry_engine.core import engine
from tests.builders import Result, results_table, with_unvalidated_group
from tests.lakehouse import Lake, wait_for
from tests.streaming import running

pytestmark = pytest.mark.slow

INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
TS = pa.timestamp("us", tz="UTC")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
LATEST = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
YEAR_19969_US = 568_000_000_000_000_000  # fits timestamp[us], not a Python datetime
# A group whose retry_queue_nums (2^32, which config loading refuses, set here anyway) makes some retries' queue id
# (hash % retry_queue_nums) too big for the int32 queue_id column: deciding those rows
# raises deep inside decide, a failure nobody anticipated (the general rule, item 3).
WIDE = "wide"
WIDE_IDS = [f"W{i}" for i in range(8)]


def with_bytes(table: pa.Table, column: str, row: int, data: bytes) -> pa.Table:
    """``table`` with string ``column[row]`` holding ``data`` unvalidated, as Parquet allows."""
    binary = table.column(column).combine_chunks().cast(pa.binary()).to_pylist()
    binary[row] = data
    raw = pa.array(binary, pa.binary())
    strings = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers(), null_count=raw.null_count)
    return table.set_column(table.schema.get_field_index(column), table.schema.field(column), strings)


def with_micros(table: pa.Table, column: str, row: int, us: int) -> pa.Table:
    values = table.column(column).combine_chunks().cast(pa.int64()).to_pylist()
    values[row] = us
    return table.set_column(
        table.schema.get_field_index(column), table.schema.field(column), pa.array(values, pa.int64()).cast(TS)
    )


def first_results() -> tuple[list[Result], pa.Table]:
    results = [
        Result.of("OK1").ok(),
        Result.of("F1").failed(),
        # item 1: int32 edges
        Result.of("RMAX").failed(reconsume_times=INT32_MAX),
        Result.of("LMAX").failed(delay_level_when_next_consume=INT32_MAX),
        Result.of("LMIN").failed(delay_level_when_next_consume=INT32_MIN),
        Result.of("XMAX").failed(reconsume_times=INT32_MAX - 1, max_reconsume_times=INT32_MAX),
        Result.of("QE").failed(queue_id=INT32_MIN, flag=INT32_MAX),
        # item 1: timestamps
        Result.of("FUT").failed(store_timestamp=LATEST, born_timestamp=LATEST, consumed_at=LATEST),
        Result.of("TOUT").failed(),
        # item 2: invalid UTF-8
        Result.of("U8G").failed(),
        Result.of("U8E").failed(),
        # item 3: rows whose decision raises, between good ones
        *[Result.of(m, group=WIDE).failed() for m in WIDE_IDS],
        Result.of("OK2").ok(),
        # item 5: store times just before 1970 (buckets -1 and -2 with 1 s buckets)
        Result.of("PRE1").failed(store_timestamp=EPOCH - dt.timedelta(seconds=1)),
        Result.of("PRE2").failed(store_timestamp=EPOCH - dt.timedelta(milliseconds=1500)),
        # item 4: whitespace-only origin id
        Result.of("WS").failed(origin_msg_id=" \t\u3000"),
        # item 18
        Result.of("GHOST", group="ghost").failed(),
        Result.of("BIG").failed(body=bytes(range(256)) * 20),
        Result.of("F2").failed(),
    ]
    table = results_table(results)
    index = {r.values["msg_id"]: i for i, r in enumerate(results)}
    table = with_micros(table, "born_timestamp", index["TOUT"], YEAR_19969_US)
    table = with_bytes(table, "consumer_group", index["U8G"], b"G\xff\xfe")
    table = with_bytes(table, "error_message", index["U8E"], b"boom \xc3(")
    return results, table


def test_hostile_rows_between_good_ones_each_get_one_outcome_and_the_stream_goes_on(
    spark: Any, tmp_path: Path
) -> None:
    """SPEC bad-input rule, B1, R8; #12 items 1, 2, 3, 4, 5 and 18 in one engine run."""
    lake = Lake.make(
        tmp_path,
        engine={"auto_create_groups": False, "max_body_bytes": 1024},
        groups={"G": {}, WIDE: {}},
    )
    lake = Lake(lake.root, with_unvalidated_group(lake.config, WIDE, retry_queue_nums=2**32))
    first, table = first_results()
    later = [Result.of("AFTER1").ok(), Result.of("AFTER2").failed()]
    write_deltalake(lake.path("consume_results"), table, mode="append")
    n = len(first) + len(later)

    query = engine.start(spark, lake.config)
    with running(query):

        def outcomes(count: int) -> list[dict[str, Any]]:
            if query.exception() is not None:
                raise AssertionError(f"the engine stopped: {query.exception()}")
            rows = lake.rows("outcomes")
            return rows if len(rows) >= count else []

        wait_for(lambda: outcomes(len(first)), timeout=240, what="an outcome for every first row")
        # The stream goes on after the bad rows.
        lake.write_results(later)
        wait_for(lambda: outcomes(n), timeout=240, what="outcomes of the rows written later")
        retried = {o["output_msg_id"] for o in lake.rows("outcomes") if o["outcome"] == "retry"}
        wait_for(
            lambda: {r["msg_id"] for r in lake.rows("retry")} >= retried,
            timeout=240,
            what="a retry row for every retry outcome",
        )
        assert query.isActive and query.exception() is None

    out = lake.rows("outcomes")
    # Bad-input rule: every input row has exactly one outcome.
    counts = Counter(o["result_id"] for o in out)
    assert set(counts) == {r.values["result_id"] for r in [*first, *later]}
    assert set(counts.values()) == {1}, counts
    by = {o["msg_id"]: o for o in out}
    retry_rows = lake.rows("retry")
    retries = Counter(r["msg_id"] for r in retry_rows)
    dlq = Counter(d["msg_id"] for d in lake.rows("dlq"))
    quarantine = {q["result_id"]: q for q in lake.rows("quarantine")}
    # B1: each retry outcome has exactly one retry row, each dead letter one DLQ row (R8: none early).
    for o in out:
        if o["outcome"] == "retry":
            assert retries[o["output_msg_id"]] == 1, o["msg_id"]
        if o["outcome"] == "dead_letter":
            assert dlq[o["output_msg_id"]] == 1, o["msg_id"]
    assert sum(retries.values()) == sum(o["outcome"] == "retry" for o in out)
    assert all(r["delivered_at"] >= r["due_at"] for r in retry_rows)
    assert {o["result_id"] for o in out if o["outcome"] == "quarantined"} == set(quarantine)
    retry_of = {r["origin_msg_id"]: r for r in retry_rows}

    def result_id(msg_id: str) -> str:
        return next(r.values["result_id"] for r in first if r.values["msg_id"] == msg_id)

    # good rows, before and after the bad ones
    assert [by[m]["outcome"] for m in ("OK1", "F1", "OK2", "F2", "AFTER1", "AFTER2")] == [
        "acknowledged", "retry", "acknowledged", "retry", "acknowledged", "retry"
    ]

    # item 1: int32 edges (R5 clamp, R5 negative level, R6 limit, R7 +1)
    assert (by["RMAX"]["outcome"], by["RMAX"]["reason_code"]) == ("quarantined", "RECONSUME_TIMES_OVERFLOW")
    assert by["LMAX"]["outcome"] == "retry" and by["LMAX"]["delay_level"] == 18
    assert (by["LMIN"]["outcome"], by["LMIN"]["reason_code"]) == ("dead_letter", "DLQ_REQUESTED")
    assert by["XMAX"]["outcome"] == "retry" and retry_of["XMAX"]["reconsume_times"] == INT32_MAX
    assert by["QE"]["outcome"] == "retry" and retry_of["QE"]["flag"] == INT32_MAX
    # item 1: year 9999 is scheduled and delivered; a time past datetime's range is quarantined.
    assert by["FUT"]["outcome"] == "retry" and retry_of["FUT"]["born_timestamp"] == LATEST
    assert (by["TOUT"]["outcome"], by["TOUT"]["reason_code"]) == ("quarantined", "TIMESTAMP_OUT_OF_RANGE")
    assert json.loads(quarantine[result_id("TOUT")]["raw"])["born_timestamp"]["unrepresentable"] == YEAR_19969_US

    # item 2: invalid UTF-8 is quarantined naming the column; raw keeps the bytes; the tables read as UTF-8.
    for msg_id, column, data in (("U8G", "consumer_group", b"G\xff\xfe"), ("U8E", "error_message", b"boom \xc3(")):
        q = quarantine[result_id(msg_id)]
        assert q["reason_code"] == "INVALID_UTF8" and f"column {column}" in q["reason"]
        assert base64.b64decode(json.loads(q["raw"])[column]["invalid_utf8_base64"]) == data

    # item 3: the rows whose decision raises are quarantined with the exception; the others retry.
    wide = [by[m] for m in WIDE_IDS]
    failed = [o for o in wide if o["outcome"] == "quarantined"]
    assert failed and len(failed) < len(wide), [o["outcome"] for o in wide]
    for o in wide:
        if o["outcome"] == "quarantined":
            assert o["reason_code"] == "DECIDE_FAILED"
            assert o["reason"].startswith("deciding this row raised ArrowInvalid: Value "), o["reason"]
            too_big = int(o["reason"].split("Value ")[1].split()[0])
            assert too_big > INT32_MAX  # a queue id the int32 column cannot hold
            assert json.loads(quarantine[o["result_id"]]["raw"])["msg_id"] == o["msg_id"]
        else:
            assert o["outcome"] == "retry" and 0 <= retry_of[o["msg_id"]]["queue_id"] <= INT32_MAX

    # item 4: a whitespace origin id is blank: the consumed id is the origin (R7, UtilAll.isBlank).
    assert retry_of["WS"]["delivery_key"] == "WS:1"

    # item 5: a pre-1970 store time is scheduled and delivered, not passed through as "no state".
    assert by["PRE1"]["outcome"] == "retry" and by["PRE2"]["outcome"] == "retry"
    assert {"PRE1", "PRE2"} <= set(retry_of)

    # item 18: raw keeps the row of an unknown group, and only a prefix and the size of a huge body.
    ghost = json.loads(quarantine[result_id("GHOST")]["raw"])
    assert by["GHOST"]["reason_code"] == "SUBSCRIPTION_GROUP_NOT_EXIST" and ghost["msg_id"] == "GHOST"
    big = json.loads(quarantine[result_id("BIG")]["raw"])["body"]
    assert by["BIG"]["reason_code"] == "BODY_TOO_LARGE"
    assert big == {"base64": base64.b64encode(bytes(range(256)) * 4).decode(), "size": 5120, "truncated": True}
