"""Packing WORK rows for their trip through Spark: one row per state key, order kept (retry_engine.core.packed)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from retry_engine.config import parse_config
from retry_engine.core.packed import (
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_ROWS,
    as_work,
    pack,
    payload_chunks,
    unpack,
)
from retry_engine.delta._arrow_ipc import from_ipc, ipc_array, ipc_chunks, to_ipc
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


def test_wide_rows_make_for_fewer_rows_per_payload() -> None:
    """Bodies of 200 KiB: a payload keeps to about MAX_PAYLOAD_BYTES, not MAX_PAYLOAD_ROWS rows."""
    one = work_rows([Result.of("W").failed()], batch_ts=T0)
    rows = pa.concat_tables([one] * 100)
    rows = rows.set_column(rows.schema.get_field_index("body"), WORK.arrow_schema.field("body"),
                           pa.array([b"x" * 200 * 1024] * 100, pa.binary()))
    payloads = payload_chunks(rows)
    assert len(payloads) > 1 and all(len(p) < 2 * MAX_PAYLOAD_BYTES for p in payloads)
    assert unpack(payloads).num_rows == 100


def test_ipc_chunks_bound_rows_and_bytes_and_keep_order() -> None:
    table = pa.table({"i": pa.array(range(10), pa.int64())})
    by_rows = [from_ipc(c).column("i").to_pylist() for c in ipc_chunks(table, max_rows=4, max_bytes=1 << 20)]
    assert by_rows == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    by_bytes = [from_ipc(c).num_rows for c in ipc_chunks(table, max_rows=100, max_bytes=24)]
    assert by_bytes == [3, 3, 3, 1]  # 8 bytes a row
    assert [from_ipc(c).num_rows for c in ipc_chunks(table, max_rows=100, max_bytes=1)] == [1] * 10
    assert ipc_chunks(table.slice(0, 0), max_rows=4, max_bytes=100) == []


def test_pack_takes_a_record_batch_and_makes_one_row_per_key_of_three() -> None:
    """Every (route, bucket) key is one packed row (issue #16): three routes of two rows each are three rows."""
    config = parse_config({"engine": {"state_bucket": "1s"}})
    results = [Result.of(f"{g}{i}", group=g).failed() for g in ("A", "B", "C") for i in range(2)]
    work = work_rows(results, batch_ts=T0, config=config)
    assert len(set(work.column("bucket").to_pylist())) == 1
    packed = pack(work.combine_chunks().to_batches()[0])
    assert packed.column("route").to_pylist() == ["A", "B", "C"]
    assert [unpack([p]).num_rows for p in packed.column("payload").to_pylist()] == [2, 2, 2]


def test_unpack_gives_a_payload_of_some_columns_every_work_column_with_the_others_null() -> None:
    """#14 part 5: a ledger row crosses Spark with its own columns only; unpack restores WORK's shape."""
    work = work_rows([Result.of("F").failed(), Result.of("A").ok()], batch_ts=T0)
    narrow = work.select(["kind", "outcome", "consumed_msg_id", "route", "bucket"])
    rows = unpack(payload_chunks(narrow) + payload_chunks(work))
    assert rows.schema == WORK.arrow_schema and rows.num_rows == 4
    assert rows.column("consumed_msg_id").to_pylist() == ["F", "A", "F", "A"]
    assert rows.column("body").to_pylist()[:2] == [None, None]
    assert rows.column("body").to_pylist()[2:] == work.column("body").to_pylist()
    assert as_work(work) is work  # a full payload is taken as it is


def test_ipc_array_holds_the_bytes_to_ipc_writes_for_each_table_in_one_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Packed payloads are written once into one shared buffer: the same values as one to_ipc per table."""
    from retry_engine.delta import _arrow_ipc

    work = pa.Table.from_batches([work_rows([Result.of(f"F{i}").failed() for i in range(5)], batch_ts=T0)
                                  .to_batches()[0]])
    tables = [work.slice(0, 2), work.slice(2, 0), pa.table({"x": [1, None]}).to_batches()[0], work.slice(2)]
    want = [to_ipc(t) for t in tables]
    array = ipc_array(tables)
    assert array.type == pa.binary() and array.null_count == 0
    assert array.to_pylist() == want
    assert from_ipc(array[3].as_py()).equals(work.slice(2))
    assert ipc_array([]).to_pylist() == []
    # Past what one binary array holds (2 GiB; made small here) the bytes go through pa.array, as before.
    monkeypatch.setattr(_arrow_ipc, "_BINARY_MAX_BYTES", 10)
    assert ipc_array(tables).to_pylist() == want


def test_pack_payloads_are_one_buffer_and_unpack_alike() -> None:
    work = work_rows([Result.of(f"F{i}").failed() for i in range(7)] + [Result.of("A").ok()], batch_ts=T0)
    payload = pack(work).column("payload")
    assert len(payload.buffers()) == 3 and payload.buffers()[0] is None
    assert unpack(payload.to_pylist()).sort_by("source_position").equals(
        work.sort_by("source_position").select(unpack(payload.to_pylist()).schema.names))
