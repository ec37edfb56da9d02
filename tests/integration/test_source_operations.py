"""#12 item 9: operating on consume_results (DELETE, overwrite, VACUUM) with the engine's ``[source]`` keys.

Runs the engine's own consume-result stream (``engine._read_results``, the
deltars reader with ``packedColumn``) on real Spark over a real Delta table.
Meanings are Delta's streaming source options (startingVersion,
startingTimestamp, skipChangeCommits, ignoreDeletes). A commit the stream
cannot follow must fail with an error naming those options and what they do,
and setting one must let the same checkpoint go on: the stream is never
stuck for good.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from retry_engine.config import parse_config
from retry_engine.core import engine
from retry_engine.delta import append_arrow, ensure_table
from retry_engine.delta._arrow_ipc import from_ipc
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import Result, results_table
from tests.streaming import running


def _read(spark: SparkSession, lake: Path, checkpoint: str, **source: Any) -> list[str]:
    """msg ids the engine's consume-result stream reads with ``[source]`` = ``source`` (Trigger.AvailableNow)."""
    config = parse_config({"engine": {"lake": str(lake)}, "source": source})
    seen: list[str] = []

    def collect(frame: DataFrame, batch_id: int) -> None:
        for row in frame.collect():
            seen.extend(from_ipc(bytes(row[engine.PACKED_INPUT])).column("msg_id").to_pylist())

    query = (
        engine._read_results(spark, config)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(lake / "_checkpoints" / checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with running(query):
        query.awaitTermination(180)
    return sorted(seen)


def _append(path: str, *ids: str) -> None:
    append_arrow(path, results_table([Result.of(i) for i in ids]))


def test_delete_overwrite_and_vacuum_fail_clearly_and_the_source_keys_let_the_stream_go_on(
    spark: SparkSession, lake: Path
) -> None:
    path = str(lake / "consume_results")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)  # 0
    _append(path, "A1", "A2")  # 1
    _append(path, "A3")  # 2
    assert _read(spark, lake, "main") == ["A1", "A2", "A3"]

    DeltaTable(path).delete("msg_id = 'A1'")  # 3: removes commit 1's file, adds A2 again
    _append(path, "B1")  # 4
    with pytest.raises(Exception, match="DELTA_SOURCE_REMOVE_IN_COMMIT") as caught:
        _read(spark, lake, "main")
    message = str(caught.value)
    for named in ("commit 3 ", "skip_change_commits = true", "ignore_deletes = true",
                  "starting_version", "starting_timestamp", "skips every commit that removes data"):
        assert named in message, named
    # Same checkpoint, the key set: the rewrite (and its copy of A2) is skipped, B1 is read.
    assert _read(spark, lake, "main", skip_change_commits=True) == ["B1"]

    DeltaTable(path).delete()  # 5: removes every file, adds none
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    _append(path, "C1")  # 6
    with pytest.raises(Exception, match=r"DELTA_SOURCE_REMOVE_IN_COMMIT.*commit 5 "):  # past commit 3 for good
        _read(spark, lake, "main")
    assert _read(spark, lake, "main", ignore_deletes=True) == ["C1"]

    # A new checkpoint asked to start before the vacuum needs files that are gone.
    with pytest.raises(Exception, match="DELTA_FILE_MISSING") as caught:
        _read(spark, lake, "from_zero", starting_version=0, skip_change_commits=True)
    assert "starting_version" in str(caught.value) and "VACUUM" in str(caught.value)
    assert _read(spark, lake, "from_six", starting_version=6) == ["C1"]

    # startingTimestamp: commit times are the log files' modification times (no in-commit timestamps).
    for version in range(7):
        stamp = 1000 * (version + 1)
        os.utime(Path(path) / "_delta_log" / f"{version:020d}.json", (stamp, stamp))
    assert _read(spark, lake, "at_time", starting_timestamp="1970-01-01T01:56:40Z") == ["C1"]  # 7000 s: commit 6
