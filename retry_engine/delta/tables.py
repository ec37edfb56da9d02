"""Plain-Python helpers over Delta tables (no Spark): create, check, read, append."""

from __future__ import annotations

import datetime as dt
import json
import logging
import posixpath
import time
import uuid
from collections.abc import Callable, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from retry_engine.delta._handles import Handle, keep, open_or_create
from retry_engine.delta._schema import (
    SchemaDrift,
    check_partition_columns,
    check_write_schema,
    schema_drift,
)
from retry_engine.delta.storage import (
    CHECKPOINT_INTERVAL,
    EARLIER_INTERVAL,
    ENGINE_INTERVAL,
    TABLE_PROPERTIES,
    add_columns,
    create_delta,
    location,
    open_delta,
    reaching,
    set_properties,
)
from retry_engine.errors import (
    ConcurrentWriteError,
    ConfigError,
    DeltaSinkError,
    SchemaMismatchError,
)

if TYPE_CHECKING:
    import pyarrow.dataset as ds

    from retry_engine.delta._files import WrittenFile
    from retry_engine.delta._log import FileEntry

log = logging.getLogger(__name__)

# A file's statistics may keep a timestamp to the millisecond (Spark's do, a maximum truncated down):
# a pruning predicate on one is widened by this much.
STATS_SLACK = dt.timedelta(milliseconds=1)


def stats_from(when: dt.datetime) -> dt.datetime:
    """``when`` widened down by :data:`STATS_SLACK` for a pruning predicate (``>=``), never past the
    first date a datetime holds (a bound from outside may be year 1)."""
    return when - STATS_SLACK if when - dt.datetime.min.replace(tzinfo=when.tzinfo) >= STATS_SLACK else when


def stats_until(when: dt.datetime) -> dt.datetime:
    """``when`` widened up by :data:`STATS_SLACK` for a pruning predicate (``<=``), never past the last
    date a datetime holds."""
    return when + STATS_SLACK if dt.datetime.max.replace(tzinfo=when.tzinfo) - when >= STATS_SLACK else when


def pyarrow_dataset(table: DeltaTable, file_pruning_predicate: Any = None) -> ds.FileSystemDataset:
    """delta-rs's pyarrow dataset of ``table`` (optionally pruned), whose files a filter never skips wrongly.

    delta-rs gives each file a guarantee built from its statistics (``col >= min and col <= max``).
    For a file without statistics of a column (another writer's: Spark with
    ``delta.dataSkippingNumIndexedCols``, an old writer) it writes ``col >= null`` (deltalake 1.6),
    which a filter on that column takes for "no row here": the whole file is skipped, its rows lost
    to the reader. Such a file's guarantee is its partition values alone; the others keep theirs.
    """
    from urllib.parse import unquote

    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from retry_engine.delta._log import PARTITION_PREFIX, add_actions, check_table_protocol

    check_table_protocol(table.table_uri, table)  # delta-rs's dataset reads column mapping's reader v2 as nulls
    dataset = table.to_pyarrow_dataset(file_pruning_predicate=file_pruning_predicate)
    actions = add_actions(table)
    counts = [c for c in actions.column_names if c.startswith("null_count.")]
    if not counts or actions.num_rows == 0:
        return dataset
    unstated = pc.is_null(actions[counts[0]])
    for name in counts[1:]:
        unstated = pc.or_(unstated, pc.is_null(actions[name]))
    if not pc.any(unstated).as_py():
        return dataset
    parts = [c for c in actions.column_names if c.startswith(PARTITION_PREFIX)]
    # The log's paths are URL-encoded once more than the fragments' (a partition value "a b": "a%2520b", "a%20b").
    bare = {unquote(r.pop("path")): r for r in actions.filter(unstated).select(["path", *parts]).to_pylist()}
    fragments = []
    for fragment in dataset.get_fragments():
        values = bare.get(fragment.path)
        if values is None:
            fragments.append(fragment)
            continue
        guarantee = pc.scalar(True)
        for name, value in values.items():
            column = name[len(PARTITION_PREFIX):]
            field = pc.field(column)
            kind = dataset.schema.field(column).type
            guarantee = guarantee & (~field.is_valid() if value is None else field == pa.scalar(value).cast(kind))
        fragments.append(dataset.format.make_fragment(fragment.path, dataset.filesystem, partition_expression=guarantee))
    return ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)


def require_columns(
    table: DeltaTable, columns: Sequence[str], table_name: str, schema: pa.Schema | None = None
) -> None:
    """:class:`SchemaMismatchError` naming the first of ``columns`` the table lacks (another writer replaced
    or rewrote it), before a read fails on it deep inside pyarrow. ``schema``: the table's, if read already."""
    have = set((schema if schema is not None else table_arrow_schema(table)).names)
    missing = [c for c in columns if c not in have]
    if missing:
        raise SchemaMismatchError(
            f"table {table_name} at {table.table_uri} has no column {missing[0]!r} (it has {sorted(have)}): another "
            f"writer replaced or rewrote it; {table_name} needs {', '.join(columns)}",
        )


def cast_not_null(rows: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """``rows`` cast to ``schema``; :class:`SchemaMismatchError` naming the column and how many rows when
    another writer left a null in a column this release never leaves empty (the cast's own error names
    neither the table nor what to do)."""
    for field in schema:
        if not field.nullable and field.name in rows.column_names and rows.column(field.name).null_count:
            raise SchemaMismatchError(
                f"{where} holds {rows.column(field.name).null_count} row(s) without {field.name!r}, which the "
                f"engine always fills: another writer wrote them. Delete or mend them (e.g. DELETE ... WHERE "
                f"{field.name} IS NULL) and run again",
                code="NULL_IN_REQUIRED_COLUMN",
            )
    return rows.cast(schema)


def read_columns(
    table: DeltaTable,
    expected: pa.Schema,
    columns: Sequence[str],
    *,
    files: Any = None,
    rows: Any = None,
) -> pa.Table:
    """``columns`` of the snapshot ``table`` in the engine's types (``expected``): of the files the
    delta-rs predicate ``files`` may match (:func:`pyarrow_dataset`), the ``rows`` (an expression on
    ``columns``) picks.

    A column another writer changed to another type (a time as text or without a zone) prunes no
    file, and is read as the engine reads a column of consume_results
    (:func:`~retry_engine.core.decide.cast_columns`: no zone is UTC, a value with no such form null)
    before ``rows`` picks: its statistics and its values are of the other type.
    """
    from retry_engine.core.decide import cast_columns, drifted_columns

    wanted = list(columns)
    needed = [*wanted, *(term[0] for term in _terms(files))]
    schema = table_arrow_schema(table)
    require_columns(table, needed, posixpath.basename(table.table_uri.rstrip("/")), schema)
    drifted = drifted_columns(schema, expected, needed)
    if not drifted:
        if files is None and rows is None:
            from retry_engine.delta._log import check_table_protocol

            check_table_protocol(table.table_uri, table)
            return pa.table(table.to_pyarrow_table(columns=wanted))
        return pyarrow_dataset(table, files).to_table(columns=wanted, filter=rows)
    log.info("%s of another type than the engine's: it prunes no file, and is cast before rows are picked", ", ".join(drifted))
    read = cast_columns(pyarrow_dataset(table, _without(files, drifted)).to_table(columns=wanted), expected, drifted)
    return read if rows is None else read.filter(rows)


def _conjunctions(files: Any) -> list[list[tuple[str, str, Any]]]:
    """The delta-rs predicate ``files`` (terms, or a list of term lists: an OR of ANDs) as a list of ANDs."""
    if not files:
        return []
    return [files] if isinstance(files[0], tuple) else files


def _terms(files: Any) -> list[tuple[str, str, Any]]:
    return [term for terms in _conjunctions(files) for term in terms]


def _without(files: Any, columns: Sequence[str]) -> Any:
    """The delta-rs predicate ``files`` without the terms on ``columns``: it then matches at least the
    files it matched. None when nothing is left to prune by."""
    if not files:
        return None
    kept = [[term for term in terms if term[0] not in columns] for terms in _conjunctions(files)]
    if any(not terms for terms in kept):  # a conjunction left empty matches every file
        return None
    return kept[0] if isinstance(files[0], tuple) else kept


def commit_next(
    table: DeltaTable,
    removed: Sequence[FileEntry],
    added: Sequence[WrittenFile] = (),
    *,
    data_change: bool,
    operation: str,
    app_transaction: tuple[str, int] | None = None,
) -> int:
    """Commit removes of ``removed`` and adds of ``added`` as the version after ``table``'s; that
    version, or :class:`CommitFailedError` when another writer committed in between (never rebased:
    delta-rs would rebase removes over a commit that removed the same files first).
    ``app_transaction``: (app id, version) of a transaction action committed with them.

    ``data_change`` False: the rows do not change (a rewrite, as OPTIMIZE); True: ``removed`` rows are
    gone and ``added`` ones new. ``operation``: the commit's ``retry_engine.operation``. Paths are
    given physical: delta-rs URL-encodes them into the log itself.
    """
    from retry_engine.delta._log import data_file_path

    now = int(time.time() * 1000)
    actions: list[AddAction | RemoveAction] = [
        RemoveAction(
            path=data_file_path(entry.path),
            data_change=data_change,
            deletion_timestamp=now,
            size=entry.size,
            partition_values=dict(entry.partition_values),
        )
        for entry in removed
    ]
    actions += [f.add_action(data_change=data_change) for f in added]
    version = table.version() + 1
    token = uuid.uuid4().hex
    try:
        table.create_write_transaction(
            actions,
            mode="append",
            schema=table.schema(),
            partition_by=list(table.metadata().partition_columns) or None,
            commit_properties=CommitProperties(
                max_commit_retries=0,
                custom_metadata={"retry_engine.operation": operation, COMMIT_TOKEN_KEY: token},
                app_transactions=[Transaction(*app_transaction)] if app_transaction is not None else None,
            ),
        )
    except CommitFailedError as exc:
        refused = cannot_write(table.table_uri, exc)
        if refused is not None:
            raise refused from exc
        raise  # another writer's version first: nothing of ours is in the log
    except Exception as exc:
        # delta-rs runs its post-commit hooks (a checkpoint, log cleanup) after the commit is in the
        # log: their failure raises for a commit that stands, whose files must not be deleted.
        if not is_own_commit(table.table_uri, version, token):
            raise
        log.warning(
            "%s: version %d (%s) is committed, but delta-rs failed after the commit: %s",
            table.table_uri, version, operation, exc,
        )
    return version


# The commitInfo key by which :func:`commit_next` recognises its own commit after an error.
COMMIT_TOKEN_KEY = "retry_engine.commit"


def is_own_commit(uri: str, version: int, token: str) -> bool:
    """Whether commit ``version`` of the table at ``uri`` carries ``token`` under
    :data:`COMMIT_TOKEN_KEY` in its commitInfo: the commit a writer made with it (:func:`commit_next`,
    the lease's row) landed, though delta-rs raised. False also when the log cannot be read: the
    caller then treats it as not committed (and deletes only files no commit references)."""
    from retry_engine.delta._log import commit_lines

    try:
        lines = commit_lines(*location(uri).filesystem(), version) or []
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("%s: cannot read commit %d to see whether it is ours: %s", uri, version, exc)
        return False
    for line in lines:
        try:
            action = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        info = action.get("commitInfo") if isinstance(action, dict) else None
        if isinstance(info, dict) and info.get(COMMIT_TOKEN_KEY) == token:
            return True
    return False


def open_table(path: str) -> DeltaTable | None:
    """The table at ``path`` (a folder or URI, with its storage options), or None if there is none."""
    try:
        return open_delta(path)
    except TableNotFoundError:
        return None


def table_version(path: str) -> int | None:
    """The latest version of the table at ``path``, or None if there is no table."""
    table = open_table(path)
    return None if table is None else table.version()


def table_arrow_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


# Column metadata of row rules a writer checks in every row it writes (Delta's invariants, generated
# and identity columns) and what each is called.
_ROW_RULE_KEYS = {
    "delta.invariants": "an invariant",
    "delta.generationExpression": "a generated column",
    "delta.identity.start": "an identity column",
}
# delta-rs's CommitFailedError for a table it cannot write at all: no conflict, retrying changes nothing.
_CANNOT_WRITE = ("Unsupported table features required", "Delta table is append-only")


def files_written_here_break(table: DeltaTable) -> list[str]:
    """What of ``table``'s rules a Parquet file written by this package (Spark's ``deltars`` sink, the
    engine's outputs, a rewrite) would break: delta-rs checks CHECK constraints, invariants and
    generated columns only inside ``write_deltalake``, and such a file names its columns by their
    logical names, which a table with column mapping does not read."""
    config = table.metadata().configuration
    broken = []
    mapping = str(config.get("delta.columnMapping.mode") or "none").lower()
    if mapping != "none":
        broken.append(f"column mapping ({mapping!r})")
    checks = sorted(k[len("delta.constraints."):] for k in config if k.lower().startswith("delta.constraints."))
    if checks:
        broken.append(f"CHECK constraints ({', '.join(checks)})")
    pending = list(table.schema().fields)
    while pending:
        field = pending.pop(0)
        broken += [f"{what} ({field.name})" for key, what in _ROW_RULE_KEYS.items() if key in (field.metadata or {})]
        kind = field.type
        pending += list(getattr(kind, "fields", None) or ())  # a struct's fields
    return broken


def check_writable(uri: str, table: DeltaTable, *, rewrite: bool = False) -> None:
    """:class:`DeltaSinkError` (``DELTA_UNSUPPORTED_WRITER_FEATURE``) naming what files written here
    would break in ``table`` (:func:`files_written_here_break`), before any is written. ``rewrite``: the
    caller also reads the table's files to copy their rows (compaction, expiry, the layout migration),
    so a table whose files a plain read gets wrong (deletion vectors) is refused too
    (``DELTA_UNSUPPORTED_FEATURE``)."""
    if rewrite:
        from retry_engine.delta._log import check_table_protocol

        check_table_protocol(uri, table)
    broken = files_written_here_break(table)
    if broken:
        raise DeltaSinkError(
            f"{uri} has {'; '.join(broken)}, which files written by the retry engine's Delta writer would not "
            "keep (delta-rs checks such rules only in write_deltalake); write this table without them, or "
            "point the engine at another table",
            code="DELTA_UNSUPPORTED_WRITER_FEATURE",
        )


def cannot_write(uri: str, exc: BaseException) -> DeltaSinkError | None:
    """The coded error for delta-rs's refusal ``exc`` of a table it cannot write (a writer feature it
    lacks, a remove in an append-only table), which is no conflict: a retry fails the same way."""
    text = str(exc)
    if not any(words in text for words in _CANNOT_WRITE):
        return None
    return DeltaSinkError(f"{uri}: delta-rs cannot write this table: {text}", code="DELTA_UNSUPPORTED_WRITER_FEATURE")


def not_null_columns(table: DeltaTable) -> tuple[str, ...]:
    """Columns the table declares NOT NULL (writers check them before writing a file)."""
    return tuple(f.name for f in table_arrow_schema(table) if not f.nullable)


def ensure_table(
    path: str,
    arrow_schema: pa.Schema,
    *,
    partition_by: Sequence[str] = (),
    add_missing: bool = False,
    properties: Mapping[str, str] = TABLE_PROPERTIES,
) -> DeltaTable:
    """Create the table at ``path`` if missing; else check ``arrow_schema`` fits it.

    Raises :class:`~retry_engine.errors.SchemaMismatchError` naming the first
    column that is missing, extra or of another type (nullability is not
    compared), or when ``partition_by`` is given and differs from the table's.
    Idempotent: concurrent creators end with one table.

    ``add_missing``: for the engine's own tables, whose schema is the
    release's. Nullable columns of ``arrow_schema`` that the table lacks
    (added by a later release) are added to it first, logged one INFO line per
    column; existing rows read them as null. A missing NOT NULL column, an
    extra column or another type still raise: old rows cannot satisfy the
    first, and the others are not additive. Then the engine's table properties
    it lacks are set (:func:`add_missing_properties`, ``properties``); a table created
    with ``add_missing`` gets them all, any other keeps delta-rs's defaults.
    """
    table = open_table(path)
    if table is None:
        missing = [c for c in partition_by if c not in arrow_schema.names]
        if missing:
            raise ConfigError(
                f"partition column {missing[0]!r} is not a column of the data {arrow_schema.names}",
                code="INVALID_OPTION",
            )
        table = create_delta(
            path,
            arrow_schema,
            mode="ignore",
            partition_by=list(partition_by) or None,
            configuration=dict(properties) if add_missing else None,
        )
        log.info("created Delta table %s partitioned by %s", path, list(partition_by))
        table = _checked(path, table, arrow_schema, partition_by)
        # The interval's mark cannot be in a new table's configuration (storage.ENGINE_INTERVAL).
        return add_missing_properties(path, table, properties=properties) if add_missing else table
    if add_missing:
        table = _add_missing_columns(path, table, arrow_schema)
    table = _checked(path, table, arrow_schema, partition_by)
    # Only a table that passed the checks is changed further.
    return add_missing_properties(path, table, properties=properties) if add_missing else table


# Another engine (or an operator tool) upgrading the same table at once makes the upgrade's
# commit conflict; each conflict re-reads the table, which then usually has the change.
MAX_UPGRADE_ATTEMPTS = 10


def _upgrade(
    path: str,
    table: DeltaTable,
    *,
    what: str,
    missing: Callable[[DeltaTable], Sized],
    apply: Callable[[int, Any], None],
) -> tuple[DeltaTable, Any]:
    """The table after ``apply(version, missing(table))``, retried on conflicts; ``(table, applied)``.

    ``missing`` says what the table lacks (empty: nothing to do, ``applied`` is
    empty); ``apply`` commits it against ``version``, so a commit by anyone since
    raises ``CommitFailedError`` and the table is read and checked again.
    """
    last_error: CommitFailedError | None = None
    for attempt in range(1, MAX_UPGRADE_ATTEMPTS + 1):
        wanted = missing(table)
        if not wanted:
            return table, wanted
        try:
            apply(table.version(), wanted)
        except CommitFailedError as exc:
            last_error = exc
            log.info("%s: %s conflicted with another commit (attempt %d); checking again", path, what, attempt)
            table = open_delta(path)
            continue
        return open_delta(path), wanted
    raise ConcurrentWriteError(
        f"{path}: {what} conflicted {MAX_UPGRADE_ATTEMPTS} times in a row with other commits: {last_error}",
    ) from last_error


def _add_missing_columns(path: str, table: DeltaTable, arrow_schema: pa.Schema) -> DeltaTable:
    """The table after adding the nullable columns of ``arrow_schema`` it lacks (see :func:`ensure_table`)."""

    def missing(current: DeltaTable) -> list[pa.Field]:
        have = table_arrow_schema(current)
        lacking = [f for f in arrow_schema if f.name not in have.names]
        if not lacking:
            return lacking
        # Types and extra columns first: a table that fails them is left unchanged.
        check_write_schema(path, have, pa.schema([f for f in arrow_schema if f.name in have.names]))
        not_null = [f for f in lacking if not f.nullable]
        if not_null:
            f = not_null[0]
            raise SchemaMismatchError(
                f"{path}: the table lacks column {f.name!r} ({f.type}, NOT NULL) that this release writes; a NOT "
                f"NULL column cannot be added to a table whose rows have no value for it. Table columns: "
                f"{have.names}. Rewrite the table with the new schema, or run the release that wrote it",
                code="COLUMN_MISSING_IN_TABLE",
            )
        return lacking

    table, added = _upgrade(
        path,
        table,
        what="adding this release's columns",
        missing=missing,
        apply=lambda version, fields: add_columns(path, fields, version=version),
    )
    for f in added:
        log.info(
            "%s: added column %r (%s, nullable) of this release's schema; existing rows read it as null",
            path,
            f.name,
            f.type,
        )
    return table


# The table property that tells a table's writers to remove expired log files at each checkpoint.
EXPIRED_LOG_CLEANUP = "delta.enableExpiredLogCleanup"


def writers_clean_log(table: DeltaTable) -> bool:
    """Whether the table's writers remove its expired log files themselves (so maintenance must not).

    True unless :data:`EXPIRED_LOG_CLEANUP` is ``false`` (Delta's default is
    true; a value Delta would not parse as a boolean counts as the default).
    Measured with delta-rs 1.6: two ``cleanup_metadata`` calls at once raise
    ``FileNotFoundError`` on the file the other deleted first, and an append
    whose post-commit checkpoint cleans the log while maintenance does raises
    it too, after its commit landed.
    """
    value = table.metadata().configuration.get(EXPIRED_LOG_CLEANUP)
    return value is None or str(value).strip().lower() != "false"


def add_missing_properties(
    path: str, table: DeltaTable | None = None, *, properties: Mapping[str, str] = TABLE_PROPERTIES
) -> DeltaTable:
    """The table at ``path`` after setting the ``properties`` (default
    :data:`~retry_engine.delta.storage.TABLE_PROPERTIES`) it lacks.

    For the engine's own tables made by an earlier release: a property the
    table has, whatever its value, is kept (an operator's choice), except a
    checkpoint interval the engine set itself (:func:`properties_wanted`).
    """
    table, added = _upgrade(
        path,
        table if table is not None else open_delta(path),
        what="setting table properties",
        missing=lambda current: properties_wanted(current.metadata().configuration, properties),
        apply=lambda version, properties: set_properties(path, properties, version=version),
    )
    if added:
        log.info("%s: set table properties %s (this release's default)", path, added)
    return table


def properties_wanted(have: Mapping[str, str], properties: Mapping[str, str]) -> dict[str, str]:
    """What to set on a table whose configuration is ``have`` for it to have ``properties``.

    The ones it lacks; and the checkpoint interval when the engine set the
    current one (it equals :data:`~retry_engine.delta.storage.ENGINE_INTERVAL`, or
    that mark is absent and it is an earlier release's 10) and ``properties``
    has another. The mark then records the interval the engine chose, so an
    operator's later change, whatever its value, is told from the engine's.
    """
    wanted = {k: v for k, v in properties.items() if k not in have}
    interval = properties.get(CHECKPOINT_INTERVAL)
    if interval is None:
        return wanted
    if have.get(CHECKPOINT_INTERVAL) == have.get(ENGINE_INTERVAL, EARLIER_INTERVAL) != interval:
        wanted[CHECKPOINT_INTERVAL] = interval
    if have.get(ENGINE_INTERVAL) != interval:
        wanted[ENGINE_INTERVAL] = interval
    return wanted


def ensure_readable_table(
    path: str, arrow_schema: pa.Schema, *, ignore: Sequence[str] = ()
) -> tuple[DeltaTable, list[SchemaDrift]]:
    """Create the table at ``path`` if missing; else tolerate drift from ``arrow_schema`` and log it.

    For tables the engine reads but others write (consume_results): extra
    columns, missing columns and other types do not stop the reader, whose
    consumer casts value by value (see :func:`~retry_engine.delta._schema.schema_drift`).
    Returns the table and its drift (see :func:`report_drift`); whether the
    columns the reader *needs* are there is the caller's check.
    """
    table = open_table(path)
    if table is None:
        return ensure_table(path, arrow_schema), []
    return table, report_drift(path, table_arrow_schema(table), arrow_schema, ignore=ignore)


def report_drift(
    path: str, table_schema: pa.Schema, arrow_schema: pa.Schema, *, ignore: Sequence[str] = ()
) -> list[SchemaDrift]:
    """Log one warning per way ``table_schema`` drifts from ``arrow_schema`` and return them.

    Each line names the column, the table's type, the expected type and what
    the reader does about it; ``ignore`` names columns not to compare.
    """
    drifts = schema_drift(table_schema, arrow_schema, ignore=ignore)
    for drift in drifts:
        log.warning(
            "%s drifts from the schema the engine expects; tolerated: %s", path, drift.describe()
        )
    return drifts


def read_table(path: str, *, version: int | None = None) -> pa.Table:
    """The whole table at ``path`` (at ``version`` if given) as one Arrow table."""
    from retry_engine.delta._log import check_table_protocol

    table = open_delta(path, version=version)
    check_table_protocol(path, table)
    return pa.table(table.to_pyarrow_table())


# A conflict on a checked append means another writer committed in between; each
# re-check either finds the transaction done (skip) or commits, so a few attempts suffice
# unless other writers of the same app id keep winning.
MAX_APPEND_ATTEMPTS = 10


def append_arrow(
    path: str,
    table: pa.Table,
    *,
    app_id: str | None = None,
    txn_version: int | None = None,
    partition_by: Sequence[str] = (),
    expect_version: int | None = None,
) -> bool:
    """Append ``table`` to the Delta table at ``path`` (created if missing).

    With ``app_id`` and ``txn_version`` the append is idempotent like Delta's
    ``txnAppId`` / ``txnVersion``: it is skipped, returning False, when the
    table already records a transaction of ``app_id`` at ``txn_version`` or
    later. delta-rs records the token but does not skip on it, so it is
    checked here, and the commit is made against the very snapshot that was
    checked: if another writer committed a transaction of the same ``app_id``
    in between, delta-rs' conflict check fails the commit (its
    ``ConcurrentTransaction`` rule), and the check runs again on the new
    snapshot: skip if the other writer committed this version, else retry.
    Two processes appending the same ``(app_id, txn_version)`` at once thus
    leave exactly one copy. Appends of other writers (other app ids) do not
    conflict. An append (plain or not) that conflicts with another writer's
    metadata change (an upgrade adding columns) is checked against the new
    schema and tried again. Raises :class:`~retry_engine.errors.ConcurrentWriteError`
    after :data:`MAX_APPEND_ATTEMPTS` conflicts in a row.

    With ``expect_version`` the append commits only as the table's next
    version after ``expect_version``: any commit by anyone since then raises
    :class:`~retry_engine.errors.ConcurrentWriteError` (code ``TABLE_MOVED``)
    and nothing is written. Callers use it to claim rows they chose from that
    version (the re-drive audit): re-read, re-decide, try again.
    """
    if (app_id is None) != (txn_version is None):
        raise ConfigError(
            "app_id and txn_version go together; pass both or neither", code="INVALID_OPTION"
        )
    if expect_version is not None:
        return _append_at(
            path,
            table,
            expect_version,
            app_id=app_id,
            txn_version=txn_version,
            partition_by=partition_by,
        )
    last_error: CommitFailedError | None = None
    for attempt in range(1, MAX_APPEND_ATTEMPTS + 1):
        checked = _checked_handle(path, table.schema, partition_by)
        try:
            written = _write_once(
                path, checked.table, table, app_id=app_id, txn_version=txn_version, partition_by=partition_by,
                strict=False,
            )
        except CommitFailedError as exc:
            # Nothing was committed. delta-rs rebases appends over other appends itself, so this is
            # a commit it cannot rebase over: the same app id's transaction, or a metadata change
            # (another release adding columns). Check the schema and the transaction again.
            last_error = exc
            log.info(
                "%s: commit of %s conflicted (attempt %d); checking again: %s",
                path,
                "a plain append" if app_id is None else f"{app_id}/{txn_version}",
                attempt,
                exc,
            )
            continue
        keep(checked)
        return written
    raise ConcurrentWriteError(
        f"{path}: append of {'rows' if app_id is None else f'transaction {app_id}/{txn_version}'} conflicted "
        f"{MAX_APPEND_ATTEMPTS} times in a row with other writers"
        f"{'' if app_id is None else f' of app id {app_id!r} (is a second copy of this writer running?)'}: {last_error}",
    ) from last_error


def _append_at(
    path: str,
    table: pa.Table,
    expect_version: int,
    *,
    app_id: str | None,
    txn_version: int | None,
    partition_by: Sequence[str],
) -> bool:
    """Append as version ``expect_version + 1`` or not at all (see :func:`append_arrow`)."""
    if (
        isinstance(expect_version, bool)
        or not isinstance(expect_version, int)
        or expect_version < 0
    ):
        raise ConfigError(
            f"expect_version must be a table version (an int >= 0), got {expect_version!r}",
            code="INVALID_OPTION",
        )
    latest = table_version(path)
    if latest is None or latest < expect_version:
        raise ConfigError(
            f"{path}: expect_version={expect_version} but the table is at {latest}; pass a version read from it",
            code="INVALID_OPTION",
        )
    if latest > expect_version:
        raise ConcurrentWriteError(
            f"{path}: the table moved from version {expect_version} to {latest}; read it again"
        )
    checked = _checked(path, open_delta(path, version=expect_version), table.schema, partition_by)
    try:
        return _write_once(
            path, checked, table, app_id=app_id, txn_version=txn_version, partition_by=partition_by, strict=True
        )
    except CommitFailedError as exc:
        raise ConcurrentWriteError(
            f"{path}: another writer committed after version {expect_version}; read the table again: {exc}"
        ) from exc


def _write_once(
    path: str,
    checked: DeltaTable,
    table: pa.Table,
    *,
    app_id: str | None,
    txn_version: int | None,
    partition_by: Sequence[str],
    strict: bool,
) -> bool:
    """Append ``table`` with ``checked``'s snapshot as the read version; False (nothing written) if it records the transaction.

    ``strict``: no commit retries, so a commit that finds a newer version fails
    instead of being rebased onto it (appends never conflict with appends).
    """
    if _already_done(path, checked, app_id, txn_version):
        return False
    transactions = (
        [Transaction(app_id, txn_version)]
        if app_id is not None and txn_version is not None
        else None
    )
    try:
        with reaching(path):
            write_deltalake(
                checked,
                table,
                mode="append",
                partition_by=list(partition_by) or None,
                commit_properties=CommitProperties(
                    app_transactions=transactions, max_commit_retries=0 if strict else None
                ),
            )
    except CommitFailedError as exc:
        refused = cannot_write(path, exc)
        if refused is not None:
            raise refused from exc
        raise
    return True


def check_append(path: str, table: DeltaTable, schema: pa.Schema, partition_by: Sequence[str] = ()) -> None:
    """Raise what :func:`append_arrow` of rows of ``schema`` to ``table`` (at ``path``) would for their
    columns or its partitioning: for a caller about to promise the write (a re-drive's claim)."""
    _checked(path, table, schema, partition_by)


def _checked_handle(path: str, schema: pa.Schema, partition_by: Sequence[str]) -> Handle:
    """A handle on the latest snapshot (kept from this process's last append when still the same
    table), the table created first if missing (concurrent creators are fine)."""
    handle = open_or_create(location(path), lambda: ensure_table(path, schema, partition_by=partition_by))
    _checked(path, handle.table, schema, partition_by)  # the snapshot's metadata: no I/O
    return handle


def _checked(path: str, table: DeltaTable, schema: pa.Schema, partition_by: Sequence[str]) -> DeltaTable:
    """``table``, once its schema takes ``schema`` and it is partitioned by ``partition_by``."""
    check_write_schema(path, table_arrow_schema(table), schema)
    check_partition_columns(path, table.metadata().partition_columns, partition_by)
    return table


def _already_done(
    path: str, checked: DeltaTable, app_id: str | None, txn_version: int | None
) -> bool:
    if app_id is None or txn_version is None:
        return False
    done = checked.transaction_version(app_id)
    if done is not None and done >= txn_version:
        log.info(
            "%s: transaction %s/%d already in the table (at %d); append skipped",
            path,
            app_id,
            txn_version,
            done,
        )
        return True
    return False
