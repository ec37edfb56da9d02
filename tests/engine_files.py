"""Writing a Delta table the way the engine's ``deltars`` sink does, without Spark.

The sink's executors write Parquet files with :class:`PartitionedWriter` (its
partition folders) and the driver commits them with :func:`commit_files`;
tests that need a table laid out exactly like an engine output use this.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from retry_engine.delta._files import PartitionedWriter
from retry_engine.delta._log import TableLocation
from retry_engine.delta.sink import FilesWritten, commit_files
from retry_engine.delta.tables import ensure_table


def append_like_engine(path: str, data: pa.Table, *, partition_by: Sequence[str] = ()) -> None:
    """Append ``data`` to the table at ``path`` (created if missing) as one commit of the sink."""
    table = ensure_table(path, data.schema, partition_by=partition_by)
    location = TableLocation(path)
    fs, root = location.filesystem()
    not_null = [f.name for f in data.schema if not f.nullable]
    writer = PartitionedWriter(fs, root, data.schema, partition_by=partition_by, not_null=not_null, uri=path)
    for batch in data.to_batches():
        writer.write(batch)
    files = writer.close()
    partitions = list(table.metadata().partition_columns)
    commit_files(location, [FilesWritten(tuple(files))], mode="append", partition_by=partitions, app_id=None, txn_version=None)
