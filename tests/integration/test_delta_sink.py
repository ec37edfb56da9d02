"""The ``deltars`` sinks on real Spark and real Delta tables: exactly once, ordinary tables."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from retry_engine.delta import FORMAT_NAME, read_query_id, read_table, write_stream
from tests.streaming import running

AWKWARD = ["%RETRY%x|y", "a/b", "plain", None]


def rows(start: int, n: int) -> pa.Table:
    ids = range(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "grp": pa.array([AWKWARD[i % len(AWKWARD)] for i in ids]),
            "at": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=7 * i) for i in ids], pa.timestamp("us", tz="UTC")),
        }
    )


def make_source(path: Path, *, versions: int, per_version: int = 10) -> None:
    for v in range(versions):
        write_deltalake(str(path), rows(v * per_version, per_version), mode="append")


def sorted_rows(table: pa.Table) -> list[dict[str, object]]:
    return sorted(table.select(["id", "grp", "at"]).to_pylist(), key=lambda r: r["id"])  # type: ignore[arg-type,return-value]


def copy(spark: SparkSession, src: Path, dst: Path, ck: Path, **options: str) -> StreamingQuery:
    reader = spark.readStream.format(FORMAT_NAME).option("path", str(src))
    for key, value in options.items():
        reader = reader.option(key, value)
    return write_stream(reader.load(), str(dst), checkpoint=str(ck), partition_by=["grp"]).trigger(availableNow=True).start()


def data_files_on_disk(path: Path) -> int:
    return len(list(path.rglob("*.parquet")))


def test_stream_copies_partitioned_table_exactly_into_an_ordinary_delta_table(spark: SparkSession, lake: Path) -> None:
    src, dst, ck = lake / "src", lake / "dst", lake / "ck"
    make_source(src, versions=3)
    with running(copy(spark, src, dst, ck)) as q:
        q.awaitTermination(120)
    assert sorted_rows(read_table(str(dst))) == sorted_rows(read_table(str(src)))
    table = DeltaTable(str(dst))
    assert table.metadata().partition_columns == ["grp"]
    assert pa.schema(table.schema().to_arrow()).field("at").type == pa.timestamp("us", tz="UTC")
    # Hive folders (#13 part 3): only Hive's characters escaped ('%' as %25, '/' as %2F), so a
    # value's '/' never adds a folder level and a Hive reader decodes the folder to the value.
    relative = [str(p.relative_to(dst)) for p in dst.rglob("*.parquet")]
    assert len(relative) == len(table.file_uris()) and all(p.count("/") == 1 for p in relative)
    assert {p.split("/")[0] for p in relative} == {
        "grp=%25RETRY%25x|y", "grp=a%2Fb", "grp=plain", "grp=__HIVE_DEFAULT_PARTITION__"
    }
    # One transaction per micro-batch, keyed by the query id Spark keeps in the checkpoint.
    assert table.transaction_version(read_query_id(str(ck)) or "") == 0
    # Spark's batch reader sees the same rows.
    back = spark.read.format(FORMAT_NAME).option("path", str(dst)).load()
    assert sorted((r["id"], r["grp"]) for r in back.collect()) == [(r["id"], r["grp"]) for r in sorted_rows(read_table(str(src)))]
    # An empty micro-batch (a metadata-only source commit) commits nothing.
    version = table.version()
    DeltaTable(str(src)).alter.set_table_properties({"delta.logRetentionDuration": "interval 30 days"})
    with running(copy(spark, src, dst, ck)) as q:
        q.awaitTermination(120)
        assert len(q.recentProgress) >= 1
    assert DeltaTable(str(dst)).version() == version


def test_query_stopped_midway_and_restarted_neither_loses_nor_duplicates(spark: SparkSession, lake: Path) -> None:
    """B1: a query stopped with input still to come, restarted from its checkpoint, copies every row once.

    Deterministic (#16 item 3): the first run reads the 3 versions there are, one file per batch, and
    stops by itself (availableNow); 3 more versions land while it is down. Before, a live query was
    stopped once the copy reached version 2 and the partial count was only bounded (20..59 rows),
    which a slow stop on a loaded machine could break.
    """
    src, dst, ck = lake / "src", lake / "dst", lake / "ck"
    make_source(src, versions=3)
    with running(copy(spark, src, dst, ck, maxFilesPerTrigger="1")) as q:
        q.awaitTermination(120)
        assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [10, 10, 10]
    assert sorted_rows(read_table(str(dst))) == sorted_rows(read_table(str(src)))
    for v in range(3, 6):
        write_deltalake(str(src), rows(v * 10, 10), mode="append")
    with running(copy(spark, src, dst, ck, maxFilesPerTrigger="1")) as q:
        q.awaitTermination(120)
        assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [10, 10, 10]
    assert sorted_rows(read_table(str(dst))) == sorted_rows(read_table(str(src)))
    assert read_table(str(dst)).num_rows == 60


def test_batch_committed_to_delta_but_not_to_the_checkpoint_is_not_written_twice(spark: SparkSession, lake: Path) -> None:
    src, dst, ck = lake / "src", lake / "dst", lake / "ck"
    make_source(src, versions=2)
    with running(copy(spark, src, dst, ck, maxFilesPerTrigger="1")) as q:
        q.awaitTermination(120)
    query_id = read_query_id(str(ck)) or ""
    version, files = DeltaTable(str(dst)).version(), data_files_on_disk(dst)
    assert DeltaTable(str(dst)).transaction_version(query_id) == 1
    for lost in (["commits"], ["commits", "offsets"]):
        # The Delta commit of batch 1 happened; the checkpoint's record of it did not.
        for folder in lost:
            (ck / folder / "1").unlink()
            (ck / folder / ".1.crc").unlink(missing_ok=True)
        with running(copy(spark, src, dst, ck, maxFilesPerTrigger="1")) as q:
            q.awaitTermination(120)
            assert [p["batchId"] for p in q.recentProgress] == [1]  # batch 1 did run again
        assert read_table(str(dst)).num_rows == 20
        assert DeltaTable(str(dst)).version() == version
        assert DeltaTable(str(dst)).transaction_version(query_id) == 1
        assert data_files_on_disk(dst) == files  # the replay's files were removed
    assert sorted_rows(read_table(str(dst))) == sorted_rows(read_table(str(src)))


def test_batch_write_is_idempotent_with_txn_options(spark: SparkSession, lake: Path) -> None:
    dst = str(lake / "t")
    df = spark.createDataFrame([(1, "a"), (2, "b/c")], "id long, grp string")

    def write(frame: DataFrame, version: int, mode: str = "append") -> None:
        (
            frame.write.format(FORMAT_NAME).mode(mode).option("path", dst).option("partitionBy", "grp")
            .option("txnAppId", "job").option("txnVersion", str(version)).save()
        )

    write(df, 7)
    write(df, 7)  # a replay: skipped
    write(df, 3)  # an older one: skipped too
    assert sorted(read_table(dst).column("id").to_pylist()) == [1, 2]
    assert DeltaTable(dst).transaction_version("job") == 7
    write(df, 8)
    assert sorted(read_table(dst).column("id").to_pylist()) == [1, 1, 2, 2]
    write(spark.createDataFrame([(9, None)], "id long, grp string"), 9, mode="overwrite")
    assert read_table(dst).to_pylist() == [{"id": 9, "grp": None}]
    assert DeltaTable(dst).metadata().partition_columns == ["grp"]
    df.write.format(FORMAT_NAME).mode("append").save(dst)  # no txn options: plain append
    assert read_table(dst).num_rows == 3


def test_schema_mismatch_names_the_column_and_both_types(spark: SparkSession, lake: Path) -> None:
    dst = str(lake / "t")
    spark.createDataFrame([(1, "a")], "id long, grp string").write.format(FORMAT_NAME).mode("append").save(dst)

    def append(frame: DataFrame) -> None:
        frame.write.format(FORMAT_NAME).mode("append").option("path", dst).save()

    with pytest.raises(Exception, match=r"SCHEMA_MISMATCH|COLUMN_TYPE_MISMATCH") as info:
        append(spark.createDataFrame([(1, 2)], "id long, grp int"))
    assert "column 'grp' is string in the table but int32 in the data" in str(info.value)
    with pytest.raises(Exception, match=r"COLUMN_NOT_IN_TABLE.*'extra'"):
        append(spark.createDataFrame([(1, "a", True)], "id long, grp string, extra boolean"))
    with pytest.raises(Exception, match=r"COLUMN_MISSING_IN_DATA.*'grp'"):
        append(spark.createDataFrame([(1,)], "id long"))
    with pytest.raises(Exception, match=r"PARTITION_COLUMNS_MISMATCH"):
        spark.createDataFrame([(1, "a")], "id long, grp string").write.format(FORMAT_NAME).mode("append").option(
            "partitionBy", "grp"
        ).save(dst)
    # A stricter DataFrame (NOT NULL where the table allows nulls) is fine.
    append(spark.range(3).selectExpr("id", "'x' as grp"))
    assert read_table(dst).num_rows == 4
