"""The lake lease and the resume plan (SPEC B8, #12 item 8), on real Delta tables, without Spark."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from retry_engine.core import resume
from retry_engine.core.engine import _unpacked
from retry_engine.core.lease import (
    BatchRecord,
    EngineState,
    Heartbeat,
    LakeLease,
    Owner,
    process_space,
    read_state,
)
from retry_engine.core.totals import Totals
from retry_engine.delta._arrow_ipc import to_ipc
from retry_engine.delta._files import position_array, position_prefix
from retry_engine.errors import DeltaSourceError, LakeOwnedError, LakeResumeError, LeaseLostError

T0 = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)
TIMEOUT_MS = 60_000


def owner(query_id: str, *, pid: int | None = None, host: str | None = None) -> Owner:
    return Owner(host or process_space(), os.getpid() if pid is None else pid, query_id, f"/ckpt/{query_id}", T0)


class Clock:
    """A settable clock; ``on_tick`` runs once at the next reading (to interleave another engine)."""

    def __init__(self, now: dt.datetime = T0) -> None:
        self.now = now
        self.on_tick: Any = None

    def __call__(self) -> dt.datetime:
        hook, self.on_tick = self.on_tick, None
        if hook is not None:
            hook()
        return self.now


def lease(lake: Path, query_id: str, clock: Clock, **kw: Any) -> LakeLease:
    return LakeLease(str(lake), owner(query_id, **kw), timeout_ms=TIMEOUT_MS, clock=clock)


@contextmanager
def owning(lease_: LakeLease) -> Iterator[EngineState | None]:
    """Take ``lease_`` and run its owner as a live engine of this process (as engine.start does);
    yields what the lake held before."""
    before = lease_.acquire()
    beat = Heartbeat(lease_, interval_s=3600, alive=lambda: True, on_lost=lambda exc: None)
    beat.start()
    try:
        yield before
    finally:
        beat.stop()


def batch(query_id: str, batch_id: int, *, pending: int = 0, end: dict[str, Any] | None = None) -> BatchRecord:
    offset = end if end is not None else {"reservoirVersion": 4, "index": -1, "isStartingVersion": False}
    return BatchRecord(query_id, batch_id, offset, {"outcomes": []}, pending)


def test_second_engine_refuses_naming_owner_and_take_over(tmp_path: Path) -> None:
    """B8: a live lease makes a second engine refuse; the message names host, pid, query id, since, --take-over."""
    clock = Clock()
    first = lease(tmp_path, "query-A", clock)
    with owning(first) as before:
        assert before is None
        second = lease(tmp_path, "query-B", clock)
        with pytest.raises(LakeOwnedError, match="LAKE_OWNED") as err:
            second.acquire()
        text = str(err.value)
        for part in (socket.gethostname(), f"pid {os.getpid()}", "query id query-A", "2026-11-23T12:00:00", "--take-over"):
            assert part in text
        state = read_state(str(tmp_path))
        assert state is not None and state.epoch == 1 and state.owner is not None
        assert state.owner.query_id == "query-A"


def test_take_over_bumps_epoch_and_fences_the_old_owner(tmp_path: Path) -> None:
    """#12 item 8: after a take-over the old owner's batch record and heartbeat are refused; the lake keeps B's."""
    clock = Clock()
    first = lease(tmp_path, "query-A", clock)
    with owning(first):
        first.record_batch(batch("query-A", 0))
        second = lease(tmp_path, "query-B", clock)
        before = second.acquire(take_over=True)
        assert before is not None and before.epoch == 1 and before.last_batch == batch("query-A", 0)
        assert second.epoch == 2
        with pytest.raises(LeaseLostError, match=r"LEASE_LOST.*query id query-A, epoch 1.*query id query-B.*epoch 2"):
            first.record_batch(batch("query-A", 1))
        with pytest.raises(LeaseLostError, match="LEASE_LOST"):
            first.heartbeat()
        state = read_state(str(tmp_path))
        assert state is not None and state.epoch == 2 and state.last_batch == batch("query-A", 0)


@pytest.mark.parametrize("raised", ["conflict", "storage"])
def test_a_batch_record_that_lands_while_delta_rs_raises_counts_as_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: str
) -> None:
    """B8 (found by a review): delta-rs can raise for a commit that landed (its post-commit checkpoint
    failed; on object storage a retried put met its own first attempt, a conflict). Taken for a failed
    record, the batch's files were deleted though the lake recorded them, or (a conflict) the replay
    check found the record and dropped the batch. Either way the record is this batch's: True."""
    from deltalake.exceptions import CommitFailedError

    from retry_engine.core import lease as lease_module

    real = lease_module.write_delta
    failures = [CommitFailedError("version exists") if raised == "conflict" else OSError("checkpoint failed")]

    def lands_then_raises(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        if failures:
            raise failures.pop()

    first = lease(tmp_path, "query-A", Clock())
    with owning(first):
        first.record_batch(batch("query-A", 1))
        monkeypatch.setattr(lease_module, "write_delta", lands_then_raises)
        recorded = batch("query-A", 2)
        recorded = replace(recorded, files={"outcomes": [{"path": "part-2.parquet", "size": 1}]})
        assert first.record_batch(recorded) is True
        assert not failures
        state = read_state(str(tmp_path))
        assert state is not None and state.last_batch is not None
        assert (state.last_batch.batch_id, state.last_batch.files) == (2, recorded.files)
        # A replay of the same batch id (other files: another attempt's) is still told apart.
        assert first.record_batch(batch("query-A", 2)) is False


def _take_over_from_another_process(lake: Path, query_id: str) -> None:
    """A take-over by an engine in another process: it has no handle this process keeps."""
    code = (
        "import datetime as dt, sys; from retry_engine.core.lease import LakeLease, Owner; "
        "LakeLease(sys.argv[1], Owner('other-host', 1, sys.argv[2], '/b', dt.datetime.now(dt.UTC)))"
        ".acquire(take_over=True)"
    )
    subprocess.run([sys.executable, "-c", code, str(lake), query_id], check=True, cwd=Path(__file__).parents[2])


def _kept_lease_table(lake: Path) -> Any:
    from retry_engine.delta import _handles, storage
    from retry_engine.delta._handles import _key

    kept = _handles._kept.get(_key(storage.location(str(lake / "_engine_state"))))
    return None if kept is None else kept.table


def test_the_lease_keeps_its_table_open_between_batches_and_sees_another_processs_take_over(tmp_path: Path) -> None:
    """#14 part 4: each batch record and heartbeat reads the row through the handle the last one left (on S3 a
    fresh open re-reads the checkpoint and every commit since), and a take-over by an engine in another process
    (whose commit the kept handle did not make) still fences this one."""
    first = lease(tmp_path, "query-A", Clock())
    with owning(first):
        first.record_batch(batch("query-A", 0))
        table = _kept_lease_table(tmp_path)
        assert table is not None
        first.heartbeat()
        first.record_batch(batch("query-A", 1))
        assert _kept_lease_table(tmp_path) is table
        _take_over_from_another_process(tmp_path, "query-B")
        with pytest.raises(LeaseLostError, match="LEASE_LOST.*query id query-B.*epoch 2"):
            first.record_batch(batch("query-A", 2))
    state = read_state(str(tmp_path))
    assert state is not None and state.epoch == 2 and state.last_batch == batch("query-A", 1)


@pytest.mark.parametrize("records", [0, 3])
def test_a_lease_table_re_created_under_its_kept_handle_is_read_afresh(tmp_path: Path, records: int) -> None:
    """An operator drops ``_engine_state`` and another engine starts on the lake; the new table's log is shorter
    (its version 2 is not there) or as long (another version 2): the kept handle is not used, the new owner is
    seen and this engine's record is refused."""
    first = lease(tmp_path, "query-A", Clock())
    with owning(first):
        first.record_batch(batch("query-A", 0))  # the kept handle is at version 2: creation, acquire, record
        shutil.rmtree(tmp_path / "_engine_state")
        _take_over_from_another_process(tmp_path, "query-B")
        for _ in range(records):
            _take_over_from_another_process(tmp_path, "query-B")
        with pytest.raises(LeaseLostError, match="LEASE_LOST.*query id query-B"):
            first.record_batch(batch("query-A", 1))
    state = read_state(str(tmp_path))
    assert state is not None and state.owner is not None and state.owner.query_id == "query-B"
    assert state.last_batch is None


def test_take_over_between_check_and_commit_is_refused(tmp_path: Path) -> None:
    """Fencing holds in the race: B takes over after A read the row, before A's commit lands (CAS conflict)."""
    clock = Clock()
    first = lease(tmp_path, "query-A", clock)
    with owning(first):
        second = lease(tmp_path, "query-B", Clock())
        # A's record_batch reads the clock after it checked the row and before it commits.
        clock.on_tick = lambda: second.acquire(take_over=True)
        with pytest.raises(LeaseLostError, match="LEASE_LOST"):
            first.record_batch(batch("query-A", 7))
        state = read_state(str(tmp_path))
        assert state is not None and state.epoch == 2 and state.last_batch is None
        assert state.owner is not None and state.owner.query_id == "query-B"


def test_expired_released_and_dead_leases_are_taken_without_flag(tmp_path: Path) -> None:
    """Leases expire a timeout after the last heartbeat; a graceful stop or a dead process frees them at once."""
    clock = Clock()
    first = lease(tmp_path / "expired", "query-A", clock)
    with owning(first):
        clock.now = T0 + dt.timedelta(milliseconds=TIMEOUT_MS)
        with pytest.raises(LakeOwnedError):
            lease(tmp_path / "expired", "query-B", clock).acquire()
        clock.now = T0 + dt.timedelta(milliseconds=TIMEOUT_MS + 1)
        assert lease(tmp_path / "expired", "query-B", clock).acquire() is not None

    released = lease(tmp_path / "released", "query-A", Clock())
    with owning(released):
        released.release()
        taker = lease(tmp_path / "released", "query-B", Clock())
        taker.acquire()
        assert taker.epoch == 2

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    dead = lease(tmp_path / "dead", "query-A", Clock(), pid=int(gone.stdout))
    dead.acquire()
    assert lease(tmp_path / "dead", "query-B", Clock()).acquire() is not None

    # An owner on another host is never presumed dead before its lease expires.
    remote = lease(tmp_path / "remote", "query-A", Clock(), host="elsewhere.example", pid=1)
    remote.acquire()
    with pytest.raises(LakeOwnedError, match="host elsewhere.example"):
        lease(tmp_path / "remote", "query-B", Clock()).acquire()

    # (found by a review) Nor one with this host's name in another pid namespace (a host-network pod, a
    # container sharing the host name): its pid, missing here or even this very one, says nothing of it.
    # A bare host name (what earlier releases recorded: only the lease's expiry frees it) likewise.
    for host in (socket.gethostname() + " (pid:[1], boot 00000000)", socket.gethostname()):
        for pid in (int(gone.stdout), os.getpid()):
            path = tmp_path / f"neighbour-{pid}-{len(host)}"
            lease(path, "query-A", Clock(), host=host, pid=pid).acquire()
            with pytest.raises(LakeOwnedError, match="LAKE_OWNED"):
                lease(path, "query-B", Clock()).acquire()


def test_a_heartbeat_dated_far_ahead_is_no_sign_of_life(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Hostile input (found by review): an owner on another host whose heartbeat says 9999 (a clock far
    ahead, or a damaged row) kept the lake owned for good, and a standby never took over. A heartbeat
    more than FUTURE_EVENTS ahead is none; one within it (clocks a little apart) still binds."""
    for ahead, binds in [(dt.timedelta(minutes=30), True), (dt.timedelta(hours=2), False),
                         (dt.datetime(9999, 1, 1, tzinfo=dt.UTC) - T0, False)]:
        lake = tmp_path / f"ahead-{ahead.total_seconds():.0f}"
        remote = lease(lake, "query-A", Clock(T0 + ahead), host="elsewhere.example", pid=1)
        remote.acquire()
        taker = lease(lake, "query-B", Clock())
        if binds:
            with pytest.raises(LakeOwnedError, match="host elsewhere.example"):
                taker.acquire()
        else:
            assert taker.acquire() is not None and taker.epoch == 2
            assert "ahead of this clock" in caplog.text


def _state(last: BatchRecord | None) -> EngineState:
    return EngineState(3, owner("query-A"), T0, False, last)


def planned_checkpoint(tmp_path: Path, ends: dict[int, Any]) -> str:
    """A checkpoint whose offset log has planned batch ``i`` to read through ``ends[i]`` (Spark's format)."""
    checkpoint = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
    (checkpoint / "offsets").mkdir(parents=True)
    for batch_id, end in ends.items():
        (checkpoint / "offsets" / str(batch_id)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(end)}')
    return str(checkpoint)


def test_resume_plan_after_the_lakes_last_batch(tmp_path: Path) -> None:
    """A new checkpoint starts right after the recorded offset: next commit, or the rest of a commit."""
    after_commit = resume.plan(_state(batch("query-A", 5)), query_id="B", checkpoint="/c", fresh=True, source_table_id=None)
    assert after_commit == resume.ResumePoint(4, None, "query-A/5")
    mid = batch("query-A", 5, end={"reservoirVersion": 9, "index": 2, "isStartingVersion": False, "reservoirId": "t1"})
    inside = resume.plan(_state(mid), query_id="B", checkpoint="/c", fresh=True, source_table_id="t1")
    # Files 0..2 of commit 9 were read: keep from file 3 of commit 9 on.
    assert inside == resume.ResumePoint(9, "v00000000000000000009/000003/", "query-A/5")
    # The same checkpoint, or a lake without batches: Spark's own rule.
    same = planned_checkpoint(tmp_path, {5: batch("B", 5).source_end, 6: batch("B", 5).source_end})
    assert resume.plan(_state(batch("B", 5)), query_id="B", checkpoint=same, fresh=False, source_table_id=None) is None
    assert resume.plan(None, query_id="B", checkpoint="/c", fresh=True, source_table_id=None) is None
    # consume_results re-created: its new table is read from the start.
    assert resume.plan(_state(mid), query_id="B", checkpoint="/c", fresh=True, source_table_id="t2") is None


def test_resume_plan_refuses_what_would_lose_or_repeat() -> None:
    """Pending retries of the old checkpoint, an older checkpoint behind the lake, a mid-snapshot end."""
    pending = _state(batch("query-A", 5, pending=3))
    with pytest.raises(LakeResumeError, match=r"LAKE_PENDING_RETRIES.*3 retries.*--discard-pending"):
        resume.plan(pending, query_id="B", checkpoint="/c", fresh=True, source_table_id=None)
    assert resume.plan(
        pending, query_id="B", checkpoint="/c", fresh=True, source_table_id=None, discard_pending=True
    ) == resume.ResumePoint(4, None, "query-A/5")
    with pytest.raises(LakeResumeError, match="LAKE_AHEAD_OF_CHECKPOINT.*query-A/5"):
        resume.plan(_state(batch("query-A", 5)), query_id="B", checkpoint="/c", fresh=False, source_table_id=None)
    snap = batch("query-A", 0, end={"reservoirVersion": 3, "index": 10, "isStartingVersion": True})
    with pytest.raises(LakeResumeError, match="LAKE_RESUME_MID_SNAPSHOT"):
        resume.plan(_state(snap), query_id="B", checkpoint="/c", fresh=True, source_table_id=None)
    # The record is a row anyone with write access to the lake can change: a damaged offset is a clear error.
    for damaged in ({"reservoirVersion": "x", "index": 0, "isStartingVersion": False}, {"index": 0}, {"sourceVersion": 99}):
        with pytest.raises(DeltaSourceError, match="DELTA_OFFSET_INVALID"):
            resume.plan(_state(batch("query-A", 0, end=damaged)), query_id="B", checkpoint="/c", fresh=True, source_table_id=None)


def test_a_checkpoint_of_the_lakes_query_that_did_not_write_its_last_batch_is_refused(tmp_path: Path) -> None:
    """B8 (found by a review): a copy of the checkpoint restored from an older backup (or with its offset log
    deleted) planned batch ids the lake already records, whose outputs were dropped as replays: the rows it read
    past the lake's end were lost (or read again from the start). Refused, naming what it planned."""
    end = {"reservoirVersion": 7, "index": -1, "isStartingVersion": False}
    lake = _state(batch("B", 5, end=end))
    older = {4: {**end, "reservoirVersion": 6}}
    for ends, said in (
        (older, "has planned batches up to 4"),
        ({}, "has planned no batch"),
        ({**older, 5: {**end, "reservoirVersion": 8}}, "has planned batch 5 ending at"),
    ):
        checkpoint = planned_checkpoint(tmp_path, ends)
        with pytest.raises(LakeResumeError, match=rf"LAKE_AHEAD_OF_CHECKPOINT.*B/5.*{said}"):
            resume.plan(lake, query_id="B", checkpoint=checkpoint, fresh=not ends, source_table_id=None)
    # The checkpoint that wrote it, also after idle batches (read nothing) and once Spark purged batch 5's offsets.
    for ends in ({5: end}, {5: end, 6: end, 7: end}, {180: end}):
        checkpoint = planned_checkpoint(tmp_path, ends)
        assert resume.plan(lake, query_id="B", checkpoint=checkpoint, fresh=False, source_table_id=None) is None


def test_a_new_checkpoint_that_has_recorded_no_batch_yet_starts_again(tmp_path: Path) -> None:
    """B8 (found by a review): a new checkpoint whose first run recorded no batch (nothing new to read, or
    stopped before its first record) was refused at every later start (LAKE_AHEAD_OF_CHECKPOINT), naming
    itself as the checkpoint to run. It resumes from the point it stored; another's later batch still refuses."""
    lake = _state(batch("query-A", 5))
    checkpoint = planned_checkpoint(tmp_path, {0: batch("query-A", 5).source_end})
    point = resume.plan(lake, query_id="B", checkpoint=checkpoint, fresh=True, source_table_id=None)
    assert point is not None
    resume.store(checkpoint, point)
    assert resume.plan(lake, query_id="B", checkpoint=checkpoint, fresh=False, source_table_id=None) is None
    later = EngineState(3, owner("query-C"), T0, False, batch("query-A", 6))
    with pytest.raises(LakeResumeError, match=r"LAKE_AHEAD_OF_CHECKPOINT.*query-A/6, from checkpoint of query id query-A"):
        resume.plan(later, query_id="B", checkpoint=checkpoint, fresh=False, source_table_id=None)


def test_resume_filter_drops_exactly_the_rows_already_read() -> None:
    """The position floor keeps rows of later files of the resume commit, and of later commits, only."""
    from retry_engine.core.decide import BATCH_TS, POSITION
    from retry_engine.core.engine import PACKED_INPUT

    def payload(version: int, index: int, rows: int) -> bytes:
        positions = position_array(position_prefix(version, index, False), 0, rows)
        return to_ipc(pa.table({"result_id": [f"{version}-{index}-{r}" for r in range(rows)], POSITION: positions}))

    packed = pa.RecordBatch.from_arrays(
        [
            pa.array([payload(9, 1, 2), payload(9, 2, 3), payload(9, 3, 2), payload(10, 0, 1)], pa.binary()),
            pa.array([dt.datetime(2026, 11, 23, tzinfo=dt.UTC)] * 4, pa.timestamp("us", tz="UTC")),
        ],
        names=[PACKED_INPUT, BATCH_TS],
    )
    floor = position_prefix(9, 3, False)
    kept = [rid for b in _unpacked(packed, floor=floor) for rid in b.column("result_id").to_pylist()]
    assert kept == ["9-3-0", "9-3-1", "10-0-0"]
    # Unpacked input (native Delta mode) is filtered the same way.
    plain = pa.RecordBatch.from_pylist(
        [{"result_id": r, POSITION: p} for r, p in [("old", position_prefix(9, 2, False) + "0"), ("new", floor + "0")]]
    )
    assert [b.column("result_id").to_pylist() for b in _unpacked(plain, floor=floor)] == [["new"]]


def test_once_waits_for_the_table_version_it_saw() -> None:
    """#12 item 20: ``run_once`` stops only at a batch whose source end lies past the version it saw at start."""
    import json

    from retry_engine.core.engine import _covers

    def end(version: int, index: int, starting: bool = False) -> dict[str, object]:
        return {"reservoirVersion": version, "index": index, "isStartingVersion": starting}

    # A replayed batch planned before the new commit 7 does not count, however empty it is.
    assert not _covers(end(7, -1), 7)
    assert not _covers(end(7, 3), 7)
    # Inside the initial snapshot of a later version: not everything of it is read yet.
    assert not _covers(end(9, 2, starting=True), 7)
    assert _covers(end(8, -1), 7)
    assert _covers(json.dumps(end(12, 0)), 7)  # Spark may hand the offset over as JSON text
    assert not _covers(None, 7) and not _covers({"unrelated": 1}, 7)


def _lake_config(tmp_path: Path) -> Any:
    from retry_engine.config import parse_config

    return parse_config({"engine": {"lake": str(tmp_path), "checkpoint": str(tmp_path / "new-checkpoint")}})


def _append(config: Any, name: str, rows: list[dict[str, Any]]) -> None:
    from deltalake import write_deltalake

    from retry_engine.schemas import OUTCOMES, RETRY

    table = {"outcomes": OUTCOMES, "retry": RETRY}[name]
    write_deltalake(
        config.table_path(name),
        pa.Table.from_pylist(rows, schema=table.arrow_schema),
        mode="append",
        partition_by=list(table.partition_by) or None,
    )


def test_new_checkpoint_refuses_a_lake_whose_outcomes_no_batch_record_covers(tmp_path: Path) -> None:
    """#12 item 8: outcomes written before lake records (an upgrade) must not be decided again by a new checkpoint."""
    from retry_engine.core.engine import _resume_point

    config = _lake_config(tmp_path)
    assert _resume_point(config, None, "q", fresh=True, discard_pending=False) == (None, 0, Totals.empty(), None)
    _append(config, "outcomes", [{"outcome": "acknowledged", "batch_id": 0, "decided_at": T0}])
    with pytest.raises(LakeResumeError, match="LAKE_NOT_RECORDED"):
        _resume_point(config, None, "q", fresh=True, discard_pending=False)
    # The checkpoint that wrote them continues as before, its lake's counts taken from the tables (#14).
    assert _resume_point(config, None, "q", fresh=False, discard_pending=False) == (
        None, 0, Totals.of([(None, "acknowledged", 1)]), None
    )
    # A retry that checkpoint's state holds is pending: the record it starts (the first, after an upgrade
    # from a release before records) counts it, so its release brings the count to 0, not -1.
    _append(config, "outcomes", [{"outcome": "retry", "output_msg_id": "R-1", "batch_id": 1, "decided_at": T0}])
    assert _resume_point(config, None, "q", fresh=False, discard_pending=False) == (
        None, 1, Totals.of([(None, "acknowledged", 1), (None, "retry", 1)]), None
    )


def test_a_lake_counted_beyond_the_records_bounds_keeps_no_totals(tmp_path: Path) -> None:
    """Bad input (#14): a quarantined row's 2,000-character group makes the counts too big for the record
    rewritten every batch: the engine starts without totals (status counts the tables)."""
    from retry_engine.core.engine import _resume_point

    config = _lake_config(tmp_path)
    row = {"outcome": "quarantined", "consumer_group": "x" * 2000, "batch_id": 0, "decided_at": T0}
    _append(config, "outcomes", [row])
    assert _resume_point(config, None, "q", fresh=False, discard_pending=False) == (None, 0, None, None)


def test_retries_a_new_checkpoint_discards_are_given_up_in_the_lake_and_pending_nowhere(tmp_path: Path) -> None:
    """`run --discard-pending` (#14): the new checkpoint gives up the retries the old one left waiting and
    the lake records when (EngineState.discarded_before): they count as pending neither in its record
    (0) nor in the tables (`status` checks its window against the record: both agree), and the next new
    checkpoint is not refused for them again (before: they stayed pending in both for good, every later
    new checkpoint was refused until discarding again, and `status` read every outcome past 64 days)."""
    from retry_engine.core.engine import _resume_point
    from retry_engine.ops.status import lake_counts

    config = _lake_config(tmp_path)
    totals = Totals.of([(None, "retry", 1)])
    before = EngineState(1, owner("A"), T0, True, replace(batch("A", 3, pending=1), totals=totals))
    _append(config, "outcomes", [{"outcome": "retry", "output_msg_id": "LOST-1", "batch_id": 3, "decided_at": T0}])
    assert lake_counts(config)[1] == 1
    point, pending, carried_on, discarded = _resume_point(config, before, "B", fresh=True, discard_pending=True)
    assert point is not None and pending == 0 and carried_on == totals and discarded is not None and discarded > T0
    taker = LakeLease(str(tmp_path), owner("B"), timeout_ms=TIMEOUT_MS)
    taker.acquire(take_over=True)
    # Written with B's first record, not at its start: a start that never records a batch leaves A's
    # retries counted (A, resumed, still holds them).
    assert lake_counts(config)[1] == 1
    assert taker.record_batch(batch("B", 0), discarded_before=discarded)
    state = read_state(str(tmp_path))
    assert state is not None and state.discarded_before == discarded
    assert lake_counts(config)[1] == 0
    # A retry B decides later and has not released is pending again; a take-over keeps the mark.
    _append(config, "outcomes", [{"outcome": "retry", "output_msg_id": "NEW-1", "batch_id": 0,
                                  "decided_at": discarded + dt.timedelta(seconds=1)}])
    assert lake_counts(config)[1] == 1
    third = LakeLease(str(tmp_path), owner("C"), timeout_ms=TIMEOUT_MS)
    third.acquire(take_over=True)
    assert third.record_batch(batch("C", 0))
    state = read_state(str(tmp_path))
    assert state is not None and state.discarded_before == discarded and lake_counts(config)[1] == 1
    # Without a discard there is nothing to give up: no mark.
    assert _resume_point(config, None, "q", fresh=False, discard_pending=True)[3] is None
    # A mark never moves back (a later discard on a clock behind).
    assert third.record_batch(batch("C", 1), discarded_before=discarded - dt.timedelta(hours=1))
    state = read_state(str(tmp_path))
    assert state is not None and state.discarded_before == discarded
    # C's record counts a retry C decided on a clock behind the mark (the tables cannot tell it from a
    # given-up one): a new checkpoint is refused on the record's count.
    _append(config, "outcomes", [{"outcome": "retry", "output_msg_id": "SKEWED-1", "batch_id": 2,
                                  "decided_at": discarded - dt.timedelta(minutes=5)}])
    assert third.record_batch(batch("C", 2, pending=2))
    assert lake_counts(config)[1] == 1
    with pytest.raises(LakeResumeError, match="LAKE_PENDING_RETRIES.*2 retries"):
        _resume_point(config, read_state(str(tmp_path)), "D", fresh=True, discard_pending=False)


def test_a_discard_marks_past_the_lakes_latest_decision_on_a_clock_ahead(tmp_path: Path) -> None:
    """The previous engine's clock ran an hour ahead: its retries' decisions are after this engine's
    now, and a mark at now would leave them counted (a spurious refusal of the next new checkpoint)."""
    from retry_engine.core.engine import _resume_point
    from retry_engine.ops.status import lake_counts

    config = _lake_config(tmp_path)
    ahead = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    before = EngineState(1, owner("A"), T0, True, batch("A", 3, pending=1))
    _append(config, "outcomes", [{"outcome": "retry", "output_msg_id": "AHEAD-1", "batch_id": 3, "decided_at": ahead}])
    *_, mark = _resume_point(config, before, "B", fresh=True, discard_pending=True)
    assert mark is not None and mark > ahead
    taker = LakeLease(str(tmp_path), owner("B"), timeout_ms=TIMEOUT_MS)
    taker.acquire(take_over=True)
    assert taker.record_batch(batch("B", 0), discarded_before=mark)
    assert lake_counts(config)[1] == 0


def test_pending_retries_are_counted_in_the_lakes_tables(tmp_path: Path) -> None:
    """A retry outcome whose retry row is missing is pending, whatever the batch record says (B8)."""
    from retry_engine.core.engine import _resume_point

    config = _lake_config(tmp_path)
    before = EngineState(1, owner("A"), T0, True, batch("A", 3, pending=0))
    _append(config, "outcomes", [{"outcome": "retry", "output_msg_id": "NEW-1", "batch_id": 3, "decided_at": T0}])
    with pytest.raises(LakeResumeError, match="LAKE_PENDING_RETRIES.*1 retries"):
        _resume_point(config, before, "B", fresh=True, discard_pending=False)
    _append(config, "retry", [{"msg_id": "NEW-1", "topic": "%RETRY%G", "consumer_group": "G", "delivery_key": "O:1"}])
    point, pending, totals, _ = _resume_point(config, before, "B", fresh=True, discard_pending=False)
    assert point == resume.ResumePoint(4, None, "A/3") and pending == 0
    # A record without totals (an earlier release's): counted from the tables.
    assert totals == Totals.of([(None, "retry", 1), (None, "delivered", 1)])
    assert resume.stored(str(tmp_path / "new-checkpoint")) == point


def test_heartbeat_stops_the_engine_when_taken_over_and_releases_when_the_query_ends(tmp_path: Path) -> None:
    """B8: a fenced owner learns it from its heartbeat (on_lost, ``lost``); a stopped query's lease is released."""
    import threading

    first = LakeLease(str(tmp_path / "a"), owner("query-A"), timeout_ms=TIMEOUT_MS)
    first.acquire()
    lost = threading.Event()
    # Beats far enough apart that a take-over (a few compare-and-swap attempts) lands between two.
    beat = Heartbeat(first, interval_s=0.5, alive=lambda: True, on_lost=lambda exc: lost.set())
    beat.start()
    try:
        LakeLease(str(tmp_path / "a"), owner("query-B"), timeout_ms=TIMEOUT_MS).acquire(take_over=True)
        assert lost.wait(60)
        assert isinstance(beat.lost, LeaseLostError) and "query id query-B" in str(beat.lost)
    finally:
        beat.stop()

    running = threading.Event()
    running.set()
    second = LakeLease(str(tmp_path / "b"), owner("query-C"), timeout_ms=TIMEOUT_MS)
    second.acquire()
    beat = Heartbeat(second, interval_s=0.05, alive=running.is_set, on_lost=lambda exc: None)
    beat.start()
    try:
        running.clear()  # the query stopped without engine.stop()

        def released() -> bool:
            state = read_state(str(tmp_path / "b"))
            return state is not None and state.released

        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=60)
        while not released() and dt.datetime.now(dt.UTC) < deadline:
            threading.Event().wait(0.05)
        assert released()
        # engine.stop (and the exit hook) need not release it again: on object storage that gone a
        # release retried for minutes at the exit of a process whose query was stopped this way.
        beat.stop()
        assert beat.released
    finally:
        beat.stop()


def test_recording_a_batch_the_lake_already_has_writes_nothing(tmp_path: Path) -> None:
    """B1 replay: the lake's record of this query's batch (or a later one) is kept; no commit is made."""
    from deltalake import DeltaTable

    first = lease(tmp_path, "query-A", Clock())
    with owning(first):
        assert first.record_batch(batch("query-A", 3)) is True
        version = DeltaTable(str(tmp_path / "_engine_state")).version()
        assert first.record_batch(batch("query-A", 3, pending=9)) is False
        assert first.record_batch(batch("query-A", 2)) is False
        assert DeltaTable(str(tmp_path / "_engine_state")).version() == version
        state = read_state(str(tmp_path))
        assert state is not None and state.last_batch == batch("query-A", 3)
        assert first.record_batch(batch("query-A", 4)) is True
        state = read_state(str(tmp_path))
        assert state is not None and state.last_batch == batch("query-A", 4)


def test_an_earlier_releases_state_table_gains_totals_and_a_native_engine_forgets_them(tmp_path: Path) -> None:
    """#14: the totals (and batch_recorded_at) columns are added when the lease is taken (not before: a live owner of an earlier
    release could no longer write its row); an engine that records no batches drops the record's totals."""
    from deltalake import DeltaTable, write_deltalake

    from retry_engine.schemas import ENGINE_STATE

    path = str(tmp_path / "_engine_state")
    old_row = EngineState(3, owner("query-A"), T0, True, batch("query-A", 5, pending=2)).to_arrow().drop_columns(
        ["totals", "discarded_before", "batch_recorded_at"]
    )
    write_deltalake(path, old_row)
    second = lease(tmp_path, "query-B", Clock())
    with owning(second) as before:
        assert before is not None and before.last_batch == batch("query-A", 5, pending=2)
        assert before.last_batch is not None and before.last_batch.recorded_at is None  # an earlier release's
        assert DeltaTable(path).schema().to_arrow().names == list(ENGINE_STATE.names)
        totals = Totals.of([("G", "retry", 2)])
        assert second.record_batch(replace(batch("query-B", 0, pending=2), totals=totals))
        state = read_state(str(tmp_path))
        assert state is not None and state.last_batch is not None and state.last_batch.totals == totals
        assert state.last_batch.recorded_at == T0  # the lease's clock when it recorded the batch
        second.forget_totals()
        state = read_state(str(tmp_path))
        assert state is not None and state.last_batch == batch("query-B", 0, pending=2)
        version = DeltaTable(path).version()
        second.forget_totals()  # nothing to forget: no commit
        assert DeltaTable(path).version() == version


def test_the_engine_state_table_is_checkpointed_every_10_commits_and_cleaned_by_the_lease_also_on_an_old_lake(
    tmp_path: Path,
) -> None:
    """#14 part 4: every lease operation reads this table; an earlier release's table gains the properties at
    acquire, and since its writers then leave expired log files alone, the lease's own upkeep removes them."""
    from deltalake import DeltaTable

    from retry_engine.core.lease import MAINTAIN_EVERY, state_path
    from retry_engine.schemas import ENGINE_STATE

    fresh, old = tmp_path / "fresh", tmp_path / "old"
    # The old table's log expires at once, so its upkeep has something to remove.
    DeltaTable.create(
        state_path(str(old)), ENGINE_STATE.arrow_schema, configuration={"delta.logRetentionDuration": "interval 0 seconds"}
    )
    for lake, rounds in ((fresh, 12), (old, MAINTAIN_EVERY + 2)):
        clock = Clock()
        with owning(lease(lake, "query-A", clock)) as mine:
            assert mine is None
            configuration = DeltaTable(state_path(str(lake))).metadata().configuration
            assert configuration["delta.checkpointInterval"] == "10"
            assert configuration["delta.enableExpiredLogCleanup"] == "false"
            # Its checkpoints hold a replaced row's remove 2 hours, not 7 days (a week of them: 52 MB a checkpoint).
            assert configuration["delta.deletedFileRetentionDuration"] == "interval 2 hours"
            assert configuration["delta.logRetentionDuration"] == ("interval 2 hours" if lake == fresh else "interval 0 seconds")
            again = lease(lake, "query-A", clock)
            for _ in range(rounds):
                clock.now += dt.timedelta(seconds=1)
                again.acquire(take_over=True)
        state = read_state(str(lake))
        assert state is not None and state.epoch == rounds + 1
    # Fresh: a checkpoint every 10 commits, nothing expired in 30 days; old: commits before the upkeep's
    # checkpoint are gone, and the table reads from that checkpoint.
    assert "00000000000000000000.json" in names_of(fresh)
    assert "00000000000000000009.checkpoint.parquet" in names_of(fresh)
    assert f"{MAINTAIN_EVERY - 1:020d}.checkpoint.parquet" in names_of(old)
    assert min(n for n in names_of(old) if n.endswith(".json")) == f"{MAINTAIN_EVERY - 1:020d}.json"


def test_the_engine_state_log_keeps_two_hours_so_each_batch_record_stays_cheap(tmp_path: Path) -> None:
    """A review (session 20) measured a record at 0.28 s with 150,000 log entries (delta-rs lists the whole
    log at each commit on a local disk), and the table kept Delta's 30 days of commits: one a batch. Its
    log now keeps two hours; the lease's upkeep removes older commits before its checkpoint."""
    import os

    from retry_engine.core.lease import MAINTAIN_EVERY, state_path

    clock = Clock()
    with owning(lease(tmp_path, "query-A", clock)) as mine:
        assert mine is None
        again = lease(tmp_path, "query-A", clock)
        for _ in range(MAINTAIN_EVERY - 10):
            clock.now += dt.timedelta(seconds=1)
            again.acquire(take_over=True)
        three_hours_ago = dt.datetime.now(dt.UTC).timestamp() - 3 * 3600
        log_dir = Path(state_path(str(tmp_path))) / "_delta_log"
        aged = [p for p in log_dir.iterdir() if p.name[:20].isdigit()]
        for file in aged:
            os.utime(file, (three_hours_ago, three_hours_ago))
        # Commits before the newest checkpoint older than the retention can go.
        cut = max(int(p.name[:20]) for p in aged if p.name.endswith(".checkpoint.parquet"))
        for _ in range(12):
            clock.now += dt.timedelta(seconds=1)
            again.acquire(take_over=True)
    names = names_of(tmp_path)
    assert f"{MAINTAIN_EVERY - 1:020d}.checkpoint.parquet" in names
    assert cut > 9 and min(int(n[:20]) for n in names if n.endswith(".json")) == cut
    assert read_state(str(tmp_path)) is not None


def names_of(lake: Path) -> list[str]:
    from retry_engine.core.lease import state_path

    return sorted(p.name for p in (Path(state_path(str(lake))) / "_delta_log").iterdir())


GOOD_FILE = {"path": "p.parquet", "size": 1, "partition_values": {}, "modification_time": 0, "num_records": 1,
             "stats": "{}"}


@pytest.mark.parametrize(
    ("column", "value", "what"),
    [
        ("source_end", "not json", "source_end is not JSON"),
        ("source_end", "[1, 2]", "source_end is JSON list, not dict"),
        ("source_end", "[" * 100_000, "source_end is not JSON"),
        ("batch_files", "[1, 2]", "batch_files is JSON list"),
        ("batch_files", '{"retry": 5}', "not a list of files"),
        ("batch_files", '{"retry": [{"size": 1}]}', "not a file"),
        ("batch_files", json.dumps({"retry": [{**GOOD_FILE, "extra": 1}]}), "not a file"),
        ("batch_files", json.dumps({"retry": [{**GOOD_FILE, "size": -1}]}), "size -1 is not a count"),
        ("batch_files", json.dumps({"retry": [{**GOOD_FILE, "stats": None}]}), "stats None is not str"),
        ("owner_pid", None, "owner_pid is None"),
        ("owner_host", None, "owner_host is None"),
        ("batch_id", None, "batch_id is None"),
        ("epoch", None, "epoch is None"),
        ("since", None, "since is None"),
    ],
)
def test_a_damaged_engine_state_row_is_one_clear_error_naming_the_field(
    tmp_path: Path, column: str, value: Any, what: str
) -> None:
    """Hostile input (the lake's `_engine_state`, which only the engine writes): a value the engine never
    writes stops `run` with ENGINE_STATE_DAMAGED naming the field and how to restore the table, never a
    JSONDecodeError or TypeError from deep inside the lease."""
    from deltalake import write_deltalake

    from retry_engine.errors import EngineStateError

    row = EngineState(3, owner("query-A"), T0, False, batch("query-A", 5, pending=2)).to_arrow().to_pylist()[0]
    row[column] = value
    from retry_engine.schemas import ENGINE_STATE

    write_deltalake(str(tmp_path / "_engine_state"), pa.Table.from_pylist([row], schema=_loose(ENGINE_STATE.arrow_schema)))
    with pytest.raises(EngineStateError, match=rf"ENGINE_STATE_DAMAGED.*{re.escape(what)}.*restore\(0\)"):
        read_state(str(tmp_path))
    with pytest.raises(EngineStateError, match="ENGINE_STATE_DAMAGED"):
        lease(tmp_path, "query-B", Clock()).acquire(take_over=True)


def _loose(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column nullable (another writer's table need not keep NOT NULL)."""
    return pa.schema([field.with_nullable(True) for field in schema])


@pytest.mark.parametrize(
    "offset",
    [
        {"reservoirVersion": 1e400, "index": -1, "isStartingVersion": False},
        {"reservoirVersion": 1.9, "index": -1, "isStartingVersion": False},
        {"reservoirVersion": -9, "index": -1, "isStartingVersion": False},
        {"reservoirVersion": 1, "index": -2, "isStartingVersion": False},
        {"reservoirVersion": 1, "index": -1, "isStartingVersion": "no"},
        {"reservoirVersion": True, "index": -1, "isStartingVersion": False},
        {"reservoirVersion": 1, "index": -1, "isStartingVersion": False, "reservoirId": 5},
        {"reservoirVersion": 1, "index": -1, "isStartingVersion": False, "batchStart": [1]},
        {"reservoirVersion": 1, "index": -1, "isStartingVersion": False, "sourceVersion": "x"},
    ],
)
def test_a_hostile_offset_is_refused_never_read_as_another_position(offset: dict[str, Any]) -> None:
    """Hostile input (a checkpoint's offsets, the lake's recorded source end): a position that is not
    whole numbers and a flag is DELTA_OFFSET_INVALID, not rounded, wrapped or read as true."""
    from retry_engine.delta._offsets import Offset

    with pytest.raises(DeltaSourceError, match="DELTA_OFFSET_INVALID"):
        Offset.from_json(offset)
    assert Offset.from_json({"reservoirVersion": 1, "index": -1, "isStartingVersion": True}).key == (1, -1)


def test_a_recorded_file_without_its_fields_is_not_rolled_forward() -> None:
    """Hostile input: a recorded batch file with a path only reads (status needs the path) but is never
    committed half-known: ENGINE_STATE_DAMAGED naming what it lacks (a TypeError before)."""
    from retry_engine.core.lease import written_files
    from retry_engine.errors import EngineStateError

    with pytest.raises(EngineStateError, match="ENGINE_STATE_DAMAGED.*file of retry without size, partition_values"):
        written_files("retry", [{"path": "p.parquet"}])
    assert [f.path for f in written_files("retry", [GOOD_FILE])] == ["p.parquet"]


def test_a_recorded_batch_is_replayed_only_with_the_settings_that_decided_it(tmp_path: Path) -> None:
    """B1 (found by a review): the lake recorded batch 5, Spark did not commit it (a crash), and the operator set
    retry_max_times = 3 before the restart. The replay decided dead_letter where the record said retry: its state
    held no pending retry, its outputs were dropped as a replay's, and the retry the ledger counted was never
    released (the reverse released one twice). Such a start is refused, naming what changed."""
    from retry_engine.config import parse_config

    before = parse_config({"groups": {"G": {"retry_max_times": 16}}}).decision_settings()
    after = parse_config({"groups": {"G": {"retry_max_times": 3}}}).decision_settings()
    checkpoint = Path(planned_checkpoint(tmp_path, {5: batch("B", 5).source_end}))
    lake = _state(batch("B", 5))
    (checkpoint / "commits").mkdir()
    (checkpoint / "commits" / "5").write_text("v1\n{}")
    resume.check_replay(str(checkpoint), lake, query_id="B", settings=before)  # committed: stores the settings
    (checkpoint / "commits" / "5").unlink()  # batch 5 recorded in the lake, not committed by Spark
    with pytest.raises(LakeResumeError, match=r"REPLAY_SETTINGS_CHANGED.*batch 5 .*groups\.G\.retry_max_times.*run --once"):
        resume.check_replay(str(checkpoint), lake, query_id="B", settings=after)
    resume.check_replay(str(checkpoint), lake, query_id="B", settings=before)  # the previous config replays it
    # The same meaning written otherwise ("60s" as "1m", levels as other units) is no change.
    same = parse_config({"engine": {"dedup_window": "10m"}, "groups": {"G": {"retry_max_times": 16}}}).decision_settings()
    assert same == parse_config({"engine": {"dedup_window": "600s"}, "groups": {"G": {"retry_max_times": 16}}}).decision_settings()
    # A setting the stored ones lack (a release added it) is no change; a group added or removed is one.
    newer = json.loads(json.dumps(before))
    newer["engine"]["a_later_setting"] = 1
    newer["groups"]["G"]["a_later_group_setting"] = 2
    resume.check_replay(str(checkpoint), lake, query_id="B", settings=newer)
    more = parse_config({"groups": {"G": {"retry_max_times": 16}, "H": {}}}).decision_settings()
    with pytest.raises(LakeResumeError, match=r"REPLAY_SETTINGS_CHANGED.*\(groups\.H in "):
        resume.check_replay(str(checkpoint), lake, query_id="B", settings=more)
    # (found by a review of the fix) Spark committed later batches and purged batch 5's file (it keeps the last
    # 100; an idle engine commits one every trigger): no replay is coming, the new settings are stored.
    (checkpoint / "commits" / "180").write_text("v1\n{}")
    resume.check_replay(str(checkpoint), lake, query_id="B", settings=after)
    (checkpoint / "commits" / "180").unlink()
    resume.check_replay(str(checkpoint), lake, query_id="B", settings=after)
    # Another checkpoint's batch, or none: nothing to replay, the new settings are stored.
    resume.check_replay(str(checkpoint), _state(batch("A", 5)), query_id="B", settings=after)
    assert json.loads((checkpoint / resume.DECISIONS_FILE).read_text()) == json.loads(json.dumps(after))
    # A checkpoint of an earlier release (nothing stored) or a damaged file: not checked.
    for damaged in (None, b"\xff{", b"[" * 100_000):
        if damaged is None:
            (checkpoint / resume.DECISIONS_FILE).unlink()
        else:
            (checkpoint / resume.DECISIONS_FILE).write_bytes(damaged)
        resume.check_replay(str(checkpoint), lake, query_id="B", settings=before)


def test_a_stopping_engine_keeps_its_lease_until_its_batch_has_committed(tmp_path: Path) -> None:
    """B8 (found by a review): Spark marks a stopping query inactive at once, then waits for its running batch's
    commits; the heartbeat saw it inactive and released the lease, and a standby took the lake while the owner
    still committed, unfenced. Held by the stop, the heartbeat goes on beating until the stop ends it."""
    import time

    running = [True]
    owner_lease = lease(tmp_path, "query-A", Clock())
    owner_lease.acquire()
    beat = Heartbeat(owner_lease, interval_s=0.05, alive=lambda: running[0], on_lost=lambda exc: None)
    beat.start()
    beat.hold()  # engine.stop() begins
    running[0] = False  # Spark: the query is no longer active, its batch still commits
    from deltalake import DeltaTable

    from retry_engine.core.lease import state_path

    before = DeltaTable(state_path(str(tmp_path))).version()
    time.sleep(0.4)
    state = read_state(str(tmp_path))
    assert state is not None and not state.released and not beat.released
    # It went on beating (not merely kept from releasing): heartbeats committed since the hold.
    assert DeltaTable(state_path(str(tmp_path))).version() > before
    with pytest.raises(LakeOwnedError):
        lease(tmp_path, "query-B", Clock(), host="elsewhere.example").acquire()
    beat.stop()
    owner_lease.release()  # what stop() does once the query has ended


def test_a_heartbeat_that_cannot_ask_the_query_releases_the_lease(tmp_path: Path) -> None:
    """(found by a review) The driver's JVM died (OOM-kill): alive() raised, the heartbeat thread died with the
    error, and the lake stayed owned by a dead engine until its lease expired. It is taken for stopped."""
    import time

    owner_lease = lease(tmp_path, "query-A", Clock())
    owner_lease.acquire()

    def gone() -> bool:
        raise ConnectionRefusedError("py4j: the JVM is gone")

    beat = Heartbeat(owner_lease, interval_s=0.05, alive=gone, on_lost=lambda exc: None)
    beat.start()
    deadline = time.monotonic() + 10
    while not beat.released and time.monotonic() < deadline:
        time.sleep(0.05)
    state = read_state(str(tmp_path))
    assert beat.released and state is not None and state.released
