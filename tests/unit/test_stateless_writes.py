"""The decide step writing the rows that need no state itself (#15 goal 2; retry_engine.core.outputs.StatelessWrites).

No Spark here: the decide task's function as the engine hands it to Spark, on real Delta
tables (the engine test in tests/integration/test_outputs.py runs it in a stream).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from retry_engine.config import parse_config
from retry_engine.core import engine
from retry_engine.core.decide import BATCH_TS, NO_STATE_BUCKET, POSITION, Decider
from retry_engine.core.outputs import WRITTEN_ROUTE, BatchWriter
from retry_engine.core.packed import unpack
from retry_engine.core.schedule import StateKeySplit
from retry_engine.delta._arrow_ipc import from_ipc
from retry_engine.errors import ConfigError
from tests.builders import T0, Result, results_table
from tests.lakehouse import Lake

RESULTS = [Result.of("A1").ok(), Result.of("F1").failed(), Result.of("A2", group="H").ok(),
           Result.of("Q1").with_(status="WHAT"), Result.of("F2").failed(), Result.of("A3").ok()]


def _input(results: list[Result], start: int = 0) -> pa.RecordBatch:
    table = results_table(results)
    n = table.num_rows
    table = table.append_column(POSITION, pa.array([f"p{start + i:06d}" for i in range(n)])).append_column(
        BATCH_TS, pa.array([T0] * n, type=pa.timestamp("us", tz="UTC"))
    )
    return table.to_batches()[0]


def _decide(lake: Lake, batches: Iterator[pa.RecordBatch], *, min_rows: int) -> list[pa.RecordBatch]:
    plan = dataclasses.replace(BatchWriter(lake.config, "app-1").stateless_writes(), min_rows=min_rows)
    run = engine._decide_batches(Decider(lake.config), StateKeySplit(subkeys=1), stateless=plan)
    return list(run(batches))


def _parquet_rows(lake: Lake, table: str) -> list[dict[str, object]]:
    return [r for f in sorted(Path(lake.path(table)).rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]


@pytest.fixture(autouse=True)
def _in_batch_7(monkeypatch: pytest.MonkeyPatch) -> None:
    # A decide task learns its micro-batch from Spark's task context; here there is none.
    monkeypatch.setattr(engine, "current_batch_id", lambda: 7)


def test_a_task_with_enough_stateless_rows_writes_them_and_sends_on_only_failures_and_its_files(
    tmp_path: Path,
) -> None:
    lake = Lake.make(tmp_path)
    out = pa.Table.from_batches(_decide(lake, iter([_input(RESULTS[:3]), _input(RESULTS[3:], 3)]), min_rows=2))
    keys = list(zip(out.column("route").to_pylist(), out.column("bucket").to_pylist(), strict=True))
    assert keys.count((WRITTEN_ROUTE, NO_STATE_BUCKET)) == 1
    work = unpack([p for (r, _), p in zip(keys, out.column("payload").to_pylist(), strict=True) if r != WRITTEN_ROUTE])
    assert sorted(work.column("consumed_msg_id").to_pylist()) == ["F1", "F2"]  # only rows that need state
    (written,) = [p for (r, _), p in zip(keys, out.column("payload").to_pylist(), strict=True) if r == WRITTEN_ROUTE]
    results = from_ipc(written).to_pylist()
    files = [(r["table"], json.loads(r["payload"])) for r in results if r["kind"] == "file"]
    assert {t for t, _ in files} == {"outcomes", "quarantine"}
    # The files hold the stateless rows, with the batch id, and the counts count them.
    outcomes = _parquet_rows(lake, "outcomes")
    assert sorted((o["msg_id"], o["outcome"], o["batch_id"]) for o in outcomes) == [
        ("A1", "acknowledged", 7), ("A2", "acknowledged", 7), ("A3", "acknowledged", 7), ("Q1", "quarantined", 7)]
    assert [q["msg_id"] for q in _parquet_rows(lake, "quarantine")] == ["Q1"]
    assert sum(f["num_records"] for t, f in files if t == "outcomes") == 4
    (counts,) = [from_ipc(r["payload"]) for r in results if r["kind"] == "counts"]
    assert sum(counts.column("value").to_pylist()) == 4


def test_a_task_with_few_stateless_rows_sends_them_on_and_writes_nothing(tmp_path: Path) -> None:
    """A trickle of small input files adds no small files: below min_rows the rows go the old way."""
    lake = Lake.make(tmp_path)
    out = pa.Table.from_batches(_decide(lake, iter([_input(RESULTS)]), min_rows=100))
    assert WRITTEN_ROUTE not in out.column("route").to_pylist()
    assert sorted(unpack(out.column("payload").to_pylist()).column("consumed_msg_id").to_pylist()) == sorted(
        r.values["msg_id"] for r in RESULTS
    )
    assert _parquet_rows(lake, "outcomes") == [] and _parquet_rows(lake, "quarantine") == []


def test_a_task_that_fails_after_writing_leaves_no_file(tmp_path: Path) -> None:
    lake = Lake.make(tmp_path)

    def failing() -> Iterator[pa.RecordBatch]:
        yield _input(RESULTS)
        raise OSError("the input file went away")

    with pytest.raises(OSError, match="went away"):
        _decide(lake, failing(), min_rows=1)
    assert list(Path(lake.path("outcomes")).rglob("*.parquet")) == []


@pytest.mark.parametrize("value", [0, -1, True, "8192", 1.5, 2**31])
def test_direct_write_rows_refuses_hostile_values(value: object) -> None:
    with pytest.raises(ConfigError, match="direct_write_rows"):
        parse_config({"engine": {"direct_write_rows": value}})


def test_direct_write_rows_defaults_to_8192_and_reaches_the_decide_step(tmp_path: Path) -> None:
    assert parse_config({}).engine.direct_write_rows == 8192
    config = parse_config({"engine": {"lake": str(tmp_path), "direct_write_rows": 1}})
    assert BatchWriter(config, "app").stateless_writes().min_rows == 1


def test_a_batch_of_only_failures_passes_through_uncopied_and_one_of_only_acks_is_all_taken(tmp_path: Path) -> None:
    """The hot path at 100% failures: no filter (a copy of every column) when nothing is stateless."""
    from tests.builders import work_rows

    lake = Lake.make(tmp_path)
    plan = dataclasses.replace(BatchWriter(lake.config, "app-1").stateless_writes(), min_rows=100)
    task = plan.task(7)
    failures = work_rows([Result.of(f"F{i}").failed() for i in range(3)], batch_ts=T0).to_batches()[0]
    assert task.keep_stateful(failures) is failures and task.held == []
    acks = work_rows([Result.of(f"A{i}").ok() for i in range(3)], batch_ts=T0).to_batches()[0]
    rest = task.keep_stateful(acks)
    assert rest.num_rows == 0 and rest.schema == acks.schema and task.held_rows == 3
    (packed,) = task.finish()
    assert sorted(unpack(packed.column("payload").to_pylist()).column("consumed_msg_id").to_pylist()) == [
        "A0", "A1", "A2"]


@pytest.mark.parametrize("in_order", [True, False])
def test_a_mixed_batch_is_split_alike_whether_decided_in_order_or_grouped(tmp_path: Path, in_order: bool) -> None:
    """Grouped (acks first) the split is two slices; interleaved a filter; the same rows go each way."""
    lake = Lake.make(tmp_path)
    plan = dataclasses.replace(BatchWriter(lake.config, "app-1").stateless_writes(), min_rows=100)
    task = plan.task(7)
    results = [Result.of("A0").ok(), Result.of("F1").failed(), Result.of("A2").ok(), Result.of("F3").failed()]
    work = Decider(lake.config)(_input(results), in_order=in_order)
    rest = task.keep_stateful(work)
    assert rest.column("consumed_msg_id").to_pylist() == ["F1", "F3"]
    assert task.held_rows == 2
    assert sorted(pa.concat_tables(task.held).column("consumed_msg_id").to_pylist()) == ["A0", "A2"]
