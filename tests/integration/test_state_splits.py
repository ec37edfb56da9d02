"""Size-bounded state keys in the real engine: sealing, splitting, replay (#12 item 17) on real Spark and Delta."""

from __future__ import annotations

import dataclasses
import re
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame

from retry_engine.core import engine
from retry_engine.core._placement import placed_route
from retry_engine.core._state_splits import SPLITS_DIR
from retry_engine.core.outputs import BatchWriter
from tests.builders import Result
from tests.lakehouse import Lake, wait_for

pytestmark = pytest.mark.slow

# The smallest threshold the config allows; a key of these rows passes it with ~25 pending retries.
MAX_BYTES = 16 * 1024
_SEAL = re.compile(r"bucket_(-?\d+)\.level_(\d+)\.batch_(\d+)\.route_([0-9a-f]+)\.arrow\Z")


@dataclasses.dataclass
class _CrashAfterFirstSeal(BatchWriter):
    """The engine's own writer, which fails once right after committing the batch that wrote the first seal.

    Spark then has not committed that batch to its checkpoint: the restart replays it on the same input.
    """

    crashed: list[int] = dataclasses.field(default_factory=list)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        super().__call__(batch, batch_id)
        seals = Path(self.config.checkpoint_path) / SPLITS_DIR
        if not self.crashed and seals.is_dir() and any(f".batch_{batch_id}." in p.name for p in seals.iterdir()):
            self.crashed.append(batch_id)
            raise RuntimeError(f"test crash after batch {batch_id}'s outputs, before Spark commits it")


def _seals(lake: Lake) -> list[tuple[str, int, int, list[str], Path]]:
    """(route, level, batch, published ids, path) of every seal in the checkpoint."""
    out = []
    for path in sorted((Path(lake.config.checkpoint_path) / SPLITS_DIR).iterdir()):
        match = _SEAL.match(path.name)
        assert match is not None, path.name
        ids = pa.ipc.open_file(path).read_all().column("msg_id").to_pylist()
        out.append((bytes.fromhex(match[4]).decode(), int(match[2]), int(match[3]), ids, path))
    return out


def _state_keys(query: Any) -> int:
    progress = query.lastProgress
    return int(progress["stateOperators"][0]["numRowsTotal"]) if progress and progress["stateOperators"] else -1


def test_a_mass_failure_in_one_key_seals_and_splits_and_duplicates_across_splits_and_a_replay_stay_duplicates(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#12 item 17 (integration, replay), B1, R8: one group, one store time, engine.state_key_max_bytes at its
    16 KiB minimum. Batch A's 120 failures fill key G past it: G seals, publishing exactly A's ids, and the
    engine fails right after that batch's outputs, before Spark commits it; the restart replays the batch
    (same seal file, kept) without a second outcome or retry. Then B (120 new ids, 30 of A re-sent) lands in
    the two level-1 keys, which seal; then C (80 new, 40 of B and 10 of A re-sent). Every re-sent result is
    a DUPLICATE, every new id has exactly one retry, and the state holds G, its two level-1 keys and the
    level-2 keys C's ids pick by their CRC-32's top two bits."""
    lake = Lake.make(tmp_path, engine={"state_key_max_bytes": MAX_BYTES})
    a = [Result.of(f"SA-{i:04d}").failed() for i in range(120)]
    b = [Result.of(f"SB-{i:04d}").failed() for i in range(120)]
    c = [Result.of(f"SC-{i:04d}").failed() for i in range(80)]
    resent_b = [r.with_(result_id=f"again-a-{i}") for i, r in enumerate(a[::4])]
    resent_c = [r.with_(result_id=f"again-b-{i}") for i, r in enumerate(b[::3])] + [
        r.with_(result_id=f"again-a2-{i}") for i, r in enumerate(a[1::12])
    ]

    monkeypatch.setattr(engine, "BatchWriter", _CrashAfterFirstSeal)
    query = engine.start(spark, lake.config)
    try:
        lake.write_results(a)
        wait_for(lambda: not query.isActive, timeout=240, what="the crash after the sealing batch")
    finally:
        engine.stop(query)
    monkeypatch.undo()
    assert "test crash after batch" in str(query.exception())
    ((route, level, sealed_in, ids, path),) = _seals(lake)
    # Group G's key of the one store-time bucket, placed on one of the session's two partitions.
    match = _SEAL.match(path.name)
    assert match is not None
    base = placed_route("G", int(match[1]), 2)
    assert (route, level) == (base, 0) and ids == sorted(r.values["msg_id"] for r in a)
    first_attempt = (path.read_bytes(), path.stat().st_mtime_ns)

    query = engine.start(spark, lake.config)
    try:
        # Spark replays the uncommitted batch first; its outcomes are already in the lake.
        wait_for(
            lambda: any(p["batchId"] >= sealed_in for p in query.recentProgress),
            timeout=240,
            what="the replay of the sealing batch",
        )
        lake.write_results(b + resent_b)
        wait_for(lambda: len(lake.rows("outcomes")) >= 270, timeout=240, what="batch B's outcomes")
        lake.write_results(c + resent_c)
        wait_for(lambda: len(lake.rows("outcomes")) >= 390, timeout=240, what="batch C's outcomes")
        fresh = a + b + c
        retries = wait_for(
            lambda: len(lake.rows("retry")) >= len(fresh) and lake.rows("retry"), timeout=240, what="every retry"
        )
        level2 = {zlib.crc32(r.values["msg_id"].encode()) >> 30 for r in c}
        wait_for(
            lambda: _state_keys(query) == 3 + len(level2),
            timeout=240,
            what=f"{3 + len(level2)} state keys (G, G#L1.0, G#L1.1, level 2 keys {sorted(level2)})",
        )
        assert query.exception() is None
    finally:
        engine.stop(query)

    outcomes = {o["result_id"]: o["outcome"] for o in lake.rows("outcomes")}
    assert len(lake.rows("outcomes")) == len(outcomes) == len(fresh) + len(resent_b) + len(resent_c)
    assert {outcomes[r.values["result_id"]] for r in fresh} == {"retry"}
    assert {outcomes[r.values["result_id"]] for r in resent_b + resent_c} == {"duplicate"}
    assert sorted(r["origin_msg_id"] for r in retries) == sorted(r.values["msg_id"] for r in fresh)
    assert len(lake.rows("retry")) == len(fresh)

    seals = _seals(lake)
    assert (path.read_bytes(), path.stat().st_mtime_ns) == first_attempt  # the replay kept the file
    by_route = {s[0]: s for s in seals}
    assert {base, f"{base}#L1.0", f"{base}#L1.1"} <= set(by_route)
    assert all(s[2] > sealed_in for s in seals if s[1] >= 1)
    level1 = by_route[f"{base}#L1.0"][3] + by_route[f"{base}#L1.1"][3]
    assert sorted(level1) == sorted(r.values["msg_id"] for r in b)
    assert all(zlib.crc32(i.encode()) >> 31 == 0 for i in by_route[f"{base}#L1.0"][3])
    assert lake.rows("quarantine") == []
