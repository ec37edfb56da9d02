"""#14 (months on a lake): a stream behind a topic's row retention skips the files the retention removed
and VACUUM then deleted, as RocketMQ's consumer misses what its commit log deleted (``skipExpiredBy``).

A file gone for any other reason (deleted by hand, vacuumed after a compaction of rows still retained,
a table without a recorded cut, a log whose statistics cannot tell) still stops the stream with
``DELTA_FILE_MISSING``: those rows were lost, not expired. No SparkSession: the stream reader is driven
directly (``read`` is what Spark's read tasks run), on real Delta tables.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction
from pyspark.sql.datasource import ReadAllAvailable

from retry_engine.delta._log import (
    EXPIRED_BEFORE_APP,
    Expired,
    ExpiryJudge,
    TableLocation,
    expired_before,
)
from retry_engine.delta.source import DeltaStreamReader, SourceOptions
from retry_engine.delta.tables import append_arrow, ensure_table
from retry_engine.errors import ConfigError, DeltaSourceError
from retry_engine.ops.maintenance import expire_rows
from retry_engine.schemas import MESSAGES
from tests.builders import message_rows

NOW = dt.datetime.now(dt.UTC)
OLD = NOW - dt.timedelta(days=10)
CUT = NOW - dt.timedelta(days=3)
STREAM = {"ignoreDeletes": "true", "skipExpiredBy": "store_timestamp"}


def _topic(tmp_path: Path) -> str:
    """The messages table: version 1 two messages stored 10 days ago, version 2 one more, version 3 one now."""
    path = str(tmp_path / "messages")
    ensure_table(path, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
    append_arrow(path, message_rows(["old1", "old2"], [OLD, OLD]))
    append_arrow(path, message_rows(["old3"], [OLD + dt.timedelta(hours=1)]))
    append_arrow(path, message_rows(["new"], [NOW]))
    return path


def _stopped_at(path: str, options: dict[str, str]) -> tuple[DeltaStreamReader, dict[str, object]]:
    """A stream of ``path`` whose checkpoint holds the start of its first batch, not yet read."""
    reader = DeltaStreamReader(SourceOptions.parse({"path": path, **options}), MESSAGES.spark_schema)
    return reader, reader.initialOffset()


def _read(reader: DeltaStreamReader, start: dict[str, object]) -> list[str]:
    end = reader.latestOffset(start, ReadAllAvailable())
    return [m for part in reader.partitions(start, end) for b in reader.read(part) for m in b.column("msg_id").to_pylist()]


def _expire_and_vacuum(path: str, *, stamped: bool = True) -> None:
    assert expire_rows(path, "store_timestamp", CUT, stamped=stamped) == (2, 3)
    DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)


@pytest.mark.parametrize("start", [{"startingVersion": "1"}, {}], ids=["commits", "snapshot"])
def test_a_stream_behind_the_retention_skips_the_expired_files_vacuum_deleted(tmp_path: Path, start: dict[str, str]) -> None:
    """From commits (a consumer that stopped before they came) and from a first snapshot not yet read:
    the expired files are skipped, the rest delivered; without the option the stream stops."""
    path = _topic(tmp_path)
    reader, at = _stopped_at(path, {**STREAM, **start})
    plain, plain_at = _stopped_at(path, {"ignoreDeletes": "true", **start})
    _expire_and_vacuum(path)
    assert _read(reader, at) == ["new"]
    with pytest.raises(DeltaSourceError, match="DELTA_FILE_MISSING"):
        _read(plain, plain_at)


def test_the_expired_file_is_judged_by_its_statistics_against_the_cut(tmp_path: Path) -> None:
    path = _topic(tmp_path)
    location = TableLocation(path)
    first = DeltaTable(path, version=1).get_add_actions(flatten=True).column("path")[0].as_py()

    def expired(path: str, version: int, column: str = "store_timestamp") -> Expired | None:
        return ExpiryJudge(location, column).expired(path, version)

    assert expired(first, 1) is None  # no cut recorded yet
    _expire_and_vacuum(path)
    gone = expired(first, 1)
    assert gone is not None and gone.rows == 2 and gone.newest <= OLD + dt.timedelta(milliseconds=1)
    assert abs(gone.cut - CUT) < dt.timedelta(milliseconds=1)
    # Not what version 1 added (the file of another commit, a made-up one), another column: unknown.
    assert expired(first, 2) is None
    assert expired("part-none.parquet", 1) is None
    assert expired(first, 1, "topic") is None  # a string statistic: no time
    assert expired(first, 1, "no_such_column") is None


def test_a_file_gone_with_rows_inside_the_retention_still_stops_the_stream(tmp_path: Path) -> None:
    """Deleted by hand (or vacuumed after a compaction) while its rows are still retained: a loss."""
    path = _topic(tmp_path)
    reader, at = _stopped_at(path, {**STREAM, "startingVersion": "1"})
    _expire_and_vacuum(path)
    newest = DeltaTable(path, version=3).get_add_actions(flatten=True).column("path").to_pylist()
    (Path(path) / next(p for p in newest if p not in _paths_of(path, 2))).unlink()
    with pytest.raises(DeltaSourceError, match="DELTA_FILE_MISSING"):
        _read(reader, at)


def _paths_of(path: str, version: int) -> set[str]:
    return set(DeltaTable(path, version=version).get_add_actions(flatten=True).column("path").to_pylist())


def test_without_a_recorded_cut_a_gone_file_stops_the_stream(tmp_path: Path) -> None:
    """An expiry of an earlier release (or anyone's delete) records no cut: nothing says the rows expired."""
    path = _topic(tmp_path)
    reader, at = _stopped_at(path, {**STREAM, "startingVersion": "1"})
    _expire_and_vacuum(path, stamped=False)
    with pytest.raises(DeltaSourceError, match="DELTA_FILE_MISSING"):
        _read(reader, at)


@pytest.mark.parametrize("version", [2**62, -(2**62), 0])
def test_a_cut_another_writer_set_to_no_time_skips_nothing(tmp_path: Path, version: int) -> None:
    """Hostile input: a transaction of the retention's app id holding no time (or the epoch) is no cut
    the files' rows are before."""
    path = _topic(tmp_path)
    reader, at = _stopped_at(path, {**STREAM, "startingVersion": "1"})
    _expire_and_vacuum(path, stamped=False)
    write_deltalake(path, message_rows(["later"], [NOW]), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(EXPIRED_BEFORE_APP, version)]))
    with pytest.raises(DeltaSourceError, match="DELTA_FILE_MISSING"):
        _read(reader, at)


def _future_cut(path: str, ahead: dt.timedelta) -> None:
    """Another writer (or a clock ahead) records a cut ``ahead`` of now."""
    at_ms = int((dt.datetime.now(dt.UTC) + ahead).timestamp() * 1000)
    write_deltalake(path, message_rows(["later"], [NOW]), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(EXPIRED_BEFORE_APP, at_ms)]))


def test_a_cut_in_the_future_skips_nothing_and_the_next_expiry_records_a_true_one(tmp_path: Path) -> None:
    """Hostile input (found by review): a cut in the year 2999 made a stream skip a file deleted by hand
    whose rows were stored now, and `status` count pending retries as released. A cut more than
    FUTURE_EVENTS ahead is no cut; the next expiry stamps its own (the future one is not kept for good)."""
    path = _topic(tmp_path)
    reader, at = _stopped_at(path, {**STREAM, "startingVersion": "1"})
    _future_cut(path, dt.timedelta(days=365 * 900))
    assert expired_before(DeltaTable(path)) is None
    (Path(path) / next(iter(_paths_of(path, 3) - _paths_of(path, 2)))).unlink()  # stored now, deleted by hand
    with pytest.raises(DeltaSourceError, match="DELTA_FILE_MISSING"):
        _read(reader, at)
    assert expire_rows(path, "store_timestamp", CUT, stamped=True)[0] == 2
    cut = expired_before(DeltaTable(path))
    assert cut is not None and abs(cut - CUT) < dt.timedelta(milliseconds=1)


def test_a_cut_just_ahead_of_this_clock_is_still_a_cut(tmp_path: Path) -> None:
    """Engines' clocks a little apart: a cut minutes ahead is kept (the rule is FUTURE_EVENTS, an hour)."""
    path = _topic(tmp_path)
    _future_cut(path, dt.timedelta(minutes=20))
    cut = expired_before(DeltaTable(path))
    assert cut is not None and cut > dt.datetime.now(dt.UTC)


@pytest.mark.parametrize(
    "stats",
    [None, "{", "[]", '{"numRecords": 2}', '{"maxValues": {"store_timestamp": 17}}',
     '{"maxValues": {"store_timestamp": "yesterday"}}', '{"maxValues": {"store_timestamp": "2026-01-01T00:00:00"}}',
     '{"maxValues": []}'],
    ids=["none", "not-json", "a-list", "no-max", "a-number", "no-date", "no-zone", "max-a-list"],
)
def test_statistics_that_cannot_tell_skip_nothing(tmp_path: Path, stats: str | None) -> None:
    """Hostile input: the adding commit's statistics (another writer's) missing, malformed, or no time
    with a zone: the gone file is not known to be expired."""
    path = _topic(tmp_path)
    reader, at = _stopped_at(path, {**STREAM, "startingVersion": "1"})
    _expire_and_vacuum(path)
    commit = Path(path) / "_delta_log" / f"{1:020d}.json"
    actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
    for action in actions:
        if "add" in action:
            action["add"]["stats"] = stats
    commit.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    with pytest.raises(DeltaSourceError, match="DELTA_FILE_MISSING"):
        _read(reader, at)


def test_a_file_with_a_null_time_is_not_expired_even_when_gone(tmp_path: Path) -> None:
    """Another writer's row without a store time: the expiry keeps its file (a null might be a row to
    keep), so a stream finding it gone has lost it."""
    path = _topic(tmp_path)
    reader, at = _stopped_at(path, {**STREAM, "startingVersion": "4"})
    append_arrow(path, message_rows(["old4", "timeless"], [OLD, None]))  # version 4
    _expire_and_vacuum(path)
    kept = _paths_of(path, 4) - _paths_of(path, 3)
    assert kept <= _paths_of(path, DeltaTable(path).version())  # not expired
    for name in kept:
        (Path(path) / name).unlink()
    with pytest.raises(DeltaSourceError, match="DELTA_FILE_MISSING"):
        _read(reader, at)


def test_skip_expired_by_is_a_column_a_retention_judges_by() -> None:
    """Hostile option values: a table's cut is by its own column (a message born ten days ago may be
    stored now), so no other column judges a file; empty is off."""
    assert SourceOptions.parse({"path": "/t", "skipExpiredBy": " "}).skip_expired_by is None
    assert SourceOptions.parse({"path": "/t", "skipExpiredBy": "store_timestamp"}).skip_expired_by == "store_timestamp"
    for column in ("born_timestamp", "at", "Store_Timestamp", "store_timestamp,delivered_at"):
        with pytest.raises(ConfigError, match=r"INVALID_OPTION.*skipExpiredBy"):
            SourceOptions.parse({"path": "/t", "skipExpiredBy": column})
