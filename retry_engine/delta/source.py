"""The ``deltars`` data source: Delta tables in Spark through delta-rs.

Streaming follows Delta's own source. A new query reads the snapshot of the
latest version (or starts at ``startingVersion``), then tails later commits,
emitting only data-changing ``add`` files; offsets are
``{"reservoirVersion", "index", "isStartingVersion"}`` (see ``_offsets``).
Admission control (``maxFilesPerTrigger`` / ``maxBytesPerTrigger``, and
``maxRowsPerTrigger`` by the files' ``numRecords`` statistics, which Delta's
source lacks) always admits at least one file, and ``Trigger.AvailableNow`` stops at the version
that was latest when the query started.

Replay: ``partitions(start, end)`` is a pure function of the two offsets and
the immutable log, and ``read`` of a file is deterministic, so a replayed
micro-batch yields the same rows in the same order (and the same
``sourcePositionColumn`` values).

``wakeOnStart`` is for stateful queries with processing-time timeouts (the
engine's schedule stage): Spark runs a batch without new data only after a
batch ran in the same query execution, so a query restarted on a checkpoint
whose every planned batch was committed ran nothing, and fired no timeout, until
new input arrived. With it, the first ``latestOffset`` of a restarted query's reader that finds
no new file still moves the offset (a ``wake`` count, read as the same
position), so Spark plans one empty batch at the first trigger. A new query
(no checkpoint yet) has no state, so nothing to wake.

``packedColumn`` is for Python consumers of the stream (``mapInArrow``): each
Spark row then holds a slice of an Arrow batch as read (table columns plus the
position column; about :data:`PACKED_MAX_BYTES`), as an Arrow IPC stream in
that one binary column. Spark converts a few rows per file instead of every
row, which is most of the cost of a read that Python code will consume as
Arrow anyway.
"""

from __future__ import annotations

import datetime as dt
import functools
import heapq
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from retry_engine.core.names import EXPIRING_TABLES
from retry_engine.delta import storage
from retry_engine.delta._arrow_ipc import ipc_array, ipc_slices
from retry_engine.delta._files import FileToRead, read_file
from retry_engine.delta._log import (
    Commit,
    DeltaLog,
    ExpiryJudge,
    FileEntry,
    FilePrune,
    TableLocation,
    relative_data_path,
)
from retry_engine.delta._offsets import (
    Admission,
    ChangeRules,
    Offset,
    end_offset,
    files_after,
    files_between,
    replay_start,
    require_within_table,
    within_table,
)
from retry_engine.delta._options import (
    lower_keys,
    parse_bool,
    parse_bytes,
    parse_positive_int,
    parse_timestamp,
    parse_timestamp_ms,
    require_path,
)
from retry_engine.delta._schema import check_stream_schema
from retry_engine.delta._worker_heap import settle
from retry_engine.delta.tables import stats_from
from retry_engine.errors import ConfigError, DeltaSourceError

log = logging.getLogger(__name__)

DEFAULT_MAX_FILES_PER_TRIGGER = 1000
# With packedColumn: about this many bytes per packed value (Spark builds each Arrow
# batch in JVM direct memory, and one binary value is capped at 2 GiB).
PACKED_MAX_BYTES = 8 * 1024 * 1024

@dataclass(frozen=True)
class SourceOptions:
    """Read options of ``format("deltars")``, validated on construction."""

    path: str
    max_files_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    max_rows_per_trigger: int | None = None
    ignore_deletes: bool = False
    skip_change_commits: bool = False
    skip_expired_by: str | None = None
    """``skipExpiredBy`` (a time column): a data file gone before the stream read it whose rows the
    log's statistics put all before the table's row retention cut (:func:`expired_file`) is skipped,
    logged, rather than failing the stream with ``DELTA_FILE_MISSING``."""
    starting_version: int | Literal["latest"] | None = None
    starting_timestamp: str | None = None
    """As given; :attr:`starting_timestamp_ms` is its value."""
    version_as_of: int | None = None
    added_after_version: int | None = None
    """``addedAfterVersion`` (a batch read): only the snapshot's files that commits after this version
    added (:meth:`DeltaLog.added_after`): every row committed since, and the rows a compaction rewrote
    into such a file with them."""
    position_column: str | None = None
    packed_column: str | None = None
    read_partitions: int | None = None
    """``readPartitions``: at most this many read tasks a batch (None: one per file)."""
    wake_on_start: bool = False
    """``wakeOnStart``: a query's first trigger plans a batch even without new files."""
    prune: FilePrune | None = None
    """``pruneColumn`` and ``pruneBefore`` (a batch read): skip the files whose statistics put every
    value of that time column before that time. Rows are not filtered: a file read keeps its older rows."""
    partition_filter: Mapping[str, frozenset[str]] | None = None
    """``partitionFilter`` (JSON, column -> the values wanted): skip the files of other values of a
    partition column (a file of a table not partitioned by it is read). Only whole files: a caller
    still filters the rows; the offsets are those of every file."""
    # ``storage.<key>`` options (not in repr: they may hold credentials); None: the registered ones.
    storage_options: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    @property
    def location(self) -> TableLocation:
        """The table with its storage options (these, or on the driver the ones registered for ``path``)."""
        return storage.location(self.path, self.storage_options)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = lower_keys(options)
        starting: int | Literal["latest"] | None = None
        raw_start = opts.get("startingversion", "").strip()
        if raw_start.lower() == "latest":
            starting = "latest"
        elif raw_start:
            if not (raw_start.isascii() and raw_start.isdigit()):
                raise ConfigError(
                    f"option startingVersion={raw_start!r} must be a version number >= 0 or 'latest'",
                    code="INVALID_OPTION",
                )
            starting = int(raw_start)
        raw_timestamp = opts.get("startingtimestamp", "").strip() or None
        if raw_timestamp is not None:
            parse_timestamp_ms(raw_timestamp)
            if starting is not None:
                raise ConfigError(
                    f"options startingVersion={raw_start!r} and startingTimestamp={raw_timestamp!r} are both "
                    "set; a stream starts at one place: give only one of them",
                    code="INVALID_OPTION",
                )
        raw_as_of = opts.get("versionasof", "").strip()
        if raw_as_of and not (raw_as_of.isascii() and raw_as_of.isdigit()):
            raise ConfigError(f"option versionAsOf={raw_as_of!r} must be a version number >= 0", code="INVALID_OPTION")
        raw_after = opts.get("addedafterversion", "").strip()
        if raw_after and not (raw_after.isascii() and raw_after.isdigit()):
            raise ConfigError(
                f"option addedAfterVersion={raw_after!r} must be a version number >= 0", code="INVALID_OPTION"
            )
        prune = _parse_prune(opts)
        path = require_path(opts)
        storage_options = storage.from_spark_options(opts)
        if storage_options is not None:
            # Also for this process's path-only helpers (ensure_table, open_table).
            storage.register(path, storage_options)
        return cls(
            path=path,
            storage_options=storage_options,
            max_files_per_trigger=parse_positive_int(opts, "maxFilesPerTrigger"),
            max_bytes_per_trigger=parse_bytes(opts, "maxBytesPerTrigger"),
            max_rows_per_trigger=parse_positive_int(opts, "maxRowsPerTrigger"),
            ignore_deletes=parse_bool(opts, "ignoreDeletes"),
            skip_change_commits=parse_bool(opts, "skipChangeCommits"),
            skip_expired_by=_parse_expiry_column(opts),
            starting_version=starting,
            starting_timestamp=raw_timestamp,
            version_as_of=int(raw_as_of) if raw_as_of else None,
            added_after_version=int(raw_after) if raw_after else None,
            position_column=opts.get("sourcepositioncolumn", "").strip() or None,
            packed_column=opts.get("packedcolumn", "").strip() or None,
            read_partitions=parse_positive_int(opts, "readPartitions"),
            wake_on_start=parse_bool(opts, "wakeOnStart"),
            prune=prune,
            partition_filter=_parse_partition_filter(opts),
        )

    def kept(self, entries: Sequence[FileEntry]) -> list[FileEntry]:
        """``entries`` without the files :attr:`partition_filter` leaves out."""
        wanted = self.partition_filter
        if not wanted:
            return list(entries)
        return [
            e for e in entries
            if all(column not in e.partition_values or e.partition_values[column] in values for column, values in wanted.items())
        ]

    @property
    def starting_timestamp_ms(self) -> int | None:
        return None if self.starting_timestamp is None else parse_timestamp_ms(self.starting_timestamp)

    @property
    def rules(self) -> ChangeRules:
        return ChangeRules(ignore_deletes=self.ignore_deletes, skip_change_commits=self.skip_change_commits)

    def default_read_limit(self) -> ReadLimit:
        """Delta's default: ``maxBytesPerTrigger`` if set, else ``maxFilesPerTrigger`` (1000)."""
        if self.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.max_bytes_per_trigger)
        return ReadMaxFiles(self.max_files_per_trigger or DEFAULT_MAX_FILES_PER_TRIGGER)

    def admission(self, limit: ReadLimit) -> Admission:
        """Spark's limit for this batch; with both options set, whichever is hit first (as in Delta)."""
        rows = self.max_rows_per_trigger
        if isinstance(limit, ReadMaxFiles):
            return Admission(max_files=limit.max_files, max_bytes=self.max_bytes_per_trigger, max_rows=rows)
        if isinstance(limit, ReadMaxBytes):
            return Admission(max_files=self.max_files_per_trigger, max_bytes=limit.max_bytes, max_rows=rows)
        if not isinstance(limit, ReadAllAvailable):
            log.warning("%s: read limit %r is not supported; reading everything available", self.path, limit)
        return Admission()


def _parse_expiry_column(opts: Mapping[str, str]) -> str | None:
    """``skipExpiredBy``: one of the columns a row retention judges by (the cut a table records is
    by its own column, so a file is judged by no other: a message born long ago may be stored now)."""
    column = opts.get("skipexpiredby", "").strip() or None
    columns = sorted(set(EXPIRING_TABLES.values()))
    if column is not None and column not in columns:
        raise ConfigError(
            f"option skipExpiredBy={column!r} must be the column a table's row retention judges by, one of "
            f"{', '.join(columns)}",
            code="INVALID_OPTION",
        )
    return column


def _parse_partition_filter(opts: Mapping[str, str]) -> dict[str, frozenset[str]] | None:
    """``partitionFilter``: a JSON object of partition column -> list of values (text), or
    :class:`ConfigError` ``INVALID_OPTION``."""
    raw = opts.get("partitionfilter", "").strip()
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        parsed = None
    if (
        not isinstance(parsed, dict)
        or not parsed
        or not all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in parsed.values())
    ):
        raise ConfigError(
            f"option partitionFilter={raw[:200]!r} must be a JSON object of partition column -> list of values, "
            'e.g. {"consumer_group": ["G"]}',
            code="INVALID_OPTION",
        )
    return {str(column): frozenset(values) for column, values in parsed.items()}


def _parse_prune(opts: Mapping[str, str]) -> FilePrune | None:
    """``pruneColumn`` with ``pruneBefore`` (both or neither), or :class:`ConfigError` ``INVALID_OPTION``."""
    column = opts.get("prunecolumn", "").strip()
    before = opts.get("prunebefore", "").strip()
    if not column and not before:
        return None
    if not column or not before:
        raise ConfigError(
            f"options pruneColumn={column!r} and pruneBefore={before!r} go together: give both or neither",
            code="INVALID_OPTION",
        )
    try:  # in UTC, as the statistics are: an offset may take the time past the years a datetime holds
        at = parse_timestamp(before, name="pruneBefore").astimezone(dt.UTC)
    except OverflowError:
        raise ConfigError(f"option pruneBefore={before!r} is out of range", code="INVALID_OPTION") from None
    return FilePrune(column, stats_from(at))


# --------------------------------------------------------------------------- reading


class FilePartition(InputPartition):
    """Data files read one after the other, in stream order: the unit of work of a read task."""

    def __init__(self, files: Sequence[FileToRead]) -> None:
        super().__init__(tuple(f.path for f in files))
        self.files = tuple(files)

    @classmethod
    def of(cls, entries: Sequence[FileEntry], table_uri: str) -> FilePartition:
        """The partition reading ``entries``; a path outside the table fails here, on the driver."""
        files = []
        for entry in entries:
            relative_data_path(entry.path, table_uri)
            files.append(
                FileToRead(
                    path=entry.path,
                    partition_values=dict(entry.partition_values),
                    version=entry.version,
                    index=entry.index,
                    is_starting_version=entry.is_starting_version,
                )
            )
        return cls(files)


def plan_partitions(entries: Sequence[FileEntry], table_uri: str, most: int | None) -> list[FilePartition]:
    """``entries`` as read tasks: one per file, or with ``most`` (``readPartitions``) at most that many.

    Files go largest first to the task with the fewest bytes so far (ties: the earlier
    task), and each task reads its files in stream order. Without it a batch of many
    small files is as many tasks, each paying a Python worker's round trip: Spark's own
    file source packs files into about one task per core the same way.
    Replay: a pure function of the entries and ``most``.
    """
    if most is None or len(entries) <= most:
        return [FilePartition.of([e], table_uri) for e in entries]
    groups: list[list[int]] = [[] for _ in range(most)]
    lightest = [(0, task) for task in range(most)]  # (bytes so far, task): a heap
    for i in sorted(range(len(entries)), key=lambda i: (-max(entries[i].size, 0), i)):
        load, task = lightest[0]
        groups[task].append(i)
        heapq.heapreplace(lightest, (load + max(entries[i].size, 0) + _FILE_OPEN_COST, task))
    return [FilePartition.of([entries[i] for i in sorted(g)], table_uri) for g in groups]


# What opening a file costs a read task, in bytes of reading (Spark's spark.sql.files.openCostInBytes):
# a task of many empty files is not a light one.
_FILE_OPEN_COST = 4 * 1024 * 1024


def arrow_target(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects from ``read`` for ``schema``."""
    return to_arrow_schema(schema, timezone="UTC")


def row_schema(options: SourceOptions) -> StructType:
    """The table's schema (at ``versionAsOf`` if given), plus the position column if asked."""
    arrow = DeltaLog(options.location).arrow_schema(options.version_as_of)
    schema = from_arrow_schema(arrow, prefer_timestamp_ntz=True)
    if options.position_column:
        if options.position_column in schema.fieldNames():
            raise ConfigError(
                f"sourcePositionColumn={options.position_column!r} is already a column of {options.path}",
                code="INVALID_OPTION",
            )
        schema = StructType([*schema.fields, StructField(options.position_column, StringType(), False)])
    return schema


def packed_schema(column: str) -> StructType:
    """The schema of a ``packedColumn`` read: one binary column."""
    return StructType([StructField(column, BinaryType(), False)])


class _FileReading:
    """``read`` shared by the batch and stream readers (runs on executors).

    ``rows`` is the schema of the rows read: ``schema`` itself, or with
    ``packedColumn`` the schema packed inside each payload.
    """

    options: SourceOptions
    schema: StructType
    rows: StructType

    def _init_schemas(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.rows = row_schema(options) if options.packed_column else schema
        # A partition value is compared as the log's text, which is one text only for a text column
        # (a number or a time is written differently by different writers, and read back re-rendered).
        types = {f.name: f.dataType for f in self.rows.fields}
        for column in options.partition_filter or {}:
            if column in types and not isinstance(types[column], StringType):
                raise ConfigError(
                    f"option partitionFilter names {column!r}, a {types[column].simpleString()} column: it filters "
                    "text partition columns only; filter the rows instead",
                    code="INVALID_OPTION",
                )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        settle()
        if type(partition) is InputPartition and partition.value is None:
            # A snapshot without data files: Spark plans one placeholder partition for it.
            return
        if not isinstance(partition, FilePartition):
            raise DeltaSourceError(f"unexpected input partition {partition!r}", code="DELTA_PARTITION_INVALID")
        fs, root = self.options.location.filesystem()
        target_rows = arrow_target(self.rows)
        column = self.options.skip_expired_by
        reading = (
            read_file if column is None
            else functools.partial(_read_unless_expired, ExpiryJudge(self.options.location, column))
        )
        batches = (
            batch
            for file in partition.files
            for batch in reading(
                fs,
                root,
                file,
                target_rows,
                table_uri=self.options.path,
                position_column=self.options.position_column,
            )
        )
        packed = self.options.packed_column
        if packed is None:
            yield from batches
            return
        target = arrow_target(self.schema)
        for batch in batches:
            payloads = ipc_array(ipc_slices(batch, max_rows=batch.num_rows, max_bytes=PACKED_MAX_BYTES))
            yield pa.RecordBatch.from_arrays([payloads], schema=target)


class DeltaStreamReader(_FileReading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streams a Delta table's data files in commit order (driver side plans, executors read).

    Replay: ``partitions(start, end)`` lists the same files for the same
    offsets; ``read`` yields the same rows in the same order.
    """

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        if options.prune is not None:
            raise ConfigError(
                "options pruneColumn and pruneBefore are for a batch read (spark.read): a stream reads every "
                "file it is given",
                code="INVALID_OPTION",
            )
        if options.added_after_version is not None:
            raise ConfigError(
                "option addedAfterVersion is for a batch read (spark.read): a stream starts with startingVersion",
                code="INVALID_OPTION",
            )
        self._init_schemas(options, schema)
        self._available_now_version: int | None = None
        self._log: DeltaLog | None = None
        self._reservoir_id: str | None = None
        # The table's latest version as last read (-1: not yet): offsets within it need no new read.
        self._latest_seen = -1
        self._initial: dict[str, Any] | None = None
        self._woken = not options.wake_on_start

    def __getstate__(self) -> dict[str, Any]:
        # Executors only need options and schema; delta-rs handles do not pickle.
        state = self.__dict__.copy()
        state["_log"] = None
        return state

    @property
    def delta_log(self) -> DeltaLog:
        if self._log is None:
            self._log = DeltaLog(self.options.location)
            self._reservoir_id = self._log.table_id()
        return self._log

    def _check_reservoir(self, offset: Offset) -> None:
        _ = self.delta_log
        if offset.reservoir_id is not None and offset.reservoir_id != self._reservoir_id:
            raise DeltaSourceError(
                f"the Delta table at {self.options.path} is now table {self._reservoir_id}, but the "
                f"checkpoint read table {offset.reservoir_id}: the table was deleted and re-created, or the "
                "checkpoint belongs to a stream of another table (two engines or lakes given one "
                "engine.checkpoint?). Give each stream its own checkpoint; for a re-created table, start "
                "from a new checkpoint",
                code="DELTA_TABLE_ID_CHANGED",
            )

    def _latest_version(self) -> int:
        self._latest_seen = self.delta_log.latest_version()
        return self._latest_seen

    def _check_within_table(self, *offsets: Offset) -> None:
        """``DELTA_OFFSET_INVALID`` for an offset past what the table can have (see ``within_table``).

        Free when the latest version already read covers the offsets (every
        offset this reader made): the table is read again only for one past it.
        """
        for offset in offsets:
            if not within_table(offset, self._latest_seen):
                require_within_table(offset, self._latest_version(), table=self.options.path)

    def initialOffset(self) -> dict[str, Any]:
        """Before the snapshot at the latest version, or before ``startingVersion``'s commit.

        Computed once per reader: Spark asks again when it plans the first
        batch, and a table that gained commits in between must not move the
        start past the files of the first batch (they would be skipped).
        """
        if self._initial is None:
            self._initial = self._initial_offset()
        return self._initial

    def _initial_offset(self) -> dict[str, Any]:
        delta_log = self.delta_log
        start = self.options.starting_version
        timestamp_ms = self.options.starting_timestamp_ms
        if timestamp_ms is not None:
            # Delta: every commit at or after the time, from its changes (not a snapshot).
            option = f"startingTimestamp={self.options.starting_timestamp!r}"
            version = delta_log.first_version_at_or_after(timestamp_ms, option=option)
            offset = Offset(version, -1, False, self._reservoir_id)
        elif start is None:
            offset = Offset(self._latest_version(), -1, True, self._reservoir_id)
        elif start == "latest":
            offset = Offset.after_version(self._latest_version(), self._reservoir_id)
        else:
            latest = self._latest_version()
            if start > latest + 1:
                raise DeltaSourceError(
                    f"startingVersion={start} but {self.options.path} is at version {latest}",
                    code="DELTA_STARTING_VERSION_INVALID",
                )
            offset = Offset(start, -1, False, self._reservoir_id)
        log.info("%s: stream starts at %s", self.options.path, offset.to_json())
        return offset.to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.options.default_read_limit()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_version = self._latest_version()
        log.info("%s: Trigger.AvailableNow reads through version %d", self.options.path, self._available_now_version)

    def _on_commit(self, commit: Commit) -> None:
        if commit.metadata is not None and commit.metadata.get("schemaString"):
            skip = [self.options.position_column] if self.options.position_column else []
            check_stream_schema(
                self.options.path, commit.version, str(commit.metadata["schemaString"]), arrow_target(self.rows), skip
            )

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next micro-batch: as many files after ``start`` as ``limit`` admits."""
        begin = Offset.from_json(start)
        self._check_reservoir(begin)
        delta_log = self.delta_log
        until = self._available_now_version
        if until is None:
            until = self._latest_version()
        # A start past the table's log would return itself forever (a stream stalled without a word).
        self._check_within_table(begin)
        files = files_after(delta_log, begin, through_version=until, rules=self.options.rules, on_commit=self._on_commit)
        end = end_offset(files, begin, until_version=until, admission=self.options.admission(limit))
        # A new query (it starts at initialOffset) has no state to wake: only a restarted one does.
        wake = not self._woken and end.key == begin.key and start != self._initial
        self._woken = True
        if end.key != begin.key and start == self._initial:
            # The query's first batch: Spark logs only its end, and asks initialOffset()
            # anew if it must run it again after a restart (see replay_start).
            end = end.starting_from(begin)
        if not wake:
            return end.to_json()
        # Nothing new: ``end`` is ``start``, without where a first batch started (this one reads nothing).
        end = Offset(end.version, end.index, end.is_starting_version, end.reservoir_id)
        return {**end.to_json(), WAKE: _next_wake(start)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One partition per file in ``(start, end]``, in stream order.

        Replayed: the same files, also for batch 0 after a restart (see ``replay_start``).
        """
        finish = Offset.from_json(end)
        begin = replay_start(Offset.from_json(start), finish)
        self._check_reservoir(finish)
        self._check_within_table(finish, begin)
        files = self.options.kept(
            files_between(self.delta_log, begin, finish, rules=self.options.rules, on_commit=self._on_commit)
        )
        log.debug("%s: batch %s -> %s has %d files", self.options.path, start, end, len(files))
        return plan_partitions(files, self.options.path, self.options.read_partitions)

    def commit(self, end: dict[str, Any]) -> None:
        log.debug("%s: source committed through %s", self.options.path, end)

    def stop(self) -> None:
        """Called by PySpark's stream-source runner process (driver side) when its loop ends.

        The loop ends with an ``EOFError`` when the query stops: the JVM hangs
        up (or a ``ConnectionResetError``, when the JVM's side closed with
        unread data and the kernel reset the connection: CI, 2026-11-26). The
        runner then reports that error over the closed socket and dies
        printing a BrokenPipeError traceback on stderr after every clean
        stop. Then (and only then) this process's last uncaught hang-up error
        is not printed; any other error is still reported and printed.
        """
        self._log = None
        if isinstance(sys.exc_info()[1], HANGUP_ERRORS):
            sys.excepthook = _quiet_after_hangup(sys.excepthook)


HANGUP_ERRORS = (EOFError, BrokenPipeError, ConnectionResetError)

# The offset key ``wakeOnStart`` counts in; offsets read it as nothing (the same position).
WAKE = "wake"


def _read_unless_expired(
    judge: ExpiryJudge, fs: Any, root: str, file: FileToRead, target: pa.Schema, **kwargs: Any
) -> Iterator[pa.RecordBatch]:
    """:func:`read_file`, or nothing for a file gone past the table's row retention (``skipExpiredBy``)."""
    batches = read_file(fs, root, file, target, **kwargs)
    try:
        first = next(batches)  # the file is opened here
    except StopIteration:
        return
    except DeltaSourceError as exc:
        if exc.code != "DELTA_FILE_MISSING":
            raise
        gone = judge.expired(file.path, file.version, from_snapshot=file.is_starting_version)
        if gone is None:
            raise
        log.warning(
            "%s: data file %s (version %d, %s rows) is gone and every row of it was %s before %s, the "
            "table's row retention cut: skipped, as a RocketMQ consumer behind the commit log's retention "
            "misses what it deleted", judge.location.uri, file.path, file.version,
            "?" if gone.rows is None else gone.rows, judge.column, gone.cut.isoformat(),
        )
        return
    yield first
    yield from batches


def _next_wake(offset: Mapping[str, Any]) -> int:
    """A wake count that differs from ``offset``'s, whatever a checkpoint holds there."""
    value = offset.get(WAKE)
    count = (value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0) + 1
    return count + 1 if value == count else count  # True == 1 and 1.0 == 1 in Python


def _quiet_after_hangup(previous: Callable[..., Any]) -> Callable[..., Any]:
    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> Any:
        if issubclass(kind, HANGUP_ERRORS):
            return None
        return previous(kind, value, tb)

    return hook


class DeltaBatchReader(_FileReading, DataSourceReader):
    """Reads the snapshot at ``versionAsOf`` (default: the latest version), one task per file; with
    ``addedAfterVersion``, only its files added after that version (a commit gone from the log since:
    ``DELTA_COMMIT_MISSING``)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self._init_schemas(options, schema)

    def partitions(self) -> Sequence[InputPartition]:
        delta_log = DeltaLog(self.options.location)
        version = self.options.version_as_of
        if version is None:
            version = delta_log.latest_version()
        entries = delta_log.snapshot(version, self.options.prune)
        after = self.options.added_after_version
        if after is not None:
            added = delta_log.added_after(after, version)
            entries = [e for e in entries if relative_data_path(e.path, delta_log.uri) in added]
        return plan_partitions(self.options.kept(entries), self.options.path, self.options.read_partitions)
