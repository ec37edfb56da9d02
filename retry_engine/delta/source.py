"""The ``deltars`` data source: Delta tables in Spark through delta-rs.

Streaming offsets follow Delta's own source: ``(reservoirVersion, index,
isStartingVersion)``. A new query reads the snapshot of the latest version
first, then tails later commits, emitting only data-changing ``add`` files.
Admission control (``maxFilesPerTrigger``, ``maxBytesPerTrigger``) always
admits at least one file, and ``Trigger.AvailableNow`` stops at the version
that was latest when the query started.

Replay: ``partitions(start, end)`` is a pure function of the two offsets and
the (immutable) log, so a replayed micro-batch reads the same files in the
same order.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StringType, StructField, StructType

from retry_engine.delta._commits import DeltaLog, FileEntry, file_path
from retry_engine.errors import DeltaSourceError

log = logging.getLogger(__name__)

FORMAT_NAME = "deltars"
DEFAULT_MAX_FILES_PER_TRIGGER = 1000


def _flag(options: dict[str, str], name: str) -> bool:
    return str(options.get(name, "false")).strip().lower() in ("true", "1", "yes")


@dataclass(frozen=True)
class FilePartition(InputPartition):
    """One data file of the stream (or of a batch read)."""

    path: str
    partition_values: dict[str, str | None]
    version: int
    index: int

    def __init__(self, entry: FileEntry) -> None:
        object.__setattr__(self, "path", entry.path)
        object.__setattr__(self, "partition_values", entry.partition_values)
        object.__setattr__(self, "version", entry.version)
        object.__setattr__(self, "index", entry.index)
        object.__setattr__(self, "value", entry.path)


def read_file(
    uri: str, part: FilePartition, target: pa.Schema, position_column: str | None
) -> Iterator[pa.RecordBatch]:
    """Stream one data file as batches of exactly ``target``'s schema."""
    parquet = pq.ParquetFile(file_path(uri, part.path))
    row = 0
    for batch in parquet.iter_batches(batch_size=65_536):
        n = batch.num_rows
        arrays = []
        for f in target:
            if f.name == position_column:
                arrays.append(pa.array([f"{part.version:020d}/{part.index:06d}/{row + i:09d}" for i in range(n)], pa.string()))
            elif f.name in part.partition_values:
                value = part.partition_values[f.name]
                arrays.append(pa.array([value] * n, pa.string()).cast(f.type))
            elif f.name in batch.schema.names:
                arrays.append(batch.column(f.name).cast(f.type))
            else:  # a column added to the table after this file was written
                arrays.append(pa.nulls(n, f.type))
        row += n
        yield pa.RecordBatch.from_arrays(arrays, schema=target)


def _target_schema(schema: StructType) -> pa.Schema:
    return to_arrow_schema(schema, timezone="UTC")


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streams the files of a Delta table in commit order."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.uri = options["path"]
        self.schema = schema
        self.position_column = options.get("sourcePositionColumn")
        self.ignore_deletes = _flag(options, "ignoreDeletes")
        self.skip_change_commits = _flag(options, "skipChangeCommits")
        self.max_files = int(options.get("maxFilesPerTrigger", DEFAULT_MAX_FILES_PER_TRIGGER))
        self.max_bytes = int(options["maxBytesPerTrigger"]) if options.get("maxBytesPerTrigger") else None
        self.starting_version = options.get("startingVersion")
        self.log = DeltaLog(self.uri)
        self.available_now_version: int | None = None

    def initialOffset(self) -> dict[str, Any]:
        if self.starting_version not in (None, "", "latest"):
            return {"reservoirVersion": int(self.starting_version), "index": -1, "isStartingVersion": False}
        latest = self.log.latest_version()
        if self.starting_version == "latest":
            return {"reservoirVersion": latest + 1, "index": -1, "isStartingVersion": False}
        return {"reservoirVersion": latest, "index": -1, "isStartingVersion": True}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_bytes is not None:
            return ReadMaxBytes(self.max_bytes)
        return ReadMaxFiles(self.max_files)

    def prepareForTriggerAvailableNow(self) -> None:
        self.available_now_version = self.log.latest_version()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        until = self.available_now_version if self.available_now_version is not None else self.log.latest_version()
        last: FileEntry | None = None
        files = 0
        size = 0
        for entry in self._files(start, until):
            if last is not None:
                if isinstance(limit, ReadMaxFiles) and files >= limit.max_files:
                    break
                if isinstance(limit, ReadMaxBytes) and size + entry.size > limit.max_bytes:
                    break
            last, files, size = entry, files + 1, size + entry.size
        if last is None:
            return start
        return last.offset

    def _files(self, start: dict[str, Any], until: int) -> Iterator[FileEntry]:
        return self.log.files_after(
            start, until_version=until, ignore_deletes=self.ignore_deletes, skip_change_commits=self.skip_change_commits
        )

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """The files after ``start`` up to and including the file ``end`` points at."""
        last = (int(end["reservoirVersion"]), int(end["index"]))
        parts: list[InputPartition] = []
        for entry in self._files(start, last[0]):
            if (entry.version, entry.index) > last:
                break
            parts.append(FilePartition(entry))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        yield from read_file(self.uri, partition, _target_schema(self.schema), self.position_column)

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("source %s committed through %s", self.uri, end)


class DeltaBatchReader(DataSourceReader):
    """Reads the snapshot at ``versionAsOf`` (default: latest)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.uri = options["path"]
        self.schema = schema
        self.version = int(options["versionAsOf"]) if options.get("versionAsOf") else None
        self.position_column = options.get("sourcePositionColumn")

    def partitions(self) -> Sequence[InputPartition]:
        delta_log = DeltaLog(self.uri)
        version = self.version if self.version is not None else delta_log.latest_version()
        return [FilePartition(e) for e in delta_log.snapshot(version)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        yield from read_file(self.uri, partition, _target_schema(self.schema), self.position_column)


class DeltaRsDataSource(DataSource):
    """``format("deltars")``: read and write Delta tables through delta-rs.

    Options: ``path`` (required); reading: ``maxFilesPerTrigger``,
    ``maxBytesPerTrigger``, ``startingVersion``, ``ignoreDeletes``,
    ``skipChangeCommits``, ``versionAsOf``, ``sourcePositionColumn``; writing:
    ``partitionBy``, ``txnAppId``, ``txnVersion``.
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        if not options.get("path"):
            raise DeltaSourceError("format('deltars') needs option 'path' (the Delta table's folder)", code="PATH_MISSING")

    def schema(self) -> StructType:
        arrow = DeltaLog(self.options["path"]).arrow_schema(
            int(self.options["versionAsOf"]) if self.options.get("versionAsOf") else None
        )
        schema = from_arrow_schema(arrow)
        position = self.options.get("sourcePositionColumn")
        if position:
            schema = StructType([*schema.fields, StructField(position, StringType(), False)])
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return DeltaBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DeltaStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from retry_engine.delta.sink import DeltaBatchWriter

        return DeltaBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from retry_engine.delta.sink import DeltaStreamWriter

        return DeltaStreamWriter(self.options, schema, overwrite)
