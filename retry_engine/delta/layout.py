"""Moving data files of older partition layouts into Hive-standard folders.

Engines before the Hive layout wrote partition folders such as
``consumer_5Fgroup=order_5Fgroup``, which Delta readers accept (they take
partition values from the log) but Hive-partitioned readers misread (Spark's
``read.parquet`` sees a column ``consumer_5Fgroup``, Polars fails).
:func:`migrate_partition_folders` rewrites such files into the folders
:func:`~retry_engine.delta._files.partition_folder` names and commits, in one
Delta transaction, a ``remove`` of each old file and an ``add`` of its new
copy, all with ``dataChange`` false, as OPTIMIZE does: the table's rows do not
change, streaming readers (Delta's own and ``format("deltars")``) skip the
commit, and time travel to older versions still reads the old files until
VACUUM removes them.

Concurrency: the commit is made against the very version that was read and
is never rebased, so a writer that committed in between (an append, a
re-drive, a resolve) makes it fail; the new copies are then deleted and the
migration starts again from the new version. A file is thus never both
removed by someone else and re-added here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from retry_engine.delta import storage
from retry_engine.delta._files import (
    HIVE_NULL,
    FileToRead,
    PartitionedWriter,
    WrittenFile,
    delete_written,
    partition_folder,
    read_file,
)
from retry_engine.delta._log import (
    FileEntry,
    TableLocation,
    data_file_path,
    snapshot_files,
)
from retry_engine.delta.sink import delete_uncommitted
from retry_engine.delta.tables import (
    check_writable,
    commit_next,
    not_null_columns,
    table_arrow_schema,
)
from retry_engine.errors import ConcurrentWriteError, DeltaSinkError, DeltaSourceError

log = logging.getLogger(__name__)

# Each attempt fails only when another writer committed while this one rewrote the
# files; a handful covers operator tools running now and then.
MAX_MIGRATION_ATTEMPTS = 5
MIGRATION_OPERATION = "retry-engine: Hive partition folders"


@dataclass(frozen=True)
class LayoutMigration:
    """What :func:`migrate_partition_folders` did to one table."""

    uri: str
    files_moved: int
    rows_moved: int
    version: int | None
    """The table version of the migration commit; None when nothing needed moving."""


def folder_matches(path: str, values: Mapping[str, str | None], columns: Sequence[str]) -> bool:
    """Whether a Hive reader gets ``values`` back from the folders of data file ``path`` (as in the log).

    True for the folders this package writes now and for any other spelling a
    Hive reader decodes to the same columns and values (delta-rs escapes more
    characters, e.g. ``|`` as ``%7C``): only files a Hive reader misreads move.
    """
    folders = data_file_path(path).split("/")[:-1]
    if not columns:
        return not folders
    if folders == partition_folder(values, columns).split("/"):
        return True
    if len(folders) != len(columns):
        return False
    for folder, column in zip(folders, columns, strict=True):
        name, sep, raw = folder.partition("=")
        if not sep or unquote(name) != column:
            return False
        decoded: str | None = None if raw == HIVE_NULL else unquote(raw)
        expected = values.get(column)
        if decoded != (None if expected == "" else expected):
            return False
    return True


def misplaced_files(table: DeltaTable) -> list[FileEntry]:
    """The data files of ``table``'s current snapshot whose folders a Hive reader misreads."""
    columns = list(table.metadata().partition_columns)
    if not columns:
        return []
    entries = snapshot_files(table, table.version())
    return [e for e in entries if not folder_matches(e.path, e.partition_values, columns)]


def migrate_partition_folders(
    uri: str, *, storage_options: Mapping[str, str] | None = None
) -> LayoutMigration:
    """Move every misplaced data file of the Delta table at ``uri`` into its Hive folder.

    Does nothing (and commits nothing) when the table does not exist, is not
    partitioned, or has no misplaced file, so it is cheap to run at every
    start. Raises :class:`~retry_engine.errors.ConcurrentWriteError`
    (``TABLE_MOVED``) when other writers commit during each of
    :data:`MAX_MIGRATION_ATTEMPTS` attempts; the table is then unchanged
    (still readable by every Delta reader) and the migration can run again.
    """
    # Default to the lake's registered options: an S3 table opened without them asks IMDS for credentials.
    location = storage.location(uri, storage_options)
    options = dict(location.storage_options) if location.storage_options else None
    last: CommitFailedError | None = None
    for attempt in range(1, MAX_MIGRATION_ATTEMPTS + 1):
        try:
            with storage.reaching(uri):
                table = DeltaTable(location.table_uri, storage_options=options)
        except TableNotFoundError:
            return LayoutMigration(uri, 0, 0, None)
        misplaced = misplaced_files(table)
        if not misplaced:
            return LayoutMigration(uri, 0, 0, None)
        try:
            check_writable(uri, table, rewrite=True)
        except (DeltaSinkError, DeltaSourceError) as exc:
            # Another writer's table (deletion vectors, column mapping, row rules): its files are where
            # that writer put them, and a copy read as plain Parquet would not hold the same rows.
            log.info("%s: %d data file(s) outside Hive folders left where they are: %s", uri, len(misplaced), exc)
            return LayoutMigration(uri, 0, 0, None)
        written = _rewrite(location, table, misplaced)
        try:
            version = commit_next(table, misplaced, written, data_change=False, operation=MIGRATION_OPERATION)
        except CommitFailedError as exc:
            delete_uncommitted(location, written)
            last = exc
            log.info(
                "%s: partition folder migration conflicted with another writer (attempt %d); again",
                uri,
                attempt,
            )
            continue
        except BaseException:
            # Unless the commit landed before its error, nothing references the copies: delete them.
            delete_uncommitted(location, written)
            raise
        rows = sum(f.num_records for f in written)
        log.warning(
            "%s: moved %d data file(s) (%d rows) of an older partition layout into Hive folders "
            "(version %d, no data change; the old files stay for time travel until VACUUM)",
            uri,
            len(misplaced),
            rows,
            version,
        )
        return LayoutMigration(uri, len(misplaced), rows, version)
    raise ConcurrentWriteError(
        f"{uri}: moving data files into Hive partition folders conflicted with other writers "
        f"{MAX_MIGRATION_ATTEMPTS} times in a row; the table is unchanged and still readable by Delta readers. "
        f"Run it again when re-drives and other writers of this table are idle: {last}",
    ) from last


def _rewrite(
    location: TableLocation, table: DeltaTable, files: Sequence[FileEntry]
) -> list[WrittenFile]:
    """Copy the rows of ``files`` into new files under Hive folders (not yet committed)."""
    fs, root = location.filesystem()
    schema = table_arrow_schema(table)
    writer = PartitionedWriter(
        fs,
        root,
        schema,
        partition_by=list(table.metadata().partition_columns),
        not_null=not_null_columns(table),
        uri=location.uri,
    )
    try:
        for entry in files:
            source = FileToRead(
                entry.path, entry.partition_values, entry.version, entry.index, True
            )
            for batch in read_file(fs, root, source, schema, table_uri=location.table_uri):
                writer.write(batch)
        return writer.close()
    except BaseException:
        writer.discard()
        delete_written(fs, root, writer.done)
        raise
