"""The deltars stream reader's initial offset is fixed once computed (no rows skipped at start-up)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import ReadAllAvailable
from pyspark.sql.types import StringType, StructField, StructType

from retry_engine.delta import append_arrow, ensure_table
from retry_engine.delta.source import DeltaStreamReader, SourceOptions
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import Result, results_table


def test_initial_offset_does_not_move_when_the_table_grows(tmp_path: Path) -> None:
    path = str(tmp_path / "in")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)
    append_arrow(path, results_table([Result.of()]))
    reader = DeltaStreamReader(SourceOptions.parse({"path": path}), CONSUME_RESULTS.spark_schema)
    first = reader.initialOffset()
    end = reader.latestOffset(first, ReadAllAvailable())
    # Spark asks for the initial offset again when it plans the first batch; a commit landed meanwhile.
    append_arrow(path, results_table([Result.of()]))
    again = reader.initialOffset()
    assert again == first
    files = reader.partitions(again, end)
    assert len(files) == 1
    rows = sum(b.num_rows for f in files for b in reader.read(f))
    assert rows == 1


def _read_ids(reader: DeltaStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[tuple[str, str]]:
    """(msg_id, position) of every row of the range, in stream order."""
    out = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            out += list(zip(batch.column("msg_id").to_pylist(), batch.column("_pos").to_pylist(), strict=True))
    return out


@pytest.mark.parametrize(
    ("start", "first", "rest"),
    [
        ({}, ["OLD", "NEW0"], ["NEW1", "NEW2"]),
        # Consumer(consume_from="latest") reads with startingVersion=latest (#12 item 7).
        ({"startingVersion": "latest"}, ["NEW0", "NEW1"], ["NEW2", "LATE"]),
        # Before every commit: from the first commit on (#12 item 9).
        ({"startingTimestamp": "1970-01-01"}, ["OLD", "NEW0"], ["NEW1", "NEW2"]),
    ],
)
def test_b1_first_batch_replayed_after_a_restart_reads_the_same_rows_and_positions(
    tmp_path: Path, start: dict[str, str], first: list[str], rest: list[str]
) -> None:
    """R12/B1: the driver dies after logging batch 0's end, before committing it; producers go on writing.

    Spark logs only the end of batch 0 and asks a new reader for its initial
    offset, which now lies past (snapshot) or inside (``latest``) the batch.
    """
    path = str(tmp_path / "in")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)
    append_arrow(path, results_table([Result.of("OLD")]))
    options = {"path": path, "maxFilesPerTrigger": "2", "sourcePositionColumn": "_pos", **start}
    schema = StructType([*CONSUME_RESULTS.spark_schema.fields, StructField("_pos", StringType(), False)])
    reader = DeltaStreamReader(SourceOptions.parse(options), schema)
    initial = reader.initialOffset()
    for i in range(3):
        append_arrow(path, results_table([Result.of(f"NEW{i}")]))
    end = reader.latestOffset(initial, reader.getDefaultReadLimit())
    planned = _read_ids(reader, initial, end)
    assert [m for m, _ in planned] == first

    append_arrow(path, results_table([Result.of("LATE")]))
    restarted = DeltaStreamReader(SourceOptions.parse(options), schema)
    logged_end = json.loads(json.dumps(end))  # as read back from the offset log
    assert _read_ids(restarted, restarted.initialOffset(), logged_end) == planned
    # The next batch starts where the logged one ended.
    following = restarted.latestOffset(logged_end, restarted.getDefaultReadLimit())
    assert [m for m, _ in _read_ids(restarted, logged_end, following)] == rest
