"""#12 item 16: the ``deltars`` source never reads a data file outside the table, on real Spark.

Each test hand-writes a commit JSON into ``_delta_log`` (what a broken or
hostile writer can do) and reads through the real stream and batch readers.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from retry_engine.delta import FORMAT_NAME
from tests.streaming import running


def _table(path: Path, ids: range) -> str:
    """A one-file table of ``ids``; returns its data file's name."""
    write_deltalake(str(path), pa.table({"id": pa.array(ids, pa.int64())}), mode="append")
    return next(name for name in os.listdir(path) if name.endswith(".parquet"))


def _hand_written_add(table: Path, version: int, log_path: str, size: int) -> None:
    add = {"add": {"path": log_path, "partitionValues": {}, "size": size, "modificationTime": 1, "dataChange": True}}
    (table / "_delta_log" / f"{version:020d}.json").write_text(json.dumps(add) + "\n")


def test_stream_refuses_an_add_that_climbs_into_another_tenants_table(spark: SparkSession, lake: Path) -> None:
    """SPEC bad-input rule / #12 item 16: ``%2e%2e/tenant_b/...`` fails the query with the path and table named.

    The other tenant's rows (ids >= 100) are never read, and the error names
    the code, the path and the table.
    """
    mine, theirs = lake / "tenant_a", lake / "tenant_b"
    _table(mine, range(10))
    secret = _table(theirs, range(100, 105))
    _hand_written_add(mine, 1, f"%2e%2e/tenant_b/{secret}", (theirs / secret).stat().st_size)
    query = (
        spark.readStream.format(FORMAT_NAME).option("path", str(mine)).option("startingVersion", "0").load()
        .writeStream.format("memory").queryName("tenant_a_stream").trigger(availableNow=True).start()
    )
    with running(query), pytest.raises(Exception, match=r"DELTA_PATH_OUTSIDE_TABLE") as caught:
        query.awaitTermination(120)
    assert f"%2e%2e/tenant_b/{secret}" in str(caught.value) and str(mine) in str(caught.value)
    assert all(r["id"] < 100 for r in spark.table("tenant_a_stream").collect())


@pytest.mark.parametrize("escape", ["../tenant_b/{secret}", "file://{theirs}/{secret}", "{theirs}/{secret}", "file:///etc/passwd"])
def test_batch_read_refuses_snapshot_files_outside_the_table(spark: SparkSession, lake: Path, escape: str) -> None:
    """#12 item 16: relative climbs, absolute paths and ``file:`` URIs elsewhere are refused in snapshots too."""
    mine, theirs = lake / "tenant_a", lake / "tenant_b"
    _table(mine, range(10))
    secret = _table(theirs, range(100, 105))
    _hand_written_add(mine, 1, escape.format(theirs=theirs, secret=secret), (theirs / secret).stat().st_size)
    with pytest.raises(Exception, match="DELTA_PATH_OUTSIDE_TABLE"):
        spark.read.format(FORMAT_NAME).option("path", str(mine)).load().collect()


def test_absolute_uris_inside_the_table_root_are_read(spark: SparkSession, lake: Path) -> None:
    """Delta shallow clones write absolute URIs: one that points inside the root is a file of the table."""
    mine = lake / "tenant_a"
    first = _table(mine, range(10))
    (mine / "copied").mkdir()
    shutil.copy(mine / first, mine / "copied" / first)
    _hand_written_add(mine, 1, f"file://{mine}/copied/{first}", (mine / first).stat().st_size)
    query = (
        spark.readStream.format(FORMAT_NAME).option("path", str(mine)).option("startingVersion", "0").load()
        .writeStream.format("memory").queryName("tenant_a_absolute").trigger(availableNow=True).start()
    )
    with running(query):
        query.awaitTermination(120)
    assert sorted(r["id"] for r in spark.table("tenant_a_absolute").collect()) == sorted([*range(10), *range(10)])
