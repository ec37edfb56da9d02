"""Writing Spark DataFrames to Delta tables through delta-rs.

Executors write Parquet files into the table's folder and return what they
wrote; the driver commits them as ONE Delta transaction. Both writers carry
Delta's idempotency token, an ``(appId, version)`` transaction: batch writes
take it from the ``txnAppId`` / ``txnVersion`` options, streaming writes use
the query id (from ``<checkpointLocation>/metadata``) and the batch id, as
Delta's own sink does. delta-rs records the token but does not enforce it,
so every commit first checks ``transaction_version`` and skips a
transaction the table already has.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from retry_engine.delta import storage
from retry_engine.delta._checkpoint import read_query_id
from retry_engine.delta._files import PartitionedWriter, WrittenFile, delete_written
from retry_engine.delta._handles import keep, open_latest
from retry_engine.delta._log import TableLocation, add_actions, data_file_path
from retry_engine.delta._options import FORMAT_NAME, lower_keys, require_path
from retry_engine.delta._worker_heap import settle
from retry_engine.delta.tables import cannot_write, check_writable, ensure_table, not_null_columns
from retry_engine.errors import ConfigError, DeltaSinkError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.readwriter import DataStreamWriter

log = logging.getLogger(__name__)

WriteMode = Literal["append", "overwrite"]


@dataclass(frozen=True)
class SinkOptions:
    """Write options of ``format("deltars")``, validated on construction."""

    path: str
    partition_by: tuple[str, ...] = ()
    txn_app_id: str | None = None
    txn_version: int | None = None
    checkpoint_location: str | None = None
    # ``storage.<key>`` options (not in repr: they may hold credentials); None: the registered ones.
    storage_options: Mapping[str, str] | None = field(default=None, repr=False, compare=False)

    @property
    def location(self) -> TableLocation:
        """The table with its storage options (these, or on the driver the ones registered for ``path``)."""
        return storage.location(self.path, self.storage_options)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = lower_keys(options)
        app_id = opts.get("txnappid", "").strip() or None
        raw_version = opts.get("txnversion", "").strip()
        # ASCII digits only ("²" is a digit to str.isdigit), and what a Delta transaction version holds (int64).
        if raw_version and not (raw_version.isascii() and raw_version.isdigit() and int(raw_version) < 2**63):
            raise ConfigError(
                f"option txnVersion={raw_version!r} must be a whole number from 0 to 2^63-1", code="INVALID_OPTION"
            )
        partition_by = tuple(c.strip() for c in opts.get("partitionby", "").split(",") if c.strip())
        if len(set(partition_by)) != len(partition_by):
            raise ConfigError(f"option partitionBy={opts['partitionby']!r} repeats a column", code="INVALID_OPTION")
        path = require_path(opts)
        storage_options = storage.from_spark_options(opts)
        if storage_options is not None:
            # Also for this process's path-only helpers (ensure_table, open_table).
            storage.register(path, storage_options)
        return cls(
            path=path,
            storage_options=storage_options,
            partition_by=partition_by,
            txn_app_id=app_id,
            txn_version=int(raw_version) if raw_version else None,
            checkpoint_location=opts.get("checkpointlocation", "").strip() or None,
        )


@dataclass(frozen=True)
class FilesWritten(WriterCommitMessage):
    """What one write task produced: the add-action fields of each file."""

    files: tuple[WrittenFile, ...] = ()


def _written(messages: Sequence[WriterCommitMessage | None]) -> list[WrittenFile]:
    return [f for m in messages if isinstance(m, FilesWritten) for f in m.files]


def commit_files(
    location: TableLocation,
    messages: Sequence[WriterCommitMessage | None],
    *,
    mode: WriteMode,
    partition_by: Sequence[str],
    app_id: str | None,
    txn_version: int | None,
    replayed: bool = True,
) -> bool:
    """Commit every file in ``messages`` as one transaction; False if it was already committed.

    Replay: when the table already records ``(app_id, txn_version)`` or a later
    version of ``app_id``, nothing is committed and this attempt's files (which
    no commit references) are deleted. ``replayed`` False: the files are the ones
    that commit holds (a roll-forward of a recorded batch), kept whatever the
    snapshot says (a compaction may have replaced them since; a stream still
    reading that version needs them). An append with no files commits nothing;
    an overwrite always commits (it empties the table).
    """
    files = _written(messages)
    # Kept open from this process's last commit to the table when it is still the same table.
    handle = open_latest(location)
    table = handle.table
    if app_id is not None and txn_version is not None:
        done = table.transaction_version(app_id)
        if done is not None and done >= txn_version:
            log.info(
                "%s: transaction %s/%d already committed (table has %d); skipped, %d new file(s) dropped",
                location.uri, app_id, txn_version, done, len(files),
            )
            keep(handle)
            if replayed:
                abort_files(location, messages)
            return False
    if not files and mode == "append":
        log.debug("%s: nothing to commit for %s/%s", location.uri, app_id, txn_version)
        keep(handle)
        return False
    actions: list[AddAction | RemoveAction] = [f.add_action(data_change=True) for f in files]
    transactions = [Transaction(app_id, txn_version)] if app_id is not None and txn_version is not None else None
    # An overwrite is never rebased by delta-rs: it would remove the files of the snapshot it planned on
    # over a commit that replaced them (a compaction), and the replacement, holding the old rows, would
    # stay beside the new ones. It is planned again on the new snapshot instead.
    properties = CommitProperties(app_transactions=transactions, max_commit_retries=0 if mode == "overwrite" else None)
    for attempt in range(1, OVERWRITE_ATTEMPTS + 1):
        try:
            table.create_write_transaction(
                actions,
                mode=mode,
                schema=table.schema(),
                partition_by=list(partition_by) or None,
                commit_properties=properties,
            )
            break
        except CommitFailedError as exc:
            refused = cannot_write(location.uri, exc)
            if refused is not None:
                raise refused from exc
            failed = DeltaSinkError(
                f"{location.uri}: commit of {len(files)} file(s) for transaction {app_id}/{txn_version} failed "
                f"(another writer with the same id, or a conflicting change): {exc}",
                code="DELTA_COMMIT_FAILED",
            )
            if (mode != "overwrite" and app_id is None) or attempt == OVERWRITE_ATTEMPTS:
                raise failed from exc
            handle = open_latest(location)
            table = handle.table
            done = table.transaction_version(app_id) if app_id is not None else None
            if done is not None and txn_version is not None and done >= txn_version:
                # The transaction is in the table: this very commit, whose answer was lost (on object
                # storage a retried put then meets its own first attempt), or another copy of this write.
                log.info("%s: transaction %s/%d is in the table after the commit failed (%s); done",
                         location.uri, app_id, txn_version, exc)
                keep(handle)
                if replayed:
                    # Nothing once the table records the transaction: its commit may be this one, whose
                    # files a compaction may have replaced since (a stream of that version needs them).
                    abort_files(location, messages, transaction=(app_id, txn_version))
                return False
            if mode != "overwrite":
                raise failed from exc
            log.info("%s: overwrite conflicted with another commit (attempt %d); planning it again: %s",
                     location.uri, attempt, exc)
    keep(handle)
    log.info(
        "%s: committed %d file(s), %d row(s) (%s, txn %s/%s)",
        location.uri, len(files), sum(f.num_records for f in files), mode, app_id, txn_version,
    )
    return True


# Commits of one overwrite, each planned on the latest snapshot, before a conflict is the write's error.
OVERWRITE_ATTEMPTS = 10


def abort_files(
    location: TableLocation,
    messages: Sequence[WriterCommitMessage | None],
    *,
    transaction: tuple[str | None, int | None] = (None, None),
) -> None:
    """Delete the files of a failed write, except any a commit already references.

    Spark also aborts when ``commit`` raises, and a commit may have landed
    before the error (e.g. in a post-commit hook), so referenced files stay.
    ``transaction``: the write's (app id, version); once the table records it, nothing is deleted.
    """
    delete_uncommitted(location, _written(messages), transaction=transaction)


def delete_uncommitted(
    location: TableLocation,
    files: Sequence[WrittenFile],
    *,
    transaction: tuple[str | None, int | None] = (None, None),
) -> None:
    """Delete ``files``, written for a commit that failed, except any the table's snapshot references
    (the commit landed before its error: delta-rs's post-commit hooks fail after it). When the table
    cannot be read, every file stays: an orphan is invisible to readers, a deleted live file is not.
    Nor when the table records ``transaction`` (app id, version): the commit landed, and a compaction
    since may have replaced its files, which a stream still reading that version needs (files of a
    replay the commit skipped stay as orphans: maintenance's vacuum deletes them after the retention)."""
    if not files:
        return
    app_id, version = transaction
    try:
        table = DeltaTable(location.table_uri, storage_options=dict(location.storage_options or {}) or None)
        done = table.transaction_version(app_id) if app_id is not None else None
        if done is not None and version is not None and done >= version:
            log.warning("%s: transaction %s/%d is in the table; its %d file(s) stay", location.uri, app_id, version, len(files))
            return
        logged = add_actions(table, flatten=False).column("path").to_pylist()
        # Compared decoded: writers may URL-encode one physical path in different ways.
        referenced = {data_file_path(p) for p in logged}
    except (DeltaError, OSError) as exc:
        log.warning("%s: cannot read the table to abort (%s); leaving %d file(s) in place", location.uri, exc, len(files))
        return
    delete_written(*location.filesystem(), [f for f in files if data_file_path(f.path) not in referenced])


class _DeltaWriter:
    """Shared by the batch and stream writers: set-up on the driver, ``write`` on executors.

    Set-up creates the table if missing, or checks the DataFrame against it
    (:class:`SchemaMismatchError` naming the column), so every task writes
    files of the table's schema and partitioning.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        self.options = SinkOptions.parse(options)
        self.location = self.options.location
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.mode: WriteMode = "overwrite" if overwrite else "append"
        missing = [c for c in self.options.partition_by if c not in self.arrow_schema.names]
        if missing:
            raise ConfigError(
                f"partitionBy column {missing[0]!r} is not a column of the DataFrame {self.arrow_schema.names}",
                code="INVALID_OPTION",
            )
        table = ensure_table(self.location.table_uri, self.arrow_schema, partition_by=self.options.partition_by)
        check_writable(self.location.uri, table)
        self.partition_by = tuple(table.metadata().partition_columns)
        self.not_null = not_null_columns(table)
        app_id = self.options.txn_app_id
        self.committed_txn = table.transaction_version(app_id) if app_id is not None else None
        self.skip_writes = False

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        """Write this task's rows as new Parquet files (invisible until the driver commits)."""
        settle()
        if self.skip_writes:
            for _ in iterator:
                pass
            return FilesWritten()
        fs, root = self.location.filesystem()
        writer = PartitionedWriter(
            fs, root, self.arrow_schema, partition_by=self.partition_by, not_null=self.not_null, uri=self.location.uri
        )
        try:
            for batch in iterator:
                writer.write(batch)
            return FilesWritten(tuple(writer.close()))
        except BaseException:
            writer.discard()
            raise


class DeltaBatchWriter(_DeltaWriter, DataSourceArrowWriter):
    """``df.write.format("deltars")``: one transaction; idempotent with ``txnAppId`` + ``txnVersion``.

    Replay (same ``txnAppId``/``txnVersion`` again, e.g. a replayed
    ``foreachBatch``): detected on the driver before any task writes, and
    again at commit, so the table gets the data once.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        parsed = SinkOptions.parse(options)
        if (parsed.txn_app_id is None) != (parsed.txn_version is None):
            raise ConfigError("options txnAppId and txnVersion go together; set both or neither", code="INVALID_OPTION")
        super().__init__(options, schema, overwrite)
        done, wanted = self.committed_txn, self.options.txn_version
        self.skip_writes = done is not None and wanted is not None and done >= wanted
        if self.skip_writes:
            log.info(
                "%s: transaction %s/%s already committed (table has %s); write skipped",
                self.location.uri, self.options.txn_app_id, wanted, done,
            )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.skip_writes:
            return
        commit_files(
            self.location,
            messages,
            mode=self.mode,
            partition_by=self.partition_by,
            app_id=self.options.txn_app_id,
            txn_version=self.options.txn_version,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_files(self.location, messages, transaction=(self.options.txn_app_id, self.options.txn_version))


class DeltaStreamWriter(_DeltaWriter, DataSourceStreamArrowWriter):
    """``writeStream.format("deltars")``: one transaction per micro-batch, exactly once.

    The transaction id is ``txnAppId`` if given, else the query id Spark keeps
    in ``<checkpointLocation>/metadata``; its version is the batch id. Spark
    makes a new writer for every commit, so nothing is kept between batches.

    Replay: a batch whose Delta commit landed but whose checkpoint commit did
    not is re-run by Spark with the same batch id; ``commit`` finds the
    transaction in the table, skips it and deletes the replay's files.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        parsed = SinkOptions.parse(options)
        if parsed.txn_version is not None:
            raise ConfigError(
                "option txnVersion is for batch writes; a stream uses its batch id", code="INVALID_OPTION"
            )
        if parsed.txn_app_id is None and parsed.checkpoint_location is None:
            raise DeltaSinkError(
                "writeStream.format('deltars') needs option checkpointLocation (the session-wide "
                "spark.sql.streaming.checkpointLocation does not reach data sources) or option txnAppId, "
                "to tie its idempotent commits to the query",
                code="SINK_APP_ID",
            )
        super().__init__(options, schema, overwrite)

    def app_id(self) -> str:
        """The idempotency key: ``txnAppId``, else the checkpoint's query id."""
        if self.options.txn_app_id is not None:
            return self.options.txn_app_id
        checkpoint = self.options.checkpoint_location or ""
        query_id = read_query_id(checkpoint)
        if query_id is None:
            raise DeltaSinkError(
                f"no query id in {checkpoint}/metadata; Spark writes it when the query starts",
                code="SINK_APP_ID",
            )
        return query_id

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_files(
            self.location,
            messages,
            mode=self.mode,
            partition_by=self.partition_by,
            app_id=self.app_id(),
            txn_version=batchId,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("%s: batch %d aborted", self.location.uri, batchId)
        abort_files(self.location, messages, transaction=(self.app_id(), batchId))


def write_stream(
    df: DataFrame, path: str, *, checkpoint: str, partition_by: Sequence[str] = ()
) -> DataStreamWriter:
    """``df.writeStream`` to the Delta table at ``path``, exactly once, tied to ``checkpoint``.

    Returns the configured writer: set a trigger if needed and ``start()`` it.
    """
    writer = df.writeStream.format(FORMAT_NAME).option("path", path).option("checkpointLocation", checkpoint)
    if partition_by:
        writer = writer.option("partitionBy", ",".join(partition_by))
    return writer

