"""Consuming topic tables with RocketMQ's push-consumer semantics, as a Spark stream.

A :class:`Consumer` of group G reads the messages table filtered to its
subscribed topics and, in CLUSTERING mode, the retry table filtered to G's
rows (RocketMQ's ``copySubscription`` subscribes every clustering consumer to
``%RETRY%G``). Each delivered row goes to the listener on the executors; what
the listener returns becomes one row of the consume-result table, which the
engine turns into retries, dead letters or recorded drops.

* R1: ``CONSUME_SUCCESS`` acknowledges; ``RECONSUME_LATER``, ``None`` and an
  exception are failures (written as ``RECONSUME_LATER``, null and
  ``EXCEPTION``).
* R11: a batch listener sets ``context.ack_index``; messages after it fail.
* R5/R6: the listener may set ``context.delay_level_when_next_consume`` and
  ``context.max_reconsume_times`` for the message (or the batch).
* R9: subscribing to a ``%DLQ%`` topic is refused.
* R12: results are committed with Delta's idempotent txn (app id = the
  checkpoint's query id, version = batch id), retried with backoff inside the
  batch, and finally the batch fails so Spark replays it on restart: exactly
  one consume result per delivered message.
* R14: every delivered message carries ``delivery_key`` =
  ``origin_msg_id:reconsume_times``, plus ``:r<n>`` once re-driven n times.

Pure parts (the listener calls, :func:`consume_batch`) need no Spark.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from retry_engine.config import EngineConfig
from retry_engine.decide import (
    BROADCASTING,
    CLUSTERING,
    MAX_RECONSUME_TIMES_DEFAULT,
    SUCCESS,
    truncate_error,
)
from retry_engine.delta import FORMAT_NAME, ensure_query_id, ensure_table
from retry_engine.dlq import redrive_count_column
from retry_engine.errors import ConsumeResultWriteError, SubscriptionError
from retry_engine.names import (
    delivery_key,
    is_dlq_topic,
    is_retry_topic,
    redrive_count,
    validate_group,
    validate_topic,
)
from retry_engine.schemas import CONSUME_RESULTS, MESSAGE_COLUMNS, MESSAGES, RETRY

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

CONSUME_SUCCESS = SUCCESS
RECONSUME_LATER = "RECONSUME_LATER"
EXCEPTION = "EXCEPTION"
ConsumeStatus = Literal["CONSUME_SUCCESS", "RECONSUME_LATER"]
MessageModel = Literal["CLUSTERING", "BROADCASTING"]
ConsumeFrom = Literal["earliest", "latest"]
MESSAGE_MODELS: tuple[MessageModel, ...] = (CLUSTERING, BROADCASTING)  # type: ignore[assignment]
LISTENER_STATUSES = (CONSUME_SUCCESS, RECONSUME_LATER)
DELIVERY_KEY = "delivery_key"
DEFAULT_TRIGGER_INTERVAL = "1 second"
# RocketMQ re-sends a failed send-back 5 s later; here the batch retries its write with backoff.
DEFAULT_WRITE_ATTEMPTS = 5
DEFAULT_WRITE_BACKOFF_SECONDS = 1.0
MESSAGE_NAMES = tuple(c.name for c in MESSAGE_COLUMNS)


def delivery_key_column() -> Column:
    """:func:`retry_engine.names.delivery_key` as a Spark expression over message columns (R14)."""
    from pyspark.sql import functions as F

    base = F.concat_ws(
        ":", F.coalesce(F.col("origin_msg_id"), F.col("msg_id")), F.coalesce(F.col("reconsume_times"), F.lit(0)).cast("string")
    )
    redrives = redrive_count_column()
    return F.when(redrives > 0, F.concat(base, F.lit(":r"), redrives.cast("string"))).otherwise(base)


# -- what the listener sees ---------------------------------------------------------


@dataclass(frozen=True)
class ReceivedMessage:
    """A delivered message, as RocketMQ's ``MessageExt`` after the client resets the retry topic.

    ``topic`` is the original topic even for a retry (RocketMQ's
    ``resetRetryAndNamespace``); ``delivered_topic`` is ``%RETRY%G`` then.
    ``delivery_key`` is stable across redeliveries of the same attempt (R14).
    """

    msg_id: str
    topic: str
    delivered_topic: str
    body: bytes
    tags: str | None
    keys: str | None
    properties: Mapping[str, str]
    flag: int
    born_timestamp: dt.datetime | None
    born_host: str | None
    store_timestamp: dt.datetime | None
    queue_id: int | None
    reconsume_times: int
    origin_msg_id: str
    delivery_key: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ReceivedMessage:
        origin = row["origin_msg_id"] or row["msg_id"]
        reconsume = row["reconsume_times"] or 0
        properties = dict(row["properties"] or ())
        return cls(
            msg_id=row["msg_id"],
            topic=row["retry_topic"] or row["topic"],
            delivered_topic=row["topic"],
            body=row["body"] or b"",
            tags=row["tags"],
            keys=row["keys"],
            properties=properties,
            flag=row["flag"] or 0,
            born_timestamp=row["born_timestamp"],
            born_host=row["born_host"],
            store_timestamp=row["store_timestamp"],
            queue_id=row["queue_id"],
            reconsume_times=reconsume,
            origin_msg_id=origin,
            delivery_key=row.get(DELIVERY_KEY) or delivery_key(origin, reconsume, redrive_count(properties)),
        )


@dataclass
class ConsumeContext:
    """What a listener may set (RocketMQ ``ConsumeConcurrentlyContext``).

    ``delay_level_when_next_consume``: > 0 that level, 0 the engine's choice,
    < 0 straight to the DLQ (R5). ``max_reconsume_times``: this message's
    attempt limit, None for the consumer's (R6). ``ack_index`` (batch
    listeners): messages up to this index succeeded, the rest failed; None
    means all of them (R11).
    """

    delay_level_when_next_consume: int = 0
    max_reconsume_times: int | None = None
    ack_index: int | None = None


MessageListener = Callable[[ReceivedMessage, ConsumeContext], Any]
BatchListener = Callable[[list[ReceivedMessage], ConsumeContext], Any]


@dataclass(frozen=True)
class _Outcome:
    status: str | None
    error_class: str | None = None
    error_message: str | None = None


def _call(listener: Callable[..., Any], arg: Any, context: ConsumeContext, *, where: str) -> _Outcome:
    """Run the listener; every return but CONSUME_SUCCESS and every exception is a failure (R1)."""
    try:
        returned = listener(arg, context)
    except Exception as exc:  # the listener's failure is data: recorded as EXCEPTION, then retried
        log.info("listener raised on %s: %s: %s", where, type(exc).__name__, exc)
        return _Outcome(EXCEPTION, _qualified(type(exc)), truncate_error(str(exc)))
    if returned is None:
        return _Outcome(None, None, "listener returned None")
    status = getattr(returned, "value", returned)
    if status in LISTENER_STATUSES:
        return _Outcome(str(status))
    return _Outcome(
        EXCEPTION,
        "InvalidConsumeStatus",
        truncate_error(f"listener returned {returned!r}; expected one of {', '.join(LISTENER_STATUSES)} or None"),
    )


def _qualified(cls: type) -> str:
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"




# -- one delivered Arrow batch -> consume results (pure, runs on executors) -----------


@dataclass(frozen=True)
class ListenerSpec:
    """The listener and everything written beside its verdicts."""

    group: str
    consumer_id: str
    app_id: str
    message_model: MessageModel
    max_reconsume_times: int
    on_message: MessageListener | None = None
    on_batch: BatchListener | None = None
    batch_size: int = 1


def result_id(app_id: str, msg_id: str) -> str:
    """Stable id of the result of delivering ``msg_id`` to this consumer: a replay repeats it."""
    return hashlib.sha1(f"{app_id}\0{msg_id}".encode()).hexdigest()[:32]


def consume_batch(batch: pa.RecordBatch, spec: ListenerSpec) -> pa.RecordBatch:
    """Deliver every row of ``batch`` to the listener; one consume-result row per row, in order.

    Replay: the listener runs again on the same rows (delivery is at least
    once, R14); the rows produced carry the same ``result_id``.
    """
    rows = batch.to_pylist()
    messages = [ReceivedMessage.from_row(r) for r in rows]
    outcomes: list[tuple[_Outcome, ConsumeContext]] = []
    if spec.on_message is not None:
        for m in messages:
            context = ConsumeContext()
            outcomes.append((_call(spec.on_message, m, context, where=f"message {m.msg_id}"), context))
    elif spec.on_batch is not None:
        for start in range(0, len(messages), spec.batch_size):
            chunk = messages[start : start + spec.batch_size]
            context = ConsumeContext()
            outcome = _call(spec.on_batch, chunk, context, where=f"batch of {len(chunk)} from {chunk[0].msg_id}")
            outcomes.extend(_ack(outcome, context, len(chunk)))
    else:
        raise SubscriptionError("no listener registered", code="NO_LISTENER")
    now = dt.datetime.now(dt.UTC)
    out = []
    for row, m, (outcome, context) in zip(rows, messages, outcomes, strict=True):
        limit = context.max_reconsume_times
        out.append({
            "result_id": result_id(spec.app_id, m.msg_id),
            "consumer_group": spec.group,
            "consumer_id": spec.consumer_id,
            "message_model": spec.message_model,
            "status": outcome.status,
            "delay_level_when_next_consume": context.delay_level_when_next_consume,
            "max_reconsume_times": spec.max_reconsume_times if limit is None else limit,
            "error_class": outcome.error_class,
            "error_message": outcome.error_message,
            "consumed_at": now,
            **{name: row[name] for name in MESSAGE_NAMES},
        })
    return pa.RecordBatch.from_pylist(out, schema=CONSUME_RESULTS.arrow_schema)


def _ack(outcome: _Outcome, context: ConsumeContext, size: int) -> list[tuple[_Outcome, ConsumeContext]]:
    """Per-message outcomes of a batch (RocketMQ ``processConsumeResult``, R11)."""
    if outcome.status != CONSUME_SUCCESS:
        return [(outcome, context)] * size
    ack = size - 1 if context.ack_index is None else min(context.ack_index, size - 1)
    failed = _Outcome(RECONSUME_LATER, None, f"after ack_index {ack} of a batch of {size}")
    return [(outcome if i <= ack else failed, context) for i in range(size)]


def _consume_partition(spec: ListenerSpec) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The ``mapInArrow`` function of the consumer; replayed like :func:`consume_batch`."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                yield consume_batch(batch, spec)

    return run


# -- writing results (driver) --------------------------------------------------------


@dataclass
class ResultWriter:
    """``foreachBatch`` function: commits one micro-batch of consume results exactly once.

    Each attempt is one Delta transaction tagged (``app_id``, batch id). A
    failed attempt is retried after ``backoff_seconds`` (doubling); after
    ``attempts`` failures :class:`ConsumeResultWriteError` fails the batch, and
    Spark replays it when the consumer restarts (R12). Replay: an already
    committed batch is skipped by the table's transaction check, so no result
    is written twice; the listener may run again for an uncommitted one.
    """

    path: str
    app_id: str
    _: KW_ONLY
    attempts: int = DEFAULT_WRITE_ATTEMPTS
    backoff_seconds: float = DEFAULT_WRITE_BACKOFF_SECONDS
    group: str = ""

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark import StorageLevel

        # Keep the listener's verdicts: a write retry must not ask the listener again.
        batch.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            if batch.isEmpty():
                return
            last: Exception | None = None
            for attempt in range(1, self.attempts + 1):
                try:
                    self.commit(batch, batch_id)
                    return
                except Exception as exc:  # any failure of the hand-back is retried, then re-raised
                    last = exc
                    log.warning(
                        "group %s batch %d: writing consume results, attempt %d/%d failed: %s",
                        self.group, batch_id, attempt, self.attempts, str(exc).splitlines()[0] if str(exc) else exc,
                    )
                    if attempt < self.attempts:
                        time.sleep(self.backoff_seconds * 2 ** (attempt - 1))
            raise ConsumeResultWriteError(
                f"group {self.group!r}: consume results of batch {batch_id} not written after {self.attempts} "
                f"attempt(s) to {self.path}; restart the consumer to replay the batch (nothing is lost): {last}"
            ) from last
        finally:
            batch.unpersist()

    def commit(self, batch: DataFrame, batch_id: int) -> None:
        """One write attempt; a transaction the table already has is skipped."""
        (
            batch.write.format(FORMAT_NAME)
            .mode("append")
            .option("path", self.path)
            .option("txnAppId", self.app_id)
            .option("txnVersion", str(batch_id))
            .save()
        )


# -- the consumer -----------------------------------------------------------------------


def parse_tags(expression: str) -> tuple[str, ...] | None:
    """RocketMQ's tag subscription: ``*`` (all, returns None) or ``TagA || TagB``."""
    if not isinstance(expression, str) or not expression.strip():
        raise SubscriptionError(f"tag expression {expression!r} must be '*' or 'TagA || TagB'", code="INVALID_TAGS")
    if expression.strip() == "*":
        return None
    tags = tuple(t.strip() for t in expression.split("||"))
    if any(not t for t in tags):
        raise SubscriptionError(f"tag expression {expression!r} has an empty tag", code="INVALID_TAGS")
    return tags


def default_consumer_id() -> str:
    """``host@pid``, like RocketMQ's client id ``ip@instanceName``."""
    return f"{socket.gethostname()}@{os.getpid()}"


@dataclass
class Consumer:
    """A push consumer of group ``group`` over the lake described by ``config``.

    ``subscribe`` topics, register one listener, then ``start`` the streaming
    query (the caller stops it). ``checkpoint`` defaults to a folder under
    ``<lake>/_checkpoints`` named by a hash of the group, model and
    ``instance_name`` (names never become paths).
    """

    spark: SparkSession
    config: EngineConfig
    _: KW_ONLY
    group: str
    message_model: MessageModel = "CLUSTERING"
    max_reconsume_times: int = MAX_RECONSUME_TIMES_DEFAULT
    consume_from: ConsumeFrom = "earliest"
    trigger_interval: str = DEFAULT_TRIGGER_INTERVAL
    max_files_per_trigger: int | None = None
    checkpoint: str | None = None
    instance_name: str = "DEFAULT"
    consumer_id: str = field(default_factory=default_consumer_id)
    write_attempts: int = DEFAULT_WRITE_ATTEMPTS
    write_backoff_seconds: float = DEFAULT_WRITE_BACKOFF_SECONDS
    _subscriptions: dict[str, tuple[str, ...] | None] = field(default_factory=dict, init=False, repr=False)
    _on_message: MessageListener | None = field(default=None, init=False, repr=False)
    _on_batch: BatchListener | None = field(default=None, init=False, repr=False)
    _batch_size: int = field(default=1, init=False, repr=False)

    def __post_init__(self) -> None:
        validate_group(self.group)
        if is_retry_topic(self.group) or is_dlq_topic(self.group):
            raise SubscriptionError(f"group name {self.group!r} may not start with %RETRY% or %DLQ%", code="INVALID_GROUP")
        if self.message_model not in MESSAGE_MODELS:
            raise SubscriptionError(
                f"message_model {self.message_model!r} is not one of {', '.join(MESSAGE_MODELS)}", code="INVALID_OPTION"
            )
        if self.consume_from not in ("earliest", "latest"):
            raise SubscriptionError(f"consume_from {self.consume_from!r} is not 'earliest' or 'latest'", code="INVALID_OPTION")
        limit = self.max_reconsume_times
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < MAX_RECONSUME_TIMES_DEFAULT:
            raise SubscriptionError(
                f"max_reconsume_times {limit!r} must be an int >= 0, or -1 for the group's", code="INVALID_OPTION"
            )
        if not isinstance(self.write_attempts, int) or self.write_attempts < 1:
            raise SubscriptionError(f"write_attempts {self.write_attempts!r} must be >= 1", code="INVALID_OPTION")

    # -- subscription ---------------------------------------------------------------

    def subscribe(self, topic: str, tags: str = "*") -> Consumer:
        """Subscribe to ``topic`` (tags ``*`` or ``A || B``). A DLQ is refused (R9)."""
        validate_topic(topic)
        if is_dlq_topic(topic):
            raise SubscriptionError(
                f"topic {topic!r} is a dead-letter queue: write-only for consumers (R9); "
                "read it as a table (an operator action) instead",
                code="DLQ_NOT_CONSUMABLE",
            )
        if is_retry_topic(topic):
            raise SubscriptionError(
                f"topic {topic!r} is a retry topic: a CLUSTERING consumer of the group reads it automatically",
                code="RETRY_TOPIC_NOT_SUBSCRIBABLE",
            )
        self._subscriptions[topic] = parse_tags(tags)
        return self

    @property
    def subscriptions(self) -> dict[str, tuple[str, ...] | None]:
        """Topic -> tags (None = all). CLUSTERING adds ``%RETRY%G`` at read time (not listed)."""
        return dict(self._subscriptions)

    @property
    def reads_retry(self) -> bool:
        """RocketMQ ``copySubscription``: only CLUSTERING consumers read ``%RETRY%G`` (R2)."""
        return self.message_model == CLUSTERING

    def register_message_listener(self, listener: MessageListener) -> Consumer:
        """One call per message: ``listener(message, context) -> status``."""
        self._check_listener(listener)
        self._on_message = listener
        return self

    def register_batch_listener(self, listener: BatchListener, *, batch_size: int) -> Consumer:
        """One call per up to ``batch_size`` messages (``consumeMessageBatchMaxSize``); ack index honoured."""
        self._check_listener(listener)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 1024:
            raise SubscriptionError(f"batch_size {batch_size!r} must be an int in 1..1024", code="INVALID_OPTION")
        self._on_batch, self._batch_size = listener, batch_size
        return self

    def _check_listener(self, listener: object) -> None:
        if not callable(listener):
            raise SubscriptionError(f"listener must be callable, got {type(listener).__name__}", code="INVALID_LISTENER")
        if self._on_message is not None or self._on_batch is not None:
            raise SubscriptionError("a listener is already registered; one per consumer", code="INVALID_LISTENER")

    # -- the stream ------------------------------------------------------------------

    @property
    def checkpoint_path(self) -> str:
        if self.checkpoint:
            return self.checkpoint
        digest = hashlib.sha1(f"{self.group}\0{self.message_model}\0{self.instance_name}".encode()).hexdigest()[:16]
        return os.path.join(self.config.engine.lake, "_checkpoints", f"consumer-{digest}")

    def _read(self, path: str) -> DataFrame:
        reader = self.spark.readStream.format(FORMAT_NAME).option("path", path)
        if self.max_files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", str(self.max_files_per_trigger))
        if self.consume_from == "latest":
            reader = reader.option("startingVersion", "latest")
        return reader.load()

    def deliveries(self) -> DataFrame:
        """The streaming DataFrame of delivered messages: message columns plus ``delivery_key``."""
        from pyspark.sql import functions as F

        if not self._subscriptions:
            raise SubscriptionError(f"group {self.group!r} has no subscription; call subscribe(topic) first", code="NO_SUBSCRIPTION")
        messages_path = self.config.table_path("messages")
        ensure_table(messages_path, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
        wanted = F.lit(False)
        for topic, tags in self._subscriptions.items():
            cond = F.col("topic") == F.lit(topic)
            if tags is not None:
                cond = cond & F.col("tags").isin(*tags)
            wanted = wanted | cond
        delivered = self._read(messages_path).filter(wanted).select(*MESSAGE_NAMES)
        if self.reads_retry:
            retry_path = self.config.table_path("retry")
            ensure_table(retry_path, RETRY.arrow_schema, partition_by=RETRY.partition_by)
            retries = self._read(retry_path).filter(F.col("consumer_group") == F.lit(self.group)).select(*MESSAGE_NAMES)
            delivered = delivered.unionByName(retries)
        return delivered.withColumn(DELIVERY_KEY, delivery_key_column())

    def result_writer(self) -> ResultWriter:
        """The default ``foreachBatch`` writer of this consumer (tied to its checkpoint)."""
        return ResultWriter(
            self.config.table_path("consume_results"),
            ensure_query_id(self.checkpoint_path),
            attempts=self.write_attempts,
            backoff_seconds=self.write_backoff_seconds,
            group=self.group,
        )

    def start(self, *, result_writer: ResultWriter | None = None) -> StreamingQuery:
        """Start consuming; returns the query (the caller stops it).

        Restarting with the same checkpoint resumes where the last committed
        batch ended and writes no result twice.
        """
        if self._on_message is None and self._on_batch is None:
            raise SubscriptionError(
                "register a listener first (register_message_listener or register_batch_listener)", code="NO_LISTENER"
            )
        results_path = self.config.table_path("consume_results")
        ensure_table(results_path, CONSUME_RESULTS.arrow_schema)
        writer = result_writer or self.result_writer()
        spec = ListenerSpec(
            group=self.group,
            consumer_id=self.consumer_id,
            app_id=writer.app_id,
            message_model=self.message_model,
            max_reconsume_times=self.max_reconsume_times,
            on_message=self._on_message,
            on_batch=self._on_batch,
            batch_size=self._batch_size,
        )
        results = self.deliveries().select(*MESSAGE_NAMES, DELIVERY_KEY).mapInArrow(
            _consume_partition(spec), CONSUME_RESULTS.spark_schema
        )
        query = (
            results.writeStream.queryName(f"consumer-{hashlib.sha1(self.checkpoint_path.encode()).hexdigest()[:12]}")
            .foreachBatch(writer)
            .option("checkpointLocation", self.checkpoint_path)
            .trigger(processingTime=self.trigger_interval)
            .start()
        )
        log.info(
            "consumer started: group %s (%s), topics %s, retry %s, checkpoint %s",
            self.group, self.message_model, sorted(self._subscriptions), self.reads_retry, self.checkpoint_path,
        )
        return query
