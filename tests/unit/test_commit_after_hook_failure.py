"""#14: a rewrite whose commit lands but whose delta-rs post-commit hook fails (found by a review).

delta-rs writes a checkpoint after every ``delta.checkpointInterval``-th commit (10 on the engine's
tables) once the commit is in the log; a storage error there raises for a commit that stands. The
windowed compaction took any error for "not committed" and deleted the files it had just
committed: every reader then failed on a missing file, for good. The hook is made to fail here as a
storage error would: ``_last_checkpoint`` is a folder, so its rename fails.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from retry_engine.delta import tables
from retry_engine.delta._files import PartitionedWriter
from retry_engine.delta._log import snapshot_files
from retry_engine.delta.sink import delete_uncommitted
from retry_engine.delta.storage import filesystem, location
from retry_engine.ops.maintenance import TimeWindow, maintain_table

AT = dt.datetime.now(dt.UTC).replace(minute=5, second=0, microsecond=0) - dt.timedelta(days=1)


def small_files(path: str, count: int, *, interval: int) -> None:
    """``count`` one-row commits (one file each) of a table checkpointed every ``interval`` commits."""
    for i in range(count):
        write_deltalake(
            path,
            pa.table(
                {
                    "id": [f"m{i}"],
                    "ts": pa.array([AT + dt.timedelta(minutes=i)], pa.timestamp("us", "UTC")),
                }
            ),
            mode="append",
            configuration={"delta.checkpointInterval": str(interval)} if i == 0 else None,
        )


def missing_files(path: str) -> list[str]:
    return [
        u for u in DeltaTable(path).file_uris() if not os.path.exists(u.removeprefix("file://"))
    ]


def failing_hook(path: str) -> Path:
    """Make the next post-commit checkpoint fail (the commit itself is unaffected)."""
    marker = Path(path) / "_delta_log" / "_last_checkpoint"
    marker.mkdir()
    return marker


def test_windowed_compaction_keeps_the_files_it_committed_when_the_hook_fails(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "t")
    small_files(
        path, 9, interval=10
    )  # versions 0-8: the compaction's commit is version 9, a checkpoint's
    marker = failing_hook(path)
    report = maintain_table(
        "t", path, retention_hours=168, window=TimeWindow("ts", dt.timedelta(hours=1))
    )
    marker.rmdir()
    assert DeltaTable(path).version() == 9
    assert missing_files(path) == []
    assert sorted(DeltaTable(path).to_pyarrow_table()["id"].to_pylist()) == sorted(
        f"m{i}" for i in range(9)
    )
    # The report tells what the commit did (it said 0 files compacted, and an error, for a commit that stood).
    assert (report.files_compacted, report.files_written) == (9, 1)
    assert report.error is None


def test_commit_next_returns_the_version_of_a_commit_whose_hook_failed(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    small_files(path, 2, interval=3)  # versions 0-1: the next commit (2) writes a checkpoint
    table = DeltaTable(path)
    removed = snapshot_files(table, table.version())
    marker = failing_hook(path)
    assert tables.commit_next(table, removed, data_change=True, operation="test") == 2
    marker.rmdir()
    assert DeltaTable(path).version() == 2
    assert DeltaTable(path).to_pyarrow_table().num_rows == 0


def test_commit_next_still_raises_when_the_commit_did_not_land(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "t")
    small_files(path, 2, interval=100)
    table = DeltaTable(path)

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("the store went away before the commit")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", broken)
    with pytest.raises(OSError, match="went away"):
        tables.commit_next(
            table, snapshot_files(table, table.version()), data_change=True, operation="test"
        )
    assert DeltaTable(path).version() == 1


def test_delete_uncommitted_keeps_files_the_table_references(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    small_files(path, 1, interval=100)
    table = DeltaTable(path)
    fs, root = filesystem(path)
    schema = pa.schema(table.schema().to_arrow())

    def written() -> list:
        writer = PartitionedWriter(fs, root, schema, partition_by=[], uri=path)
        writer.write(
            pa.record_batch(
                {"id": ["x"], "ts": pa.array([AT], pa.timestamp("us", "UTC"))}, schema=schema
            )
        )
        return writer.close()

    kept, orphan = written(), written()
    tables.commit_next(table, [], kept, data_change=True, operation="test")
    delete_uncommitted(location(path), [*kept, *orphan])
    assert missing_files(path) == []
    assert os.path.exists(os.path.join(root, kept[0].path))
    assert not os.path.exists(os.path.join(root, orphan[0].path))


def test_an_abort_after_its_commit_landed_keeps_the_files_a_compaction_replaced_since(tmp_path: Path) -> None:
    """A sink commit lands, its post-commit hook fails, and a compaction replaces its files before
    Spark's abort runs: the files are no longer in the snapshot, but a stream reading the append's
    version needs them. Once the table records the write's transaction the abort deletes nothing
    (found by review)."""
    from retry_engine.delta.sink import FilesWritten, abort_files, commit_files

    path = str(tmp_path / "t")
    small_files(path, 1, interval=100)
    fs, root = filesystem(path)
    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    writer = PartitionedWriter(fs, root, schema, partition_by=[], uri=path)
    writer.write(pa.record_batch({"id": ["x"], "ts": pa.array([AT], pa.timestamp("us", "UTC"))}, schema=schema))
    files = writer.close()
    messages = [FilesWritten(tuple(files))]
    assert commit_files(location(path), messages, mode="append", partition_by=[], app_id="q", txn_version=3)
    table = DeltaTable(path)
    tables.commit_next(table, snapshot_files(table, table.version()), data_change=False, operation="compaction")
    abort_files(location(path), messages, transaction=("q", 3))
    assert os.path.exists(os.path.join(root, files[0].path))
    abort_files(location(path), messages, transaction=("q", 4))  # not recorded: the files are orphans
    assert not os.path.exists(os.path.join(root, files[0].path))


def test_a_roll_forward_of_a_committed_batch_keeps_its_files_a_compaction_replaced(tmp_path: Path) -> None:
    """The engine's start re-commits the lake's recorded batch; when the table already has it and a
    compaction replaced its files while the engine was down, the files stay for streams still reading
    that version (they were deleted as a replay's would be; found by review). A transaction version of 0
    (a stream's first batch) counts as recorded."""
    import dataclasses

    from retry_engine.config import parse_config
    from retry_engine.core.lease import BatchRecord
    from retry_engine.core.outputs import roll_forward
    from retry_engine.delta.sink import FilesWritten, abort_files, commit_files
    from retry_engine.schemas import RETRY
    from tests.builders import retry_rows

    config = parse_config({"engine": {"lake": str(tmp_path / "lake")}})
    path = config.table_path(RETRY.name)
    tables.ensure_table(path, RETRY.arrow_schema, partition_by=RETRY.partition_by)
    fs, root = filesystem(path)
    writer = PartitionedWriter(fs, root, RETRY.arrow_schema, partition_by=list(RETRY.partition_by), uri=path)
    for batch in retry_rows(AT, ["m1"]).to_batches():
        writer.write(batch)
    files = writer.close()
    record = BatchRecord("q", 0, None, {RETRY.name: [dataclasses.asdict(f) for f in files]}, 0)
    assert roll_forward(config, record) == [RETRY.name]
    table = DeltaTable(path)
    tables.commit_next(table, snapshot_files(table, table.version()), data_change=False, operation="compaction")
    abort_files(location(path), [FilesWritten(tuple(files))], transaction=("q", 0))
    assert all(os.path.exists(os.path.join(root, f.path)) for f in files), "abort of batch 0"
    assert roll_forward(config, record) == []  # the engine's next start: already committed
    assert all(os.path.exists(os.path.join(root, f.path)) for f in files), "roll-forward"
    # A replay's own files (never committed) still go: commit_files as Spark's replay calls it.
    orphan_writer = PartitionedWriter(fs, root, RETRY.arrow_schema, partition_by=list(RETRY.partition_by), uri=path)
    for batch in retry_rows(AT, ["m2"]).to_batches():
        orphan_writer.write(batch)
    orphans = orphan_writer.close()
    assert not commit_files(location(path), [FilesWritten(tuple(orphans))], mode="append",
                            partition_by=list(RETRY.partition_by), app_id="q", txn_version=0)
    assert not any(os.path.exists(os.path.join(root, f.path)) for f in orphans)



def test_an_overwrite_that_meets_a_compaction_replaces_the_compacted_rows_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(found by a review) A deltars overwrite (complete mode, mode("overwrite")) planned before a compaction landed
    was rebased by delta-rs: it removed the files the compaction had already removed, and the compacted file,
    holding the old rows, stayed beside the new ones. It is planned again on the new snapshot."""
    import pyarrow.fs as pafs

    from retry_engine.delta import sink
    from retry_engine.delta._files import PartitionedWriter
    from retry_engine.delta.tables import commit_next, ensure_table

    path = str(tmp_path / "t")
    schema = pa.schema([("x", pa.int64())])
    ensure_table(path, schema)

    def task(values: list[int]) -> sink.FilesWritten:
        writer = PartitionedWriter(pafs.LocalFileSystem(), path, schema)
        writer.write(pa.record_batch([pa.array(values, pa.int64())], schema=schema))
        return sink.FilesWritten(tuple(writer.close()))

    sink.commit_files(location(path), [task([1]), task([2])], mode="overwrite", partition_by=(), app_id="q", txn_version=0)
    real = sink.open_latest
    compacted: list[int] = []

    def open_then_compact(where: Any) -> Any:
        handle = real(where)
        if not compacted:  # another process compacts once, after the overwrite read the table
            other = DeltaTable(path)
            compacted.append(commit_next(other, snapshot_files(other, other.version()), task([1, 2]).files,
                                         data_change=False, operation="COMPACT"))
        return handle

    monkeypatch.setattr(sink, "open_latest", open_then_compact)
    assert sink.commit_files(location(path), [task([10])], mode="overwrite", partition_by=(), app_id="q", txn_version=1)
    assert DeltaTable(path).to_pyarrow_table().column("x").to_pylist() == [10] and compacted
    assert missing_files(path) == []


def test_a_sink_commit_whose_answer_was_lost_is_done_not_a_conflict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On S3 a commit's answer lost on the way back makes object_store put it again, which meets its own
    first attempt (412): delta-rs raises CommitFailedError for a commit that stands. The sink raised
    DELTA_COMMIT_FAILED ("another writer"), the engine's query failed and restarted (found by a review
    on moto with a proxy that drops the answer). With the write's transaction in the table it is done; a
    failure whose transaction is not there is still the write's error."""
    from deltalake.exceptions import CommitFailedError

    from retry_engine.delta.sink import FilesWritten, commit_files
    from retry_engine.errors import DeltaSinkError

    path = str(tmp_path / "t")
    small_files(path, 1, interval=100)
    fs, root = filesystem(path)
    schema = pa.schema(DeltaTable(path).schema().to_arrow())

    def written(row: str) -> list[FilesWritten]:
        writer = PartitionedWriter(fs, root, schema, partition_by=[], uri=path)
        writer.write(pa.record_batch({"id": [row], "ts": pa.array([AT], pa.timestamp("us", "UTC"))}, schema=schema))
        return [FilesWritten(tuple(writer.close()))]

    real = DeltaTable.create_write_transaction
    landed: list[bool] = []

    def answer_lost(self: DeltaTable, *args: Any, **kwargs: Any) -> Any:
        if landed[-1]:
            real(self, *args, **kwargs)
            # Maintenance compacts the table before the retried put fails: the landed commit's file is
            # replaced, and a stream still reading that version needs it (found by the review of this fix).
            assert DeltaTable(path).optimize.compact().get("numFilesRemoved") == 2
        raise CommitFailedError("Transaction failed: Version already exists")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", answer_lost)
    landed.append(True)
    lost = written("x")
    assert not commit_files(location(path), lost, mode="append", partition_by=[], app_id="q", txn_version=1)
    assert all(os.path.exists(os.path.join(root, f.path)) for m in lost for f in m.files)
    landed.append(False)
    with pytest.raises(DeltaSinkError, match="DELTA_COMMIT_FAILED"):
        commit_files(location(path), written("y"), mode="append", partition_by=[], app_id="q", txn_version=2)
    monkeypatch.undo()
    assert sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist()) == ["m0", "x"]
    assert DeltaTable(path).transaction_version("q") == 1 and missing_files(path) == []
    assert sorted(DeltaTable(path, version=1).to_pyarrow_table().column("id").to_pylist()) == ["m0", "x"]
