"""Every column of every table, defined once.

Names follow RocketMQ's message model in snake_case; where RocketMQ keeps a
value in a system property, the property is named in the doc.
"""

from __future__ import annotations

import pyarrow as pa

from ._model import Column

TS = pa.timestamp("us", tz="UTC")

ATTEMPT = pa.struct(
    [
        pa.field("reconsume_times", pa.int32()),
        pa.field("consumer_group", pa.string()),
        pa.field("consumer_id", pa.string()),
        pa.field("status", pa.string()),
        pa.field("error_class", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("consumed_at", TS),
        pa.field("delay_level", pa.int32()),
    ]
)

# -- the message (RocketMQ MessageExt) ---------------------------------------
MSG_ID = Column(
    "msg_id", pa.string(), "Message id, unique per delivery (a retry gets a new one).", False
)
TOPIC = Column(
    "topic", pa.string(), "Topic the row belongs to (%RETRY%G / %DLQ%G on engine tables).", False
)
TAGS = Column("tags", pa.string(), "Message tag (RocketMQ TAGS).")
KEYS = Column("keys", pa.string(), "Business keys, space separated (RocketMQ KEYS).")
BODY = Column("body", pa.binary(), "Message body, opaque bytes.")
FLAG = Column("flag", pa.int32(), "Application flag, copied unchanged.")
PROPERTIES = Column(
    "properties", pa.map_(pa.string(), pa.string()), "User properties, copied unchanged."
)
BORN_TIMESTAMP = Column(
    "born_timestamp", TS, "When the producer created the message; kept on retries."
)
BORN_HOST = Column("born_host", pa.string(), "Producer host; kept on retries.")
STORE_TIMESTAMP = Column("store_timestamp", TS, "When this row was stored in its table.")
QUEUE_ID = Column("queue_id", pa.int32(), "Queue within the topic (retry: hash % retryQueueNums).")
RECONSUME_TIMES = Column(
    "reconsume_times",
    pa.int32(),
    "Deliveries that failed before this one (RocketMQ reconsumeTimes).",
)
ORIGIN_MSG_ID = Column(
    "origin_msg_id", pa.string(), "Id of the first delivery; never changes (ORIGIN_MESSAGE_ID)."
)
RETRY_TOPIC = Column(
    "retry_topic", pa.string(), "The original topic, kept across retries (RETRY_TOPIC)."
)
ATTEMPTS = Column(
    "attempts", pa.list_(ATTEMPT), "Every failed attempt so far, oldest first (B4, B6)."
)

# -- the consume result ------------------------------------------------------
RESULT_ID = Column("result_id", pa.string(), "Unique id of the consume-result event.")
CONSUMER_GROUP = Column("consumer_group", pa.string(), "Consumer group G.")
CONSUMER_ID = Column("consumer_id", pa.string(), "Client id of the consumer instance.")
MESSAGE_MODEL = Column(
    "message_model", pa.string(), "CLUSTERING (default when null) or BROADCASTING."
)
STATUS = Column(
    "status", pa.string(), "CONSUME_SUCCESS, RECONSUME_LATER, EXCEPTION, or null (= failure, R1)."
)
DELAY_LEVEL_WHEN_NEXT_CONSUME = Column(
    "delay_level_when_next_consume",
    pa.int32(),
    "Requested level: >0 use it, 0/null broker picks, <0 DLQ (R5).",
)
MAX_RECONSUME_TIMES = Column(
    "max_reconsume_times", pa.int32(), "Consumer's attempt limit; null or -1 = group's (R6)."
)
ERROR_CLASS = Column("error_class", pa.string(), "Exception class of the failure, if any.")
ERROR_MESSAGE = Column("error_message", pa.string(), "Exception message of the failure, if any.")
CONSUMED_AT = Column("consumed_at", TS, "When the consumer finished the attempt.")

# -- engine output -----------------------------------------------------------
DELAY_LEVEL = Column("delay_level", pa.int32(), "Delay level used (after clamping), 1-based.")
SCHEDULE_QUEUE_ID = Column(
    "schedule_queue_id", pa.int32(), "Schedule-stage queue, level - 1 (SCHEDULE_TOPIC_XXXX)."
)
SCHEDULED_AT = Column(
    "scheduled_at", TS, "When the engine stored the retry in the schedule stage (store time)."
)
DUE_AT = Column("due_at", TS, "Earliest delivery time: scheduled_at + delay(level).")
DELIVERED_AT = Column(
    "delivered_at", TS, "Micro-batch time at which the retry was released to %RETRY%G."
)
DEAD_LETTERED_AT = Column(
    "dead_lettered_at", TS, "Micro-batch time at which the message was dead-lettered."
)
DELIVERY_KEY = Column(
    "delivery_key",
    pa.string(),
    "origin_msg_id:reconsume_times (then :r<n> once re-driven n times), stable de-duplication key (R14).",
    False,
)
SOURCE_RESULT_ID = Column(
    "source_result_id", pa.string(), "result_id of the consume result that caused this row."
)
OUTCOME = Column(
    "outcome",
    pa.string(),
    "acknowledged, retry, dead_letter, dropped, duplicate or quarantined.",
    False,
)
REASON_CODE = Column(
    "reason_code", pa.string(), "Stable code of why (e.g. MAX_RECONSUME_TIMES, UNKNOWN_STATUS)."
)
REASON = Column("reason", pa.string(), "Human-readable reason naming the bad value.")
OUTPUT_MSG_ID = Column(
    "output_msg_id", pa.string(), "msg_id of the retry or dead letter this result produced."
)
BATCH_ID = Column("batch_id", pa.int64(), "Micro-batch that decided this row.", False)
DECIDED_AT = Column("decided_at", TS, "Micro-batch time of the decision.", False)
SOURCE_POSITION = Column(
    "source_position", pa.string(), "Position of the input row in the consume-result table."
)
RAW = Column(
    "raw",
    pa.string(),
    "The input row as JSON, exactly as read (binary as base64; a body over the limit as its first 1 KiB and size); "
    "for STATE_UNREADABLE, a part of the unreadable schedule state (JSON, bytes in base64).",
)
QUARANTINED_AT = Column("quarantined_at", TS, "Micro-batch time of quarantine.", False)

# -- engine metrics (B7) --------------------------------------------------------
BATCH_TIME = Column(
    "batch_time", TS, "Micro-batch timestamp (Spark's clock for that batch).", False
)
METRIC = Column(
    "metric",
    pa.string(),
    "What the row measures: an outcome count (acknowledged, retry, dead_letter, dropped, duplicate, "
    "quarantined), 'delivered' (retries released to %RETRY%G) or a lateness statistic of those deliveries.",
    False,
)
VALUE = Column(
    "value", pa.float64(), "The measured value (a count, or milliseconds for lateness).", False
)

# -- query progress (B7): one row per StreamingQueryListener event ------------
QUERY_ID = Column(
    "query_id", pa.string(), "Streaming query id (stable across restarts of one checkpoint).", False
)
RUN_ID = Column("run_id", pa.string(), "Id of this run of the query (new on every start).", False)
QUERY_NAME = Column("query_name", pa.string(), "Name the query was started with.")
EVENT = Column(
    "event", pa.string(), "Listener event: started, progress, idle or terminated.", False
)
EVENT_TIME = Column(
    "event_time", TS, "When the event happened (progress: when the trigger started).", False
)
RECORDED_AT = Column(
    "recorded_at", TS, "When the listener received the event (driver wall clock).", False
)
BATCH_DURATION_MS = Column("batch_duration_ms", pa.int64(), "Wall time of the micro-batch, ms.")
DURATION_MS = Column(
    "duration_ms",
    pa.map_(pa.string(), pa.int64()),
    "The batch's time by phase (Spark durationMs: addBatch, latestOffset, queryPlanning, walCommit, ...).",
)
NUM_INPUT_ROWS = Column(
    "num_input_rows",
    pa.int64(),
    "Consume results read by the micro-batch (the engine's count; Spark's numInputRows counts packed source rows).",
)
INPUT_ROWS_PER_SECOND = Column(
    "input_rows_per_second",
    pa.float64(),
    "Arrival rate Spark reports for the batch, scaled to num_input_rows.",
)
PROCESSED_ROWS_PER_SECOND = Column(
    "processed_rows_per_second",
    pa.float64(),
    "Processing rate Spark reports for the batch, scaled to num_input_rows.",
)
STATE_ROWS_TOTAL = Column(
    "state_rows_total",
    pa.int64(),
    "Rows in the state stores after the batch (all stateful operators).",
)
STATE_ROWS_UPDATED = Column("state_rows_updated", pa.int64(), "State rows written by the batch.")
STATE_ROWS_REMOVED = Column("state_rows_removed", pa.int64(), "State rows removed by the batch.")
STATE_MEMORY_BYTES = Column(
    "state_memory_bytes", pa.int64(), "Memory the state stores use after the batch, bytes."
)
SOURCE_END_OFFSET = Column(
    "source_end_offset",
    pa.string(),
    "End offset of the (first) source, as Spark reports it (JSON).",
)
EXCEPTION = Column(
    "exception", pa.string(), "Why the query terminated, if it failed (terminated events only)."
)
ERROR_CLASS_ON_EXCEPTION = Column(
    "error_class_on_exception", pa.string(), "Spark's error class of that exception, if any."
)
STOP_REASON = REASON.variant(
    doc="Why the query terminated (terminated events only): stopped (on request: a signal, engine.stop, the "
    "API), finished (run --once done), failed (died with an exception) or lease_lost (another engine took the "
    "lake over); null for other events and for rows written before the column existed."
)

# -- internal: rows between the decision step and the writers ------------------
KIND = Column(
    "kind",
    pa.string(),
    "outcome (one per input row), delivery (a retry released) or state_quarantine (an unreadable schedule state "
    "moved aside).",
    False,
)
ROUTE = Column(
    "route",
    pa.string(),
    "State key part 1: the consumer group ('' when unknown), '#nn' appended for its state sub-key.",
    False,
)
BUCKET = Column(
    "bucket",
    pa.int64(),
    "State key part 2: floor(store time / state bucket); int64 min (NO_STATE_BUCKET) = no state.",
    False,
)
CONSUMED_MSG_ID = Column("consumed_msg_id", pa.string(), "msg_id of the consumed message.")
CONSUMED_ORIGIN_MSG_ID = Column(
    "consumed_origin_msg_id", pa.string(), "origin_msg_id of the consumed message."
)
CONSUMED_RECONSUME_TIMES = Column(
    "consumed_reconsume_times", pa.int32(), "reconsume_times of the consumed message."
)

# -- DLQ re-drive audit (B5) -----------------------------------------------------
REDRIVE_ID = Column(
    "redrive_id",
    pa.string(),
    "Id of the re-drive: one named selection, resumable, idempotent.",
    False,
)
CHUNK = Column(
    "chunk", pa.int64(), "Chunk of the re-drive; also its Delta app-transaction version.", False
)
OPERATOR = Column("operator", pa.string(), "Who ran the re-drive (user name or --operator).")
NOTE = Column(
    "note", pa.string(), "Why, as the operator wrote it (a resolution's required reason)."
)
SELECTION = Column("selection", pa.string(), "The filter that selected the dead letters, as JSON.")
REDRIVE_TARGET = Column(
    "target",
    pa.string(),
    "Where the message went: topic (its original topic) or retry (%RETRY%G); resolve or purge for a resolution.",
    False,
)
DLQ_MSG_ID = Column("dlq_msg_id", pa.string(), "msg_id of the dead letter re-driven.", False)
REDRIVEN_MSG_ID = Column(
    "redriven_msg_id",
    pa.string(),
    "msg_id of the new message written to the target (a resolution: the dead letter's).",
    False,
)
TARGET_TABLE = Column(
    "target_table",
    pa.string(),
    "Table the new message was appended to (messages or retry; redrive_audit for a resolution).",
    False,
)
RESET_RECONSUME_TIMES = Column(
    "reset_reconsume_times", pa.bool_(), "Whether the reconsume count was reset to 0.", False
)
REDRIVEN_AT = Column("redriven_at", TS, "When the chunk was planned (its audit commit).", False)

# -- re-drive tasks: runs, heartbeats and cancels of re-drives -------------------------
RUN_ID = Column(
    "run_id",
    pa.string(),
    "One run of a re-drive (a re-drive id can be run again to resume it).",
    False,
)
TASK_EVENT = Column(
    "event",
    pa.string(),
    "started, alive, finished, stopped (interrupted), cancel (asked) or cancelled (stopped for it).",
    False,
)
TASK_AT = Column("at", TS, "When the event was written (the writer's wall clock).", False)
TASK_MOVED = Column(
    "moved",
    pa.int64(),
    "Messages of the re-drive moved so far (all runs), when the event was written.",
)
TASK_TOTAL = Column(
    "total", pa.int64(), "Messages the re-drive had moved or planned to move when the run started."
)
DETAIL = Column(
    "detail", pa.string(), "Why: the cancel's reason, or the error that stopped the run."
)
HOST = Column("host", pa.string(), "Host and process id of the run (where to look for it).")
