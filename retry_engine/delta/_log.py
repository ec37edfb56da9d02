"""A Delta table's log as the streaming source needs it: versions, snapshots, commits.

delta-rs has no public "files added by commit v" API, so commits are read from
``_delta_log/{v:020d}.json`` the way Delta's own streaming source reads them,
through the table's storage (a local filesystem for local paths, delta-rs's
object-store handler for anything else). Snapshots come from delta-rs.

Everything here is Spark-free; ``DeltaLog`` caches what it reads because
commits and snapshots of a version never change.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import os
import posixpath
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from retry_engine.core.names import FIRST_MS, FUTURE_EVENTS, LAST_MS, is_whole
from retry_engine.errors import DeltaSourceError

log = logging.getLogger(__name__)

LOG_DIR = "_delta_log"
# Reader features whose only effect on a reader is handled here or by delta-rs.
SUPPORTED_READER_FEATURES = frozenset({"timestampNtz", "typeWidening", "v2Checkpoint", "vacuumProtocolCheck"})
MAX_READER_VERSION = 3
COMMIT_CACHE_SIZE = 256
# The columns of ``get_add_actions(flatten=True)`` a snapshot's FileEntry is made of.
SNAPSHOT_COLUMNS = frozenset({"path", "size_bytes", "modification_time", "num_records"})
PARTITION_PREFIX = "partition."


# --------------------------------------------------------------------------- storage


def add_actions(table: DeltaTable, *, flatten: bool = True) -> pa.Table:
    """The snapshot's add actions (one row per data file) as a pyarrow table.

    Read through the Arrow C stream: ``pa.table`` on delta-rs's (arro3) table
    first asks pandas whether it is a DataFrame, which imports pandas, 0.19 s
    of CPU measured here, in processes that have no other use for it: the
    streaming source runner paid it in the first micro-batch's ``latestOffset``.
    """
    return pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=flatten)).read_all()


def newest_time(table: DeltaTable, column: str) -> dt.datetime | None:
    """The newest ``column`` value of ``table`` by its files' statistics (kept to the millisecond, cut
    down), or None: no file, a file without that statistic, or not a time with a zone."""
    actions = add_actions(table)
    stat = f"max.{column}"
    if actions.num_rows == 0 or stat not in actions.schema.names or actions[stat].null_count:
        return None
    if not zoned_time(actions[stat].type):
        return None
    newest = pc.max(actions[stat]).as_py()
    return newest if isinstance(newest, dt.datetime) else None


# The app id of the transaction a row retention's expiry commits (retry-engine maintain): its
# version is the cut in epoch ms, never moved back.
EXPIRED_BEFORE_APP = "retry-engine-expired-before"


def expired_before(table: DeltaTable) -> dt.datetime | None:
    """The latest cut of ``table``'s row retention (:data:`EXPIRED_BEFORE_APP`), None if it never had one."""
    ms = table.transaction_version(EXPIRED_BEFORE_APP)
    if ms is None:
        return None
    try:
        cut = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    except (OverflowError, ValueError, OSError):  # another writer's transaction of that id: no cut known
        log.warning("%s: transaction %s holds %d, no time; taken as no row retention cut", table.table_uri,
                    EXPIRED_BEFORE_APP, ms)
        return None
    # A cut ahead of now (another writer, a clock far ahead) would skip a stream's missing files and count
    # pending retries as released: no cut known, and the next expiry records a true one.
    if cut > dt.datetime.now(dt.UTC) + FUTURE_EVENTS:
        log.warning("%s: transaction %s holds %s, more than %s ahead of this clock; taken as no row retention cut",
                    table.table_uri, EXPIRED_BEFORE_APP, cut.isoformat(), FUTURE_EVENTS)
        return None
    return cut


@dataclass(frozen=True)
class Expired:
    """A data file gone past its table's row retention (:func:`expired_file`)."""

    rows: int | None
    newest: dt.datetime
    cut: dt.datetime


def _stat_time(value: object) -> dt.datetime | None:
    """A time statistic of the log (``"2026-11-20T10:00:00.000Z"``, or read by delta-rs) with its zone, or None."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo is not None else None
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


@dataclass
class ExpiryJudge:
    """Whether a data file gone from ``location`` is past the table's row retention by ``column``
    (:meth:`expired`). Reads the cut, the commits and the snapshots it needs once (a read task's files)."""

    location: TableLocation
    column: str
    _log: DeltaLog | None = field(default=None, repr=False)
    _snapshots: dict[int, pa.Table] = field(default_factory=dict, repr=False)

    @functools.cached_property
    def cut(self) -> dt.datetime | None:
        """The table's latest cut (:func:`expired_before`), read at the first file gone."""
        return expired_before(self.location.open_table())

    def expired(self, path: str, version: int, *, from_snapshot: bool = False) -> Expired | None:
        """Data file ``path`` (added by commit ``version``, or in the snapshot at ``version``) when the
        log's statistics put every ``column`` value of it before the table's latest cut
        (:func:`expired_before`). None when anything is unknown (no cut, no statistic, not a time with
        a zone, a commit gone from the log): a gone file is then a loss, not an expiry.

        A file gone before a stream read it (VACUUM after the expiry's removal, or after a compaction
        that rewrote its rows into a file since expired) holds rows a RocketMQ consumer that far behind
        would not get either: the commit log past its retention is deleted whatever the consumer's offset.
        """
        cut = self.cut
        if cut is None:
            return None
        rows, newest, nulls = self._added_stats(path, version, from_snapshot)
        newest_time = _stat_time(newest.get(self.column)) if isinstance(newest, Mapping) else None
        no_null = isinstance(nulls, Mapping) and _records(nulls.get(self.column)) == 0
        # As the expiry judges a file (expiring_files): a null time, or no count, might be a row to keep.
        if newest_time is None or newest_time >= cut or not no_null or rows is None:
            return None
        return Expired(rows, newest_time, cut)

    def _added_stats(self, path: str, version: int, from_snapshot: bool) -> tuple[int | None, Any, Any]:
        """(rows, the ``maxValues`` and ``nullCount`` statistics) of ``path`` as the log holds it; Nones if it
        does not."""
        if from_snapshot:
            if version not in self._snapshots:
                self._snapshots[version] = add_actions(self.location.open_table(version), flatten=False)
            actions = self._snapshots[version]
            found = actions.filter(pc.equal(actions["path"], path)).to_pylist()
            if not found:
                return None, None, None
            return _records(found[0].get("num_records")), found[0].get("max"), found[0].get("null_count")
        if self._log is None:
            self._log = DeltaLog(self.location)
        commit = self._log.commit(version)
        add = next((a for a in commit.adds if a.get("path") == path), None) if commit is not None else None
        stats = add.get("stats") if add is not None else None
        try:
            parsed = json.loads(stats) if isinstance(stats, str) else None
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            return None, None, None
        return _records(parsed.get("numRecords")), parsed.get("maxValues"), parsed.get("nullCount")


@dataclass(frozen=True)
class TableLocation:
    """Where a table lives and how to reach its files.

    Local paths (plain or ``file:`` URIs) use pyarrow's local filesystem; any
    other URI goes through delta-rs's storage handler with ``storage_options``,
    so the same code reads object stores.
    """

    uri: str
    # Not in repr: the options may hold credentials (see retry_engine.delta.storage).
    storage_options: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    @property
    def is_local(self) -> bool:
        return urlparse(self.uri).scheme in ("", "file")

    @property
    def table_uri(self) -> str:
        """The URI delta-rs is given (local paths made absolute)."""
        return self.local_root if self.is_local else self.uri

    @property
    def local_root(self) -> str:
        uri = self.uri
        if uri.startswith("file://"):
            uri = uri[len("file://") :]
        elif uri.startswith("file:"):
            uri = uri[len("file:") :]
        return os.path.abspath(uri)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A filesystem and the table root within it (file paths are ``root/relative``)."""
        if self.is_local:
            return pafs.LocalFileSystem(), self.local_root
        from deltalake.fs import DeltaStorageHandler

        handler = DeltaStorageHandler(self.uri, dict(self.storage_options or {}))
        return pafs.PyFileSystem(handler), ""

    def open_table(self, version: int | None = None) -> DeltaTable:
        """The delta-rs table, or :class:`DeltaSourceError` if there is none here."""
        try:
            return DeltaTable(self.table_uri, version=version, storage_options=_opts(self.storage_options))
        except TableNotFoundError as exc:
            raise DeltaSourceError(
                f"{self.uri} is not a Delta table (no readable _delta_log): {exc}", code="NOT_A_DELTA_TABLE"
            ) from exc
        except Exception as exc:  # delta-rs raises DeltaError / OSError for a bad version or storage
            from retry_engine.delta.storage import scrubbed

            # Not chained: the store's answer in delta-rs's text may echo a credential (scrubbed here).
            raise DeltaSourceError(
                f"cannot load Delta table {self.uri} at version {version}: {scrubbed(str(exc))}",
                code="DELTA_TABLE_UNREADABLE",
            ) from None


def _opts(options: Mapping[str, str] | None) -> dict[str, str] | None:
    return dict(options) if options else None


def join_path(root: str, relative: str) -> str:
    return f"{root.rstrip('/')}/{relative}" if root else relative


def data_file_path(log_path: str) -> str:
    """The physical relative path of a data file named in the log (log paths are URL-encoded).

    Only for paths this package wrote itself; paths read from a log go
    through :func:`relative_data_path`, which refuses any leaving the table.
    """
    return unquote(log_path)


def _table_root(table_uri: str) -> tuple[str, str]:
    """``(scheme://authority, normalised path)`` of a table root; local paths become ``file`` ones."""
    parsed = urlparse(table_uri)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # one letter: a Windows drive
        return "file://", posixpath.normpath(TableLocation(table_uri).local_root)
    return f"{parsed.scheme}://{parsed.netloc}", posixpath.normpath("/" + parsed.path.lstrip("/"))


def relative_data_path(log_path: str, table_uri: str) -> str:
    """Where the data file ``log_path`` (as the log names it) lies, relative to the table root.

    Log paths are URL-encoded URIs, relative to the table root or absolute
    (shallow clones write absolute ones). A path that resolves outside the
    table (``../other_table/...``, ``%2e%2e/``, ``/etc/...``, a URI of another
    folder, bucket or scheme) is refused with :class:`DeltaSourceError`
    ``DELTA_PATH_OUTSIDE_TABLE``: a log someone else can write must not make
    the reader open files of other tables or tenants.
    """

    def refuse(why: str) -> DeltaSourceError:
        return DeltaSourceError(
            f"data file path {log_path!r} in the log of {table_uri} {why}; format('deltars') reads only "
            "files inside the table's own folder. The log was written by a broken or hostile writer: "
            "remove the commit or restore the table",
            code="DELTA_PATH_OUTSIDE_TABLE",
        )

    decoded = unquote(log_path)
    if not decoded or "\x00" in decoded:
        raise refuse("is empty or contains a NUL character")
    parsed = urlparse(log_path)
    is_uri = bool(parsed.scheme) and len(parsed.scheme) > 1
    if is_uri or decoded.startswith("/"):
        authority, root = _table_root(table_uri)
        if is_uri:
            scheme = "file://" if parsed.scheme == "file" else f"{parsed.scheme}://{parsed.netloc}"
            if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
                raise refuse(f"names host {parsed.netloc!r}")
            path = unquote(parsed.path)
        else:
            scheme, path = "file://", decoded
        full = posixpath.normpath(path)
        if scheme != authority or not full.startswith(root.rstrip("/") + "/"):
            raise refuse(f"resolves to {scheme}{full}, outside the table root {authority}{root}")
        return full[len(root.rstrip("/")) + 1 :]
    relative = posixpath.normpath(decoded)
    if relative in (".", "..") or relative.startswith("../"):
        raise refuse(f"resolves to {relative!r}, outside the table root")
    return relative


# --------------------------------------------------------------------------- commits


@dataclass(frozen=True)
class Commit:
    """The actions of one commit file that matter to a streaming reader."""

    version: int
    adds: tuple[Mapping[str, Any], ...]
    """``add`` actions with ``dataChange`` true, in file order."""
    removes: tuple[Mapping[str, Any], ...]
    """``remove`` actions with ``dataChange`` true."""
    protocol: Mapping[str, Any] | None = None
    metadata: Mapping[str, Any] | None = None
    in_commit_timestamp: int | None = None
    """``commitInfo.inCommitTimestamp`` (ms) when the table records commit times in the log."""
    rewrites: tuple[str, ...] = ()
    """Paths of the ``add`` actions with ``dataChange`` false (a compaction's files: rows committed before)."""

    @property
    def changes_data(self) -> bool:
        return bool(self.adds or self.removes)



def parse_commit(version: int, lines: Iterable[str]) -> Commit:
    """Parse the newline-delimited JSON of commit ``version``.

    ``dataChange`` defaults to true when absent, as in the protocol. Actions a
    reader does not need (``commitInfo``, ``txn``, ``cdc``, domain metadata)
    are dropped.
    """
    adds: list[Mapping[str, Any]] = []
    removes: list[Mapping[str, Any]] = []
    rewrites: list[str] = []
    protocol = metadata = None
    in_commit_timestamp: int | None = None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise DeltaSourceError(
                f"commit {version} line {number} is not JSON: {exc}", code="DELTA_COMMIT_CORRUPT"
            ) from exc
        problem = _action_problem(action)
        if problem is not None:
            raise DeltaSourceError(
                f"commit {version} line {number} is no Delta action: {problem} ({line[:200]!r})",
                code="DELTA_COMMIT_CORRUPT",
            )
        if "add" in action:
            if action["add"].get("dataChange", True):
                adds.append(action["add"])
            else:
                rewrites.append(action["add"]["path"])
        elif "remove" in action:
            if action["remove"].get("dataChange", True):
                removes.append(action["remove"])
        elif "protocol" in action:
            protocol = action["protocol"]
        elif "metaData" in action:
            metadata = action["metaData"]
        elif "commitInfo" in action and isinstance(action["commitInfo"], dict):
            stamp = action["commitInfo"].get("inCommitTimestamp")
            # A time the calendar holds (years 1-9999); another writer's anything else is no time (the file's then).
            in_commit_timestamp = None
            if is_whole(stamp) and FIRST_MS <= stamp <= LAST_MS:
                in_commit_timestamp = stamp
    return Commit(version, tuple(adds), tuple(removes), protocol, metadata, in_commit_timestamp, tuple(rewrites))


def _action_problem(action: object) -> str | None:
    """Why a commit line is no action this reader can use (another writer's, a damaged file); None if it is.

    The fields read of an add or a remove are checked: a path; a size and a modification time that are
    whole numbers, if given; partition values as a mapping of text to text or null.
    """
    if not isinstance(action, dict):
        return f"a JSON {type(action).__name__}, not an object"
    for kind in ("add", "remove", "protocol", "metaData"):
        if kind in action and not isinstance(action[kind], dict):
            return f"its {kind} is a JSON {type(action[kind]).__name__}, not an object"
    for kind in ("add", "remove"):
        file = action.get(kind)
        if file is None:
            continue
        if not isinstance(file.get("path"), str) or not file["path"]:
            return f"the {kind} has no path"
        for name in ("size", "modificationTime", "deletionTimestamp"):
            if file.get(name) is not None and not is_whole(file[name]):
                return f"the {kind}'s {name} {file[name]!r} is no whole number"
        values = file.get("partitionValues")
        if values is not None and (
            not isinstance(values, dict) or not all(isinstance(v, str) or v is None for v in values.values())
        ):
            return f"the {kind}'s partitionValues {values!r} are not text by column"
    return None


def commit_log_path(version: int) -> str:
    return f"{LOG_DIR}/{version:020d}.json"


def commit_lines(fs: pafs.FileSystem, root: str, version: int) -> list[str] | None:
    """The lines of commit ``version`` of the table at ``root`` (None if its file does not exist).

    Split on "\n" only: JSON strings may hold U+2028, U+2029 and U+0085 raw (delta-rs writes them so
    into stats), and str.splitlines() would break a line there.
    """
    try:
        with fs.open_input_stream(join_path(root, commit_log_path(version))) as stream:
            text: str = stream.read().decode("utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        # delta-rs's handler reports a missing object as a generic OSError.
        if "not found" in str(exc).lower() or "no such file" in str(exc).lower():
            return None
        raise
    return text.split("\n")


# --------------------------------------------------------------------------- protocol


def check_reader_protocol(
    uri: str, *, min_reader_version: int, reader_features: Iterable[str] | None, configuration: Mapping[str, str]
) -> None:
    """Raise :class:`DeltaSourceError` if reading needs a feature this reader lacks.

    Deletion vectors and column mapping change what a file's rows or column
    names mean; reading the Parquet files as they are would return wrong data.
    """
    features = set(reader_features or ())
    mapping = str(configuration.get("delta.columnMapping.mode", "none")).lower()
    if mapping != "none":
        features.add("columnMapping")
    unsupported = sorted(features - SUPPORTED_READER_FEATURES)
    if min_reader_version > MAX_READER_VERSION or unsupported:
        raise DeltaSourceError(
            f"{uri} needs Delta reader version {min_reader_version} with features {unsupported}; "
            f"the retry engine's reader (format('deltars')) reads versions <= {MAX_READER_VERSION} with features "
            f"{sorted(SUPPORTED_READER_FEATURES)} (no deletion vectors, no column mapping)",
            code="DELTA_UNSUPPORTED_FEATURE",
        )


def check_table_protocol(uri: str, table: DeltaTable) -> None:
    protocol = table.protocol()
    check_reader_protocol(
        uri,
        min_reader_version=protocol.min_reader_version,
        reader_features=protocol.reader_features,
        configuration=table.metadata().configuration,
    )


# --------------------------------------------------------------------------- files


@dataclass(frozen=True)
class FileEntry:
    """One data file in stream order: snapshot files first, then commit files."""

    path: str
    """As in the log: relative to the table root and URL-encoded."""
    size: int
    partition_values: Mapping[str, str | None]
    """Delta's string form (``None`` for null), as in the log."""
    version: int
    index: int
    is_starting_version: bool
    is_last: bool
    """True for the last data file of its version (or of the snapshot)."""
    modification_time: int = 0
    num_records: int | None = None
    """Rows of the file from its ``numRecords`` statistic; None when the writer wrote none."""

    @property
    def key(self) -> tuple[int, int]:
        return (self.version, self.index)


def partition_value_string(value: Any) -> str | None:
    """A typed partition value in Delta's string form (timestamps in UTC)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return f"{value.year:04d}-{value:%m-%d %H:%M:%S.%f}"  # four digits (see _files._stat_json)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return str(value.decode("utf-8", errors="surrogateescape"))
    if isinstance(value, Decimal):
        return format(value, "f")
    return str(value)


def _records(value: object) -> int | None:
    """A row count from a log statistic, or None when it is missing or not a count (any writer's stats)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _stats_records(stats: object) -> int | None:
    """``numRecords`` of an add action's ``stats`` JSON string; None when absent or malformed."""
    if not isinstance(stats, str) or '"numRecords"' not in stats:
        return None
    try:
        parsed = json.loads(stats)
    except ValueError:
        return None
    return _records(parsed.get("numRecords")) if isinstance(parsed, dict) else None


@dataclass(frozen=True)
class FilePrune:
    """Leave out the data files whose statistics say every ``column`` value is before ``before``.

    A file without that statistic, or whose statistic is no time with a zone
    (a table another writer made), is kept: only its rows could tell.
    """

    column: str
    before: dt.datetime


def snapshot_files(table: DeltaTable, version: int, prune: FilePrune | None = None) -> list[FileEntry]:
    """The data files of ``table`` (loaded at ``version``) in stream order (:func:`snapshot_entries`).

    Only the columns a :class:`FileEntry` holds cross to Python, not the
    per-column statistics: those are Python objects for every file, and their
    tz-aware timestamps convert through pandas. With ``prune``, the files it
    leaves out are dropped after the files are numbered, so a kept file has
    the index (and stream position) it has without ``prune``.
    """
    actions = add_actions(table)
    entries = file_entries(actions, version)
    if prune is None:
        return entries
    kept = _reaching(actions, prune)
    return entries if kept is None else [e for e in entries if e.path in kept]


def file_entries(actions: pa.Table, version: int) -> list[FileEntry]:
    """The files of ``actions`` (rows of :func:`add_actions`) as :class:`FileEntry`, in stream order
    (:func:`snapshot_entries`); only the columns an entry holds cross to Python."""
    wanted = [c for c in actions.column_names if c in SNAPSHOT_COLUMNS or c.startswith(PARTITION_PREFIX)]
    return snapshot_entries(actions.select(wanted).to_pylist(), version)


def zoned_time(kind: pa.DataType) -> bool:
    """Whether ``kind`` is a time with a zone: what the engine's times are, and what a time bound
    can prune statistics of (another writer's text or zoneless time cannot)."""
    return pa.types.is_timestamp(kind) and kind.tz is not None


def _reaching(actions: pa.Table, prune: FilePrune) -> set[str] | None:
    """Paths of the files ``prune`` keeps; None if the statistics cannot prune at all."""
    name = f"max.{prune.column}"
    if name not in actions.column_names:
        return None
    latest = actions[name]
    if not zoned_time(latest.type):
        log.info("column %s of the table is %s, not a time with a zone: no file is pruned", prune.column, latest.type)
        return None
    reaches = pc.fill_null(pc.greater_equal(latest, pa.scalar(prune.before, latest.type)), True)
    return set(actions.filter(reaches)["path"].to_pylist())


def snapshot_entries(table_rows: list[dict[str, Any]], version: int) -> list[FileEntry]:
    """Snapshot files (rows of ``get_add_actions(flatten=True)``) in stream order.

    The order (modification time, then path) is a pure function of the
    snapshot, so a replay lists the same files with the same indexes.
    """
    rows = sorted(table_rows, key=lambda r: (int(r["modification_time"]), str(r["path"])))
    prefix = PARTITION_PREFIX
    return [
        FileEntry(
            path=str(r["path"]),
            size=int(r["size_bytes"]),
            partition_values={k[len(prefix) :]: partition_value_string(v) for k, v in r.items() if k.startswith(prefix)},
            version=version,
            index=i,
            is_starting_version=True,
            is_last=i == len(rows) - 1,
            modification_time=int(r["modification_time"]),
            num_records=_records(r.get("num_records")),
        )
        for i, r in enumerate(rows)
    ]


# How to get past a commit the stream cannot follow: Delta's option names, and the
# retry engine's config keys for the same options (the engine streams consume_results).
CHANGE_OPTIONS_HELP = (
    "one of: skipChangeCommits=true (retry-engine config: [source] skip_change_commits = true), which "
    "skips every commit that removes data, the rows it adds too; ignoreDeletes=true ([source] "
    "ignore_deletes = true), which skips commits that only delete whole files and add none; or, from a "
    "new checkpoint, startingVersion={next_version} ([source] starting_version) or startingTimestamp "
    "([source] starting_timestamp), which start at that commit (or the first at or after that time) "
    "and never read what came before"
)


def commit_entries(commit: Commit, *, uri: str, ignore_deletes: bool, skip_change_commits: bool) -> list[FileEntry]:
    """The files commit ``commit`` contributes to a stream, under Delta's rules.

    * only ``add`` actions with ``dataChange`` true, in file order;
    * a commit with a data-changing ``remove`` fails the stream, unless
      ``skipChangeCommits`` (skip the whole commit, its adds too) or
      ``ignoreDeletes`` and the commit only removes (e.g. a partition drop);
    * metadata / protocol / txn-only commits contribute nothing.
    """
    if commit.removes:
        if skip_change_commits:
            log.info("%s: commit %d changes existing data; skipped (skipChangeCommits)", uri, commit.version)
            return []
        if ignore_deletes and not commit.adds:
            log.info("%s: commit %d only deletes; ignored (ignoreDeletes)", uri, commit.version)
            return []
        raise DeltaSourceError(
            f"commit {commit.version} of {uri} removes {len(commit.removes)} data file(s)"
            f"{' and adds ' + str(len(commit.adds)) if commit.adds else ''} (a DELETE, UPDATE, MERGE or "
            "overwrite); a stream of appended rows cannot follow it. To go on, restart the stream with "
            f"{CHANGE_OPTIONS_HELP.format(next_version=commit.version + 1)}",
            code="DELTA_SOURCE_REMOVE_IN_COMMIT",
        )
    for add in commit.adds:
        if add.get("deletionVector"):
            raise DeltaSourceError(
                f"commit {commit.version} of {uri} adds {add['path']} with a deletion vector; "
                "format('deltars') cannot apply deletion vectors",
                code="DELTA_UNSUPPORTED_FEATURE",
            )
    last = len(commit.adds) - 1
    return [
        FileEntry(
            path=str(a["path"]),
            size=int(a.get("size") or 0),
            partition_values=dict(a.get("partitionValues") or {}),
            version=commit.version,
            index=i,
            is_starting_version=False,
            is_last=i == last,
            modification_time=int(a.get("modificationTime") or 0),
            num_records=_stats_records(a.get("stats")),
        )
        for i, a in enumerate(commit.adds)
    ]


# --------------------------------------------------------------------------- the log


@dataclass
class DeltaLog:
    """The log of one table, read lazily and cached (commits never change).

    Not picklable state: a reader holds one on the driver only.
    """

    location: TableLocation
    _table: DeltaTable | None = field(default=None, repr=False)
    _fs: tuple[pafs.FileSystem, str] | None = field(default=None, repr=False)
    _snapshot: tuple[tuple[int, FilePrune | None], list[FileEntry]] | None = field(default=None, repr=False)
    _commits: OrderedDict[int, Commit] = field(default_factory=OrderedDict, repr=False)
    # The latest version the handle read and its commit's text, to tell the same table from one
    # deleted and re-created at the path (see table()).
    _seal: tuple[int, str | None] | None = field(default=None, repr=False)

    @property
    def uri(self) -> str:
        return self.location.uri

    def table(self) -> DeltaTable:
        """A handle at the latest version (refreshed incrementally).

        A table deleted and re-created at its path is ``DELTA_TABLE_ID_CHANGED``: delta-rs's
        incremental update goes on over the new log (its versions up to the old latest
        unread: their rows skipped), or fails when that log is shorter. So when the version
        moves, the commit of the version read before must still be the one it was (one read
        of it, and one of the new latest's); a commit log cleanup removed is judged by the
        table id of a fresh open.
        """
        if self._table is None:
            self._table = self.location.open_table()
        else:
            before = self._table.version()
            try:
                self._table.update_incremental()
            except Exception:
                self._check_same_table()  # re-created, or a fresh handle (the store's error raises again)
            else:
                if self._table.version() == before:
                    return self._table
                if self._seal is not None and self._commit_text(self._seal[0]) != self._seal[1]:
                    self._check_same_table()
        latest = self._table.version()
        self._seal = (latest, self._commit_text(latest))
        return self._table

    def _commit_text(self, version: int) -> str | None:
        if self._fs is None:
            self._fs = self.location.filesystem()
        lines = commit_lines(*self._fs, version)
        return None if lines is None else "\n".join(lines)

    def _check_same_table(self) -> None:
        """``DELTA_TABLE_ID_CHANGED`` if the table at the path is another than the handle's; else the
        handle and the caches start again from a fresh open."""
        known = str(self._table.metadata().id) if self._table is not None else None
        fresh = self.location.open_table()
        if known is not None and str(fresh.metadata().id) != known:
            raise DeltaSourceError(
                f"the Delta table at {self.uri} was deleted and re-created while it was read (table {known} is now "
                f"table {fresh.metadata().id}); a stream cannot go on from one table's versions into another's. "
                "Start from a new checkpoint to read the new table",
                code="DELTA_TABLE_ID_CHANGED",
            )
        self._table, self._snapshot = fresh, None
        self._commits.clear()

    def latest_version(self) -> int:
        return self.table().version()

    def table_id(self) -> str:
        return str(self.table().metadata().id)

    def arrow_schema(self, version: int | None = None) -> pa.Schema:
        table = self.location.open_table(version) if version is not None else self.table()
        check_table_protocol(self.uri, table)
        return pa.schema(table.schema().to_arrow())

    def snapshot(self, version: int, prune: FilePrune | None = None) -> list[FileEntry]:
        """Files of the snapshot at ``version`` in stream order (only the last one asked is cached);
        with ``prune``, those it keeps (:func:`snapshot_files`).

        A version the log no longer holds (log cleanup removed its commits and
        no checkpoint at or before it is left) is ``DELTA_COMMIT_MISSING``.
        """
        if self._snapshot is None or self._snapshot[0] != (version, prune):
            try:
                table = self.location.open_table(version)
            except DeltaSourceError as exc:
                earliest = self.earliest_commit()
                # delta-rs reports an unloadable old version as "no table" or a generic error.
                unloadable = exc.code in ("DELTA_TABLE_UNREADABLE", "NOT_A_DELTA_TABLE")
                if unloadable and earliest is not None and earliest > version:
                    raise self._missing(version, earliest) from exc
                raise
            check_table_protocol(self.uri, table)
            self._snapshot = ((version, prune), snapshot_files(table, version, prune))
            log.debug("%s: snapshot at version %d has %d files", self.uri, version, len(self._snapshot[1]))
        return self._snapshot[1]

    def commit(self, version: int) -> Commit | None:
        """Commit ``version``, or None if its file does not exist."""
        cached = self._commits.get(version)
        if cached is not None:
            self._commits.move_to_end(version)
            return cached
        if self._fs is None:
            self._fs = self.location.filesystem()
        lines = commit_lines(*self._fs, version)
        if lines is None:
            return None
        commit = parse_commit(version, lines)
        if commit.protocol is not None or commit.metadata is not None:
            protocol = commit.protocol or {}
            configuration = (commit.metadata or {}).get("configuration") or {}
            check_reader_protocol(
                self.uri,
                min_reader_version=int(protocol.get("minReaderVersion", 1)),
                reader_features=protocol.get("readerFeatures"),
                configuration=configuration,
            )
        self._commits[version] = commit
        if len(self._commits) > COMMIT_CACHE_SIZE:
            self._commits.popitem(last=False)
        return commit

    def commit_timestamp_ms(self, version: int) -> int | None:
        """When commit ``version`` happened, as Delta tells it; None if the commit file is gone.

        Delta's rule: the in-commit timestamp when the table records one, else
        the commit file's modification time.
        """
        commit = self.commit(version)
        if commit is None:
            return None
        if commit.in_commit_timestamp is not None:
            return commit.in_commit_timestamp
        if self._fs is None:
            self._fs = self.location.filesystem()
        fs, root = self._fs
        info = fs.get_file_info(join_path(root, commit_log_path(version)))
        if info.mtime_ns is None:
            return None
        return int(info.mtime_ns) // 1_000_000

    def first_version_at_or_after(self, timestamp_ms: int, *, option: str) -> int:
        """The first commit at or after ``timestamp_ms`` (Delta's ``startingTimestamp``).

        A time before every commit still kept gives the earliest kept commit;
        a time after the latest commit is an error (``DELTA_TIMESTAMP_AFTER_LATEST_COMMIT``),
        as in Delta. Scans back from the latest commit, so the cost is the
        number of commits since ``timestamp_ms``.
        """
        latest = self.latest_version()
        latest_ms = self.commit_timestamp_ms(latest)
        if latest_ms is not None and timestamp_ms > latest_ms:
            stamp = dt.datetime.fromtimestamp(latest_ms / 1000, dt.UTC).isoformat()
            raise DeltaSourceError(
                f"{option} is after the latest commit of {self.uri} (version {latest}, committed {stamp}); "
                "nothing was committed then yet. Use a time at or before it, or start from the next "
                "commit with the starting version 'latest'",
                code="DELTA_TIMESTAMP_AFTER_LATEST_COMMIT",
            )
        found = latest
        version = latest - 1
        while version >= 0:
            stamp_ms = self.commit_timestamp_ms(version)
            if stamp_ms is None or stamp_ms < timestamp_ms:
                break
            found, version = version, version - 1
        return found

    def added_after(self, after: int, through: int) -> set[str]:
        """Paths (relative to the table, as :func:`relative_data_path` makes them) of every file commits
        ``after + 1`` .. ``through`` added, rewrites too; a commit gone from the log is ``DELTA_COMMIT_MISSING``.

        A row committed in that range is in one of these files, or in a file a
        later commit rewrote it into, added after it: so, of the snapshot at
        ``through``, the files in this set hold every row committed after ``after``
        (and, in rewritten files, some committed before).
        """
        paths: set[str] = set()
        for version in range(max(after + 1, 0), through + 1):
            commit = self.require_commit(version)
            for path in [str(a["path"]) for a in commit.adds] + list(commit.rewrites):
                paths.add(relative_data_path(path, self.uri))
        return paths

    def require_commit(self, version: int) -> Commit:
        commit = self.commit(version)
        if commit is None:
            raise self._missing(version, self.earliest_commit())
        return commit

    def earliest_commit(self) -> int | None:
        """The oldest commit whose JSON is still in the log (log cleanup removes older ones), or None."""
        if self._fs is None:
            self._fs = self.location.filesystem()
        fs, root = self._fs
        infos = fs.get_file_info(pafs.FileSelector(join_path(root, LOG_DIR), allow_not_found=True))
        versions = [
            int(name[: -len(".json")])
            for name in (posixpath.basename(info.path) for info in infos)
            if name.endswith(".json") and name[: -len(".json")].isdigit()
        ]
        return min(versions) if versions else None

    def _missing(self, version: int, earliest: int | None) -> DeltaSourceError:
        kept = (
            f"the log now starts at commit {earliest}" if earliest is not None else "the log holds no commit file"
        )
        start = earliest if earliest is not None else "a version still in the log"
        return DeltaSourceError(
            f"commit {version} of {self.uri} is missing from {LOG_DIR}: {kept}. The stream is further behind "
            "than the table's log retention (delta.logRetentionDuration: 30 days unless set, 3 days on the retry "
            "engine's tables each micro-batch writes), and log cleanup "
            "(retry-engine maintain, or any Delta writer's checkpointing) removed what it still needed; it "
            "cannot continue without losing data. Restore the missing log files, or skip the lost commits on "
            f"purpose: start a new checkpoint with the option startingVersion={start} ([source] "
            f"starting_version = {start} in the retry engine's config) or startingTimestamp ([source] "
            "starting_timestamp). A new retry-engine checkpoint alone does not help (it resumes after the "
            "lake's last batch, which needs these commits). A Consumer of %RETRY%G or a topic: start it with a "
            "new checkpoint= (it resumes after its group's published offsets) or consume_from='latest'",
            code="DELTA_COMMIT_MISSING",
        )
