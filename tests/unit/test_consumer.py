"""The consumer's pure parts: listener verdicts to consume results (R1, R5, R6, R11, R14), subscriptions (R9)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from retry_engine.clients.consumer import (
    CONSUME_SUCCESS,
    RECONSUME_LATER,
    ConsumeContext,
    Consumer,
    ListenerSpec,
    ReceivedMessage,
    consume_batch,
    parse_tags,
)
from retry_engine.config import parse_config
from retry_engine.errors import InvalidNameError, SubscriptionError
from retry_engine.schemas import CONSUME_RESULTS, MESSAGES

T0 = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


def delivered(*keys: str, reconsume_times: int = 0) -> pa.RecordBatch:
    rows = [
        {
            "msg_id": f"M{i}", "topic": "orders" if reconsume_times == 0 else "%RETRY%G", "tags": "T",
            "keys": k, "body": k.encode(), "flag": 0, "properties": [("p", "v")], "born_timestamp": T0,
            "born_host": "h:1", "store_timestamp": T0, "queue_id": 0, "reconsume_times": reconsume_times,
            "origin_msg_id": None if reconsume_times == 0 else f"O{i}",
            "retry_topic": None if reconsume_times == 0 else "orders", "attempts": None,
        }
        for i, k in enumerate(keys)
    ]
    return pa.RecordBatch.from_pylist(rows, schema=MESSAGES.arrow_schema)


def spec(**listener: Any) -> ListenerSpec:
    base: dict[str, Any] = dict(group="G", consumer_id="c@1", app_id="app", message_model="CLUSTERING", max_reconsume_times=-1)
    return ListenerSpec(**{**base, **listener})


def by_verdict(message: ReceivedMessage, context: ConsumeContext) -> Any:
    if message.keys == "raise":
        raise KeyError("no such order")
    if message.keys == "none":
        return None
    if message.keys == "later":
        context.delay_level_when_next_consume = 2
        context.max_reconsume_times = 4
        return RECONSUME_LATER
    if message.keys == "garbage":
        return 42
    return CONSUME_SUCCESS


@pytest.mark.parametrize(
    "column, raw",
    [
        ("born_timestamp", 253_402_300_800_000_000),  # 10000-01-01: Spark, Parquet and Delta hold it, Python cannot
        ("store_timestamp", -62_135_596_800_000_001),  # just before 0001-01-01
        ("keys", b"\xff\xfe"),  # no UTF-8 (another writer's bytes in a string column)
    ],
)
def test_a_row_python_cannot_hold_is_not_delivered_and_the_rest_of_the_batch_is(column: str, raw: Any) -> None:
    """Bad-input rule (found by a review): one such row in the messages table made every attempt of its batch raise
    (OverflowError in to_pylist), on every restart: no message after it was ever consumed. Its result now asks for
    the DLQ, with the row's columns as read (the engine quarantines or dead-letters it); the others are delivered."""
    good = delivered("ok", "bad", "ok")
    arrays = []
    for f in MESSAGES.arrow_schema:
        a = good.column(f.name)
        if f.name == column:
            values = a.to_pylist()
            if pa.types.is_timestamp(f.type):
                values = [None if v is None else int(v.timestamp() * 1_000_000) for v in values]
                a = pa.array([values[0], raw, values[2]], pa.int64()).cast(f.type)
            else:
                a = pa.array([values[0].encode(), raw, values[2].encode()], pa.binary()).cast(f.type, safe=False)
        arrays.append(a)
    batch = pa.RecordBatch.from_arrays(arrays, schema=MESSAGES.arrow_schema)
    seen: list[str] = []

    def listener(message: ReceivedMessage, context: ConsumeContext) -> str:
        seen.append(message.msg_id)
        return CONSUME_SUCCESS

    out = consume_batch(batch, spec(on_message=listener))
    assert seen == ["M0", "M2"] and out.num_rows == 3
    rows = out.select(["msg_id", "status", "delay_level_when_next_consume", "error_class"]).to_pylist()
    assert [(r["status"], r["delay_level_when_next_consume"]) for r in rows] == [
        (CONSUME_SUCCESS, 0), ("EXCEPTION", -1), (CONSUME_SUCCESS, 0)
    ]
    assert rows[1]["error_class"] == "retry_engine.UnreadableMessage"
    assert out.column(column).cast(pa.binary() if column == "keys" else pa.int64())[1].as_py() == raw
    # Replayed, the same result ids (R14); and as ids before this change.
    assert consume_batch(batch, spec(on_message=listener)).column("result_id") == out.column("result_id")
    from retry_engine.clients.consumer import result_id

    assert out.column("result_id")[0].as_py() == result_id("app", "M0")


def test_r1_every_verdict_but_success_is_a_failure() -> None:
    out = consume_batch(delivered("ok", "later", "none", "raise", "garbage"), spec(on_message=by_verdict)).to_pylist()
    assert [r["status"] for r in out] == [CONSUME_SUCCESS, RECONSUME_LATER, None, "EXCEPTION", "EXCEPTION"]
    assert out[3]["error_class"] == "KeyError" and "no such order" in out[3]["error_message"]
    assert out[4]["error_class"] == "InvalidConsumeStatus" and "returned 42" in out[4]["error_message"]
    assert out[2]["error_message"] == "listener returned None"
    # R5/R6: the listener's per-message settings travel with the result; others keep the defaults.
    assert (out[1]["delay_level_when_next_consume"], out[1]["max_reconsume_times"]) == (2, 4)
    assert (out[0]["delay_level_when_next_consume"], out[0]["max_reconsume_times"]) == (0, -1)
    assert {r["consumer_group"] for r in out} == {"G"} and {r["message_model"] for r in out} == {"CLUSTERING"}
    assert [r["msg_id"] for r in out] == ["M0", "M1", "M2", "M3", "M4"]
    assert len({r["result_id"] for r in out}) == 5
    assert pa.RecordBatch.from_pylist(out, schema=CONSUME_RESULTS.arrow_schema).num_rows == 5


def test_result_ids_repeat_on_replay() -> None:
    batch = delivered("ok", "later")
    first = consume_batch(batch, spec(on_message=by_verdict)).column("result_id")
    assert consume_batch(batch, spec(on_message=by_verdict)).column("result_id") == first


def test_r14_retry_delivery_shows_the_original_topic_and_a_stable_key() -> None:
    seen: list[ReceivedMessage] = []

    def record(message: ReceivedMessage, context: ConsumeContext) -> str:
        seen.append(message)
        return CONSUME_SUCCESS

    consume_batch(delivered("a", reconsume_times=3), spec(on_message=record))
    (m,) = seen
    assert (m.topic, m.delivered_topic, m.reconsume_times) == ("orders", "%RETRY%G", 3)
    assert m.delivery_key == "O0:3" and m.origin_msg_id == "O0" and m.properties == {"p": "v"}


@pytest.mark.parametrize(
    ("ack_index", "expected"),
    [
        (None, [CONSUME_SUCCESS] * 5),
        (1, [CONSUME_SUCCESS, CONSUME_SUCCESS, RECONSUME_LATER, CONSUME_SUCCESS, CONSUME_SUCCESS]),
        (-1, [RECONSUME_LATER, RECONSUME_LATER, RECONSUME_LATER, RECONSUME_LATER, RECONSUME_LATER]),
        (99, [CONSUME_SUCCESS] * 5),
    ],
)
def test_r11_batch_ack_index(ack_index: int | None, expected: list[str]) -> None:
    sizes: list[int] = []

    def on_batch(messages: list[ReceivedMessage], context: ConsumeContext) -> str:
        sizes.append(len(messages))
        context.ack_index = ack_index
        return CONSUME_SUCCESS

    out = consume_batch(delivered(*"abcde"), spec(on_batch=on_batch, batch_size=3)).to_pylist()
    assert sizes == [3, 2]
    assert [r["status"] for r in out] == expected


def test_r11_a_failed_batch_fails_every_message_whatever_the_ack_index() -> None:
    def on_batch(messages: list[ReceivedMessage], context: ConsumeContext) -> str:
        context.ack_index = 0
        return RECONSUME_LATER

    out = consume_batch(delivered("a", "b"), spec(on_batch=on_batch, batch_size=4)).to_pylist()
    assert [r["status"] for r in out] == [RECONSUME_LATER, RECONSUME_LATER]


def consumer(**options: Any) -> Consumer:
    # Subscriptions and options are checked without touching Spark.
    return Consumer(None, parse_config({}), **{"group": "G", **options})  # type: ignore[arg-type]


def test_r9_subscribing_to_a_dlq_is_refused() -> None:
    with pytest.raises(SubscriptionError, match=r"\[DLQ_NOT_CONSUMABLE\].*'%DLQ%G' is a dead-letter queue"):
        consumer().subscribe("%DLQ%G")
    with pytest.raises(SubscriptionError, match=r"\[RETRY_TOPIC_NOT_SUBSCRIBABLE\]"):
        consumer().subscribe("%RETRY%G")


def test_r2_only_clustering_reads_the_retry_topic() -> None:
    assert consumer().reads_retry is True
    assert consumer(message_model="BROADCASTING").reads_retry is False


def test_bad_names_and_options_are_clear_errors() -> None:
    with pytest.raises(InvalidNameError, match=r"\[INVALID_GROUP_NAME\] group name 'a/b' has characters outside"):
        consumer(group="a/b")
    with pytest.raises(InvalidNameError, match=r"\[INVALID_TOPIC_NAME\]"):
        consumer().subscribe("or ders")
    with pytest.raises(SubscriptionError, match=r"message_model 'PUSH' is not one of CLUSTERING, BROADCASTING"):
        consumer(message_model="PUSH")
    with pytest.raises(SubscriptionError, match=r"max_reconsume_times -2 must be"):
        consumer(max_reconsume_times=-2)
    with pytest.raises(SubscriptionError, match=r"listener must be callable, got str"):
        consumer().register_message_listener("nope")  # type: ignore[arg-type]
    with pytest.raises(SubscriptionError, match=r"batch_size 0 must be"):
        consumer().register_batch_listener(lambda ms, ctx: None, batch_size=0)
    with pytest.raises(SubscriptionError, match=r"\[NO_LISTENER\]"):
        consumer().subscribe("orders").start()


def test_tag_expressions() -> None:
    assert parse_tags("*") is None
    assert parse_tags("A || B") == ("A", "B")
    with pytest.raises(SubscriptionError, match=r"\[INVALID_TAGS\].*empty tag"):
        parse_tags("A ||")


def test_default_checkpoint_does_not_contain_the_group_name() -> None:
    path = consumer(group="billing-group").checkpoint_path
    assert "billing" not in path and "_checkpoints" in path
    assert consumer(group="billing-group", message_model="BROADCASTING").checkpoint_path != path


def test_demo_command_rejects_a_bad_message_count_before_starting_spark(capsys: pytest.CaptureFixture[str]) -> None:
    from retry_engine.ops.cli import EXIT_ERROR, main

    assert main(["demo", "--messages", "0"]) == EXIT_ERROR
    assert "[INVALID_OPTION] demo messages=0 must be a positive int" in capsys.readouterr().err


@pytest.mark.parametrize("micros", [-62_135_596_800_000_001, 253_402_300_800_000_000, -(2**63), 2**63 - 1])
def test_a_rebalance_check_from_a_store_time_no_datetime_holds_reads_every_file(micros: int) -> None:
    """(found by a review) The oldest store_timestamp of a rebalance's rows, from Spark's microseconds: one before
    year 1 (another writer's) raised OverflowError at every restart or queue gain; now no bound (every file)."""
    from retry_engine.clients.consumer import _utc_from_micros

    assert _utc_from_micros(micros) is None
    assert _utc_from_micros(1_000_000) == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC)
