"""CLUSTERING instances of one group share the queues; BROADCASTING gets everything (#12 item 19).

RocketMQ's rebalance (``AllocateMessageQueueAveragely``) over real Delta
tables and real streaming queries. Members sort as ``A@one`` < ``B@two`` <
``C@three``; with two live members and 4 topic queues (the producer's
default) plus 2 retry queues (``retry_queue_nums = 2``), the first member
owns topic queues 0-1 and retry queue 0, the second topic queues 2-3 and
retry queue 1 (derived by hand: 4 / 2 = 2 each; 2 / 2 = 1 each).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from retry_engine.clients.consumer import CONSUME_SUCCESS, Consumer, _RebalancedBatch
from retry_engine.clients.producer import Message, Producer
from retry_engine.clients.rebalance import Membership
from retry_engine.delta import ensure_table
from retry_engine.schemas import RETRY
from tests.builders import Result
from tests.lakehouse import Lake, start_consumer, wait_for

pytestmark = pytest.mark.slow

T0 = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
FIRST = ({"orders": {0, 1}, "%RETRY%G": {0}})
SECOND = ({"orders": {2, 3}, "%RETRY%G": {1}})
EVERYTHING = {"orders": {0, 1, 2, 3}, "%RETRY%G": {0, 1}}


def ok(message: Any, context: Any) -> str:
    return CONSUME_SUCCESS


class Sent:
    """Messages and retry rows written so far, with the queue each one is in."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.producer = Producer(lake.path("messages"))
        self.queue: dict[str, tuple[str, int]] = {}
        self.unreadable: set[Path] = set()
        """Data files a test made unreadable: not read here either."""
        ensure_table(lake.path("retry"), RETRY.arrow_schema, partition_by=RETRY.partition_by)

    def messages(self, n: int, tag: str) -> set[str]:
        ids = set(self.producer.send_batch([Message("orders", f"{tag}-{i}") for i in range(n)]).msg_ids)
        files = [f for f in DeltaTable(self.lake.path("messages")).file_uris() if Path(f) not in self.unreadable]
        rows = {r["msg_id"]: r["queue_id"] for f in files for r in pq.read_table(f, columns=["msg_id", "queue_id"]).to_pylist()}
        self.queue.update({m: ("orders", rows[m]) for m in ids})
        return ids

    def retries(self, n: int, tag: str) -> set[str]:
        rows = [
            {"msg_id": f"R-{tag}-{i}", "topic": "%RETRY%G", "consumer_group": "G", "queue_id": i % 2,
             "reconsume_times": 1, "origin_msg_id": f"O-{tag}-{i}", "retry_topic": "orders", "body": b"r",
             "store_timestamp": T0, "delivery_key": f"O-{tag}-{i}:1"}
            for i in range(n)
        ]
        write_deltalake(self.lake.path("retry"), pa.Table.from_pylist(rows, schema=RETRY.arrow_schema), mode="append")
        self.queue.update({r["msg_id"]: ("%RETRY%G", r["queue_id"]) for r in rows})
        return {r["msg_id"] for r in rows}

    def owned_by(self, ids: set[str], owned: dict[str, set[int]]) -> set[str]:
        return {m for m in ids if self.queue[m][1] in owned[self.queue[m][0]]}


def results(lake: Lake) -> list[dict[str, Any]]:
    return lake.rows("consume_results")


def consumed(lake: Lake, queries: list[Any]) -> set[str]:
    """msg ids with a consume result; fails at once if a query died (rather than at the timeout)."""
    for query in queries:
        if query.exception() is not None:
            raise AssertionError(f"query {query.name} failed: {query.exception()}")
    return {r["msg_id"] for r in results(lake)}


def consumer(spark: Any, lake: Lake, cid: str, instance: str, **options: Any) -> Consumer:
    base: dict[str, Any] = dict(
        group="G", consumer_id=cid, instance_name=instance, trigger_interval="300 milliseconds",
        heartbeat_interval_seconds=0.5, heartbeat_expiry_seconds=6000,
    )
    c = Consumer(spark, lake.config, **{**base, **options}).subscribe("orders")
    return c.register_message_listener(ok)


def test_clustering_instances_split_the_queues_and_the_survivor_takes_over(spark: Any, tmp_path: Path) -> None:
    """#12 item 19, R2/R3, B1: together they consume every message and retry once, no overlap.

    Phase 1: A and B split the queues. Phase 2: B stops without leaving (a
    crash); while its heartbeat is fresh A leaves B's queues alone. Phase 3:
    B's heartbeat expires; A takes every queue and also delivers what B never
    consumed. Phase 4: C joins with a new checkpoint reading from the start:
    it skips what the group consumed and shares the new rows with A; once its
    query stops, C leaves the group.
    """
    lake = Lake.make(tmp_path, groups={"G": {"retry_queue_nums": 2}})
    sent = Sent(lake)
    # Expiries are long (6000 s) so a slow machine never expires anyone by accident. B beats at
    # start and never again during the test: stopping its query then is a crash.
    a = consumer(spark, lake, "A", "one")
    b = consumer(spark, lake, "B", "two", heartbeat_interval_seconds=3000)
    c = consumer(spark, lake, "C", "three")
    queries = []
    try:
        phase1 = sent.messages(12, "p1") | sent.retries(6, "p1")
        a.heartbeat()
        b.heartbeat()
        start_consumer(a, queries)
        qb = start_consumer(b, queries)
        wait_for(lambda: consumed(lake, queries) >= phase1, timeout=300, what="phase 1 consumed")
        by = Counter((r["msg_id"], r["consumer_id"]) for r in results(lake))
        assert all(n == 1 for n in by.values())
        assert {m for m, cid in by if cid == "A"} == sent.owned_by(phase1, FIRST)
        assert {m for m, cid in by if cid == "B"} == sent.owned_by(phase1, SECOND)

        qb.stop()  # a crash: B's heartbeat file stays and counts as live
        phase2 = sent.messages(8, "p2") | sent.retries(4, "p2")
        a_share = sent.owned_by(phase2, FIRST)
        wait_for(lambda: consumed(lake, queries) >= a_share, timeout=300, what="A's share of phase 2")
        assert not {r["msg_id"] for r in results(lake)} & (phase2 - a_share)  # B's queues wait for B

        # B's last heartbeat is now three hours old: past A's 6000 s expiry.
        Membership(str(tmp_path), "G", "B@two").beat(dt.datetime.now(dt.UTC) - dt.timedelta(hours=3))
        phase3 = sent.messages(4, "p3") | sent.retries(2, "p3")
        wait_for(lambda: consumed(lake, queries) >= phase1 | phase2 | phase3, timeout=300,
                 what="phase 2 and 3 consumed after the take-over")
        assert a.last_assignment is not None and a.last_assignment.members == ("A@one",)
        assert {t: set(q) for t, q in a.last_assignment.owned.items()} == EVERYTHING
        by = Counter(r["msg_id"] for r in results(lake))
        assert all(n == 1 for n in by.values()), [m for m, n in by.items() if n > 1]

        c.heartbeat()
        trigger = sent.messages(1, "p4-trigger")
        wait_for(lambda: a.last_assignment is not None and "C@three" in a.last_assignment.members, timeout=300,
                 what="A seeing C")
        qc = start_consumer(c, queries)
        phase4 = sent.messages(8, "p4") | sent.retries(4, "p4")
        everything = phase1 | phase2 | phase3 | trigger | phase4
        wait_for(lambda: consumed(lake, queries) >= everything, timeout=300, what="phase 4 consumed")
        rows = results(lake)
        by = Counter(r["msg_id"] for r in rows)
        assert all(n == 1 for n in by.values()), [m for m, n in by.items() if n > 1]
        assert set(by) == everything
        owner = {r["msg_id"]: r["consumer_id"] for r in rows}
        assert {m for m in phase4 if owner[m] == "A"} == sent.owned_by(phase4, FIRST)
        assert {m for m in phase4 if owner[m] == "C"} == sent.owned_by(phase4, SECOND)

        # A query stopped without shutdown() still leaves the group (its heartbeat thread notices).
        qc.stop()
        wait_for(lambda: not c.membership.file.exists(), timeout=120, what="C to leave after its query stopped")
        assert a.membership.live() == ["A@one"]
    finally:
        for query in queries:
            query.stop()
        for instance in (a, b, c):
            instance.shutdown()


def test_a_window_reads_the_consume_results_since_its_rows_were_stored(spark: Any, tmp_path: Path) -> None:
    """B1, #14 (reads that grow with the lake's age): a new checkpoint opens a window over every owned
    queue, and each of its batches checked the rows against every column of every consume result the
    group ever wrote (21-24 s a batch at 1M results). Now only three columns are read, of the files whose
    ``consumed_at`` statistics reach the rows' store time less ``clock_skew_seconds``: results of
    40 days ago are not read (their files are made unreadable), those of another instance an hour
    ago still keep their messages from being consumed twice; another group's or a BROADCASTING
    result does not."""
    lake = Lake.make(tmp_path)
    sent = Sent(lake)
    ids = sorted(sent.messages(10, "w"))
    now = dt.datetime.now(dt.UTC)
    old = now - dt.timedelta(days=40)
    for k in range(2):  # months-old results, a file each
        lake.write_results([Result.of(f"OLD-{k}-{i}").with_(consumed_at=old) for i in range(3)])
    by_b = ids[:4]
    lake.write_results(
        [Result.of(m).ok().with_(consumer_id="B@two", consumed_at=now - dt.timedelta(hours=1)) for m in by_b]
        + [Result.of(ids[4], group="H").ok(), Result.of(ids[5]).ok().with_(message_model="BROADCASTING")]
    )
    junk = [f for f in Path(lake.path("consume_results")).glob("*.parquet")
            if set(pq.read_table(f)["msg_id"].to_pylist()) <= {f"OLD-{k}-{i}" for k in range(2) for i in range(3)}]
    assert len(junk) == 2
    for file in junk:
        file.write_bytes(b"not parquet")

    def by_a() -> Counter[str]:  # the results A wrote (the junk files are not read here either)
        for query in queries:
            assert query.exception() is None, query.exception()
        files = [f for f in DeltaTable(lake.path("consume_results")).file_uris() if Path(f).name not in names]
        rows = pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()
        return Counter(r["msg_id"] for r in rows if r["consumer_id"] == "A")

    names = {f.name for f in junk}
    a = consumer(spark, lake, "A", "one")
    queries: list[Any] = []
    try:
        start_consumer(a, queries)
        wait_for(lambda: set(by_a()) >= set(ids) - set(by_b), timeout=300, what="the messages B did not consume")
        assert a.last_assignment is not None and a.last_assignment.windows  # a new checkpoint: windows
        mine = by_a()
        assert set(mine) == set(ids) - set(by_b) and set(mine.values()) == {1}
    finally:
        for query in queries:
            query.stop()
        a.shutdown()


def test_the_time_a_window_reads_results_from(spark: Any, tmp_path: Path) -> None:
    """The oldest store time of the rows a window checks, less the skew; never later than now; every file
    (None) for a row without a time, one Spark cannot read as a time (text another producer wrote), or a
    bound before the first time a datetime holds. No row inside: nothing to read."""
    rebalance = _RebalancedBatch(
        spark=spark, group="G", spec=None, writer=None, membership=None,  # type: ignore[arg-type]
        queue_counts={}, sources={}, topic_filter=lambda _: None, records=str(tmp_path),  # type: ignore[arg-type,return-value]
        results_path=str(tmp_path / "cr"), clock_skew_seconds=600,
    )

    def since(times: list[Any], kind: str = "timestamp") -> tuple[bool, dt.datetime | None]:
        rows = spark.createDataFrame([(f"m{i}", t) for i, t in enumerate(times)], f"msg_id string, store_timestamp {kind}")
        return rebalance._stored_since(rows)

    t1, t2 = T0, T0 + dt.timedelta(hours=5)
    skew = dt.timedelta(seconds=600)
    assert since([]) == (False, None)
    assert since([t2, t1, t2]) == (True, t1 - skew)
    assert since([t1, None]) == (True, None)
    assert since(["2026-11-23T12:00:00Z", "2026-11-23T15:00:00Z"], "string") == (True, t1 - skew)
    assert since(["2026-11-23T12:00:00Z", "not a time"], "string") == (True, None)
    before = dt.datetime.now(dt.UTC)
    found, future = since([before + dt.timedelta(days=3650)])
    assert found and future is not None and before - skew <= future <= dt.datetime.now(dt.UTC) - skew
    assert since([dt.datetime(1, 1, 1, 0, 5, tzinfo=dt.UTC)]) == (True, None)
    # Several frames (a window's rows and a catch-up's, one of them another writer's text): their oldest.
    frames = [spark.createDataFrame([("a", t2)], "msg_id string, store_timestamp timestamp"),
              spark.createDataFrame([("b", "2026-11-23T12:00:00Z")], "msg_id string, store_timestamp string"),
              spark.createDataFrame([], "msg_id string, store_timestamp timestamp")]
    assert rebalance._stored_since(*frames) == (True, t1 - skew)
    assert rebalance._stored_since(frames[0], frames[2]) == (True, t2 - skew)
    assert rebalance._stored_since(frames[2]) == (False, None) and rebalance._stored_since() == (False, None)


def test_a_group_consuming_from_latest_never_catches_up_what_came_before_it(spark: Any, tmp_path: Path) -> None:
    """R2/R3, B1: a group started with consume_from='latest' never consumes what its topic held before
    it started. A queue that comes back to an instance (another instance joined and left) is caught
    up from the table: only its rows the stream passed that no instance consumed. (Every message the
    topic held before the group started was delivered on the first rebalance.)"""
    lake = Lake.make(tmp_path)
    sent = Sent(lake)
    before = sent.messages(8, "old")
    # One machine, one clock: no skew to allow for (rows stored up to the skew before the start may be caught up).
    a = consumer(spark, lake, "A", "one", consume_from="latest", clock_skew_seconds=0)
    b = consumer(spark, lake, "B", "two", consume_from="latest", clock_skew_seconds=0)
    queries: list[Any] = []
    try:
        start_consumer(a, queries)
        first = sent.messages(4, "p1")
        wait_for(lambda: consumed(lake, queries) >= first, timeout=300, what="A consuming what came after it")
        b.heartbeat()  # B joins (no query): A gives up half the queues ...
        sent.messages(1, "tick")
        seen = wait_for(lambda: a.last_assignment if a.last_assignment and "B@two" in a.last_assignment.members
                        else None, timeout=300, what="A seeing B")
        b.shutdown()  # ... and takes them back when B leaves: a catch-up of those queues
        sent.messages(1, "tock")
        back = wait_for(lambda: a.last_assignment if a.last_assignment.batch_id > seen.batch_id else None,
                        timeout=300, what="A's next batch")
        assert back.members == ("A@one",) and back.catch_up  # the queues came back: caught up
        last = sent.messages(4, "p2")
        wait_for(lambda: consumed(lake, queries) >= last, timeout=300, what="A consuming the last messages")
        assert not consumed(lake, queries) & before
    finally:
        for query in queries:
            query.stop()
        a.shutdown()


def test_a_gainer_catches_up_only_what_came_after_the_groups_published_offsets(spark: Any, tmp_path: Path) -> None:
    """#14 (reads that grow with the lake's age), R2/R3, B1: every rolling restart moves queues, and the
    gainer's catch-up read the gained queues' whole history (bodies too) and every consume result of
    the group. Now each instance publishes, per owned queue, the version through which the group
    consumed it; the gainer reads only the files added after it, and the results since those rows
    were stored. Here the first rows' data files are made unreadable once both instances consumed
    them: a catch-up that read them would fail the query. B stops (its last rows unconsumed: it
    crashed), then leaves; A catches up B's share of what came after B's offsets, exactly once.
    Then C joins with a new checkpoint: its stream starts after the group's offsets (as a new
    instance of a RocketMQ group resumes at the group's offsets), not at the first row."""
    lake = Lake.make(tmp_path, groups={"G": {"retry_queue_nums": 2}})
    sent = Sent(lake)
    a = consumer(spark, lake, "A", "one")
    # B beats (and publishes) once at start and then only when it shuts down: stopping its query is a crash.
    b = consumer(spark, lake, "B", "two", heartbeat_interval_seconds=3000)
    c = consumer(spark, lake, "C", "three")
    queries: list[Any] = []
    try:
        phase1 = sent.messages(12, "p1") | sent.retries(6, "p1")
        first_files = {p for t in ("messages", "retry") for p in Path(lake.path(t)).rglob("*.parquet")}
        a.heartbeat()
        b.heartbeat()
        start_consumer(a, queries)
        qb = start_consumer(b, queries)
        wait_for(lambda: consumed(lake, queries) >= phase1, timeout=300, what="phase 1 consumed")
        versions = {t: DeltaTable(lake.path(t)).version() for t in ("messages", "retry")}
        for file in first_files:
            file.write_bytes(b"not parquet")
        sent.unreadable = first_files

        qb.stop()
        phase2 = sent.messages(12, "p2") | sent.retries(6, "p2")
        a_share = sent.owned_by(phase2, FIRST)
        wait_for(lambda: consumed(lake, queries) >= a_share, timeout=300, what="A's share of phase 2")
        assert not consumed(lake, queries) & (phase2 - a_share)
        b.shutdown()  # publishes what it consumed (phase 1), then leaves: A gains its queues
        published = json.loads((b.membership.folder / "offsets" / b.membership.file.name).read_text())
        through = {t: o["through"] for t, o in published["topics"].items()}
        assert through == {"orders": {"2": versions["messages"], "3": versions["messages"]},
                           "%RETRY%G": {"1": versions["retry"]}}
        trigger = sent.messages(1, "p3")  # a batch runs when a row comes
        wait_for(lambda: consumed(lake, queries) >= phase1 | phase2 | trigger, timeout=300,
                 what="B's share caught up by A")
        by = Counter((r["msg_id"], r["consumer_id"]) for r in results(lake))
        assert all(n == 1 for n in by.values()) and len(by) == len(phase1 | phase2 | trigger)
        assert {m for m, cid in by if cid == "A"} == sent.owned_by(phase1, FIRST) | phase2 | trigger
        records = [json.loads(p.read_text()) for p in (Path(a.checkpoint_path) / "rebalance").glob("*.json")
                   if p.stem.isdigit()]
        (gain,) = [r for r in records if r["catch_up"]]
        assert gain["catch_up_after"] == {"orders": versions["messages"], "%RETRY%G": versions["retry"]}
        assert gain["consumed_through"]["orders"]["2"] >= gain["catch_up_versions"]["orders"]

        # C joins with a new checkpoint: its streams start after the group's offsets (A's, every queue),
        # not at the first row (whose files it cannot read), and it shares the new rows with A.
        # (Nothing was resent to C: a row resent to it would be in no offset.)
        wait_for(lambda: (a.membership.folder / "offsets" / a.membership.file.name).exists(), what="A's offsets")
        c.heartbeat()
        start_consumer(c, queries)
        phase4 = sent.messages(8, "p4") | sent.retries(4, "p4")
        everything = phase1 | phase2 | trigger | phase4
        wait_for(lambda: consumed(lake, queries) >= everything, timeout=300, what="phase 4 consumed")
        by_msg = Counter(r["msg_id"] for r in results(lake))
        assert set(by_msg) == everything and set(by_msg.values()) == {1}
        owner = {r["msg_id"]: r["consumer_id"] for r in results(lake)}
        assert {m for m in phase4 if owner[m] == "C"} == sent.owned_by(phase4, SECOND)
    finally:
        for query in queries:
            query.stop()
        for instance in (a, b, c):
            instance.shutdown()
