"""The ``deltars`` source on real Spark and real Delta tables (written with delta-rs)."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from retry_engine.delta import FORMAT_NAME
from tests.streaming import running


def rows(start: int, n: int) -> pa.Table:
    """``n`` rows with ids ``start..``, a UTC timestamp and a day to partition by."""
    ids = range(start, start + n)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{i}" for i in ids]),
            "at": pa.array([dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i) for i in ids], pa.timestamp("us", tz="UTC")),
            "day": pa.array([dt.date(2024, 1, 1 + i % 2) for i in ids], pa.date32()),
        }
    )


def make_table(path: Path, *, versions: int, per_version: int = 10, partition_by: list[str] | None = None) -> None:
    for v in range(versions):
        write_deltalake(str(path), rows(v * per_version, per_version), mode="append", partition_by=partition_by)


def stream(spark: SparkSession, path: Path, **options: str) -> DataFrame:
    reader = spark.readStream.format(FORMAT_NAME).option("path", str(path))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def ids_of(spark: SparkSession, name: str) -> list[int]:
    return sorted(r["id"] for r in spark.table(name).select("id").collect())


def input_rows(query: StreamingQuery) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_schema_types_and_batch_read_at_version(spark: SparkSession, lake: Path) -> None:
    src = lake / "src"
    make_table(src, versions=3, partition_by=["day"])
    df = spark.read.format(FORMAT_NAME).option("path", str(src)).option("sourcePositionColumn", "_pos").load()
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in df.schema.fields] == [
        ("id", "bigint", True),
        ("name", "string", True),
        ("at", "timestamp", True),
        ("day", "date", True),
        ("_pos", "string", False),
    ]
    got = sorted((r["id"], r["name"], r["at"], r["day"]) for r in df.collect())
    want = sorted(tuple(r.values()) for r in rows(0, 30).to_pylist())
    assert [(i, n, a.replace(tzinfo=None), d) for i, n, a, d in want] == [
        (i, n, a.replace(tzinfo=None), d) for i, n, a, d in got
    ]  # the session time zone is UTC
    positions = [r["_pos"] for r in df.select("_pos").collect()]
    assert len(set(positions)) == 30 and all(p.startswith("s00000000000000000002/") for p in positions)
    old = spark.read.format(FORMAT_NAME).option("path", str(src)).option("versionAsOf", "0").load()
    assert sorted(r["id"] for r in old.collect()) == list(range(10))
    user = spark.read.format(FORMAT_NAME).schema("id long, day date").option("path", str(src)).load()
    assert user.filter("day = date'2024-01-02'").count() == 15


def test_a_snapshot_without_data_files_reads_as_no_rows(spark: SparkSession, lake: Path) -> None:
    """A created but empty table (and a version before its first append): Spark plans a placeholder
    partition for a reader with no partitions; the batch reader yields nothing instead of failing."""
    src = lake / "empty"
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    DeltaTable.create(str(src), schema=schema)
    df = spark.read.format(FORMAT_NAME).option("path", str(src)).load()
    assert df.count() == 0 and df.columns == ["id", "name"]
    write_deltalake(str(src), pa.table({"id": [1], "name": ["a"]}, schema=schema), mode="append")
    assert spark.read.format(FORMAT_NAME).option("path", str(src)).option("versionAsOf", "0").load().count() == 0
    assert spark.read.format(FORMAT_NAME).option("path", str(src)).load().count() == 1


def test_missing_path_and_not_a_table_fail_clearly(spark: SparkSession, lake: Path) -> None:
    with pytest.raises(Exception, match="PATH_MISSING"):
        spark.read.format(FORMAT_NAME).load()
    with pytest.raises(Exception, match="NOT_A_DELTA_TABLE"):
        spark.readStream.format(FORMAT_NAME).option("path", str(lake / "nothing")).load()


def test_unsupported_protocol_fails_clearly(spark: SparkSession, lake: Path) -> None:
    path = str(lake / "dv")
    DeltaTable.create(path, rows(0, 1).schema, configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(Exception, match="DELTA_UNSUPPORTED_FEATURE.*deletionVectors"):
        spark.read.format(FORMAT_NAME).option("path", path).load()


def test_max_files_per_trigger_and_restart_from_checkpoint(spark: SparkSession, lake: Path) -> None:
    src, ck = lake / "src", lake / "ck"
    make_table(src, versions=3)
    batches: dict[int, list[tuple[int, str]]] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        batches[batch_id] = [(r["id"], r["_pos"]) for r in df.collect()]

    def start() -> StreamingQuery:
        return (
            stream(spark, src, maxFilesPerTrigger="1", sourcePositionColumn="_pos")
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )

    with running(start()) as q:
        q.awaitTermination(120)
        assert input_rows(q) == [10, 10, 10]
    for v in range(2):
        write_deltalake(str(src), rows(30 + 10 * v, 10), mode="append")
    with running(start()) as q:
        q.awaitTermination(120)
        assert input_rows(q) == [10, 10]
    every = [row for batch_id in sorted(batches) for row in batches[batch_id]]
    assert sorted(i for i, _ in every) == list(range(50))  # nothing lost, nothing twice
    assert len({p for _, p in every}) == 50
    # Positions sort in stream order: snapshot files, then commits 3 and 4.
    assert [p[:21] for p in sorted(p for _, p in every)][::10] == ["s00000000000000000002"] * 3 + [
        "v00000000000000000003",
        "v00000000000000000004",
    ]


def test_trigger_available_now_stops_at_the_version_latest_at_start(spark: SparkSession, lake: Path) -> None:
    src = lake / "src"
    make_table(src, versions=2)

    def append_during_first_batch(df: DataFrame, batch_id: int) -> None:
        if batch_id == 0:
            write_deltalake(str(src), rows(100, 10), mode="append")

    seen: list[int] = []

    def run(fn: Callable[[DataFrame, int], None]) -> StreamingQuery:
        def wrapped(df: DataFrame, batch_id: int) -> None:
            seen.extend(r["id"] for r in df.select("id").collect())
            fn(df, batch_id)

        return (
            stream(spark, src, maxFilesPerTrigger="1")
            .writeStream.foreachBatch(wrapped)
            .option("checkpointLocation", str(lake / "ck"))
            .trigger(availableNow=True)
            .start()
        )

    with running(run(append_during_first_batch)) as q:
        assert q.awaitTermination(120)
    assert sorted(seen) == list(range(20))
    with running(run(lambda df, batch_id: None)) as q:
        assert q.awaitTermination(120)
    assert sorted(seen) == [*range(20), *range(100, 110)]


def test_concurrent_appends_are_not_lost(spark: SparkSession, lake: Path) -> None:
    src = lake / "src"
    make_table(src, versions=1)
    query = (
        stream(spark, src, maxFilesPerTrigger="2")
        .writeStream.format("memory")
        .queryName("concurrent")
        .trigger(processingTime="0 seconds")
        .start()
    )

    def append() -> None:
        for v in range(1, 9):
            write_deltalake(str(src), rows(v * 10, 10), mode="append")

    writer = threading.Thread(target=append)
    with running(query):
        writer.start()
        writer.join()
        query.processAllAvailable()
    assert ids_of(spark, "concurrent") == list(range(90))


def test_remove_commit_fails_stream_unless_skipped_or_ignored(spark: SparkSession, lake: Path) -> None:
    src = lake / "src"
    make_table(src, versions=2)  # versions 0, 1
    DeltaTable(str(src)).delete("id < 3")  # version 2: rewrites a file (remove + add)
    write_deltalake(str(src), rows(20, 5), mode="append")  # version 3

    def run(name: str, **options: str) -> Any:
        return (
            stream(spark, src, **{"startingVersion": "0", **options})
            .writeStream.format("memory")
            .queryName(name)
            .trigger(availableNow=True)
            .start()
        )

    with running(run("fails")) as q, pytest.raises(Exception, match=r"DELTA_SOURCE_REMOVE_IN_COMMIT.*commit 2 "):
        q.awaitTermination(120)
    with running(run("skipped", skipChangeCommits="true")) as q:
        q.awaitTermination(120)
    assert ids_of(spark, "skipped") == list(range(25))  # commits 0, 1, 3 as they were appended
    # ignoreDeletes ignores commits that only delete (whole files), not rewrites.
    DeltaTable(str(src)).delete()  # version 4: removes every file, adds none
    write_deltalake(str(src), rows(30, 5), mode="append")  # version 5
    with running(run("ignored", startingVersion="4", ignoreDeletes="true")) as q:
        q.awaitTermination(120)
    assert ids_of(spark, "ignored") == list(range(30, 35))


def test_starting_version_latest_reads_only_new_commits(spark: SparkSession, lake: Path) -> None:
    src = lake / "src"
    make_table(src, versions=2)
    query = stream(spark, src, startingVersion="latest").writeStream.format("memory").queryName("latest").start()
    with running(query):
        query.processAllAvailable()
        write_deltalake(str(src), rows(50, 3), mode="append")
        query.processAllAvailable()
    assert ids_of(spark, "latest") == [50, 51, 52]


def test_packed_column_carries_the_same_rows_as_arrow_batches(spark: SparkSession, lake: Path) -> None:
    """``packedColumn``: one Spark row per Arrow batch read; unpacked, the rows and positions of a plain read."""
    from retry_engine.delta._arrow_ipc import from_ipc

    src = lake / "src"
    make_table(src, versions=3, partition_by=["day"])
    plain = spark.read.format(FORMAT_NAME).option("path", str(src)).option("sourcePositionColumn", "_pos").load()
    packed = (
        spark.read.format(FORMAT_NAME).option("path", str(src)).option("sourcePositionColumn", "_pos")
        .option("packedColumn", "_rows").load()
    )
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in packed.schema.fields] == [("_rows", "binary", False)]
    payloads = [r["_rows"] for r in packed.collect()]
    assert 1 <= len(payloads) < 30  # batches, not rows
    unpacked = pa.concat_tables([from_ipc(bytes(p)) for p in payloads])
    assert unpacked.schema.names == ["id", "name", "at", "day", "_pos"]
    assert unpacked.schema.field("at").type == pa.timestamp("us", tz="UTC")
    got = sorted(zip(unpacked.column("id").to_pylist(), unpacked.column("_pos").to_pylist(), strict=True))
    assert got == sorted((r["id"], r["_pos"]) for r in plain.select("id", "_pos").collect())


def test_read_partitions_reads_every_row_once_in_fewer_tasks(spark: SparkSession, lake: Path) -> None:
    """#15 goal 1: a batch of five files read by two tasks (readPartitions=2), on real Spark; the same
    rows and positions as one task per file."""
    src = lake / "src"
    make_table(src, versions=5)
    seen: dict[str, tuple[int, list[tuple[int, str]]]] = {}

    def collect(name: str) -> Callable[[DataFrame, int], None]:
        def run(df: DataFrame, batch_id: int) -> None:
            seen[name] = (df.rdd.getNumPartitions(), sorted((r["id"], r["_pos"]) for r in df.collect()))

        return run

    for name, options in (("grouped", {"readPartitions": "2"}), ("per file", {})):
        query = (
            stream(spark, src, sourcePositionColumn="_pos", **options)
            .writeStream.foreachBatch(collect(name))
            .option("checkpointLocation", str(lake / f"ck-{name}"))
            .trigger(availableNow=True)
            .start()
        )
        with running(query) as q:
            q.awaitTermination(120)
    assert seen["grouped"][0] == 2 and seen["per file"][0] == 5
    assert seen["grouped"][1] == seen["per file"][1] and [i for i, _ in seen["grouped"][1]] == list(range(50))


def test_storage_credentials_in_the_options_are_redacted_in_plans(spark: SparkSession, lake: Path) -> None:
    """A review (session 20): Spark redacts options whose keys name a secret, token or password only, so a
    plan (``explain()``, an analysis error) showed an Azure account key, a GCS service account key and the
    AWS key id given as storage options of the deltars source and sink in clear."""
    path = str(lake / "redacted")
    write_deltalake(path, pa.table({"a": [1]}))
    frame = (
        spark.readStream.format(FORMAT_NAME).option("path", path)
        .option("storage.azure_storage_account_key", "SEKRET-AZ").option("storage.aws_access_key_id", "AKIDSEKRET")
        .option("storage.google_service_account_key", "SEKRET-GCS").option("storage.aws_region", "eu-west-1").load()
    )
    plan = frame._jdf.queryExecution().toString()
    assert "SEKRET" not in plan and "eu-west-1" in plan  # a setting that is no secret stays readable


def test_a_partition_filter_reads_only_the_files_of_the_wanted_values(spark: SparkSession, lake: Path) -> None:
    """A consumer of one of 1,000 groups read every group's retries to deliver its own (a review, session 20):
    ``partitionFilter`` plans only the files of the wanted partition values, in a snapshot and in later
    commits, and a restart goes on after what the stream passed (nothing read twice)."""
    src, ck = lake / "parts", lake / "ck-parts"

    def parted(start: int, n: int) -> pa.Table:
        ids = range(start, start + n)
        return pa.table({"id": pa.array(ids, pa.int64()), "grp": ["odd" if i % 2 else "even" for i in ids]})

    for v in range(2):
        write_deltalake(str(src), parted(v * 10, 10), mode="append", partition_by=["grp"])
    seen: list[int] = []

    def start() -> StreamingQuery:
        return (
            stream(spark, src, partitionFilter='{"grp": ["odd"]}')
            .writeStream.foreachBatch(lambda df, _: seen.extend(r["id"] for r in df.collect()))
            .option("checkpointLocation", str(ck))
            .trigger(availableNow=True)
            .start()
        )

    with running(start()) as q:
        q.awaitTermination(120)
    write_deltalake(str(src), parted(20, 10), mode="append", partition_by=["grp"])
    with running(start()) as q:
        q.awaitTermination(120)
        assert sum(input_rows(q)) == 5  # the new commit's odd rows only
    assert sorted(seen) == [i for i in range(30) if i % 2 == 1]
    batch = spark.read.format(FORMAT_NAME).option("path", str(src)).option("partitionFilter", '{"grp": ["even"]}').load()
    assert sorted(r["id"] for r in batch.collect()) == [i for i in range(30) if i % 2 == 0]
    with pytest.raises(Exception, match="INVALID_OPTION.*partitionFilter"):
        stream(spark, src, partitionFilter='["grp"]').writeStream.format("noop").start().awaitTermination(30)
    # A date's value is written differently by different writers (and re-rendered from a snapshot): only text
    # columns are filtered (a review found files of one value kept or dropped by how they were listed).
    dated = lake / "dated"
    make_table(dated, versions=1, partition_by=["day"])
    with pytest.raises(Exception, match="INVALID_OPTION.*partitionFilter names 'day', a date column"):
        spark.read.format(FORMAT_NAME).option("path", str(dated)).option("partitionFilter", '{"day": ["2024-01-01"]}').load().collect()
