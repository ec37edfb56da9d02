"""Upgrading a lake: the engine's own tables gain the nullable columns a later release added (#13 part 2).

No Spark: real Delta tables written with an older schema, then ensured with
the release's schema as the engine does at start.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from retry_engine.delta import storage, tables
from retry_engine.delta.tables import append_arrow, ensure_table
from retry_engine.errors import SchemaMismatchError

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
    assert table.version() == 1 and pa.schema(table.schema().to_arrow()).names == NEW.names
