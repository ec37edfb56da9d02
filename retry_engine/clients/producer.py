"""Publishing messages into the topic table (RocketMQ's ``DefaultMQProducer``, over Delta).

Every topic lives in one ``messages`` table partitioned by topic. A send is
one Delta commit carrying an idempotency token (a Delta app transaction), so
retrying a send whose outcome is unknown never writes the message twice
(R13): the retry, and a send that timed out, first ask the table whether that
token is already committed.

The token is ``(producer:<producer_id>, sequence)`` when the caller names its
producer and numbers its sends: it holds across processes, so a restarted
process that sends the same sequence again writes nothing and gets the same
message ids back. Without a ``producer_id`` the token is the producer
instance (a random id) and its own send counter: it only covers the retries
inside one ``send`` call.

For Spark, :func:`prepare_messages` turns a DataFrame with ``topic`` and
``body`` (plus any optional message columns) into rows of the messages table,
and :func:`send_frame` appends them in one idempotent transaction.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import os
import re
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import DeltaError

from retry_engine.config import DEFAULT_MAX_BODY_BYTES
from retry_engine.core.decide import new_msg_id
from retry_engine.core.names import SCHEDULE_TOPIC, is_dlq_topic, is_retry_topic, validate_topic
from retry_engine.delta import FORMAT_NAME, append_arrow, ensure_table
from retry_engine.delta.session import capped_arrow_batches
from retry_engine.delta.storage import spark_options
from retry_engine.delta.tables import open_table, pyarrow_dataset
from retry_engine.errors import (
    ConcurrentWriteError,
    ConfigError,
    InvalidMessageError,
    InvalidNameError,
    MessageTypeError,
    SendFailedError,
)
from retry_engine.schemas import MESSAGES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

# RocketMQ DefaultMQProducer defaults.
DEFAULT_RETRY_TIMES_WHEN_SEND_FAILED = 2
DEFAULT_SEND_TIMEOUT_MS = 3000
DEFAULT_RETRY_BACKOFF_MS = 100
DEFAULT_QUEUE_NUMS = 4

# Errors a retry can cure: storage hiccups and commit conflicts (delta-rs' own, or
# append_arrow's after repeated conflicts). Bad input is never retried.
RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (OSError, DeltaError, ConcurrentWriteError)

# A producer id becomes part of a Delta app id: printable, no spaces, bounded.
PRODUCER_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
# Delta transaction versions are signed 64-bit integers.
MAX_SEQUENCE = 2**63 - 1


def check_producer_id(value: object) -> str:
    """``value`` if it can be a producer id; :class:`InvalidMessageError` (``INVALID_PRODUCER_ID``) otherwise."""
    if not isinstance(value, str) or PRODUCER_ID.fullmatch(value) is None:
        shown = value if not isinstance(value, str) or len(value) <= 80 else f"{value[:80]}... ({len(value)} chars)"
        raise InvalidMessageError(
            f"producer_id {shown!r} must be 1-128 characters from A-Z a-z 0-9 _ . : - "
            "(no spaces or newlines); pick one stable name per sending process, e.g. 'orders-service-1'",
            code="INVALID_PRODUCER_ID",
        )
    return value


def check_sequence(value: object) -> int:
    """``value`` if it can be a send sequence number; :class:`InvalidMessageError` (``INVALID_SEQUENCE``) otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQUENCE:
        raise InvalidMessageError(
            f"sequence {value!r} must be an int from 0 to {MAX_SEQUENCE} (a Delta transaction version)",
            code="INVALID_SEQUENCE",
        )
    return value


# -- message ids ---------------------------------------------------------------


def _local_ip() -> bytes:
    try:
        return socket.inet_aton(socket.gethostbyname(socket.gethostname()))
    except OSError:
        return socket.inet_aton("127.0.0.1")


@dataclass
class MessageIdGenerator:
    """Unique ids shaped like RocketMQ's ``MessageClientIDSetter``: 32 upper-case hex digits.

    ip (4 bytes) + pid (2) + a random instance tag (4, RocketMQ uses its class
    loader's hash) + milliseconds since the start of the month (4) + a
    counter (2). Thread-safe.
    """

    ip: bytes = field(default_factory=_local_ip)
    pid: int = field(default_factory=os.getpid)
    tag: bytes = field(default_factory=lambda: secrets.token_bytes(4))
    _counter: Iterator[int] = field(default_factory=itertools.count, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def host(self) -> str:
        """``ip:pid``: the born host recorded on messages (the pid stands in for the client port)."""
        return f"{socket.inet_ntoa(self.ip)}:{self.pid}"

    def next_id(self, now: dt.datetime | None = None) -> str:
        now = now or dt.datetime.now(dt.UTC)
        month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        millis = int((now - month_start).total_seconds() * 1000) & 0xFFFFFFFF
        with self._lock:
            count = next(self._counter) & 0xFFFF
        fixed = self.ip + (self.pid & 0xFFFF).to_bytes(2, "big") + self.tag
        return (fixed + millis.to_bytes(4, "big") + count.to_bytes(2, "big")).hex().upper()


# -- messages --------------------------------------------------------------------


def check_send_topic(topic: object) -> str:
    """``topic`` if a producer may send to it; :class:`InvalidNameError` otherwise.

    Like RocketMQ's ``TopicValidator``: a valid name, and not a system topic
    (``%RETRY%G`` and ``%DLQ%G`` belong to the engine, the schedule topic too).
    """
    name = validate_topic(topic)
    if is_retry_topic(name) or is_dlq_topic(name) or name == SCHEDULE_TOPIC:
        raise InvalidNameError(
            f"topic {name!r} is a system topic (retry, dead-letter or schedule); producers may not send to it",
            code="TOPIC_NOT_ALLOWED",
        )
    return name


@dataclass(frozen=True)
class Message:
    """A message to send: RocketMQ's ``Message`` (topic, body, tags, keys, flag, user properties).

    Validated on construction: the topic by RocketMQ's rules, the body is
    non-empty ``bytes`` (a ``str`` is encoded as UTF-8), keys a string or a
    sequence of strings (stored space separated), properties ``str -> str``.
    """

    topic: str
    body: bytes
    tags: str | None = None
    keys: str | Sequence[str] | None = None
    properties: Mapping[str, str] | None = None
    flag: int = 0

    def __post_init__(self) -> None:
        check_send_topic(self.topic)
        body: Any = self.body
        if isinstance(body, str):
            object.__setattr__(self, "body", body.encode("utf-8"))
        elif isinstance(body, bytearray | memoryview):
            object.__setattr__(self, "body", bytes(body))
        elif not isinstance(body, bytes):
            raise MessageTypeError(f"message body must be bytes or str, got {type(body).__name__}")
        if not self.body:
            raise InvalidMessageError("message body is empty; RocketMQ rejects zero-length bodies", code="BODY_EMPTY")
        _check_optional_str("tags", self.tags)
        keys: Any = self.keys
        if keys is not None and not isinstance(keys, str):
            if not isinstance(keys, Sequence) or not all(isinstance(k, str) for k in keys):
                raise MessageTypeError(f"message keys must be a str or a sequence of str, got {keys!r}")
            object.__setattr__(self, "keys", " ".join(keys))
        props: Any = self.properties
        if props is not None:
            if not isinstance(props, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in props.items()
            ):
                raise MessageTypeError(f"message properties must map str to str, got {props!r}")
        if isinstance(self.flag, bool) or not isinstance(self.flag, int):
            raise MessageTypeError(f"message flag must be an int, got {type(self.flag).__name__}")
        if not -(2**31) <= self.flag < 2**31:
            # RocketMQ's flag is a Java int; the column is int32.
            raise InvalidMessageError(f"message flag {self.flag} is outside the int32 range a flag holds", code="FLAG_OUT_OF_RANGE")


def _held_or_not(landed: bool | None, transaction: str) -> str:
    """What a failed send's error says of the table: whether it holds the send's transaction."""
    if landed is None:
        return (f"the table could not be read to tell whether it holds transaction {transaction}: it may have been "
                "written (a resend is safe with a producer_id)")
    return f"the table does not hold transaction {transaction}"


def _check_optional_str(name: str, value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise MessageTypeError(f"message {name} must be a str or None, got {type(value).__name__}")


@dataclass(frozen=True)
class SendResult:
    """What a send wrote: the ids of its messages, in order, and how many attempts it took."""

    msg_ids: tuple[str, ...]
    attempts: int
    written: bool
    """False when the send was found already committed: by an earlier attempt of this
    send, or (with a ``producer_id``) by an earlier send of the same sequence, maybe
    from another process; nothing was written again."""


class Producer:
    """Appends messages to the messages table, one idempotent Delta commit per send.

    ``retry_times_when_send_failed`` retries follow a failed attempt (storage
    or commit errors only) while the ``send_timeout_ms`` budget lasts; the
    budget is checked before each attempt, as RocketMQ's ``sendDefaultImpl``
    does (a running commit is not interrupted). Every attempt of one send
    carries the same token, so a retry after an attempt that did commit is a
    no-op, and a send whose attempts failed or timed out is reported as sent
    when the table shows its token after all (the commit landed but its
    acknowledgement was lost). One instance may be used from several threads;
    its sends are serialised (use one producer per thread to send in parallel).

    ``producer_id`` (recommended): a stable name for the sending process, unique
    among the processes that send to this table at the same time. Each send
    then takes a ``sequence``: the caller's own number for what it sends (an
    offset, a row number of its input), increasing from send to send. The
    token ``(producer_id, sequence)`` is checked in the table, so a send
    repeated after a crash or restart, by any process, writes nothing and
    returns the same message ids. A send whose sequence is at or below the
    highest one committed for ``producer_id`` and not in the table is refused
    (``SEQUENCE_OUT_OF_ORDER``), never reported as sent: number sends in the
    order you send them. Without ``producer_id`` the token is
    this instance's; it covers only the retries inside one call.
    """

    def __init__(
        self,
        messages_path: str,
        *,
        producer_group: str = "DEFAULT_PRODUCER",
        retry_times_when_send_failed: int = DEFAULT_RETRY_TIMES_WHEN_SEND_FAILED,
        send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS,
        retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        queue_nums: int = DEFAULT_QUEUE_NUMS,
        producer_id: str | None = None,
    ) -> None:
        if producer_id is not None:
            check_producer_id(producer_id)
        for name, value, low in (
            ("retry_times_when_send_failed", retry_times_when_send_failed, 0),
            ("send_timeout_ms", send_timeout_ms, 1),
            ("retry_backoff_ms", retry_backoff_ms, 0),
            ("max_body_bytes", max_body_bytes, 1),
            ("queue_nums", queue_nums, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidMessageError(f"producer option {name}={value!r} must be an int >= {low}", code="INVALID_OPTION")
        self.path = messages_path
        self.producer_group = producer_group
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self.send_timeout_ms = send_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.max_body_bytes = max_body_bytes
        self.queue_nums = queue_nums
        self.ids = MessageIdGenerator()
        self.producer_id = producer_id
        # The token's app id: the caller's stable name, or (without one) this instance. The
        # two forms cannot collide: "producer:" vs "producer-".
        self.app_id = f"producer:{producer_id}" if producer_id is not None else f"producer-{producer_group}-{uuid.uuid4()}"
        self._sequence = itertools.count(1)
        self._lock = threading.Lock()
        ensure_table(messages_path, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)

    def send(
        self,
        topic: str,
        body: bytes | str,
        *,
        tags: str | None = None,
        keys: str | Sequence[str] | None = None,
        properties: Mapping[str, str] | None = None,
        flag: int = 0,
        sequence: int | None = None,
    ) -> SendResult:
        """Send one message; see :meth:`send_batch`."""
        return self.send_batch([Message(topic, body, tags, keys, properties, flag)], sequence=sequence)  # type: ignore[arg-type]

    def send_batch(self, messages: Sequence[Message], *, sequence: int | None = None) -> SendResult:
        """Send ``messages`` as one commit: all of them are written, once, or none.

        ``sequence`` is required with a ``producer_id`` and refused without one
        (see the class docstring). Raises :class:`InvalidMessageError` for an
        oversized body or a bad sequence (never retried) and
        :class:`SendFailedError` when every attempt failed or the timeout ran
        out and the table does not hold the send, with the last error as its cause.
        """
        if self.producer_id is not None and sequence is None:
            raise InvalidMessageError(
                f"producer {self.producer_id!r} sends need a sequence= number (the caller's own, increasing), "
                "so that a repeated send is recognised across restarts",
                code="SEQUENCE_REQUIRED",
            )
        if self.producer_id is None and sequence is not None:
            raise InvalidMessageError(
                f"sequence={sequence!r} needs a producer: Producer(..., producer_id='<stable name>')",
                code="PRODUCER_ID_REQUIRED",
            )
        if sequence is not None:
            check_sequence(sequence)
        if not messages:
            raise InvalidMessageError("send_batch needs at least one message", code="BATCH_EMPTY")
        for m in messages:
            if not isinstance(m, Message):
                raise MessageTypeError(f"send_batch takes Message objects, got {type(m).__name__}")
            if len(m.body) > self.max_body_bytes:
                raise InvalidMessageError(
                    f"message body to topic {m.topic!r} is {len(m.body)} bytes; at most {self.max_body_bytes} allowed",
                    code="BODY_TOO_LARGE",
                )
        table = self._rows(messages, sequence)
        ids = tuple(table.column("msg_id").to_pylist())
        # Sends of one producer are serialised: the table's transaction check treats every
        # version at or below the last committed one as done, so versions must commit in order.
        with self._lock:
            version = next(self._sequence) if sequence is None else sequence
            return self._send(table, ids, version)

    def _send(self, table: pa.Table, ids: tuple[str, ...], version: int) -> SendResult:
        started = time.monotonic()
        last_error: BaseException | None = None
        total = 1 + self.retry_times_when_send_failed
        for attempt in range(1, total + 1):
            elapsed_ms = (time.monotonic() - started) * 1000
            if attempt > 1 and elapsed_ms >= self.send_timeout_ms:
                landed = self._landed(table, version)
                if landed:
                    return SendResult(ids, attempt - 1, False)
                raise SendFailedError(
                    f"send of {len(ids)} message(s) (first {ids[0]}) timed out after {elapsed_ms:.0f} ms "
                    f"and {attempt - 1} attempt(s) (send_timeout_ms={self.send_timeout_ms}); "
                    + _held_or_not(landed, f"{self.app_id}/{version}"),
                    code="SEND_TIMEOUT",
                ) from last_error
            try:
                written = self._write(table, version)
                if not written:
                    self._require_in_order(table, version)
            except RETRYABLE_ERRORS as exc:
                last_error = exc
                log.warning(
                    "send %s/%d (first msg %s) attempt %d/%d failed: %s",
                    self.app_id, version, ids[0], attempt, total, exc,
                )
                if attempt < total:
                    time.sleep(self.retry_backoff_ms / 1000)
                continue
            return SendResult(ids, attempt, written)
        landed = self._landed(table, version)
        if landed:
            return SendResult(ids, total, False)
        raise SendFailedError(
            f"send of {len(ids)} message(s) (first {ids[0]}) failed {total} time(s) "
            f"(retry_times_when_send_failed={self.retry_times_when_send_failed}): {last_error}; "
            + _held_or_not(landed, f"{self.app_id}/{version}"),
        ) from last_error

    def _write(self, table: pa.Table, version: int) -> bool:
        """One attempt: append unless the table already holds this send's token."""
        return append_arrow(
            self.path, table, app_id=self.app_id, txn_version=version, partition_by=MESSAGES.partition_by
        )

    def _landed(self, rows: pa.Table, version: int) -> bool | None:
        """Whether the table holds this send (of ``rows``) after all its attempts failed; None when it
        cannot be read to say.

        An attempt can commit and still fail (the acknowledgement of the commit
        was lost, or the attempt ran past the timeout): reporting that as a
        failure makes the caller send again. If the table cannot be read
        either, the send is reported failed, saying so (the caller's resend is
        then safe only with a ``producer_id``).
        """
        try:
            held = open_table(self.path)
            done = None if held is None else held.transaction_version(self.app_id)
            if done is None or done < version:
                return False
            self._require_in_order(rows, version)
        except RETRYABLE_ERRORS as exc:
            log.warning("send %s/%d: could not check whether it landed: %s", self.app_id, version, exc)
            return None
        log.info("send %s/%d: its attempts failed but the table holds it (at %d): sent", self.app_id, version, done)
        return True

    def _require_in_order(self, table: pa.Table, version: int) -> None:
        """After the table said it holds ``version``: with a ``producer_id``, check it really is this send.

        Delta keeps only the highest transaction version of an app id, so a
        sequence below it reads as committed whether or not it ever was. The
        ids of a numbered send are derived from its token: if its first message
        is not in the table, the sequence came out of order and was never
        written. That is refused (``SEQUENCE_OUT_OF_ORDER``, as Kafka's idempotent
        producer refuses a sequence gap), never reported as sent.
        """
        if self.producer_id is None:
            return
        topic, first = table.column("topic")[0].as_py(), table.column("msg_id")[0].as_py()
        held = open_table(self.path)
        rows = None if held is None else pyarrow_dataset(held, [("topic", "=", topic), ("msg_id", "=", first)]).to_table(
            columns=["msg_id"], filter=(pc.field("topic") == topic) & (pc.field("msg_id") == first)
        )
        if rows is not None and rows.num_rows:
            return
        highest = None if held is None else held.transaction_version(self.app_id)
        raise InvalidMessageError(
            f"producer {self.producer_id!r}: sequence {version} is at or below the highest committed sequence "
            f"{highest}, but no send with sequence {version} is in the table; number the sends of one "
            "producer_id in the order they are sent. Nothing was written",
            code="SEQUENCE_OUT_OF_ORDER",
        )

    def _rows(self, messages: Sequence[Message], sequence: int | None) -> pa.Table:
        now = dt.datetime.now(dt.UTC)
        rows = []
        for index, m in enumerate(messages):
            # With a caller's sequence the ids are derived from the token, so a repeated
            # send (from any process) reports the ids of the copy that is in the table.
            msg_id = (
                self.ids.next_id(now)
                if sequence is None
                else new_msg_id(f"producer\0{self.producer_id}", str(sequence), str(index))
            )
            rows.append({
                "msg_id": msg_id,
                "topic": m.topic,
                "tags": m.tags,
                "keys": m.keys,
                "body": m.body,
                "flag": m.flag,
                "properties": list(m.properties.items()) if m.properties else None,
                "born_timestamp": now,
                "born_host": self.ids.host,
                "store_timestamp": now,
                "queue_id": int(msg_id[-4:], 16) % self.queue_nums,
                "reconsume_times": 0,
                "origin_msg_id": None,
                "retry_topic": None,
                "attempts": None,
            })
        return pa.Table.from_pylist(rows, schema=MESSAGES.arrow_schema)


# -- Spark -------------------------------------------------------------------------


def _fill_batches(
    batches: Iterator[pa.RecordBatch], *, max_body_bytes: int, queue_nums: int
) -> Iterator[pa.RecordBatch]:
    """Complete each row to a message: ids, born time and host, checks (runs on executors).

    Replay (a retried task or a replayed micro-batch): new ids and times are
    minted, but only one attempt's files are ever committed (the batch writer's
    single transaction, or the stream sink's batch-id transaction check).
    """
    ids = MessageIdGenerator()
    for batch in batches:
        if batch.num_rows == 0:
            continue
        now = dt.datetime.now(dt.UTC)
        data = batch.to_pydict()
        n = batch.num_rows
        for topic in set(data["topic"]):
            check_send_topic(topic)
        for i, body in enumerate(data["body"]):
            if body is None or len(body) == 0:
                raise InvalidMessageError(f"row {i} to topic {data['topic'][i]!r} has an empty body", code="BODY_EMPTY")
            if len(body) > max_body_bytes:
                raise InvalidMessageError(
                    f"row {i} to topic {data['topic'][i]!r} has a {len(body)}-byte body; at most {max_body_bytes} allowed",
                    code="BODY_TOO_LARGE",
                )
        msg_ids = [ids.next_id(now) for _ in range(n)]

        def given(name: str, default: Any, data: dict[str, list[Any]] = data, n: int = n) -> list[Any]:
            values = data.get(name)
            return [default if v is None else v for v in values] if values is not None else [default] * n

        out = {
            "msg_id": msg_ids,
            "topic": data["topic"],
            "tags": given("tags", None),
            "keys": given("keys", None),
            "body": data["body"],
            "flag": given("flag", 0),
            "properties": given("properties", None),
            "born_timestamp": given("born_timestamp", now),
            "born_host": given("born_host", ids.host),
            "store_timestamp": [now] * n,
            "queue_id": [int(m[-4:], 16) % queue_nums for m in msg_ids],
            "reconsume_times": [0] * n,
            "origin_msg_id": [None] * n,
            "retry_topic": [None] * n,
            "attempts": [None] * n,
        }
        yield pa.RecordBatch.from_pydict(out, schema=MESSAGES.arrow_schema)


OPTIONAL_FRAME_COLUMNS = ("tags", "keys", "flag", "properties", "born_timestamp", "born_host")


def prepare_messages(
    df: DataFrame, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, queue_nums: int = DEFAULT_QUEUE_NUMS
) -> DataFrame:
    """``df`` (batch or streaming) as rows of the messages table.

    ``df`` needs ``topic`` (string) and ``body`` (binary or string); it may
    carry any of ``tags``, ``keys``, ``flag``, ``properties``,
    ``born_timestamp``, ``born_host``. Other columns are an error. Ids, born
    time and host are filled on the executors; an invalid topic or an empty
    or oversized body fails the task with the error naming the row's topic.
    """
    from pyspark.sql import functions as F

    from retry_engine.errors import SchemaMismatchError

    names = df.columns
    missing = [c for c in ("topic", "body") if c not in names]
    extra = [c for c in names if c not in ("topic", "body", *OPTIONAL_FRAME_COLUMNS)]
    if missing or extra:
        raise SchemaMismatchError(
            f"messages DataFrame {'lacks column ' + repr(missing[0]) if missing else 'has unknown column ' + repr(extra[0])}; "
            f"required: topic, body; optional: {', '.join(OPTIONAL_FRAME_COLUMNS)}",
            code="MESSAGE_COLUMNS",
        )
    schema = MESSAGES.spark_schema
    typed = df.select(
        *[F.col(c).cast(schema[c].dataType).alias(c) for c in ("topic", "body", *OPTIONAL_FRAME_COLUMNS) if c in names]
    )

    def fill(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _fill_batches(batches, max_body_bytes=max_body_bytes, queue_nums=queue_nums)

    return typed.mapInArrow(fill, schema)


def send_frame(
    df: DataFrame,
    messages_path: str,
    *,
    txn_app_id: str | None = None,
    txn_version: int | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """Append the batch DataFrame ``df`` (see :func:`prepare_messages`) to the messages table.

    One Delta transaction. With ``txn_app_id`` and ``txn_version`` the write
    is idempotent: running it again with the same pair writes nothing.
    """
    ensure_table(messages_path, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
    writer = (
        prepare_messages(df, max_body_bytes=max_body_bytes)
        .write.format(FORMAT_NAME)
        .mode("append")
        .option("path", messages_path)
        .options(**spark_options(messages_path))
        .option("partitionBy", ",".join(MESSAGES.partition_by))
    )
    if (txn_app_id is None) != (txn_version is None):
        raise ConfigError("txn_app_id and txn_version go together; pass both or neither", code="INVALID_OPTION")
    if txn_app_id is not None and txn_version is not None:
        writer = writer.option("txnAppId", txn_app_id).option("txnVersion", str(txn_version))
    # Bodies of up to max_body_bytes each cross to Python (prepare_messages, the sink) in Arrow batches.
    with capped_arrow_batches(df.sparkSession):
        writer.save()
