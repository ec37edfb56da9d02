"""Writing Spark DataFrames to Delta tables through delta-rs.

Executors write Parquet files into the table folder and return what they
wrote; the driver commits them as one Delta transaction. Both writers carry
an idempotency token like Delta's own (``txnAppId`` / ``txnVersion``; for a
stream the query id and batch id) and skip a transaction the table already
has: delta-rs records the token but does not enforce it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction, CommitProperties, Transaction
from pyspark.sql import DataFrame
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming import DataStreamWriter
from pyspark.sql.types import StructType

from retry_engine.delta._commits import local_path
from retry_engine.delta.tables import ensure_table
from retry_engine.errors import DeltaSinkError

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def escape_path_value(value: str | None) -> str:
    """A partition value as a safe folder name: no '%', '/', '|' or other specials.

    The folder name is only a convention; readers take partition values from
    the log, so this need not be reversible.
    """
    if value is None:
        return "__HIVE_DEFAULT_PARTITION__"
    return _UNSAFE.sub(lambda m: f"_x{ord(m.group()):02X}", value) or "_empty"


@dataclass
class FilesWritten(WriterCommitMessage):
    """What one task wrote: add-action fields per file."""

    files: list[dict[str, Any]]


def _partition_by(options: dict[str, str]) -> list[str]:
    return [c.strip() for c in options.get("partitionBy", "").split(",") if c.strip()]


def write_files(uri: str, batches: Iterator[pa.RecordBatch], partition_by: list[str]) -> FilesWritten:
    """Write ``batches`` as Parquet files (one per partition value) under ``uri``."""
    root = local_path(uri)
    tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
    if not tables:
        return FilesWritten([])
    data = pa.concat_tables(tables)
    if partition_by:
        keys = data.select(partition_by).group_by(partition_by).aggregate([]).to_pylist()
    else:
        keys = [{}]
    files = []
    for key in keys:
        part = data
        for col, value in key.items():
            part = part.filter(pc.is_null(part[col]) if value is None else pc.equal(part[col], value))
        part = part.drop_columns(partition_by)
        folder = "/".join(f"{col}={escape_path_value(None if v is None else str(v))}" for col, v in key.items())
        relative = f"{folder}/part-{uuid.uuid4()}.parquet" if folder else f"part-{uuid.uuid4()}.parquet"
        full = os.path.join(root, relative)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        pq.write_table(part, full, compression="snappy")
        files.append(
            {
                "path": relative,
                "size": os.path.getsize(full),
                "partition_values": {c: None if v is None else str(v) for c, v in key.items()},
                "modification_time": int(time.time() * 1000),
                "num_records": part.num_rows,
            }
        )
    return FilesWritten(files)


def commit_files(
    uri: str,
    messages: list[WriterCommitMessage | None],
    *,
    schema: pa.Schema,
    partition_by: list[str],
    mode: str,
    app_id: str | None,
    txn_version: int | None,
) -> bool:
    """Commit every file in ``messages`` as one transaction; False if already committed."""
    table = DeltaTable(uri)
    if app_id is not None and txn_version is not None:
        done = table.transaction_version(app_id)
        if done is not None and done >= txn_version:
            log.info("%s: transaction %s/%d already committed (at %d); skipped", uri, app_id, txn_version, done)
            return False
    files = [f for m in messages if isinstance(m, FilesWritten) for f in m.files]
    if not files and mode == "append":
        return True
    actions = [
        AddAction(
            path=f["path"],
            size=f["size"],
            partition_values=f["partition_values"],
            modification_time=f["modification_time"],
            data_change=True,
            stats=json.dumps({"numRecords": f["num_records"]}),
        )
        for f in files
    ]
    properties = (
        CommitProperties(app_transactions=[Transaction(app_id, txn_version)])
        if app_id is not None and txn_version is not None
        else None
    )
    table.create_write_transaction(
        actions, mode=mode, schema=schema, partition_by=partition_by or None, commit_properties=properties
    )
    log.debug("%s: committed %d files (txn %s/%s)", uri, len(files), app_id, txn_version)
    return True


def _abort(uri: str, messages: list[WriterCommitMessage | None]) -> None:
    for m in messages:
        if isinstance(m, FilesWritten):
            for f in m.files:
                try:
                    os.remove(os.path.join(local_path(uri), f["path"]))
                except FileNotFoundError:
                    pass


class _Writer:
    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.uri = options["path"]
        self.partition_by = _partition_by(options)
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.overwrite = overwrite
        self.app_id = options.get("txnAppId")
        self.txn_version = int(options["txnVersion"]) if options.get("txnVersion") else None
        if (self.app_id is None) != (self.txn_version is None):
            raise DeltaSinkError("options txnAppId and txnVersion go together", code="TXN_OPTIONS")
        missing = [c for c in self.partition_by if c not in self.arrow_schema.names]
        if missing:
            raise DeltaSinkError(f"partitionBy column {missing[0]!r} is not in the DataFrame", code="PARTITION_COLUMN")
        # Runs on the driver: create the table, or check the DataFrame fits it.
        ensure_table(self.uri, self.arrow_schema, partition_by=self.partition_by)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        return write_files(self.uri, iterator, self.partition_by)


class DeltaBatchWriter(_Writer, DataSourceArrowWriter):
    """``df.write.format("deltars")``: one transaction; idempotent with txnAppId/txnVersion."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        commit_files(
            self.uri,
            messages,
            schema=self.arrow_schema,
            partition_by=self.partition_by,
            mode="overwrite" if self.overwrite else "append",
            app_id=self.app_id,
            txn_version=self.txn_version,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        _abort(self.uri, messages)


def ensure_query_id(checkpoint: str) -> str:
    """The streaming query id stored in ``<checkpoint>/metadata``, created if absent.

    Spark keeps an existing metadata file, so writing it first lets a sink
    know the id before the query starts (the data source API does not pass the
    checkpoint location to writers). A new checkpoint gets a new id, so batch
    ids restarting at 0 never collide with an old query's transactions.
    """
    root = local_path(checkpoint)
    path = os.path.join(root, "metadata")
    if os.path.exists(path):
        with open(path) as handle:
            return str(json.loads(handle.readline())["id"])
    os.makedirs(root, exist_ok=True)
    query_id = str(uuid.uuid4())
    with open(path, "w") as handle:
        handle.write(json.dumps({"id": query_id}) + "\n")
    return query_id


def write_stream(
    df: DataFrame, path: str, *, checkpoint: str, partition_by: Sequence[str] = ()
) -> DataStreamWriter:
    """``df.writeStream`` to the Delta table at ``path``, exactly once, tied to ``checkpoint``.

    Returns the configured writer: set a trigger if needed and call ``start()``.
    """
    writer = (
        df.writeStream.format("deltars")
        .option("path", path)
        .option("checkpointLocation", checkpoint)
        .option("txnAppId", f"deltars-stream-{ensure_query_id(checkpoint)}")
    )
    if partition_by:
        writer = writer.option("partitionBy", ",".join(partition_by))
    return writer


class DeltaStreamWriter(_Writer, DataSourceStreamArrowWriter):
    """``writeStream.format("deltars")``: one transaction per micro-batch, exactly once.

    Replay: a batch id the table already recorded for this query is skipped.
    """

    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        if not options.get("txnAppId"):
            # Spark does not hand the checkpoint location to Python sinks, and without an
            # id tied to it a restarted query could not tell its batches apart from a new one's.
            raise DeltaSinkError(
                "writeStream.format('deltars') needs option txnAppId tied to the checkpoint; "
                "use retry_engine.delta.write_stream(df, path, checkpoint=...) which sets it",
                code="SINK_APP_ID",
            )
        options = options.copy()
        options["txnVersion"] = "0"
        super().__init__(options, schema, overwrite)

    def _app_id(self) -> str:
        assert self.app_id is not None  # checked in __init__
        return self.app_id

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        commit_files(
            self.uri,
            messages,
            schema=self.arrow_schema,
            partition_by=self.partition_by,
            mode="append",
            app_id=self._app_id(),
            txn_version=batchId,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # type: ignore[override]
        _abort(self.uri, messages)
