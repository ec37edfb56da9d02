"""Plain-Python helpers over Delta tables (no Spark): create, check, read, append."""

from __future__ import annotations

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction

from retry_engine.errors import SchemaMismatchError


def _strip_nullability(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _strip_nullability(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_strip_nullability(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(_strip_nullability(t.key_type), _strip_nullability(t.item_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def open_table(path: str) -> DeltaTable | None:
    try:
        return DeltaTable(path)
    except TableNotFoundError:
        return None


def table_version(path: str) -> int | None:
    table = open_table(path)
    return None if table is None else table.version()


def check_schema(path: str, existing: pa.Schema, wanted: pa.Schema) -> None:
    """Raise :class:`SchemaMismatchError` naming the first column that differs."""
    have = {f.name: f for f in existing}
    want = {f.name: f for f in wanted}
    for name, f in want.items():
        if name not in have:
            raise SchemaMismatchError(f"{path}: the table has no column {name!r} ({f.type})", code="COLUMN_NOT_IN_TABLE")
        if _strip_nullability(have[name].type) != _strip_nullability(f.type):
            raise SchemaMismatchError(
                f"{path}: column {name!r} is {have[name].type} in the table but {f.type} in the data",
                code="COLUMN_TYPE_MISMATCH",
            )
    extra = [n for n in have if n not in want]
    if extra:
        raise SchemaMismatchError(f"{path}: the data has no column {extra[0]!r} of the table", code="COLUMN_MISSING_IN_DATA")


def ensure_table(path: str, schema: pa.Schema, *, partition_by: list[str] | tuple[str, ...] = ()) -> DeltaTable:
    """Create the table if missing; else check ``schema`` fits it."""
    table = open_table(path)
    if table is None:
        return DeltaTable.create(path, schema, mode="ignore", partition_by=list(partition_by) or None)
    check_schema(path, pa.schema(table.schema().to_arrow()), schema)
    return table


def read_table(path: str, *, version: int | None = None) -> pa.Table:
    return pa.table(DeltaTable(path, version=version).to_pyarrow_table())


def append_arrow(path: str, data: pa.Table, *, app_id: str | None = None, txn_version: int | None = None) -> bool:
    """Append ``data``; with (app_id, txn_version) skip if that transaction is already in the table."""
    properties = None
    if app_id is not None and txn_version is not None:
        table = open_table(path)
        done = table.transaction_version(app_id) if table is not None else None
        if done is not None and done >= txn_version:
            return False
        properties = CommitProperties(app_transactions=[Transaction(app_id, txn_version)])
    write_deltalake(path, data, mode="append", commit_properties=properties)
    return True
