"""The progress recorder without a running query: Spark's event objects built from JSON."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.streaming.listener import (
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from retry_engine.errors import ConfigError
from retry_engine.ops.falling_behind import RECOVERED_AFTER
from retry_engine.ops.monitor import (
    ProgressRecorder,
    ensure_progress_table,
    lifecycle_row,
    parse_spark_time,
    progress_row,
)
from retry_engine.ops.status import query_state
from retry_engine.ops.terms import STARTED, TERMINATED, StopReason
from retry_engine.schemas import PROGRESS

QUERY = "11111111-1111-1111-1111-111111111111"
OTHER = "99999999-9999-9999-9999-999999999999"
RUN = "22222222-2222-2222-2222-222222222222"
NOW = dt.datetime(2026, 11, 22, 12, 0, 1, tzinfo=dt.UTC)


def progress_json(
    batch_id: int, *, query: str = QUERY, timestamp: str = "2026-11-22T12:00:00.250Z"
) -> dict[str, Any]:
    operator = {
        "operatorName": "applyInPandasWithState",
        "numRowsTotal": 3,
        "numRowsUpdated": 2,
        "allUpdatesTimeMs": 1,
        "numRowsRemoved": 1,
        "allRemovalsTimeMs": 0,
        "commitTimeMs": 5,
        "memoryUsedBytes": 1000,
        "numRowsDroppedByWatermark": 0,
        "numShufflePartitions": 2,
        "numStateStoreInstances": 2,
        "customMetrics": {},
    }
    return {
        "id": query,
        "runId": RUN,
        "name": "retry-engine",
        "timestamp": timestamp,
        "batchId": batch_id,
        "batchDuration": 812,
        "durationMs": {"addBatch": 700, "triggerExecution": 812},
        "eventTime": {},
        "stateOperators": [operator, {**operator, "numRowsTotal": 4, "memoryUsedBytes": 24}],
        "sources": [
            {
                "description": "deltars",
                "startOffset": None,
                "endOffset": '{"reservoirVersion":3}',
                "latestOffset": None,
                "numInputRows": 10,
                "inputRowsPerSecond": 5.0,
                "processedRowsPerSecond": 12.5,
                "metrics": {},
            }
        ],
        "sink": {"description": "ForeachBatchSink", "numOutputRows": -1, "metrics": {}},
        "numInputRows": 10,
        "inputRowsPerSecond": 5.0,
        "processedRowsPerSecond": 12.5,
        "observedMetrics": {},
    }


def started(query: str = QUERY) -> QueryStartedEvent:
    return QueryStartedEvent.fromJson(
        {
            "id": query,
            "runId": RUN,
            "name": "retry-engine",
            "timestamp": "2026-11-22T12:00:00.000Z",
            "jobTags": [],
        }
    )


def terminated(exception: str | None = None) -> QueryTerminatedEvent:
    return QueryTerminatedEvent.fromJson(
        {"id": QUERY, "runId": RUN, "exception": exception, "errorClassOnException": None}
    )


def test_progress_row_sums_state_operators() -> None:
    row = progress_row(
        QueryProgressEvent.fromJson({"progress": progress_json(4)}).progress, recorded_at=NOW
    )
    assert row["event_time"] == dt.datetime(2026, 11, 22, 12, 0, 0, 250_000, tzinfo=dt.UTC)
    assert (row["batch_id"], row["batch_duration_ms"], row["num_input_rows"]) == (4, 812, 10)
    assert row["duration_ms"] == {"addBatch": 700, "triggerExecution": 812}
    assert (row["state_rows_total"], row["state_rows_updated"], row["state_memory_bytes"]) == (
        7,
        4,
        1024,
    )
    assert row["source_end_offset"] == '{"reservoirVersion":3}'
    assert parse_spark_time("2026-11-22T12:00:00Z") == dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)


def test_recorder_writes_its_query_only_and_closes_on_terminated(tmp_path: Path) -> None:
    path = str(tmp_path / "progress")
    closed: list[ProgressRecorder] = []
    recorder = ProgressRecorder(
        path, query_id=QUERY, flush_interval_ms=60_000, on_close=closed.append
    )
    recorder.start()
    recorder.onQueryStarted(started())
    recorder.onQueryStarted(started(OTHER))
    for batch_id in range(3):
        recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(batch_id)}))
    recorder.onQueryProgress(
        QueryProgressEvent.fromJson({"progress": progress_json(9, query=OTHER)})
    )
    recorder.onQueryTerminated(terminated("boom"))
    recorder.close(timeout=30)
    assert recorder.closed and closed == [recorder] and recorder.unregistered
    rows = DeltaTable(path).to_pyarrow_table().sort_by("recorded_at").to_pylist()
    assert [(r["event"], r["batch_id"]) for r in rows] == [
        ("started", None),
        ("progress", 0),
        ("progress", 1),
        ("progress", 2),
        ("terminated", None),
    ]
    assert {r["query_id"] for r in rows} == {QUERY} and rows[-1]["exception"] == "boom"
    # Events after the end are ignored rather than written to a closed table.
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(3)}))
    assert recorder.flush() == 0


def test_a_bad_event_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    recorder = ProgressRecorder(
        str(tmp_path / "progress"), query_id=QUERY, flush_interval_ms=60_000
    )
    with caplog.at_level(logging.ERROR, logger="retry_engine.ops.monitor"):
        recorder.onQueryProgress(
            QueryProgressEvent.fromJson({"progress": progress_json(0, timestamp="yesterday")})
        )
    assert "could not record a progress event" in caplog.text and QUERY in caplog.text
    assert recorder.flush() == 0


def test_a_failed_write_keeps_the_rows_for_the_next_flush(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the table should be")
    recorder = ProgressRecorder(str(blocker / "progress"), query_id=QUERY, flush_interval_ms=60_000)
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(0)}))
    with caplog.at_level(logging.ERROR, logger="retry_engine.ops.monitor"):
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
    recorder = ProgressRecorder(
        str(tmp_path / "progress"), query_id=QUERY, flush_interval_ms=60_000
    )
    recorder.record_input_rows(3, 7)  # a batch Spark never reported: dropped, not reused
    recorder.record_input_rows(4, 40_000)
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(4)}))
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(5)}))
    rows = recorder._rows
    assert [(r["batch_id"], r["num_input_rows"]) for r in rows] == [(4, 40_000), (5, 10)]
    assert recorder._input_rows == {}


def test_falling_behind_is_logged_once_per_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """#13 part 6: one WARNING when batches start taking longer than the trigger, one INFO when they stop.

    Spark's executor would warn after each of the 4 late batches; other queries' batches do not count.
    """
    recorder = ProgressRecorder(
        str(tmp_path / "progress"),
        query_id=QUERY,
        flush_interval_ms=60_000,
        trigger_interval_ms=1000,
    )
    durations = [50, 4000, 3000, 1000, 3500, 2000] + [10] * (RECOVERED_AFTER + 5)
    with caplog.at_level(logging.INFO, logger="retry_engine.ops.monitor"):
        for batch_id, duration in enumerate(durations):
            recorder.onQueryProgress(
                QueryProgressEvent.fromJson(
                    {"progress": {**progress_json(batch_id), "batchDuration": duration}}
                )
            )
            recorder.onQueryProgress(
                QueryProgressEvent.fromJson(
                    {"progress": {**progress_json(batch_id, query=OTHER), "batchDuration": 9000}}
                )
            )
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == [logging.WARNING, logging.INFO], lines
    assert f"engine query {QUERY} is falling behind: batch 1 took 4000 ms" in lines[0][1]
    recovered_at = len(durations) - 5 - 1
    assert (
        f"caught up at batch {recovered_at}: 4 late batches since batch 1, the slowest took 4000 ms"
        in lines[1][1]
    )
    assert OTHER not in caplog.text


def test_finish_waits_for_sparks_terminated_event(tmp_path: Path) -> None:
    """#13 part 2: after a stop, finish() returns once Spark's terminated event is written (status: stopped)."""
    path = str(tmp_path / "progress")
    recorder = ProgressRecorder(path, query_id=QUERY, flush_interval_ms=60_000)
    recorder.start()
    recorder.onQueryStarted(started())
    recorder.onQueryTerminated(terminated())
    recorder.finish(run_id=RUN, timeout=30)
    assert recorder.closed
    rows = DeltaTable(path).to_pyarrow_table()
    assert rows["event"].to_pylist() == ["started", "terminated"]
    # Recorded at this clock's time (status leaves events far ahead of its now out).
    now = dt.datetime.now(dt.UTC)
    assert query_state(rows, now=now, trigger_interval_ms=1000, flush_interval_ms=1000)[0] == "stopped"


def test_finish_records_the_end_itself_when_spark_does_not(tmp_path: Path) -> None:
    """#13 part 2: a stop whose terminated event never arrives still leaves status reading stopped, not running."""
    path = str(tmp_path / "progress")
    recorder = ProgressRecorder(path, query_id=QUERY, flush_interval_ms=60_000)
    recorder.start()
    recorder.onQueryStarted(started())
    recorder.finish(run_id=RUN, timeout=0.2)
    recorder._thread.join(30)  # finish() waits 0.2 s for the writer too; its last append may take longer
    assert recorder.closed
    # A terminated event that arrives late is not recorded a second time.
    recorder.onQueryTerminated(terminated())
    assert recorder.flush() == 0
    rows = DeltaTable(path).to_pyarrow_table()
    assert rows["event"].to_pylist() == ["started", "terminated"]
    assert rows["run_id"].to_pylist() == [RUN, RUN] and rows["exception"].to_pylist() == [
        None,
        None,
    ]
    now = dt.datetime.now(dt.UTC)
    state, why, _, _ = query_state(rows, now=now, trigger_interval_ms=1000, flush_interval_ms=1000)
    assert state == "stopped", why


def test_a_terminated_event_arriving_as_finish_records_the_end_is_not_recorded_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's terminated event past the recorder's first check while finish() records the end itself: the
    event's row was appended after the close (two terminated rows, or one left unwritten)."""
    import threading

    from retry_engine.ops import monitor

    path = str(tmp_path / "progress")
    recorder = ProgressRecorder(path, query_id=QUERY, flush_interval_ms=60_000)
    recorder.start()
    recorder.onQueryStarted(started())
    entered = threading.Event()

    def late_row(*args: Any, **kwargs: Any) -> dict[str, Any]:
        if threading.current_thread() is listener:  # the event's row is made once finish() has closed
            entered.set()
            while not recorder._closing.is_set():
                threading.Event().wait(0.01)
        return lifecycle_row(*args, **kwargs)

    monkeypatch.setattr(monitor, "lifecycle_row", late_row)
    listener = threading.Thread(target=recorder.onQueryTerminated, args=(terminated(),))
    listener.start()
    assert entered.wait(30)
    recorder.finish(run_id=RUN, timeout=0.2)
    listener.join(30)
    recorder._thread.join(30)  # finish() waits 0.2 s for the writer too; its last append may take longer
    assert recorder.closed
    assert [r["event"] for r in recorded(path)] == ["started", "terminated"]
    assert recorder._rows == [] and path not in monitor._UNWRITTEN


def test_a_terminated_event_recorded_just_before_finish_gives_up_waiting_is_the_only_end(tmp_path: Path) -> None:
    """The other order: Spark's event is recorded, and finish() stops waiting for it before the event has
    marked the recorder closed. finish() recorded the end a second time."""
    import threading

    path = str(tmp_path / "progress")
    recorder = ProgressRecorder(path, query_id=QUERY, flush_interval_ms=60_000)
    recorder.start()
    recorder.onQueryStarted(started())
    recorded_event, gate = threading.Event(), threading.Event()

    class Held(threading.Event):
        def set(self) -> None:  # the event's row is appended; hold the listener before it says so
            if threading.current_thread() is listener:
                recorded_event.set()
                gate.wait(30)
            super().set()

    recorder._terminated = Held()
    listener = threading.Thread(target=recorder.onQueryTerminated, args=(terminated(),))
    listener.start()
    try:
        assert recorded_event.wait(30)
        recorder.finish(run_id=RUN, timeout=0.2)
    finally:
        gate.set()
        listener.join(30)
    recorder._thread.join(30)
    assert [r["event"] for r in recorded(path)] == ["started", "terminated"]
    assert recorder._rows == []


# -- why the query terminated (#13 part 2) ------------------------------------------


def recorded(path: str) -> list[dict[str, Any]]:
    return list(DeltaTable(path).to_pyarrow_table().sort_by("recorded_at").to_pylist())


@pytest.mark.parametrize(
    "told, exception, reason",
    [
        (None, None, "stopped"),  # stopped through the API (query.stop()) without a word
        ("stopped", None, "stopped"),
        ("finished", None, "finished"),
        ("lease_lost", None, "lease_lost"),
        ("finished", "boom", "failed"),  # an exception always means failed
        (None, "boom", "failed"),
    ],
)
def test_the_terminated_event_records_why_the_query_stopped(
    tmp_path: Path, told: StopReason | None, exception: str | None, reason: str
) -> None:
    path = str(tmp_path / "progress")
    recorder = ProgressRecorder(path, query_id=QUERY, flush_interval_ms=60_000)
    recorder.start()
    recorder.onQueryStarted(started())
    recorder.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress_json(0)}))
    if told is not None:
        recorder.stopping(told)
    recorder.onQueryTerminated(terminated(exception))
    recorder.finish(run_id=RUN, timeout=30)
    rows = recorded(path)
    assert [(r["event"], r["reason"]) for r in rows] == [
        ("started", None),
        ("progress", None),
        ("terminated", reason),
    ]


def test_finish_records_the_reason_it_was_told_when_spark_sends_no_terminated_event(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "progress")
    recorder = ProgressRecorder(path, query_id=QUERY, flush_interval_ms=60_000)
    recorder.start()
    recorder.stopping("finished")
    recorder.finish(run_id=RUN, timeout=0.2)
    recorder._thread.join(30)
    assert [(r["event"], r["reason"]) for r in recorded(path)] == [("terminated", "finished")]


def test_the_first_reason_wins_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    recorder = ProgressRecorder(
        str(tmp_path / "progress"), query_id=QUERY, flush_interval_ms=60_000
    )
    with pytest.raises(
        ConfigError,
        match=r"stop reason 'bored' is not one of stopped, finished, failed, lease_lost",
    ):
        recorder.stopping("bored")  # type: ignore[arg-type]
    recorder.stopping("lease_lost")  # the heartbeat, on losing the lake ...
    recorder.stopping("stopped")  # ... then the stop that follows
    assert recorder.stop_requested == "lease_lost"


def test_only_a_terminated_event_has_a_reason() -> None:
    with pytest.raises(ConfigError, match="a started event has no stop reason"):
        lifecycle_row(
            STARTED, query_id=QUERY, run_id=RUN, event_time=NOW, recorded_at=NOW, reason="stopped"
        )
    assert (
        lifecycle_row(TERMINATED, query_id=QUERY, run_id=RUN, event_time=NOW, recorded_at=NOW)[
            "reason"
        ]
        == "stopped"
    )


class StoppableQuery:
    """What engine.stop() uses of a StreamingQuery; stop() delivers Spark's terminated event."""

    id = QUERY
    runId = RUN  # noqa: N815 (Spark's name)
    isActive = False  # noqa: N815

    def __init__(self, recorder: ProgressRecorder) -> None:
        self.recorder = recorder

    def stop(self) -> None:
        self.recorder.onQueryTerminated(terminated())

    def exception(self) -> None:
        return None


@pytest.mark.parametrize(
    "before, reason, want",
    [
        (None, "finished", "finished"),
        (None, "stopped", "stopped"),
        ("lease_lost", "stopped", "lease_lost"),
    ],
)
def test_engine_stop_tells_the_recorder_why_before_it_stops_the_query(
    tmp_path: Path, before: StopReason | None, reason: StopReason, want: str
) -> None:
    """The code that stops the query says why first: run --once says finished, a signal stopped (engine.stop)."""
    from retry_engine.core import engine

    path = str(tmp_path / "progress")
    recorder = ProgressRecorder(path, query_id=QUERY, flush_interval_ms=60_000)
    recorder.start()
    if before is not None:
        recorder.stopping(before)  # the lease heartbeat stopped the query first
    engine._RECORDERS[QUERY] = recorder
    try:
        assert engine.stop(StoppableQuery(recorder), reason=reason) is None  # type: ignore[arg-type]
    finally:
        engine._RECORDERS.pop(QUERY, None)
    assert recorder.closed
    assert [(r["event"], r["reason"]) for r in recorded(path)] == [("terminated", want)]


def test_an_old_progress_table_gains_the_reason_column_and_the_engines_rows_are_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """#13 part 2, upgrade: a lake whose progress table predates `reason` (a real Delta table of the old
    schema); the engine's start adds the column, its terminated row with a reason is written, old rows
    read back with reason null."""
    path = str(tmp_path / "progress")
    old_schema = pa.schema([f for f in PROGRESS.arrow_schema if f.name != "reason"])
    old_rows = [
        {
            k: v
            for k, v in lifecycle_row(
                kind, query_id=QUERY, run_id="old-run", event_time=NOW, recorded_at=NOW
            ).items()
            if k != "reason"
        }
        for kind in (STARTED, TERMINATED)
    ]
    write_deltalake(path, pa.Table.from_pylist(old_rows, schema=old_schema))

    with caplog.at_level(logging.INFO, logger="retry_engine.delta.tables"):
        ensure_progress_table(path)  # what monitor.attach does at the engine's start
    assert "added column 'reason' (string, nullable)" in caplog.text
    recorder = ProgressRecorder(path, query_id=QUERY, flush_interval_ms=60_000)
    recorder.start()
    recorder.onQueryStarted(started())
    recorder.stopping("stopped")
    recorder.onQueryTerminated(terminated())
    recorder.finish(run_id=RUN, timeout=30)

    assert recorder.rows_written == 2 and recorder.rows_dropped == 0
    rows = recorded(path)
    assert [(r["run_id"], r["event"], r["reason"]) for r in rows] == [
        ("old-run", "started", None),
        ("old-run", "terminated", None),
        (RUN, "started", None),
        (RUN, "terminated", "stopped"),
    ]
