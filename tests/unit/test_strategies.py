"""The property test's generators write what they claim to (#12 item F), so its failures are the engine's.

No Spark here: the tables are built and written with pyarrow and delta-rs only.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from retry_engine.schemas import CONSUME_RESULTS
from tests import strategies
from tests.strategies import Example, Ident


def test_unchecked_strings_keep_invalid_utf8_byte_for_byte_through_delta(tmp_path: Path) -> None:
    """SPEC bad-input rule: invalid UTF-8 must reach the engine as written (Parquet does not validate)."""
    values = [b"ok", b"\xff", b"\xed\xa0\x80", None, b""]
    table = pa.table({"s": strategies.unchecked_strings(values)})
    write_deltalake(str(tmp_path), table)
    back = DeltaTable(str(tmp_path)).to_pyarrow_table().column("s").cast(pa.binary()).to_pylist()
    assert back == values


def test_timestamps_keep_the_whole_int64_range(tmp_path: Path) -> None:
    """Timestamps before 1970, before year 1 and after 9999 are written as the microseconds drawn."""
    micros = [strategies.INT64_MIN, -2_000_000, -1, 0, strategies.INT64_MAX, 253_402_300_800 * 1_000_000]
    row = {name: None for name in CONSUME_RESULTS.names} | {"store_timestamp": micros[0]}
    rows = [{**row, "store_timestamp": us} for us in micros]
    write_deltalake(str(tmp_path), strategies.arrow_table(rows, b"ns-"))
    back = DeltaTable(str(tmp_path)).to_pyarrow_table().column("store_timestamp").cast(pa.int64()).to_pylist()
    assert back == micros


def test_ids_are_namespaced_except_null_and_empty() -> None:
    """Examples sharing an engine must not share ids; null and '' name nothing and stay as drawn."""
    assert Ident(b"\xffa").value(b"p7-") == b"p7-\xffa"
    assert Ident(None).value(b"p7-") is None
    assert Ident(b"").value(b"p7-") == b""


def test_pinned_examples_are_consume_results_tables() -> None:
    """The pinned counterexamples (#12 items 1 and 5, the line separator) write as drawn."""
    for pinned in strategies.PINNED.values():
        table = strategies.arrow_table(pinned.rows, b"p0-")
        assert table.schema == CONSUME_RESULTS.arrow_schema and table.num_rows == len(pinned.rows)
    (row,) = strategies.arrow_table(strategies.BEFORE_1970.rows, b"p0-").column("store_timestamp").cast(pa.int64()).to_pylist()
    assert row == -1_000_000


@settings(max_examples=60, deadline=None)
@given(example=strategies.examples(), namespace=st.sampled_from([b"p0-", b"p12-"]))
def test_examples_are_consume_results_tables_with_their_copies(example: Example, namespace: bytes) -> None:
    """Every example writes as a CONSUME_RESULTS table; a copy differs from its original at most in result_id."""
    for rows in (example.rows, example.late):
        if rows:
            table = strategies.arrow_table(rows, namespace)
            assert table.schema == CONSUME_RESULTS.arrow_schema and table.num_rows == len(rows)
            table.validate(full=False)
    assert len(example.copy_of) == len(example.rows) and len(example.late_copy_of) == len(example.late)
    copies = [(example.rows[i], r) for r, i in zip(example.rows, example.copy_of, strict=True)]
    copies += [(example.rows[i], r) for r, i in zip(example.late, example.late_copy_of, strict=True)]
    for original, copy in copies:
        assert {k: v for k, v in copy.items() if k != "result_id"} == {
            k: v for k, v in original.items() if k != "result_id"
        }
