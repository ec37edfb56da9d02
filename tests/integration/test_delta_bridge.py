"""The deltars source and sinks on real Spark and real Delta tables."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from retry_engine.delta import read_table, write_stream
from retry_engine.errors import SchemaMismatchError


def _rows(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "grp": pa.array([f"g{i % 3}" if i % 5 else "%RETRY%x|y" for i in range(start, start + n)])})


def _ids(path: Path) -> list[int]:
    return sorted(read_table(str(path)).column("id").to_pylist())


def _copy_stream(spark: Any, src: Path, dst: Path, ckpt: Path, **opts: str) -> Any:
    reader = spark.readStream.format("deltars").option("path", str(src))
    for k, v in opts.items():
        reader = reader.option(k, v)
    return (write_stream(reader.load(), str(dst), checkpoint=str(ckpt), partition_by=["grp"])
            .trigger(availableNow=True).start())


def test_stream_copies_table_exactly_and_output_is_readable(spark: Any, lake: Path) -> None:
    src, dst = lake / "src", lake / "dst"
    for i in range(3):
        write_deltalake(str(src), _rows(i * 100, 100), mode="append")
    q = _copy_stream(spark, src, dst, lake / "ck")
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    assert _ids(dst) == list(range(300))
    batch = spark.read.format("deltars").option("path", str(dst)).load()
    assert batch.count() == 300
    assert {r["grp"] for r in batch.select("grp").distinct().collect()} == {"g1", "g2", "g0", "%RETRY%x|y"}
    # The partition value with '%' and '|' stays a value, never a path piece.
    files = DeltaTable(str(dst)).file_uris()
    assert not any("%" in f.split(str(dst))[-1] or "|" in f for f in files)


def test_restart_from_checkpoint_neither_loses_nor_duplicates(spark: Any, lake: Path) -> None:
    src, dst, ck = lake / "src", lake / "dst", lake / "ck"
    for i in range(4):
        write_deltalake(str(src), _rows(i * 10, 10), mode="append")
    q = _copy_stream(spark, src, dst, ck, maxFilesPerTrigger="1")
    try:
        q.awaitTermination(120)
        assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [10, 10, 10, 10]
    finally:
        q.stop()
    for i in range(4, 6):
        write_deltalake(str(src), _rows(i * 10, 10), mode="append")
    q = _copy_stream(spark, src, dst, ck, maxFilesPerTrigger="1")
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    assert _ids(dst) == list(range(60))


def test_batch_committed_but_not_checkpointed_is_not_written_twice(spark: Any, lake: Path) -> None:
    src, dst, ck = lake / "src", lake / "dst", lake / "ck"
    write_deltalake(str(src), _rows(0, 10), mode="append")
    write_deltalake(str(src), _rows(10, 10), mode="append")
    q = _copy_stream(spark, src, dst, ck)
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    version_before = DeltaTable(str(dst)).version()
    commits = sorted((ck / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()  # the Delta commit happened, the checkpoint commit did not
    (ck / "commits" / f".{last.name}.crc").unlink(missing_ok=True)
    q = _copy_stream(spark, src, dst, ck)
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    assert _ids(dst) == list(range(20))
    assert DeltaTable(str(dst)).version() == version_before


def test_concurrent_appends_are_not_lost(spark: Any, lake: Path) -> None:
    src, dst = lake / "src", lake / "dst"
    write_deltalake(str(src), _rows(0, 10), mode="append")
    q = (write_stream(spark.readStream.format("deltars").option("path", str(src)).load(), str(dst),
                      checkpoint=str(lake / "ck")).trigger(processingTime="100 milliseconds").start())

    def append() -> None:
        for i in range(1, 8):
            write_deltalake(str(src), _rows(i * 10, 10), mode="append")

    writer = threading.Thread(target=append)
    try:
        writer.start()
        writer.join()
        q.processAllAvailable()
    finally:
        q.stop()
    assert _ids(dst) == list(range(80))


def test_remove_commit_fails_stream_unless_skipped(spark: Any, lake: Path) -> None:
    src = lake / "src"
    write_deltalake(str(src), _rows(0, 10), mode="append")
    DeltaTable(str(src)).delete("id < 3")
    write_deltalake(str(src), _rows(10, 5), mode="append")
    q = (spark.readStream.format("deltars").option("path", str(src)).option("startingVersion", "0").load()
         .writeStream.format("memory").queryName("removes").trigger(availableNow=True).start())
    with pytest.raises(Exception, match="DELTA_SOURCE_REMOVE_IN_COMMIT"):
        try:
            q.awaitTermination(120)
        finally:
            q.stop()
    q = (spark.readStream.format("deltars").option("path", str(src)).option("startingVersion", "0")
         .option("skipChangeCommits", "true").load()
         .writeStream.format("memory").queryName("skipped").trigger(availableNow=True).start())
    try:
        q.awaitTermination(120)
    finally:
        q.stop()
    assert sorted(r["id"] for r in spark.table("skipped").collect()) == list(range(15))


def test_idempotent_batch_write_and_schema_mismatch(spark: Any, lake: Path) -> None:
    dst = str(lake / "t")
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id long, grp string")
    for _ in range(2):
        df.write.format("deltars").mode("append").option("path", dst).option("txnAppId", "app").option("txnVersion", "7").save()
    assert _ids(lake / "t") == [1, 2]
    assert DeltaTable(dst).transaction_version("app") == 7
    bad = spark.createDataFrame([(1, 2)], "id long, grp int")
    with pytest.raises(Exception, match="column 'grp' is string in the table but int32"):
        bad.write.format("deltars").mode("append").option("path", dst).save()
    with pytest.raises(SchemaMismatchError):
        from retry_engine.delta import ensure_table
        ensure_table(dst, pa.schema([("id", pa.int64())]))
