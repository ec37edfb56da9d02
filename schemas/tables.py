"""The tables: one definition each."""

from __future__ import annotations

import pyarrow as pa

from . import columns as c
from ._model import Column, Table

# The message as RocketMQ models it; every message-carrying table starts with these.
MESSAGE_COLUMNS = (
    c.MSG_ID,
    c.TOPIC,
    c.TAGS,
    c.KEYS,
    c.BODY,
    c.FLAG,
    c.PROPERTIES,
    c.BORN_TIMESTAMP,
    c.BORN_HOST,
    c.STORE_TIMESTAMP,
    c.QUEUE_ID,
    c.RECONSUME_TIMES,
    c.ORIGIN_MSG_ID,
    c.RETRY_TOPIC,
    c.ATTEMPTS,
)

# What both engine output tables carry about the failure that produced the row.
FAILURE_CONTEXT = (c.ERROR_CLASS, c.ERROR_MESSAGE, c.DELIVERY_KEY, c.SOURCE_RESULT_ID)
_GROUP_PARTITION = c.CONSUMER_GROUP.variant(
    doc="Consumer group G (partition column).", nullable=False
)

MESSAGES = Table(
    "messages",
    "Topic messages written by producers; one table holds every topic, partitioned by topic.",
    MESSAGE_COLUMNS,
    partition_by=("topic",),
)

# Every column is nullable here: bad input must be writable so it can be quarantined.
CONSUME_RESULTS = Table(
    "consume_results",
    "One row per delivered message a consumer processed: the message as delivered plus the result.",
    tuple(
        col.variant(nullable=True)
        for col in (
            c.RESULT_ID,
            c.CONSUMER_GROUP,
            c.CONSUMER_ID,
            c.MESSAGE_MODEL,
            c.STATUS,
            c.DELAY_LEVEL_WHEN_NEXT_CONSUME,
            c.MAX_RECONSUME_TIMES,
            c.ERROR_CLASS,
            c.ERROR_MESSAGE,
            c.CONSUMED_AT,
            *MESSAGE_COLUMNS,
        )
    ),
)

RETRY = Table(
    "retry",
    "Retry messages released by the schedule stage to %RETRY%G (the topic column), by group.",
    (
        *MESSAGE_COLUMNS,
        _GROUP_PARTITION,
        c.DELAY_LEVEL,
        c.SCHEDULE_QUEUE_ID,
        c.SCHEDULED_AT,
        c.DUE_AT,
        c.DELIVERED_AT,
        *FAILURE_CONTEXT,
    ),
    partition_by=("consumer_group",),
)

DLQ = Table(
    "dlq",
    "Dead letters of %DLQ%G (the topic column), by group. Write-only for consumers (R9).",
    (
        *MESSAGE_COLUMNS,
        _GROUP_PARTITION,
        c.DEAD_LETTERED_AT,
        c.REASON_CODE,
        c.REASON,
        *FAILURE_CONTEXT,
    ),
    partition_by=("consumer_group",),
)

QUARANTINE = Table(
    "quarantine",
    "Consume results the engine could not act on, with the reason; nothing is dropped silently.",
    (
        c.RESULT_ID,
        c.CONSUMER_GROUP,
        c.MSG_ID.variant(nullable=True),
        c.REASON_CODE,
        c.REASON,
        c.SOURCE_POSITION,
        c.RAW,
        c.BATCH_ID,
        c.QUARANTINED_AT,
    ),
)

OUTCOMES = Table(
    "outcomes",
    "One row per consume result read: what the engine did with it (the accounting ledger).",
    (
        c.RESULT_ID,
        c.CONSUMER_GROUP,
        c.RETRY_TOPIC.variant(doc="Original topic of the consumed message."),
        c.MSG_ID.variant(
            doc="msg_id of the consumed message (null if it was missing).", nullable=True
        ),
        c.ORIGIN_MSG_ID,
        c.RECONSUME_TIMES,
        c.OUTCOME,
        c.REASON_CODE,
        c.REASON,
        c.OUTPUT_MSG_ID,
        c.DELAY_LEVEL,
        c.DUE_AT,
        c.SOURCE_POSITION,
        c.BATCH_ID,
        c.DECIDED_AT,
    ),
)

METRICS = Table(
    "metrics",
    "Per micro-batch counts and delivery lateness, by group, original topic and delay level (B7).",
    (
        c.BATCH_ID,
        c.BATCH_TIME,
        c.CONSUMER_GROUP,
        c.RETRY_TOPIC.variant(doc="Original topic of the messages counted."),
        c.DELAY_LEVEL.variant(
            doc="Delay level of the retries counted; null when not about one level."
        ),
        c.METRIC,
        c.VALUE,
    ),
)

REDRIVE_AUDIT = Table(
    "redrive_audit",
    "One row per dead letter re-driven (B5) or resolved: who, what, when, where to, why. Written before the move "
    "(an intent log); a chunk has moved once its target table records the re-drive's transaction.",
    (
        c.REDRIVE_ID,
        c.CHUNK,
        c.OPERATOR,
        c.NOTE,
        c.SELECTION,
        c.REDRIVE_TARGET,
        c.RESET_RECONSUME_TIMES,
        c.CONSUMER_GROUP.variant(nullable=False),
        c.RETRY_TOPIC.variant(doc="Original topic of the dead letter."),
        c.DLQ_MSG_ID,
        c.ORIGIN_MSG_ID,
        c.REASON_CODE.variant(
            doc="Why the message was dead-lettered (the dead letter's reason_code)."
        ),
        c.REDRIVEN_MSG_ID,
        c.TOPIC.variant(
            doc="Topic the new message was written to (the original topic or %RETRY%G)."
        ),
        c.TARGET_TABLE,
        c.RECONSUME_TIMES.variant(doc="reconsume_times of the new message."),
        c.REDRIVEN_AT,
    ),
)

REDRIVE_TASKS = Table(
    "redrive_tasks",
    "One row per event of a re-drive run: started, alive (heartbeat), finished, stopped, cancel asked, "
    "cancelled. Append-only; with the audit table it says which re-drives run, moved what, and who cancelled them.",
    (
        c.REDRIVE_ID,
        c.RUN_ID,
        c.TASK_EVENT,
        c.TASK_AT,
        c.OPERATOR.variant(doc="Who ran the re-drive, or who asked to cancel it."),
        c.SELECTION,
        c.REDRIVE_TARGET.variant(nullable=True),
        c.TASK_MOVED,
        c.TASK_TOTAL,
        c.DETAIL,
        c.HOST,
    ),
)

PROGRESS = Table(
    "progress",
    "One row per StreamingQueryListener event of the engine query: batch timing, rows, state (B7).",
    (
        c.QUERY_ID,
        c.RUN_ID,
        c.QUERY_NAME,
        c.EVENT,
        c.BATCH_ID.variant(
            doc="Micro-batch id (progress events; null for the others).", nullable=True
        ),
        c.EVENT_TIME,
        c.RECORDED_AT,
        c.BATCH_DURATION_MS,
        c.DURATION_MS,
        c.NUM_INPUT_ROWS,
        c.INPUT_ROWS_PER_SECOND,
        c.PROCESSED_ROWS_PER_SECOND,
        c.STATE_ROWS_TOTAL,
        c.STATE_ROWS_UPDATED,
        c.STATE_ROWS_REMOVED,
        c.STATE_MEMORY_BYTES,
        c.SOURCE_END_OFFSET,
        c.EXCEPTION,
        c.ERROR_CLASS_ON_EXCEPTION,
        c.STOP_REASON,
    ),
)

ALL_TABLES = (
    MESSAGES,
    CONSUME_RESULTS,
    RETRY,
    DLQ,
    QUARANTINE,
    OUTCOMES,
    METRICS,
    PROGRESS,
    REDRIVE_AUDIT,
    REDRIVE_TASKS,
)


def _union(*parts: tuple[Column, ...] | Table) -> tuple[Column, ...]:
    seen: dict[str, Column] = {}
    for part in parts:
        for col in part.columns if isinstance(part, Table) else part:
            seen.setdefault(
                col.name,
                col if col.name in ("kind", "route", "bucket") else col.variant(nullable=True),
            )
    return tuple(seen.values())


WORK = Table(
    "work",
    "Internal: rows between the decision step, the schedule stage and the writers.",
    _union(
        (c.KIND, c.ROUTE, c.BUCKET),
        RETRY,
        DLQ,
        QUARANTINE,
        OUTCOMES,
        (c.CONSUMED_MSG_ID, c.CONSUMED_ORIGIN_MSG_ID, c.CONSUMED_RECONSUME_TIMES),
    ),
)


# The lake's single-row engine state (lease + last batch), at ``<lake>/_engine_state``.
# Not in ALL_TABLES: no user reads it; :mod:`retry_engine.core.lease` owns it.
_TS = c.TS
ENGINE_STATE = Table(
    "engine_state",
    "Internal, one row: who owns the lake (lease with an epoch) and the engine's last batch (B8).",
    (
        Column(
            "epoch",
            pa.int64(),
            "Lease epoch; every take-over bumps it, fencing older owners.",
            False,
        ),
        Column("owner_host", pa.string(), "Host of the engine holding the lease."),
        Column("owner_pid", pa.int64(), "Process id of the engine holding the lease."),
        Column(
            "owner_query_id", pa.string(), "Query id (checkpoint) of the engine holding the lease."
        ),
        Column(
            "owner_checkpoint", pa.string(), "Checkpoint location of the engine holding the lease."
        ),
        Column("since", _TS, "When the current owner acquired the lease."),
        Column(
            "heartbeat", _TS, "The owner's last heartbeat; the lease expires a timeout after it."
        ),
        Column("released", pa.bool_(), "True once the owner stopped gracefully.", False),
        Column("batch_query_id", pa.string(), "Query id of the last batch the lake records."),
        Column(
            "batch_id", pa.int64(), "Batch id of that batch (txnVersion of its output commits)."
        ),
        Column("source_end", pa.string(), "consume_results offset (JSON) that batch read through."),
        Column("batch_files", pa.string(), "JSON: the data files of that batch per output table."),
        Column(
            "pending_retries", pa.int64(), "Retries decided but not yet released, after that batch."
        ),
        Column(
            "totals",
            pa.string(),
            "JSON [[group, metric, count], ...]: outcomes decided and retries delivered since the lake's "
            "first batch, through that batch.",
        ),
        Column(
            "discarded_before",
            _TS,
            "A new checkpoint gave up the retries its predecessors left waiting (`run --discard-pending`) "
            "when it started: retries decided before this and never released are no longer pending.",
        ),
        Column(
            "batch_recorded_at",
            _TS,
            "When that batch was recorded, after its schedule stage released the retries due by its batch time.",
        ),
    ),
)


# What each `retry-engine maintain` run (or the engine's own maintenance) did to one table,
# at ``<lake>/_maintenance``. Not in ALL_TABLES: :mod:`retry_engine.ops.maintenance` owns it.
MAINTENANCE = Table(
    "maintenance",
    "Internal: one row per table per maintenance run (compaction, log checkpoint, log cleanup, vacuum).",
    (
        Column(
            "run_id", pa.string(), "One id per maintenance run (all its tables share it).", False
        ),
        Column("run_at", _TS, "When the run started.", False),
        Column(
            "trigger",
            pa.string(),
            "'command' (retry-engine maintain) or 'engine' (in-engine).",
            False,
        ),
        Column(
            "table_name",
            pa.string(),
            "The table maintained (consume_results, retry, dlq, ...).",
            False,
        ),
        Column("table_path", pa.string(), "Where that table lives.", False),
        Column("version_before", pa.int64(), "Table version before the run."),
        Column("version_after", pa.int64(), "Table version after the run."),
        Column("files_before", pa.int64(), "Data files in the snapshot before the run."),
        Column("files_after", pa.int64(), "Data files in the snapshot after the run."),
        Column("bytes_before", pa.int64(), "Bytes of those data files before the run."),
        Column("bytes_after", pa.int64(), "Bytes of the data files after the run."),
        Column("files_compacted", pa.int64(), "Small files replaced by compaction."),
        Column("files_written", pa.int64(), "Files compaction wrote in their place."),
        Column("checkpoint_version", pa.int64(), "Version of the Delta log checkpoint written."),
        Column("log_files_before", pa.int64(), "Entries of _delta_log before the run."),
        Column("log_files_after", pa.int64(), "Entries of _delta_log after the run."),
        Column(
            "files_vacuumed",
            pa.int64(),
            "Unreferenced data files deleted (older than the retention).",
        ),
        Column(
            "files_expired",
            pa.int64(),
            "Files removed because every row was older than the row retention (progress: progress_retention).",
        ),
        Column("rows_expired", pa.int64(), "Rows of those files."),
        Column("retention_hours", pa.int64(), "The vacuum retention used, in hours.", False),
        Column("error", pa.string(), "What failed (the run went on with the next step), or null."),
    ),
)
