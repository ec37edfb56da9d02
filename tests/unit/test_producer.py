"""The producer on real Delta tables (no Spark): ids, idempotent retries (R13), bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from retry_engine.clients.producer import Message, MessageIdGenerator, Producer
from retry_engine.errors import (
    InvalidMessageError,
    InvalidNameError,
    MessageTypeError,
    SendFailedError,
)
from retry_engine.schemas import MESSAGES


def rows(path: Path) -> list[dict[str, Any]]:
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


class LostAckProducer(Producer):
    """Commits, then reports a failure (the acknowledgement was lost) for the first ``lost`` attempts."""

    def __init__(self, path: str, *, lost: int, before_commit: bool = False, **options: Any) -> None:
        super().__init__(path, **options)
        self.lost = lost
        self.before_commit = before_commit
        self.calls = 0

    def _write(self, table: pa.Table, version: int) -> bool:
        self.calls += 1
        if self.calls <= self.lost:
            if not self.before_commit:
                super()._write(table, version)
            raise OSError(f"connection reset (injected, attempt {self.calls})")
        return super()._write(table, version)


def test_send_writes_a_message_with_rocketmq_fields(tmp_path: Path) -> None:
    producer = Producer(str(tmp_path / "messages"))
    result = producer.send("orders", "hello", tags="TagA", keys=["k1", "k2"], properties={"a": "b"}, flag=3)
    (row,) = rows(tmp_path / "messages")
    assert row["msg_id"] == result.msg_ids[0] and len(row["msg_id"]) == 32
    assert row["topic"] == "orders" and row["body"] == b"hello" and row["tags"] == "TagA"
    assert row["keys"] == "k1 k2" and row["properties"] == [("a", "b")] and row["flag"] == 3
    assert row["reconsume_times"] == 0 and row["origin_msg_id"] is None
    assert row["born_host"] == producer.ids.host and row["born_timestamp"] is not None
    assert DeltaTable(str(tmp_path / "messages")).metadata().partition_columns == list(MESSAGES.partition_by)


def test_message_ids_are_unique_and_rocketmq_shaped() -> None:
    a, b = MessageIdGenerator(), MessageIdGenerator()
    ids = [a.next_id() for _ in range(70_000)] + [b.next_id() for _ in range(1000)]
    assert len(set(ids[:65_536])) == 65_536
    assert len(set(ids[-2000:])) == 2000  # two generators in one process do not collide
    assert all(len(i) == 32 and i == i.upper() for i in ids[:10])


def test_r13_retry_after_a_lost_acknowledgement_writes_nothing_twice(tmp_path: Path) -> None:
    producer = LostAckProducer(str(tmp_path / "m"), lost=2, retry_backoff_ms=1)
    result = producer.send_batch([Message("orders", b"one"), Message("orders", b"two")])
    assert result.attempts == 3 and result.written is False  # attempt 1 committed; 2 and 3 found it
    assert sorted(r["body"] for r in rows(tmp_path / "m")) == [b"one", b"two"]
    producer.send("orders", b"three")  # the next send is a new transaction
    assert len(rows(tmp_path / "m")) == 3


def test_r13_retry_after_a_failed_write_writes_once(tmp_path: Path) -> None:
    producer = LostAckProducer(str(tmp_path / "m"), lost=1, before_commit=True, retry_backoff_ms=1)
    result = producer.send("orders", b"x")
    assert (result.attempts, result.written) == (2, True)
    assert [r["msg_id"] for r in rows(tmp_path / "m")] == list(result.msg_ids)


def test_r13_gives_up_after_retry_times_when_send_failed(tmp_path: Path) -> None:
    producer = LostAckProducer(
        str(tmp_path / "m"), lost=10, before_commit=True, retry_times_when_send_failed=2, retry_backoff_ms=1
    )
    with pytest.raises(SendFailedError, match=r"\[SEND_FAILED\].*failed 3 time\(s\).*connection reset"):
        producer.send("orders", b"x")
    assert producer.calls == 3
    assert rows(tmp_path / "m") == []


def test_r13_timeout_stops_the_retries(tmp_path: Path) -> None:
    producer = LostAckProducer(
        str(tmp_path / "m"), lost=10, before_commit=True, retry_times_when_send_failed=50,
        send_timeout_ms=1, retry_backoff_ms=5,
    )
    with pytest.raises(SendFailedError, match=r"\[SEND_TIMEOUT\].*send_timeout_ms=1"):
        producer.send("orders", b"x")
    assert producer.calls < 50


@pytest.mark.parametrize(
    ("topic", "code"),
    [
        ("bad topic", "INVALID_TOPIC_NAME"),
        ("", "INVALID_TOPIC_NAME"),
        ("x" * 128, "INVALID_TOPIC_NAME"),
        ("../etc", "INVALID_TOPIC_NAME"),
        ("%DLQ%G", "TOPIC_NOT_ALLOWED"),
        ("%RETRY%G", "TOPIC_NOT_ALLOWED"),
        ("SCHEDULE_TOPIC_XXXX", "TOPIC_NOT_ALLOWED"),
    ],
)
def test_invalid_topic_is_a_clear_error(tmp_path: Path, topic: str, code: str) -> None:
    producer = Producer(str(tmp_path / "m"))
    with pytest.raises(InvalidNameError, match=rf"\[{code}\]"):
        producer.send(topic, b"x")


def test_bad_messages_are_clear_errors(tmp_path: Path) -> None:
    producer = Producer(str(tmp_path / "m"), max_body_bytes=10)
    with pytest.raises(InvalidMessageError, match=r"\[BODY_TOO_LARGE\].*'orders' is 11 bytes; at most 10"):
        producer.send("orders", b"x" * 11)
    with pytest.raises(InvalidMessageError, match=r"\[BODY_EMPTY\]"):
        producer.send("orders", b"")
    with pytest.raises(MessageTypeError, match=r"\[WRONG_TYPE\] message body must be bytes or str, got int"):
        producer.send("orders", 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"properties must map str to str"):
        producer.send("orders", b"x", properties={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"keys must be a str or a sequence of str"):
        producer.send("orders", b"x", keys=[1])  # type: ignore[list-item]
    with pytest.raises(InvalidMessageError, match=r"\[INVALID_OPTION\] producer option retry_times_when_send_failed=-1"):
        Producer(str(tmp_path / "m"), retry_times_when_send_failed=-1)
    assert rows(tmp_path / "m") == []


def test_sends_from_many_threads_all_land_once(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    producer = Producer(str(tmp_path / "m"))
    with ThreadPoolExecutor(max_workers=6) as pool:
        sent = list(pool.map(lambda i: producer.send("orders", f"m{i}").msg_ids[0], range(30)))
    assert sorted(r["msg_id"] for r in rows(tmp_path / "m")) == sorted(sent)


def test_r13_timeout_after_the_commit_landed_reports_the_send(tmp_path: Path) -> None:
    """#12 item 12 / R13: the first attempt commits, then fails (lost ack); the budget runs out.

    The table holds the send's transaction, so the send succeeded: reporting
    SEND_TIMEOUT would make the caller resend and duplicate it.
    """
    producer = LostAckProducer(
        str(tmp_path / "m"), lost=10**6, retry_times_when_send_failed=10**6, send_timeout_ms=1, retry_backoff_ms=5
    )
    result = producer.send("orders", b"x")
    assert result.written is False and result.attempts == producer.calls >= 1
    assert [r["msg_id"] for r in rows(tmp_path / "m")] == list(result.msg_ids)


def test_r13_last_retry_failing_after_the_commit_landed_reports_the_send(tmp_path: Path) -> None:
    """#12 item 12 / R13: no retries left, the only attempt committed and then failed: the send is reported sent."""
    producer = LostAckProducer(str(tmp_path / "m"), lost=1, retry_times_when_send_failed=0)
    result = producer.send("orders", b"x")
    assert (result.attempts, result.written) == (1, False)
    assert [r["msg_id"] for r in rows(tmp_path / "m")] == list(result.msg_ids)


def test_r13_timeout_names_the_missing_transaction(tmp_path: Path) -> None:
    """#12 item 12: when nothing landed, SEND_TIMEOUT still fires and says the table lacks the send."""
    producer = LostAckProducer(
        str(tmp_path / "m"), lost=10**6, before_commit=True, retry_times_when_send_failed=10**6,
        send_timeout_ms=1, retry_backoff_ms=5,
    )
    with pytest.raises(SendFailedError, match=r"\[SEND_TIMEOUT\].*does not hold transaction producer-"):
        producer.send("orders", b"x")
    assert rows(tmp_path / "m") == []


def test_stable_producer_id_deduplicates_a_repeated_sequence(tmp_path: Path) -> None:
    """#12 item 21 / R13: (producer_id, sequence) is the token: a repeat writes nothing and returns the same ids."""
    path = str(tmp_path / "m")
    first = Producer(path, producer_id="orders-svc.1").send_batch(
        [Message("orders", b"a"), Message("orders", b"b")], sequence=0
    )
    again = Producer(path, producer_id="orders-svc.1").send_batch(
        [Message("orders", b"a"), Message("orders", b"b")], sequence=0
    )
    assert first.written and not again.written
    assert again.msg_ids == first.msg_ids and len(set(first.msg_ids)) == 2
    assert all(len(i) == 32 and i == i.upper() for i in first.msg_ids)
    other = Producer(path, producer_id="billing-svc").send("orders", b"a", sequence=0)  # another producer's 0
    assert other.written and other.msg_ids[0] not in first.msg_ids
    assert sorted(r["msg_id"] for r in rows(tmp_path / "m")) == sorted(first.msg_ids + other.msg_ids)


@pytest.mark.parametrize(
    "producer_id",
    ["", " ", "   ", "orders\n", "\norders", "orders svc", "x" * 129, "x" * 100_000, "ürün", "a/b", 42, b"orders"],
)
def test_bad_producer_id_is_a_clear_error(tmp_path: Path, producer_id: Any) -> None:
    """#12 item 21, hostile input: empty, whitespace, newline-terminated, huge, non-ASCII, path-like, non-str ids."""
    with pytest.raises(InvalidMessageError, match=r"\[INVALID_PRODUCER_ID\] producer_id .* must be 1-128 characters"):
        Producer(str(tmp_path / "m"), producer_id=producer_id)


def test_longest_producer_id_is_accepted(tmp_path: Path) -> None:
    """#12 item 21: the bound is inclusive (128 characters)."""
    assert Producer(str(tmp_path / "m"), producer_id="x" * 128).send("orders", b"x", sequence=1).written


@pytest.mark.parametrize("sequence", [-1, -(2**63), 2**63, True, 1.0, "1", None])
def test_bad_sequence_is_a_clear_error(tmp_path: Path, sequence: Any) -> None:
    """#12 item 21, hostile input: negative, beyond int64, bool, float, str and missing sequences write nothing."""
    producer = Producer(str(tmp_path / "m"), producer_id="p1")
    code = "SEQUENCE_REQUIRED" if sequence is None else "INVALID_SEQUENCE"
    with pytest.raises(InvalidMessageError, match=rf"\[{code}\]"):
        producer.send("orders", b"x", sequence=sequence)
    assert rows(tmp_path / "m") == []


def test_sequence_bounds_are_delta_transaction_versions(tmp_path: Path) -> None:
    """#12 item 21: 0 and 2**63-1 are valid; after 2**63-1 a lower sequence that was sent is recognised."""
    producer = Producer(str(tmp_path / "m"), producer_id="p1")
    first = producer.send("orders", b"x", sequence=0)
    assert first.written
    assert producer.send("orders", b"y", sequence=2**63 - 1).written
    again = producer.send("orders", b"x", sequence=0)
    assert (again.written, again.msg_ids) == (False, first.msg_ids)
    assert sorted(r["body"] for r in rows(tmp_path / "m")) == [b"x", b"y"]


def test_a_sequence_sent_out_of_order_is_refused_not_reported_sent(tmp_path: Path) -> None:
    """#12 item 21, R13, bad-input rule: Delta keeps only a producer's highest sequence, so 2 sent
    after 3 once read as "already sent" and the message was silently lost. It is refused now, and
    writes nothing; a restarted process re-sending 1 and 3 (both in the table) is still told so."""
    path = str(tmp_path / "m")
    producer = Producer(path, producer_id="p1")
    assert producer.send("orders", b"one", sequence=1).written
    assert producer.send("orders", b"three", sequence=3).written

    with pytest.raises(InvalidMessageError, match=r"\[SEQUENCE_OUT_OF_ORDER\] .*sequence 2 .*highest committed sequence 3"):
        producer.send("orders", b"two", sequence=2)

    restarted = Producer(path, producer_id="p1")
    assert [restarted.send("orders", b, sequence=n).written for n, b in ((1, b"one"), (3, b"three"))] == [False, False]
    assert sorted(r["body"] for r in rows(path)) == [b"one", b"three"]


def test_a_sequence_sent_into_a_file_without_statistics_is_known_as_sent(tmp_path: Path) -> None:
    """#12 item 21, bad-input rule: a messages table whose writer kept no column statistics (a Spark
    job with delta.dataSkippingNumIndexedCols = 0): delta-rs's filter skipped the file holding the
    sequence's first message, and a re-send of 3 was refused as out of order (pyarrow_dataset)."""
    from deltalake import DeltaTable

    path = str(tmp_path / "m")
    producer = Producer(path, producer_id="p1")
    assert producer.send("orders", b"one", sequence=1).written
    DeltaTable(path).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": "0"})
    assert producer.send("orders", b"three", sequence=3).written
    DeltaTable(path).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": "32"})
    assert Producer(path, producer_id="p1").send("orders", b"three", sequence=3).written is False
    assert sorted(r["body"] for r in rows(path)) == [b"one", b"three"]


def test_sequence_without_producer_id_is_refused(tmp_path: Path) -> None:
    """#12 item 21: an instance-scoped producer cannot promise cross-process dedup, so it takes no sequence."""
    with pytest.raises(InvalidMessageError, match=r"\[PRODUCER_ID_REQUIRED\] sequence=3 needs a producer"):
        Producer(str(tmp_path / "m")).send("orders", b"x", sequence=3)
    assert rows(tmp_path / "m") == []


@pytest.mark.parametrize("flag", [2**31, -(2**31) - 1, 2**70])
def test_a_flag_outside_int32_is_a_clear_error_and_nothing_is_written(tmp_path: Path, flag: int) -> None:
    """(found by a review) It raised pyarrow's ArrowInvalid naming no field."""
    producer = Producer(str(tmp_path / "messages"))
    with pytest.raises(InvalidMessageError, match=rf"\[FLAG_OUT_OF_RANGE\] message flag {flag} is outside the int32"):
        producer.send("orders", "hello", flag=flag)
    assert Message("orders", "x", flag=2**31 - 1).flag == 2**31 - 1 and Message("orders", "x", flag=-(2**31)).flag < 0


@pytest.mark.parametrize("path", ["timeout", "last_retry"])
def test_r13_a_numbered_send_whose_commit_landed_is_reported_sent(tmp_path: Path, path: str) -> None:
    """(found by a review) With a producer_id, the check that the table holds the send passed the opened table where
    the send's rows were wanted: AttributeError, neither a SendResult nor a SendFailedError."""
    options: dict[str, Any] = (
        {"lost": 10**6, "retry_times_when_send_failed": 10**6, "send_timeout_ms": 1, "retry_backoff_ms": 5}
        if path == "timeout" else {"lost": 1, "retry_times_when_send_failed": 0}
    )
    producer = LostAckProducer(str(tmp_path / "m"), producer_id="orders-1", **options)
    result = producer.send("orders", b"x", sequence=1)
    assert result.written is False and [r["msg_id"] for r in rows(tmp_path / "m")] == list(result.msg_ids)


def test_r13_a_failed_send_says_when_the_table_could_not_be_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(found by a review) The commit landed, then the store stopped answering: the error said the table does not
    hold the send, and a caller without a producer_id who believed it sent it twice."""
    from retry_engine.clients import producer as module

    sender = LostAckProducer(str(tmp_path / "m"), lost=10**6, retry_times_when_send_failed=1, retry_backoff_ms=0)

    def unreachable(path: str) -> None:
        raise OSError("store unreachable")

    monkeypatch.setattr(module, "open_table", unreachable)
    with pytest.raises(SendFailedError, match=r"could not be read to tell whether it holds transaction .*may have been"):
        sender.send("orders", b"x")
    monkeypatch.undo()
    assert len(rows(tmp_path / "m")) == 1
