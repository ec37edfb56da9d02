"""Tables another Delta writer made with features the engine's own files cannot keep (a review, session 20).

The engine writes Parquet files itself (Spark's ``deltars`` sink, the batch outputs, the start-up layout
migration, row expiry) and commits them through delta-rs, which checks a table's row rules only inside
``write_deltalake``. So a CHECK constraint, an invariant or a generated column was not kept, a
column-mapped table got files it reads as nulls, a deletion vector was dropped by a rewrite, and
delta-rs's refusal of a table it cannot write was retried as a conflict. Each table is made as Spark
writes it (the log by hand, real Parquet files) and read back through delta-rs's SQL, which applies
deletion vectors and column mapping.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from pyspark.sql.types import LongType, StringType, StructField, StructType

from retry_engine.config import parse_config
from retry_engine.core.outputs import BatchWriter
from retry_engine.delta._log import snapshot_files
from retry_engine.delta.layout import migrate_partition_folders
from retry_engine.delta.sink import DeltaBatchWriter
from retry_engine.delta.tables import (
    append_arrow,
    check_writable,
    commit_next,
    pyarrow_dataset,
    read_columns,
    read_table,
)
from retry_engine.errors import DeltaSinkError, DeltaSourceError
from retry_engine.ops.maintenance import expire_rows
from retry_engine.schemas import OUTCOMES
from tests.unit.test_windowed_compaction_tables import (
    AT,
    STRING,
    TIME,
    add,
    commit,
    deletion_vector,
    ids,
    rows,
    table,
)

LONG = {"type": "long", "nullable": True, "metadata": {}}
DV_PROTOCOL = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
               "writerFeatures": ["deletionVectors"]}


def mapped(fields: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``fields`` with column mapping's metadata: physical names ``col-<name>``."""
    return {name: {**field, "metadata": {"delta.columnMapping.id": i, "delta.columnMapping.physicalName": f"col-{name}"}}
            for i, (name, field) in enumerate(fields.items(), start=1)}


def misplaced_table(path: str, *, dv: bool = False, column_mapping: bool = False) -> None:
    """A table partitioned by topic whose files are not in Hive folders (delta-spark's random prefixes),
    one of them with a deletion vector (``dv``) or its columns mapped (``column_mapping``)."""
    fields = {"topic": STRING, "id": STRING, "ts": TIME}
    if column_mapping:
        table(path, mapped(fields), protocol={"minReaderVersion": 2, "minWriterVersion": 5}, partition_by=("topic",),
              configuration={"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "3"})
    else:
        table(path, fields, partition_by=("topic",), protocol=DV_PROTOCOL if dv else None,
              configuration={"delta.enableDeletionVectors": "true"} if dv else None)
    for v in (1, 2):
        data = ids(f"m{v}", AT, 2)
        if column_mapping:
            data = data.rename_columns(["col-id", "col-ts"])
        first = add(path, v, f"Xy{v}/part-{v}.parquet", data, AT, partition_values={"col-topic" if column_mapping else "topic": "t"},
                    time_column="col-ts" if column_mapping else "ts")
    if dv:
        commit(path, 3, [{"remove": {"path": first["path"], "dataChange": True, "deletionTimestamp": 3,
                                     "size": first["size"], "partitionValues": first["partitionValues"]}},
                         {"add": {**first, "deletionVector": deletion_vector([1])}}])


@pytest.mark.parametrize("kind", ["dv", "column_mapping"])
def test_the_layout_migration_leaves_another_writers_files_where_they_are(tmp_path: Path, kind: str) -> None:
    """A messages table with deletion vectors got a full copy of the file beside it (a deleted row back,
    live rows twice); a column-mapped one a file of nulls and a table no reader opened again."""
    path = str(tmp_path / kind)
    misplaced_table(path, dv=kind == "dv", column_mapping=kind == "column_mapping")
    before, version = rows(path), DeltaTable(path).version()
    assert len(before) == (3 if kind == "dv" else 4)
    report = migrate_partition_folders(path)
    assert (report.files_moved, report.version) == (0, None)
    assert rows(path) == before and DeltaTable(path).version() == version


def test_the_layout_migration_still_moves_files_of_a_plain_table(tmp_path: Path) -> None:
    """The same files in a table without those features move (what the migration is for)."""
    path = str(tmp_path / "plain")
    misplaced_table(path)
    before = rows(path)
    assert migrate_partition_folders(path).files_moved == 2
    assert rows(path) == before


def _sink(path: str) -> DeltaBatchWriter:
    schema = StructType([StructField("id", LongType()), StructField("v", StringType())])
    return DeltaBatchWriter({"path": path}, schema, False)


ROW_RULES = {
    "check": ({"configuration": {"delta.constraints.small": "id < 10"}}, {}, "CHECK constraints (small)"),
    "invariant": ({}, {"id": {"delta.invariants": json.dumps({"expression": {"expression": "id < 10"}})}},
                  "an invariant (id)"),
    "generated": ({}, {"v": {"delta.generationExpression": "CAST(id AS STRING)"}}, "a generated column (v)"),
    "column_mapping": ({"configuration": {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "2"},
                        "protocol": {"minReaderVersion": 2, "minWriterVersion": 5}}, "mapped", "column mapping ('name')"),
}


@pytest.mark.parametrize("rule", sorted(ROW_RULES))
def test_the_sink_refuses_a_table_whose_rules_its_files_would_break(tmp_path: Path, rule: str) -> None:
    """The sink committed a row ``id = 42`` into a table with ``CHECK (id < 10)`` (and the same for an
    invariant and a generated column), and files with logical names into a column-mapped table: it now
    refuses when the write is set up, before any file, naming the rule."""
    made, metadata, named = ROW_RULES[rule]
    path = str(tmp_path / rule)
    fields = {"id": LONG, "v": STRING}
    fields = mapped(fields) if metadata == "mapped" else {n: {**f, "metadata": metadata.get(n, {})} for n, f in fields.items()}
    table(path, fields, **made)
    with pytest.raises(DeltaSinkError, match=rf"DELTA_UNSUPPORTED_WRITER_FEATURE.*{named.replace('(', '.').replace(')', '.')}"):
        _sink(path)
    assert DeltaTable(path).version() == 0 and not list((tmp_path / rule).glob("*.parquet"))


def test_a_plain_table_and_a_nested_rule_are_told_apart(tmp_path: Path) -> None:
    path = str(tmp_path / "plain")
    table(path, {"id": LONG, "v": STRING})
    _sink(path)  # no rule: set up
    nested = str(tmp_path / "nested")
    inner = {"type": "struct", "fields": [{"name": "n", "type": "long", "nullable": True,
                                           "metadata": {"delta.generationExpression": "1"}}]}
    table(nested, {"s": {"type": inner, "nullable": True, "metadata": {}}})
    with pytest.raises(DeltaSinkError, match=r"a generated column \(n\)"):
        check_writable(nested, DeltaTable(nested))


def test_the_engine_refuses_an_output_table_with_a_check_constraint_at_start(tmp_path: Path) -> None:
    """An operator's ``CHECK (reason <> 'kaboom')`` on an engine table: the engine wrote rows
    breaking it; it now stops at start, naming it (a batch writer is made before the query starts)."""
    lake = tmp_path / "lake"
    write_deltalake(str(lake / "outcomes"), OUTCOMES.arrow_schema.empty_table())
    DeltaTable(str(lake / "outcomes")).alter.add_constraint({"no_kaboom": "reason <> 'kaboom'"})
    config = parse_config({"engine": {"lake": str(lake)}})
    with pytest.raises(DeltaSinkError, match=r"DELTA_UNSUPPORTED_WRITER_FEATURE.*outcomes has CHECK constraints \(no_kaboom\)"):
        BatchWriter(config, "app")


def test_a_table_delta_rs_cannot_write_is_not_retried_as_a_conflict(tmp_path: Path) -> None:
    """rowTracking / identity columns / an unknown writer feature: delta-rs refuses every commit, which
    was taken for a conflict (append_arrow tried 10 times and said TABLE_MOVED; the engine restarted on
    DELTA_COMMIT_FAILED for 25 minutes); a remove in an append-only table (row expiry) alike."""
    path = str(tmp_path / "future")
    table(path, {"id": LONG}, protocol={"minReaderVersion": 1, "minWriterVersion": 7,
                                        "writerFeatures": ["someFutureWriterFeature"]})
    with pytest.raises(DeltaSinkError, match=r"DELTA_UNSUPPORTED_WRITER_FEATURE.*someFutureWriterFeature"):
        append_arrow(path, pa.table({"id": pa.array([1], pa.int64())}))
    appending = str(tmp_path / "append_only")
    write_deltalake(appending, pa.table({"id": [1]}), configuration={"delta.appendOnly": "true"})
    delta = DeltaTable(appending)
    with pytest.raises(DeltaSinkError, match=r"DELTA_UNSUPPORTED_WRITER_FEATURE.*append-only") as info:
        commit_next(delta, snapshot_files(delta, delta.version()), data_change=True, operation="probe")
    assert not isinstance(info.value, CommitFailedError)
    assert DeltaTable(appending).version() == 0


def test_row_expiry_leaves_a_table_with_deletion_vectors_alone(tmp_path: Path) -> None:
    """Its removes named no file with a vector: nothing was removed, yet expiry reported rows gone and
    recorded its cut."""
    path = str(tmp_path / "dv")
    table(path, {"id": STRING, "ts": TIME}, protocol=DV_PROTOCOL, configuration={"delta.enableDeletionVectors": "true"})
    first = add(path, 1, "part-1.parquet", ids("a", AT, 2), AT)
    commit(path, 2, [{"remove": {"path": first["path"], "dataChange": True, "deletionTimestamp": 2,
                                 "size": first["size"], "partitionValues": {}}},
                     {"add": {**first, "deletionVector": deletion_vector([1])}}])
    before = rows(path)
    with pytest.raises(DeltaSourceError, match=r"DELTA_UNSUPPORTED_FEATURE.*row expiry leaves .*deletionVectors"):
        expire_rows(path, "ts", AT + dt.timedelta(days=1))
    assert rows(path) == before and DeltaTable(path).version() == 2


def test_a_column_mapped_table_is_refused_by_every_plain_read(tmp_path: Path) -> None:
    """``dlq list`` read a column-mapped DLQ (reader version 2) as nulls and blamed another writer's
    nulls; ``dlq show`` said the message was in no table. Every read helper now names the feature."""
    path = str(tmp_path / "cm")
    table(path, mapped({"id": STRING, "ts": TIME}), protocol={"minReaderVersion": 2, "minWriterVersion": 5},
          configuration={"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "2"})
    add(path, 1, "part-1.parquet", ids("m", AT, 1).rename_columns(["col-id", "col-ts"]), AT, time_column="col-ts")
    assert [r["id"] for r in rows(path)] == ["m0"]
    schema = pa.schema([("id", pa.string()), ("ts", pa.timestamp("us", "UTC"))])
    for read in (
        lambda: read_table(path),
        lambda: read_columns(DeltaTable(path), schema, ["id"]),
        lambda: pyarrow_dataset(DeltaTable(path)),
    ):
        with pytest.raises(DeltaSourceError, match=r"DELTA_UNSUPPORTED_FEATURE.*columnMapping"):
            read()
