"""State sub-keys of the schedule stage: a mass failure in one key stays bounded, dedup still holds (#12 item 17)."""

from __future__ import annotations

import datetime as dt
import json
import zlib
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pytest

from retry_engine.config import parse_config
from retry_engine.core.packed import pack, unpack
from retry_engine.core.schedule import (
    KEYS_FILE,
    ScheduleStage,
    StateKeySplit,
    group_of,
    state_key_split,
)
from retry_engine.errors import StateUnreadableError
from tests.builders import T0, Result, work_rows
from tests.unit.test_schedule import MINUTE_MS, HeldState

CONFIG = parse_config({"engine": {"message_delay_level": "1h"}})
SUBKEYS = 32
N = 2000


def _through_stage(
    packed: pa.RecordBatch,
    states: dict[tuple[str, int], HeldState],
    now: dt.datetime,
    stage: ScheduleStage,
) -> pa.Table:
    """Every key of ``packed`` through the stage, each with its own state, as Spark's groupBy would."""
    frames: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    for route, bucket, payload in zip(
        *(packed.column(i).to_pylist() for i in range(3)), strict=True
    ):
        frames[(route, bucket)].append(payload)
    out: list[bytes] = []
    for key, payloads in frames.items():
        state = states.setdefault(key, HeldState(now))
        state.now_ms = int(now.timestamp() * 1000)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([key[0]] * len(payloads)),
                pa.array([key[1]] * len(payloads), pa.int64()),
                pa.array(payloads, pa.binary()),
            ],
            names=["route", "bucket", "payload"],
        )
        out += [
            p for frame in stage(key, iter([batch.to_pandas()]), state) for p in frame["payload"]
        ]
    return unpack(out)


def test_a_mass_failure_in_one_key_is_spread_over_bounded_sub_keys_and_duplicates_meet_their_original() -> (
    None
):
    """#12 item 17, B1: N failures of one group with one store time (one (group, bucket) key) end up in
    SUBKEYS state values, each holding only the msg ids whose CRC-32 picks it and far less than the
    unsplit value; every re-sent result, after the dedup window and before its retry is due, is a
    duplicate (#12 item 6), never a second retry."""
    results = [Result.of(f"MASS-{i:05d}").failed() for i in range(N)]
    work = work_rows(results, batch_ts=T0, config=CONFIG)
    assert len(set(work.column("bucket").to_pylist())) == 1 and set(
        work.column("route").to_pylist()
    ) == {"G"}
    stage = ScheduleStage(dedup_window_ms=10 * MINUTE_MS)
    split = StateKeySplit(subkeys=SUBKEYS)

    states: dict[tuple[str, int], HeldState] = {}
    first = _through_stage(pack(split(work)), states, T0, stage)
    assert first.column("outcome").to_pylist() == ["retry"] * N
    assert len(states) == SUBKEYS
    for (route, _), state in states.items():
        group, nn = route.split("#")
        ids = pa.ipc.open_stream(state.get[0]).read_all().column("consumed_msg_id").to_pylist()
        assert group == "G" and group_of(route) == "G"
        assert {zlib.crc32(i.encode()) % SUBKEYS for i in ids} == {int(nn)}
        assert len(ids) < 2 * N / SUBKEYS

    unsplit: dict[tuple[str, int], HeldState] = {}
    _through_stage(pack(work), unsplit, T0, stage)
    (whole,) = unsplit.values()
    largest = max(len(s.get[0]) for s in states.values())
    assert largest * SUBKEYS / 2 < len(whole.get[0])

    # Re-sent results 30 minutes later (window over, retries due in 1h): each meets its original.
    again = work_rows(
        [r.with_(result_id=f"again-{i}") for i, r in enumerate(results[::7])],
        batch_ts=T0,
        config=CONFIG,
    )
    later = T0 + dt.timedelta(minutes=30)
    resent = _through_stage(pack(split(again)), states, later, stage)
    assert resent.column("outcome").to_pylist() == ["duplicate"] * again.num_rows
    assert len(states) == SUBKEYS  # no new key appeared
    # Due: the keys' timeouts fire (Spark calls each with no rows); each retry is released once.
    due = T0 + dt.timedelta(hours=1, seconds=1)
    out: list[bytes] = []
    for key, state in states.items():
        state.now_ms = int(due.timestamp() * 1000)
        out += [p for frame in stage(key, iter([]), state) for p in frame["payload"]]
    deliveries = unpack(out)
    assert sorted(deliveries.column("consumed_msg_id").to_pylist()) == sorted(
        r.values["msg_id"] for r in results
    )


def test_rows_without_state_and_buckets_of_an_older_release_keep_their_key() -> None:
    """#12 items 13 and 17: acknowledged rows (no state) are not re-keyed; nor are buckets before the
    first split bucket, whose state a release without sub-keys wrote under the plain key."""
    work = work_rows(
        [Result.of("OK-1").ok(), Result.of("F-1").failed()], batch_ts=T0, config=CONFIG
    )
    routes = dict(
        zip(
            work.column("consumed_msg_id").to_pylist(),
            work.column("route").to_pylist(),
            strict=True,
        )
    )
    bucket = max(work.column("bucket").to_pylist())
    split = StateKeySplit(subkeys=SUBKEYS, first_split_bucket=bucket + 1)(work)
    assert split.column("route").to_pylist() == work.column("route").to_pylist()
    now_split = dict(
        zip(
            work.column("consumed_msg_id").to_pylist(),
            StateKeySplit(subkeys=SUBKEYS, first_split_bucket=bucket)(work)
            .column("route")
            .to_pylist(),
            strict=True,
        )
    )
    assert now_split["OK-1"] == routes["OK-1"]
    assert now_split["F-1"] == f"G#{zlib.crc32(b'F-1') % SUBKEYS:02d}"


def test_the_sub_key_rule_is_fixed_per_checkpoint(tmp_path: Path) -> None:
    """#12 items 13 and 17: a new checkpoint splits every bucket; one that a release without sub-keys
    already ran (it has offsets) splits only buckets after the first start; the rule is recorded and
    read back unchanged on every later start, and a damaged record stops the start with a clear error."""
    bucket_ms = 10_000
    fresh = tmp_path / "fresh"
    assert state_key_split(str(fresh), bucket_ms=bucket_ms, now_ms=1_000_000, subkeys=32) == StateKeySplit(
        32, None, bucket_ms=bucket_ms
    )
    # A later start with another engine.state_subkeys keeps the checkpoint's count.
    assert state_key_split(str(fresh), bucket_ms=bucket_ms, now_ms=9_000_000, subkeys=4) == StateKeySplit(
        32, None, bucket_ms=bucket_ms
    )
    assert [p.name for p in fresh.iterdir()] == [KEYS_FILE]  # written aside and renamed: no partial left

    old = tmp_path / "old"
    (old / "offsets").mkdir(parents=True)
    (old / "offsets" / "0").write_text("v1\n")
    # Placement (tests/unit/test_placement.py) starts with the sub-keys here: same bucket.
    assert state_key_split(str(old), bucket_ms=bucket_ms, now_ms=1_234_567, subkeys=32) == StateKeySplit(
        32, 124, first_placed_bucket=124, bucket_ms=bucket_ms
    )
    assert state_key_split(str(old), bucket_ms=bucket_ms, now_ms=9_999_999, subkeys=1) == StateKeySplit(
        32, 124, first_placed_bucket=124, bucket_ms=bucket_ms
    )
    assert json.loads((old / KEYS_FILE).read_text()) == {
        "subkeys": 32, "split_since_ms": 1_234_567, "partitions": 1, "placed_since_ms": 1_234_567,
        "bucket_ms": bucket_ms,
    }

    for bad in (
        "{not json",
        '{"subkeys": 0, "split_since_ms": null}',
        '["x"]',
        '{"subkeys": true, "split_since_ms": null}',
        '{"subkeys": 4, "split_since_ms": false}',
        '{"subkeys": "4", "split_since_ms": null}',
    ):
        (old / KEYS_FILE).write_text(bad)
        with pytest.raises(
            StateUnreadableError, match=r"\[STATE_KEYS_FILE_INVALID\].*retry_engine_state_keys.json"
        ):
            state_key_split(str(old), bucket_ms=bucket_ms, now_ms=0)


def test_a_new_checkpoint_takes_the_configured_sub_key_count(tmp_path: Path) -> None:
    """#12 item 17: engine.state_subkeys (default 1: no fixed split, size-bounded splits instead) is what
    a new checkpoint records."""
    from retry_engine.config import parse_config

    assert parse_config({}).engine.state_subkeys == 1
    assert state_key_split(str(tmp_path / "d"), bucket_ms=1000, now_ms=0) == StateKeySplit(1, None, bucket_ms=1000)
    configured = parse_config({"engine": {"state_subkeys": 64}}).engine.state_subkeys
    assert state_key_split(str(tmp_path / "c"), bucket_ms=1000, now_ms=0, subkeys=configured) == StateKeySplit(
        64, None, bucket_ms=1000
    )


@pytest.mark.parametrize("value", [0, -1, 1025, 2**63, "4", 4.5, True, None])
def test_state_subkeys_config_refuses_hostile_values(value: object) -> None:
    from retry_engine.config import parse_config
    from retry_engine.errors import ConfigError

    with pytest.raises(ConfigError, match="state_subkeys"):
        parse_config({"engine": {"state_subkeys": value}})


def test_the_bucket_width_is_fixed_per_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """B1: a new checkpoint records engine.state_bucket; a later start with another width keeps the
    recorded one (and says so), and a keys file of an earlier release gains the configured width."""
    fresh = tmp_path / "fresh"
    assert state_key_split(str(fresh), bucket_ms=10_000, now_ms=0).bucket_ms == 10_000
    with caplog.at_level("WARNING", logger="retry_engine.core.schedule"):
        assert state_key_split(str(fresh), bucket_ms=3_600_000, now_ms=0).bucket_ms == 10_000
    assert "keeps the 10000 ms it was created with (engine.state_bucket = 3600000 ms" in caplog.text

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / KEYS_FILE).write_text('{"subkeys": 4, "split_since_ms": 5, "partitions": 2, "placed_since_ms": 5}\n')
    assert state_key_split(str(earlier), bucket_ms=2_000, now_ms=99).bucket_ms == 2_000
    assert json.loads((earlier / KEYS_FILE).read_text()) == {
        "subkeys": 4, "split_since_ms": 5, "partitions": 2, "placed_since_ms": 5, "bucket_ms": 2_000,
    }


@pytest.mark.parametrize("width", ["0", "-1000", '"1000"', "true", "1.5", "null", "[1]"])
def test_a_damaged_bucket_width_stops_the_start_and_is_left_as_it_was(tmp_path: Path, width: str) -> None:
    recorded = f'{{"subkeys": 1, "split_since_ms": null, "partitions": 2, "placed_since_ms": null, "bucket_ms": {width}}}'
    (tmp_path / KEYS_FILE).write_text(recorded)
    with pytest.raises(StateUnreadableError, match=r"\[STATE_KEYS_FILE_INVALID\].*bucket_ms"):
        state_key_split(str(tmp_path), bucket_ms=1000, now_ms=0)
    assert (tmp_path / KEYS_FILE).read_text() == recorded
