"""``dlq resend`` on real Spark and Delta (#13 part 5): only the named instance delivers it.

Two CLUSTERING instances of group billing, ``host@1@DEFAULT`` < ``host@2@DEFAULT``.
billing has one retry queue (the default ``retry_queue_nums = 1``), so by
RocketMQ's averaging rule (1 queue / 2 members: the first takes it) host@1
owns all of ``%RETRY%billing``. The dead letter is resent to host@2: the pin,
not the queue, decides who delivers it.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from retry_engine.clients import dlq
from retry_engine.clients.consumer import CONSUME_SUCCESS, Consumer
from retry_engine.clients.producer import Message, Producer
from retry_engine.ops.resend import resend
from retry_engine.schemas import DLQ
from tests.lakehouse import Lake, start_consumer, wait_for

pytestmark = pytest.mark.slow

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


def ok(message: Any, context: Any) -> str:
    return CONSUME_SUCCESS


def instance(spark: Any, lake: Lake, tmp_path: Path, consumer_id: str) -> Consumer:
    return (
        Consumer(
            spark, lake.config, group="billing", consumer_id=consumer_id, checkpoint=str(tmp_path / f"ck-{consumer_id}"),
            trigger_interval="300ms", heartbeat_interval_seconds=0.5, heartbeat_expiry_seconds=6000,
        )
        .subscribe("orders")
        .register_message_listener(ok)
    )


def results(lake: Lake, queries: list[Any]) -> list[dict[str, Any]]:
    for query in queries:
        if query.exception() is not None:
            raise AssertionError(f"query {query.name} failed: {query.exception()}")
    return lake.rows("consume_results")


def test_a_resent_dead_letter_is_delivered_only_by_the_named_instance(spark: Any, tmp_path: Path) -> None:
    """#13 part 5, R3, B5: resend D1 to host@2; host@1 owns its queue but never delivers it."""
    lake = Lake.make(tmp_path / "lake")
    dead = {
        "msg_id": "D1", "topic": "%DLQ%billing", "consumer_group": "billing", "origin_msg_id": "O1",
        "retry_topic": "orders", "reconsume_times": 17, "delivery_key": "O1:17", "body": b"payload",
        "reason_code": "MAX_RECONSUME_TIMES", "dead_lettered_at": NOW,
    }
    write_deltalake(lake.path("dlq"), pa.Table.from_pylist([dead], schema=DLQ.arrow_schema), partition_by=["consumer_group"])
    a, b = instance(spark, lake, tmp_path, "host@1"), instance(spark, lake, tmp_path, "host@2")
    queries: list[Any] = []
    try:
        for consumer in (a, b):
            consumer.heartbeat()
        for consumer in (a, b):
            start_consumer(consumer, queries)  # one at a time: overlapping worker spawns fail on a busy machine
        report = resend(lake.config, "O1", consumer_id="host@2")
        assert report.instance == "host@2@DEFAULT" and report.redrive.moved == 1
        resent = report.resent_msg_id
        # Messages committed after the resend: an instance that consumed one of them planned a batch
        # after the resend's commit, so its stream has already passed the resent row.
        producer = Producer(lake.path("messages"))
        markers = set(producer.send_batch([Message("orders", f"after-{i}") for i in range(12)]).msg_ids)
        wait_for(lambda: {r["msg_id"] for r in results(lake, queries)} >= markers | {resent}, timeout=300,
                 what="the resent message and every marker consumed")
        rows = results(lake, queries)
        owners = {r["msg_id"]: r["consumer_id"] for r in rows}
        assert "host@1" in {owners[m] for m in markers}  # host@1's stream is past the resent row
        assert a.last_assignment is not None and a.last_assignment.owned["%RETRY%billing"] == (0,)
        assert b.last_assignment is not None and b.last_assignment.owned["%RETRY%billing"] == ()
        deliveries = Counter((r["msg_id"], r["consumer_id"]) for r in rows if r["msg_id"] == resent)
        assert deliveries == Counter({(resent, "host@2"): 1})
    finally:
        for query in queries:
            query.stop()
        for consumer in (a, b):
            consumer.shutdown()
    # dlq show: the instance that consumed the resent message, and the resend itself.
    history = dlq.history(lake.config, "D1")
    consumed = history[history["event"] == "consumed: CONSUME_SUCCESS"]
    assert consumed[["msg_id", "consumer_id"]].values.tolist() == [[resent, "host@2"]]
    assert "resend moved to one consumer" in set(history["event"])
