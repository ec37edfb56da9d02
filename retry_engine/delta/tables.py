"""Plain-Python helpers over Delta tables (no Spark): create, check, read, append."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction

from retry_engine.delta._schema import (
    SchemaDrift,
    check_partition_columns,
    check_write_schema,
    schema_drift,
)
from retry_engine.errors import ConfigError

log = logging.getLogger(__name__)


def open_table(path: str) -> DeltaTable | None:
    """The table at ``path``, or None if there is none."""
    try:
        return DeltaTable(path)
    except TableNotFoundError:
        return None


def table_version(path: str) -> int | None:
    """The latest version of the table at ``path``, or None if there is no table."""
    table = open_table(path)
    return None if table is None else table.version()


def table_arrow_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def not_null_columns(table: DeltaTable) -> tuple[str, ...]:
    """Columns the table declares NOT NULL (writers check them before writing a file)."""
    return tuple(f.name for f in table_arrow_schema(table) if not f.nullable)


def ensure_table(path: str, arrow_schema: pa.Schema, *, partition_by: Sequence[str] = ()) -> DeltaTable:
    """Create the table at ``path`` if missing; else check ``arrow_schema`` fits it.

    Raises :class:`~retry_engine.errors.SchemaMismatchError` naming the first
    column that is missing, extra or of another type (nullability is not
    compared), or when ``partition_by`` is given and differs from the table's.
    Idempotent: concurrent creators end with one table.
    """
    table = open_table(path)
    if table is None:
        missing = [c for c in partition_by if c not in arrow_schema.names]
        if missing:
            raise ConfigError(
                f"partition column {missing[0]!r} is not a column of the data {arrow_schema.names}",
                code="INVALID_OPTION",
            )
        table = DeltaTable.create(path, arrow_schema, mode="ignore", partition_by=list(partition_by) or None)
        log.info("created Delta table %s partitioned by %s", path, list(partition_by))
    check_write_schema(path, table_arrow_schema(table), arrow_schema)
    check_partition_columns(path, table.metadata().partition_columns, partition_by)
    return table


def ensure_readable_table(
    path: str, arrow_schema: pa.Schema, *, ignore: Sequence[str] = ()
) -> tuple[DeltaTable, list[SchemaDrift]]:
    """Create the table at ``path`` if missing; else tolerate drift from ``arrow_schema`` and log it.

    For tables the engine reads but others write (consume_results): extra
    columns, missing columns and other types do not stop the reader, whose
    consumer casts value by value (see :func:`~retry_engine.delta._schema.schema_drift`).
    Returns the table and its drift (see :func:`report_drift`); whether the
    columns the reader *needs* are there is the caller's check.
    """
    table = open_table(path)
    if table is None:
        return ensure_table(path, arrow_schema), []
    return table, report_drift(path, table_arrow_schema(table), arrow_schema, ignore=ignore)


def report_drift(
    path: str, table_schema: pa.Schema, arrow_schema: pa.Schema, *, ignore: Sequence[str] = ()
) -> list[SchemaDrift]:
    """Log one warning per way ``table_schema`` drifts from ``arrow_schema`` and return them.

    Each line names the column, the table's type, the expected type and what
    the reader does about it; ``ignore`` names columns not to compare.
    """
    drifts = schema_drift(table_schema, arrow_schema, ignore=ignore)
    for drift in drifts:
        log.warning("%s drifts from the schema the engine expects; tolerated: %s", path, drift.describe())
    return drifts


def read_table(path: str, *, version: int | None = None) -> pa.Table:
    """The whole table at ``path`` (at ``version`` if given) as one Arrow table."""
    return pa.table(DeltaTable(path, version=version).to_pyarrow_table())


def append_arrow(
    path: str,
    table: pa.Table,
    *,
    app_id: str | None = None,
    txn_version: int | None = None,
    partition_by: Sequence[str] = (),
) -> bool:
    """Append ``table`` to the Delta table at ``path`` (created if missing).

    With ``app_id`` and ``txn_version`` the append is idempotent like Delta's
    ``txnAppId`` / ``txnVersion``: it is skipped, returning False, when the
    table already records a transaction of ``app_id`` at ``txn_version`` or
    later. delta-rs records the token but does not check it, so it is checked
    here; a writer racing with another copy of itself gets a commit conflict.
    """
    if (app_id is None) != (txn_version is None):
        raise ConfigError("app_id and txn_version go together; pass both or neither", code="INVALID_OPTION")
    existing = open_table(path)
    if existing is not None:
        check_write_schema(path, table_arrow_schema(existing), table.schema)
        check_partition_columns(path, existing.metadata().partition_columns, partition_by)
    properties = None
    if app_id is not None and txn_version is not None:
        done = existing.transaction_version(app_id) if existing is not None else None
        if done is not None and done >= txn_version:
            log.info("%s: transaction %s/%d already in the table (at %d); append skipped", path, app_id, txn_version, done)
            return False
        properties = CommitProperties(app_transactions=[Transaction(app_id, txn_version)])
    write_deltalake(
        path,
        table,
        mode="append",
        partition_by=list(partition_by) or None,
        commit_properties=properties,
    )
    return True
