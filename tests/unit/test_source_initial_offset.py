"""The deltars stream reader's initial offset is fixed once computed (no rows skipped at start-up)."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql.datasource import ReadAllAvailable

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
