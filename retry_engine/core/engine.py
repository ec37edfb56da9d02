"""The retry engine as one Structured Streaming query.

consume results (Delta) -> decide (mapInArrow) -> schedule stage
(applyInPandasWithState, keyed by group and store-time bucket) -> foreachBatch
writes to the retry, DLQ, quarantine and outcomes tables. Between the steps
rows travel packed (:mod:`retry_engine.core.packed`), a few Spark rows per key.

One engine owns a lake at a time (B8): :func:`start` takes the lake's lease
(:mod:`retry_engine.core.lease`), commits any batch the lake recorded but did not
finish committing, and starts the stream after the lake's last batch when the
checkpoint is new (:mod:`retry_engine.core.resume`). :func:`stop` releases the lease.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.state import GroupStateTimeout

from retry_engine.config import EngineConfig
from retry_engine.core import at_exit, checkpoint_lake, resume
from retry_engine.core._parked import ParkedStore
from retry_engine.core._state_splits import current_batch_id
from retry_engine.core.decide import BATCH_TS, POSITION, Decider, check_input_schema
from retry_engine.core.delays import parse_duration_ms
from retry_engine.core.lease import EngineState, Heartbeat, LakeLease, Owner
from retry_engine.core.outputs import BatchWriter, OnCounts, StatelessWrites, roll_forward
from retry_engine.core.packed import PACKED_SCHEMA, pack
from retry_engine.core.schedule import STATE_SCHEMA, ScheduleStage, StateKeySplit, state_key_split
from retry_engine.core.startup import Startup
from retry_engine.core.totals import Totals
from retry_engine.delta import (
    FORMAT_NAME,
    ensure_query_id,
    ensure_readable_table,
    native_delta,
    report_drift,
    storage,
    table_version,
)
from retry_engine.delta._arrow_ipc import from_ipc
from retry_engine.delta._checkpoint import SHUFFLE_PARTITIONS_CONF, remove_orphan_log_temps
from retry_engine.delta._log import add_actions, newest_time
from retry_engine.delta._offsets import Offset
from retry_engine.delta._worker_heap import settle
from retry_engine.delta.lake import describe_engine_tables
from retry_engine.delta.layout import migrate_partition_folders
from retry_engine.delta.session import capped_arrow_batches, read_parallelism
from retry_engine.delta.tables import open_table
from retry_engine.errors import (
    ConcurrentWriteError,
    DeltaSourceError,
    EngineStoppedError,
    LakeResumeError,
    LeaseLostError,
)
from retry_engine.ops import maintenance, monitor, terms
from retry_engine.ops.status import lake_counts
from retry_engine.schemas import ALL_TABLES, CONSUME_RESULTS, OUTCOMES

log = logging.getLogger(__name__)

QUERY_NAME = "retry-engine"


# The deltars source hands consume results over packed in this column (its ``packedColumn``).
PACKED_INPUT = "_packed_results"
# Decide works on at most this many rows at a time: its per-failure Python objects are what
# a decide worker holds, besides the payload (at most 8 MB) the rows come from. 10k rows made
# a 125k-row task 40% slower in per-call costs (RESULTS run W).
DECIDE_BATCH_ROWS = 32_768


def _decide_batches(
    decider: Decider,
    split: StateKeySplit,
    *,
    floor: str | None = None,
    stateless: StatelessWrites | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of the decide step: consume results in, packed WORK rows out.

    ``decider`` quarantines a row whose decision raises (DECIDE_FAILED) instead of
    failing the task, so no input row can stop the stream (SPEC, bad input);
    ``split`` gives stateful rows their state sub-key (#12 item 17); ``floor``
    (see :func:`_unpacked`) drops what the lake's last batch already read;
    with ``stateless``, a task with enough rows that need no state writes them
    to their tables itself and sends on what it wrote (:class:`~retry_engine.core.outputs.StatelessWrites`).
    Replay: deterministic in its input, so a replayed batch decides the same way.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settle()
        # Routing through sealed keys reads only seals of earlier batches (replay-safe).
        batch_id = current_batch_id()
        task = None if stateless is None or batch_id is None else stateless.task(batch_id)
        try:
            for batch in batches:
                for results in _unpacked(batch, floor=floor):
                    if results.num_rows:
                        # A stateless task separates rows without state at once: no need to
                        # put them back in input order first (the schedule stage orders by position).
                        work = split(decider(results, in_order=task is None), batch_id=batch_id)
                        if task is not None:
                            work = task.keep_stateful(work)
                        if work.num_rows:
                            yield pack(work)
            if task is not None:
                yield from task.finish()
        except BaseException:
            if task is not None:
                task.discard()
            raise

    return run


def _unpacked(batch: pa.RecordBatch, *, floor: str | None = None) -> Iterator[pa.RecordBatch]:
    """Consume results with their batch timestamp, whether the source packed them or not.

    ``floor``: a new checkpoint resuming inside the commit the lake's last batch
    read in part (B8) drops rows whose source position sorts before it; positions
    sort in stream order, so exactly the rows already read go, on replays too.
    """
    if PACKED_INPUT not in batch.schema.names:
        yield batch if floor is None else batch.filter(_at_or_after(batch.column(POSITION), floor))
        return
    stamp = batch.schema.field(BATCH_TS)
    for payload, ts in zip(batch.column(PACKED_INPUT).to_pylist(), batch.column(BATCH_TS), strict=True):
        table = from_ipc(payload)
        if floor is not None:
            table = table.filter(_at_or_after(table.column(POSITION), floor))
        for results in table.to_batches(max_chunksize=DECIDE_BATCH_ROWS):
            # pa.repeat of the scalar: a list of datetimes cost ~30 ms per 125k rows.
            yield results.append_column(stamp, pa.repeat(ts, results.num_rows))


def _at_or_after(positions: pa.Array | pa.ChunkedArray, floor: str) -> pa.Array | pa.ChunkedArray:
    return pc.greater_equal(positions, pa.scalar(floor, pa.string()))


def _read_results(
    spark: SparkSession, config: EngineConfig, *, starting_version: int | None = None
) -> DataFrame:
    """The consume-result stream through the configured table format (``engine.table_format``).

    Fails at start only when the table lacks a required column; other drift
    is logged and tolerated (:func:`~retry_engine.delta.ensure_readable_table`). The deltars source
    packs its rows (``packedColumn``): decide reads them as Arrow anyway. The
    ``[source]`` settings become the reader's Delta options; ``starting_version``
    (a new checkpoint resuming after the lake's last batch) is the source's
    ``startingVersion`` and cannot be combined with ``[source]`` starting options.
    """
    source_path = config.table_path("consume_results")
    if config.engine.table_format == "delta":
        native_delta.ensure_table(spark, source_path, CONSUME_RESULTS)
        frame = native_delta.read_stream(
            spark,
            source_path,
            max_files_per_trigger=config.engine.max_files_per_trigger,
            position_column=POSITION,
            options=config.source.stream_options(),
        )
        read_schema = to_arrow_schema(frame.schema, timezone="UTC")
        report_drift(source_path, read_schema, CONSUME_RESULTS.arrow_schema, ignore=[POSITION])
        check_input_schema(read_schema)
        return frame
    # Drift is tolerated (decide casts value by value and quarantines what does not fit);
    # only a missing required column stops the start.
    table, _ = ensure_readable_table(source_path, CONSUME_RESULTS.arrow_schema)
    check_input_schema(pa.schema(table.schema().to_arrow()))
    return (
        spark.readStream.format(FORMAT_NAME)
        .option("path", source_path)
        .options(**storage.spark_options(source_path))
        .option("maxFilesPerTrigger", str(config.engine.max_files_per_trigger))
        .option("maxRowsPerTrigger", str(config.engine.max_rows_per_trigger))
        .option("maxBytesPerTrigger", str(config.engine.max_bytes_per_trigger))
        .option("sourcePositionColumn", POSITION)
        .option("packedColumn", PACKED_INPUT)
        .option("readPartitions", read_parallelism(spark))
        # Due retries are released by the schedule stage's timeouts, which fire only in a batch:
        # a restart on a fully committed checkpoint must run one even when no result arrives.
        .option("wakeOnStart", "true")
        .options(**_source_options(config, starting_version))
        .load()
    )


def _source_options(config: EngineConfig, starting_version: int | None) -> dict[str, str]:
    """The deltars reader's options: ``[source]``, and the lake's resume point on a new checkpoint.

    The lake's record decides where a new checkpoint starts (B8). A ``[source]``
    ``starting_version`` at or after that point (or ``"latest"``) is an
    operator's deliberate skip (past a vacuumed file, say) and wins, logged; one
    before it would decide consume results a second time, and a
    ``starting_timestamp`` cannot be compared with it, so both are refused.
    """
    options = config.source.stream_options()
    if starting_version is None:
        return options
    requested = options.get("startingVersion")
    if "startingTimestamp" in options or (
        requested not in (None, "latest") and int(requested) < starting_version
    ):
        setting = (
            f"starting_timestamp = {options['startingTimestamp']!r}"
            if "startingTimestamp" in options
            else f"starting_version = {requested}"
        )
        raise LakeResumeError(
            f"the lake {config.engine.lake} records its last batch, so this new checkpoint resumes at "
            f"consume_results version {starting_version}; [source] {setting} would decide consume results "
            f"the lake already decided. Remove it, or set starting_version to {starting_version} or later "
            '(or "latest") to skip ahead on purpose',
            code="LAKE_RESUME_CONFLICT",
        )
    if requested is not None:
        log.warning(
            "[source] starting_version = %s: skipping consume_results from version %d (where the lake's record "
            "resumes) on purpose",
            requested,
            starting_version,
        )
        return options
    return {**options, "startingVersion": str(starting_version)}


def engine_frame(
    spark: SparkSession,
    config: EngineConfig,
    *,
    resume_at: resume.ResumePoint | None = None,
    stateless: StatelessWrites | None = None,
) -> DataFrame:
    """The engine's streaming DataFrame of packed WORK rows, before the writers.

    ``resume_at``: a new checkpoint resuming after the lake's last batch. ``stateless``:
    decide tasks write the rows that need no state themselves (the writer must be a
    :class:`~retry_engine.core.outputs.BatchWriter`, which takes what they wrote).
    """
    results = _read_results(
        spark, config, starting_version=None if resume_at is None else resume_at.starting_version
    )
    floor = None if resume_at is None else resume_at.position_floor
    # Sub-keys of the schedule stage's state keys (#12 item 17): the base split fixed per
    # checkpoint, and the keys sealed by size; base keys placed on the stateful stage's partitions.
    split = state_key_split(
        config.checkpoint_path,
        bucket_ms=config.state_bucket_ms,
        now_ms=int(time.time() * 1000),
        subkeys=config.engine.state_subkeys,
        partitions=int(spark.conf.get(SHUFFLE_PARTITIONS_CONF) or 1),
    )
    decided = results.withColumn(BATCH_TS, F.current_timestamp()).mapInArrow(
        _decide_batches(Decider(config, state_bucket_ms=split.bucket_ms), split, floor=floor, stateless=stateless),
        PACKED_SCHEMA,
    )
    stage = ScheduleStage(
        dedup_window_ms=parse_duration_ms(config.engine.dedup_window),
        seals=split.seals,
        max_key_bytes=config.engine.state_key_max_bytes,
        parked=ParkedStore(config.checkpoint_path),
        park_bytes=config.engine.state_park_bytes,
    )
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


class _Held(NamedTuple):
    """What an engine started in this process holds until :func:`stop`."""

    lease: LakeLease
    heartbeat: Heartbeat
    # What _left_at_exit stops at exit if stop() never came.
    query: StreamingQuery
    # Its run id, for the terminated event stop() may write (known here: the JVM may be gone then).
    run_id: str


# The engines started in this process, by query id (their leases released by stop()).
_HELD: dict[str, _Held] = {}
# Their progress recorders, by query id: stop() waits for the terminated event to be written.
_RECORDERS: dict[str, monitor.ProgressRecorder] = {}
_HELD_LOCK = threading.Lock()
# How long stop() waits for the progress recorder to write the terminated event.
RECORDER_CLOSE_SECONDS = 30.0
# The same wait for a query stopped at interpreter exit (_left_at_exit): the event arrives
# at once from a live JVM; if the session is gone, the row is written without it sooner.
EXIT_RECORD_SECONDS = 5.0


def _left_at_exit() -> list[at_exit.Ending]:
    """The engine queries this process started and did not stop with :func:`stop`, to stop at exit.

    A script or notebook that ended after ``query.stop()``, or with its query
    still running, left the engine's end unrecorded: Spark delivers the
    terminated event to the progress recorder asynchronously, and it came after
    the Python side had gone (an ERROR trace from Spark's listener bus), so
    ``retry-engine status`` said ``running`` until stale, and the lease stayed
    held (its heartbeat thread died with the process) until its timeout or a
    start on the same host. At exit each is stopped as :func:`stop` does (a
    no-op stop for a stopped query), within :data:`at_exit.EXIT_SECONDS`.
    """
    with _HELD_LOCK:
        left = [(app_id, held.query) for app_id, held in _HELD.items()]
    return [(app_id, functools.partial(stop, q, record_timeout_s=EXIT_RECORD_SECONDS)) for app_id, q in left]


at_exit.at_exit("engine", _left_at_exit)


def _resume_point(
    config: EngineConfig,
    before: EngineState | None,
    query_id: str,
    *,
    fresh: bool,
    discard_pending: bool,
) -> tuple[resume.ResumePoint | None, int, Totals | None, dt.datetime | None]:
    """Start-up under the lease: where the stream starts, the pending retries the lake counts for it,
    the lake's counts through its last batch (:mod:`retry_engine.core.totals`; None on
    ``table_format = "delta"``, which records no batches), and when it gave up the retries earlier
    checkpoints left waiting (``discard_pending``; None: none given up).

    First commits the lake's last recorded batch to any output table that lacks it.
    """
    checkpoint = config.checkpoint_path
    last = before.last_batch if before is not None else None
    if last is not None:
        roll_forward(config, last)
    elif fresh and _has_rows(config.table_path(OUTCOMES.name)):
        raise LakeResumeError(
            f"the lake {config.engine.lake} has outcomes but records no batch (they were written before batches "
            "were recorded in the lake, or by a custom writer); the new checkpoint "
            f"{checkpoint} would decide every consume result again. Run the previous checkpoint until it has "
            "committed one batch, then start the new one",
            code="LAKE_NOT_RECORDED",
        )
    # The lake's own tables, not only the record: retries decided but never released. Counted when a
    # new checkpoint takes over from another or the record carries no totals, once for both.
    # Not fresh with another query's batch last: a new checkpoint that started after that batch and has
    # recorded none since (resume.plan refuses any other); it is still taking over.
    taking_over = last is not None and last.query_id != query_id
    recount = config.engine.table_format != "delta" and (last is None or last.totals is None)
    counted = lake_counts(config) if taking_over or recount else None
    pending_in_lake = counted[1] if taking_over and counted is not None else None
    resume.check_replay(checkpoint, before, query_id=query_id, settings=config.decision_settings())
    source = open_table(config.table_path("consume_results"))
    point = resume.plan(
        before,
        query_id=query_id,
        checkpoint=checkpoint,
        fresh=fresh,
        source_table_id=None if source is None else str(source.metadata().id),
        discard_pending=discard_pending,
        pending_in_lake=pending_in_lake,
    )
    if point is not None:
        resume.store(checkpoint, point)
    elif not fresh:
        point = resume.stored(checkpoint)
    # The record's pending count is the tables' (retry outcomes without a retry row, less those given
    # up), which `status` checks its window against: a new checkpoint carries on with what the tables hold.
    pending = last.pending_retries if last is not None and last.query_id == query_id else (pending_in_lake or 0)
    totals = last.totals if last is not None else None
    if recount and counted is not None:
        # A lake of an earlier release, one without records, or one a native Delta engine or a custom
        # writer wrote: its counts through the last batch, for the writer to carry on, from the
        # tables, and so is what waits in the checkpoint's state (in the tables, not in a record).
        lake_totals, in_tables = counted
        log.info("lake %s: counted its outcomes for the batch record: %s", config.engine.lake, lake_totals.outcomes())
        totals, pending = (lake_totals if lake_totals.bounded else None), in_tables or 0
    # --discard-pending: the retries the earlier checkpoints left waiting are given up, and the lake
    # says so (EngineState.discarded_before), so they are pending neither in this record nor for the
    # next new checkpoint, which would otherwise be refused for them again.
    # A restart of such a checkpoint was given --discard-pending at its first start if retries were pending
    # then (plan refused it otherwise) and the lake has recorded nothing since: its discard, not yet
    # recorded (it goes with the first record), is carried on.
    discarded = taking_over and (discard_pending or not fresh) and bool(pending_in_lake)
    return point, 0 if discarded else pending, totals, _discard_mark(config) if discarded else None


def _discard_mark(config: EngineConfig) -> dt.datetime:
    """When this start gives up the retries earlier checkpoints left waiting: now, or past the lake's
    latest decision if another engine's clock ran ahead of this one (every retry it gave up was decided
    before the mark; one a later engine decides on a clock behind it is still counted by its record)."""
    now = dt.datetime.now(dt.UTC)
    table = open_table(config.table_path(OUTCOMES.name))
    latest = newest_time(table, "decided_at") if table is not None else None
    # Statistics keep times to the millisecond, cut down: the latest decision is within one past it.
    return now if latest is None else max(now, latest + dt.timedelta(milliseconds=1))



def _has_rows(path: str) -> bool:
    table = open_table(path)
    if table is None:
        return False
    counts = add_actions(table).column("num_records").to_pylist()
    # A file without stats may hold rows.
    return any(n is None or n > 0 for n in counts)


def start(
    spark: SparkSession,
    config: EngineConfig,
    *,
    writer: Callable[[DataFrame, int], None] | None = None,
    take_over: bool = False,
    discard_pending: bool = False,
    startup: Startup | None = None,
) -> StreamingQuery:
    """Start the engine query; the caller owns it (``awaitTermination`` / :func:`stop`).

    First takes the lake's lease (:class:`~retry_engine.errors.LakeOwnedError`
    naming the owner if another live engine holds it, unless ``take_over``),
    commits a batch the lake recorded but did not finish committing, and, for
    a new checkpoint, starts after the lake's last batch
    (:class:`~retry_engine.errors.LakeResumeError` if that would lose pending
    retries, unless ``discard_pending``). The lease is heartbeated while the
    query runs and released when it stops.

    With ``engine.table_format = "delta"`` this first checks that Spark has the
    Delta jars and settings (:func:`retry_engine.delta.native_delta.require_delta`).

    A custom ``writer`` receives packed rows (:mod:`retry_engine.core.packed`; the
    outcome rows of retries and duplicates carry only the ledger's columns,
    :data:`~retry_engine.core.outputs.LEDGER_COLUMNS`, the message leaves with the
    retry's delivery row); the
    progress table then records Spark's ``numInputRows``, a count of packed
    source rows, as the batches' input, and the lake records no batches.

    ``startup``: times the steps of this start and logs where the time went
    once the first batch commits (:mod:`retry_engine.core.startup`).
    """

    def step(name: str) -> contextlib.AbstractContextManager[None]:
        return startup.step(name) if startup is not None else contextlib.nullcontext()

    native = config.engine.table_format == "delta"
    log.info(
        "retry engine starting on lake %s; tables:\n%s",
        config.engine.lake,
        describe_engine_tables(config),
    )
    if native:
        native_delta.require_delta(spark)
    checkpoint = config.checkpoint_path
    # Spark writes the checkpoint through Hadoop, not delta-rs: refuse a scheme it lacks up front.
    storage.require_checkpoint_filesystem(spark, checkpoint)
    storage.use_filesystem_checkpoints_on_local_disk(spark, checkpoint)
    # Before the checkpoint or the lake is written to: a checkpoint of another lake is refused.
    recorded_lake = checkpoint_lake.check(config)
    fresh = resume.is_fresh(checkpoint)
    app_id = ensure_query_id(checkpoint)
    lease = LakeLease(
        config.engine.lake,
        Owner.this_process(query_id=app_id, checkpoint=checkpoint),
        timeout_ms=config.lease_timeout_ms,
    )
    with step("lease"):
        before = lease.acquire(take_over=take_over)
    try:
        checkpoint_lake.record(config, recorded_lake)
        if native or writer is not None:
            # Its batches are recorded nowhere (a custom writer's, or Delta's own), so neither are their counts.
            lease.forget_totals()
        for path in remove_orphan_log_temps(checkpoint):
            # Also after a clean stop: `run --once` stops with a batch planned, whose state files stay half-written.
            log.info("removed %s, left by a stop (or a kill) during a batch", path)
        if not native:
            with step("table layout"):
                _migrate_partition_layout(config)
        with step("resume point"):
            point, pending, totals, discarded = _resume_point(
                config, before, app_id, fresh=fresh, discard_pending=discard_pending
            )
            if discarded is not None and (native or writer is not None):
                log.warning(
                    "lake %s: the retries given up are not recorded as such by this writer (it records no "
                    "batches): a later new checkpoint counts them as pending again", config.engine.lake,
                )
        if native and point is not None:
            raise LakeResumeError(
                f"a new checkpoint {checkpoint} would resume after the lake's last batch {point.after_batch}, which "
                'engine.table_format = "delta" does not support yet; use the previous checkpoint or "deltars"',
                code="LAKE_RESUME_UNSUPPORTED",
            )
        with step("query start"):
            query = _start_query(
                spark,
                config,
                app_id,
                writer,
                lease=lease,
                pending=pending,
                totals=totals,
                discarded=discarded,
                resume_at=point,
                startup=startup,
            )
    except BaseException:
        lease.release()
        raise

    def lost(exc: LeaseLostError) -> None:
        log.error("engine %s stops: %s", app_id, exc)
        _stopping(app_id, terms.LEASE_LOST)
        query.stop()

    heartbeat = Heartbeat(
        lease,
        interval_s=config.lease_timeout_ms / 4000,
        alive=lambda: bool(query.isActive),
        on_lost=lost,
    )
    with _HELD_LOCK:
        _HELD[app_id] = _Held(lease, heartbeat, query, str(query.runId))
    heartbeat.start()
    maintenance.start(app_id, alive=lambda: bool(query.isActive))
    log.info(
        "engine started: query id %s, checkpoint %s, lake epoch %s", app_id, checkpoint, lease.epoch
    )
    return query


def _migrate_partition_layout(config: EngineConfig) -> None:
    """Move files of partitioned tables written by engines before the Hive layout into Hive folders.

    Runs under the lease before the query starts, so the engine itself never
    writes during it; a no-op (one snapshot read per table) once moved. Operator
    tools may still write: if they keep winning, the table stays as it is (Delta
    readers read either layout) and the next start tries again.
    """
    for table in ALL_TABLES:
        if not table.partition_by:
            continue
        try:
            migrate_partition_folders(config.table_path(table.name))
        except ConcurrentWriteError as exc:
            log.warning("%s; the engine starts anyway and moves the files at its next start", exc)


def _start_query(
    spark: SparkSession,
    config: EngineConfig,
    app_id: str,
    writer: Callable[[DataFrame, int], None] | None,
    *,
    lease: LakeLease,
    pending: int,
    totals: Totals | None = None,
    discarded: dt.datetime | None = None,
    resume_at: resume.ResumePoint | None,
    startup: Startup | None = None,
) -> StreamingQuery:
    native = config.engine.table_format == "delta"
    checkpoint = config.checkpoint_path
    # Registered first so the started event and batch 0 are recorded; it unregisters
    # itself when the query terminates.
    recorder = monitor.attach(spark, config, query_id=app_id, startup=startup)
    with _HELD_LOCK:
        _RECORDERS[app_id] = recorder
    # An explicit processing-time trigger makes Spark run (possibly empty) batches on
    # schedule, which is what fires the schedule stage's timeouts. Trigger.AvailableNow
    # would never end: processing-time timeouts always ask for another batch.
    trigger = f"{config.trigger_interval_ms} milliseconds"
    try:
        if writer is None:
            writer = (
                native_delta.NativeBatchWriter(config, app_id)
                if native
                else BatchWriter(
                    config,
                    app_id,
                    on_counts=_counting_inputs(recorder),
                    lease=lease,
                    checkpoint=checkpoint,
                    pending_retries=pending,
                    totals=totals,
                    discarded_before=discarded,
                )
            )
        stateless = writer.stateless_writes() if isinstance(writer, BatchWriter) else None
        # [maintenance]: a driver thread maintains the tables between batches (never during one).
        writer = maintenance.attach(config, app_id, writer)
        writer = _sweeping_parked(writer, ParkedStore(checkpoint), _batches_retained(spark))
        stream = (
            engine_frame(spark, config, resume_at=resume_at, stateless=stateless)
            .writeStream.queryName(QUERY_NAME)
            .foreachBatch(writer)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=trigger)
        )
        with capped_arrow_batches(spark):
            return stream.start()
    except Exception:
        with _HELD_LOCK:
            _RECORDERS.pop(app_id, None)
        monitor.detach(recorder)
        maintenance.detach(app_id)
        raise


# Parked retries' files released long enough ago are deleted every this many batches.
SWEEP_EVERY_BATCHES = 20


def _batches_retained(spark: SparkSession) -> int:
    """How many state versions Spark keeps (``spark.sql.streaming.minBatchesToRetain``)."""
    return int(spark.conf.get("spark.sql.streaming.minBatchesToRetain", "100") or 100)


def _sweeping_parked(
    writer: Callable[[DataFrame, int], None], store: ParkedStore, retain: int
) -> Callable[[DataFrame, int], None]:
    """``writer`` that, every :data:`SWEEP_EVERY_BATCHES` batches, deletes the parked retries' files
    fully released before the oldest state version Spark keeps (none of them can be referenced
    again). A failed sweep is logged, never fatal: the next one tries again."""

    def write(frame: DataFrame, batch_id: int) -> None:
        writer(frame, batch_id)
        if batch_id % SWEEP_EVERY_BATCHES == 0 and batch_id > retain:
            try:
                deleted = store.sweep(batch_id - retain)
            except Exception as exc:
                storage.log_failure(log, "deleting released parked retries' files failed; the next sweep tries again", exc)
            else:
                log.debug("deleted %d released parked retries' files", len(deleted))

    return write


def finish_current_batch(query: StreamingQuery, *, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Wait up to ``timeout_s`` for the running micro-batch to end; True if one ended (or none ran).

    Returns as soon as the query is between batches (not still initializing),
    or a batch finished since the call (an engine that falls behind starts the
    next batch at once, so there is no gap to wait for: the next one is then
    stopped while it plans).
    Stopping inside a batch is safe too (the commit protocol replays it on the
    next start), but Spark, Hadoop and py4j log the interruption as errors and
    the batch's work is done twice.
    """
    deadline = time.monotonic() + timeout_s
    running = _last_batch_id(query)
    while query.isActive:
        status = query.status
        # While a query initializes, Spark starts its Python source runners; a stop then
        # leaves a runner unable to connect back, which prints a traceback.
        starting = str(status.get("message", "")).startswith("Initializing")
        if (not status.get("isTriggerActive", False) and not starting) or _last_batch_id(
            query
        ) != running:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def _last_batch_id(query: StreamingQuery) -> int | None:
    progress = query.lastProgress
    return None if progress is None else int(progress["batchId"])


def _stopping(app_id: str, reason: terms.StopReason) -> None:
    """Tell the query's progress recorder why it is about to be stopped (before ``query.stop()``)."""
    with _HELD_LOCK:
        recorder = _RECORDERS.get(app_id)
    if recorder is not None:
        recorder.stopping(reason)


def stop(
    query: StreamingQuery,
    *,
    finish_batch_s: float = 0.0,
    reason: terms.StopReason = terms.STOPPED,
    record_timeout_s: float = RECORDER_CLOSE_SECONDS,
) -> LeaseLostError | None:
    """Stop the engine query, record its end, and release its lake lease.

    ``reason``: why, as the ``terminated`` event records it (``stopped`` on
    request, ``finished`` after ``run --once``); a query that died with an
    exception is recorded as ``failed``, one stopped after its lease was lost
    as ``lease_lost``, whatever ``reason`` says.

    ``finish_batch_s``: first wait up to this long for the running micro-batch
    to finish (:func:`finish_current_batch`); after that the batch is
    abandoned, which is safe: its outputs are committed by the next start's
    replay of the same batch id, or were already committed and are skipped.

    Returns after the PROGRESS table holds the query's ``terminated`` event
    (so ``retry-engine status`` says ``stopped``; if Spark's event has not come
    within ``record_timeout_s``, the row is written without it), the progress recorder's
    and the lease heartbeat's threads have ended (none is left inside a
    delta-rs call when the interpreter exits), and the lease is released (the
    next engine starts without ``--take-over``). Returns the error if the
    engine had stopped because another engine took the lake over.
    """
    app_id = _app_id(query)
    _stopping(app_id, reason)
    with _HELD_LOCK:
        holding = _HELD.get(app_id)
    if holding is not None:
        # The lease stays this engine's until the query has ended: see Heartbeat.hold.
        holding.heartbeat.hold()
    try:
        if finish_batch_s > 0 and not finish_current_batch(query, timeout_s=finish_batch_s):
            log.info(
                "engine %s: the running batch did not finish within %.0f s; abandoning it (the next start "
                "replays it)",
                app_id,
                finish_batch_s,
            )
        query.stop()
    finally:
        maintenance.detach(app_id)
        with _HELD_LOCK:
            held = _HELD.pop(app_id, None)
            recorder = _RECORDERS.pop(app_id, None)
        # The heartbeat first: seeing the query stopped, it would release the lease itself.
        if held is not None:
            held.heartbeat.stop()
        if recorder is not None:
            recorder.finish(
                run_id=holding.run_id if holding is not None else str(query.runId),
                exception=_exception_text(query),
                timeout=record_timeout_s,
            )
        # Unless its heartbeat did already: the query had stopped without stop() (query.stop()).
        if held is not None and not held.heartbeat.released:
            held.lease.release()
    return held.heartbeat.lost if held is not None else None


def _app_id(query: StreamingQuery) -> str:
    """The query's id: the one an engine of this process holds it under (no call into the JVM, which may
    be gone: a stop must still end the heartbeat and release the lease), else Spark's."""
    with _HELD_LOCK:
        for app_id, held in _HELD.items():
            if held.query is query:
                return app_id
    return str(query.id)


def _exception_text(query: StreamingQuery) -> str | None:
    try:
        exc = query.exception()
    except Exception:  # the session is gone: nothing more to learn about the query
        return None
    return None if exc is None else str(exc)


def run_once(
    spark: SparkSession,
    config: EngineConfig,
    *,
    take_over: bool = False,
    discard_pending: bool = False,
    wait: Callable[[float], bool] | None = None,
    finish_batch_s: float = 0.0,
    startup: Startup | None = None,
    quiet: Callable[[], None] | None = None,
) -> bool:
    """Process every consume result in the table when this is called, then stop.

    "In the table" means through the table version seen here, whatever the
    checkpoint replays first (a planned batch left by a stop runs before any
    new input). Retries that are not yet due stay in the checkpointed schedule
    stage and are released by a later run.

    ``wait``: see :func:`wait_until_idle`; when it reports a stop request the
    query is stopped early, after its running batch (up to ``finish_batch_s``).
    Returns True when the input was processed (terminated event ``finished``),
    False when stopped on request (``stopped``). The query is stopped from
    the calling thread either way.

    ``quiet`` is called right before either stop (not before the stop of a
    query that failed): the engine plans its batches back to back, so the stop
    interrupts a planned batch (replayed at the next start) and Spark logs that
    interruption (``retry-engine run --once`` silences those loggers with it).
    """
    through = table_version(config.table_path("consume_results"))
    # A batch the last run planned is replayed first, at its own (old) time: retries due since then
    # are released only in a batch planned now (the source's wakeOnStart plans one).
    replayed = resume.last_planned(config.checkpoint_path) if config.engine.table_format == "deltars" else None
    query = start(
        spark, config, take_over=take_over, discard_pending=discard_pending, startup=startup
    )
    finished: bool | None = None
    try:
        finished = wait_until_idle(
            query, through_version=0 if through is None else through, wait=wait, after_batch=replayed
        )
    finally:
        requested = finished is False
        if finished is not None and quiet is not None:
            quiet()
        stop(
            query,
            finish_batch_s=finish_batch_s if requested else 0.0,
            reason=terms.FINISHED if finished else terms.STOPPED,
        )
    return finished


def _covers(end: Any, version: int) -> bool:
    """Whether a Delta/deltars source end offset is past every file of commit ``version``."""
    data: Any = json.loads(end) if isinstance(end, str) else end
    if not isinstance(data, Mapping):
        return False
    try:
        offset = Offset.from_json(data)
    except DeltaSourceError:
        return False
    return not offset.is_starting_version and offset.version > version


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def wait_until_idle(
    query: StreamingQuery,
    *,
    through_version: int | None = None,
    poll_seconds: float = 0.2,
    wait: Callable[[float], bool] | None = None,
    after_batch: int | None = None,
) -> bool:
    """Block until the query has processed the consume results through table version ``through_version``.

    That is, until a finished batch's source end offset lies past that
    commit (the source moves its offset past a version once it has read all
    of it). A replayed batch planned before that version does not count.
    Without ``through_version``: until a micro-batch completes that found no
    new input (which a replayed empty batch also satisfies).

    ``processAllAvailable`` never returns here: processing-time timeouts make
    Spark plan a batch on every trigger, so the query is never "idle" in its
    sense.

    ``wait(seconds)`` sleeps between polls and returns True when a stop was
    requested (e.g. :meth:`StopSignals.wait <retry_engine.ops.stopping.StopSignals.wait>`);
    the wait then ends, returning False. Returns True once the input is processed.

    ``after_batch``: only a batch with a greater id counts (one planned by this
    run, at its time, rather than a replay of the last run's).
    """
    pause = wait or _sleep
    while True:
        if query.exception() is not None:
            raise query.exception()  # type: ignore[misc]
        if not query.isActive:
            raise EngineStoppedError(
                f"the engine query {query.id} stopped before it had processed table version {through_version}"
            )
        progress = query.lastProgress
        if progress is not None and (after_batch is None or progress["batchId"] > after_batch):
            if through_version is None:
                if progress["numInputRows"] == 0:
                    return True
            elif progress["sources"] and _covers(
                progress["sources"][0].get("endOffset"), through_version
            ):
                return True
        if pause(poll_seconds):
            return False
