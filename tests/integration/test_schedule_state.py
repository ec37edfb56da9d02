"""The schedule stage's state across releases, in a real checkpoint on real Spark and Delta (#12 items 3, 13)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from retry_engine.core import engine
from retry_engine.core.schedule import KEYS_FILE, ScheduleStage, StateKeySplit
from retry_engine.delta._arrow_ipc import from_ipc, to_ipc
from tests.builders import Result
from tests.lakehouse import Lake, wait_for

pytestmark = pytest.mark.slow


class _StoredAs:
    """Spark's GroupState, passed through, except that stored blobs carry ``metadata`` instead of ours."""

    def __init__(self, state: Any, metadata: dict[bytes, bytes] | None) -> None:
        self._state = state
        self._metadata = metadata

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)

    def update(self, value: tuple[Any, ...]) -> None:
        pending, seen, expires_ms = value
        self._state.update(
            (
                to_ipc(from_ipc(pending).replace_schema_metadata(self._metadata)),
                to_ipc(from_ipc(seen).replace_schema_metadata(self._metadata)),
                expires_ms,
            )
        )


class _FutureReleaseStage(ScheduleStage):
    """The schedule stage of a (pretend) later release whose state layout (99) this release does not know."""

    stored_metadata: dict[bytes, bytes] | None = {b"retry_engine.state_version": b"99"}

    def __call__(
        self, key: tuple[str, int], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        return super().__call__(key, frames, _StoredAs(state, self.stored_metadata))


class _MainStage(_FutureReleaseStage):
    """The schedule stage as main a97474f stored its state: unversioned blobs (no metadata)."""

    stored_metadata = None


def test_a_state_this_release_cannot_read_is_quarantined_and_the_stream_goes_on(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad-input rule, R8, #12 items 3 and 13: a later release writes state layout 99 into the checkpoint
    and is rolled back. Today's engine, restarted on that checkpoint, does not fail the batch: when the
    key wakes it moves the state aside to the quarantine table (STATE_UNREADABLE, the version in the
    reason, the pending retry's bytes in raw) and goes on deciding and releasing new failures."""
    lake = Lake.make(tmp_path, engine={"message_delay_level": "15s"})
    old = Result.of("OLD-1").failed()
    monkeypatch.setattr(engine, "ScheduleStage", _FutureReleaseStage)
    query = engine.start(spark, lake.config)
    try:
        lake.write_results([old])
        first = wait_for(lambda: lake.rows("outcomes"), timeout=180, what="the first outcome")
        # Its state is only the checkpoint's once Spark has logged the batch as committed (reported
        # in its progress); stopped earlier, the restart would replay the batch with today's stage.
        wait_for(
            lambda: any(p["numInputRows"] > 0 for p in query.recentProgress),
            timeout=180,
            what="the first batch committed to the checkpoint",
        )
    finally:
        query.stop()
    assert [(o["msg_id"], o["outcome"]) for o in first] == [("OLD-1", "retry")]
    monkeypatch.undo()

    query = engine.start(spark, lake.config)
    try:
        # Same group, store time and state sub-key (CRC-32 of the msg id mod 32 is 9 for both, so mod 4 is 1) as OLD-1.
        lake.write_results([Result.of("NEW-14").failed()])
        quarantined = wait_for(
            lambda: lake.rows("quarantine"), timeout=180, what="the state moved aside"
        )
        retries = wait_for(lambda: lake.rows("retry"), timeout=180, what="NEW-14's retry")
        assert query.exception() is None and query.isActive
    finally:
        query.stop()

    assert {q["reason_code"] for q in quarantined} == {"STATE_UNREADABLE"}
    assert all(
        "STATE_VERSION_UNKNOWN" in q["reason"] and "'99'" in q["reason"] for q in quarantined
    )
    assert {q["consumer_group"] for q in quarantined} == {"G"} and {
        q["result_id"] for q in quarantined
    } == {None}
    parts = sorted(
        (json.loads(q["raw"]) for q in quarantined), key=lambda p: (p["blob"], p["part"])
    )
    pending = b"".join(base64.b64decode(p["base64"]) for p in parts if p["blob"] == "pending")
    kept = pa.ipc.open_stream(pending).read_all()
    assert kept.column("consumed_msg_id").to_pylist() == ["OLD-1"]
    assert kept.column("output_msg_id").to_pylist() == [first[0]["output_msg_id"]]
    # Every outcome is a consume result's: the moved-aside state is no outcome.
    assert sorted(o["msg_id"] for o in lake.rows("outcomes")) == ["NEW-14", "OLD-1"]
    assert [r["origin_msg_id"] for r in retries] == ["NEW-14"]


def test_a_checkpoint_of_the_previous_release_is_taken_over_without_a_second_retry(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B1, R8, #12 items 6, 13 and 17: a checkpoint written the way main a97474f wrote it (unversioned
    state, keys without sub-keys) holds a pending retry. Today's engine on that checkpoint keeps the
    plain key for that old bucket, so the same consume result re-sent meets its record (a duplicate,
    not a second retry) and the pending retry is released exactly once. (With 4 fixed sub-keys, the
    default before size-bounded splits, so the plain key of the old bucket is not today's key.)"""
    lake = Lake.make(tmp_path, engine={"message_delay_level": "15s", "state_subkeys": 4})
    old = Result.of("OLD-1").failed()
    monkeypatch.setattr(engine, "ScheduleStage", _MainStage)
    monkeypatch.setattr(engine, "state_key_split", lambda *_, **__: StateKeySplit(subkeys=1))
    query = engine.start(spark, lake.config)
    try:
        lake.write_results([old])
        first = wait_for(lambda: lake.rows("outcomes"), timeout=180, what="the first outcome")
        wait_for(
            lambda: any(p["numInputRows"] > 0 for p in query.recentProgress),
            timeout=180,
            what="the first batch committed to the checkpoint",
        )
    finally:
        query.stop()
    monkeypatch.undo()
    assert not (Path(lake.config.checkpoint_path) / KEYS_FILE).exists()

    query = engine.start(spark, lake.config)
    try:
        lake.write_results([old.with_(result_id="re-sent")])
        outcomes = wait_for(
            lambda: len(lake.rows("outcomes")) >= 2 and lake.rows("outcomes"),
            timeout=180,
            what="the re-sent outcome",
        )
        retries = wait_for(lambda: lake.rows("retry"), timeout=180, what="OLD-1's retry")
        assert query.exception() is None
    finally:
        query.stop()
    assert {o["result_id"]: o["outcome"] for o in outcomes} == {
        first[0]["result_id"]: "retry",
        "re-sent": "duplicate",
    }
    assert [(r["origin_msg_id"], r["msg_id"]) for r in retries] == [
        ("OLD-1", first[0]["output_msg_id"])
    ]
    assert lake.rows("quarantine") == []
    recorded = json.loads((Path(lake.config.checkpoint_path) / KEYS_FILE).read_text())
    assert recorded["subkeys"] == lake.config.engine.state_subkeys == 4 and isinstance(recorded["split_since_ms"], int)
    # Placed from the same bucket on, on the partition count Spark recorded in the offsets.
    assert recorded["partitions"] == 2 and recorded["placed_since_ms"] == recorded["split_since_ms"]
    assert recorded["bucket_ms"] == lake.config.state_bucket_ms


def test_a_changed_state_bucket_keeps_the_checkpoints_width_so_duplicates_meet_their_record(
    spark: Any, tmp_path: Path
) -> None:
    """B1 across an operator's config change: a msg id's state key is its store time's bucket, so an
    engine restarted with another engine.state_bucket decided a duplicate of a result decided before
    the change as a second retry. The checkpoint now keeps the width it was created with (logged)."""
    failing = Result.of("DUP").failed()
    before = Lake.make(tmp_path / "lake", engine={"state_bucket": "1s"})
    before.write_results([failing])
    query = engine.start(spark, before.config)
    try:
        wait_for(lambda: before.rows("outcomes"), what="the first outcome")
    finally:
        engine.stop(query)

    after = Lake.make(tmp_path / "lake", engine={"state_bucket": "1h"})
    after.write_results([failing.with_(result_id="again")])
    query = engine.start(spark, after.config)
    try:
        wait_for(lambda: len(after.rows("outcomes")) == 2 and after.rows("retry"), what="the duplicate and the retry")
    finally:
        engine.stop(query)
    assert {o["result_id"]: o["outcome"] for o in after.rows("outcomes")} == {
        failing.values["result_id"]: "retry", "again": "duplicate"
    }
    assert [r["origin_msg_id"] for r in after.rows("retry")] == ["DUP"]
    assert json.loads((Path(after.config.checkpoint_path) / KEYS_FILE).read_text())["bucket_ms"] == 1000
