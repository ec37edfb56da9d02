"""Comparing a table's Arrow schema with the data written to or read from it."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from retry_engine.errors import DeltaSourceError, SchemaMismatchError


def normalize_type(t: pa.DataType) -> pa.DataType:
    """``t`` without nested nullability, with large/view string and binary made plain.

    Delta has one string and one binary type; Arrow has three of each.
    """
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, normalize_type(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(normalize_type(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(normalize_type(t.key_type), normalize_type(t.item_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def check_write_schema(uri: str, table: pa.Schema, data: pa.Schema) -> None:
    """Raise :class:`SchemaMismatchError` unless ``data`` has exactly the table's columns and types.

    Names are matched exactly; order does not matter. Nullability is not
    compared here: a nullable column written into a NOT NULL one is checked
    on the data (rows with nulls fail the write), as Delta does.
    """
    have = {f.name: f for f in table}
    for f in data:
        if f.name not in have:
            raise SchemaMismatchError(
                f"{uri}: the data has column {f.name!r} ({f.type}) that the table does not have; "
                f"table columns: {table.names}",
                code="COLUMN_NOT_IN_TABLE",
            )
        want = have[f.name].type
        if normalize_type(want) != normalize_type(f.type):
            raise SchemaMismatchError(
                f"{uri}: column {f.name!r} is {want} in the table but {f.type} in the data",
                code="COLUMN_TYPE_MISMATCH",
            )
    missing = [n for n in table.names if n not in data.names]
    if missing:
        raise SchemaMismatchError(
            f"{uri}: the data lacks column {missing[0]!r} ({have[missing[0]].type}) of the table; "
            f"data columns: {data.names}",
            code="COLUMN_MISSING_IN_DATA",
        )


def check_partition_columns(uri: str, table: Iterable[str], wanted: Iterable[str]) -> None:
    table_cols, wanted_cols = list(table), list(wanted)
    if wanted_cols and wanted_cols != table_cols:
        raise SchemaMismatchError(
            f"{uri}: the table is partitioned by {table_cols} but the write asks for {wanted_cols}",
            code="PARTITION_COLUMNS_MISMATCH",
        )


def check_stream_schema(uri: str, version: int, schema_string: str, stream: pa.Schema, skip: Iterable[str]) -> None:
    """Fail a stream whose table changed the type of, or dropped, a column it reads.

    ``schema_string`` is the ``metaData.schemaString`` of commit ``version``.
    Added columns are fine: they are read as absent until the query restarts
    (a restart infers the new schema). Like Delta, a non-additive change
    needs a restart from a new checkpoint.
    """
    from deltalake import Schema

    new = pa.schema(Schema.from_json(schema_string).to_arrow())
    skipped = set(skip)
    for f in stream:
        if f.name in skipped:
            continue
        if f.name not in new.names:
            raise DeltaSourceError(
                f"commit {version} of {uri} drops column {f.name!r} that the stream reads; "
                "restart the query from a new checkpoint to read the new schema (the retry engine then resumes "
                "after the lake's last batch; do not pick a startingVersion by hand, it can skip or repeat rows)",
                code="DELTA_SCHEMA_CHANGED",
            )
        now = new.field(f.name).type
        if normalize_type(now) != normalize_type(f.type):
            raise DeltaSourceError(
                f"commit {version} of {uri} changes column {f.name!r} from {f.type} to {now}; "
                "restart the query from a new checkpoint to read the new schema (the retry engine then resumes "
                "after the lake's last batch; do not pick a startingVersion by hand, it can skip or repeat rows)",
                code="DELTA_SCHEMA_CHANGED",
            )

