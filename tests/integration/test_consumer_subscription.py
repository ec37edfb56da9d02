"""What a consumer's subscription delivers: tag expressions and where it starts (no engine needed)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from retry_engine.clients.consumer import Consumer
from retry_engine.clients.producer import Producer
from retry_engine.delta.tables import append_arrow, ensure_table
from retry_engine.ops.maintenance import expire_rows
from retry_engine.schemas import RETRY
from tests.builders import message_rows, retry_rows
from tests.lakehouse import Lake
from tests.streaming import running


def delivered(spark: Any, consumer: Consumer, name: str, then: Any = None) -> list[dict[str, Any]]:
    """Run the consumer's delivery stream into a memory table until caught up (twice if ``then``)."""
    query = consumer.deliveries().writeStream.format("memory").queryName(name).start()
    with running(query):
        query.processAllAvailable()
        if then is not None:
            then()
            query.processAllAvailable()
    return [row.asDict() for row in spark.table(name).collect()]


def test_tag_expression_delivers_only_the_listed_tags(spark: Any, tmp_path: Path) -> None:
    lake = Lake.make(tmp_path)
    producer = Producer(lake.path("messages"))
    sent = {tag: producer.send("orders", f"body {tag}", tags=tag).msg_ids[0] for tag in ("A", "B", "C")}
    untagged = producer.send("orders", "no tag").msg_ids[0]
    elsewhere = producer.send("other", "other topic", tags="A").msg_ids[0]
    consumer = Consumer(spark, lake.config, group="G").subscribe("orders", "A || B")
    rows = delivered(spark, consumer, "tags_ab")
    assert sorted(r["msg_id"] for r in rows) == sorted([sent["A"], sent["B"]])
    assert all(r["delivery_key"] == f"{r['msg_id']}:0" for r in rows)  # R14 on a first delivery
    everything = Consumer(spark, lake.config, group="G2").subscribe("orders")
    assert sorted(r["msg_id"] for r in delivered(spark, everything, "tags_all")) == sorted([*sent.values(), untagged])
    assert elsewhere not in {r["msg_id"] for r in rows}


def test_r14_a_redriven_message_has_a_delivery_key_of_its_own(spark: Any, tmp_path: Path) -> None:
    lake = Lake.make(tmp_path)
    producer = Producer(lake.path("messages"))
    plain = producer.send("orders", "first time").msg_ids[0]
    again = producer.send("orders", "re-driven twice", properties={"REDRIVE_COUNT": "2"}).msg_ids[0]
    odd = producer.send("orders", "user property", properties={"REDRIVE_COUNT": "lots"}).msg_ids[0]
    consumer = Consumer(spark, lake.config, group="G").subscribe("orders")
    keys = {r["msg_id"]: r["delivery_key"] for r in delivered(spark, consumer, "keys")}
    assert keys == {plain: f"{plain}:0", again: f"{again}:0:r2", odd: f"{odd}:0"}


def test_r14_spark_and_python_make_the_same_delivery_keys(spark: Any) -> None:
    """The consumer computes keys in Spark; decide and re-drive in Python: one rule for both."""
    from retry_engine.clients.consumer import delivery_key_column
    from retry_engine.core.names import delivery_key, redrive_count

    values = [None, "", "3", "007", "+2", " 2", "2 ", "\u00b2", "\u0663", "lots", "-1", "123456789", "1234567890", "9" * 5000]
    rows = [
        {"msg_id": f"M{i}", "origin_msg_id": None if i % 2 else "O", "reconsume_times": i % 3,
         "properties": {} if v is None else {"REDRIVE_COUNT": v}}
        for i, v in enumerate(values)
    ]
    df = spark.createDataFrame(rows, "msg_id string, origin_msg_id string, reconsume_times int, properties map<string,string>")
    got = {r["msg_id"]: r["key"] for r in df.select("msg_id", delivery_key_column().alias("key")).collect()}
    want = {
        r["msg_id"]: delivery_key(r["origin_msg_id"] or r["msg_id"], r["reconsume_times"], redrive_count(r["properties"]))
        for r in rows
    }
    assert got == want
    assert got["M2"] == "O:2:r3" and got["M7"] == "M7:1"  # "3" counts, "\u00b2" does not


def test_consume_from_latest_skips_what_was_already_there(spark: Any, tmp_path: Path) -> None:
    lake = Lake.make(tmp_path)
    producer = Producer(lake.path("messages"))
    old = producer.send("orders", "before").msg_ids[0]
    new: list[str] = []
    consumer = Consumer(spark, lake.config, group="G", consume_from="latest").subscribe("orders")
    rows = delivered(spark, consumer, "latest", then=lambda: new.extend(producer.send("orders", "after").msg_ids))
    assert [r["msg_id"] for r in rows] == new and old not in new


def test_the_streams_go_on_past_a_row_retentions_removes(spark: Any, tmp_path: Path) -> None:
    """#14 (`[maintenance] messages_retention` / `retry_retention`): maintenance removes the files of
    messages stored and retries delivered before its cut, in commits that only remove. The consumer's
    streams of both tables skip them (ignoreDeletes) and deliver what comes after; a Delta stream that
    does not stops there for good."""
    lake = Lake.make(tmp_path)
    retry, messages = lake.path("retry"), lake.path("messages")
    ensure_table(retry, RETRY.arrow_schema, partition_by=RETRY.partition_by)
    now = dt.datetime.now(dt.UTC)
    append_arrow(retry, retry_rows(now - dt.timedelta(days=2), ["r1"]))
    producer = Producer(messages)
    sent = list(producer.send("orders", "before").msg_ids)
    consumer = Consumer(spark, lake.config, group="G").subscribe("orders")
    assert consumer.reads_retry

    def expire_then_more() -> None:
        assert expire_rows(retry, "delivered_at", now - dt.timedelta(days=1)) == (1, 1)
        assert expire_rows(messages, "store_timestamp", dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)) == (1, 1)
        append_arrow(retry, retry_rows(now, ["r2"]))
        sent.extend(producer.send("orders", "after").msg_ids)

    rows = delivered(spark, consumer, "retention", then=expire_then_more)
    assert sorted(r["msg_id"] for r in rows) == sorted(["r1", "r2", *sent]) and len(sent) == 2


def test_a_consumer_stopped_past_retention_and_vacuum_goes_on_without_the_expired_rows(
    spark: Any, tmp_path: Path
) -> None:
    """#14: a consumer stopped for longer than `messages_retention` / `retry_retention` plus the vacuum
    retention finds the expired files deleted. Like RocketMQ's consumer behind the commit log's
    retention it goes on without them (logged) and delivers what came after; before, the stream stopped
    with `DELTA_FILE_MISSING` for good."""
    lake = Lake.make(tmp_path)
    retry, messages = lake.path("retry"), lake.path("messages")
    ensure_table(retry, RETRY.arrow_schema, partition_by=RETRY.partition_by)
    producer = Producer(messages)
    first = list(producer.send("orders", "first").msg_ids)
    consumer = Consumer(spark, lake.config, group="G").subscribe("orders")
    got: list[str] = []

    def run() -> None:
        query = (
            consumer.deliveries().writeStream.option("checkpointLocation", str(tmp_path / "ck"))
            .foreachBatch(lambda frame, _: got.extend(r["msg_id"] for r in frame.select("msg_id").collect()))
            .start()
        )
        with running(query):
            query.processAllAvailable()

    run()
    assert got == first
    # While it is stopped: rows it has not read yet pass the retention, expire, and vacuum deletes them.
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    append_arrow(retry, retry_rows(old, ["r-old"]))
    append_arrow(messages, message_rows(["m-old"], [old]))
    for path, column in ((retry, "delivered_at"), (messages, "store_timestamp")):
        assert expire_rows(path, column, old + dt.timedelta(days=7), stamped=True) == (1, 1)
        DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    append_arrow(retry, retry_rows(dt.datetime.now(dt.UTC), ["r-new"]))
    after = list(producer.send("orders", "after").msg_ids)
    run()
    assert sorted(got) == sorted([*first, "r-new", *after])
