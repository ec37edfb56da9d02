"""The engine end to end on real Spark and real Delta tables (fast delay levels)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from retry_engine.core import engine
from retry_engine.core._parked import PARKED_DIR
from retry_engine.core.delays import parse_delay_levels
from retry_engine.delta import storage
from tests.builders import Result
from tests.lakehouse import FAST_LEVELS, Lake, wait_for

pytestmark = pytest.mark.slow


def redeliver(row: dict[str, Any], *, status: str = "RECONSUME_LATER", **extra: Any) -> Result:
    """What a consumer of %RETRY%G writes after processing retry row ``row``."""
    message = {k: row[k] for k in ("msg_id", "topic", "tags", "keys", "body", "flag", "properties",
                                   "born_timestamp", "born_host", "store_timestamp", "queue_id",
                                   "reconsume_times", "origin_msg_id", "retry_topic", "attempts")}
    return Result.of(row["msg_id"], group=row["consumer_group"]).with_(
        **message, status=status, consumed_at=dt.datetime.now(dt.UTC),
        result_id=f"res-{row['msg_id']}", error_message=f"fail #{row['reconsume_times']}", **extra
    )


def run_ladder(lake: Lake, first: Result, *, timeout: float = 240) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Fail ``first`` and every retry of it until it reaches the DLQ; return (retries, dead letters)."""
    lake.write_results([first])
    handled: set[str] = set()

    def step() -> list[dict[str, Any]]:
        dlq = lake.rows("dlq")
        if dlq:
            return dlq
        fresh = [r for r in lake.rows("retry") if r["msg_id"] not in handled]
        if fresh:
            handled.update(r["msg_id"] for r in fresh)
            lake.write_results([redeliver(r) for r in fresh])
        return []

    dlq = wait_for(step, timeout=timeout, what="the message to reach the DLQ")
    return lake.rows("retry"), dlq


def test_r5_r6_r7_r8_full_ladder_then_dlq(spark: Any, tmp_path: Path) -> None:
    """The seeds' ladder: 16 retries at levels 3..18, then %DLQ%G with reconsume_times 17.

    The whole ladder runs on the FileSystem-based checkpoint manager, which the
    engine picks for a checkpoint on local disk (#15: no process starts per file),
    and with every retry parked in a file outside Spark's state (``state_park_bytes``
    0, #14 part 5): each rung is released from its file.
    """
    lake = Lake.make(tmp_path, engine={"state_park_bytes": 0})
    spark.conf.unset(storage.CHECKPOINT_FILE_MANAGER)
    query = engine.start(spark, lake.config)
    assert spark.conf.get(storage.CHECKPOINT_FILE_MANAGER) == storage.FILESYSTEM_CHECKPOINT_MANAGER
    try:
        retries, dlq = run_ladder(lake, Result.of("FIRST").failed())
    finally:
        query.stop()
    retries.sort(key=lambda r: r["reconsume_times"])
    assert [r["reconsume_times"] for r in retries] == list(range(1, 17))
    assert [r["delay_level"] for r in retries] == list(range(3, 19))
    assert {r["origin_msg_id"] for r in retries} == {"FIRST"}
    assert {r["retry_topic"] for r in retries} == {"orders"}
    assert {r["topic"] for r in retries} == {"%RETRY%G"}
    assert len({r["msg_id"] for r in retries}) == 16
    delays = parse_delay_levels(FAST_LEVELS)
    for r in retries:
        # R8: never early, and the wait is the level's delay.
        assert r["delivered_at"] >= r["due_at"]
        assert r["due_at"] - r["scheduled_at"] == dt.timedelta(milliseconds=delays[r["delay_level"] - 1])
        assert r["delivery_key"] == f"FIRST:{r['reconsume_times']}"  # R14
    parked = sorted(p.name for p in (Path(lake.config.checkpoint_path) / PARKED_DIR).iterdir())
    assert len([n for n in parked if n.endswith(".arrow")]) == 16, parked  # one file per rung, each released
    assert len([n for n in parked if ".arrow.done_" in n]) == 16, parked
    (dead,) = dlq
    assert dead["topic"] == "%DLQ%G" and dead["reconsume_times"] == 17
    assert dead["origin_msg_id"] == "FIRST" and dead["reason_code"] == "MAX_RECONSUME_TIMES"
    assert len(dead["attempts"]) == 17  # B4: every failed attempt travels with it


def test_r5_short_custom_levels_clamp_to_top(spark: Any, tmp_path: Path) -> None:
    lake = Lake.make(tmp_path, groups={"G": {"retry_max_times": 5, "backoff": {"levels": "150ms 200ms 250ms"}}})
    query = engine.start(spark, lake.config)
    try:
        retries, dlq = run_ladder(lake, Result.of("C1").failed())
    finally:
        query.stop()
    assert sorted(r["delay_level"] for r in retries) == [3, 3, 3, 3, 3]
    assert dlq[0]["reconsume_times"] == 6


def test_every_input_row_has_exactly_one_outcome(spark: Any, tmp_path: Path) -> None:
    """R1, R2, R10 and bad input in one stream; duplicates produce one retry (B1)."""
    lake = Lake.make(
        tmp_path,
        engine={"auto_create_groups": False},
        groups={"G": {}, "off": {"retry_queue_nums": 0}},
    )
    failing = Result.of("DUP").failed()
    batch = [
        Result.of("A1").ok(),
        failing,
        failing.with_(result_id="again-1"),
        Result.of("B1").failed(message_model="BROADCASTING"),
        Result.of("N1").with_(status=None),
        Result.of("X1", group="off").failed(),
        Result.of("U1", group="ghost").failed(),
        Result.of("Q1").with_(status="WHATEVER"),
        Result.of(None).with_(msg_id=None),
        Result.of("D1").failed(delay_level_when_next_consume=-1),
    ]
    query = engine.start(spark, lake.config)
    try:
        lake.write_results(batch)
        wait_for(lambda: len(lake.rows("outcomes")) >= len(batch), what="outcomes of the first commit")
        lake.write_results([failing.with_(result_id="again-2")])  # a later duplicate
        wait_for(lambda: len(lake.rows("outcomes")) >= len(batch) + 1, what="outcome of the duplicate")
        wait_for(lambda: len(lake.rows("retry")) >= 2, what="two retries")
    finally:
        query.stop()
    outcomes = lake.rows("outcomes")
    by_result = Counter(o["result_id"] for o in outcomes)
    assert all(n == 1 for n in by_result.values()), by_result
    # Every input row is accounted for, quarantined ones included.
    named = {r.values["result_id"] for r in batch} | {"again-2"}
    assert named <= set(by_result) and len(by_result) == len(batch) + 1
    got = {o["result_id"]: (o["outcome"], o["reason_code"]) for o in outcomes}
    ids = {r.values["msg_id"]: r.values["result_id"] for r in batch if r.values["msg_id"]}
    assert got[ids["A1"]] == ("acknowledged", None)
    assert got[ids["B1"]] == ("dropped", "BROADCASTING_NOT_RETRIED")
    assert got[ids["N1"]][0] == "retry"
    assert got[ids["X1"]] == ("dropped", "RETRY_DISABLED")
    assert got[ids["U1"]] == ("quarantined", "SUBSCRIPTION_GROUP_NOT_EXIST")
    assert got[ids["Q1"]] == ("quarantined", "UNKNOWN_STATUS")
    assert got[ids["D1"]] == ("dead_letter", "DLQ_REQUESTED")
    dup_outcomes = [got[r][0] for r in (failing.values["result_id"], "again-1", "again-2")]
    assert dup_outcomes == ["retry", "duplicate", "duplicate"]
    retries = lake.rows("retry")
    assert sorted(r["origin_msg_id"] for r in retries) == ["DUP", "N1"]
    quarantine = lake.rows("quarantine")
    assert {q["reason_code"] for q in quarantine} == {"SUBSCRIPTION_GROUP_NOT_EXIST", "UNKNOWN_STATUS", "MISSING_MSG_ID"}
    assert [d["origin_msg_id"] for d in lake.rows("dlq")] == ["D1"]


def test_released_parked_files_are_deleted_by_the_running_engine(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#14 part 5 / #15 goal 4 clean-up on real Spark: every retry parked (``state_park_bytes`` 0) leaves
    a file in the checkpoint; once released it is marked, and the engine deletes file and marker when
    the marking batch is older than the state versions kept (2 here instead of Spark's 100, swept every
    batch instead of every 20), while every retry is in %RETRY% exactly once."""
    monkeypatch.setattr(engine, "SWEEP_EVERY_BATCHES", 1)
    monkeypatch.setattr(engine, "_batches_retained", lambda _spark: 2)
    lake = Lake.make(tmp_path, engine={"state_park_bytes": 0})
    folder = Path(lake.config.checkpoint_path) / PARKED_DIR
    query = engine.start(spark, lake.config)
    try:
        lake.write_results([Result.of(f"P{i}").failed() for i in range(5)])
        wait_for(lambda: len(lake.rows("retry")) >= 5, timeout=120, what="the 5 retries")
        # The folder exists only once a key parked; empty, every file and marker was deleted.
        wait_for(lambda: folder.is_dir() and not any(folder.iterdir()), timeout=120,
                 what="the released files and markers deleted")
        assert query.exception() is None
    finally:
        engine.stop(query)
    assert sorted(r["origin_msg_id"] for r in lake.rows("retry")) == [f"P{i}" for i in range(5)]
