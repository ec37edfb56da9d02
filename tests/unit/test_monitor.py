"""The progress recorder without a running query: Spark's event objects built from JSON."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql.streaming.listener import (
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from retry_engine.monitor import ProgressRecorder, parse_spark_time, progress_row

QUERY = "11111111-1111-1111-1111-111111111111"
OTHER = "99999999-9999-9999-9999-999999999999"
RUN = "22222222-2222-2222-2222-222222222222"
NOW = dt.datetime(2026, 11, 22, 12, 0, 1, tzinfo=dt.UTC)


def progress_json(batch_id: int, *, query: str = QUERY, timestamp: str = "2026-11-22T12:00:00.250Z") -> dict[str, Any]:
    operator = {
        "operatorName": "applyInPandasWithState", "numRowsTotal": 3, "numRowsUpdated": 2,
        "allUpdatesTimeMs": 1, "numRowsRemoved": 1, "allRemovalsTimeMs": 0, "commitTimeMs": 5,
        "memoryUsedBytes": 1000, "numRowsDroppedByWatermark": 0, "numShufflePartitions": 2,
        "numStateStoreInstances": 2, "customMetrics": {},
    }
    return {
        "id": query, "runId": RUN, "name": "retry-engine", "timestamp": timestamp,
        "batchId": batch_id, "batchDuration": 812,
        "durationMs": {"addBatch": 700, "triggerExecution": 812}, "eventTime": {},
        "stateOperators": [operator, {**operator, "numRowsTotal": 4, "memoryUsedBytes": 24}],
        "sources": [{
            "description": "deltars", "startOffset": None, "endOffset": '{"reservoirVersion":3}',
            "latestOffset": None, "numInputRows": 10, "inputRowsPerSecond": 5.0,
            "processedRowsPerSecond": 12.5, "metrics": {},
        }],
        "sink": {"description": "ForeachBatchSink", "numOutputRows": -1, "metrics": {}},
        "numInputRows": 10, "inputRowsPerSecond": 5.0, "processedRowsPerSecond": 12.5,
        "observedMetrics": {},
    }


def started(query: str = QUERY) -> QueryStartedEvent:
    return QueryStartedEvent.fromJson(
        {"id": query, "runId": RUN, "name": "retry-engine", "timestamp": "2026-11-22T12:00:00.000Z", "jobTags": []}
    )


def terminated(exception: str | None = None) -> QueryTerminatedEvent:
    return QueryTerminatedEvent.fromJson(
        {"id": QUERY, "runId": RUN, "exception": exception, "errorClassOnException": None}
    )


def test_progress_row_sums_state_operators() -> None:
    row = progress_row(QueryProgressEvent.fromJson({"progress": progress_json(4)}).progress, recorded_at=NOW)
    assert row["event_time"] == dt.datetime(2026, 11, 22, 12, 0, 0, 250_000, tzinfo=dt.UTC)
    assert (row["batch_id"], row["batch_duration_ms"], row["num_input_rows"]) == (4, 812, 10)
    assert row["duration_ms"] == {"addBatch": 700, "triggerExecution": 812}
    assert (row["state_rows_total"], row["state_rows_updated"], row["state_memory_bytes"]) == (7, 4, 1024)
    assert row["source_end_offset"] == '{"reservoirVersion":3}'
    assert parse_spark_time("2026-11-22T12:00:00Z") == dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)


def test_recorder_writes_its_query_only_and_closes_on_terminated(tmp_path: Path) -> None:
    path = str(tmp_path / "progress")
    closed: list[ProgressRecorder] = []
    recorder = ProgressRecorder(path, query_id=QUERY, flush_interval_ms=60_000, on_close=closed.append)
    recorder.start()
    recorder.onQueryStarted(started())
    recorder.onQueryStarted(started(OTHER))
    for batch_id in range(3):
        recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(batch_id)}))
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(9, query=OTHER)}))
    recorder.onQueryTerminated(terminated("boom"))
    recorder.close(timeout=30)
    assert recorder.closed and closed == [recorder] and recorder.unregistered
    rows = DeltaTable(path).to_pyarrow_table().sort_by("recorded_at").to_pylist()
    assert [(r["event"], r["batch_id"]) for r in rows] == [
        ("started", None), ("progress", 0), ("progress", 1), ("progress", 2), ("terminated", None)
    ]
    assert {r["query_id"] for r in rows} == {QUERY} and rows[-1]["exception"] == "boom"
    # Events after the end are ignored rather than written to a closed table.
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(3)}))
    assert recorder.flush() == 0


def test_a_bad_event_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recorder = ProgressRecorder(str(tmp_path / "progress"), query_id=QUERY, flush_interval_ms=60_000)
    with caplog.at_level(logging.ERROR, logger="retry_engine.monitor"):
        recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(0, timestamp="yesterday")}))
    assert "could not record a progress event" in caplog.text and QUERY in caplog.text
    assert recorder.flush() == 0


def test_a_failed_write_keeps_the_rows_for_the_next_flush(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the table should be")
    recorder = ProgressRecorder(str(blocker / "progress"), query_id=QUERY, flush_interval_ms=60_000)
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(0)}))
    with caplog.at_level(logging.ERROR, logger="retry_engine.monitor"):
        assert recorder.flush() == 0
    assert "could not append 1 rows" in caplog.text
    recorder.path = str(tmp_path / "progress")
    assert recorder.flush() == 1
    assert DeltaTable(recorder.path).to_pyarrow_table()["batch_id"].to_pylist() == [0]


def test_progress_row_takes_the_engines_input_count_and_scales_the_rates_with_it() -> None:
    """The deltars source packs rows, so Spark's numInputRows (10 here) counts Arrow batches."""
    progress = QueryProgressEvent.fromJson({"progress": progress_json(4)}).progress
    row = progress_row(progress, recorded_at=NOW, input_rows=40_000)
    assert row["num_input_rows"] == 40_000
    assert (row["input_rows_per_second"], row["processed_rows_per_second"]) == (20_000.0, 50_000.0)


def test_recorder_uses_the_count_recorded_for_its_batch(tmp_path: Path) -> None:
    recorder = ProgressRecorder(str(tmp_path / "progress"), query_id=QUERY, flush_interval_ms=60_000)
    recorder.record_input_rows(3, 7)  # a batch Spark never reported: dropped, not reused
    recorder.record_input_rows(4, 40_000)
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(4)}))
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(5)}))
    rows = recorder._rows
    assert [(r["batch_id"], r["num_input_rows"]) for r in rows] == [(4, 40_000), (5, 10)]
    assert recorder._input_rows == {}
