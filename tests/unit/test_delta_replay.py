"""Batch 0 replayed after a restart: Spark asks initialOffset() again, the table has moved on.

Found by the crash test: the recomputed initial offset (snapshot at the latest
version) lay past batch 0's logged end, the range was empty and batch 0's
consume results never got an outcome. B1.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from retry_engine.delta._log import DeltaLog, FileEntry, TableLocation
from retry_engine.delta._offsets import (
    Admission,
    ChangeRules,
    Offset,
    end_offset,
    files_after,
    files_between,
    replay_start,
)

RULES = ChangeRules()


def _append(path: Path, first: int, n: int = 5) -> None:
    write_deltalake(str(path), pa.table({"id": pa.array(range(first, first + n), pa.int64())}), mode="append")


def _first_batch(delta_log: DeltaLog, admission: Admission) -> tuple[Offset, Offset]:
    latest = delta_log.latest_version()
    start = Offset(latest, -1, True, "rid")  # what initialOffset() returns
    end = end_offset(files_after(delta_log, start, through_version=latest, rules=RULES), start,
                     until_version=latest, admission=admission)
    return start, end


def _rows(path: Path, files: list[FileEntry]) -> list[int]:
    return sorted(i for f in files for i in pq.read_table(path / f.path).column("id").to_pylist())


@pytest.mark.parametrize("max_files", [None, 2])
def test_b1_batch0_replayed_after_new_commits_reads_the_same_rows(tmp_path: Path, max_files: int | None) -> None:
    path = tmp_path / "t"
    for i in range(4):
        _append(path, i * 5)
    delta_log = DeltaLog(TableLocation(str(path)))
    start, end = _first_batch(delta_log, Admission(max_files=max_files))
    planned = _rows(path, files_between(delta_log, start, end, rules=RULES))
    # The driver dies before batch 0 commits; producers keep appending.
    for i in range(4, 7):
        _append(path, i * 5)
    recomputed = Offset(DeltaLog(TableLocation(str(path))).latest_version(), -1, True, "rid")
    assert files_between(delta_log, recomputed, end, rules=RULES) == []  # the loss, without the fix
    replayed = _rows(path, files_between(delta_log, replay_start(recomputed, end), end, rules=RULES))
    assert replayed == planned and planned


def test_b1_batch0_of_snapshot_and_commits_replayed_reads_the_same_rows(tmp_path: Path) -> None:
    path = tmp_path / "t"
    _append(path, 0)
    delta_log = DeltaLog(TableLocation(str(path)))
    start = Offset(0, -1, True, "rid")
    _append(path, 100)
    # Batch 0 is snapshot 0 plus commit 1; it ends "after version 1".
    end = end_offset(files_after(delta_log, start, through_version=1, rules=RULES), start,
                     until_version=1, admission=Admission())
    planned = _rows(path, files_between(delta_log, start, end, rules=RULES))
    _append(path, 200)
    recomputed = Offset(2, -1, True, "rid")
    assert _rows(path, files_between(delta_log, replay_start(recomputed, end), end, rules=RULES)) == planned
    assert planned == list(range(5)) + list(range(100, 105))


def test_replay_start_leaves_consistent_ranges_alone() -> None:
    initial = Offset(3, -1, True, "rid")
    for end in (Offset(3, 0, True, "rid"), Offset(3, -1, True, "rid"), Offset(4, -1, False, "rid"), Offset(5, 2, False, "rid")):
        assert replay_start(initial, end) == initial
    later = Offset(3, 1, True, "rid")  # the end of an earlier batch, not an initial offset
    assert replay_start(later, Offset(9, -1, False, "rid")) == later
    assert replay_start(Offset(9, -1, True, "rid"), Offset(4, -1, False, "rid")) == Offset(3, -1, True, "rid")
    assert replay_start(Offset(9, -1, True, "rid"), Offset(4, 2, True, "rid")) == Offset(4, -1, True, "rid")
