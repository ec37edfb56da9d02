"""Recording the engine query's progress into the PROGRESS Delta table (B7).

A :class:`ProgressRecorder` is a ``StreamingQueryListener`` registered on the
session before the engine query starts. Spark calls it on the driver's
listener bus (``onQueryStarted`` synchronously inside ``start()``); every
callback only turns the event into one PROGRESS row and appends it to an
in-memory buffer. A daemon thread appends the buffer to the table every
``flush_interval`` (one small Delta commit) and once more when the query
terminates, then unregisters the listener. Nothing here can slow or fail the
query: callbacks never do I/O, and every error is logged, never raised.

Replayed batch: after a restart, Spark re-runs the last uncommitted batch id
under a new run id and reports a new progress event for it; the recorder
appends it as its own row, so the table holds one row per execution of a
batch (keyed by ``run_id`` + ``batch_id``) and readers take the latest.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
    StreamingQueryProgress,
)

from retry_engine.config import EngineConfig
from retry_engine.core.delays import parse_duration_ms
from retry_engine.core.startup import Startup
from retry_engine.delta import append_arrow, ensure_table
from retry_engine.delta.session import set_jvm_log_level
from retry_engine.delta.storage import BATCH_TABLE_PROPERTIES, scrubbed
from retry_engine.errors import ConfigError
from retry_engine.ops.falling_behind import FallingBehind
from retry_engine.ops.terms import (
    FAILED,
    IDLE,
    PROGRESS_EVENT,
    STARTED,
    STOP_REASONS,
    STOPPED,
    TERMINATED,
    StopReason,
)
from retry_engine.schemas import PROGRESS

log = logging.getLogger(__name__)

# Rows kept when the table cannot be written; beyond this the oldest are dropped (and logged).
MAX_BUFFERED_ROWS = 10_000

# Rows a closed recorder could not write (the store failed until the end: an outage is what fails
# the query that `retry-engine run` then restarts), by progress table: the next recorder on the
# same table in this process writes them first, so the failed run's events (its terminated event
# with the exception) reach the table once the store is back.
_UNWRITTEN: dict[str, list[dict[str, Any]]] = {}
_UNWRITTEN_LOCK = threading.Lock()


def parse_spark_time(value: str) -> dt.datetime:
    """Spark's event timestamps (``2026-11-22T12:00:00.123Z``) as aware UTC datetimes."""
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(dt.UTC)


def _sum(values: list[Any]) -> int | None:
    present = [int(v) for v in values if v is not None]
    return sum(present) if present else None


def progress_row(
    progress: StreamingQueryProgress, *, recorded_at: dt.datetime, input_rows: int | None = None
) -> dict[str, Any]:
    """The PROGRESS row of one progress event (pure: no I/O).

    ``input_rows`` is the batch's count of consume results when the engine
    knows it: Spark's ``numInputRows`` counts the rows the source handed
    over, which the deltars source packs (one per Arrow batch). The two
    rates are scaled by the same factor, as Spark derives both from that count.
    """
    operators = progress.stateOperators
    sources = progress.sources
    spark_rows = int(progress.numInputRows)
    rows = spark_rows if input_rows is None else input_rows
    scale = rows / spark_rows if spark_rows else 1.0
    return {
        "query_id": str(progress.id),
        "run_id": str(progress.runId),
        "query_name": progress.name,
        "event": PROGRESS_EVENT,
        "batch_id": int(progress.batchId),
        "event_time": parse_spark_time(progress.timestamp),
        "recorded_at": recorded_at,
        "batch_duration_ms": int(progress.batchDuration),
        "duration_ms": {str(k): int(v) for k, v in progress.durationMs.items()},
        "num_input_rows": rows,
        "input_rows_per_second": float(progress.inputRowsPerSecond) * scale,
        "processed_rows_per_second": float(progress.processedRowsPerSecond) * scale,
        "state_rows_total": _sum([op.numRowsTotal for op in operators]),
        "state_rows_updated": _sum([op.numRowsUpdated for op in operators]),
        "state_rows_removed": _sum([op.numRowsRemoved for op in operators]),
        "state_memory_bytes": _sum([op.memoryUsedBytes for op in operators]),
        "source_end_offset": sources[0].endOffset if sources else None,
    }


def lifecycle_row(
    event: str,
    *,
    query_id: str,
    run_id: str,
    event_time: dt.datetime,
    recorded_at: dt.datetime,
    query_name: str | None = None,
    exception: str | None = None,
    error_class: str | None = None,
    reason: StopReason | None = None,
) -> dict[str, Any]:
    """The PROGRESS row of a started, idle or terminated event (pure: no I/O).

    A terminated event's ``reason`` is :func:`stop_reason` of ``reason`` and
    ``exception``; the other events have none.
    """
    if reason is not None and event != TERMINATED:
        raise ConfigError(
            f"a {event} event has no stop reason (got {reason!r}); only {TERMINATED} events do",
            code="INVALID_OPTION",
        )
    row: dict[str, Any] = dict.fromkeys(PROGRESS.names)
    row.update(
        query_id=query_id,
        run_id=run_id,
        query_name=query_name,
        event=event,
        event_time=event_time,
        recorded_at=recorded_at,
        # Spark's text of the failure, traceback and causes: a store's answer in it may echo a credential.
        exception=scrubbed(exception) if exception is not None else None,
        error_class_on_exception=error_class,
        reason=stop_reason(reason, exception) if event == TERMINATED else None,
    )
    return row


def stop_reason(requested: StopReason | None, exception: str | None) -> StopReason:
    """Why a query terminated: failed if it has an exception, else what its stopper said, else stopped.

    A query stopped without a word from the engine was stopped on request
    (``query.stop()`` through the API).
    """
    if exception is not None:
        return FAILED
    return STOPPED if requested is None else requested


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def progress_from_json(jprogress: Any) -> StreamingQueryProgress:
    """One progress event's ``StreamingQueryProgress`` from Spark's JSON of it: three py4j calls, not hundreds.

    PySpark's own conversion (``fromJObject``) reads every field and walks every
    Java map through py4j, and each walk ends in a Java exception that PySpark
    converts with about ten more calls: 50-80 ms of driver CPU per micro-batch
    on 2 cores, beside the next batch's planning (#15). Spark's JSON rounds the
    rates to one decimal place (as its UI shows them) and leaves out those that
    are NaN (Spark's value for "no time elapsed"), which read as NaN here as
    there; sources' offsets keep Spark's own strings.
    """
    j = json.loads(jprogress.json())
    j.setdefault("name", None)
    j.setdefault("numInputRows", 0)
    for rates in (j, *j.get("sources", [])):
        rates.setdefault("inputRowsPerSecond", math.nan)
        rates.setdefault("processedRowsPerSecond", math.nan)
    j.setdefault("stateOperators", [])
    j.setdefault("sink", {"description": "", "numOutputRows": -1, "metrics": {}})
    sources = j.setdefault("sources", [])
    for source, jsource in zip(sources, jprogress.sources() if sources else [], strict=True):
        source.setdefault("numInputRows", 0)
        for key in ("startOffset", "endOffset", "latestOffset"):
            value = getattr(jsource, key)()
            source[key] = None if value is None else str(value)
    j.pop("observedMetrics", None)  # Row objects in PySpark's form; the engine reads none
    return StreamingQueryProgress.fromJson(j)


class _JsonProgress(JStreamingQueryListener):
    """PySpark's bridge for a listener, with progress events read by :func:`progress_from_json`."""

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802 (Spark's name)
        try:
            event = QueryProgressEvent(progress_from_json(jevent.progress()))
        except Exception as exc:  # JSON of a shape this code does not know: PySpark's own reading
            log.debug("progress event read by PySpark's fromJObject (from JSON: %s: %s)", type(exc).__name__, exc)
            event = QueryProgressEvent.fromJObject(jevent)
        self.pylistener.onQueryProgress(event)


class JsonProgressListener(StreamingQueryListener):
    """A listener whose progress events are read by :func:`progress_from_json` (its ``_bridge``)."""

    _bridge: type[JStreamingQueryListener] = _JsonProgress

    @property
    def _jlistener(self) -> Any:
        # PySpark's StreamingQueryListener builds its Java side here (pyspark is pinned); this one
        # differs only in the Python bridge that reads the events.
        from pyspark import SparkContext

        if not hasattr(self, "_jlistenerobj"):
            jvm: Any = SparkContext._jvm
            self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(self._bridge(self))
        return self._jlistenerobj


class ProgressRecorder(JsonProgressListener):
    """Listener that records one query's events into the PROGRESS table.

    Events of other queries on the same session are ignored. See the module
    docstring for threading, failure handling and replayed batches.
    """

    def __init__(
        self,
        path: str,
        *,
        query_id: str,
        flush_interval_ms: int,
        on_close: Callable[[ProgressRecorder], None] | None = None,
        trigger_interval_ms: int | None = None,
        startup: Startup | None = None,
    ) -> None:
        self.path = path
        # Logs where start-up time went once the query's first batch commits.
        self._startup = startup
        # With the query's trigger interval, late batches are logged once per episode.
        self._behind = None if trigger_interval_ms is None else FallingBehind(trigger_interval_ms)
        self.query_id = query_id
        self.flush_interval_ms = flush_interval_ms
        self._on_close = on_close
        with _UNWRITTEN_LOCK:
            self._rows: list[dict[str, Any]] = _UNWRITTEN.pop(path, [])
        self._input_rows: dict[int, int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._terminated = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"progress-recorder-{query_id[:8]}", daemon=True
        )
        self.rows_written = 0
        self.rows_dropped = 0
        self.unregistered = False
        self._stop_reason: StopReason | None = None

    # -- listener callbacks: cheap, never raise -----------------------------------
    def onQueryStarted(self, event: QueryStartedEvent) -> None:  # noqa: N802 (Spark's name)
        self._guard(
            "started",
            lambda: self._add_if_ours(
                str(event.id),
                lambda: lifecycle_row(
                    STARTED,
                    query_id=str(event.id),
                    run_id=str(event.runId),
                    query_name=event.name,
                    event_time=parse_spark_time(event.timestamp),
                    recorded_at=_now(),
                ),
            ),
        )

    def onQueryProgress(self, event: QueryProgressEvent) -> None:  # noqa: N802
        progress = event.progress
        rows: list[int | None] = []

        def row() -> dict[str, Any]:
            rows.append(self._take_input_rows(int(progress.batchId)))
            return progress_row(progress, recorded_at=_now(), input_rows=rows[0])

        self._guard("progress", lambda: self._add_if_ours(str(progress.id), row))
        if self._startup is not None and rows:
            self._guard("progress", lambda: self._report_startup(progress, rows[0]))
        if self._behind is not None and str(progress.id) == self.query_id:
            self._guard(
                "progress",
                lambda: self._report_lateness(int(progress.batchId), int(progress.batchDuration)),
            )

    def _report_startup(self, progress: StreamingQueryProgress, input_rows: int | None) -> None:
        assert self._startup is not None
        durations = {str(k): int(v) for k, v in progress.durationMs.items()}
        line = self._startup.first_batch(durations, input_rows)
        if line is not None:
            log.info("%s", line)

    def _report_lateness(self, batch_id: int, duration_ms: int) -> None:
        assert self._behind is not None
        change = self._behind.observe(batch_id, duration_ms)
        if change is not None:
            message = self._behind.message(
                change, query_id=self.query_id, batch_id=batch_id, duration_ms=duration_ms
            )
            log.log(logging.WARNING if change == "started" else logging.INFO, "%s", message)

    def record_input_rows(self, batch_id: int, rows: int) -> None:
        """The writer's count of the consume results of ``batch_id`` (before Spark reports the batch).

        A replayed batch records its count again; the latest is used.
        """
        with self._lock:
            self._input_rows[batch_id] = rows

    def _take_input_rows(self, batch_id: int) -> int | None:
        with self._lock:
            rows = self._input_rows.pop(batch_id, None)
            # Counts of batches Spark never reported (stopped mid-batch) are not kept forever.
            for stale in [b for b in self._input_rows if b < batch_id]:
                del self._input_rows[stale]
        return rows

    def onQueryIdle(self, event: QueryIdleEvent) -> None:  # noqa: N802
        self._guard(
            "idle",
            lambda: self._add_if_ours(
                str(event.id),
                lambda: lifecycle_row(
                    IDLE,
                    query_id=str(event.id),
                    run_id=str(event.runId),
                    event_time=parse_spark_time(event.timestamp),
                    recorded_at=_now(),
                ),
            ),
        )

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:  # noqa: N802
        def record() -> None:
            now = _now()
            added = self._add_if_ours(
                str(event.id),
                lambda: lifecycle_row(
                    TERMINATED,
                    query_id=str(event.id),
                    run_id=str(event.runId),
                    event_time=now,
                    recorded_at=now,
                    exception=event.exception,
                    error_class=event.errorClassOnException,
                    reason=self.stop_requested,
                ),
                closes=True,
            )
            if added:
                self._terminated.set()
                self._wake.set()

        self._guard("terminated", record)

    def stopping(self, reason: StopReason) -> None:
        """Say why the query is about to be stopped; call before ``query.stop()``.

        The terminated event records it (or ``failed`` if the query died with an
        exception). The first reason given wins: when another engine takes the
        lake over, the heartbeat says ``lease_lost`` and the stop that follows
        does not change it.
        """
        if reason not in STOP_REASONS:
            raise ConfigError(
                f"stop reason {reason!r} is not one of {', '.join(STOP_REASONS)}",
                code="INVALID_OPTION",
            )
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason

    @property
    def stop_requested(self) -> StopReason | None:
        """The reason given to :meth:`stopping`, if any."""
        with self._lock:
            return self._stop_reason

    # -- buffer and writer thread -----------------------------------------------
    def start(self) -> None:
        """Start the writer thread (call once, before the query starts)."""
        self._thread.start()

    def close(self, *, timeout: float = 30.0) -> None:
        """Write what is buffered and stop the writer thread (idempotent)."""
        self._closing.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def finish(self, *, run_id: str, exception: str | None = None, timeout: float = 30.0) -> None:
        """After the query was stopped: wait until its terminated event is written, then close.

        Spark delivers the terminated event asynchronously (listener bus); if it
        has not arrived within ``timeout`` seconds the row is made here from
        ``run_id``, ``exception`` and the reason given to :meth:`stopping`, so a
        stopped engine is never left looking
        ``running`` to ``retry-engine status``. Returns when the writer thread has
        ended (none of its delta-rs calls outlives the caller).
        """
        if not self._terminated.wait(timeout):
            log.warning(
                "progress recorder %s: no terminated event from Spark within %.0f s; recording it directly",
                self.query_id,
                timeout,
            )
            now = _now()
            row = lifecycle_row(
                TERMINATED,
                query_id=self.query_id,
                run_id=run_id,
                event_time=now,
                recorded_at=now,
                exception=exception,
                reason=self.stop_requested,
            )
            with self._lock:
                # Spark's event may have been recorded since the wait gave up (it closes under this lock).
                if not self._closing.is_set():
                    # Closing first: a terminated event arriving late is then not recorded twice.
                    self._closing.set()
                    self._rows.append(row)
            self._terminated.set()
        self.close(timeout=timeout)

    @property
    def closed(self) -> bool:
        return self._closing.is_set() and not self._thread.is_alive()

    def _guard(self, what: str, action: Callable[[], object]) -> None:
        try:
            action()
        except Exception:
            # A listener must never break the query it watches: log and go on.
            log.exception("progress recorder %s: could not record a %s event", self.query_id, what)

    def _add_if_ours(
        self, event_query_id: str, make_row: Callable[[], dict[str, Any]], *, closes: bool = False
    ) -> bool:
        """Buffer ``make_row()`` if the event is this query's and the recorder is open; ``closes``: the
        row is the query's end (the terminated event), and the recorder closes with it.

        Checked and closed under the lock :meth:`finish` records its own end under, so exactly one
        terminated row is written, whichever of the two comes first.
        """
        if event_query_id != self.query_id or self._closing.is_set():
            return False
        row = make_row()
        with self._lock:
            if self._closing.is_set():
                return False
            self._rows.append(row)
            if closes:
                self._closing.set()
        return True

    def flush(self) -> int:
        """Append the buffered rows to the table; return how many were written.

        On a write error the rows stay buffered for the next flush (at most
        :data:`MAX_BUFFERED_ROWS`, oldest dropped first) and the error is logged.
        """
        with self._lock:
            rows, self._rows = self._rows, []
        if not rows:
            return 0
        try:
            append_arrow(self.path, pa.Table.from_pylist(rows, schema=PROGRESS.arrow_schema))
        except Exception as exc:
            # The store failing (a StorageError says it in one line) is a warning; anything else an error
            # with its traceback.
            storage = isinstance(exc, OSError)
            log.log(
                logging.WARNING if storage else logging.ERROR,
                "progress recorder %s: could not append %d rows to %s (batch ids %s..%s); will retry%s",
                self.query_id,
                len(rows),
                self.path,
                rows[0].get("batch_id"),
                rows[-1].get("batch_id"),
                f": {exc}" if storage else "",
                exc_info=not storage,
            )
            with self._lock:
                self._rows = rows + self._rows
                excess = len(self._rows) - MAX_BUFFERED_ROWS
                if excess > 0:
                    del self._rows[:excess]
                    self.rows_dropped += excess
                    log.warning(
                        "progress recorder %s: dropped %d oldest rows", self.query_id, excess
                    )
            return 0
        self.rows_written += len(rows)
        return len(rows)

    def _run(self) -> None:
        interval = self.flush_interval_ms / 1000.0
        while not self._closing.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            self.flush()
        self.flush()
        with self._lock:
            left, self._rows = self._rows, []
        if left:
            with _UNWRITTEN_LOCK:
                _UNWRITTEN[self.path] = (_UNWRITTEN.get(self.path, []) + left)[-MAX_BUFFERED_ROWS:]
            log.warning(
                "progress recorder %s: %d rows not written to %s; the next recorder on it in this process "
                "writes them", self.query_id, len(left), self.path,
            )
        if self._on_close is not None:
            try:
                self._on_close(self)
                self.unregistered = True
            except Exception:
                log.exception(
                    "progress recorder %s: could not unregister the listener", self.query_id
                )
        log.info("progress recorder %s closed: %d rows written", self.query_id, self.rows_written)


def ensure_progress_table(path: str) -> None:
    """Create the PROGRESS table at ``path``, or add the columns this release added to it (see ``ensure_table``)."""
    ensure_table(path, PROGRESS.arrow_schema, add_missing=True, properties=BATCH_TABLE_PROPERTIES)


def attach(
    spark: SparkSession, config: EngineConfig, *, query_id: str, startup: Startup | None = None
) -> ProgressRecorder:
    """Create the PROGRESS table if needed and record query ``query_id``'s events.

    Call before ``start()`` so the started event and batch 0 are recorded. The
    listener unregisters itself after the query terminates (or on ``detach``).
    """
    path = config.table_path("progress")
    ensure_progress_table(path)
    recorder = ProgressRecorder(
        path,
        query_id=query_id,
        flush_interval_ms=parse_duration_ms(config.engine.progress_flush_interval),
        on_close=lambda r: spark.streams.removeListener(r),
        trigger_interval_ms=config.trigger_interval_ms,
        startup=startup,
    )
    # The recorder warns once per episode of late batches; Spark's own executor warns after
    # every late batch (an engine catching up on a backlog would repeat it for minutes).
    set_jvm_log_level(spark, SPARK_FALLING_BEHIND_LOGGER, "ERROR")
    recorder.start()
    spark.streams.addListener(recorder)
    return recorder


# Logs "Current batch is falling behind" after every batch slower than the trigger interval.
SPARK_FALLING_BEHIND_LOGGER = (
    "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor"
)


def detach(recorder: ProgressRecorder, *, timeout: float = 30.0) -> None:
    """Flush, stop recording and unregister (for a query that failed to start)."""
    recorder.close(timeout=timeout)
