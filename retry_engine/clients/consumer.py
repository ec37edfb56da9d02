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
* Rebalance (RocketMQ ``AllocateMessageQueueAveragely``): CLUSTERING
  instances of one group heartbeat into the lake and each consumes only its
  share of every topic's queues and of ``%RETRY%G``'s queues
  (:mod:`retry_engine.clients.rebalance`); the share is decided at each micro-batch
  and recorded in the checkpoint, so a replay consumes the same rows. When an
  instance gains a queue it also delivers the queue's older rows that no
  instance of the group has a result for, and skips those that have one.
  BROADCASTING instances each consume everything.
* Resend (``dlq resend``, :mod:`retry_engine.ops.resend`): a ``%RETRY%G`` row
  marked for one instance (``RESEND_TO_CONSUMER``) is delivered by that
  instance only, whichever instance owns its queue, and never caught up.

Pure parts (the listener calls, :func:`consume_batch`) need no Spark.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.fs as pafs

from retry_engine.clients.dlq import redrive_count_column
from retry_engine.clients.producer import DEFAULT_QUEUE_NUMS
from retry_engine.clients.rebalance import (
    DEFAULT_HEARTBEAT_EXPIRY_SECONDS,
    DEFAULT_HEARTBEAT_INTERVAL_SECONDS,
    MEMBER_ID_CHARACTERS,
    UNREADABLE_RECORD,
    Assignment,
    Membership,
    TopicOffsets,
    Window,
    best_offsets,
    credible,
    plan_assignment,
    validate_member_id,
    window_bound,
)
from retry_engine.config import EngineConfig
from retry_engine.core import at_exit
from retry_engine.core.decide import (
    BROADCASTING,
    CLUSTERING,
    MAX_RECONSUME_TIMES_DEFAULT,
    SUCCESS,
    truncate_error,
)
from retry_engine.core.delays import parse_duration_ms
from retry_engine.core.names import (
    EXPIRING_TABLES,
    PROP_RESEND_MSG_ID,
    PROP_RESEND_TO,
    delivery_key,
    is_dlq_topic,
    is_retry_topic,
    named_like_a_topic,
    redrive_count,
    retry_topic,
    validate_group,
    validate_topic,
)
from retry_engine.core.resume import is_fresh, planned_ends
from retry_engine.delta import FORMAT_NAME, ensure_query_id, ensure_table, storage, table_version
from retry_engine.delta._checkpoint import checkpoint_folder, write_bytes_atomically
from retry_engine.delta._log import DeltaLog, relative_data_path
from retry_engine.delta._offsets import Offset
from retry_engine.delta.session import capped_arrow_batches, read_parallelism
from retry_engine.delta.tables import open_table
from retry_engine.errors import (
    ConsumeResultWriteError,
    DeltaSourceError,
    DurationError,
    SubscriptionError,
)
from retry_engine.ops.terms import RESEND_TARGET
from retry_engine.schemas import CONSUME_RESULTS, MESSAGE_COLUMNS, MESSAGES, RETRY

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, DataFrameReader, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)
# A side file of the checkpoint that cannot be read, or is not one this release writes.
_UNREADABLE_FILE: tuple[type[Exception], ...] = (OSError, *UNREADABLE_RECORD)

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
# How far a producer's clock may be ahead of the consumers': a rebalance window checks the consume
# results written from this long before the oldest message it checks (see _RebalancedBatch._consumed).
DEFAULT_CLOCK_SKEW_SECONDS = 3600.0
# What a rebalance reads of the group's consume results: the columns that say who consumed what.
_CONSUMED_COLUMNS = "msg_id string, consumer_group string, message_model string"
MESSAGE_NAMES = tuple(c.name for c in MESSAGE_COLUMNS)
# Internal column: each delivered row's position in its source table's stream (rebalance windows).
POSITION = "_delivery_position"
# Internal column: the queue set a row belongs to (its topic, or %RETRY%G for any row of the retry table).
QUEUE_SET = "_delivery_queue_set"
MAX_QUEUE_NUMS = 1024
# Assignments of the last batches kept in the checkpoint (a replay needs only the last two).
KEEP_ASSIGNMENTS = 20
# A catch-up after a published offset reads the log's commits since it, one file each: past this
# many it reads the whole table instead (an offset that old: a topic the group has had no row of).
MAX_CATCH_UP_COMMITS = 1000
# Offsets unchanged (no new commit to read) are still published this often: the group forgets a
# file not rewritten for a day (Membership.published), and this instance's is still true.
REPUBLISH_SECONDS = 3600.0


def delivery_key_column() -> Column:
    """:func:`retry_engine.core.names.delivery_key` as a Spark expression over message columns (R14)."""
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


def result_id(app_id: str, msg_id: str | bytes | None) -> str:
    """Stable id of the result of delivering ``msg_id`` to this consumer: a replay repeats it
    (``msg_id`` as its UTF-8 bytes too: the same id, also for bytes that are no UTF-8)."""
    raw = msg_id if isinstance(msg_id, bytes) else str(msg_id).encode()
    return hashlib.sha1(app_id.encode() + b"\0" + raw).hexdigest()[:32]


def consume_batch(batch: pa.RecordBatch, spec: ListenerSpec) -> pa.RecordBatch:
    """Deliver every row of ``batch`` to the listener; one consume-result row per row, in order.

    Replay: the listener runs again on the same rows (delivery is at least
    once, R14); the rows produced carry the same ``result_id``. A row Python
    cannot hold (a time past year 9999, text that is no UTF-8: another writer's)
    is not delivered: its result is an ``EXCEPTION`` (:data:`UNREADABLE`) asking for
    the DLQ, its message columns as read, which the engine quarantines or
    dead-letters; the other rows are delivered as usual.
    """
    messages = _received(batch)
    readable = [m for m in messages if isinstance(m, ReceivedMessage)]
    outcomes: list[tuple[_Outcome, ConsumeContext]] = []
    if spec.on_message is not None:
        for m in readable:
            context = ConsumeContext()
            outcomes.append((_call(spec.on_message, m, context, where=f"message {m.msg_id}"), context))
    elif spec.on_batch is not None:
        for start in range(0, len(readable), spec.batch_size):
            chunk = readable[start : start + spec.batch_size]
            context = ConsumeContext()
            outcome = _call(spec.on_batch, chunk, context, where=f"batch of {len(chunk)} from {chunk[0].msg_id}")
            outcomes.extend(_ack(outcome, context, len(chunk)))
    else:
        raise SubscriptionError("no listener registered", code="NO_LISTENER")
    delivered = iter(outcomes)
    verdicts = [
        next(delivered) if isinstance(m, ReceivedMessage) else (_Outcome(EXCEPTION, UNREADABLE, m), _TO_DLQ)
        for m in messages
    ]
    now = dt.datetime.now(dt.UTC)
    ids = batch.column("msg_id").cast(pa.binary()).to_pylist()
    results = {
        "result_id": [result_id(spec.app_id, i) for i in ids],
        "consumer_group": [spec.group] * batch.num_rows,
        "consumer_id": [spec.consumer_id] * batch.num_rows,
        "message_model": [spec.message_model] * batch.num_rows,
        "status": [outcome.status for outcome, _ in verdicts],
        "delay_level_when_next_consume": [context.delay_level_when_next_consume for _, context in verdicts],
        "max_reconsume_times": [
            spec.max_reconsume_times if context.max_reconsume_times is None else context.max_reconsume_times
            for _, context in verdicts
        ],
        "error_class": [outcome.error_class for outcome, _ in verdicts],
        "error_message": [outcome.error_message for outcome, _ in verdicts],
        "consumed_at": [now] * batch.num_rows,
    }
    # The message columns as read, not through Python: a value Python cannot hold is carried as it is.
    columns = [
        pa.array(results[f.name], f.type) if f.name in results else _as_type(batch.column(f.name), f.type)
        for f in CONSUME_RESULTS.arrow_schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=CONSUME_RESULTS.arrow_schema)


# The error class of a delivered row Python cannot hold; its result asks for the DLQ (R5: level -1).
UNREADABLE = "retry_engine.UnreadableMessage"
_TO_DLQ = ConsumeContext(delay_level_when_next_consume=-1)


def _received(batch: pa.RecordBatch) -> list[ReceivedMessage | str]:
    """Each row of ``batch`` as the listener gets it, or why it cannot be (row by row only then)."""
    try:
        return [ReceivedMessage.from_row(r) for r in batch.to_pylist()]
    except Exception:  # some row: find which, below
        pass
    received: list[ReceivedMessage | str] = []
    for i in range(batch.num_rows):
        try:
            received.append(ReceivedMessage.from_row(batch.slice(i, 1).to_pylist()[0]))
        except Exception as exc:
            received.append(truncate_error(f"the message cannot be read: {type(exc).__name__}: {exc}") or "unreadable")
    return received


def _utc_from_micros(micros: int) -> dt.datetime | None:
    """The UTC time ``micros`` after the epoch; None outside the years a datetime holds (Spark's hold more)."""
    try:
        return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    except OverflowError:
        return None


def _as_type(column: pa.Array, wanted: pa.DataType) -> pa.Array:
    return column if column.type == wanted else column.cast(wanted)


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
            .options(**storage.spark_options(self.path))
            .option("txnAppId", self.app_id)
            .option("txnVersion", str(batch_id))
            .save()
        )


# -- rebalance: this instance's share of the queues, per micro-batch (driver) ------------


def _queue_of(count: int) -> Column:
    """The queue a row belongs to among ``count``: a null or out-of-range ``queue_id`` still lands in one."""
    from pyspark.sql import functions as F

    return F.pmod(F.coalesce(F.col("queue_id"), F.lit(0)), F.lit(count))


@dataclass
class _RebalancedBatch:
    """``foreachBatch`` function of a consumer: picks this instance's rows, runs the listener, writes.

    CLUSTERING: the batch's :class:`~retry_engine.clients.rebalance.Assignment` is
    planned from the live heartbeats and written to the checkpoint before any
    row reaches the listener. Replay: the recorded assignment is read back,
    so the same rows (and the same caught-up rows, read at the recorded table
    versions) are consumed again; the writer skips a batch already committed.
    BROADCASTING: every row, no heartbeat.
    """

    spark: SparkSession
    group: str
    spec: ListenerSpec
    writer: ResultWriter
    membership: Membership | None
    queue_counts: dict[str, int]
    sources: dict[str, str]
    """topic -> path of the table its rows come from."""
    topic_filter: Callable[[str], Column]
    records: str
    results_path: str
    on_assignment: Callable[[Assignment], None] = lambda _: None
    clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    stream_start: dt.datetime | None = None
    """When a stream that consumes from the latest rows started (:func:`stream_start`); None: from the first."""
    checkpoint: str = ""
    """The query's checkpoint: its offsets log tells how far the stream has read each table."""
    tags: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    """topic -> the subscription's tags (None: every tag): published offsets are for those rows only."""
    publish_interval_seconds: float = DEFAULT_HEARTBEAT_INTERVAL_SECONDS
    audit_path: str = ""
    """The re-drive audit table (`dlq resend` records there whom it resent to); "" unknown."""
    vouches: bool = True
    """Whether this stream delivers from the first row (``consume_from="earliest"``), so may vouch for what
    it consumed; a stream from the latest rows never delivered what came before it."""
    _planned: bool = field(default=False, init=False, repr=False)
    _table_ids: dict[str, str] | None = field(default=None, init=False, repr=False)
    _unpublished: Assignment | None = field(default=None, init=False, repr=False)
    _latest: Assignment | None = field(default=None, init=False, repr=False)
    _publishing: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _published: tuple[float, dict[str, dict[int, int]]] = field(default=(0.0, {}), init=False, repr=False)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        from pyspark import StorageLevel

        if self.membership is None:
            self.writer(self._consume(batch), batch_id)
            return
        # Read several times (positions, owned rows, catch-up exclusions): read the files once.
        batch.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            assignment = self._assignment(batch, batch_id)
            self.on_assignment(assignment)
            self.writer(self._consume(self._rows(batch, assignment)), batch_id)
        finally:
            batch.unpersist()
        self._unpublished = assignment  # its results are committed: what it vouches for is true now
        if time.monotonic() - self._published[0] >= self.publish_interval_seconds:
            self.publish()

    # -- consumed offsets ---------------------------------------------------------------

    def publish(self) -> None:
        """Publish the consumed offsets of the last committed batch if they changed, or again once they
        are :data:`REPUBLISH_SECONDS` old (the heartbeat thread calls this too: an idle instance's
        file must not be forgotten): a gainer of these queues then catches up only what came after
        them. Never fails a batch: an offset not published only makes a gainer read further back."""
        with self._publishing:
            if self._unpublished is not None:
                self._latest, self._unpublished = self._unpublished, None
            # Nothing vouched for now (a lost record, other tags): what was published before is still true.
            through = (self._latest.consumed_through if self._latest is not None else {}) or self._published[1]
            if self.membership is None or not through:
                return
            if through == self._published[1] and time.monotonic() - self._published[0] < REPUBLISH_SECONDS:
                return
            try:
                keys = self._offset_keys()
                self.membership.publish({
                    topic: replace(keys[topic], through=dict(queues)) for topic, queues in through.items() if topic in keys
                })
            except Exception as exc:
                log.warning("group %s: could not publish consumed offsets: %s", self.group, exc)
                return
            self._published = (time.monotonic(), through)

    def group_starts(self) -> dict[str, int]:
        """Path -> the version the stream of a new checkpoint may start at: the group has a result for
        every row of the table's topics before it (published offsets of each of their queues, the
        lowest, plus one); RocketMQ's new instance of a group also resumes at the group's offsets.

        A table some queue of which has no published offset, or one past the latest version, or
        that a stream could not read from there (:meth:`_streamable`), is not in it (the stream
        reads its snapshot, and the windows skip what the group consumed). Never past the latest
        version (a start there reads that commit again: consumed rows are skipped by the windows).
        %RETRY%G's table only if no `dlq resend` ever named this instance (:meth:`_resent_to_me`): a
        row resent to it is in no offset, and only its own stream delivers it. Never fails a
        start: nothing known is read from the first row.
        """
        if self.membership is None:
            return {}
        retry = retry_topic(self.group)
        try:
            logs = {path: DeltaLog(storage.location(path)) for path in set(self.sources.values())}
            latest = {path: delta_log.latest_version() for path, delta_log in logs.items()}
            by_topic = {topic: latest[path] for topic, path in self.sources.items()}
            published = credible(self._published_offsets(), by_topic, by_topic)
            starts = {}
            for path, delta_log in sorted(logs.items()):
                bounds = [published.get(t, {}).get(q) for t, p in self.sources.items() if p == path
                          for q in range(self.queue_counts.get(t, 0))]
                if not bounds or None in bounds:
                    continue
                start = min(min(b for b in bounds if b is not None) + 1, latest[path])
                if start > 0 and self._streamable(delta_log, start, latest[path], ignore_deletes=True):
                    starts[path] = start
            # After the retry table's latest version was read: a resend's audit row commits before its
            # retry row, so one whose row is at or before that version is seen here.
            if self.sources.get(retry) in starts and self._resent_to_me():
                del starts[self.sources[retry]]
        except Exception as exc:
            log.warning("group %s: published offsets unreadable (%s); the new stream reads from the first row", self.group, exc)
            return {}
        if starts:
            log.info("group %s: a new checkpoint starts after the group's published offsets: %s", self.group, starts)
        return starts

    def _published_offsets(self) -> dict[str, dict[int, int]]:
        """Topic -> queue -> the furthest offset the group published for this instance's rows (:func:`best_offsets`)."""
        assert self.membership is not None  # only called for CLUSTERING; not an input check
        return best_offsets(self.membership.published(), self._offset_keys())

    def _resent_to_me(self) -> bool:
        """Whether the re-drive audit holds a `dlq resend` of this group to this instance (or one it cannot
        read as another's); True when there is no audit table path to look in."""
        if not self.audit_path:
            return True
        table = open_table(self.audit_path)
        if table is None:
            return False
        rows = table.to_pyarrow_table(columns=["target", "consumer_group", "selection"]).to_pylist()
        assert self.membership is not None  # only called for CLUSTERING; not an input check
        for row in rows:
            if row["target"] != RESEND_TARGET or row["consumer_group"] != self.group:
                continue
            try:
                named = json.loads(row["selection"]).get("consumer_id")
            except (TypeError, ValueError, AttributeError):
                return True
            if named == self.membership.member or not isinstance(named, str):
                return True
        return False

    @staticmethod
    def _streamable(delta_log: DeltaLog, start: int, latest: int, *, ignore_deletes: bool = False) -> bool:
        """Whether a stream can start at commit ``start``: not too far back to check, every commit since
        in the log, none removing data (a stream cannot follow it; ``ignore_deletes``, as the consumer's
        streams: one that only removes, a row retention's, is skipped), and every file they added still
        in the table (a file compacted away since may be vacuumed: the stream could not read it)."""
        if latest - start > MAX_CATCH_UP_COMMITS:
            return False
        current = {relative_data_path(e.path, delta_log.uri) for e in delta_log.snapshot(latest)}
        for version in range(start, latest + 1):
            commit = delta_log.commit(version)
            if commit is None or (commit.removes and not (ignore_deletes and not commit.adds)):
                return False
            if any(relative_data_path(str(add["path"]), delta_log.uri) not in current for add in commit.adds):
                return False
        return True

    def _source_table_ids(self) -> dict[str, str]:
        """Path -> Delta table id of each table a topic is read from (a table re-created at its path is
        another table: the stream itself then stops, so the ids of the first batch hold)."""
        if self._table_ids is None:
            ids = {}
            for path in set(self.sources.values()):
                table = open_table(path)
                if table is not None:
                    ids[path] = str(table.metadata().id)
            self._table_ids = ids
        return self._table_ids

    def _offset_keys(self) -> dict[str, TopicOffsets]:
        """Topic -> what an offset of it must be for (table, queue count, tags) to be this instance's."""
        ids = self._source_table_ids()
        return {
            topic: TopicOffsets(ids[path], self.queue_counts[topic], self.tags.get(topic), {})
            for topic, path in self.sources.items() if path in ids and topic in self.queue_counts
        }

    def _stream_through(self, batch_id: int) -> dict[str, int] | None:
        """Topic -> the version through which this stream has delivered every row of the topic's table once
        ``batch_id`` is done (Spark's offsets log of the batch); -1 inside a first snapshot or unknown.
        None for a stream from the latest rows: it never delivered what came before it."""
        if self.stream_start is not None or not self.vouches:
            return None
        through: dict[str, int] = {}
        try:
            ends = planned_ends(self.checkpoint, batch_id) if self.checkpoint else []
            ids = self._source_table_ids()
        except (OSError, ValueError) as exc:
            log.info("group %s batch %d: stream offsets unreadable (%s); vouching for nothing new", self.group, batch_id, exc)
            return through
        for end in ends:
            try:
                offset = Offset.from_json(end) if end is not None else None
            except DeltaSourceError:
                offset = None
            paths = [p for p, table in ids.items() if offset is not None and table == offset.reservoir_id]
            if offset is None or len(paths) != 1:
                continue
            version = -1 if offset.is_starting_version else offset.version - 1
            for topic, path in self.sources.items():
                if path == paths[0]:
                    through[topic] = max(version, through.get(topic, -1))
        return through

    # -- planning -----------------------------------------------------------------

    def _record_path(self, batch_id: int) -> str:
        return os.path.join(self.records, f"{batch_id}.json")

    def _load(self, batch_id: int) -> Assignment | None:
        """The recorded assignment of ``batch_id``, to replay; None if there is none or it does not fit
        this consumer.

        A record for other topics or queue counts (the subscription changed
        between a failed batch and its replay) is planned anew: replaying it
        would skip the new topic's rows of that batch for good.
        """
        recorded = self._read_record(batch_id)
        if recorded is not None and recorded.queue_counts != dict(sorted(self.queue_counts.items())):
            log.warning("group %s: assignment record of batch %d is for queues %s, not %s; planning anew",
                        self.group, batch_id, recorded.queue_counts, self.queue_counts)
            return None
        return recorded

    def _previous(self, batch_id: int) -> Assignment | None:
        """The recorded assignment of ``batch_id`` as the batch after it goes on from: with the subscription
        changed since (a restart), its topics whose queue count is the same, so queues gained in them are
        still caught up (a record dropped whole caught up none: rows this stream passed while another
        instance owned them were consumed by nobody)."""
        recorded = self._read_record(batch_id)
        if recorded is None:
            return None
        same = [t for t, n in recorded.queue_counts.items() if self.queue_counts.get(t) == n]
        return recorded if len(same) == len(recorded.queue_counts) else recorded.of_topics(same)

    def _read_record(self, batch_id: int) -> Assignment | None:
        path = self._record_path(batch_id)
        try:
            with open(path) as f:
                recorded = Assignment.from_json(json.load(f))
        except FileNotFoundError:
            return None
        except _UNREADABLE_FILE as exc:
            log.warning("group %s: unreadable assignment record %s (%s); planning batch %d anew",
                        self.group, path, exc, batch_id)
            return None
        if recorded.batch_id != batch_id:
            log.warning("group %s: assignment record %s is of batch %d; planning batch %d anew",
                        self.group, path, recorded.batch_id, batch_id)
            return None
        return recorded

    def _save(self, assignment: Assignment) -> None:
        os.makedirs(self.records, exist_ok=True)
        tmp = self._record_path(assignment.batch_id) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(assignment.to_json(), f)
        os.replace(tmp, self._record_path(assignment.batch_id))
        for name in os.listdir(self.records):
            stem = name.removesuffix(".json")
            if stem.isdigit() and int(stem) < assignment.batch_id - KEEP_ASSIGNMENTS:
                os.remove(os.path.join(self.records, name))

    def _assignment(self, batch: DataFrame, batch_id: int) -> Assignment:
        recorded = self._load(batch_id)
        if recorded is not None:
            log.info("group %s batch %d: replaying recorded assignment %s", self.group, batch_id, recorded.owned)
            streamed = self._stream_through(batch_id)
            if recorded.consumed_through and streamed != recorded.streamed:
                # Spark's offsets of the batch are not those it was planned on (the checkpoint was edited):
                # what the record vouches for may not be what this replay reads.
                log.warning("group %s batch %d: the stream's offsets changed since the batch was planned (%s, now %s); "
                            "its replay vouches for nothing", self.group, batch_id, recorded.streamed, streamed)
                recorded = replace(recorded, consumed_through={})
            return recorded
        assert self.membership is not None  # only called for CLUSTERING; not an input check
        members = self.membership.live()
        versions = self._versions()
        previous = self._previous(batch_id - 1)
        streamed = self._stream_through(batch_id)
        plan = functools.partial(
            plan_assignment,
            batch_id=batch_id,
            members=members,
            me=self.membership.member,
            queue_counts=self.queue_counts,
            versions=versions,
            previous=previous,
            carried_windows=previous.windows if previous is not None else (),
            restarted=not self._planned,
            stream_through=streamed,
            tags=self.tags,
        )
        planned = plan()
        if planned.catch_up:  # queues gained: where the group's published offsets let the catch-up start
            try:
                published = self._published_offsets()
                latest = self._versions()
            except Exception as exc:
                log.warning("group %s: published offsets unreadable (%s); catching up whole tables", self.group, exc)
                published, latest = {}, versions
            planned = plan(published=credible(published, versions, latest))
        self._planned = True
        assignment = replace(planned, windows=self._open_windows(batch, planned.windows))
        self._save(assignment)
        if previous is None or previous.owned != assignment.owned:
            log.info(
                "group %s batch %d: %s of live %s owns %s (catch-up %s)",
                self.group, batch_id, self.membership.member, list(assignment.members), assignment.owned,
                assignment.catch_up,
            )
        return assignment

    def _versions(self) -> dict[str, int]:
        """Topic -> the latest version of the table its rows come from (each table opened once: the
        subscribed topics share the messages table)."""
        by_path = {path: table_version(path) or 0 for path in set(self.sources.values())}
        return {topic: by_path[path] for topic, path in self.sources.items()}

    def _open_windows(self, batch: DataFrame, windows: tuple[Window, ...]) -> tuple[Window, ...]:
        """Drop the windows this batch's stream is already past (positions only grow)."""
        from pyspark.sql import functions as F

        if not windows:
            return windows
        retry = retry_topic(self.group)
        lowest = {
            bool(r["is_retry"]): r["lowest"]
            for r in batch.groupBy((F.col(QUEUE_SET) == F.lit(retry)).alias("is_retry"))
            .agg(F.min(POSITION).alias("lowest"))
            .collect()
        }
        return tuple(
            w for w in windows
            if lowest.get(w.topic == retry) is None or lowest[w.topic == retry] < window_bound(w.through_version)
        )

    # -- rows -----------------------------------------------------------------------

    def _in(self, topic: str, queues: tuple[int, ...], *, column: str = QUEUE_SET) -> Column:
        from pyspark.sql import functions as F

        return (F.col(column) == F.lit(topic)) & _queue_of(self.queue_counts[topic]).isin(list(queues))

    def _snapshot(self, path: str, version: int | None = None) -> DataFrame:
        """The table at ``version`` (default: latest) as a batch DataFrame."""
        return self._reader(path, version).load()

    def _reader(self, path: str, version: int | None = None) -> DataFrameReader:
        reader = (
            self.spark.read.format(FORMAT_NAME)
            .option("path", path)
            .options(**storage.spark_options(path))
            .option("readPartitions", read_parallelism(self.spark))
        )
        if version is not None:
            reader = reader.option("versionAsOf", str(version))
        return reader

    def _consumed(self, since: dt.datetime | None) -> DataFrame:
        """msg ids the group already has a CLUSTERING result for (read when the plan runs).

        Only the columns that say so are read, and with ``since`` only the files
        whose statistics may hold a result consumed at or after it. A result
        missed that way can only make a message delivered twice, never lost.
        """
        from pyspark.sql import functions as F

        reader = self._reader(self.results_path).schema(_CONSUMED_COLUMNS)
        if since is not None:
            reader = reader.option("pruneColumn", "consumed_at").option("pruneBefore", since.isoformat())
        results = reader.load()
        model = F.coalesce(F.col("message_model"), F.lit(CLUSTERING))
        return (
            results.filter((F.col("consumer_group") == F.lit(self.group)) & (model == F.lit(CLUSTERING)))
            .select("msg_id")
            .distinct()
        )

    def _resent(self) -> Column:
        """Rows of %RETRY%G that ``dlq resend`` wrote for one instance (see retry_engine.ops.resend).

        Only the resent row itself: its retries copy the properties but not its id.
        """
        from pyspark.sql import functions as F

        properties = F.col("properties")
        resent = (
            (F.col(QUEUE_SET) == F.lit(retry_topic(self.group)))
            & properties[PROP_RESEND_TO].isNotNull()
            & (F.col("msg_id") == properties[PROP_RESEND_MSG_ID])
        )
        return F.coalesce(resent, F.lit(False))

    def _rows(self, batch: DataFrame, assignment: Assignment) -> DataFrame:
        from pyspark.sql import functions as F

        assert self.membership is not None  # only called for CLUSTERING; not an input check
        owned = F.lit(False)
        for topic, queues in assignment.owned.items():
            if queues:
                owned = owned | self._in(topic, queues)
        # A resent row goes to the instance it names, whoever owns its queue; the others skip it.
        to_me = F.coalesce(F.col("properties")[PROP_RESEND_TO] == F.lit(self.membership.member), F.lit(False))
        rows = batch.filter((owned & ~self._resent()) | (self._resent() & to_me))
        inside = F.lit(False)
        for w in assignment.windows:
            inside = inside | (self._in(w.topic, w.queues) & (F.col(POSITION) < F.lit(window_bound(w.through_version))))
        inside = F.coalesce(inside, F.lit(False))
        checked = rows.filter(inside) if assignment.windows else None
        caught, whole = self._catch_up_rows(assignment) if assignment.catch_up else (None, False)
        # The results that may say a checked or caught-up row was consumed: those since the oldest of them
        # was stored (nothing to read if there is none). A catch-up that read a whole table (rows of any age
        # since the stream started, any age for a stream from the first rows): every result since then.
        if whole:
            consumed: DataFrame | None = self._consumed(self._skewed(self.stream_start, 2))
        else:
            found, since = self._stored_since(*[d for d in (checked, caught) if d is not None])
            consumed = self._consumed(since) if found else None
        if checked is not None and consumed is not None:
            rows = rows.filter(~inside).unionByName(checked.join(consumed, "msg_id", "left_anti"))
        rows = rows.drop(POSITION, QUEUE_SET)
        if caught is not None and consumed is not None:
            rows = rows.unionByName(self._catch_up(batch, caught, consumed))
        return rows

    def _skewed(self, at: dt.datetime | None, times: int = 1) -> dt.datetime | None:
        """``at`` less ``times`` clock skews; None for None, or before the first time a datetime holds."""
        try:
            return None if at is None else at - times * dt.timedelta(seconds=self.clock_skew_seconds)
        except OverflowError:
            return None

    def _stored_since(self, *frames: DataFrame) -> tuple[bool, dt.datetime | None]:
        """Whether ``frames`` have rows, and the time from which their consume results can be.

        A result is written after its message was stored: the oldest
        ``store_timestamp`` (never later than now), less ``clock_skew_seconds``
        for a producer whose clock runs ahead. None (every file) if a row has
        no time, or none Spark reads as one (a table another writer made).
        """
        from pyspark.sql import functions as F

        if not frames:
            return False, None
        # One Spark job for all of them: each frame's time as a timestamp (text another writer made too).
        times = [frame.select(F.col("store_timestamp").try_cast("timestamp").alias("at")) for frame in frames]
        together = functools.reduce(lambda a, b: a.unionByName(b), times)
        row = together.agg(
            F.count(F.lit(1)).alias("rows"), F.count("at").alias("timed"), F.unix_micros(F.min("at")).alias("oldest")
        ).first()
        if row is None or not row["rows"]:
            return False, None
        if row["timed"] < row["rows"]:
            return True, None
        oldest = _utc_from_micros(row["oldest"])
        return True, None if oldest is None else self._skewed(min(oldest, dt.datetime.now(dt.UTC)))

    def _catch_up_rows(self, assignment: Assignment) -> tuple[DataFrame | None, bool]:
        """Rows of the gained queues as of the recorded versions (none to read: None), and whether a
        table was read whole rather than after a published offset (``catch_up_after``).

        A stream that consumes from the latest rows never passed the rows stored before it started:
        those are not caught up either (a row stored up to ``clock_skew_seconds`` before may be).
        """
        from pyspark.sql import functions as F

        since = self._skewed(self.stream_start)
        parts, whole = [], False
        for topic, queues in sorted(assignment.catch_up.items()):
            path, version = self.sources[topic], assignment.catch_up_versions[topic]
            after = assignment.catch_up_after.get(topic)
            if after is not None and after >= version:
                continue  # the group consumed every row of these queues the table had then
            reader = self._reader(path, version)
            if after is not None and self._log_holds(path, after, version):
                reader = reader.option("addedAfterVersion", str(after))
            else:
                whole = True
            table = reader.load()
            if since is not None:  # a row without a time (or none Spark reads as one) is caught up
                stored = F.col("store_timestamp").try_cast("timestamp") >= F.lit(since)
                table = table.filter(F.coalesce(stored, F.lit(True)))
            tagged = table.filter(self.topic_filter(topic)).withColumn(QUEUE_SET, F.lit(topic))
            # A resent row is never caught up: its instance's own stream delivers it.
            parts.append(tagged.filter(self._in(topic, queues) & ~self._resent()).select(*MESSAGE_NAMES))
        if not parts:
            return None, False
        rows = parts[0]
        for part in parts[1:]:
            rows = rows.unionByName(part)
        return rows, whole

    def _log_holds(self, path: str, after: int, version: int) -> bool:
        """Whether the log of ``path`` still has (few enough) commits ``after + 1`` .. ``version`` to
        pick their files; the oldest goes first in a log cleanup."""
        if version - after > MAX_CATCH_UP_COMMITS:
            log.info("group %s: %s is %d commits past the published offset %d; catching up the whole table",
                     self.group, path, version - after, after)
            return False
        try:
            held = DeltaLog(storage.location(path)).commit(after + 1) is not None
        except Exception as exc:
            log.info("group %s: log of %s unreadable at commit %d (%s); catching up the whole table", self.group, path, after + 1, exc)
            return False
        if not held:
            log.info("group %s: commit %d of %s is gone from the log; catching up the whole table", self.group, after + 1, path)
        return held

    def _catch_up(self, batch: DataFrame, caught: DataFrame, consumed: DataFrame) -> DataFrame:
        """The caught-up rows (:meth:`_catch_up_rows`) no instance of the group consumed, not in this batch."""
        return (
            caught.join(consumed, "msg_id", "left_anti")
            .join(batch.select("msg_id"), "msg_id", "left_anti")
            .dropDuplicates(["msg_id"])
            .withColumn(DELIVERY_KEY, delivery_key_column())
            .select(*MESSAGE_NAMES, DELIVERY_KEY)
        )

    def _consume(self, rows: DataFrame) -> DataFrame:
        return rows.select(*MESSAGE_NAMES, DELIVERY_KEY).mapInArrow(_consume_partition(self.spec), CONSUME_RESULTS.spark_schema)


START_RECORD = "start.json"


def stream_start(checkpoint: str, consume_from: ConsumeFrom, now: dt.datetime | None = None) -> dt.datetime | None:
    """When the stream of ``checkpoint`` started, if it consumes from the latest rows; None: from the first.

    Written at the first start of a new checkpoint with ``consume_from='latest'``
    (``<checkpoint>/rebalance/start.json``, beside Spark's own files) and read at
    every later start, whatever ``consume_from`` says then (a restarted stream
    resumes where it was). A checkpoint an earlier release started has none (its
    rows are all caught up, as before); a damaged record, or one the checkpoint's
    file system cannot give, is logged and read as none (rows may be delivered
    again, none is lost).
    """
    try:
        fs, folder = checkpoint_folder(checkpoint, "rebalance")
        path = f"{folder}/{START_RECORD}"
        try:
            with fs.open_input_stream(path) as stream:
                text: str | None = stream.read().decode("utf-8")
        except FileNotFoundError:
            text = None
        if text is None:
            if consume_from != "latest" or not is_fresh(checkpoint):
                return None
            started = now or dt.datetime.now(dt.UTC)
            record = {"consume_from": "latest", "started_at": started.isoformat()}
            write_bytes_atomically(fs, path, json.dumps(record).encode("utf-8"))
            return started
        data = json.loads(text)
        if data["consume_from"] != "latest":
            return None
        started = dt.datetime.fromisoformat(data["started_at"])
        if started.tzinfo is None:
            raise ValueError(f"started_at {data['started_at']!r} has no zone")
        return started
    except _UNREADABLE_FILE as exc:
        log.warning("unreadable stream start record in %s (%s): every row of a gained queue is caught up", checkpoint, exc)
        return None


def spark_interval(value: str) -> str:
    """A trigger interval as Spark takes it: the engine's durations (``"500ms"``, ``"10s"``, as its config
    writes them) as milliseconds, anything else as given (Spark's own ``"1 second"``)."""
    try:
        return f"{parse_duration_ms(value)} milliseconds"
    except DurationError:
        return value


def records_folder(checkpoint: str) -> str:
    """The local folder of the per-batch assignments: ``<checkpoint>/rebalance`` (a ``file:`` URI as
    its path); of a checkpoint on another file system, that path as a local one (README: local files)."""
    try:
        fs, folder = checkpoint_folder(checkpoint, "rebalance")
    except (OSError, ValueError):  # a scheme pyarrow cannot open here (hdfs:// without libhdfs)
        return os.path.join(checkpoint, "rebalance")
    return folder if isinstance(fs, pafs.LocalFileSystem) else os.path.join(checkpoint, "rebalance")


class _Heartbeater:
    """Beats every ``interval`` seconds on a daemon thread while the query runs.

    Once the query has stopped (the caller stopped it, or it failed) the
    instance leaves the group, so its queues move to the others. ``publish``
    (the consumer offsets) runs after each beat and before leaving.
    """

    def __init__(self, membership: Membership, interval: float, publish: Callable[[], None] = lambda: None) -> None:
        self.membership = membership
        self.interval = interval
        self.publish = publish
        self.query: StreamingQuery | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{membership.member}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(self.interval, 1.0) * 2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                query = self.query
                if query is not None and not query.isActive:
                    log.info("consumer %s: query stopped; leaving group %s", self.membership.member, self.membership.group)
                    self.publish()
                    self.membership.leave()
                    return
                self.membership.beat()
                self.publish()
            except Exception as exc:  # a missed beat is retried next interval; the expiry allows several
                log.warning("consumer %s: heartbeat failed: %s", self.membership.member, exc)


# Consumers started in this process and not shut down, by id: what _left_at_exit lists at exit.
_RUNNING: dict[int, tuple[Consumer, StreamingQuery]] = {}
_RUNNING_LOCK = threading.Lock()


def _left_at_exit() -> list[at_exit.Ending]:
    """The consumers this process started and did not shut down, to shut down at exit.

    A script that ended after ``query.stop()``, or with its consumer running,
    stayed a member of its group (the heartbeat thread died with the process
    before it saw the query stop), so its queues waited for the heartbeat
    expiry (30 s) before the other instances took them; RocketMQ's broker sees
    a client's connection close and rebalances at once. At exit each query is
    stopped (a no-op if it was) and the instance leaves its group.
    """
    with _RUNNING_LOCK:
        running = list(_RUNNING.values())
    return [(consumer.member_id, functools.partial(consumer.shutdown, query)) for consumer, query in running]


at_exit.at_exit("consumer", _left_at_exit)


# -- the consumer -----------------------------------------------------------------------


def _sorted_tags(tags: tuple[str, ...] | None) -> tuple[str, ...] | None:
    return None if tags is None else tuple(sorted(set(tags)))


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
    """``host@pid``, like RocketMQ's client id ``ip@instanceName`` (odd host name characters become ``_``)."""
    host = re.sub(f"[^{MEMBER_ID_CHARACTERS}]", "_", socket.gethostname())[:200] or "host"
    return f"{host}@{os.getpid()}"


@dataclass
class Consumer:
    """A push consumer of group ``group`` over the lake described by ``config``.

    ``subscribe`` topics, register one listener, then ``start`` the streaming
    query (the caller stops it, best with ``shutdown(query)``). ``checkpoint``
    defaults to a folder under ``<lake>/_checkpoints`` named by a hash of the
    group, model and ``instance_name`` (names never become paths).

    CLUSTERING instances of a group share the queues (see
    :mod:`retry_engine.clients.rebalance`): each is ``consumer_id@instance_name``
    (give instances in one process distinct ``instance_name`` s), every topic
    has ``queue_nums`` queues, ``%RETRY%G`` the group's ``retry_queue_nums``;
    an instance is live while its last heartbeat (every
    ``heartbeat_interval_seconds``) is younger than ``heartbeat_expiry_seconds``.
    An instance that gains queues checks their rows against the group's
    consume results of the time since those rows were stored, less
    ``clock_skew_seconds`` (how far a producer's clock may run ahead of the
    consumers'; a result older than that is not looked at, so a row whose
    producer's clock ran further ahead may be consumed twice, never lost).
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
    queue_nums: int = DEFAULT_QUEUE_NUMS
    heartbeat_interval_seconds: float = DEFAULT_HEARTBEAT_INTERVAL_SECONDS
    heartbeat_expiry_seconds: float = DEFAULT_HEARTBEAT_EXPIRY_SECONDS
    clock_skew_seconds: float = DEFAULT_CLOCK_SKEW_SECONDS
    last_assignment: Assignment | None = field(default=None, init=False, repr=False)
    _heartbeater: _Heartbeater | None = field(default=None, init=False, repr=False)
    _batch_function: _RebalancedBatch | None = field(default=None, init=False, repr=False)
    _subscriptions: dict[str, tuple[str, ...] | None] = field(default_factory=dict, init=False, repr=False)
    _on_message: MessageListener | None = field(default=None, init=False, repr=False)
    _on_batch: BatchListener | None = field(default=None, init=False, repr=False)
    _batch_size: int = field(default=1, init=False, repr=False)

    def __post_init__(self) -> None:
        validate_group(self.group)
        if named_like_a_topic(self.group):
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
        if not isinstance(self.trigger_interval, str) or not self.trigger_interval.strip():
            raise SubscriptionError(
                f"trigger_interval {self.trigger_interval!r} must be a duration, e.g. '500ms' or '1 second'",
                code="INVALID_OPTION",
            )
        if not isinstance(self.write_attempts, int) or self.write_attempts < 1:
            raise SubscriptionError(f"write_attempts {self.write_attempts!r} must be >= 1", code="INVALID_OPTION")
        validate_member_id(self.consumer_id, what="consumer_id")
        validate_member_id(self.instance_name, what="instance_name")
        validate_member_id(self.member_id, what="consumer_id@instance_name")
        queues = self.queue_nums
        if isinstance(queues, bool) or not isinstance(queues, int) or not 1 <= queues <= MAX_QUEUE_NUMS:
            raise SubscriptionError(
                f"queue_nums {queues!r} must be an int in 1..{MAX_QUEUE_NUMS} (the topics' queue count)",
                code="INVALID_OPTION",
            )
        interval, expiry = self.heartbeat_interval_seconds, self.heartbeat_expiry_seconds
        for name, value in (("heartbeat_interval_seconds", interval), ("heartbeat_expiry_seconds", expiry)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise SubscriptionError(f"{name} {value!r} must be a positive number", code="INVALID_OPTION")
        skew = self.clock_skew_seconds
        if isinstance(skew, bool) or not isinstance(skew, int | float) or not 0 <= skew < float("inf"):
            raise SubscriptionError(f"clock_skew_seconds {skew!r} must be a number >= 0", code="INVALID_OPTION")
        if expiry <= interval:
            raise SubscriptionError(
                f"heartbeat_expiry_seconds {expiry!r} must be more than heartbeat_interval_seconds {interval!r}, "
                "or a live instance would look dead between two beats",
                code="INVALID_OPTION",
            )

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

    @property
    def member_id(self) -> str:
        """This instance among the group's (RocketMQ client id ``ip@instanceName``): ``consumer_id@instance_name``."""
        return f"{self.consumer_id}@{self.instance_name}"

    @property
    def membership(self) -> Membership:
        """The group's heartbeat registry, as this instance."""
        return Membership(self.config.engine.lake, self.group, self.member_id, self.heartbeat_expiry_seconds)

    def queue_counts(self) -> dict[str, int]:
        """Topic -> queue count: ``queue_nums`` per subscribed topic; the group's ``retry_queue_nums`` for ``%RETRY%G``."""
        counts = dict.fromkeys(self._subscriptions, self.queue_nums)
        if self.reads_retry:
            group = self.config.group(self.group)
            # A group that does not retry (retry_queue_nums <= 0, R10) may still have re-driven rows: one queue.
            counts[retry_topic(self.group)] = max(group.retry_queue_nums if group is not None else 1, 1)
        return counts

    def heartbeat(self) -> None:
        """Announce this CLUSTERING instance to its group now (``start`` does it too); BROADCASTING: nothing."""
        if self.message_model == CLUSTERING:
            self.membership.beat()

    def shutdown(self, query: StreamingQuery | None = None) -> None:
        """Stop ``query`` (if given) and leave the group: the other instances take its queues at their next batch."""
        with _RUNNING_LOCK:
            _RUNNING.pop(id(self), None)
        try:
            if query is not None:
                query.stop()
        finally:
            if self._heartbeater is not None:
                self._heartbeater.stop()
                self._heartbeater = None
            if self.message_model == CLUSTERING:
                if self._batch_function is not None:
                    self._batch_function.publish()  # RocketMQ persists its offsets on shutdown too
                self.membership.leave()

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
        if storage.is_remote(self.config.engine.lake) and self.config.engine.checkpoint:
            # A lake on object storage: Spark checkpoints stay on a Hadoop file system, next to the engine's.
            return os.path.join(os.path.dirname(self.config.engine.checkpoint.rstrip("/")), f"consumer-{digest}")
        return os.path.join(self.config.engine.lake, "_checkpoints", f"consumer-{digest}")

    def _read(
        self,
        path: str,
        *,
        expires_by: str,
        position: bool,
        starts: Mapping[str, int] | None = None,
        partitions: Mapping[str, Sequence[str]] | None = None,
    ) -> DataFrame:
        reader = (
            self.spark.readStream.format(FORMAT_NAME)
            .option("path", path)
            .options(**storage.spark_options(path))
            .option("readPartitions", read_parallelism(self.spark))
        )
        if partitions:
            # Only the files of the partitions this subscription reads (its topics; its group's retries):
            # a consumer of one of 1,000 groups read every group's retries to deliver its own. The rows
            # are still filtered (_topic_filter); the offsets are those of every file.
            reader = reader.option("partitionFilter", json.dumps({k: sorted(v) for k, v in partitions.items()}))
        if self.max_files_per_trigger is not None:
            reader = reader.option("maxFilesPerTrigger", str(self.max_files_per_trigger))
        # `[maintenance] messages_retention` / `retry_retention` remove old messages' files (RocketMQ's
        # commit log keeps them 72 h) in commits that only remove: the stream goes on past them.
        reader = reader.option("ignoreDeletes", "true")
        # Stopped for longer than that plus the vacuum retention, the stream finds some of them deleted:
        # skip those (logged), as RocketMQ's consumer misses what the commit log deleted.
        reader = reader.option("skipExpiredBy", expires_by)
        if self.consume_from == "latest":
            reader = reader.option("startingVersion", "latest")
        elif starts and path in starts:  # a new checkpoint of a group with published offsets: after them
            reader = reader.option("startingVersion", str(starts[path]))
        if position:
            reader = reader.option("sourcePositionColumn", POSITION)
        return reader.load()

    def _topic_filter(self, topic: str) -> Column:
        """The rows of ``topic`` this subscription delivers (tags), or the group's rows of ``%RETRY%G``."""
        from pyspark.sql import functions as F

        if topic == retry_topic(self.group):
            return F.col("consumer_group") == F.lit(self.group)
        cond = F.col("topic") == F.lit(topic)
        tags = self._subscriptions[topic]
        return cond & F.col("tags").isin(*tags) if tags is not None else cond

    def _sources(self) -> dict[str, str]:
        """Topic -> the table its rows are read from (created if missing)."""
        if not self._subscriptions:
            raise SubscriptionError(f"group {self.group!r} has no subscription; call subscribe(topic) first", code="NO_SUBSCRIPTION")
        messages_path = self.config.table_path("messages")
        ensure_table(messages_path, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
        sources = dict.fromkeys(self._subscriptions, messages_path)
        if self.reads_retry:
            retry_path = self.config.table_path("retry")
            ensure_table(retry_path, RETRY.arrow_schema, partition_by=RETRY.partition_by)
            sources[retry_topic(self.group)] = retry_path
        return sources

    def deliveries(self) -> DataFrame:
        """The streaming DataFrame of delivered messages: message columns plus ``delivery_key``.

        Every row of the subscription, whatever the rebalance: ``start``
        picks this instance's share of each micro-batch.
        """
        return self._deliveries(position=False)

    def _deliveries(self, *, position: bool, starts: Mapping[str, int] | None = None) -> DataFrame:
        from pyspark.sql import functions as F

        sources = self._sources()
        messages_path = self.config.table_path("messages")
        wanted = F.lit(False)
        for topic in self._subscriptions:
            wanted = wanted | self._topic_filter(topic)
        delivered = self._read(
            messages_path, expires_by=EXPIRING_TABLES[MESSAGES.name], position=position, starts=starts,
            partitions={"topic": list(self._subscriptions)},
        ).filter(wanted)
        extra = [F.col(POSITION), F.col("topic").alias(QUEUE_SET)] if position else []
        delivered = delivered.select(*MESSAGE_NAMES, *extra)
        if self.reads_retry:
            retry = retry_topic(self.group)
            retries = self._read(
                sources[retry], expires_by=EXPIRING_TABLES[RETRY.name], position=position, starts=starts,
                partitions={"consumer_group": [self.group]},
            ).filter(self._topic_filter(retry))
            # Every row of the retry table is in %RETRY%G's queues, whatever its topic column says.
            extra = [F.col(POSITION), F.lit(retry).alias(QUEUE_SET)] if position else []
            delivered = delivered.unionByName(retries.select(*MESSAGE_NAMES, *extra))
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
        # Spark writes the checkpoint through Hadoop, not delta-rs: refuse a scheme it lacks up front.
        storage.require_checkpoint_filesystem(self.spark, self.checkpoint_path)
        storage.use_filesystem_checkpoints_on_local_disk(self.spark, self.checkpoint_path)
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
        clustering = self.message_model == CLUSTERING
        batch_function = _RebalancedBatch(
            spark=self.spark,
            group=self.group,
            spec=spec,
            writer=writer,
            membership=self.membership if clustering else None,
            queue_counts=self.queue_counts(),
            sources=self._sources(),
            topic_filter=self._topic_filter,
            records=records_folder(self.checkpoint_path),
            results_path=results_path,
            on_assignment=self._on_assignment,
            clock_skew_seconds=self.clock_skew_seconds,
            stream_start=stream_start(self.checkpoint_path, self.consume_from) if clustering else None,
            checkpoint=self.checkpoint_path,
            tags={topic: _sorted_tags(self._subscriptions.get(topic)) for topic in self._sources()},
            publish_interval_seconds=self.heartbeat_interval_seconds,
            vouches=self.consume_from != "latest",
            audit_path=self.config.table_path("redrive_audit"),
        )
        self._batch_function = batch_function
        starts = batch_function.group_starts() if clustering and self.consume_from != "latest" and is_fresh(self.checkpoint_path) else {}
        deliveries = self._deliveries(position=clustering, starts=starts)
        if clustering:
            # Join before the first batch plans, so instances started together split from the start.
            self.heartbeat()
            self._heartbeater = _Heartbeater(self.membership, self.heartbeat_interval_seconds, batch_function.publish)
        try:
            stream = (
                deliveries.writeStream.queryName(f"consumer-{hashlib.sha1(self.checkpoint_path.encode()).hexdigest()[:12]}")
                .foreachBatch(batch_function)
                .option("checkpointLocation", self.checkpoint_path)
                .trigger(processingTime=spark_interval(self.trigger_interval))
            )
            # Messages of up to max_body_bytes each reach the listeners' Python in Arrow batches.
            with capped_arrow_batches(self.spark):
                query = stream.start()
        except BaseException:
            self.shutdown()
            raise
        if self._heartbeater is not None:
            self._heartbeater.query = query
            self._heartbeater.start()
        with _RUNNING_LOCK:
            _RUNNING[id(self)] = (self, query)
        log.info(
            "consumer started: group %s (%s) as %s, topics %s, retry %s, checkpoint %s",
            self.group, self.message_model, self.member_id, sorted(self._subscriptions), self.reads_retry,
            self.checkpoint_path,
        )
        return query

    def _on_assignment(self, assignment: Assignment) -> None:
        self.last_assignment = assignment
