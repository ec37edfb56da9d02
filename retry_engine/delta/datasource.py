"""The ``deltars`` Spark data source: readers from :mod:`.source`, writers from :mod:`.sink`.

Its own module so that source and sink need not import each other.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from retry_engine.delta._options import FORMAT_NAME
from retry_engine.delta.sink import DeltaBatchWriter, DeltaStreamWriter
from retry_engine.delta.source import (
    DeltaBatchReader,
    DeltaStreamReader,
    SourceOptions,
    packed_schema,
    row_schema,
)


class DeltaRsDataSource(DataSource):
    """``format("deltars")``: read and write Delta tables through delta-rs.

    Options: ``path`` (required). Reading: ``maxFilesPerTrigger`` (default
    1000), ``maxBytesPerTrigger``, ``ignoreDeletes``, ``skipChangeCommits``,
    ``startingVersion`` (a version or "latest") or ``startingTimestamp`` (a
    date or timestamp: the first commit at or after it), ``versionAsOf`` (batch),
    ``addedAfterVersion`` (batch: only the files commits after that version added), ``pruneColumn`` with
    ``pruneBefore`` (batch: skip files whose statistics put every value before that time),
    ``sourcePositionColumn``, ``packedColumn`` (rows packed as Arrow IPC
    batches in one binary column), ``readPartitions`` (at most this many read
    tasks a batch, files grouped by size; default one task per file), ``wakeOnStart``
    (a restarted query plans a batch at its first trigger without new files). Writing: ``partitionBy`` (comma-separated),
    ``txnAppId`` + ``txnVersion`` (idempotent batch writes; streams use the
    query id from ``checkpointLocation``).
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        """The table's rows (:func:`row_schema`), or with ``packedColumn`` one binary column."""
        options = SourceOptions.parse(self.options)
        rows = row_schema(options)
        return packed_schema(options.packed_column) if options.packed_column else rows

    def reader(self, schema: StructType) -> DataSourceReader:
        return DeltaBatchReader(SourceOptions.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DeltaStreamReader(SourceOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DeltaBatchWriter:
        return DeltaBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DeltaStreamWriter:
        return DeltaStreamWriter(self.options, schema, overwrite)
