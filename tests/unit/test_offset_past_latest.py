"""A checkpoint's deltars offset past the table's log is refused (``DELTA_OFFSET_INVALID``), not waited on.

A stream's offset is never past ``latest + 1`` (before the next commit, once every commit is read); a
snapshot offset or one inside a commit is never past ``latest``. A checkpoint that holds more (the
table restored from an older backup, or replaced by a table with the same id and a shorter log, while
the checkpoint was kept) used to stall: ``latestOffset`` returned the start unchanged and
``partitions`` planned nothing, forever, while the table gained commits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import ReadAllAvailable

from retry_engine.delta import FORMAT_NAME, append_arrow, ensure_table
from retry_engine.delta._log import DeltaLog
from retry_engine.delta._offsets import Offset, require_within_table, within_table
from retry_engine.delta.source import DeltaStreamReader, SourceOptions
from retry_engine.errors import DeltaSourceError
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import Result, results_table
from tests.streaming import running

LATEST = 7


@pytest.mark.parametrize(
    "offset",
    [
        Offset(
            LATEST, -1, True
        ),  # before the snapshot at the latest version (a new stream's start)
        Offset(LATEST, 4, True),  # inside that snapshot
        Offset(LATEST, -1, False),  # before the latest commit
        Offset(LATEST, 0, False),  # inside the latest commit
        Offset(
            LATEST + 1, -1, False
        ),  # every commit read: waiting for the next (startingVersion=latest too)
        Offset(0, -1, True),
        Offset(LATEST + 1, -1, False, batch_start=Offset(LATEST, -1, True)),  # a first batch's end
    ],
)
def test_every_offset_a_stream_of_the_table_can_hold_is_accepted(offset: Offset) -> None:
    assert within_table(offset, LATEST)
    require_within_table(offset, LATEST, table="t")


@pytest.mark.parametrize(
    "offset",
    [
        Offset(LATEST + 1, 0, False),  # inside a commit the table does not have
        Offset(LATEST + 1, -1, True),  # a snapshot the table does not have
        Offset(LATEST + 2, -1, False),
        Offset(10**6, -1, False),
        Offset(10**30, 5, True),
        Offset(LATEST, -1, False, batch_start=Offset(LATEST + 1, -1, True)),  # a forged batchStart
    ],
)
def test_an_offset_past_the_tables_log_is_refused_naming_table_versions_and_what_to_do(
    offset: Offset,
) -> None:
    assert not within_table(offset, LATEST)
    with pytest.raises(DeltaSourceError, match="DELTA_OFFSET_INVALID") as caught:
        require_within_table(offset, LATEST, table="s3://lake/consume_results")
    message = str(caught.value)
    past = offset.batch_start if offset.batch_start is not None else offset
    assert "s3://lake/consume_results" in message
    assert f"version {past.version} " in message and f"latest version is {LATEST}:" in message
    assert "new checkpoint" in message and "restore the table" in message


def _reader(path: str, **options: str) -> DeltaStreamReader:
    return DeltaStreamReader(
        SourceOptions.parse({"path": path, **options}), CONSUME_RESULTS.spark_schema
    )


@pytest.fixture
def table(tmp_path: Path) -> str:
    path = str(tmp_path / "in")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)  # version 0
    append_arrow(path, results_table([Result.of(), Result.of()]))  # version 1
    return path


def _read_everything(reader: DeltaStreamReader, start: dict[str, Any]) -> dict[str, Any]:
    end = reader.latestOffset(start, ReadAllAvailable())
    reader.partitions(start, end)
    return end


@pytest.mark.parametrize(
    "kind", ["snapshot", "read everything", "startingVersion=latest", "startingVersion=2"]
)
def test_the_readers_own_boundary_offsets_are_accepted(table: str, kind: str) -> None:
    """A new stream's snapshot start (1, -1, snapshot), the end of a stream that read every commit,
    and startingVersion=latest or latest + 1 (all three (2, -1)), given to a restarted reader."""
    if kind == "snapshot":
        start = _reader(table).initialOffset()
        assert Offset.from_json(start).key == (1, -1) and start["isStartingVersion"] is True
    elif kind == "read everything":
        first = _reader(table)
        start = _read_everything(first, first.initialOffset())
    else:
        start = _reader(table, startingVersion=kind.split("=")[1]).initialOffset()
    restarted = _reader(table)
    if kind != "snapshot":
        assert Offset.from_json(start).key == (2, -1)
        assert (
            restarted.latestOffset(start, ReadAllAvailable()) == start
        )  # nothing new: waits, as it should
        # (An end that records where its first batch started replays that batch: compare the position only.)
        plain = {k: v for k, v in start.items() if k != "batchStart"}
        assert restarted.partitions(plain, plain) == []
    append_arrow(table, results_table([Result.of()]))
    end = _read_everything(restarted, start)
    assert Offset.from_json(end).key == (3, -1)
    assert _read_everything(_reader(table), end) == end


@pytest.mark.parametrize("version", [5, 10**6, 10**30])
def test_a_start_past_the_table_fails_instead_of_stalling_as_commits_arrive(
    table: str, version: int
) -> None:
    """The review's probe: the start returned unchanged and no file planned, whatever was committed."""
    start = {
        **_reader(table).initialOffset(),
        "reservoirVersion": version,
        "index": -1,
        "isStartingVersion": False,
    }
    reader = _reader(table)
    for _ in range(2):
        append_arrow(table, results_table([Result.of()]))
        with pytest.raises(DeltaSourceError, match="DELTA_OFFSET_INVALID") as caught:
            reader.latestOffset(start, ReadAllAvailable())
        assert f"version {version} of {table}" in str(caught.value)
    with pytest.raises(DeltaSourceError, match="DELTA_OFFSET_INVALID"):
        _reader(table).partitions(start, start)  # a replayed batch of the checkpoint
    with pytest.raises(DeltaSourceError, match="DELTA_OFFSET_INVALID"):
        _reader(table).partitions(_reader(table).initialOffset(), start)
    with pytest.raises(DeltaSourceError, match="DELTA_OFFSET_INVALID"):
        available_now = _reader(table)
        available_now.prepareForTriggerAvailableNow()
        available_now.latestOffset(start, ReadAllAvailable())


def test_a_table_restored_from_an_older_backup_under_the_checkpoint_is_refused(
    table: str, tmp_path: Path
) -> None:
    backup = tmp_path / "backup"
    shutil.copytree(table, backup)  # at version 1
    reader = _reader(table)
    checkpointed = _read_everything(reader, reader.initialOffset())
    for _ in range(3):
        append_arrow(table, results_table([Result.of()]))
        checkpointed = _read_everything(reader, checkpointed)
    assert Offset.from_json(checkpointed).key == (5, -1)
    shutil.rmtree(table)
    shutil.copytree(backup, table)  # the same table id, latest version 1
    with pytest.raises(DeltaSourceError, match="DELTA_OFFSET_INVALID") as caught:
        _reader(table).latestOffset(checkpointed, ReadAllAvailable())
    assert "version 5 of" in str(caught.value) and "latest version is 1:" in str(caught.value)


def test_the_check_reads_the_table_no_more_than_planning_did(
    table: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """latestOffset already reads the latest version, and partitions then plans offsets within it: the
    check adds no read of the log to a batch. Only an offset past what was read makes it read again."""
    reads = []
    original = DeltaLog.latest_version

    def counted(self: DeltaLog) -> int:
        reads.append(1)
        return original(self)

    monkeypatch.setattr(DeltaLog, "latest_version", counted)
    reader = _reader(table)
    start = reader.initialOffset()
    for _ in range(3):
        append_arrow(table, results_table([Result.of()]))
        reads.clear()
        end = reader.latestOffset(start, ReadAllAvailable())
        reader.partitions(start, end)
        assert len(reads) == 1
        start = end
    reads.clear()
    with pytest.raises(DeltaSourceError, match="DELTA_OFFSET_INVALID"):
        reader.partitions(start, {**start, "reservoirVersion": 10**6})
    assert len(reads) == 1  # read again before refusing: the table may have grown since


def _forge_last_offset(checkpoint: Path, **changes: Any) -> None:
    """Edit the source offset in the checkpoint's latest offsets file (Spark: ``v1``, metadata, one line a source)."""
    offsets = checkpoint / "offsets"
    batch = max(int(p.name) for p in offsets.iterdir() if p.name.isdigit())
    file = offsets / str(batch)
    header, metadata, source = file.read_text().split("\n")
    file.write_text("\n".join([header, metadata, json.dumps({**json.loads(source), **changes})]))
    (offsets / f".{batch}.crc").unlink(
        missing_ok=True
    )  # Hadoop's checksum of the file as Spark wrote it


def test_a_spark_stream_on_a_forged_checkpoint_fails_with_the_code(
    spark: Any, tmp_path: Path, table: str
) -> None:
    checkpoint = tmp_path / "checkpoint"

    def start() -> Any:
        return (
            spark.readStream.format(FORMAT_NAME)
            .option("path", table)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    with running(start()) as query:
        query.awaitTermination(120)
        assert query.exception() is None
        assert sum(p["numInputRows"] for p in query.recentProgress) == 2
    _forge_last_offset(checkpoint, reservoirVersion=10**6, index=-1, isStartingVersion=False)
    append_arrow(table, results_table([Result.of()]))
    with running(start()) as query:
        with pytest.raises(Exception, match="DELTA_OFFSET_INVALID") as caught:
            query.awaitTermination(120)
    assert "version 1000000 of" in str(caught.value) and "latest version is 2:" in str(caught.value)


@pytest.mark.parametrize("new_versions", [3, 8])
def test_a_table_re_created_while_the_stream_runs_is_table_id_changed(tmp_path: Path, new_versions: int) -> None:
    """(found by a review) The reader checked the table id once, at its start: a table deleted and re-created at
    its path while the query ran was read on from the old latest version (the new table's rows up to it skipped,
    silently) when the new log was longer, and failed with delta-rs's kernel error when it was shorter."""
    import pyarrow as pa
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    for i in range(5):
        write_deltalake(path, pa.table({"id": [f"old{i}"]}), mode="append")
    options = SourceOptions.parse({"path": path, "startingVersion": "0"})
    from retry_engine.delta.source import row_schema

    reader = DeltaStreamReader(options, row_schema(options))
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == reader.latestOffset(end, ReadAllAvailable())  # nothing new: no error, no re-read
    shutil.rmtree(path)
    for i in range(new_versions):
        write_deltalake(path, pa.table({"id": [f"new{i}"]}), mode="append")
    with pytest.raises(DeltaSourceError, match=r"DELTA_TABLE_ID_CHANGED.*deleted and re-created while it was read"):
        reader.latestOffset(end, ReadAllAvailable())
    # The same table gaining commits is read on as before.
    same = str(tmp_path / "same")
    write_deltalake(same, pa.table({"id": ["a"]}))
    log = DeltaLog(SourceOptions.parse({"path": same}).location)
    assert log.latest_version() == 0
    write_deltalake(same, pa.table({"id": ["b"]}), mode="append")
    assert log.latest_version() == 1 and log.latest_version() == 1
