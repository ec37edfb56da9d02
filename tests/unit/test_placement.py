"""State keys placed on the stateful stage's partitions (#14 part 5, #15 goal 2; B1 across the change).

The engine names its state keys so that Spark's own hash partitioning puts
consecutive buckets of a group, and the sub-keys of a bucket, on different
partitions. These tests check the hash against Spark's, the placement against
Spark's stateful operator, and that a duplicate still meets its original when
a checkpoint of an earlier release starts placing keys.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from retry_engine.config import parse_config
from retry_engine.core import _placement
from retry_engine.core._placement import (
    MAX_PLACED_PARTITIONS,
    place,
    placed_route,
    spark_hash,
    spark_partition,
    target_partition,
)
from retry_engine.core._state_splits import base_of, level_route
from retry_engine.core.packed import pack
from retry_engine.core.schedule import (
    KEYS_FILE,
    ScheduleStage,
    StateKeySplit,
    group_of,
    state_key_split,
)
from retry_engine.delta._checkpoint import shuffle_partitions_of
from retry_engine.errors import StateUnreadableError
from tests.builders import T0, Result, work_rows
from tests.unit.test_schedule import MINUTE_MS, HeldState
from tests.unit.test_schedule_keys import _through_stage

CONFIG = parse_config({"engine": {"message_delay_level": "1h", "state_bucket": "10s"}})
BUCKET_MS = 10_000
INT64 = (-(2**63), 2**63 - 1)

# Routes that stress the hash: empty, every tail length 1-7, bytes >= 0x80 in the tail (Spark
# sign-extends them), NUL, multi-byte UTF-8, long, and the engine's own suffixes.
HOSTILE_ROUTES = [
    "", "G", "ab", "abc", "abcd", "abcde", "GID_orders-1", "\x00", "\x00\x00\x00\x00\x00",
    "é", "日本", "日本語のグループ", "\U0001f600", "a\u0080", "%RETRY%x|y", "G#07", "G#07#~12",
    "G#~3#L4.9", "x" * 1001,
]
HOSTILE_BUCKETS = [0, 1, -1, 2**31 - 1, 2**31, -(2**31), 2**32, 2**32 + 1, 176_400_000_123, *INT64]


def _pairs() -> list[tuple[str, int]]:
    rng = random.Random(20261127)
    alphabet = "aZ9_-%|#~é日\x00\U0001f600"
    randoms = [
        ("".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 24))), rng.randrange(*INT64))
        for _ in range(300)
    ]
    return [(r, b) for r in HOSTILE_ROUTES for b in HOSTILE_BUCKETS[::3]] + randoms


def test_the_hash_is_sparks_own_for_any_route_and_bucket(spark: Any) -> None:
    """Spark's ``hash(route, bucket)`` and the partition its hash partitioning gives a (route, bucket)
    key, for hostile and random pairs and several partition counts, equal this module's."""
    from pyspark.sql import functions as F

    pairs = _pairs()
    frame = spark.createDataFrame(pairs, "route string, bucket long")
    hashed = frame.select("route", "bucket", F.hash("route", "bucket").alias("h")).collect()
    assert [(r.route, r.bucket, r.h) for r in hashed] == [(r, b, spark_hash(r, b)) for r, b in pairs]
    for partitions in (2, 3, 7, 200):
        placed = frame.repartition(partitions, "route", "bucket").select(
            "route", "bucket", F.spark_partition_id().alias("p")
        )
        wrong = [(r.route, r.bucket) for r in placed.collect() if r.p != spark_partition(r.route, r.bucket, partitions)]
        assert wrong == [], partitions


def test_the_stateful_operator_runs_each_placed_key_on_its_target_partition(spark: Any, tmp_path: Path) -> None:
    """The engine's claim, on Spark's own stateful operator (``applyInPandasWithState`` grouped by
    route and bucket, as the engine's): every placed key runs in the task of its target partition,
    and 4 groups x 6 consecutive buckets fill both partitions of the test session evenly, where the
    same keys unplaced do not."""
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    assert partitions == 2
    groups = ["orders", "payments", "GID_audit", "billing-eu"]
    buckets = range(176_400_000, 176_400_006)
    keys = [(g, b) for g in groups for b in buckets]
    rows = [(placed_route(g, b, partitions), b) for g, b in keys] + [(f"plain:{g}", b) for g, b in keys]
    source = tmp_path / "keys"
    spark.createDataFrame(rows, "route string, bucket long").write.parquet(str(source))

    def where(key: tuple[str, int], frames: Any, state: Any) -> Any:
        from pyspark import TaskContext

        for _ in frames:
            pass
        yield pd.DataFrame({"route": [key[0]], "bucket": [key[1]], "p": [TaskContext.get().partitionId()]})

    query = (
        spark.readStream.schema("route string, bucket long").parquet(str(source))
        .groupBy("route", "bucket")
        .applyInPandasWithState(where, "route string, bucket long, p int", "n long", "append",
                                GroupStateTimeout.NoTimeout)
        .writeStream.format("memory").queryName("placement_probe").outputMode("append")
        .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    )
    query.awaitTermination()
    ran = {(r.route, r.bucket): r.p for r in spark.table("placement_probe").collect()}
    placed = {k: ran[(placed_route(*k, partitions), k[1])] for k in keys}
    assert placed == {(g, b): target_partition(g, b, partitions) for g, b in keys}
    assert Counter(placed.values()) == {0: 12, 1: 12}
    for g in groups:  # consecutive buckets of a group alternate between the two partitions
        runs = [placed[(g, b)] for b in buckets]
        assert all(a != b for a, b in zip(runs, runs[1:], strict=False)), (g, runs)
    plain = Counter(ran[(f"plain:{g}", b)] for g, b in keys)
    assert plain == Counter(spark_partition(f"plain:{g}", b, partitions) for g, b in keys)


@pytest.mark.parametrize("partitions", [2, 3, 8, 200])
def test_a_placed_route_lands_on_its_target_and_keeps_its_group(partitions: int) -> None:
    """Consecutive buckets take consecutive partitions; sub-keys of one bucket all partitions; the
    route still names its group, and size-split levels under it still find their base."""
    for route in ("G", "orders", "G#03", "日本"):
        for bucket in (0, 176_400_001, -5, 2**62):
            placed = placed_route(route, bucket, partitions)
            assert placed.startswith(f"{route}#~") and spark_partition(placed, bucket, partitions) == target_partition(
                route, bucket, partitions
            )
            assert group_of(placed) == group_of(route)
            assert base_of(level_route(placed, 3, 5)) == placed
    firsts = [spark_partition(placed_route("G", b, partitions), b, partitions) for b in range(100, 100 + partitions)]
    assert sorted(firsts) == list(range(partitions))
    subs = [spark_partition(placed_route(f"G#{n:02d}", 100, partitions), 100, partitions) for n in range(partitions)]
    assert sorted(subs) == list(range(partitions))


def test_the_largest_placed_count_still_finds_its_target() -> None:
    for bucket in range(5):
        placed = placed_route("GID_orders", bucket, MAX_PLACED_PARTITIONS)
        assert spark_partition(placed, bucket, MAX_PLACED_PARTITIONS) == target_partition(
            "GID_orders", bucket, MAX_PLACED_PARTITIONS
        )


def _no_hashing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any hash of a candidate suffix fails the test: what is not placed is never searched for."""

    def refuse(*_: object) -> None:
        raise AssertionError("a suffix was searched for")

    monkeypatch.setattr(_placement, "_mix_bytes", refuse)


def test_what_is_not_placed_keeps_its_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """One partition, more than MAX_PLACED_PARTITIONS (a hostile count must not start a search of
    ~count tries), rows without state, buckets before the first placed one and null routes keep
    their route."""
    routes = pa.array(["G", None, "H", "G"])
    buckets = pa.array([7, 7, None, 7], pa.int64())
    with monkeypatch.context() as patched:
        _no_hashing(patched)
        assert place(routes, buckets, 1) is routes
        assert place(routes, buckets, 10**12) is routes
        assert placed_route("G", 7, MAX_PLACED_PARTITIONS + 1) == "G"
    assert place(routes, buckets, 2).to_pylist() == [placed_route("G", 7, 2), None, None, placed_route("G", 7, 2)]

    work = work_rows([Result.of("OK-1").ok(), Result.of("F-1").failed()], batch_ts=T0, config=CONFIG)
    bucket = max(work.column("bucket").to_pylist())
    before = StateKeySplit(subkeys=1, partitions=2, first_placed_bucket=bucket + 1)(work)
    assert before.column("route").to_pylist() == work.column("route").to_pylist()
    now = dict(
        zip(
            work.column("consumed_msg_id").to_pylist(),
            StateKeySplit(subkeys=1, partitions=2, first_placed_bucket=bucket)(work).column("route").to_pylist(),
            strict=True,
        )
    )
    assert now == {"OK-1": "G", "F-1": placed_route("G", bucket, 2)}


def test_a_checkpoint_that_starts_placing_keys_still_meets_every_duplicate() -> None:
    """B1 across the upgrade: failures decided by a release without placement (plain keys) and re-sent
    after the keys file gained placement from the next bucket on are duplicates; failures of later
    buckets go to placed keys, and their re-sent results meet them there."""
    stage = ScheduleStage(dedup_window_ms=10 * MINUTE_MS)
    states: dict[tuple[str, int], HeldState] = {}
    old = [Result.of(f"OLD-{i}", group=g).failed() for i, g in enumerate(["G", "H"] * 20)]
    old_work = work_rows(old, batch_ts=T0, config=CONFIG)
    first = _through_stage(pack(StateKeySplit(subkeys=4)(old_work)), states, T0, stage)
    assert first.column("outcome").to_pylist() == ["retry"] * len(old)

    upgraded = StateKeySplit(subkeys=4, partitions=2, first_placed_bucket=max(old_work.column("bucket").to_pylist()) + 1)
    later = T0 + dt.timedelta(minutes=30)
    new = [
        Result.of(f"NEW-{i}", group=g).failed(store_timestamp=later - dt.timedelta(seconds=i))
        for i, g in enumerate(["G", "H"] * 20)
    ]
    new_work = upgraded(work_rows(new, batch_ts=later, config=CONFIG))
    assert all("#~" in r for r in new_work.column("route").to_pylist())
    assert _through_stage(pack(new_work), states, later, stage).column("outcome").to_pylist() == ["retry"] * len(new)

    again = [r.with_(result_id=f"again-{i}") for i, r in enumerate(old + new)]
    resent = _through_stage(pack(upgraded(work_rows(again, batch_ts=later, config=CONFIG))), states, later, stage)
    assert resent.column("outcome").to_pylist() == ["duplicate"] * len(again)


def _offsets(root: Path, *lines: str) -> None:
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "offsets" / "0").write_text("\n".join(lines) + "\n")


def test_the_keys_file_records_placement_and_an_earlier_releases_file_gains_it(tmp_path: Path) -> None:
    """A new checkpoint records the session's partition count, placing every bucket; a keys file of the
    release before placement gains the count Spark recorded in the checkpoint's offsets (not the
    session's) and places only buckets after the start; later starts read it back unchanged."""
    fresh = tmp_path / "fresh"
    assert state_key_split(str(fresh), bucket_ms=BUCKET_MS, now_ms=5, partitions=2) == StateKeySplit(
        1, None, partitions=2, first_placed_bucket=None, bucket_ms=BUCKET_MS
    )
    assert json.loads((fresh / KEYS_FILE).read_text()) == {
        "subkeys": 1, "split_since_ms": None, "partitions": 2, "placed_since_ms": None, "bucket_ms": BUCKET_MS,
    }
    assert state_key_split(str(fresh), bucket_ms=BUCKET_MS, now_ms=9_000_000, partitions=8).partitions == 2

    old = tmp_path / "old"
    _offsets(old, "v1", json.dumps({"batchWatermarkMs": 0, "conf": {"spark.sql.shuffle.partitions": "3"}}), "{}")
    old.joinpath(KEYS_FILE).write_text('{"subkeys": 4, "split_since_ms": 1000}\n')
    expected = StateKeySplit(4, 1, partitions=3, first_placed_bucket=124, bucket_ms=BUCKET_MS)
    assert state_key_split(str(old), bucket_ms=BUCKET_MS, now_ms=1_234_567, subkeys=1, partitions=2) == expected
    assert json.loads((old / KEYS_FILE).read_text()) == {
        "subkeys": 4, "split_since_ms": 1000, "partitions": 3, "placed_since_ms": 1_234_567, "bucket_ms": BUCKET_MS,
    }
    assert state_key_split(str(old), bucket_ms=BUCKET_MS, now_ms=9_999_999, subkeys=4, partitions=2) == expected
    assert sorted(p.name for p in old.iterdir()) == ["offsets", KEYS_FILE]  # no partial left


@pytest.mark.parametrize(
    "offsets",
    [("v1",), ("v1", "{not json"), ("v1", "[]"), ("v1", '{"conf": {}}'), ("v1", '{"conf": {"spark.sql.shuffle.partitions": "abc"}}'),
     ("v1", '{"conf": {"spark.sql.shuffle.partitions": "0"}}'), ("v1", '{"conf": {"spark.sql.shuffle.partitions": "-3"}}'),
     ("v1", '{"conf": "2"}'), ("\xff\xfe",)],
)
def test_unreadable_offsets_give_no_partition_count_and_the_session_count_is_recorded(
    tmp_path: Path, offsets: tuple[str, ...]
) -> None:
    _offsets(tmp_path, *offsets)
    assert shuffle_partitions_of(str(tmp_path)) is None
    assert state_key_split(str(tmp_path), bucket_ms=BUCKET_MS, now_ms=20_000, partitions=2).partitions == 2


@pytest.mark.parametrize(
    "recorded",
    [
        '{"subkeys": 1, "split_since_ms": null, "partitions": 0, "placed_since_ms": null}',
        '{"subkeys": 1, "split_since_ms": null, "partitions": -2, "placed_since_ms": null}',
        '{"subkeys": 1, "split_since_ms": null, "partitions": "2", "placed_since_ms": null}',
        '{"subkeys": 1, "split_since_ms": null, "partitions": true, "placed_since_ms": null}',
        '{"subkeys": 1, "split_since_ms": null, "partitions": 2.5, "placed_since_ms": null}',
        '{"subkeys": 1, "split_since_ms": null, "partitions": null, "placed_since_ms": null}',
        '{"subkeys": 1, "split_since_ms": null, "partitions": 2, "placed_since_ms": "x"}',
        '{"subkeys": 1, "split_since_ms": null, "partitions": 2, "placed_since_ms": false}',
        '{"subkeys": 1, "split_since_ms": null, "partitions": 2}',
        '{"subkeys": 0, "split_since_ms": null}',
        "[1, 2]",
        "7",
    ],
)
def test_a_damaged_keys_file_stops_the_start_and_is_left_as_it_was(tmp_path: Path, recorded: str) -> None:
    (tmp_path / KEYS_FILE).write_text(recorded)
    with pytest.raises(StateUnreadableError, match=r"\[STATE_KEYS_FILE_INVALID\].*retry_engine_state_keys.json"):
        state_key_split(str(tmp_path), bucket_ms=BUCKET_MS, now_ms=0, partitions=2)
    assert (tmp_path / KEYS_FILE).read_text() == recorded


def test_a_hostile_partition_count_in_the_keys_file_places_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    work = work_rows([Result.of("F-1").failed()], batch_ts=T0, config=CONFIG)
    _no_hashing(monkeypatch)
    assert StateKeySplit(subkeys=1, partitions=2**62)(work).column("route").to_pylist() == ["G"]
