"""The engine's input, packed by the deltars source and unpacked for decide (no Spark session)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import ReadAllAvailable
from pyspark.sql.types import StringType, StructField

from retry_engine.core.decide import BATCH_TS
from retry_engine.core.engine import DECIDE_BATCH_ROWS, PACKED_INPUT, _unpacked
from retry_engine.delta import append_arrow, ensure_table
from retry_engine.delta._arrow_ipc import from_ipc, to_ipc
from retry_engine.delta.source import DeltaStreamReader, SourceOptions, packed_schema, row_schema
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import Result, results_table

STAMP = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)


def _read(reader: DeltaStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[pa.RecordBatch]:
    return [batch for part in reader.partitions(start, end) for batch in reader.read(part)]


def test_the_packed_stream_carries_the_rows_and_positions_of_the_plain_one(tmp_path: Path) -> None:
    path = str(tmp_path / "in")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)
    for n in (3, 1, 4):
        append_arrow(path, results_table([Result.of().failed() for _ in range(n)]))
    plain_options = SourceOptions.parse({"path": path, "sourcePositionColumn": "_pos"})
    plain = DeltaStreamReader(plain_options, row_schema(plain_options))
    assert plain.schema.fields[-1] == StructField("_pos", StringType(), False)
    packed = DeltaStreamReader(
        SourceOptions.parse({"path": path, "sourcePositionColumn": "_pos", "packedColumn": "_rows"}),
        packed_schema("_rows"),
    )
    start = plain.initialOffset()
    end = plain.latestOffset(start, ReadAllAvailable())
    want = pa.Table.from_batches(_read(plain, start, end))
    batches = _read(packed, start, end)
    assert all(b.schema.names == ["_rows"] for b in batches)
    got = pa.concat_tables([from_ipc(p) for b in batches for p in b.column("_rows").to_pylist()])
    assert got.equals(want) and got.num_rows == 8


def test_decide_gets_packed_input_in_bounded_slices_with_the_batch_clock() -> None:
    first = pa.table({"msg_id": [f"m{i}" for i in range(DECIDE_BATCH_ROWS * 2 + 5)]})
    second = pa.table({"msg_id": ["last", "one"]})
    stamp = pa.field(BATCH_TS, pa.timestamp("us", tz="UTC"))
    batch = pa.RecordBatch.from_arrays(
        [pa.array([to_ipc(first), to_ipc(second)], pa.binary()), pa.array([STAMP, STAMP], stamp.type)],
        schema=pa.schema([pa.field(PACKED_INPUT, pa.binary()), stamp]),
    )
    out = list(_unpacked(batch))
    assert [b.num_rows for b in out] == [DECIDE_BATCH_ROWS, DECIDE_BATCH_ROWS, 5, 2]
    assert all(b.schema.field(BATCH_TS) == stamp and set(b.column(BATCH_TS).to_pylist()) == {STAMP} for b in out)
    assert [m for b in out for m in b.column("msg_id").to_pylist()] == [*first.column("msg_id").to_pylist(), "last", "one"]
    # Native Delta mode reads unpacked rows: they go to decide as they are.
    plain = pa.RecordBatch.from_pydict({"msg_id": ["a"], BATCH_TS: pa.array([STAMP], stamp.type)})
    assert list(_unpacked(plain)) == [plain]
