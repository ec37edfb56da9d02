"""Producer -> consumer -> engine -> consumer again, on real Spark and Delta (fast delay levels).

One module-scoped run shares the engine among three consumers:
G1 (per message, CLUSTERING): ``ok`` messages succeed, ``flaky`` ones fail twice
(RECONSUME_LATER, then None) and succeed, ``poison`` ones raise with a
per-message max_reconsume_times of 2. Its first instance cannot write some
results (injected storage errors): a transient one is retried inside the batch,
a lasting one fails the query, which is restarted on the same checkpoint.
B (BROADCASTING) fails the poison messages. G2 (batch listener) acks only the
first message of every first-delivery batch.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery

from retry_engine.clients.consumer import (
    CONSUME_SUCCESS,
    RECONSUME_LATER,
    ConsumeContext,
    Consumer,
    ReceivedMessage,
    ResultWriter,
)
from retry_engine.clients.producer import Message, Producer
from retry_engine.core import engine
from retry_engine.delta.session import (
    ARROW_MAX_BYTES_KEY,
    ARROW_MAX_BYTES_NONE,
    ARROW_MAX_BYTES_PER_BATCH,
)
from tests.lakehouse import Lake, wait_for

pytestmark = pytest.mark.slow

KINDS = {"ok": 3, "flaky": 3, "poison": 2}
BATCH_MESSAGES = 7
TIMEOUT = 240.0


@dataclass
class InjectedFailures(ResultWriter):
    """Storage errors: every batch's first attempt fails; a batch with a redelivery always fails."""

    calls: Counter[int] = field(default_factory=Counter)

    def commit(self, batch: DataFrame, batch_id: int) -> None:
        self.calls[batch_id] += 1
        if self.calls[batch_id] == 1:
            raise OSError(f"injected: storage unavailable (batch {batch_id})")
        if not batch.filter("reconsume_times >= 1").isEmpty():
            raise OSError(f"injected: storage still unavailable (batch {batch_id})")
        super().commit(batch, batch_id)


@dataclass
class Run:
    lake: Lake
    ids: dict[str, list[str]]
    seen_g1: Path
    chunks_g2: Path
    first_instance_error: str
    writer_calls: Counter[int]

    def results(self, group: str) -> list[dict[str, Any]]:
        return [r for r in self.lake.rows("consume_results") if r["consumer_group"] == group]

    def jsonl(self, path: Path) -> list[Any]:
        return [json.loads(line) for line in path.read_text().splitlines()]


def _listeners(seen: str, chunks: str) -> tuple[Any, Any, Any]:
    # Nested functions are shipped to the Python workers by value.
    def g1(message: ReceivedMessage, context: ConsumeContext) -> Any:
        with open(seen, "a") as out:
            out.write(json.dumps([message.msg_id, message.delivery_key, message.reconsume_times,
                                  message.origin_msg_id, message.topic]) + "\n")
        if message.keys == "poison":
            context.max_reconsume_times = 2
            raise RuntimeError(f"cannot process {message.origin_msg_id}")
        if message.keys == "flaky" and message.reconsume_times < 2:
            return [RECONSUME_LATER, None][message.reconsume_times]
        return CONSUME_SUCCESS

    def broadcast(message: ReceivedMessage, context: ConsumeContext) -> Any:
        if message.keys == "poison":
            raise RuntimeError("broadcast failure")
        return CONSUME_SUCCESS

    def g2(messages: list[ReceivedMessage], context: ConsumeContext) -> Any:
        if any(m.reconsume_times == 0 for m in messages):
            context.ack_index = 0
        with open(chunks, "a") as out:
            out.write(json.dumps([[m.msg_id for m in messages], context.ack_index]) + "\n")
        return CONSUME_SUCCESS

    return g1, broadcast, g2


def _done(lake: Lake, ids: dict[str, list[str]], queries: list[StreamingQuery]) -> bool:
    for q in queries:
        if q.exception() is not None:
            raise AssertionError(f"query {q.name} failed") from q.exception()
    results = lake.rows("consume_results")
    ok = {(r["consumer_group"], r["origin_msg_id"] or r["msg_id"]) for r in results if r["status"] == CONSUME_SUCCESS}
    g1_done = all(("G1", m) in ok for m in ids["ok"] + ids["flaky"])
    g2_done = all(("G2", m) in ok for m in ids["batch"])
    dead = [d for d in lake.rows("dlq") if d["consumer_group"] == "G1"]
    broadcast = [o for o in lake.rows("outcomes") if o["consumer_group"] == "B"]
    return g1_done and g2_done and len(dead) == len(ids["poison"]) and len(broadcast) == sum(KINDS.values())


@pytest.fixture(scope="module")
def run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("clients")
    lake = Lake.make(root / "lake")
    producer = Producer(lake.path("messages"))
    ids: dict[str, list[str]] = {}
    for kind, n in KINDS.items():
        ids[kind] = list(producer.send_batch([Message("orders", f"{kind}-{i}", keys=kind) for i in range(n)]).msg_ids)
    ids["batch"] = list(producer.send_batch([Message("batch", f"b{i}") for i in range(BATCH_MESSAGES)]).msg_ids)
    seen, chunks = root / "seen-g1.jsonl", root / "chunks-g2.jsonl"
    g1, broadcast, g2 = _listeners(str(seen), str(chunks))

    def consumer(group: str, **options: Any) -> Consumer:
        return Consumer(spark, lake.config, group=group, trigger_interval="200 milliseconds",
                        write_backoff_seconds=0.05, **options)

    queries: list[StreamingQuery] = []

    def start(query: StreamingQuery) -> StreamingQuery:
        # One at a time: each query spawns Python source runners, and a busy machine
        # fails spawns that overlap ("Python worker failed to connect back").
        queries.append(query)
        wait_for(lambda: query.exception() or query.lastProgress, timeout=TIMEOUT, what=f"{query.name} to start")
        return query

    try:
        start(engine.start(spark, lake.config))
        first = consumer("G1", write_attempts=2).subscribe("orders").register_message_listener(g1)
        failing = InjectedFailures(**vars(first.result_writer()))
        g1_first = start(first.start(result_writer=failing))
        # The consumer's query has the Arrow byte cap (bodies of up to max_body_bytes reach its
        # listeners' Python), the session none (run U: the deltars sink's wide rows).
        stream_conf = g1_first._jsq.streamingQuery().sparkSessionForStream().conf()
        assert stream_conf.get(ARROW_MAX_BYTES_KEY) == str(ARROW_MAX_BYTES_PER_BATCH)
        assert spark.conf.get(ARROW_MAX_BYTES_KEY) == ARROW_MAX_BYTES_NONE
        others = [
            start(consumer("B", message_model="BROADCASTING").subscribe("orders").register_message_listener(broadcast).start()),
            start(consumer("G2").subscribe("batch").register_batch_listener(g2, batch_size=3).start()),
        ]
        healthy = [queries[0], *others]
        wait_for(lambda: _done(lake, ids, healthy) or g1_first.exception(), timeout=TIMEOUT,
                 what="G1's first instance to fail its write")
        error = str(g1_first.exception())
        healthy.append(start(consumer("G1").subscribe("orders").register_message_listener(g1).start()))
        wait_for(lambda: _done(lake, ids, healthy), timeout=TIMEOUT, what="every message to succeed or reach the DLQ")
    finally:
        for q in queries:
            q.stop()
    yield Run(lake, ids, seen, chunks, error, failing.calls)


def test_r1_failing_messages_come_back_with_growing_reconsume_times_then_succeed(run: Run) -> None:
    results = run.results("G1")
    for origin in run.ids["flaky"]:
        mine = sorted((r for r in results if (r["origin_msg_id"] or r["msg_id"]) == origin),
                      key=lambda r: r["reconsume_times"])
        assert [(r["reconsume_times"], r["status"]) for r in mine] == [
            (0, RECONSUME_LATER), (1, None), (2, CONSUME_SUCCESS)
        ]
        assert [r["topic"] for r in mine] == ["orders", "%RETRY%G1", "%RETRY%G1"]
        assert len({r["msg_id"] for r in mine}) == 3  # each retry is a new message (R7)
    for origin in run.ids["ok"]:
        assert [(r["reconsume_times"], r["status"]) for r in results if r["msg_id"] == origin] == [(0, CONSUME_SUCCESS)]


def test_r6_an_always_failing_message_ends_in_the_dlq_after_its_max_reconsume_times(run: Run) -> None:
    dead = [d for d in run.lake.rows("dlq") if d["consumer_group"] == "G1"]
    assert sorted(d["origin_msg_id"] for d in dead) == sorted(run.ids["poison"])
    for d in dead:
        assert (d["topic"], d["reconsume_times"], d["reason_code"]) == ("%DLQ%G1", 3, "MAX_RECONSUME_TIMES")
        assert [a["status"] for a in d["attempts"]] == ["EXCEPTION"] * 3
        assert d["error_class"] == "RuntimeError" and "cannot process" in d["error_message"]
    poison_results = [r for r in run.results("G1") if (r["origin_msg_id"] or r["msg_id"]) in run.ids["poison"]]
    assert sorted(r["reconsume_times"] for r in poison_results) == [0, 0, 1, 1, 2, 2]
    assert {r["max_reconsume_times"] for r in poison_results} == {2}


def test_r2_broadcasting_failures_are_recorded_drops_not_retries(run: Run) -> None:
    results = run.results("B")
    assert sorted(r["msg_id"] for r in results) == sorted(run.ids["ok"] + run.ids["flaky"] + run.ids["poison"])
    outcomes = {o["msg_id"]: (o["outcome"], o["reason_code"]) for o in run.lake.rows("outcomes") if o["consumer_group"] == "B"}
    for msg_id in run.ids["poison"]:
        assert outcomes[msg_id] == ("dropped", "BROADCASTING_NOT_RETRIED")
    assert Counter(o for o, _ in outcomes.values()) == {"acknowledged": 6, "dropped": 2}
    assert [r for r in run.lake.rows("retry") if r["consumer_group"] == "B"] == []


def test_r11_batch_listener_ack_index_is_honoured(run: Run) -> None:
    results = run.results("G2")
    status = {r["msg_id"]: (r["status"], r["reconsume_times"]) for r in results}
    firsts = [(ms, ack) for ms, ack in run.jsonl(run.chunks_g2) if ack == 0]
    assert firsts, "no first-delivery batch was recorded"
    covered = set()
    for msg_ids, _ in firsts:
        covered.update(msg_ids)
        assert [status[m] for m in msg_ids] == [(CONSUME_SUCCESS, 0)] + [(RECONSUME_LATER, 0)] * (len(msg_ids) - 1)
    assert covered == set(run.ids["batch"])
    # The messages after the ack index came back once and then succeeded.
    failed = sum(len(ms) - 1 for ms, _ in firsts)
    retried = [r for r in results if r["reconsume_times"] == 1]
    assert len(retried) == failed and {r["status"] for r in retried} == {CONSUME_SUCCESS}


def test_r12_a_restart_after_failed_writes_loses_and_duplicates_no_result(run: Run) -> None:
    assert "CONSUME_RESULT_WRITE_FAILED" in run.first_instance_error
    assert any(n == 2 for n in run.writer_calls.values())  # a transient failure was retried in the batch
    results = run.results("G1")
    per_message = Counter(r["msg_id"] for r in results)
    assert set(per_message.values()) == {1}, per_message
    delivered = set(run.ids["ok"] + run.ids["flaky"] + run.ids["poison"])
    delivered |= {r["msg_id"] for r in run.lake.rows("retry") if r["consumer_group"] == "G1"}
    assert set(per_message) == delivered
    assert len(results) == 3 * 1 + 3 * 3 + 2 * 3
    assert len({r["result_id"] for r in run.lake.rows("consume_results")}) == len(run.lake.rows("consume_results"))


def test_r14_every_delivery_carries_origin_and_reconsume_times_as_its_key(run: Run) -> None:
    retry_keys = {r["msg_id"]: r["delivery_key"] for r in run.lake.rows("retry")}
    seen = run.jsonl(run.seen_g1)
    by_key: dict[str, set[str]] = defaultdict(set)
    for msg_id, key, reconsume, origin, topic in seen:
        assert key == f"{origin}:{reconsume}" and topic == "orders"
        if reconsume:
            assert retry_keys[msg_id] == key
        by_key[key].add(msg_id)
    # Redelivery of the replayed batch repeats keys, never with another message id.
    assert all(len(v) == 1 for v in by_key.values())
    assert len(by_key) == 3 * 1 + 3 * 3 + 2 * 3
