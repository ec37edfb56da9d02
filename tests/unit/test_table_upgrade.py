"""Upgrading a lake: the engine's own tables gain the nullable columns a later release added (#13 part 2)
and the table properties it sets (#14 part 4: a log checkpoint every 10 commits, every 100 on the tables
each micro-batch writes).

No Spark: real Delta tables written with an older schema, then ensured with
the release's schema as the engine does at start.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from retry_engine.delta import storage, tables
from retry_engine.delta.tables import append_arrow, ensure_table, writers_clean_log
from retry_engine.errors import ConcurrentWriteError, SchemaMismatchError

OLD = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("note", pa.string())])
NEW = pa.schema([*OLD, pa.field("reason", pa.string()), pa.field("count", pa.int64())])


def old_table(tmp_path: Path) -> str:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2], "note": ["a", None]}, schema=OLD))
    return path


def test_nullable_columns_of_the_release_are_added_and_old_rows_read_them_as_null(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = old_table(tmp_path)
    with caplog.at_level(logging.INFO, logger="retry_engine.delta.tables"):
        ensure_table(path, NEW, add_missing=True)
    added = [r.getMessage() for r in caplog.records if "added column" in r.getMessage()]
    assert (
        len(added) == 2
        and "'reason' (string, nullable)" in added[0]
        and "'count' (int64" in added[1]
    )
    append_arrow(
        path, pa.table({"id": [3], "note": ["c"], "reason": ["stopped"], "count": [7]}, schema=NEW)
    )
    rows = DeltaTable(path).to_pyarrow_table().sort_by("id").to_pylist()
    assert [(r["id"], r["reason"], r["count"]) for r in rows] == [
        (1, None, None),
        (2, None, None),
        (3, "stopped", 7),
    ]
    # Ensured again: nothing left to add, no new commit.
    version = DeltaTable(path).version()
    ensure_table(path, NEW, add_missing=True)
    assert DeltaTable(path).version() == version


def test_without_add_missing_a_missing_column_still_raises(tmp_path: Path) -> None:
    """Tables others write (a deltars sink's target) are never changed behind their writer's back."""
    path = old_table(tmp_path)
    with pytest.raises(SchemaMismatchError, match=r"COLUMN_NOT_IN_TABLE.*'reason'"):
        ensure_table(path, NEW)
    assert "reason" not in pa.schema(DeltaTable(path).schema().to_arrow()).names


def test_a_missing_not_null_column_raises_naming_it_and_changes_nothing(tmp_path: Path) -> None:
    path = old_table(tmp_path)
    strict = pa.schema([*NEW, pa.field("epoch", pa.int64(), nullable=False)])
    with pytest.raises(
        SchemaMismatchError,
        match=r"COLUMN_MISSING_IN_TABLE.*lacks column 'epoch' \(int64, NOT NULL\).*cannot be added to a table whose rows",
    ):
        ensure_table(path, strict, add_missing=True)
    assert DeltaTable(path).version() == 0


@pytest.mark.parametrize(
    "schema, match",
    [
        # Another type of an existing column is not additive.
        (
            pa.schema(
                [
                    pa.field("id", pa.int64()),
                    pa.field("note", pa.int32()),
                    pa.field("reason", pa.string()),
                ]
            ),
            r"COLUMN_TYPE_MISMATCH.*'note' is string in the table but int32",
        ),
        # A column the table has and the release does not: not ours to drop.
        (
            pa.schema([pa.field("id", pa.int64()), pa.field("reason", pa.string())]),
            r"COLUMN_MISSING_IN_DATA.*'note'",
        ),
    ],
)
def test_type_changes_and_extra_columns_still_raise_and_change_nothing(
    tmp_path: Path, schema: pa.Schema, match: str
) -> None:
    path = old_table(tmp_path)
    with pytest.raises(SchemaMismatchError, match=match):
        ensure_table(path, schema, add_missing=True)
    assert DeltaTable(path).version() == 0


def test_a_concurrent_adder_wins_and_the_loser_reloads_and_finds_the_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two engines (or an engine and a tool) upgrading one table: the second commit conflicts, re-reads, is done."""
    path = old_table(tmp_path)
    real = storage.add_columns
    calls: list[int] = []

    def racing(uri: str, fields: list[pa.Field], *, version: int) -> None:
        calls.append(version)
        if len(calls) == 1:
            real(
                uri, fields, version=version
            )  # the other writer commits first, from the same snapshot
        real(uri, fields, version=version)

    monkeypatch.setattr(tables, "add_columns", racing)
    with caplog.at_level(logging.INFO, logger="retry_engine.delta.tables"):
        table = ensure_table(path, NEW, add_missing=True)
    assert calls == [0] and "conflicted with another commit (attempt 1)" in caplog.text
    assert "added column" not in caplog.text  # the other writer added them
    # Version 1: the other writer's columns; version 2: this release's table properties.
    assert table.version() == 2 and pa.schema(table.schema().to_arrow()).names == NEW.names


# ---------------------------------------------------------------------------- table properties

INTERVAL = "delta.checkpointInterval"
CLEANUP = "delta.enableExpiredLogCleanup"
MARK = storage.ENGINE_INTERVAL
LOG = storage.LOG_RETENTION
THREE_DAYS = "interval 3 days"


def configuration(path: str) -> dict[str, str]:
    return dict(DeltaTable(path).metadata().configuration)


def log_checkpoints(path: str) -> list[int]:
    return sorted(int(n.split(".")[0]) for n in os.listdir(Path(path) / "_delta_log") if ".checkpoint." in n)


def test_an_engine_table_is_checkpointed_every_10_commits_and_its_writers_leave_the_log_to_maintenance(
    tmp_path: Path,
) -> None:
    """#14 part 4: readers replay at most 10 commits (delta-rs's own default is 100); a writer's checkpoint
    does not list the whole log for expired files (maintenance does, hourly)."""
    path = str(tmp_path / "t")
    ensure_table(path, NEW, add_missing=True)
    assert configuration(path) == {INTERVAL: "10", CLEANUP: "false", MARK: "10"}
    assert dict(storage.TABLE_PROPERTIES) == {INTERVAL: "10", CLEANUP: "false"}
    assert not writers_clean_log(DeltaTable(path))
    for i in range(12):
        append_arrow(path, pa.table({"id": [i], "note": [None], "reason": [None], "count": [i]}, schema=NEW))
    assert log_checkpoints(path) == [9]
    # A table others write (created without add_missing) keeps delta-rs's defaults.
    other = str(tmp_path / "u")
    ensure_table(other, NEW)
    assert configuration(other) == {} and writers_clean_log(DeltaTable(other))


def test_an_old_table_gains_the_properties_once_and_only_with_add_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = old_table(tmp_path)
    ensure_table(path, OLD)
    assert INTERVAL not in configuration(path) and DeltaTable(path).version() == 0
    with caplog.at_level(logging.INFO, logger="retry_engine.delta.tables"):
        ensure_table(path, OLD, add_missing=True)
    assert configuration(path) == {INTERVAL: "10", CLEANUP: "false", MARK: "10"} and DeltaTable(path).version() == 1
    assert (
        "set table properties {'delta.checkpointInterval': '10', 'delta.enableExpiredLogCleanup': 'false', "
        "'retryEngine.checkpointInterval': '10'}" in caplog.text
    )
    ensure_table(path, OLD, add_missing=True)
    assert DeltaTable(path).version() == 1
    # The rows are untouched by the metadata commit.
    assert DeltaTable(path).to_pyarrow_table().num_rows == 2


@pytest.mark.parametrize("value", ["100", "abc", "-1", ""])
def test_a_property_an_operator_set_is_kept_whatever_its_value(tmp_path: Path, value: str) -> None:
    path = str(tmp_path / "t")
    DeltaTable.create(path, OLD, configuration={INTERVAL: value, CLEANUP: value})
    ensure_table(path, OLD, add_missing=True)
    # Only the mark of the interval the engine would set is added (one commit).
    assert configuration(path) == {INTERVAL: value, CLEANUP: value, MARK: "10"} and DeltaTable(path).version() == 1
    # And the table still takes the engine's appends.
    assert append_arrow(path, pa.table({"id": [1], "note": ["x"]}, schema=OLD), app_id="q", txn_version=0)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 1


def test_a_table_each_batch_writes_is_checkpointed_every_100_commits(tmp_path: Path) -> None:
    """A checkpoint of retry, dlq, outcomes, metrics or progress carries a week of removes (one a batch: run BC,
    52 MB and 1.8 s to write at a 1 s trigger): written every 100 commits there, every 10 elsewhere."""
    path = str(tmp_path / "t")
    ensure_table(path, OLD, add_missing=True, properties=storage.BATCH_TABLE_PROPERTIES)
    assert configuration(path) == {INTERVAL: "100", CLEANUP: "false", MARK: "100", LOG: THREE_DAYS}
    for i in range(100):
        write_deltalake(path, pa.table({"id": [i], "note": [None]}, schema=OLD), mode="append")
    assert log_checkpoints(path) == [99]
    ensure_table(path, OLD, add_missing=True, properties=storage.BATCH_TABLE_PROPERTIES)
    assert DeltaTable(path).version() == 101  # nothing left to set


def test_the_interval_the_engine_set_follows_a_new_default_and_an_operators_stays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An earlier release's 10 (unmarked) on a table each batch writes becomes 100 once; an operator's
    interval, set before or after, whatever its value, is kept, by this release and the next."""
    earlier = {INTERVAL: "10", CLEANUP: "false"}
    engines = str(tmp_path / "engines")
    DeltaTable.create(engines, OLD, configuration=earlier)
    with caplog.at_level(logging.INFO, logger="retry_engine.delta.tables"):
        ensure_table(engines, OLD, add_missing=True, properties=storage.BATCH_TABLE_PROPERTIES)
    assert configuration(engines) == {INTERVAL: "100", CLEANUP: "false", MARK: "100", LOG: THREE_DAYS}
    assert DeltaTable(engines).version() == 1 and "'delta.checkpointInterval': '100'" in caplog.text
    operators = str(tmp_path / "operators")
    DeltaTable.create(operators, OLD, configuration={**earlier, INTERVAL: "50"})
    ensure_table(operators, OLD, add_missing=True, properties=storage.BATCH_TABLE_PROPERTIES)
    assert configuration(operators) == {INTERVAL: "50", CLEANUP: "false", MARK: "100", LOG: THREE_DAYS}
    # An operator sets 10 after the upgrade: it is not the engine's 100, so it stays.
    DeltaTable(engines).alter.set_table_properties({INTERVAL: "10"})
    ensure_table(engines, OLD, add_missing=True, properties=storage.BATCH_TABLE_PROPERTIES)
    assert configuration(engines)[INTERVAL] == "10" and DeltaTable(engines).version() == 2
    # A later release's default moves only the interval the engine set.
    later = {**storage.BATCH_TABLE_PROPERTIES, INTERVAL: "200"}
    mine = str(tmp_path / "mine")
    ensure_table(mine, OLD, add_missing=True, properties=storage.BATCH_TABLE_PROPERTIES)
    for path in (engines, operators, mine):
        ensure_table(path, OLD, add_missing=True, properties=later)
    assert [configuration(p)[INTERVAL] for p in (engines, operators, mine)] == ["10", "50", "200"]
    assert {configuration(p)[MARK] for p in (engines, operators, mine)} == {"200"}


def test_a_table_each_batch_writes_keeps_three_days_of_log_unless_an_operator_chose(tmp_path: Path) -> None:
    """Every commit lists the whole log on a local disk (delta-rs): 30 days of one commit a batch made each
    batch seconds slower after a month (a review, session 20). An earlier release's table gains 3 days
    (RocketMQ's 72 hours); a retention an operator set stays."""
    earlier, operators = str(tmp_path / "earlier"), str(tmp_path / "operators")
    DeltaTable.create(earlier, OLD, configuration={INTERVAL: "10", CLEANUP: "false"})
    DeltaTable.create(operators, OLD, configuration={INTERVAL: "10", CLEANUP: "false", LOG: "interval 30 days"})
    for path in (earlier, operators):
        ensure_table(path, OLD, add_missing=True, properties=storage.BATCH_TABLE_PROPERTIES)
    assert configuration(earlier)[LOG] == THREE_DAYS and configuration(operators)[LOG] == "interval 30 days"


@pytest.mark.parametrize("mark", ["abc", "", "-1", "1e9", "100 ", "\x00", "9" * 400])
def test_a_hostile_interval_mark_can_only_keep_the_interval(tmp_path: Path, mark: str) -> None:
    """The mark is a table property anyone can write: whatever it holds, an interval it does not equal is kept,
    and the table keeps taking the engine's appends."""
    path = str(tmp_path / "t")
    DeltaTable.create(path, OLD, configuration={INTERVAL: "10", CLEANUP: "false"})
    DeltaTable(path).alter.set_table_properties({MARK: mark}, raise_if_not_exists=False)
    ensure_table(path, OLD, add_missing=True, properties=storage.BATCH_TABLE_PROPERTIES)
    assert configuration(path) == {INTERVAL: "10", CLEANUP: "false", MARK: "100", LOG: THREE_DAYS}
    assert append_arrow(path, pa.table({"id": [1], "note": ["x"]}, schema=OLD), app_id="q", txn_version=0)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 1


def test_a_table_that_fails_the_checks_gets_no_properties(tmp_path: Path) -> None:
    path = old_table(tmp_path)
    with pytest.raises(SchemaMismatchError, match="PARTITION"):
        ensure_table(path, OLD, partition_by=["note"], add_missing=True)
    assert INTERVAL not in configuration(path) and DeltaTable(path).version() == 0


def test_a_concurrent_append_is_not_a_conflict_and_keeps_its_rows(tmp_path: Path) -> None:
    path = old_table(tmp_path)
    stale = DeltaTable(path)
    append_arrow(path, pa.table({"id": [9], "note": ["other"]}, schema=OLD))
    table = tables.add_missing_properties(path, stale)
    assert table.version() == 2 and configuration(path)[INTERVAL] == "10"
    assert DeltaTable(path).to_pyarrow_table().num_rows == 3


def test_a_concurrent_property_setter_wins_and_the_loser_finds_them_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Two engines (or an engine and `maintain`) upgrading one table: the second commit conflicts, re-reads, is done."""
    path = old_table(tmp_path)
    real = storage.set_properties
    calls: list[int] = []

    def racing(uri: str, properties: dict[str, str], *, version: int) -> None:
        calls.append(version)
        if len(calls) == 1:
            real(uri, properties, version=version)  # the other writer commits first, from the same snapshot
        real(uri, properties, version=version)

    monkeypatch.setattr(tables, "set_properties", racing)
    with caplog.at_level(logging.INFO, logger="retry_engine.delta.tables"):
        table = tables.add_missing_properties(path)
    assert calls == [0] and "setting table properties conflicted with another commit (attempt 1)" in caplog.text
    assert "set table properties" not in caplog.text  # the other writer set them
    assert table.version() == 1 and configuration(path)[INTERVAL] == "10"


def test_properties_that_keep_conflicting_raise_a_concurrent_write_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = old_table(tmp_path)

    def always_late(uri: str, properties: dict[str, str], *, version: int) -> None:
        # Another tool changes the table's metadata first, every time.
        storage.set_properties(uri, {"delta.logRetentionDuration": f"interval {version + 1} days"}, version=version)
        storage.set_properties(uri, properties, version=version)

    monkeypatch.setattr(tables, "set_properties", always_late)
    with pytest.raises(ConcurrentWriteError, match="setting table properties conflicted 10 times in a row"):
        tables.add_missing_properties(path)
    assert INTERVAL not in configuration(path)
