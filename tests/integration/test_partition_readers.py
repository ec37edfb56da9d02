"""Every table the engine writes reads the same in every reader (#13 part 3).

ONE engine run serves every assertion: a lake whose retry and dlq tables were
written by main's engine (old folders, ``tests/fixtures/main_layout``) gets
new consume results for RocketMQ-style groups (``%``, ``|``) and a bad row;
the engine moves the old files into Hive folders when it starts and then
writes its own. Each table is then read by Spark (``format("deltars")`` and
plain ``spark.read.parquet`` with partition discovery), delta-rs, pandas,
Polars (``read_delta``, ``scan_delta``) and ``pyarrow.dataset`` with Hive
partitioning. The plain Parquet readers list the folder, not the log, so
the test first VACUUMs (retention 0), as anyone reading a Delta table as
plain Parquet must.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable

from retry_engine.core import engine
from retry_engine.delta import FORMAT_NAME
from tests.builders import Result
from tests.lakehouse import Lake, wait_for

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "main_layout"
OLD_GROUPS = {"order_group", "%RETRY%pay|eu"}
# New results: a group named like a retry topic is quarantined since 2026-11-30 (INVALID_GROUP_NAME), so
# the escapes of % and | are taken by another name; the old rows of "%RETRY%pay|eu" stay and move.
NEW_GROUPS = {"order_group", "pay%|eu", "pay-EU_2"}
ALL_GROUPS = OLD_GROUPS | NEW_GROUPS


@pytest.fixture(scope="module")
def engine_lake(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    root = tmp_path_factory.mktemp("partition_readers") / "lake"
    root.mkdir()
    for name in ("retry", "dlq"):
        shutil.copytree(FIXTURE / name, root / name)
    lake = Lake.make(root)
    results = [Result.of(f"new-retry-{g}", group=g).failed() for g in sorted(NEW_GROUPS)]
    results += [Result.of(f"new-dead-{g}", group=g).failed(delay_level_when_next_consume=-1) for g in sorted(NEW_GROUPS)]
    results += [Result.of("new-ok", group="order_group").ok(), Result.of("bad-group", group="no spaces allowed").failed()]
    lake.write_results(results)
    query = engine.start(spark, lake.config)
    try:
        wait_for(
            lambda: len(lake.rows("retry")) == 2 + len(NEW_GROUPS) and len(lake.rows("dlq")) == 2 + len(NEW_GROUPS),
            timeout=180,
            what="the new retries and dead letters",
        )
    finally:
        engine.stop(query)
    yield lake


def _canonical(rows: list[dict[str, Any]], columns: list[str]) -> list[tuple[Any, ...]]:
    """Rows as tuples of ``columns`` (pandas' NaN for a missing value counts as None)."""

    def clean(v: Any) -> Any:
        return None if isinstance(v, float) and math.isnan(v) else v

    return sorted((tuple(clean(r[c]) for c in columns) for r in rows), key=repr)


def _compared_columns(schema: pa.Schema) -> list[str]:
    """The string and integer columns: every reader gives them the same Python values."""
    return [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_integer(f.type)]


ENGINE_TABLES = ["retry", "dlq", "quarantine", "outcomes", "metrics", "progress"]


def test_the_engine_moved_main_tables_and_writes_hive_folders(engine_lake: Lake) -> None:
    """#13 part 3: folders are ``consumer_group=<value>`` with only Hive's escapes, old rows kept (B1)."""
    for name in ("retry", "dlq"):
        table = DeltaTable(engine_lake.path(name))
        live = {Path(uri).parent.name for uri in table.file_uris()}
        assert live == {"consumer_group=order_group", "consumer_group=%25RETRY%25pay|eu", "consumer_group=pay%25|eu",
                        "consumer_group=pay-EU_2"}
        ids = [r["msg_id"] for r in engine_lake.rows(name)]
        origin = [r["origin_msg_id"] for r in engine_lake.rows(name)]
        assert len(ids) == len(set(ids)) == 2 + len(NEW_GROUPS)
        assert sum(o.startswith("old-") for o in origin) == 2
        assert {r["consumer_group"] for r in engine_lake.rows(name) if r["origin_msg_id"].startswith("old-")} == OLD_GROUPS


@pytest.mark.parametrize("name", ENGINE_TABLES)
def test_every_reader_reads_the_same_rows_and_partition_values(spark: Any, engine_lake: Lake, name: str) -> None:
    """#13 part 3: Spark (deltars and parquet discovery), delta-rs, pandas, Polars, pyarrow agree.

    Expected rows are delta-rs's (the log's own view); each other reader must
    return exactly those, partition column included.
    """
    path = engine_lake.path(name)
    table = DeltaTable(path)
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    arrow = table.to_pyarrow_table()
    assert arrow.num_rows > 0, f"the engine wrote no {name} rows"
    columns = _compared_columns(arrow.schema)
    expected = _canonical(arrow.to_pylist(), columns)
    partition_columns = list(table.metadata().partition_columns)

    spark_schema = spark.read.format(FORMAT_NAME).load(path).schema
    readers = {
        "spark deltars": lambda: spark.read.format(FORMAT_NAME).load(path).toArrow().to_pylist(),
        "spark parquet": lambda: spark.read.schema(spark_schema).parquet(path).toArrow().to_pylist(),
        "pandas": lambda: table.to_pandas().to_dict("records"),
        "polars read_delta": lambda: pl.read_delta(path).to_dicts(),
        "polars scan_delta": lambda: pl.scan_delta(path).collect().to_dicts(),
        "pyarrow hive dataset": lambda: ds.dataset(path, format="parquet", partitioning="hive").to_table().to_pylist(),
    }
    for reader, read in readers.items():
        assert _canonical(read(), columns) == expected, f"{reader} reads {name} differently"
    if partition_columns == ["consumer_group"]:
        assert {r["consumer_group"] for r in arrow.to_pylist()} == ALL_GROUPS
        discovered = ds.dataset(path, format="parquet", partitioning="hive").to_table().column("consumer_group")
        assert set(discovered.to_pylist()) == ALL_GROUPS


def test_a_stream_of_a_moved_table_sees_each_row_once(spark: Any, tmp_path: Path) -> None:
    """#13 part 3 / SPEC B1, R14: a consumer streaming the retry table across the move gets no row twice.

    A ``deltars`` stream reads main's retry table, the table is moved into
    Hive folders (one commit with ``dataChange`` false), one new row is
    appended, and the same stream (same checkpoint) goes on: it must see the
    new row and nothing else.
    """
    from deltalake import write_deltalake

    from retry_engine.delta.layout import migrate_partition_folders

    path = tmp_path / "retry"
    shutil.copytree(FIXTURE / "retry", path)
    seen: list[str] = []

    def collect(batch: Any, batch_id: int) -> None:
        seen.extend(r["msg_id"] for r in batch.select("msg_id").collect())

    def drain() -> None:
        stream = spark.readStream.format(FORMAT_NAME).option("path", str(path)).load()
        query = stream.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ck"))
        started = query.trigger(availableNow=True).start()
        try:
            started.awaitTermination(180)
        finally:
            started.stop()

    drain()
    first = sorted(seen)
    assert len(first) == 2
    assert migrate_partition_folders(str(path)).files_moved == 2
    template = DeltaTable(str(path)).to_pyarrow_table().to_pylist()[0]
    schema = pa.schema(DeltaTable(str(path)).schema().to_arrow())
    write_deltalake(str(path), pa.Table.from_pylist([{**template, "msg_id": "after-move"}], schema=schema), mode="append")
    drain()
    assert sorted(seen) == sorted([*first, "after-move"])
