"""The retry engine as one Structured Streaming query.

consume results (Delta) -> decide (mapInArrow) -> schedule stage
(applyInPandasWithState, keyed by group and store-time bucket) -> foreachBatch
writes to the retry, DLQ, quarantine and outcomes tables. Between the steps
rows travel packed (:mod:`retry_engine.packed`), a few Spark rows per key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.state import GroupStateTimeout

from retry_engine import monitor, native_delta
from retry_engine._arrow_ipc import from_ipc
from retry_engine.config import EngineConfig
from retry_engine.decide import BATCH_TS, POSITION, Decider, check_input_schema
from retry_engine.delays import parse_duration_ms
from retry_engine.delta import FORMAT_NAME, ensure_query_id, ensure_table
from retry_engine.outputs import BatchWriter, OnCounts
from retry_engine.packed import PACKED_SCHEMA, pack
from retry_engine.schedule import STATE_SCHEMA, ScheduleStage, StateKeySplit, state_key_split
from retry_engine.schemas import CONSUME_RESULTS

log = logging.getLogger(__name__)

QUERY_NAME = "retry-engine"


# The deltars source hands consume results over packed in this column (its ``packedColumn``).
PACKED_INPUT = "_packed_results"
# Decide works on at most this many rows at a time (Spark's own Arrow batch size for
# unpacked input): its per-failure Python objects are what a decide worker holds.
DECIDE_BATCH_ROWS = 10_000


def _decide_batches(
    decider: Decider, split: StateKeySplit
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for results in _unpacked(batch):
                if results.num_rows:
                    yield pack(split(decider(results)))

    return run


def _unpacked(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """Consume results with their batch timestamp, whether the source packed them or not."""
    if PACKED_INPUT not in batch.schema.names:
        yield batch
        return
    stamp = batch.schema.field(BATCH_TS)
    for payload, ts in zip(batch.column(PACKED_INPUT).to_pylist(), batch.column(BATCH_TS).to_pylist(), strict=True):
        for results in from_ipc(payload).to_batches(max_chunksize=DECIDE_BATCH_ROWS):
            yield results.append_column(stamp, pa.array([ts] * results.num_rows, stamp.type))


def _read_results(spark: SparkSession, config: EngineConfig) -> DataFrame:
    """The consume-result stream through the configured table format (``engine.table_format``).

    Fails at start when the table lacks a required column. The deltars source
    packs its rows (``packedColumn``): decide reads them as Arrow anyway.
    """
    source_path = config.table_path("consume_results")
    if config.engine.table_format == "delta":
        native_delta.ensure_table(spark, source_path, CONSUME_RESULTS)
        frame = native_delta.read_stream(
            spark, source_path, max_files_per_trigger=config.engine.max_files_per_trigger, position_column=POSITION
        )
        check_input_schema(to_arrow_schema(frame.schema, timezone="UTC"))
        return frame
    table = ensure_table(source_path, CONSUME_RESULTS.arrow_schema)
    check_input_schema(pa.schema(table.schema().to_arrow()))
    return (
        spark.readStream.format(FORMAT_NAME)
        .option("path", source_path)
        .option("maxFilesPerTrigger", str(config.engine.max_files_per_trigger))
        .option("sourcePositionColumn", POSITION)
        .option("packedColumn", PACKED_INPUT)
        .load()
    )


def engine_frame(spark: SparkSession, config: EngineConfig) -> DataFrame:
    """The engine's streaming DataFrame of packed WORK rows, before the writers."""
    results = _read_results(spark, config)
    # Sub-keys of the schedule stage's state keys (#12 item 17), fixed per checkpoint.
    split = state_key_split(config.checkpoint_path, bucket_ms=config.state_bucket_ms, now_ms=int(time.time() * 1000))
    decided = results.withColumn(BATCH_TS, F.current_timestamp()).mapInArrow(
        _decide_batches(Decider(config), split), PACKED_SCHEMA
    )
    stage = ScheduleStage(dedup_window_ms=parse_duration_ms(config.engine.dedup_window))
    return decided.groupBy("route", "bucket").applyInPandasWithState(
        stage, PACKED_SCHEMA, STATE_SCHEMA, "append", GroupStateTimeout.ProcessingTimeTimeout
    )


def _counting_inputs(recorder: monitor.ProgressRecorder) -> OnCounts:
    """The writer's per-batch outcome counts as the batch's input rows for the PROGRESS table.

    Every consume result ends in exactly one outcome, so their sum is the
    batch's input; Spark's own count is of packed source rows.
    """

    def on_counts(batch_id: int, summary: list[tuple[str, str, str, int]]) -> None:
        recorder.record_input_rows(batch_id, sum(n for *_, n in summary))

    return on_counts


def start(
    spark: SparkSession,
    config: EngineConfig,
    *,
    writer: Callable[[DataFrame, int], None] | None = None,
) -> StreamingQuery:
    """Start the engine query; the caller owns it (``awaitTermination`` / ``stop``).

    With ``engine.table_format = "delta"`` this first checks that Spark has the
    Delta jars and settings (:func:`retry_engine.native_delta.require_delta`).

    A custom ``writer`` receives packed rows (:mod:`retry_engine.packed`); the
    progress table then records Spark's ``numInputRows``, a count of packed
    source rows, as the batches' input.
    """
    native = config.engine.table_format == "delta"
    if native:
        native_delta.require_delta(spark)
    checkpoint = config.checkpoint_path
    app_id = ensure_query_id(checkpoint)
    # Registered first so the started event and batch 0 are recorded; it unregisters
    # itself when the query terminates.
    recorder = monitor.attach(spark, config, query_id=app_id)
    # An explicit processing-time trigger makes Spark run (possibly empty) batches on
    # schedule, which is what fires the schedule stage's timeouts. Trigger.AvailableNow
    # would never end: processing-time timeouts always ask for another batch.
    trigger = f"{config.trigger_interval_ms} milliseconds"
    try:
        if writer is None:
            writer = (
                native_delta.NativeBatchWriter(config, app_id)
                if native
                else BatchWriter(config, app_id, on_counts=_counting_inputs(recorder))
            )
        query = (
            engine_frame(spark, config)
            .writeStream.queryName(QUERY_NAME)
            .foreachBatch(writer)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=trigger)
            .start()
        )
    except Exception:
        monitor.detach(recorder)
        raise
    log.info("engine started: query id %s, checkpoint %s", app_id, checkpoint)
    return query


def run_once(spark: SparkSession, config: EngineConfig) -> None:
    """Process every consume result already in the table, then stop.

    Retries that are not yet due stay in the checkpointed schedule stage and
    are released by a later run.
    """
    query = start(spark, config)
    try:
        wait_until_idle(query)
    finally:
        query.stop()


def wait_until_idle(query: StreamingQuery, *, poll_seconds: float = 0.2) -> None:
    """Block until a micro-batch completes that found no new input.

    ``processAllAvailable`` never returns here: processing-time timeouts make
    Spark plan a batch on every trigger, so the query is never "idle" in its
    sense. A finished batch that read nothing means everything available when
    it was planned has been processed.
    """
    while True:
        if query.exception() is not None:
            raise query.exception()  # type: ignore[misc]
        progress = query.lastProgress
        if progress is not None and progress["numInputRows"] == 0:
            return
        time.sleep(poll_seconds)
