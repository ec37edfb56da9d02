"""Routing WORK rows to the output tables (Spark-free part of the one-job writer)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from retry_engine.config import parse_config
from retry_engine.core.outputs import route
from retry_engine.schemas import DLQ, OUTCOMES, QUARANTINE, RETRY
from tests.builders import T0, Result, delivered, work_rows

NOW = T0 + dt.timedelta(seconds=2)


def test_each_row_goes_to_its_tables_with_the_batch_id() -> None:
    config = parse_config({"engine": {"auto_create_groups": False}, "groups": {"G": {}}})
    work = work_rows(
        [Result.of("A").ok(), Result.of("F").failed(), Result.of("D").failed(delay_level_when_next_consume=-1),
         Result.of("Q").with_(status="WHAT"), Result.of("U", group="ghost").failed()],
        batch_ts=NOW,
        config=config,
    )
    rows = pa.concat_tables([work, delivered(work, late_ms=[3])])
    out = route(rows, 42)
    assert set(out) == {"retry", "dlq", "quarantine", "outcomes"}
    assert out["retry"].schema == RETRY.arrow_schema and out["retry"].num_rows == 1
    assert out["dlq"].schema == DLQ.arrow_schema and out["dlq"].column("origin_msg_id").to_pylist() == ["D"]
    assert out["quarantine"].schema == QUARANTINE.arrow_schema
    assert sorted(out["quarantine"].column("msg_id").to_pylist()) == ["Q", "U"]
    assert set(out["quarantine"].column("batch_id").to_pylist()) == {42}
    ledger = out["outcomes"]
    assert ledger.schema == OUTCOMES.arrow_schema
    # The ledger names the consumed message, not the retry or dead letter it produced.
    assert ledger.column("msg_id").to_pylist() == ["A", "F", "D", "Q", "U"]
    assert set(ledger.column("batch_id").to_pylist()) == {42}


def test_tables_without_rows_are_left_out() -> None:
    work = work_rows([Result.of().ok()], batch_ts=NOW)
    assert set(route(work, 0)) == {"outcomes"}


def test_a_table_every_row_belongs_to_takes_them_unfiltered_and_alike() -> None:
    """All outcomes (100% failures, nothing released): the ledger's rows are the work's, column for column,
    without a filter's copy; a null kind is in no table."""
    work = work_rows([Result.of(f"F{i}").failed() for i in range(4)], batch_ts=NOW)
    out = route(work, 5)
    assert set(out) == {"outcomes"}
    ledger = out["outcomes"]
    assert ledger.column("msg_id").to_pylist() == ["F0", "F1", "F2", "F3"]
    assert ledger.column("source_position").to_pylist() == work.column("source_position").to_pylist()
    # Shared, not copied: the ledger's column is the work's own buffer.
    assert ledger.column("source_position").chunk(0).buffers()[2].address == (
        work.column("source_position").chunk(0).buffers()[2].address)
    kinds = work.column("kind").to_pylist()
    odd = work.set_column(work.schema.get_field_index("kind"), "kind", pa.array([None, *kinds[1:]], pa.string()))
    assert route(odd, 5)["outcomes"].column("msg_id").to_pylist() == ["F1", "F2", "F3"]
