"""Packing WORK rows for their trip through Spark: one row per state key, order kept (retry_engine.packed)."""

from __future__ import annotations

import pyarrow as pa

from retry_engine.config import parse_config
from retry_engine.packed import MAX_PAYLOAD_ROWS, pack, unpack
from retry_engine.schemas import WORK
from tests.builders import T0, Result, work_rows


def test_pack_makes_one_row_per_key_and_unpack_restores_each_keys_rows_in_order() -> None:
    config = parse_config({"engine": {"state_bucket": "1s"}})
    results = [
        Result.of("A").ok(), Result.of("F1").failed(), Result.of("B", group="H").ok(),
        Result.of("F2").failed(), Result.of("F3", group="H").failed(), Result.of("C").ok(),
    ]
    work = work_rows(results, batch_ts=T0, config=config)
    packed = pack(work)
    keys = list(zip(packed.column("route").to_pylist(), packed.column("bucket").to_pylist(), strict=True))
    want_keys = set(zip(work.column("route").to_pylist(), work.column("bucket").to_pylist(), strict=True))
    assert len(keys) == len(want_keys) and set(keys) == want_keys
    for i, (route, bucket) in enumerate(keys):
        rows = unpack([packed.column("payload")[i].as_py()])
        assert rows.schema == WORK.arrow_schema
        assert set(rows.column("route").to_pylist()) == {route} and set(rows.column("bucket").to_pylist()) == {bucket}
        expected = [
            r["source_position"] for r in work.to_pylist() if (r["route"], r["bucket"]) == (route, bucket)
        ]
        assert rows.column("source_position").to_pylist() == expected  # input order within the key
    everything = unpack(packed.column("payload").to_pylist())
    assert sorted(everything.column("source_position").to_pylist()) == sorted(work.column("source_position").to_pylist())


def test_empty_input_packs_to_no_rows_and_unpacks_to_an_empty_work_table() -> None:
    packed = pack(WORK.arrow_schema.empty_table())
    assert packed.num_rows == 0 and packed.schema.names == ["route", "bucket", "payload"]
    assert unpack([]).schema == WORK.arrow_schema and unpack([]).num_rows == 0
    assert isinstance(packed, pa.RecordBatch)


def test_a_busy_key_is_split_into_bounded_payloads_in_order() -> None:
    """Spark builds each Arrow batch for Python in JVM direct memory: no payload holds a whole busy key."""
    one = work_rows([Result.of("F").failed()], batch_ts=T0)
    rows = MAX_PAYLOAD_ROWS * 2 + 5
    many = pa.concat_tables([one] * rows)
    many = many.set_column(
        many.schema.get_field_index("source_position"), "source_position", pa.array([f"{i:09d}" for i in range(rows)])
    )
    packed = pack(many)
    sizes = [unpack([p]).num_rows for p in packed.column("payload").to_pylist()]
    assert sizes == [MAX_PAYLOAD_ROWS, MAX_PAYLOAD_ROWS, 5]
    assert len(set(zip(packed.column("route").to_pylist(), packed.column("bucket").to_pylist(), strict=True))) == 1
    assert unpack(packed.column("payload").to_pylist()).column("source_position").to_pylist() == [
        f"{i:09d}" for i in range(rows)
    ]
