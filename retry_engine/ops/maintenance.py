"""Table maintenance: compaction, log checkpoints, log cleanup and vacuum (#14).

Every micro-batch adds a commit and a few small files to each output table,
and producers do the same to consume_results; nothing else ever tidies them,
so every reader slows down with age. :func:`maintain_table` does, per table,
what Delta's own maintenance does:

1. compact small files (delta-rs ``optimize.compact()``): one commit that
   removes the small files and adds their rows in bigger ones, both with
   ``dataChange=false``, so a streaming reader (the ``deltars`` source, Delta's
   own) skips it and never sees a row twice. A concurrent append does not
   conflict with it; any other conflict (a re-drive rewriting the DLQ, say) is
   retried on a fresh snapshot, a few times, then reported, never fatal;
2. write a log checkpoint (``create_checkpoint``), so a reader loads the table
   from one Parquet file instead of replaying every JSON commit;
3. clean expired log files (``cleanup_metadata``): only commits before that
   checkpoint and older than the table's ``delta.logRetentionDuration`` (30
   days unless set) go. Only where the table's writers are told not to
   (``delta.enableExpiredLogCleanup = false``): by default (Delta's, delta-rs's
   and Spark's) every writer cleans the log itself when it writes a
   checkpoint, and two cleaners at once make delta-rs fail on the file the
   other one deleted first, in the writer's case *after* its commit landed (a
   producer that retries then appends its rows twice). See
   :func:`writers_clean_log`;
4. vacuum data files that no version since ``retention`` references (Delta's
   "lite" vacuum: the files whose removes the log still holds), then the data
   files no version names at all that were written more than ``retention`` ago
   (:func:`unreferenced_files`): delta-rs's checkpoints drop a remove older than
   the table's ``delta.deletedFileRetentionDuration`` (7 days, Delta's default
   retention too), so without that second pass a replaced file was never
   deleted; a file written and not committed yet (a running batch's, the
   lake's recorded batch a roll-forward commits) is never touched, nor a
   folder that is not one of the table's partitions.

Before those, the progress table (a row a micro-batch, 2.6 million a month at
a 1 s trigger) and the metrics table lose their rows older than ``[maintenance]
progress_retention`` / ``metrics_retention`` (:func:`expire_rows`): whole files
whose statistics say every row is older, in one commit of removes; a file with
a newer row, a row without a time, or no statistics stays until a later run
can tell. The metrics table first gets a row saying so (:data:`EXPIRED_METRIC`):
the plots' running sums then know the table no longer starts at the lake's start.
The outcomes, retry and messages tables do the same when asked
(``outcomes_retention``, ``retry_retention``, ``messages_retention``, off by
default); the ledger's two cut from the last recorded batch (:func:`ledger_shift`), and
the three record their cut (:func:`expired_before`): the ledger's readers and the
topics' streams (``skipExpiredBy``) know which rows may be gone.

:func:`run_maintenance` does that for the tables the engine owns and for
consume_results (``retry-engine maintain``), and records what it did in the
lake's ``_maintenance`` table (:data:`~retry_engine.schemas.MAINTENANCE`).
:class:`EngineMaintenance` runs it inside a running engine, on a driver thread,
between batches (``[maintenance]`` in the config).

Spark-free: plain delta-rs.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import posixpath
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal, TypeVar
from urllib.parse import quote, unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, WriterProperties
from deltalake.exceptions import CommitFailedError

from retry_engine.config import (
    EngineConfig,
    minimum_retention_hours,
    parse_retention_hours,
)
from retry_engine.core.lease import read_state
from retry_engine.core.metrics import EXPIRED as EXPIRED_METRIC
from retry_engine.core.names import (
    ENGINE_TABLES,
    EXPIRING_TABLES,
    INPUT_TABLES,
    MAINTAINED_TABLES,
    TABLE_NAMES,
)
from retry_engine.delta._files import (
    ROW_GROUP_ROWS,
    FileToRead,
    PartitionedWriter,
    WrittenFile,
    delete_quietly,
    delete_written,
    hive_escape,
    read_file,
)
from retry_engine.delta._log import (
    EXPIRED_BEFORE_APP,
    LOG_DIR,
    FileEntry,
    add_actions,
    check_table_protocol,
    commit_lines,
    data_file_path,
    expired_before,
    file_entries,
    join_path,
    relative_data_path,
    snapshot_files,
    zoned_time,
)
from retry_engine.delta.sink import delete_uncommitted
from retry_engine.delta.storage import filesystem, location, log_failure, open_delta, write_delta
from retry_engine.delta.tables import (
    EXPIRED_LOG_CLEANUP,
    append_arrow,
    commit_next,
    ensure_table,
    open_table,
    stats_from,
    writers_clean_log,
)
from retry_engine.errors import ConfigError, DeltaSourceError
from retry_engine.schemas import MAINTENANCE, MESSAGES, METRICS, OUTCOMES, RETRY

log = logging.getLogger(__name__)

MAINTENANCE_DIR = "_maintenance"
# The lake's maintenance record (``_maintenance``) gets a commit per run: every run that
# maintains an engine table maintains the record too, under this name in its report.
RECORD_TABLE = MAINTENANCE_DIR
# A compaction that lost its commit to a writer that changed the same files is redone on
# a fresh snapshot this many times (appends never conflict with it).
COMPACT_ATTEMPTS = 10
# Row groups of a compacted file: as the engine writes them (delta-rs's default is a million rows).
# Rows stay in the order of the files compacted, so a row group spans a stretch of time, and reads
# bounded in time (`status`'s window, a re-drive's dead letters) skip the others by their statistics.
COMPACTED_ROW_GROUP_ROWS = ROW_GROUP_ROWS
# The in-engine thread looks whether maintenance is due at least this often.
POLL_SECONDS = 1.0
# The tables of the engine's ledger: their row retention cuts from the lake's last recorded batch (ledger_shift).
LEDGER_TABLES = (OUTCOMES.name, RETRY.name)
# Tables whose expiry commits its cut (expired_before): the ledger's, whose readers count a retry due
# before it without its row as released, and the topics, whose streams skip a file gone past it.
STAMPED_TABLES = (*LEDGER_TABLES, MESSAGES.name)
# Columns whose every value must be before the cut too (nulls allowed): a waiting retry keeps its outcome row.
EXPIRE_ALSO: dict[str, tuple[str, ...]] = {OUTCOMES.name: ("due_at",)}
EXPIRE_OPERATION = "EXPIRE ROWS"
# A table with a row retention is compacted by windows of time (TimeWindow): this many windows a retention,
# none shorter than an hour. Delta's default target file size otherwise.
COMPACTION_WINDOWS = 24
MIN_COMPACTION_WINDOW = dt.timedelta(hours=1)
DEFAULT_TARGET_FILE_SIZE = 100 * 1024 * 1024
COMPACT_OPERATION = "OPTIMIZE"
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# The characters delta-rs leaves as they are when it writes a path into the log (measured on 1.6: RFC 3986's
# sub-delimiters but '*', and '@' and ':'), besides letters, digits and "_.-~".
DELTA_RS_PATH_SAFE = "/=!$&'()+,:;@"

Trigger = Literal["command", "engine"]
_T = TypeVar("_T")


def maintenance_path(lake: str) -> str:
    """Where the lake's maintenance record table lives."""
    return (
        os.path.join(lake, MAINTENANCE_DIR)
        if "://" not in lake
        else f"{lake.rstrip('/')}/{MAINTENANCE_DIR}"
    )


@dataclass(frozen=True)
class TableReport:
    """What maintenance did to one table (or, in a dry run, would do)."""

    table_name: str
    table_path: str
    version_before: int | None = None
    version_after: int | None = None
    files_before: int | None = None
    files_after: int | None = None
    bytes_before: int | None = None
    bytes_after: int | None = None
    files_compacted: int = 0
    files_written: int = 0
    checkpoint_version: int | None = None
    log_files_before: int | None = None
    log_files_after: int | None = None
    files_vacuumed: int = 0
    files_expired: int = 0
    """Files removed because every row was older than the table's row retention (progress only)."""
    rows_expired: int = 0
    error: str | None = None

    @property
    def missing(self) -> bool:
        """No table at the path (nothing was done)."""
        return self.version_before is None and self.error is None


@dataclass(frozen=True)
class _Snapshot:
    version: int
    files: int
    bytes: int
    log_files: int


def _snapshot(path: str, table: DeltaTable) -> _Snapshot:
    actions = add_actions(table)
    sizes = actions.column("size_bytes").to_pylist() if actions.num_rows else []
    return _Snapshot(table.version(), actions.num_rows, int(sum(sizes)), _log_entries(path))


def _log_entries(path: str) -> int:
    """Entries of the table's ``_delta_log`` (commits, checkpoints, ``_last_checkpoint``), local or remote."""
    fs, root = filesystem(path)
    infos = fs.get_file_info(pafs.FileSelector(join_path(root, LOG_DIR), allow_not_found=True))
    return sum(1 for info in infos if info.type == pafs.FileType.File)


# A size as Spark reads one (``byteFromString``): bytes, or with a unit such as ``128mb``.
_BYTES = re.compile(r"\s*([0-9]{1,19})\s*([bkmgt]b?)?\s*", re.IGNORECASE)
_BYTE_UNITS = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _target_size(table: DeltaTable) -> int:
    """The table's ``delta.targetFileSize`` in bytes; Delta's default for a value that is no positive whole
    number of bytes (another writer's property: a compaction must not stop on it)."""
    value = table.metadata().configuration.get("delta.targetFileSize")
    if value is None:
        return DEFAULT_TARGET_FILE_SIZE
    match = _BYTES.fullmatch(value)
    if match is not None and 0 < (size := int(match[1]) * _BYTE_UNITS[(match[2] or "b").lower()[0]]) < 2**63:
        return size
    log.warning("%s: delta.targetFileSize %r is no size in bytes; compacted to %d bytes",
                table.table_uri, value[:100], DEFAULT_TARGET_FILE_SIZE)
    return DEFAULT_TARGET_FILE_SIZE


def _small_files_to_compact(table: DeltaTable, window: TimeWindow | None = None) -> int:
    """Files a compaction would rewrite: partitions (and with ``window``, windows of time) holding two or
    more files under the target size."""
    if window is not None:
        return sum(len(files) for files in _windowed_bins(table, window))
    target = _target_size(table)
    by_partition: dict[tuple[tuple[str, Any], ...], int] = {}
    for entry in snapshot_files(table, table.version()):
        if entry.size < target:
            key = tuple(sorted(entry.partition_values.items()))
            by_partition[key] = by_partition.get(key, 0) + 1
    return sum(n for n in by_partition.values() if n > 1)


@dataclass(frozen=True)
class TimeWindow:
    """Compaction of a table with a row retention: files are merged only with files whose newest
    ``column`` value falls in the same ``width`` of time (:func:`compaction_window`)."""

    column: str
    width: dt.timedelta


def compaction_window(retention: dt.timedelta, column: str) -> TimeWindow:
    """The :class:`TimeWindow` of a table kept ``retention``: a 24th of it, at least an hour.

    Delta's OPTIMIZE merges every file under the target size, the file it wrote last run included:
    a table with less than the target size (100 MB) of rows would become one file holding its
    first row and its newest, which no retention ever removes whole. Merged by window, a
    compacted file spans about a window, and goes at most a window after its oldest rows' time.
    """
    return TimeWindow(column, max(retention / COMPACTION_WINDOWS, MIN_COMPACTION_WINDOW))


def _windowed_bins(table: DeltaTable, window: TimeWindow) -> list[list[FileEntry]]:
    """The groups of files one windowed compaction writes a file of each: of one partition and one
    window of newest ``column`` (files without that statistic: a group of their own), under the target
    size, two or more, in stream order, each group at most the target size."""
    actions = add_actions(table)
    if not actions.num_rows:
        return []
    target = _target_size(table)
    stat = f"max.{window.column}"
    newest: list[Any] = (
        actions[stat].to_pylist()
        if stat in actions.column_names and zoned_time(actions[stat].type)
        else [None] * actions.num_rows
    )
    width_us = window.width // dt.timedelta(microseconds=1)
    slot = {
        path: None if at is None else (at - EPOCH) // dt.timedelta(microseconds=1) // width_us
        for path, at in zip(actions["path"].to_pylist(), newest, strict=True)
    }
    groups: dict[tuple[Any, ...], list[FileEntry]] = {}
    for entry in file_entries(actions, table.version()):
        # Only a path in the form delta-rs writes a remove in: another writer's other form (raw unicode,
        # lowercase escapes) would leave the file in the table beside its rewrite.
        if entry.size < target and quote(unquote(entry.path), safe=DELTA_RS_PATH_SAFE) == entry.path:
            key = (tuple(sorted(entry.partition_values.items())), slot[entry.path])
            groups.setdefault(key, []).append(entry)
    bins: list[list[FileEntry]] = []
    for files in groups.values():
        current: list[FileEntry] = []
        size = 0
        for entry in files:
            if current and size + entry.size > target:
                bins.append(current)
                current, size = [], 0
            current.append(entry)
            size += entry.size
        bins.append(current)
    return [b for b in bins if len(b) > 1]


def _compact_windowed(path: str, window: TimeWindow) -> tuple[int, int]:
    """Compact ``path`` by :class:`TimeWindow` (files removed, files added): a rewrite committed with
    ``dataChange=false`` as Delta's OPTIMIZE.

    When another writer committed since the plan, the rewrite still holds if every file it replaces
    is still in the table (the others appended: the commit is made again on their version), and is
    redone on a fresh snapshot if not (they removed one: an expiry, a delete, another compaction).
    """
    fs, root = filesystem(path)
    for attempt in range(1, COMPACT_ATTEMPTS + 1):
        table = open_delta(path)
        if not _rewritable(path, table):
            return _compact(path)
        bins = _windowed_bins(table, window)
        if not bins:
            return 0, 0
        removed = [entry for files in bins for entry in files]
        written = _rewrite(fs, root, path, table, bins)
        try:
            for _ in range(COMPACT_ATTEMPTS):
                try:
                    commit_next(table, removed, written, data_change=False, operation=COMPACT_OPERATION)
                    return len(removed), len(written)
                except CommitFailedError as exc:
                    table = open_delta(path)
                    if not _rewritable(path, table) or not _still_there(table, removed):
                        log.warning("%s: compaction lost a file it rewrote to another commit (attempt %d): %s",
                                    path, attempt, exc)
                        break
                    log.info("%s: appended to while compacting; the compaction commits after it", path)
        except BaseException:
            delete_uncommitted(location(path), written)
            raise
        delete_uncommitted(location(path), written)
    raise CommitFailedError(f"compaction of {path} conflicted {COMPACT_ATTEMPTS} times with other writers")


def _rewritable(path: str, table: DeltaTable) -> bool:
    """Whether the windowed rewrite may read the table's files as they are: not with deletion vectors or
    column mapping (another writer's table), which delta-rs's OPTIMIZE then handles or refuses."""
    try:
        check_table_protocol(path, table)
    except DeltaSourceError as exc:
        log.info("%s: compacted by Delta's OPTIMIZE, not by windows of time: %s", path, exc)
        return False
    return True


def _still_there(table: DeltaTable, removed: Sequence[FileEntry]) -> bool:
    """Every file a rewrite replaces is still in ``table`` (same path and size): the commits since only
    added files. (A deletion vector since needs the reader feature :func:`_rewritable` refuses.)"""
    actions = add_actions(table)
    live = dict(zip(actions["path"].to_pylist(), actions["size_bytes"].to_pylist(), strict=True))
    return all(live.get(e.path) == e.size for e in removed)


def _rewrite(
    fs: pafs.FileSystem, root: str, path: str, table: DeltaTable, bins: Sequence[Sequence[FileEntry]]
) -> list[WrittenFile]:
    """One new file per bin holding its files' rows in stream order (row groups of
    :data:`COMPACTED_ROW_GROUP_ROWS`, ZSTD as delta-rs compacts); nothing left behind if it fails."""
    schema = pa.schema(table.schema().to_arrow())
    partition_by = list(table.metadata().partition_columns)
    written: list[WrittenFile] = []
    try:
        for files in bins:
            writer = PartitionedWriter(
                fs, root, schema, partition_by=partition_by, uri=path,
                row_group_rows=COMPACTED_ROW_GROUP_ROWS, compression="zstd",
            )
            try:
                for entry in files:
                    for batch in read_file(fs, root, _to_read(entry), schema, table_uri=path):
                        writer.write(batch)
                written.extend(writer.close())
            except BaseException:
                writer.discard()
                raise
    except BaseException:
        delete_written(fs, root, written)
        raise
    return written


def _to_read(entry: FileEntry) -> FileToRead:
    return FileToRead(entry.path, entry.partition_values, entry.version, entry.index, entry.is_starting_version)


def _compact(path: str) -> tuple[int, int]:
    """Compact ``path`` (files removed, files added), retried on a conflicting commit."""
    for attempt in range(1, COMPACT_ATTEMPTS + 1):
        try:
            metrics = open_delta(path).optimize.compact(
                # Given writer properties, delta-rs no longer compresses by default (ZSTD level 4): said here.
                writer_properties=WriterProperties(
                    max_row_group_size=COMPACTED_ROW_GROUP_ROWS, compression="ZSTD", compression_level=4
                )
            )
            return int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))
        except CommitFailedError as exc:
            # Another writer changed files this compaction read: redo it on the new snapshot.
            log.warning(
                "%s: compaction conflicted with another commit (attempt %d): %s", path, attempt, exc
            )
    raise CommitFailedError(
        f"compaction of {path} conflicted {COMPACT_ATTEMPTS} times with other writers"
    )


def expiring_files(
    table: DeltaTable, column: str, before: dt.datetime, *, also: Sequence[str] = ()
) -> tuple[list[Any], int]:
    """The files of ``table`` whose every ``column`` value is before ``before`` (statistics), and their rows.

    Only a file whose statistics give a zoned time maximum, no null in the
    column and a row count: anything else might hold a row to keep. ``also``:
    columns whose every value must be before ``before`` too, nulls allowed (the
    outcomes' ``due_at``: a retry still waiting keeps its outcome row).
    """
    actions = add_actions(table)
    latest, nulls = f"max.{column}", f"null_count.{column}"
    if not actions.num_rows or {latest, nulls, "num_records"} - set(actions.column_names):
        return [], 0
    if not zoned_time(actions[latest].type):
        return [], 0
    # A maximum kept to the millisecond (cut down) a millisecond before ``before`` may be a row at it.
    old = pc.and_(
        pc.less(actions[latest], pa.scalar(stats_from(before), actions[latest].type)),
        pc.and_(pc.equal(actions[nulls], 0), pc.is_valid(actions["num_records"])),
    )
    for other in also:
        most, none, rows = f"max.{other}", f"null_count.{other}", actions["num_records"]
        if {most, none} - set(actions.column_names) or not zoned_time(actions[most].type):
            return [], 0
        # Before the cut, or a file with no value in the column at all (its maximum is then null).
        under = pc.less(actions[most], pa.scalar(stats_from(before), actions[most].type))
        old = pc.and_(old, pc.fill_null(pc.or_kleene(under, pc.equal(actions[none], rows)), False))
    chosen = actions.filter(pc.fill_null(old, False))
    return file_entries(chosen, table.version()), int(pc.sum(chosen["num_records"]).as_py() or 0)


def _moved_back(cut: dt.datetime, shift: dt.timedelta | None) -> dt.datetime | None:
    """The ledger's cut moved back by ``shift``; None (no ledger cut this run) without a shift, or past the
    calendar (a batch another writer recorded in year 1)."""
    if shift is None:
        return None
    try:
        return cut - shift
    except OverflowError:
        return None


def _markers_only(table: DeltaTable, files: Sequence[FileEntry]) -> bool:
    """Whether every row of ``files`` (of the metrics table) is an :func:`expired_marker`, by statistics."""
    actions = add_actions(table)
    if {"min.metric", "max.metric"} - set(actions.column_names):
        return False
    paths = {f.path for f in files}
    chosen = actions.filter(pc.is_in(actions["path"], pa.array(sorted(paths), actions["path"].type)))
    return all(lo == hi == EXPIRED_METRIC for lo, hi in zip(chosen["min.metric"].to_pylist(),
                                                            chosen["max.metric"].to_pylist(), strict=True))


def ledger_shift(config: EngineConfig, *, run_at: dt.datetime) -> dt.timedelta | None:
    """How far back the row retention of the ledger's tables (outcomes, retry) moves its cut: the time
    since the lake's last recorded batch (None: no cut this run; no batch recorded with its time yet, or
    the engine state is unreadable).

    The lake counts a retry as pending while its outcome row has no ``%RETRY%G``
    row, and a new checkpoint refuses to drop pending retries unseen
    (:func:`~retry_engine.ops.status.lake_counts`). Every retry due by the last
    recorded batch's time was released by it (the record comes a batch's duration
    later, and the cut at least a day before it): a retry still waiting is due
    after the cut. So an outcome row that goes (decided and due before the cut,
    :data:`EXPIRE_ALSO`) is of a retry released, whatever the delays were; and a
    retry row that goes was delivered before the cut, which the retry table keeps
    (:func:`expired_before`): a retry due before it whose row is missing was
    released (:func:`~retry_engine.ops.status.released_horizon`). Heartbeats do
    not count: a stuck engine's, or a new engine's first, releases nothing.
    """
    try:
        state = read_state(config.engine.lake)
    except Exception as exc:  # the next run looks again
        log_failure(log, f"lake {config.engine.lake}: no ledger row retention this run (engine state unreadable)", exc)
        return None
    last = state.last_batch if state is not None else None
    if last is None or last.recorded_at is None:
        log.info("lake %s: no ledger row retention until a batch is recorded with its time", config.engine.lake)
        return None
    return max(run_at - last.recorded_at, dt.timedelta(0))


def expired_marker(before: dt.datetime, rows: int) -> pa.Table:
    """The METRICS row written before its rows up to ``before`` are removed: metric
    :data:`EXPIRED_METRIC` at ``before``, ``value`` the rows planned to go."""
    row = {**dict.fromkeys(METRICS.names), "batch_id": -1, "batch_time": before, "metric": EXPIRED_METRIC,
           "value": float(rows)}
    return pa.Table.from_pylist([row], schema=METRICS.arrow_schema)


def _expirable(path: str, table: DeltaTable) -> DeltaTable:
    """``table``, unless its files hold rows other than a plain read finds (deletion vectors: a remove of
    such a file without its vector removes nothing) or name columns otherwise (column mapping)."""
    try:
        check_table_protocol(path, table)
    except DeltaSourceError as exc:
        raise DeltaSourceError(f"row expiry leaves {path} alone: {str(exc).split('] ', 1)[-1]}", code=exc.code) from None
    return table


def expire_rows(
    path: str,
    column: str,
    before: dt.datetime,
    *,
    marked: bool = False,
    also: Sequence[str] = (),
    stamped: bool = False,
) -> tuple[int, int]:
    """Remove the files of ``path`` whose rows are all before ``before`` by ``column`` (and by
    ``also``, see :func:`expiring_files`): (files, rows).

    ``marked`` (the metrics table): when there is any, first append :func:`expired_marker`, so a
    reader that sees rows gone sees the marker too. ``stamped`` (:data:`STAMPED_TABLES`): the commit also
    sets the table's :func:`expired_before` to ``before`` (never back), so a reader knows which
    retries' rows may be gone, that the tables no longer hold every row counted, and which files a
    stream behind the retention may find gone (the source's ``skipExpiredBy``).

    One commit of removes (``dataChange=true``: the rows are gone, as after a
    delete; a stream reading the table needs ``ignoreDeletes``), as the version
    after the one planned from (:func:`~retry_engine.delta.tables.commit_next`):
    any commit in between (an append, a compaction) makes it plan again.
    """
    if marked:
        table = _expirable(path, open_delta(path))
        files, rows = expiring_files(table, column, before, also=also)
        # The last run's marker is itself before this cut: alone (compacted by windows, it is a file of its
        # own), it goes with the next rows that go, not by itself with a new marker each run.
        if not files or _markers_only(table, files):
            return 0, 0
        append_arrow(path, expired_marker(before, rows))
    for attempt in range(1, COMPACT_ATTEMPTS + 1):
        table = _expirable(path, open_delta(path))
        files, rows = expiring_files(table, column, before, also=also)
        if not files:
            return 0, 0
        stamp = None
        if stamped:
            known = expired_before(table)
            stamp = (EXPIRED_BEFORE_APP, int(max(before, known or before).timestamp() * 1000))
        try:
            commit_next(table, files, data_change=True, operation=EXPIRE_OPERATION, app_transaction=stamp)
            return len(files), rows
        except CommitFailedError as exc:
            log.warning("%s: row expiry conflicted with another commit (attempt %d): %s", path, attempt, exc)
    raise CommitFailedError(f"row expiry of {path} conflicted {COMPACT_ATTEMPTS} times with other writers")


# Two cleaners at once (a `maintain` next to the engine's own maintenance) make delta-rs fail on
# the file the other deleted first, sometimes both of them; each retry lists what is left. Two
# cleaners retrying in step kept colliding: on a loaded machine both used up 5 attempts on one
# table in 1 of 30 and 2 of 40 races of two (a CI run failed on it); a random pause before each retry,
# growing with the attempt, lets one get ahead (0 of 80 with it).
CLEAN_LOG_ATTEMPTS = 10
CLEAN_LOG_PAUSE_S = 0.02


def clean_log(path: str) -> None:
    """Remove the table's expired log files (``cleanup_metadata``).

    A file another cleaner removed first (``FileNotFoundError``) is not an
    error: the cleanup starts again on what is left, up to :data:`CLEAN_LOG_ATTEMPTS` times.
    """
    for attempt in range(1, CLEAN_LOG_ATTEMPTS + 1):
        try:
            open_delta(path).cleanup_metadata()
            return
        except FileNotFoundError as exc:
            if attempt == CLEAN_LOG_ATTEMPTS:
                raise
            log.info("%s: another cleaner removed a log file first (%s); cleaning what is left", path, exc)
            time.sleep(random.uniform(0, CLEAN_LOG_PAUSE_S * attempt))


# A file no version names is vacuumed only when written at least this long ago, whatever the retention
# (`--force` allows 0h): no write takes that long between its files and its commit.
UNNAMED_MIN_AGE = dt.timedelta(days=1)
# Delta's default ``delta.deletedFileRetentionDuration``: how long a checkpoint keeps a remove (tombstone).
DEFAULT_TOMBSTONE_RETENTION = dt.timedelta(days=7)
# As delta-rs reads it (lowercase only: it takes any other spelling, Spark's "INTERVAL 14 DAYS" too, as its 7 days).
_INTERVAL = re.compile(r"\s*interval\s+([0-9]{1,12})\s+(second|minute|hour|day|week)s?\s*")
_ANY_CASE_INTERVAL = re.compile(_INTERVAL.pattern, re.IGNORECASE)
_INTERVAL_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}


def tombstone_retention(table: DeltaTable) -> dt.timedelta | None:
    """How long the table's checkpoints keep a remove (``delta.deletedFileRetentionDuration``, as Delta
    writes it: ``interval 7 days``); None for a value this cannot read."""
    value = table.metadata().configuration.get("delta.deletedFileRetentionDuration")
    if value is None:
        return DEFAULT_TOMBSTONE_RETENTION
    match = _INTERVAL.fullmatch(value)
    if match is None:
        # Another spelling of an interval delta-rs does not read: its checkpoints keep its default.
        return DEFAULT_TOMBSTONE_RETENTION if _ANY_CASE_INTERVAL.fullmatch(value) else None
    try:
        return dt.timedelta(seconds=int(match[1]) * _INTERVAL_UNITS[match[2]])
    except OverflowError:  # more days than a timedelta holds: removes kept for good
        return dt.timedelta.max


def unreferenced_files(
    path: str, table: DeltaTable, retention_hours: int, keep: Collection[str], *, now: dt.datetime | None = None
) -> list[str]:
    """The data files under ``path`` (relative paths) that no version of the table names, written more
    than ``retention_hours`` (and :data:`UNNAMED_MIN_AGE`) ago: replaced files whose removes checkpoints
    no longer hold, and files of writes that never committed. As Delta's own VACUUM judges files not in
    the log: a Parquet file at the table's root or in its partition folders (``col=value`` for each
    partition column, in order: never a folder of anything else, such as a table nested inside), not in
    the snapshot, not named by any remove the log holds (whatever its time: a writer's clock ahead), not
    in ``keep``, last modified before the retention.

    Empty when the table's checkpoints may drop a remove younger than the retention (its
    ``delta.deletedFileRetentionDuration`` shorter, or unreadable), or when the log's removes cannot
    be read whole (:func:`_held_removes`): a file replaced inside the retention would then look never
    named. Files without a modification time are kept.
    """
    held = tombstone_retention(table)
    retention = dt.timedelta(hours=retention_hours)
    if held is None or held < retention:
        log.info(
            "%s: files no version names are not vacuumed: the table keeps removes %s, less than the %dh "
            "retention (set delta.deletedFileRetentionDuration to at least it)",
            path, held if held is not None else "for an unreadable time", retention_hours,
        )
        return []
    fs, root = filesystem(path)
    removes = _held_removes(fs, root, table)
    if removes is None:
        return []
    named = _named(table.table_uri, [*add_actions(table, flatten=False).column("path").to_pylist(), *removes, *keep])
    if named is None:
        return []
    before = (now or dt.datetime.now(dt.UTC)) - max(retention, UNNAMED_MIN_AGE)
    partitions = [hive_escape(c) for c in table.metadata().partition_columns]
    prefix = f"{root.rstrip('/')}/" if root else ""
    found = []
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
        if info.type != pafs.FileType.File or not info.path.startswith(prefix):
            continue
        relative = info.path[len(prefix):]
        *folders, name = relative.split("/")
        if not name.endswith(".parquet") or name.startswith(("_", ".")):
            continue
        # Exactly the table's partition folders, in order (a partition value's "/" is escaped in its name).
        if len(folders) != len(partitions) or any(
            f.partition("=")[0] != column or "=" not in f for f, column in zip(folders, partitions, strict=True)
        ):
            continue
        # A writer's file names are unique: a name any add or remove holds is named, whatever its folder's form.
        if relative in named or name in named or info.mtime is None:
            continue
        modified = info.mtime if info.mtime.tzinfo is not None else info.mtime.replace(tzinfo=dt.UTC)
        if modified < before:
            found.append(relative)
    return found


def _named(table_uri: str, paths: Sequence[str]) -> set[str] | None:
    """Every form of ``paths`` (log paths, URL-encoded, relative or absolute URIs; physical relative
    paths) a listing's relative path may match: as given, decoded, resolved against the table root, and
    each one's file name. None when an absolute path does not resolve inside the table (another scheme
    for the same bucket, ``s3a://`` for ``s3://``; a root this cannot decode): it might name a file here."""
    named: set[str] = set()
    for given in paths:
        decoded = data_file_path(given)
        named.update((given, decoded, posixpath.basename(decoded), posixpath.basename(given)))
        try:
            named.add(relative_data_path(given, table_uri))
        except DeltaSourceError:
            if urlparse(given).scheme or decoded.startswith("/"):
                log.info("%s: the log names %r, which does not resolve inside the table; files no version "
                         "names are not vacuumed", table_uri, given[:200])
                return None
    return named


# The log's commits a sweep reads after its latest checkpoint, at most (more: no sweep this run).
HELD_REMOVES_MAX_COMMITS = 1000


def _held_removes(fs: pafs.FileSystem, root: str, table: DeltaTable) -> list[str] | None:
    """The paths of every remove the log holds at the table's version: its latest (classic, single or
    multi-part) checkpoint's and those of the commits after it, whatever their times. None when they
    cannot be read whole (a checkpoint of another kind, a commit missing, too many commits, a damaged
    file): the caller then deletes nothing."""
    version = table.version()
    log_root = join_path(root, LOG_DIR)
    try:
        try:
            with fs.open_input_stream(join_path(log_root, "_last_checkpoint")) as stream:
                last = json.loads(stream.read(1 << 20))
        except FileNotFoundError:
            last = None
        paths: list[str] = []
        start = 0
        if isinstance(last, dict) and isinstance(last.get("version"), int) and last["version"] <= version:
            at, parts = last["version"], last.get("parts")
            names = (
                [f"{at:020d}.checkpoint.parquet"]
                if parts is None
                else [f"{at:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, int(parts) + 1)]
            )
            for name in names:
                with fs.open_input_file(join_path(log_root, name)) as handle:
                    checkpoint = pq.ParquetFile(handle)
                    columns = checkpoint.schema_arrow.names
                    if "checkpointMetadata" in columns:
                        return None  # a V2 checkpoint (under this name too): its actions may be in sidecars
                    actions = checkpoint.read(columns=[c for c in ("sidecar", "remove") if c in columns])
                    if "sidecar" in columns and actions["sidecar"].null_count < actions.num_rows:
                        return None  # sidecar files hold actions this does not read
                    if "remove" in columns:
                        removed = pc.struct_field(actions["remove"], "path").to_pylist()
                        paths.extend(p for p in removed if isinstance(p, str))
            start = at + 1
        elif last is not None:
            return None
        if version - start + 1 > HELD_REMOVES_MAX_COMMITS:
            log.info("%s: %d commits since the last checkpoint; files no version names wait for one", root, version - start + 1)
            return None
        for number in range(start, version + 1):
            lines = commit_lines(fs, root, number)
            if lines is None:
                return None  # cleaned from the log: its removes are unknown
            for line in lines:
                if '"remove"' not in line:
                    continue
                action = json.loads(line)
                remove = action.get("remove") if isinstance(action, dict) else None
                if isinstance(remove, dict) and isinstance(remove.get("path"), str):
                    paths.append(remove["path"])
    except (OSError, ValueError, RecursionError, KeyError, TypeError, pa.ArrowException) as exc:
        log.warning("%s: cannot read the removes the log holds (%s); files no version names are not vacuumed", root, exc)
        return None
    return paths


def _sweep(path: str, retention_hours: int, keep: Collection[str] | None) -> int:
    """Delete :func:`unreferenced_files` (none when ``keep`` is unknown): how many."""
    if keep is None:
        return 0
    files = unreferenced_files(path, open_delta(path), retention_hours, keep)
    fs, root = filesystem(path)
    for relative in files:
        delete_quietly(fs, join_path(root, relative))
    if files:
        log.info("%s: vacuumed %d data file(s) no version names, written more than %dh ago", path, len(files), retention_hours)
    return len(files)


def maintain_table(
    name: str,
    path: str,
    *,
    retention_hours: int,
    dry_run: bool = False,
    lock: threading.Lock | None = None,
    expire_before: dt.datetime | None = None,
    window: TimeWindow | None = None,
    keep: Collection[str] | None = None,
) -> TableReport:
    """Compact, checkpoint, clean the log of and vacuum the table ``name`` at ``path``.

    ``expire_before``: for a table of :data:`EXPIRING_TABLES`, first remove the
    files whose rows are all older (:func:`expire_rows`). ``window``: compact by
    windows of time (a table with a row retention, :func:`compaction_window`). ``keep``: files
    written for a commit not made yet (the lake's recorded batch), which the vacuum of files no version
    names leaves; None when they are not known (that pass is then skipped).

    A missing table gives an empty report. A step that fails is logged and
    named in the report's ``error``; the later steps still run (a failed
    compaction does not stop the checkpoint). ``dry_run`` changes nothing and
    reports what compaction and vacuum would remove. ``lock``: held around each
    step that commits, so a writer holding it never commits at the same time.
    """
    table = open_table(path)
    if table is None:
        return TableReport(name, path)
    before = _snapshot(path, table)
    report = TableReport(
        name,
        path,
        version_before=before.version,
        files_before=before.files,
        bytes_before=before.bytes,
        log_files_before=before.log_files,
    )
    expiring = EXPIRING_TABLES.get(name) if expire_before is not None else None
    also = EXPIRE_ALSO.get(name, ())
    if dry_run:
        expired = expiring_files(table, expiring, expire_before, also=also) if expiring and expire_before else ([], 0)
        doomed = table.vacuum(
            retention_hours=retention_hours, dry_run=True, enforce_retention_duration=False
        )
        never_named = unreferenced_files(path, table, retention_hours, keep) if keep is not None else []
        return replace(
            report,
            version_after=before.version,
            files_after=before.files,
            bytes_after=before.bytes,
            log_files_after=before.log_files,
            files_compacted=_small_files_to_compact(table, window),
            files_vacuumed=len(doomed) + len(never_named),
            files_expired=len(expired[0]),
            rows_expired=expired[1],
        )
    errors: list[str] = []
    guard = lock if lock is not None else threading.Lock()

    def step(what: str, action: Callable[[], _T]) -> _T | None:
        try:
            with guard:
                return action()
        except Exception as exc:  # housekeeping: the next step and the next run still go on
            log_failure(log, f"{path}: {what} failed", exc)
            errors.append(f"{what}: {type(exc).__name__}: {exc}")
            return None

    if expiring and expire_before is not None:
        before_time = expire_before
        gone = step(
            "row retention",
            lambda: expire_rows(
                path, expiring, before_time, marked=name == METRICS.name, also=also,
                stamped=name in STAMPED_TABLES,
            ),
        )
        if gone is not None:
            report = replace(report, files_expired=gone[0], rows_expired=gone[1])
    compacted = step("compaction", lambda: _compact(path) if window is None else _compact_windowed(path, window))
    if compacted is not None:
        report = replace(report, files_compacted=compacted[0], files_written=compacted[1])

    def checkpoint() -> int:
        fresh = open_delta(path)
        fresh.create_checkpoint()
        return fresh.version()

    report = replace(report, checkpoint_version=step("checkpoint", checkpoint))
    if not writers_clean_log(table):
        step("log cleanup", lambda: clean_log(path))
    vacuumed = step(
        "vacuum",
        lambda: open_delta(path).vacuum(
            retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False
        ),
    )
    swept = step("vacuum of files no version names", lambda: _sweep(path, retention_hours, keep))
    after = _snapshot(path, open_delta(path))
    return replace(
        report,
        version_after=after.version,
        files_after=after.files,
        bytes_after=after.bytes,
        log_files_after=after.log_files,
        files_vacuumed=len(vacuumed or []) + (swept or 0),
        error="; ".join(errors) or None,
    )


# --------------------------------------------------------------------------- the lake


def select_tables(
    config: EngineConfig, names: Sequence[str] | None = None
) -> list[tuple[str, str]]:
    """``(name, path)`` of the tables to maintain: ``names``, or every maintained table."""
    wanted = list(names) if names else list(MAINTAINED_TABLES)
    unknown = [n for n in wanted if n not in MAINTAINED_TABLES]
    if unknown:
        other = [n for n in unknown if n in TABLE_NAMES]
        why = f" ({', '.join(other)} is written by others and not maintained here)" if other else ""
        raise ConfigError(
            f"unknown table {unknown[0]!r}{why}; tables maintained are {', '.join(MAINTAINED_TABLES)}",
            code="UNKNOWN_TABLE",
        )
    return [(n, config.table_path(n)) for n in dict.fromkeys(wanted)]


def retention_hours(
    config: EngineConfig, retention: str | None = None, *, force: bool = False
) -> int:
    """The vacuum retention in hours: ``retention`` (e.g. ``--retention``), else ``[maintenance] retention``.

    Shorter than :func:`~retry_engine.config.minimum_retention_hours` is refused
    (:class:`~retry_engine.errors.ConfigError` ``RETENTION_TOO_SHORT``) unless ``force``.
    """
    given = retention if retention is not None else config.maintenance.retention
    hours = parse_retention_hours(given)
    floor = minimum_retention_hours(config.engine, config.maintenance)
    if hours < floor and not force:
        raise ConfigError(
            f"retention {given!r} ({hours}h) is shorter than the {floor}h this config needs (its longest trigger "
            "interval plus the maintenance interval): a running stream could still need a file vacuum deletes. "
            f"Give {floor}h or more, or --force if no engine or reader runs on these tables",
            code="RETENTION_TOO_SHORT",
        )
    return hours


def record(
    lake: str, reports: Sequence[TableReport], *, trigger: Trigger, hours: int, run_at: dt.datetime
) -> None:
    """Append one row per maintained table to ``<lake>/_maintenance``."""
    rows = [
        {
            **asdict(r),
            "run_id": run_id,
            "run_at": run_at,
            "trigger": trigger,
            "retention_hours": hours,
        }
        for run_id in [uuid.uuid4().hex]
        for r in reports
        if not r.missing
    ]
    if not rows:
        return
    path = maintenance_path(lake)
    ensure_table(path, MAINTENANCE.arrow_schema, add_missing=True)
    write_delta(path, pa.Table.from_pylist(rows, schema=MAINTENANCE.arrow_schema), mode="append")


def recorded_batch_files(lake: str) -> dict[str, set[str]] | None:
    """The files of the lake's recorded batch by table (written, maybe not committed yet: a roll-forward
    commits them), which no vacuum may delete; None when the lake's engine state cannot be read."""
    try:
        state = read_state(lake)
    except Exception as exc:  # noqa: BLE001 - unknown: the vacuum of files no version names waits
        log.warning("lake %s: cannot read the engine state (%s); files no version names are not vacuumed", lake, exc)
        return None
    batch = state.last_batch if state is not None else None
    if batch is None:
        return {}
    return {table: {data_file_path(str(e["path"])) for e in entries} for table, entries in batch.files.items()}


def run_maintenance(
    config: EngineConfig,
    *,
    tables: Sequence[str] | None = None,
    retention: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    trigger: Trigger = "command",
    lock: threading.Lock | None = None,
    stopping: Callable[[], bool] = lambda: False,
) -> list[TableReport]:
    """Maintain ``tables`` (default: every maintained table) and record it (not in a dry run).

    A run that maintains any engine table also maintains the lake's record
    table itself (:data:`RECORD_TABLE`), last, so months of runs do not leave
    it with a commit and a small file per run.

    ``stopping()`` is asked before each table: once true, the remaining tables
    are left for the next run (an engine that stops does not wait for them).
    """
    hours = retention_hours(config, retention, force=force)
    selected = select_tables(config, tables)
    if any(name in ENGINE_TABLES for name, _ in selected):
        selected.append((RECORD_TABLE, maintenance_path(config.engine.lake)))
    run_at = dt.datetime.now(dt.UTC)
    expire_before = {
        name: run_at - dt.timedelta(milliseconds=keep_ms)
        for name in EXPIRING_TABLES
        if (keep_ms := config.maintenance.row_retention_ms(name)) is not None
    }
    ledger = [name for name, _ in selected if name in LEDGER_TABLES and name in expire_before]
    shift = ledger_shift(config, run_at=run_at) if ledger else None
    for name in ledger:
        cut = _moved_back(expire_before.pop(name), shift)
        if cut is not None:
            expire_before[name] = cut
    windows = {
        name: compaction_window(dt.timedelta(milliseconds=keep_ms), column)
        for name, column in EXPIRING_TABLES.items()
        if (keep_ms := config.maintenance.row_retention_ms(name)) is not None
    }
    keep = recorded_batch_files(config.engine.lake)
    reports = []
    for name, path in selected:
        if stopping():
            log.info("maintenance stopped before %s; the next run does it", name)
            break
        reports.append(
            maintain_table(
                name, path, retention_hours=hours, dry_run=dry_run, lock=lock, expire_before=expire_before.get(name),
                window=windows.get(name), keep=None if keep is None else keep.get(name, ()),
            )
        )
    if not dry_run:
        try:
            record(config.engine.lake, reports, trigger=trigger, hours=hours, run_at=run_at)
        except Exception as exc:  # the tables are maintained; only the record is missing
            log_failure(log, f"lake {config.engine.lake}: could not record the maintenance run", exc)
    return reports


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def format_report(reports: Sequence[TableReport], *, dry_run: bool = False) -> str:
    """One line per table: files, bytes, versions, log entries, what was compacted and vacuumed."""
    lines = (
        ["dry run: nothing changed; compacted / vacuumed say what a run would remove"]
        if dry_run
        else []
    )
    width = max([len(r.table_name) for r in reports] or [5])
    for r in reports:
        if r.missing:
            if r.table_name != RECORD_TABLE:  # the record is made by this run: nothing was skipped
                lines.append(f"{r.table_name:{width}}  no table at {r.table_path}; skipped")
            continue
        if dry_run:
            line = (
                f"{r.table_name:{width}}  files {r.files_before}, {_size(r.bytes_before)}, version "
                f"{r.version_before}, log entries {r.log_files_before}; would compact {r.files_compacted} "
                f"small files, would vacuum {r.files_vacuumed}"
            )
            if r.files_expired:
                line += f", would expire {r.files_expired} files ({r.rows_expired} rows)"
            lines.append(line)
            continue
        line = (
            f"{r.table_name:{width}}  files {r.files_before} -> {r.files_after}, "
            f"{_size(r.bytes_before)} -> {_size(r.bytes_after)}, version {r.version_before} -> {r.version_after}, "
            f"log entries {r.log_files_before} -> {r.log_files_after}; compacted {r.files_compacted} "
            f"into {r.files_written}, vacuumed {r.files_vacuumed}"
        )
        if r.files_expired:
            line += f", expired {r.files_expired} files ({r.rows_expired} rows past the retention)"
        if r.checkpoint_version is not None:
            line += f", checkpoint at {r.checkpoint_version}"
        if r.error:
            line += f"; FAILED {r.error}"
        lines.append(line)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- in the engine

WriterT = TypeVar("WriterT")


@dataclass
class _Due:
    """When in-engine maintenance is due: every ``every_batches`` batches or ``interval_ms``, whichever first."""

    every_batches: int
    interval_ms: int | None
    batches: int = 0
    since_ms: float = 0.0

    def due(self, now_ms: float) -> bool:
        by_batches = self.every_batches > 0 and self.batches >= self.every_batches
        by_time = self.interval_ms is not None and now_ms - self.since_ms >= self.interval_ms
        return by_batches or by_time

    def reset(self, now_ms: float) -> None:
        self.batches, self.since_ms = 0, now_ms


def engine_tables_to_maintain(config: EngineConfig) -> list[str]:
    """The tables in-engine maintenance covers under ``[maintenance]``."""
    section = config.maintenance
    return [
        *(("consume_results",) if section.consume_results else ()),
        *(("messages",) if section.messages else ()),
        *(ENGINE_TABLES if section.engine_tables else ()),
    ]


class EngineMaintenance:
    """In-engine maintenance: a driver thread that maintains tables between batches.

    :meth:`wrap` wraps the engine's ``foreachBatch`` function: the whole batch
    runs under a lock, and each maintenance step takes the same lock, so a
    maintenance commit never lands inside a batch's commit path (a batch waits
    at most for one step of one table). Commits of other writers (the progress
    listener, operator tools, producers) can still race it: compaction then
    retries, and a step that still fails is logged and recorded, never fatal,
    never stopping the stream.

    Replay: the wrapped function is called again for a replayed batch and only
    counts it towards ``every_batches``; the batch's own replay rules apply.
    """

    def __init__(
        self, config: EngineConfig, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config = config
        self._tables = engine_tables_to_maintain(config)
        self._hours = retention_hours(config)
        self._clock = clock
        section = config.maintenance
        self._due = _Due(section.every_batches, section.interval_ms, since_ms=clock() * 1000)
        self._lock = threading.Lock()
        self._counting = threading.Lock()  # the batch count: the writer adds, a run resets
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="retry-engine-maintenance", daemon=True
        )
        self._alive: Callable[[], bool] = lambda: True
        # Reports of every run so far (most recent last), for logs and tests.
        self.runs: list[list[TableReport]] = []

    @property
    def tables(self) -> list[str]:
        return list(self._tables)

    def wrap(self, writer: Callable[[WriterT, int], None]) -> Callable[[WriterT, int], None]:
        """``writer`` with its batches serialised against maintenance steps, counting batches."""

        def write(frame: WriterT, batch_id: int) -> None:
            with self._lock:
                writer(frame, batch_id)
            with self._counting:
                self._due.batches += 1
                wake = 0 < self._due.every_batches <= self._due.batches
            if wake:
                self._wake.set()

        return write

    def start(self, alive: Callable[[], bool]) -> None:
        """Run until :meth:`stop`, or until ``alive()`` turns false (the query stopped)."""
        self._alive = alive
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def run_now(self) -> list[TableReport]:
        """One maintenance run of this engine's tables (what the thread does when due)."""
        with self._counting:
            self._due.reset(self._clock() * 1000)
        reports = run_maintenance(
            self._config,
            tables=self._tables,
            trigger="engine",
            lock=self._lock,
            stopping=self._stop.is_set,
        )
        self.runs.append(reports)
        for report in reports:
            if report.error:
                log.warning("in-engine maintenance of %s: %s", report.table_name, report.error)
        log.info("in-engine maintenance:\n%s", format_report(reports).rstrip())
        return reports

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(POLL_SECONDS)
            self._wake.clear()
            if self._stop.is_set() or not self._alive():
                return
            with self._counting:
                due = self._due.due(self._clock() * 1000)
            if not due:
                continue
            try:
                self.run_now()
            except Exception as exc:  # never stops the stream; the next due time tries again
                log_failure(log, "in-engine maintenance failed, the next due run retries", exc)


_ENGINES: dict[str, EngineMaintenance] = {}
_ENGINES_LOCK = threading.Lock()


def attach(
    config: EngineConfig, query_id: str, writer: Callable[[WriterT, int], None]
) -> Callable[[WriterT, int], None]:
    """``writer`` wrapped for in-engine maintenance of query ``query_id``, if ``[maintenance]`` turns it on.

    The thread starts with :func:`start` once the query runs and ends with :func:`detach`.
    """
    if not config.maintenance.engine_tables:
        log.warning(
            "in-engine maintenance of the engine's tables is off ([maintenance] engine_tables = false): nothing "
            "compacts them, and their writers leave expired log files to maintenance, so their logs keep growing; "
            "run `retry-engine maintain` regularly (hourly from cron, say)"
        )
    if not config.maintenance.enabled:
        return writer
    engine = EngineMaintenance(config)
    with _ENGINES_LOCK:
        _ENGINES[query_id] = engine
    log.info("in-engine maintenance of %s: %s", ", ".join(engine.tables), _schedule_text(config))
    return engine.wrap(writer)


def start(query_id: str, alive: Callable[[], bool]) -> None:
    with _ENGINES_LOCK:
        engine = _ENGINES.get(query_id)
    if engine is not None:
        engine.start(alive)


def detach(query_id: str) -> EngineMaintenance | None:
    """Stop query ``query_id``'s maintenance thread (waits for a running step to finish)."""
    with _ENGINES_LOCK:
        engine = _ENGINES.pop(query_id, None)
    if engine is not None:
        engine.stop()
    return engine


def _schedule_text(config: EngineConfig) -> str:
    section = config.maintenance
    parts = [f"every {section.interval}"] if section.interval != "off" else []
    if section.every_batches:
        parts.append(f"every {section.every_batches} batches")
    return " or ".join(parts) + f", retention {section.retention}"


__all__ = [
    "ENGINE_TABLES",
    "EXPIRED_LOG_CLEANUP",
    "INPUT_TABLES",
    "MAINTAINED_TABLES",
    "EngineMaintenance",
    "TableReport",
    "attach",
    "detach",
    "format_report",
    "maintain_table",
    "maintenance_path",
    "record",
    "retention_hours",
    "run_maintenance",
    "select_tables",
    "start",
    "writers_clean_log",
]
