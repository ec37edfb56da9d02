"""#12 item 14: schema drift in consume_results does not block the engine; what cannot be cast is quarantined.

SPEC bad-input rule: every row ends in exactly one outcome and a malformed one
("wrong types") is quarantined with the reason, the stream going on. The
table below is written by "another team" with a drifted schema: an extra
column, optional columns missing, int64 where the engine expects int32 (with
values outside int32), strings where it expects ints. Later a commit adds
columns with ``schema_mode="merge"``.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from retry_engine.core import engine
from tests.lakehouse import Lake, wait_for

pytestmark = pytest.mark.slow

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)

DRIFTED = pa.schema(
    [
        ("result_id", pa.string()),
        ("consumer_group", pa.string()),
        ("message_model", pa.string()),
        ("status", pa.string()),
        ("delay_level_when_next_consume", pa.int64()),  # int32 expected
        ("msg_id", pa.string()),
        ("topic", pa.string()),
        ("body", pa.binary()),
        ("store_timestamp", pa.timestamp("us", tz="UTC")),
        ("queue_id", pa.string()),  # int32 expected
        ("reconsume_times", pa.int64()),  # int32 expected
        ("tenant_note", pa.string()),  # not a consume_results column
        # missing: consumer_id, max_reconsume_times, error_*, consumed_at, tags, keys, flag,
        # properties, born_*, origin_msg_id, retry_topic, attempts
    ]
)


def _row(msg_id: str, *, status: str = "RECONSUME_LATER", **values: Any) -> dict[str, Any]:
    return {
        "result_id": f"R-{msg_id}",
        "consumer_group": "G",
        "message_model": "CLUSTERING",
        "status": status,
        "delay_level_when_next_consume": 0,
        "msg_id": msg_id,
        "topic": "orders",
        "body": msg_id.encode(),
        "store_timestamp": T0,
        "queue_id": "1",
        "reconsume_times": 0,
        "tenant_note": "whatever",
        **values,
    }


def test_engine_runs_on_a_drifted_table_and_quarantines_only_uncastable_rows(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """#12 item 14; R1 (ack), R5/R6 (retry of a failure), SPEC bad input (WRONG_TYPE quarantine)."""
    lake = Lake.make(tmp_path)
    path = lake.path("consume_results")
    rows = [
        _row("OK", status="CONSUME_SUCCESS", queue_id="3"),  # acknowledged: "3" casts to 3
        _row("FAIL", queue_id="2", reconsume_times=1),  # a retry: int64 1 fits int32
        _row("HUGE", reconsume_times=2**31),  # one past int32
        _row("TINY", reconsume_times=-(2**63)),  # int64's minimum
        _row("WORD", queue_id="seven"),  # not a number
        _row("SPACE", queue_id=" "),
        _row("LEVEL", delay_level_when_next_consume=2**40),
        _row("NULLS", queue_id=None, reconsume_times=None, delay_level_when_next_consume=None),  # nulls fit
    ]
    write_deltalake(path, pa.Table.from_pylist(rows, schema=DRIFTED), mode="append")
    uncastable = {"HUGE", "TINY", "WORD", "SPACE", "LEVEL"}

    with caplog.at_level(logging.WARNING, logger="retry_engine.delta.tables"):
        query = engine.start(spark, lake.config)
    try:
        drift_lines = [r.getMessage() for r in caplog.records if "tolerated" in r.getMessage()]
        for column, words in {
            "reconsume_times": ("int64", "int32", "quarantined (WRONG_TYPE)"),
            "queue_id": ("string", "int32", "quarantined (WRONG_TYPE)"),
            "tenant_note": ("string", "ignored"),
            "attempts": ("no such column", "read as null"),
            "tags": ("no such column", "read as null"),
        }.items():
            line = next((m for m in drift_lines if f"column {column!r}" in m), None)
            assert line is not None, (column, drift_lines)
            assert path in line and all(w in line for w in words), line
        wait_for(lambda: len(lake.rows("outcomes")) >= len(rows), timeout=300, what="an outcome for every drifted row")

        # A later commit evolves the schema (adds a known column and an unknown one): the stream goes on.
        merged = pa.Table.from_pylist(
            [{**_row("MERGED", reconsume_times=0), "tags": "TagA", "added_later": 1}],
            schema=DRIFTED.append(pa.field("tags", pa.string())).append(pa.field("added_later", pa.int64())),
        )
        write_deltalake(path, merged, mode="append", schema_mode="merge")
        wait_for(lambda: len(lake.rows("outcomes")) >= len(rows) + 1, timeout=300, what="the outcome of the merged commit")
        wait_for(lambda: len(lake.rows("retry")) >= 3, timeout=300, what="retries of FAIL, NULLS and MERGED")
        assert query.isActive and query.exception() is None
    finally:
        query.stop()

    outcomes = lake.rows("outcomes")
    assert sorted(o["result_id"] for o in outcomes) == sorted([*(f"R-{r['msg_id']}" for r in rows), "R-MERGED"])
    got = {o["result_id"][2:]: (o["outcome"], o["reason_code"]) for o in outcomes}
    assert got["OK"] == ("acknowledged", None)
    assert got["FAIL"][0] == got["NULLS"][0] == got["MERGED"][0] == "retry"
    assert {m: got[m] for m in uncastable} == {m: ("quarantined", "WRONG_TYPE") for m in uncastable}
    quarantine = {q["msg_id"]: q for q in lake.rows("quarantine")}
    assert set(quarantine) == uncastable
    assert "reconsume_times" in quarantine["HUGE"]["reason"] and "2147483648" in quarantine["HUGE"]["reason"]
    assert "queue_id" in quarantine["WORD"]["reason"] and "seven" in quarantine["WORD"]["reason"]
    assert '"tenant_note": "whatever"' in quarantine["WORD"]["raw"]  # the row as read, extras included
    retries = {r["origin_msg_id"]: r for r in lake.rows("retry")}
    # R7: reconsumeTimes = old + 1 (a null count is 0).
    assert retries["FAIL"]["reconsume_times"] == 2 and retries["NULLS"]["reconsume_times"] == 1
