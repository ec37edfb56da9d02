"""#12 item 14: drift of consume_results is described per column, and decide tolerates it row by row.

SPEC bad-input rule: a row with a value of the wrong type is quarantined
(``WRONG_TYPE``), the others are decided; a drifted table never stops the
engine. No Spark here.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from retry_engine.config import parse_config
from retry_engine.core.decide import BATCH_TS, POSITION, Decider
from retry_engine.delta import ensure_readable_table
from retry_engine.delta._schema import schema_drift
from retry_engine.schemas import CONSUME_RESULTS

EXPECTED = CONSUME_RESULTS.arrow_schema


def _drifted(**changes: pa.DataType | None) -> pa.Schema:
    """The consume_results schema with columns retyped, dropped (None) or added (unknown names)."""
    fields = [f for f in EXPECTED if f.name not in changes or changes[f.name] is not None]
    fields = [pa.field(f.name, changes[f.name]) if f.name in changes else f for f in fields]
    known = set(EXPECTED.names)
    return pa.schema(fields + [pa.field(n, t) for n, t in changes.items() if n not in known and t is not None])


def test_each_kind_of_drift_is_named_with_types_and_effect() -> None:
    table = _drifted(
        tags=None,
        flag=pa.int16(),
        reconsume_times=pa.int64(),
        queue_id=pa.string(),
        properties=pa.int64(),
        body=pa.large_binary(),  # a flavour of binary: not drift
        tenant=pa.string(),
    )
    got = {d.column: (d.table_type, d.expected_type, d.effect) for d in schema_drift(table, EXPECTED)}
    assert got == {
        "tags": (None, pa.string(), "read as null in every row"),
        "flag": (pa.int16(), pa.int32(), "cast; every value fits"),
        "reconsume_times": (
            pa.int64(), pa.int32(), "cast value by value; a row whose value does not fit is quarantined (WRONG_TYPE)"
        ),
        "queue_id": (
            pa.string(), pa.int32(), "cast value by value; a row whose value does not fit is quarantined (WRONG_TYPE)"
        ),
        "properties": (
            pa.int64(), EXPECTED.field("properties").type,
            "no cast exists; a row with a non-null value is quarantined (WRONG_TYPE)",
        ),
        "tenant": (pa.string(), None, "ignored (kept only in quarantined rows' raw JSON)"),
    }
    assert schema_drift(EXPECTED, EXPECTED) == []


@pytest.mark.parametrize(
    ("have", "want", "fits"),
    [
        (pa.int8(), pa.int32(), True),
        (pa.uint16(), pa.int32(), True),
        (pa.uint32(), pa.int32(), False),
        (pa.int64(), pa.int32(), False),
        (pa.int32(), pa.float64(), True),
        (pa.int64(), pa.float64(), False),  # 2**53 + 1 has no float64
        (pa.float32(), pa.float64(), True),
    ],
)
def test_only_widening_counts_as_always_fitting(have: pa.DataType, want: pa.DataType, fits: bool) -> None:
    (drift,) = schema_drift(pa.schema([("x", have)]), pa.schema([("x", want)]))
    assert (drift.effect == "cast; every value fits") is fits


def test_ensure_readable_table_logs_one_line_per_drift_and_creates_a_missing_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = str(tmp_path / "new")
    table, drifts = ensure_readable_table(missing, EXPECTED)
    assert drifts == [] and pa.schema(table.schema().to_arrow()) == EXPECTED
    drifted = str(tmp_path / "drifted")
    write_deltalake(drifted, pa.table({"msg_id": ["m"], "reconsume_times": pa.array([1], pa.int64()), "x": [1]}))
    with caplog.at_level(logging.WARNING, logger="retry_engine.delta.tables"):
        _, drifts = ensure_readable_table(drifted, EXPECTED)
    lines = [r.getMessage() for r in caplog.records]
    # Every column but msg_id and reconsume_times is missing; reconsume_times is retyped; x is extra.
    assert len(lines) == len(drifts) == (len(EXPECTED) - 2) + 1 + 1
    assert any("'reconsume_times' (table: int64; expected: int32)" in m and drifted in m for m in lines)
    assert any("'x' (table: int64; expected: no such column): ignored" in m for m in lines)


def test_decide_quarantines_only_the_values_that_do_not_fit_and_lets_nulls_through() -> None:
    """#12 item 14 / SPEC bad input: null fits any type, even one Arrow cannot cast to (``properties`` as int64)."""
    n = 4
    batch = pa.RecordBatch.from_pydict(
        {
            "consumer_group": ["G"] * n,
            "msg_id": ["A", "B", "C", "D"],
            "topic": ["t"] * n,
            "status": ["RECONSUME_LATER"] * n,
            "reconsume_times": pa.array([0, 2**31, None, -(2**31) - 1], pa.int64()),
            "properties": pa.array([None, None, None, 5], pa.int64()),
            "tenant": ["x"] * n,
            POSITION: [f"p{i}" for i in range(n)],
            BATCH_TS: pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)] * n, pa.timestamp("us", tz="UTC")),
        }
    )
    out = Decider(parse_config({}))(batch).to_pylist()
    got = {r["consumed_msg_id"]: (r["outcome"], r["reason_code"]) for r in out if r["kind"] == "outcome"}
    assert got == {
        "A": ("retry", None),
        "B": ("quarantined", "WRONG_TYPE"),
        "C": ("retry", None),
        "D": ("quarantined", "WRONG_TYPE"),
    }
