"""Comparing a table's Arrow schema with the data written to or read from it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class SchemaDrift:
    """One way a table read by the engine differs from the schema the engine expects."""

    column: str
    table_type: pa.DataType | None
    """None: the table lacks the column."""
    expected_type: pa.DataType | None
    """None: the engine does not know the column."""
    effect: str
    """What the reader does about it."""

    def describe(self) -> str:
        table = "no such column" if self.table_type is None else str(self.table_type)
        expected = "no such column" if self.expected_type is None else str(self.expected_type)
        return f"column {self.column!r} (table: {table}; expected: {expected}): {self.effect}"


def _always_fits(have: pa.DataType, want: pa.DataType) -> bool:
    """Every value of ``have`` casts to ``want`` without loss (widening integers or floats)."""
    if pa.types.is_integer(have) and pa.types.is_integer(want):
        if pa.types.is_signed_integer(have) == pa.types.is_signed_integer(want):
            return bool(want.bit_width >= have.bit_width)
        return bool(pa.types.is_unsigned_integer(have) and want.bit_width > have.bit_width)
    if pa.types.is_floating(have) and pa.types.is_floating(want):
        return bool(want.bit_width >= have.bit_width)
    if pa.types.is_integer(have) and pa.types.is_floating(want):
        return bool(have.bit_width < {16: 11, 32: 24, 64: 53}[want.bit_width])
    return False


def _castable(have: pa.DataType, want: pa.DataType) -> bool:
    """Arrow has a cast from ``have`` to ``want`` (values may still fail one by one)."""
    try:
        pa.nulls(1, have).cast(want)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    return True


def schema_drift(table: pa.Schema, expected: pa.Schema, *, ignore: Iterable[str] = ()) -> list[SchemaDrift]:
    """How ``table`` differs from ``expected``, column by column, with what a tolerant reader does.

    Pure and Spark-free. The effects describe the engine's decide step, which
    reads by name: extra columns are ignored, missing ones are null, other
    types are cast value by value and a value that does not fit quarantines
    its row (``WRONG_TYPE``). Nullability and string/binary flavours are not drift.
    """
    skipped = set(ignore)
    drifts: list[SchemaDrift] = []
    for f in expected:
        if f.name in skipped:
            continue
        if f.name not in table.names:
            drifts.append(SchemaDrift(f.name, None, f.type, "read as null in every row"))
            continue
        have = table.field(f.name).type
        if normalize_type(have) == normalize_type(f.type):
            continue
        if _always_fits(have, f.type):
            effect = "cast; every value fits"
        elif _castable(have, f.type):
            effect = "cast value by value; a row whose value does not fit is quarantined (WRONG_TYPE)"
        else:
            effect = "no cast exists; a row with a non-null value is quarantined (WRONG_TYPE)"
        drifts.append(SchemaDrift(f.name, have, f.type, effect))
    for f in table:
        if f.name not in expected.names and f.name not in skipped:
            drifts.append(SchemaDrift(f.name, f.type, None, "ignored (kept only in quarantined rows' raw JSON)"))
    return drifts


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

