"""Data files of a Delta table: reading one as typed Arrow batches, writing new ones.

Runs on executors. Reading attaches partition values (from the log, never
from folder names) as typed columns and an optional position column;
writing splits rows by partition value into Parquet files under Hive-standard
folders (``consumer_group=order_group``), named as Spark and Hive name them so
any Hive-partitioned reader (Spark's partition discovery, pyarrow datasets,
Polars, Trino) gets the partition values back from the folder names alone.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from retry_engine.delta._log import (
    data_file_path,
    join_path,
    partition_value_string,
    relative_data_path,
)
from retry_engine.errors import DeltaSinkError, DeltaSourceError

READ_BATCH_ROWS = 65_536
ROW_GROUP_ROWS = 131_072
# A row group is also written once its rows hold this many bytes in memory.
ROW_GROUP_BYTES = 64 * 1024 * 1024
# Files a task finishes at once on object storage (each upload a few round trips in a row);
# PARALLEL_UPLOADS False finishes them one after another (what bench/bench_s3.py compares against).
MAX_PARALLEL_UPLOADS = 16
PARALLEL_UPLOADS = True
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
POSITION_ROW_DIGITS = 9


# --------------------------------------------------------------------------- partition values


def parse_partition_value(value: str | None, type_: pa.DataType, *, column: str = "?") -> pa.Scalar:
    """A partition value from the log (Delta's string form) as a scalar of ``type_``."""
    if value is None or (value == "" and not pa.types.is_string(type_) and not pa.types.is_large_string(type_)):
        return pa.scalar(None, type_)
    try:
        if pa.types.is_timestamp(type_):
            parsed = dt.datetime.fromisoformat(value.strip())
            if type_.tz is not None and parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=dt.UTC)
            if type_.tz is None and parsed.tzinfo is not None:
                parsed = parsed.astimezone(dt.UTC).replace(tzinfo=None)
            return pa.scalar(parsed, type_)
        if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
            return pa.scalar(value.encode("utf-8", errors="surrogateescape"), type_)
        return pa.scalar(value, pa.string()).cast(type_)
    except (ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DeltaSourceError(
            f"partition value {value!r} of column {column!r} is not a valid {type_}: {exc}",
            code="DELTA_PARTITION_VALUE_INVALID",
        ) from exc


# What Hive escapes in a folder name, as Spark writes it on POSIX file systems
# (ExternalCatalogUtils.escapePathName); NUL too, which no file name can hold. Anything
# else, spaces and non-ASCII letters included, stays as it is: Spark's discovery
# unescapes %XX one byte per character, so escaping UTF-8 bytes would garble them.
HIVE_ESCAPED = frozenset(chr(c) for c in range(0x20)) | frozenset('"#%\'*/:=?\\\x7f{[]^')
# Longest folder name most file systems accept (NAME_MAX), in bytes.
MAX_FOLDER_NAME_BYTES = 255
_HASH_SUFFIX_CHARS = 18  # "-h" and 16 hex digits


def hive_escape(text: str) -> str:
    """``text`` as Hive writes it in a folder name: each character of :data:`HIVE_ESCAPED` as ``%XX``.

    A lone surrogate (a byte that was not UTF-8, kept by ``surrogateescape``)
    becomes ``%XX`` of that byte, so every string has a folder name.
    """
    out: list[str] = []
    for ch in text:
        if ch in HIVE_ESCAPED:
            out.append(f"%{ord(ch):02X}")
        elif 0xD800 <= ord(ch) < 0xE000:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8", errors="surrogateescape")))
        else:
            out.append(ch)
    return "".join(out)


def hive_folder_value(value: str | None) -> str:
    """A partition value as Hive names its folder: null and ``""`` are ``__HIVE_DEFAULT_PARTITION__``."""
    return HIVE_NULL if value is None or value == "" else hive_escape(value)


def partition_folder_name(column: str, value: str | None) -> str:
    """One level of a partition path, ``column=value``, Hive-escaped.

    A name longer than :data:`MAX_FOLDER_NAME_BYTES` (possible only with very
    long values, e.g. a 255-character group of ``%`` signs) cannot be created,
    so its value is cut and suffixed with a hash of the full value: Delta
    readers take values from the log and are unaffected, Hive readers see the
    shortened value for that one partition.
    """
    name = f"{hive_escape(column)}={hive_folder_value(value)}"
    if len(name.encode("utf-8", errors="surrogateescape")) <= MAX_FOLDER_NAME_BYTES:
        return name
    digest = hashlib.sha256((value or "").encode("utf-8", errors="surrogateescape")).hexdigest()[:16]
    head = name
    while len(head.encode("utf-8", errors="surrogateescape")) > MAX_FOLDER_NAME_BYTES - _HASH_SUFFIX_CHARS:
        head = head[:-1]
    # Never end inside a %XX escape: a reader would decode a broken one.
    cut = head.rfind("%")
    if cut >= len(head) - 2 and cut > head.index("="):
        head = head[:cut]
    return f"{head}-h{digest}"


def partition_folder(values: Mapping[str, str | None], columns: Sequence[str]) -> str:
    """The Hive partition path of ``values`` (Delta's string forms), one folder per column in order."""
    return "/".join(partition_folder_name(c, values[c]) for c in columns)


# --------------------------------------------------------------------------- reading


def position_prefix(version: int, index: int, is_starting_version: bool) -> str:
    """Prefix of the position strings of one file: ``s`` marks snapshot files, ``v`` commit files.

    With fixed-width numbers, positions sort in stream order ("s" < "v").
    """
    return f"{'s' if is_starting_version else 'v'}{version:020d}/{index:06d}/"


def position_array(prefix: str, first_row: int, n: int) -> pa.Array:
    rows = pa.array(np.arange(first_row, first_row + n, dtype=np.int64)).cast(pa.string())
    return pc.binary_join_element_wise(prefix, pc.utf8_lpad(rows, POSITION_ROW_DIGITS, "0"), "")


def _cast(array: pa.Array | pa.ChunkedArray, type_: pa.DataType) -> pa.Array | pa.ChunkedArray:
    if array.type == type_:
        return array
    try:
        return array.cast(type_)
    except pa.ArrowInvalid:
        if pa.types.is_timestamp(type_):  # e.g. nanoseconds from another writer
            return array.cast(type_, safe=False)
        raise


@dataclass(frozen=True)
class FileToRead:
    """What a reader needs to know about one data file (also the input partition payload)."""

    path: str
    partition_values: Mapping[str, str | None]
    version: int
    index: int
    is_starting_version: bool


def read_file(
    fs: pafs.FileSystem,
    root: str,
    file: FileToRead,
    target: pa.Schema,
    *,
    table_uri: str,
    position_column: str | None = None,
    batch_rows: int = READ_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """Stream one data file of the table at ``table_uri`` as record batches of exactly ``target``.

    Columns are matched by name. Partition columns come from the log's
    partition values; a column the file lacks (added to the table later) is
    null; ``position_column`` holds each row's stream position. Deterministic:
    the same file always gives the same batches.
    """
    # Checked here as well as where the driver plans the read: a task never opens a
    # file outside the table, whoever built its partition.
    full = join_path(root, relative_data_path(file.path, table_uri))
    try:
        handle = fs.open_input_file(full)
    except FileNotFoundError as exc:
        raise DeltaSourceError(
            f"data file {full} added by version {file.version} is gone: a DELETE, UPDATE, overwrite or "
            "compaction (OPTIMIZE, retry-engine maintain) replaced it and VACUUM (or a person) deleted it "
            "before the stream read it, the stream being further behind than the vacuum retention; "
            "its rows cannot be read any more. skipChangeCommits / ignoreDeletes (retry-engine config: "
            "[source] skip_change_commits / ignore_deletes) skip the commits that remove data, but not "
            "this add. To go on, start a new checkpoint with startingVersion or startingTimestamp "
            "([source] starting_version / starting_timestamp) at a version whose files still exist "
            "(the first commit after the removal); rows of the vacuumed files are not processed",
            code="DELTA_FILE_MISSING",
        ) from exc
    with handle:
        # INT96 times (Spark's older writers) as microseconds: as nanoseconds, a time past 2262 wraps.
        parquet = pq.ParquetFile(handle, coerce_int96_timestamp_unit="us")
        in_file = set(parquet.schema_arrow.names)
        wanted = [
            f.name
            for f in target
            if f.name != position_column and f.name not in file.partition_values and f.name in in_file
        ]
        constants = {
            f.name: parse_partition_value(file.partition_values[f.name], f.type, column=f.name)
            for f in target
            if f.name in file.partition_values and f.name != position_column
        }
        prefix = position_prefix(file.version, file.index, file.is_starting_version)
        row = 0
        batches: Iterator[pa.RecordBatch] = (
            parquet.iter_batches(batch_size=batch_rows, columns=wanted) if parquet.metadata.num_rows else iter(())
        )
        for batch in batches:
            n = batch.num_rows
            arrays: list[pa.Array] = []
            for f in target:
                if f.name == position_column:
                    arrays.append(position_array(prefix, row, n))
                elif f.name in constants:
                    arrays.append(pa.repeat(constants[f.name], n))
                elif f.name in in_file:
                    arrays.append(_cast(batch.column(f.name), f.type))
                else:
                    arrays.append(pa.nulls(n, f.type))
            row += n
            yield pa.RecordBatch.from_arrays(arrays, schema=target)


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class WrittenFile:
    """One Parquet file written by a task, as its Delta ``add`` action needs it."""

    path: str
    """Relative to the table root, URL-encoded as the log wants it."""
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    num_records: int
    stats: str

    def add_action(self, *, data_change: bool) -> AddAction:
        """Its ``add`` action. delta-rs URL-encodes an action's path when it writes the log, so it takes
        the physical path: passing the log form would encode the % of Hive folder names twice."""
        return AddAction(
            path=data_file_path(self.path),
            size=self.size,
            partition_values=self.partition_values,
            modification_time=self.modification_time,
            data_change=data_change,
            stats=self.stats,
        )


# Columns that get min/max/nullCount stats, as delta-rs's own writer does. Every such
# column must have them: delta-rs (1.6) prunes a file as "no match" when a filter
# names a column that the file's stats leave out, so a partial stats record hides rows.
_STATS_TYPES = (
    pa.types.is_integer,
    pa.types.is_floating,
    pa.types.is_boolean,
    pa.types.is_date,
    pa.types.is_timestamp,
    pa.types.is_string,
    pa.types.is_large_string,
)
# Delta keeps string bounds short (Spark: dataSkippingStringPrefixLength = 32).
STRING_STATS_PREFIX = 32
_SURROGATES = range(0xD800, 0xE000)


def _has_stats(type_: pa.DataType) -> bool:
    return any(is_type(type_) for is_type in _STATS_TYPES)


def string_upper_bound(value: str, prefix: int = STRING_STATS_PREFIX) -> str:
    """A string of at most ``prefix`` characters that sorts at or above ``value``.

    Cut to the prefix and bump the last character that can be bumped; if none
    can, the value itself is the bound (exact, just long).
    """
    if len(value) <= prefix:
        return value
    head = value[:prefix]
    for i in range(len(head) - 1, -1, -1):
        code = ord(head[i]) + 1
        if code in _SURROGATES:
            code = _SURROGATES.stop
        if code <= 0x10FFFF:
            return head[:i] + chr(code)
    return value


def _stat_json(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        # The year as four digits: strftime's %Y gives "5" for year 5 here, which delta-rs reads as no
        # bound (its filtered reads then skipped the file's rows).
        return f"{value.year:04d}-{value:%m-%dT%H:%M:%S.%f}Z"
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


class Unbounded(ValueError):
    """A column of a file holds a value no bound can be written for. Bounds of the rest of the column
    would lie (filtered reads skip the rows past them), and a column left out of the statistics makes
    delta-rs prune the file for any filter on it (see _STATS_TYPES): the file gets no statistics but
    its row count, and every reader reads it."""


def _min_max(column: pa.ChunkedArray) -> tuple[Any, Any] | None:
    """Bounds of the non-null (and, for floats, non-NaN) values; None when there are none."""
    if pa.types.is_floating(column.type):
        column = pc.filter(column, pc.invert(pc.is_nan(column)))
    if column.null_count >= len(column):
        return None
    try:
        low, high = (v.as_py() for v in pc.min_max(column).values())
    except (OverflowError, ValueError) as exc:
        # A value Python cannot hold (a time past year 9999, text that is no UTF-8: another writer's
        # row carried as read): no bound of it can be written (see Unbounded).
        raise Unbounded(str(exc)) from exc
    if low is None or high is None:
        return None
    if isinstance(low, str):
        return low[:STRING_STATS_PREFIX], string_upper_bound(high)
    return low, high


# Rows of a file's first batch that decide which columns it dictionary-encodes.
_DICTIONARY_SAMPLE_ROWS = 1024


@functools.lru_cache(maxsize=64)
def _leaf_paths(schema: pa.Schema) -> dict[str, list[str]]:
    """Each top-level column's Parquet leaf columns (what ``use_dictionary`` names), in order."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    parquet = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    leaves = [parquet.column(i).path for i in range(len(parquet))]
    return {
        name: [path for path in leaves if path == name or path.startswith(name + ".")] for name in schema.names
    }


def dictionary_columns(schema: pa.Schema, first: pa.RecordBatch) -> list[str]:
    """The leaf columns worth dictionary-encoding in a file of ``schema`` whose first rows are ``first``.

    Values that repeat (fewer distinct than half the sampled rows) and nested
    columns are, as before; a column of values unique per row (ids, positions,
    times) is written plain. Parquet writers fall back to plain encoding once a
    dictionary outgrows its page, but only after building it: writing the
    engine's retry rows spent a quarter of its time there (64 -> 47 ms for 60k
    rows, and 7% smaller files). Only the encoding changes, never the values.
    """
    sample = first.slice(0, _DICTIONARY_SAMPLE_ROWS)
    n = sample.num_rows
    out: list[str] = []
    for name, leaves in _leaf_paths(schema).items():
        if _repeats(sample.column(name), n):
            out += leaves
    return out


def _repeats(column: pa.Array, n: int) -> bool:
    if pa.types.is_nested(column.type):
        return True
    try:
        return bool(2 * pc.count_distinct(column).as_py() <= n)
    except pa.ArrowNotImplementedError:  # a type Arrow cannot count (null, dictionary): as before
        return True


@dataclass
class _OpenFile:
    """One file of a task's output, opened (its stream and Parquet writer) at its first row group."""

    relative: str
    partition_values: dict[str, str | None]
    fs: pafs.FileSystem
    full: str
    schema: pa.Schema
    writer: pq.ParquetWriter | None = None
    # The file's stream: its position once the writer closes is the file's size (asking the store
    # for it cost a listing and a HEAD per file on object storage).
    stream: pa.NativeFile | None = None
    compression: str = "snappy"
    pending: list[pa.RecordBatch] = field(default_factory=list)
    pending_rows: int = 0
    pending_bytes: int = 0
    rows: int = 0
    null_counts: dict[str, int] = field(default_factory=dict)
    mins: dict[str, Any] = field(default_factory=dict)
    maxs: dict[str, Any] = field(default_factory=dict)
    # Set when a column holds a value no bound can be written for (Unbounded).
    unbounded: bool = False

    def _open(self, first: pa.RecordBatch) -> pq.ParquetWriter:
        parent = self.full.rsplit("/", 1)[0]
        if parent:
            self.fs.create_dir(parent, recursive=True)
        self.stream = self.fs.open_output_stream(self.full)
        self.writer = pq.ParquetWriter(
            self.stream, self.schema, compression=self.compression,
            use_dictionary=dictionary_columns(self.schema, first),
        )
        return self.writer

    def flush(self) -> None:
        if not self.pending:
            return
        writer = self.writer if self.writer is not None else self._open(self.pending[0])
        table = pa.Table.from_batches(self.pending)
        writer.write_table(table, row_group_size=max(table.num_rows, 1))
        for name in table.column_names:
            column = table.column(name)
            if not _has_stats(column.type):
                continue
            self.null_counts[name] = self.null_counts.get(name, 0) + column.null_count
            try:
                bounds = _min_max(column)
            except Unbounded:
                self.unbounded = True
                continue
            if bounds is None:
                continue
            lo, hi = bounds
            self.mins[name] = lo if name not in self.mins else min(self.mins[name], lo)
            self.maxs[name] = hi if name not in self.maxs else max(self.maxs[name], hi)
        self.pending, self.pending_rows, self.pending_bytes = [], 0, 0

    def finish(self, modification_time: int) -> WrittenFile:
        """Write what is pending and the footer, and end the file (on object storage: its upload)."""
        self.flush()
        assert self.writer is not None and self.stream is not None  # a file exists once it has a row
        self.writer.close()  # writes the footer; the stream stays open
        size = self.stream.tell()
        self.stream.close()
        return WrittenFile(
            path=quote(self.relative, safe="/="),
            size=int(size),
            partition_values=self.partition_values,
            modification_time=modification_time,
            num_records=self.rows,
            stats=self.stats(),
        )

    def discard(self) -> None:
        """Close and delete the file, if it was opened."""
        if self.stream is None:
            return
        try:
            try:
                if self.writer is not None:
                    self.writer.close()
            finally:
                self.stream.close()
        finally:
            delete_quietly(self.fs, self.full)

    def stats(self) -> str:
        if self.unbounded:
            return json.dumps({"numRecords": self.rows}, separators=(",", ":"))
        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": {k: _stat_json(v) for k, v in self.mins.items()},
                "maxValues": {k: _stat_json(v) for k, v in self.maxs.items()},
                "nullCount": self.null_counts,
            },
            separators=(",", ":"),
        )


class PartitionedWriter:
    """Writes batches into one Parquet file per partition value under a table root.

    Rows are buffered per partition into row groups of about
    ``row_group_rows``. Nothing is visible to readers until the driver commits
    the returned files; a failed attempt only leaves unreferenced files.
    """

    def __init__(
        self,
        fs: pafs.FileSystem,
        root: str,
        schema: pa.Schema,
        *,
        partition_by: Sequence[str] = (),
        not_null: Sequence[str] = (),
        uri: str = "",
        row_group_rows: int = ROW_GROUP_ROWS,
        compression: str = "snappy",
    ) -> None:
        self.fs, self.root, self.uri = fs, root, uri
        self.compression = compression
        self.schema = schema
        self.partition_by = list(partition_by)
        self.not_null = [c for c in not_null if c in schema.names]
        self.file_schema = pa.schema([f for f in schema if f.name not in self.partition_by])
        self.row_group_rows = row_group_rows
        self.open: dict[tuple[str | None, ...], _OpenFile] = {}
        self.done: list[WrittenFile] = []

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if batch.schema != self.schema:
            batch = batch.cast(self.schema)
        for name in self.not_null:
            if batch.column(name).null_count:
                raise DeltaSinkError(
                    f"{self.uri}: column {name!r} is NOT NULL in the table but the data has "
                    f"{batch.column(name).null_count} null(s)",
                    code="NOT_NULL_VIOLATION",
                )
        for key, values, part in self._split(batch):
            target = self.open.get(key)
            if target is None:
                target = self.open[key] = self._open(values)
            kept = part.select(self.file_schema.names)
            target.pending.append(kept)
            target.pending_rows += part.num_rows
            target.pending_bytes += kept.nbytes
            target.rows += part.num_rows
            # By bytes too: rows of big bodies (a compaction of a topic's messages) would otherwise be
            # held by the hundred thousand.
            if target.pending_rows >= self.row_group_rows or target.pending_bytes >= ROW_GROUP_BYTES:
                target.flush()

    def _split(
        self, batch: pa.RecordBatch
    ) -> Iterator[tuple[tuple[str | None, ...], dict[str, str | None], pa.RecordBatch]]:
        if not self.partition_by:
            yield (), {}, batch
            return
        keys = pa.table([batch.column(c) for c in self.partition_by], names=self.partition_by)
        if all(pc.count_distinct(keys.column(c), mode="all").as_py() == 1 for c in self.partition_by):
            values = {c: partition_value_string(keys.column(c)[0].as_py()) for c in self.partition_by}
            yield tuple(values.values()), values, batch
            return
        keys = keys.append_column("__row", pa.array(np.arange(batch.num_rows, dtype=np.int64)))
        groups = keys.group_by(self.partition_by, use_threads=False).aggregate([("__row", "list")])
        rows = groups.column("__row_list")
        for g in range(groups.num_rows):
            values = {c: partition_value_string(groups.column(c)[g].as_py()) for c in self.partition_by}
            yield tuple(values.values()), values, batch.take(rows[g].values)

    def _open(self, values: dict[str, str | None]) -> _OpenFile:
        folder = partition_folder(values, self.partition_by)
        name = f"part-{uuid.uuid4()}.{self.compression}.parquet"
        relative = f"{folder}/{name}" if folder else name
        return _OpenFile(
            relative, values, self.fs, join_path(self.root, relative), self.file_schema, compression=self.compression
        )

    def close(self) -> list[WrittenFile]:
        """Finish every file; returns what was written (empty if no rows).

        On object storage the files are finished side by side, one thread each: finishing one
        uploads it (a multipart upload's create, part and completion, one round trip after the
        other), and most of a task's files are opened here too (at their first row group).
        """
        now = int(time.time() * 1000)
        targets = list(self.open.values())
        if PARALLEL_UPLOADS and len(targets) > 1 and not isinstance(self.fs, pafs.LocalFileSystem):
            with ThreadPoolExecutor(max_workers=min(len(targets), MAX_PARALLEL_UPLOADS)) as pool:
                written = list(pool.map(lambda target: target.finish(now), targets))
        else:
            written = [target.finish(now) for target in targets]
        self.done.extend(written)
        self.open.clear()
        return self.done

    def discard(self) -> None:
        """Close and delete every open file (the task failed)."""
        for target in self.open.values():
            target.discard()
        self.open.clear()


def delete_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except (FileNotFoundError, OSError):
        # Best effort: an orphan file is invisible to readers and vacuum removes it.
        pass


def delete_written(fs: pafs.FileSystem, root: str, files: Sequence[WrittenFile]) -> None:
    """Delete ``files`` (written for a commit that did not happen) under the table at ``root``, quietly."""
    for file in files:
        delete_quietly(fs, join_path(root, data_file_path(file.path)))
