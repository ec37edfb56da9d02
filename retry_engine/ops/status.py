"""``retry-engine status``: what the engine is doing, read from its tables.

No Spark: the Delta tables are read with delta-rs and summarised with Arrow.
Reading (:func:`read_tables`) is separate from summarising (:func:`summarise`,
pure) and from formatting (:func:`format_status`, :func:`status_json`).

Whether the query is running is judged from the PROGRESS table (see
:func:`query_state` for the rule). Backlog, oldest due time, lateness and dead
letters (both of the last 24 h) come from the engine's own ledger (outcomes,
retry, dlq), which is exact at any moment; the all-time counts from the lake's
batch record when it can vouch for them (:func:`_recorded_tables`), else from
every outcome and retry row. The METRICS table is used by the plots, not read here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from retry_engine.config import EngineConfig
from retry_engine.core.decide import DEAD_LETTER, cast_column
from retry_engine.core.decide import RETRY as OUTCOME_RETRY
from retry_engine.core.delays import parse_duration_ms
from retry_engine.core.lease import BatchRecord, read_state
from retry_engine.core.metrics import DELIVERED, nearest_rank
from retry_engine.core.names import FUTURE_EVENTS
from retry_engine.core.standby import StandbyEntry, standbys
from retry_engine.core.totals import COUNTED, Totals
from retry_engine.delta._log import expired_before
from retry_engine.delta.storage import shown_path
from retry_engine.delta.tables import open_table, read_columns, stats_from, table_arrow_schema
from retry_engine.errors import SchemaMismatchError, TablesUnavailableError
from retry_engine.ops.terms import (
    FINISHED,
    LEASE_LOST,
    PROGRESS_EVENT,
    STOPPED,
    TERMINATED,
    StopReason,
)
from retry_engine.schemas import CONSUME_RESULTS, DLQ, METRICS, OUTCOMES, PROGRESS, RETRY, Table

log = logging.getLogger(__name__)

QueryState = Literal["running", "stale", "stopped", "failed", "not_started"]

# A query is "stale" when nothing was recorded for longer than
# flush interval + max(STALE_TRIGGERS triggers, 2 x the last batch's duration, MIN_STALE_MS).
# Spark reports a progress or an idle event at least every 10 s
# (spark.sql.streaming.noDataProgressEventInterval), so 30 s is never normal silence.
STALE_TRIGGERS = 10
MIN_STALE_MS = 30_000
# However long its last batch took, a query silent for a day is stale (a duration another writer made
# huge would keep it "running" for good).
MAX_STALE_MS = 86_400_000
# How much of a failed query's error `status` shows (one line: the Python error and its causes).
FAILURE_SHOWN_CHARS = 300
# How far back `status` counts failed queries, and the released retries whose lateness it shows.
FAILURES_WINDOW = dt.timedelta(hours=24)
LATENESS_WINDOW = FAILURES_WINDOW
# The dead letters `status` breaks down by group, reason and error class: the all-time count is the
# outcomes' (``dead_letter``); the DLQ of a failure storm months ago is never read again.
DEAD_LETTER_WINDOW = FAILURES_WINDOW
# The window of due times `status` first reads pending retries in, on a lake whose batch record
# vouches for the rest (:func:`_recorded_tables`); each retry widens it by WINDOW_GROWTH (1, 8, 64
# days), and after WINDOW_TRIES windows every row is read as without a record.
PENDING_WINDOW = dt.timedelta(days=1)
WINDOW_GROWTH = 8
WINDOW_TRIES = 3
# Reads of the record and the two tables until they show the same batch (an engine between its
# record and its commits, or past them, in between); then every row is read.
SNAPSHOT_TRIES = 5
SNAPSHOT_PAUSE_S = 0.1

# What status and the plots show for rows without a group (another writer's).
NO_GROUP = "(no group)"

# Columns each summary needs; only these are read.
_COLUMNS: dict[str, tuple[Table, tuple[str, ...]]] = {
    "progress": (PROGRESS, tuple(PROGRESS.names)),
    "outcomes": (
        OUTCOMES,
        ("consumer_group", "outcome", "output_msg_id", "delay_level", "due_at", "decided_at"),
    ),
    # source_result_id tells a re-drive's or a resend's row from a release (moved_from_dlq).
    "retry": (RETRY, ("msg_id", "consumer_group", "delay_level", "due_at", "delivered_at", "source_result_id")),
    "dlq": (DLQ, ("consumer_group", "reason_code", "error_class", "dead_lettered_at")),
    # The plots' backlog: the signed counts per batch time, group and level.
    "metrics": (METRICS, ("batch_time", "consumer_group", "delay_level", "metric", "value")),
    # Counted per group (:func:`_results_by_group`): what consumers wrote is never read whole.
    "consume_results": (CONSUME_RESULTS, ("consumer_group",)),
}
# What `status` reads: the METRICS table is the plots' (it grows with every batch that decided something).
STATUS_TABLES: tuple[str, ...] = tuple(name for name in _COLUMNS if name != "metrics")
RESULTS_BY_GROUP = pa.schema([pa.field("consumer_group", pa.string()), pa.field("results", pa.int64())])

# Columns a lake written by an older release lacks until the engine's next start adds them.
_ADDED_LATER: dict[str, tuple[str, ...]] = {"progress": ("reason",)}


@dataclass(frozen=True)
class EngineTables:
    """The engine tables status and plots need; an absent table is an empty one."""

    progress: pa.Table
    outcomes: pa.Table
    retry: pa.Table
    dlq: pa.Table
    metrics: pa.Table
    consume_results: pa.Table  # consume results written per group (RESULTS_BY_GROUP)
    present: frozenset[str]
    # The lake's counts, from its batch record; None: counted from ``outcomes`` and ``retry``, which
    # then hold every row (with totals they may hold only the retries due in a recent window).
    totals: Totals | None = None
    # See released_horizon: retry outcomes due before it are released, whether or not their row is left.
    released_before: dt.datetime | None = None
    # See discarded_before: retry outcomes decided before it and never released were given up.
    discarded_before: dt.datetime | None = None


def _empty(table: Table, columns: tuple[str, ...]) -> pa.Table:
    if table is CONSUME_RESULTS:
        return RESULTS_BY_GROUP.empty_table()
    schema = pa.schema([table.arrow_schema.field(c) for c in columns])
    return schema.empty_table()


def read_table_columns(
    path: str,
    table: Table,
    columns: tuple[str, ...],
    *,
    added_later: tuple[str, ...] = (),
    recent: tuple[str, dt.datetime] | None = None,
) -> pa.Table | None:
    """``columns`` of the Delta table at ``path``, or None when there is no table there.

    ``added_later``: columns a table written by an older release lacks until
    the engine's next start adds them; they read as null. Raises
    :class:`SchemaMismatchError` naming the first other missing column.
    ``recent``: ``(column, now)``: only the rows of the day :func:`_recent_since` finds, and the files
    that may hold one.
    """
    delta = open_table(path)
    if delta is None:
        return None
    if recent is None:
        return _columns_of(delta, path, table, columns, added_later=added_later)
    since = _recent_since(delta, *recent)
    if since is None:
        return _columns_of(delta, path, table, columns, added_later=added_later)
    # The same bound on rows: Parquet's row-group statistics skip the older parts of big files.
    files = [(recent[0], ">=", stats_from(since))]
    return _columns_of(delta, path, table, columns, added_later=added_later, files=files, rows=_since(table, recent[0], since))


def _columns_of(
    delta: Any,
    path: str,
    table: Table,
    columns: tuple[str, ...],
    *,
    added_later: tuple[str, ...] = (),
    files: Any = None,
    rows: pc.Expression | None = None,
) -> pa.Table:
    """``columns`` of the snapshot ``delta`` (of the table at ``path``), of the files its statistics
    say may hold a row of the delta-rs predicate ``files``, and the ``rows`` (of ``columns``) when given
    (see :func:`read_table_columns`).

    A column of another type than ``table`` gives it (a table another writer made) prunes no file and
    is read in the engine's type before ``rows`` picks (:func:`~retry_engine.delta.tables.read_columns`).
    """
    names = set(table_arrow_schema(delta).names)
    missing = [c for c in columns if c not in names]
    required = [c for c in missing if c not in added_later]
    if required:
        raise SchemaMismatchError(
            f"table {table.name} at {path} has no column {required[0]!r}; "
            f"{table.name} needs {', '.join(columns)}"
        )
    present = [c for c in columns if c in names]
    read = read_columns(delta, table.arrow_schema, present, files=files, rows=rows)
    for name in missing:
        read = read.append_column(table[name].field, pa.nulls(read.num_rows, table[name].type))
    return read.select(list(columns))


def _recent_since(delta: Any, column: str, now: dt.datetime) -> dt.datetime | None:
    """Where the day before the table's newest ``column`` value (or ``now``, if earlier) starts, by its
    files' statistics: what :data:`FAILURES_WINDOW` of the table to read; None (every row) when a file
    has no statistics for it, or they are not of a time with a zone. A day is what `status` needs of
    PROGRESS: the latest run's last event and batch, and the failures of the last day (a running
    engine records an event at least every 10 s), while an engine recording a batch a second adds
    2.6 million rows a month."""
    from retry_engine.delta._log import newest_time

    newest = newest_time(delta, column)
    if newest is None:
        return None
    try:
        return min(newest, now) - FAILURES_WINDOW
    except OverflowError:  # the newest time within a day of year 1 (another writer's): every row is read
        return None


def _results_by_group(path: str) -> pa.Table | None:
    """Consume results written per group (:data:`RESULTS_BY_GROUP`), or None when there is no table.

    The table is as big as the outcomes and others write it, so its rows are counted from the Delta log
    where a file's statistics say what it holds (:func:`_counted_by_statistics`; consumers write a file
    per group), and only the other files' group column is read. A table without the column (the
    engine quarantines its rows) counts every row as a result without a group; status never fails on it.
    """
    from retry_engine.delta._log import add_actions

    delta = open_table(path)
    if delta is None:
        return None
    if "consumer_group" not in table_arrow_schema(delta).names:
        return _results_table({None: delta.to_pyarrow_dataset().count_rows()})
    counted, rest = _counted_by_statistics(add_actions(delta))
    if not rest:  # the dataset alone (a fragment per file) cost 0.3 s for 400 files
        return _results_table(counted)
    dataset = delta.to_pyarrow_dataset()
    if counted:
        fragments = [f for f in dataset.get_fragments() if unquote(f.path) in rest]
        if len(fragments) != len(rest):  # a file not matched by its path: count every row instead
            counted, fragments = {}, list(dataset.get_fragments())
        dataset = ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)
    groups = _as_groups(dataset.to_table(columns=["consumer_group"]).column("consumer_group"))
    for group, rows in _count_by_group(pa.table({"consumer_group": groups})).items():
        counted[group] = counted.get(group, 0) + rows
    return _results_table(counted)


def _as_groups(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A group column of another type (a drifted writer's) as the engine reads it
    (:func:`~retry_engine.core.decide.cast_column`: an int 7 is group "7"); a value with no string form
    is a result without a group (the engine quarantines it)."""
    if column.type == pa.string():
        return column
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return cast_column(array, pa.string())[0]


def _counted_by_statistics(actions: pa.Table) -> tuple[dict[str | None, int], set[str]]:
    """Rows per group of the files whose add action says it: a ``consumer_group`` partition value, or
    statistics where the column is all null or has one value (min = max, no null; a compliant writer's
    truncated max is never its min), with a row count and no deletion vector. Returns the counts and the
    (unquoted) paths of the files left to read."""
    names = actions.schema.names
    text = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    if "min.consumer_group" in names and not any(is_text(actions["min.consumer_group"].type) for is_text in text):
        names = [n for n in names if not n.endswith(".consumer_group")]  # not a string: its files are read
    rows = actions["num_records"] if "num_records" in names else pa.nulls(actions.num_rows, pa.int64())
    known = pc.greater_equal(rows, 0)  # a negative count (a hostile log) is no count: the file is read
    for name in names:
        if name.startswith("deletionVector"):
            known = pc.and_kleene(known, pc.is_null(actions[name]))
    if "partition.consumer_group" in names:
        group = _as_groups(actions["partition.consumer_group"])
    elif {"min.consumer_group", "max.consumer_group", "null_count.consumer_group"} <= set(names):
        nulls = actions["null_count.consumer_group"]
        one = pc.and_kleene(pc.equal(nulls, 0), pc.equal(actions["min.consumer_group"], actions["max.consumer_group"]))
        all_null = pc.equal(nulls, rows)
        known = pc.and_kleene(known, pc.or_kleene(one, all_null))
        group = pc.if_else(all_null, pa.scalar(None, pa.string()), _as_groups(actions["min.consumer_group"]))
    else:
        known = pa.array([False] * actions.num_rows)
        group = pa.nulls(actions.num_rows, pa.string())
    known = pc.fill_null(known, False)
    counted: dict[str | None, int] = {}
    for g, n in zip(group.filter(known).to_pylist(), rows.filter(known).to_pylist(), strict=True):
        counted[g] = counted.get(g, 0) + n
    rest = {unquote(p) for p in actions["path"].filter(pc.invert(known)).to_pylist()}
    return counted, rest


def _results_table(counted: dict[str | None, int]) -> pa.Table:
    return pa.table({"consumer_group": list(counted), "results": list(counted.values())}, schema=RESULTS_BY_GROUP)


def read_tables(
    config: EngineConfig,
    *,
    now: dt.datetime | None = None,
    names: tuple[str, ...] = tuple(_COLUMNS),
    given: Mapping[str, pa.Table | None] | None = None,
) -> EngineTables:
    """Read what status and plots need. Raises :class:`TablesUnavailableError` when
    none of the engine's tables exists (most often a wrong ``engine.lake``).

    ``now`` (status): of PROGRESS, only its last day (:func:`_recent_since`).
    ``names``: the tables to read (status: :data:`STATUS_TABLES`); the others are empty.
    ``given``: tables already read (status: :func:`_recorded_tables`), taken as they are; None: looked
    for and not there.
    """
    tables: dict[str, pa.Table] = {}
    present: set[str] = set()
    for name, (table, columns) in _COLUMNS.items():
        if name not in names:
            found = None
        elif given is not None and name in given:
            found = given[name]
        elif table is CONSUME_RESULTS:
            found = _results_by_group(config.table_path(name))
        else:
            found = read_table_columns(
                config.table_path(name), table, columns, added_later=_ADDED_LATER.get(name, ()),
                recent=("recorded_at", now) if table is PROGRESS and now is not None else None,
            )
        present.update([name] if found is not None else [])
        tables[name] = found if found is not None else _empty(table, columns)
    if not present:
        raise TablesUnavailableError(
            f"no engine tables under {shown_path(config.engine.lake)} "
            f"(looked for {', '.join(config.table_path(n) for n in names)}); "
            "is engine.lake (or RETRY_ENGINE_LAKE) right, and has the engine run?"
        )
    return EngineTables(**tables, present=frozenset(present))


# -- the summary ----------------------------------------------------------------
@dataclass(frozen=True)
class LastBatch:
    batch_id: int
    run_id: str
    started_at: dt.datetime
    duration_ms: int | None
    input_rows: int | None
    processed_rows_per_second: float | None
    state_rows: int | None
    state_memory_bytes: int | None


@dataclass(frozen=True)
class BacklogEntry:
    consumer_group: str
    delay_level: int | None
    pending: int
    oldest_due_at: dt.datetime | None


@dataclass(frozen=True)
class LatenessEntry:
    """How late the retries released in the last 24 h were after their due time (ms); ``consumer_group`` '*' = all,
    None: rows without a group."""

    consumer_group: str | None
    deliveries: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class DeadLetterEntry:
    consumer_group: str | None  # None: dead letters without a group (another writer's)
    reason_code: str | None
    error_class: str | None
    count: int


@dataclass(frozen=True)
class LagEntry:
    """How far the engine is behind one group's consumers (``consumer_group`` None: results without a group).

    ``results_written``: consume results in the table; ``results_decided``:
    those the engine has decided (outcomes); ``results_behind`` the
    difference (never below 0). ``retries_due``: retries decided whose due
    time has passed; ``retries_released``: retries in %RETRY%G;
    ``retries_overdue``: due but not released yet (the schedule stage's lag).
    """

    consumer_group: str | None
    results_written: int
    results_decided: int
    results_behind: int
    retries_due: int
    retries_released: int
    retries_overdue: int


@dataclass(frozen=True)
class Status:
    checked_at: dt.datetime
    state: QueryState
    state_reason: str
    # Why the query terminated (stopped and failed only; None on older releases' terminated events).
    stop_reason: StopReason | None
    query_id: str | None
    last_event_at: dt.datetime | None
    last_batch: LastBatch | None
    outcomes: dict[str, int]
    backlog: list[BacklogEntry]
    oldest_due_at: dt.datetime | None
    overdue_ms: int | None
    lateness: list[LatenessEntry]
    dead_letters: list[DeadLetterEntry]
    lag: list[LagEntry] = dataclasses.field(default_factory=list)
    # Queries that failed within FAILURES_WINDOW before checked_at (`run` restarts them: a running
    # engine that keeps failing shows here), the last one's time and reason.
    failures_24h: int = 0
    last_failure_at: dt.datetime | None = None
    last_failure: str | None = None
    # Engines standing by for the lake's lease (`run --standby`), from their notes on the lake.
    standbys: list[StandbyEntry] = dataclasses.field(default_factory=list)


def stale_after_ms(
    *, trigger_interval_ms: int, flush_interval_ms: int, last_batch_ms: int | None
) -> int:
    """How long without a recorded event before a query that never said it stopped is stale."""
    return flush_interval_ms + max(
        STALE_TRIGGERS * trigger_interval_ms, min(2 * max(last_batch_ms or 0, 0), MAX_STALE_MS), MIN_STALE_MS
    )


def _latest(table: pa.Table, column: str) -> dict[str, Any] | None:
    """The row of ``table`` with the greatest ``column``; None when no row has one (a null time, another
    writer's, is no time)."""
    newest = pc.max(table[column])
    if not newest.is_valid:
        return None
    index = pc.index(table[column], newest)
    row: dict[str, Any] = table.slice(index.as_py(), 1).to_pylist()[0]
    return row


# The header line of a Python exception inside Spark's error text ("OSError: ...", "retry_engine.errors.X: ...").
_PYTHON_ERROR = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception): \S")


def failure_reason(text: str) -> str:
    """One line saying why a query failed: the last Python error in Spark's text (with its chain of
    causes on one line), else Spark's own first line."""
    from retry_engine.delta.storage import causes

    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if _PYTHON_ERROR.match(line)]
    if not headers:
        return lines[0] if lines else text
    block = []
    for line in lines[headers[-1]:]:
        if not line.strip() or line.lstrip().startswith(("SQLSTATE", "at ")) or line.startswith("\t"):
            break
        block.append(line)
    return ": ".join(causes("\n".join(block)))


def query_state(
    progress: pa.Table, *, now: dt.datetime, trigger_interval_ms: int, flush_interval_ms: int
) -> tuple[QueryState, str, dict[str, Any] | None, LastBatch | None]:
    """Judge the query from its PROGRESS rows: (state, why, last event, last batch).

    The rule: look at the latest run (the run of the most recently recorded
    event). It ended if its last event is ``terminated`` (``failed`` when that
    event carries an exception, else ``stopped``). Otherwise it is ``running``
    while its last event is younger than :func:`stale_after_ms`, and
    ``stale`` after that (the driver died without a terminated event, or a
    batch hangs). No rows: ``not_started``.
    """
    ahead = pc.fill_null(pc.greater(progress["recorded_at"], pa.scalar(now + FUTURE_EVENTS, progress["recorded_at"].type)), False)
    skipped = pc.sum(ahead).as_py() or 0
    if skipped:
        progress = progress.filter(pc.invert(ahead))
    state, why, last, last_batch = _judged(
        progress, now=now, trigger_interval_ms=trigger_interval_ms, flush_interval_ms=flush_interval_ms
    )
    if skipped:
        why += (
            f" ({skipped} event(s) recorded more than {FUTURE_EVENTS} after this clock's now left out: a clock "
            "ahead, or another writer)"
        )
    return state, why, last, last_batch


def _judged(
    progress: pa.Table, *, now: dt.datetime, trigger_interval_ms: int, flush_interval_ms: int
) -> tuple[QueryState, str, dict[str, Any] | None, LastBatch | None]:
    last = _latest(progress, "recorded_at")
    if last is None:
        return "not_started", "no progress recorded yet", None, None
    run = progress.filter(pc.equal(progress["run_id"], last["run_id"]))
    batches = run.filter(pc.equal(run["event"], PROGRESS_EVENT))
    row = _latest(batches, "recorded_at")
    last_batch = None
    if row is not None:
        last_batch = LastBatch(
            batch_id=row["batch_id"],
            run_id=row["run_id"],
            started_at=row["event_time"],
            duration_ms=row["batch_duration_ms"],
            input_rows=row["num_input_rows"],
            processed_rows_per_second=row["processed_rows_per_second"],
            state_rows=row["state_rows_total"],
            state_memory_bytes=row["state_memory_bytes"],
        )
    if last["event"] == TERMINATED:
        reason = _stop_reason_text(last["reason"])
        if last["exception"]:
            return (
                "failed",
                f"terminated at {_iso(last['event_time'])}{reason} with: "
                f"{_shown_failure(last)}",
                last,
                last_batch,
            )
        return "stopped", f"stopped at {_iso(last['event_time'])}{reason}", last, last_batch
    limit = stale_after_ms(
        trigger_interval_ms=trigger_interval_ms,
        flush_interval_ms=flush_interval_ms,
        last_batch_ms=last_batch.duration_ms if last_batch else None,
    )
    silence_ms = int((now - last["recorded_at"]).total_seconds() * 1000)
    if silence_ms <= limit:
        return (
            "running",
            f"last event {silence_ms} ms ago (stale after {limit} ms)",
            last,
            last_batch,
        )
    return (
        "stale",
        f"no event for {silence_ms} ms (limit {limit} ms) and no terminated event",
        last,
        last_batch,
    )


# What a stop reason means, after the reason itself in `status` (failed shows its exception instead).
_STOP_REASON_MEANING: dict[str, str] = {
    STOPPED: "on request",
    FINISHED: "run --once processed its input",
    LEASE_LOST: "another engine took the lake over",
}


def recent_failures(progress: pa.Table, *, now: dt.datetime) -> tuple[int, dt.datetime | None, str | None]:
    """Failed queries (terminated events with an exception) within :data:`FAILURES_WINDOW` before
    ``now``: how many, and the last one's time and reason."""
    if progress.num_rows == 0:
        return 0, None, None
    since = pa.scalar(now - FAILURES_WINDOW, progress.schema.field("event_time").type)
    failed = progress.filter(
        pc.and_(
            pc.and_(pc.equal(progress["event"], TERMINATED), pc.is_valid(progress["exception"])),
            pc.fill_null(pc.greater_equal(progress["event_time"], since), False),
        )
    )
    last = _latest(failed, "event_time")
    if last is None:
        return 0, None, None
    return failed.num_rows, last["event_time"], _shown_failure(last)


def _shown_failure(terminated: dict[str, Any]) -> str:
    """A failed query's error as status shows it: the Python error and its causes, cut short."""
    return failure_reason(str(terminated["exception"]))[:FAILURE_SHOWN_CHARS]


def _stop_reason_text(reason: str | None) -> str:
    """`` (reason: stopped, on request)``; empty for a terminated event of an older release (no reason)."""
    if reason is None:
        return ""
    meaning = _STOP_REASON_MEANING.get(reason)
    return f" (reason: {reason}, {meaning})" if meaning else f" (reason: {reason})"


def released_horizon(config: EngineConfig, retry: Any = None) -> dt.datetime | None:
    """The due time before which a retry outcome without its ``%RETRY%G`` row was released, its row since
    removed by the retry table's row retention (``[maintenance] retry_retention``); None when the table
    never lost a row to it (or does not exist). ``retry``: the table already opened.

    It is the retention's latest cut, committed with its removes
    (:func:`~retry_engine.delta._log.expired_before`): a row that went was
    delivered before it, so due before it; a retry still waiting was due after the
    last batch recorded before that cut was made, so after it
    (:func:`~retry_engine.ops.maintenance.ledger_shift`).
    """
    table = retry if retry is not None else open_table(config.table_path(RETRY.name))
    return None if table is None else expired_before(table)


def discarded_before(config: EngineConfig) -> dt.datetime | None:
    """When a new checkpoint last gave up the retries earlier ones left waiting (``run --discard-pending``,
    :attr:`~retry_engine.core.lease.EngineState.discarded_before`); None: never, or the state is unreadable
    (they then count as waiting)."""
    try:
        state = read_state(config.engine.lake)
    except Exception as exc:  # noqa: BLE001 - a refinement of the count only
        log.warning("the engine state of %s is unreadable (%s); retries given up count as waiting", config.engine.lake, exc)
        return None
    return state.discarded_before if state is not None else None


@dataclass(frozen=True)
class RetryFates:
    """The retry outcomes of a ledger and what became of each (masks over ``decided``, one of each true at
    most): its ``%RETRY%G`` row is in the table; it has none but was due before the retry table's cut
    (:func:`released_horizon`: released, its row since removed); it has none and was decided before the
    discard mark (:func:`discarded_before`: given up). Any other is still waiting."""

    decided: pa.Table
    delivered: pa.ChunkedArray
    expired: pa.ChunkedArray
    given_up: pa.ChunkedArray

    @property
    def waiting(self) -> pa.ChunkedArray:
        return pc.invert(pc.or_(pc.or_(self.delivered, self.expired), self.given_up))


def retry_fates(
    outcomes: pa.Table,
    retry: pa.Table,
    released_before: dt.datetime | None = None,
    discarded_before: dt.datetime | None = None,
) -> RetryFates:
    """What became of each retry outcome of ``outcomes`` (:class:`RetryFates`), by the rows of ``retry``."""
    decided = outcomes.filter(pc.equal(outcomes["outcome"], OUTCOME_RETRY))
    delivered = pc.fill_null(pc.is_in(decided["output_msg_id"], value_set=retry["msg_id"].combine_chunks()), False)
    rowless = pc.invert(delivered)

    def before(column: str, when: dt.datetime | None) -> pa.ChunkedArray:
        if when is None:
            return pc.and_(delivered, rowless)  # all false, of the right shape
        values = decided[column]
        return pc.fill_null(pc.less(values, pa.scalar(when, values.type)), False)

    expired = pc.and_(rowless, before("due_at", released_before))
    given_up = pc.and_(pc.and_(rowless, pc.invert(expired)), before("decided_at", discarded_before))
    return RetryFates(decided, delivered, expired, given_up)


def pending_retries(
    outcomes: pa.Table,
    retry: pa.Table,
    released_before: dt.datetime | None = None,
    discarded_before: dt.datetime | None = None,
) -> pa.Table:
    """Retries decided (outcome ``retry``) but not yet released to %RETRY%G (``released_before``: see
    :func:`released_horizon`), nor given up (decided before ``discarded_before``, see :func:`discarded_before`)."""
    fates = retry_fates(outcomes, retry, released_before, discarded_before)
    return fates.decided.filter(fates.waiting)


def totals_of(outcomes: pa.Table, retry: pa.Table, released_before: dt.datetime | None = None) -> Totals:
    """What every row of ``outcomes`` and ``retry`` counts to, as the engine counts its batches: consume
    results per group and outcome, and retries released per group (decided retries whose ``%RETRY%G``
    row exists; a re-drive's row is not one)."""
    rows: list[tuple[str | None, str, int]] = []
    if outcomes.num_rows:
        counted = (
            outcomes.select(["consumer_group", "outcome"])
            .group_by(["consumer_group", "outcome"], use_threads=False)
            .aggregate([([], "count_all")])
        )
        rows += [
            (group, outcome, n)
            for group, outcome, n in zip(
                counted["consumer_group"].to_pylist(),
                counted["outcome"].to_pylist(),
                counted["count_all"].to_pylist(),
                strict=True,
            )
            if outcome in COUNTED
        ]
    fates = retry_fates(outcomes, retry, released_before)
    released = pc.or_(fates.delivered, fates.expired)
    rows += [(group, DELIVERED, n) for group, n in _count_by_group(fates.decided.filter(released)).items()]
    return Totals.of(rows)


def lake_counts(config: EngineConfig) -> tuple[Totals, int | None]:
    """The counts of every row of the lake's outcome and retry tables (:func:`totals_of`), and the
    retries pending in them (:func:`pending_retries`; None when there is no outcome table)."""
    columns = ("consumer_group", "outcome", "output_msg_id", "due_at", "decided_at")
    outcomes = read_table_columns(config.table_path(OUTCOMES.name), OUTCOMES, columns)
    retry = read_table_columns(config.table_path(RETRY.name), RETRY, ("msg_id",))
    retry = retry if retry is not None else _empty(RETRY, ("msg_id",))
    if outcomes is None:
        return totals_of(_empty(OUTCOMES, columns), retry), None
    horizon = released_horizon(config)
    waiting = pending_retries(outcomes, retry, horizon, discarded_before(config))
    return totals_of(outcomes, retry, horizon), waiting.num_rows


def backlog(pending: pa.Table) -> list[BacklogEntry]:
    """Pending retries (:func:`pending_retries`) by group and delay level, with the oldest due time of each."""
    if pending.num_rows == 0:
        return []
    grouped = pending.group_by(["consumer_group", "delay_level"]).aggregate(
        [("outcome", "count"), ("due_at", "min")]
    )
    entries = [
        BacklogEntry(
            r["consumer_group"] or "", r["delay_level"], r["outcome_count"], r["due_at_min"]
        )
        for r in grouped.to_pylist()
    ]
    return sorted(entries, key=lambda e: (e.consumer_group, e.delay_level or 0))


def lateness_ms(retry: pa.Table) -> pa.Array:
    """Per released retry: delivered_at - due_at in ms (R8 says never negative)."""
    # As whole microseconds: any two times of the calendar are that many apart (a time another writer set
    # in year 1 or 9999 is past what Arrow's duration arithmetic checks).
    late = pc.subtract(retry["delivered_at"].cast(pa.int64()), retry["due_at"].cast(pa.int64()))
    return pc.divide(late.cast(pa.float64(), safe=False), 1000.0).combine_chunks()


def _lateness_entry(group: str | None, values: np.ndarray[Any, Any]) -> LatenessEntry:
    # Nearest-rank percentiles (as in the METRICS table): always a lateness that was actually observed.
    return LatenessEntry(
        consumer_group=group,
        deliveries=int(values.size),
        p50_ms=nearest_rank(values, 0.5),
        p99_ms=nearest_rank(values, 0.99),
        max_ms=float(values.max()),
    )


def moved_from_dlq(retry: pa.Table) -> pa.ChunkedArray:
    """Which rows of ``retry`` a re-drive or a resend wrote (due and delivered at once, never held by the
    schedule stage): those no consume result decided (no ``source_result_id``, which the engine sets on
    every retry it decides, a later retry of a re-driven message too). Not by their marks (``REDRIVE_ID``):
    reading every row's properties made `status` 4x slower. :func:`totals_of` counts no such row as
    released either: no retry outcome names it."""
    return pc.is_null(retry["source_result_id"])


def schedule_releases(retry: pa.Table) -> pa.Table:
    """The rows of ``retry`` the schedule stage released, those whose lateness `status` and the plots show:
    with a due and a delivery time (a row another writer left without one has no lateness), and not moved
    from the DLQ (:func:`moved_from_dlq`: it would show as 0 ms late, hiding a late delay stage)."""
    timed = pc.and_(pc.is_valid(retry["due_at"]), pc.is_valid(retry["delivered_at"]))
    return retry.filter(pc.and_(timed, pc.invert(moved_from_dlq(retry))))


def recent_releases(retry: pa.Table, now: dt.datetime) -> pa.Table:
    """The schedule stage's releases (:func:`schedule_releases`) delivered within :data:`LATENESS_WINDOW`
    of ``now`` (see :func:`at_or_after`)."""
    return at_or_after(schedule_releases(retry), "delivered_at", now - LATENESS_WINDOW)


# The lateness row of every group together.
ALL_GROUPS = "*"


def lateness(retry: pa.Table) -> list[LatenessEntry]:
    """Lateness percentiles of the released retries in ``retry``: all groups ('*') first, then each group
    (rows without a group last)."""
    if retry.num_rows == 0:
        return []
    values = lateness_ms(retry).to_numpy(zero_copy_only=False)
    groups = np.array(retry["consumer_group"].to_pylist(), dtype=object)
    entries = [_lateness_entry(ALL_GROUPS, values)]
    for group in sorted(set(groups.tolist()), key=group_order):
        entries.append(_lateness_entry(group, values[groups == group]))
    return entries


def at_or_after(rows: pa.Table, column: str, since: dt.datetime) -> pa.Table:
    """The ``rows`` whose time ``column`` is at or after ``since``; a row without a time is not. The
    rows are in the engine's types: a table another writer changed is cast where it is read
    (:func:`~retry_engine.delta.tables.read_columns`)."""
    at = rows[column]
    return rows.filter(pc.fill_null(pc.greater_equal(at, pa.scalar(since, at.type)), False))


def recent_dead_letters(dlq: pa.Table, now: dt.datetime) -> pa.Table:
    """The DLQ rows dead-lettered within :data:`DEAD_LETTER_WINDOW` of ``now`` (see :func:`at_or_after`)."""
    return at_or_after(dlq, "dead_lettered_at", now - DEAD_LETTER_WINDOW)


def dead_letters(dlq: pa.Table) -> list[DeadLetterEntry]:
    """Dead letters by group, reason code and error class, most frequent first."""
    if dlq.num_rows == 0:
        return []
    grouped = dlq.group_by(
        ["consumer_group", "reason_code", "error_class"], use_threads=False
    ).aggregate([("dead_lettered_at", "count")])
    entries = [
        DeadLetterEntry(
            r["consumer_group"], r["reason_code"], r["error_class"], r["dead_lettered_at_count"]
        )
        for r in grouped.to_pylist()
    ]
    return sorted(
        entries,
        key=lambda e: (-e.count, group_order(e.consumer_group), e.reason_code or "", e.error_class or ""),
    )


def group_order(group: str | None) -> tuple[bool, str]:
    """How status sorts groups: by name, rows without a group (another writer's) last."""
    return group is None, group or ""


def _count_by_group(rows: pa.Table) -> dict[str | None, int]:
    if rows.num_rows == 0:
        return {}
    counted = (
        rows.select(["consumer_group"])
        .group_by(["consumer_group"], use_threads=False)
        .aggregate([([], "count_all")])
    )
    return dict(
        zip(counted["consumer_group"].to_pylist(), counted["count_all"].to_pylist(), strict=True)
    )


def lag(consume_results: pa.Table, totals: Totals, pending: pa.Table, *, now: dt.datetime) -> list[LagEntry]:
    """Per group: consume results written (``consume_results``: :data:`RESULTS_BY_GROUP`) vs decided
    (``totals``), and retries due vs released at ``now`` (``pending``: :func:`pending_retries`).

    Every consume result gets exactly one outcome (duplicates and bad rows
    too), so written minus decided is what the engine has yet to read. A
    released retry was due (R8: never early), so retries due are the released
    ones and the pending ones due by ``now``. Groups with neither results nor
    outcomes are not listed; results without a group come last.
    """
    written = dict(zip(consume_results["consumer_group"].to_pylist(), consume_results["results"].to_pylist(), strict=True))
    decided = totals.decided()
    released = totals.of_metric(DELIVERED)
    due_mask = pc.fill_null(
        pc.less_equal(pending["due_at"], pa.scalar(now, pending.schema.field("due_at").type)), False
    )
    overdue = _count_by_group(pending.filter(due_mask))
    groups = sorted(set(written) | set(decided), key=group_order)
    return [
        LagEntry(
            consumer_group=g,
            results_written=written.get(g, 0),
            results_decided=decided.get(g, 0),
            results_behind=max(written.get(g, 0) - decided.get(g, 0), 0),
            retries_due=released.get(g, 0) + overdue.get(g, 0),
            retries_released=released.get(g, 0),
            retries_overdue=overdue.get(g, 0),
        )
        for g in groups
    ]


def summarise(
    lake: EngineTables, *, now: dt.datetime, trigger_interval_ms: int, flush_interval_ms: int
) -> Status:
    """The status at ``now`` (pure: no I/O)."""
    state, reason, last, last_batch = query_state(
        lake.progress,
        now=now,
        trigger_interval_ms=trigger_interval_ms,
        flush_interval_ms=flush_interval_ms,
    )
    failures, last_failure_at, last_failure = recent_failures(lake.progress, now=now)
    totals = lake.totals if lake.totals is not None else totals_of(lake.outcomes, lake.retry, lake.released_before)
    pending = pending_retries(lake.outcomes, lake.retry, lake.released_before, lake.discarded_before)
    entries = backlog(pending)
    due = [e.oldest_due_at for e in entries if e.oldest_due_at is not None]
    oldest = min(due) if due else None
    overdue = (
        int((now - oldest).total_seconds() * 1000) if oldest is not None and oldest < now else None
    )
    return Status(
        checked_at=now,
        state=state,
        state_reason=reason,
        stop_reason=last["reason"] if last and state in ("stopped", "failed") else None,
        query_id=last["query_id"] if last else None,
        last_event_at=last["recorded_at"] if last else None,
        last_batch=last_batch,
        outcomes=totals.outcomes(),
        backlog=entries,
        oldest_due_at=oldest,
        overdue_ms=overdue,
        lateness=lateness(recent_releases(lake.retry, now)),
        dead_letters=dead_letters(recent_dead_letters(lake.dlq, now)),
        lag=lag(lake.consume_results, totals, pending, now=now),
        failures_24h=failures,
        last_failure_at=last_failure_at,
        last_failure=last_failure,
    )


def status(config: EngineConfig, *, now: dt.datetime | None = None) -> Status:
    """Read the engine's tables and summarise them."""
    now = now or dt.datetime.now(dt.UTC)
    recorded = _recorded_tables(config, now)
    given: dict[str, pa.Table | None] = (
        {} if recorded is None or recorded.outcomes is None else {"outcomes": recorded.outcomes, "retry": recorded.retry}
    )
    # Of the DLQ, only the files (then row groups) that may hold the window's dead letters.
    dlq = open_table(config.table_path(DLQ.name))
    given["dlq"] = (
        None if dlq is None else rows_since(config, "dlq", "dead_lettered_at", now - DEAD_LETTER_WINDOW, table=dlq)
    )
    lake = read_tables(config, now=now, names=STATUS_TABLES, given=given)
    summary = summarise(
        dataclasses.replace(
            lake,
            totals=None if recorded is None else recorded.totals,
            released_before=released_horizon(config),
            discarded_before=discarded_before(config) if recorded is None else recorded.discarded_before,
        ),
        now=now,
        trigger_interval_ms=config.trigger_interval_ms,
        flush_interval_ms=parse_duration_ms(config.engine.progress_flush_interval),
    )
    return dataclasses.replace(summary, standbys=_standbys(config, now))


def _standbys(config: EngineConfig, now: dt.datetime) -> list[StandbyEntry]:
    """The lake's standby notes; none, with a warning, when the store does not list them."""
    try:
        return standbys(config.engine.lake, now=now)
    except Exception as exc:  # noqa: BLE001 - a note for operators: status goes on without it
        log.warning("status: the standby notes on %s could not be read: %s", config.engine.lake, exc)
        return []


@dataclass(frozen=True)
class Recorded:
    """What :func:`_recorded_tables` read: the lake's totals, and the outcome and retry rows beside them."""

    totals: Totals
    # The retries decided with a due time in the window, and the retry rows due in it or delivered
    # within LATENESS_WINDOW; None when no window holds the recorded count (every row is read).
    outcomes: pa.Table | None
    retry: pa.Table | None
    discarded_before: dt.datetime | None  # the state's discard mark, read with the record


def _recorded_tables(config: EngineConfig, now: dt.datetime) -> Recorded | None:
    """What `status` needs of the outcome and retry tables when the lake's batch record vouches for the
    rest; None when it cannot, and every row is read.

    Counts since the first batch are the record's :class:`Totals`. Pending retries are looked for
    among those due within :data:`PENDING_WINDOW` of ``now`` (the files whose statistics may hold one,
    then the rows), a window widened until it holds as many as the record counts: a retry decided long
    ago was released long ago, unless the engine was stopped (then the window widens to its due
    time). The record and both tables are read at one batch (:func:`_holds_through`). Lateness needs
    the retry rows delivered within :data:`LATENESS_WINDOW`.

    Every row is read instead when the record carries no totals (a lake of an earlier release until its
    engine's next start; an engine on ``table_format = "delta"``, or one that has not recorded a
    batch since it took the lake over), when the tables keep moving past the record, and when no
    window holds the recorded count (retries pending for more than the widest window: those an earlier
    release's ``run --discard-pending`` gave up stay pending in the record's count); then, on a ledger that lost rows
    to a row retention, only the outcome and retry rows are read whole, the counts are still the
    record's (``Recorded.outcomes`` None).
    """
    try:
        return _recorded_window(config, now)
    except Exception as exc:  # noqa: BLE001 - a shortcut only: whatever stops it, every row is read as before
        log.warning(
            "status: the lake's batch record could not be used (%s: %s); reading every outcome instead",
            type(exc).__name__, exc,
        )
        return None


def _recorded_window(config: EngineConfig, now: dt.datetime) -> Recorded | None:
    found = recorded_snapshot(config)
    if found is None:
        return None
    record, snapshot, given_up = found
    if record.totals is None:
        return None
    window = pending_window(config, found, now)
    if window is not None:
        return Recorded(record.totals, window.outcomes, window.retry, given_up)
    # No window holds the recorded count (retries it counts that the tables no longer hold as waiting:
    # given up by `run --discard-pending`, their rows since gone to a row retention). When the ledger
    # lost rows to one, the counts since the first batch are still the record's (the tables no longer
    # hold them all) and only the backlog is read whole; else every row is read, counts too.
    cut = [expired_before(table) for table in (snapshot[OUTCOMES.name], snapshot[RETRY.name]) if table is not None]
    return Recorded(record.totals, None, None, given_up) if any(c is not None for c in cut) else None


class RecordedSnapshot(NamedTuple):
    """What :func:`recorded_snapshot` read: the record, the tables at its batch, the state's discard mark."""

    record: BatchRecord
    tables: dict[str, Any]
    discarded_before: dt.datetime | None


class PendingWindow(NamedTuple):
    """What :func:`pending_window` read, and the retries pending among them."""

    outcomes: pa.Table
    retry: pa.Table
    pending: pa.Table


def recorded_snapshot(config: EngineConfig, *, metrics: bool = False) -> RecordedSnapshot | None:
    """The lake's batch record with totals, and the outcome and retry tables (``metrics``: and the
    METRICS table) opened at its batch (:func:`_holds_through`); None when there is no such record or
    the tables keep moving past it. Tables that do not exist are None in the snapshot."""
    names = (OUTCOMES.name, RETRY.name, *((METRICS.name,) if metrics else ()))
    held = False
    for attempt in range(SNAPSHOT_TRIES):
        if attempt:
            time.sleep(SNAPSHOT_PAUSE_S)
        state = read_state(config.engine.lake)
        record = state.last_batch if state is not None else None
        if (
            state is None
            or record is None
            or record.totals is None
            or state.owner is None
            or state.owner.query_id != record.query_id
        ):
            return None
        snapshot = {name: open_table(config.table_path(name)) for name in names}
        # The same record after the tables were opened: no engine (this one, or another that took the
        # lake over, whose batches carry another query id) recorded a batch in between.
        again = read_state(config.engine.lake)
        held = (
            again is not None
            and again.epoch == state.epoch
            and again.last_batch == record
            and all(_holds_through(record, name, snapshot[name]) for name in (OUTCOMES.name, RETRY.name))
        )
        if held and (not metrics or _metrics_through(record, snapshot[METRICS.name])):
            return RecordedSnapshot(record, snapshot, state.discarded_before)
    if held:
        log.info("plots: the METRICS table does not hold the lake's recorded batch; reading every METRICS row")
    else:
        log.info("status: the tables kept moving past the lake's batch record; reading every outcome")
    return None


def pending_window(config: EngineConfig, found: RecordedSnapshot, now: dt.datetime) -> PendingWindow | None:
    """The outcome and retry rows of ``found``'s tables (:func:`recorded_snapshot`) that hold every retry
    pending at the recorded batch: those due within a window of ``now`` widened until it holds as many
    as the record counts (see :func:`_recorded_tables`), the retry rows also those delivered within
    :data:`LATENESS_WINDOW`. None when no window does."""
    record, snapshot = found.record, found.tables
    window, horizon = PENDING_WINDOW, released_horizon(config, snapshot[RETRY.name])
    for _ in range(WINDOW_TRIES):
        since = now - window
        outcomes = _retries_decided(config, snapshot[OUTCOMES.name], since)
        retry = _retry_rows(config, snapshot[RETRY.name], since, now - LATENESS_WINDOW)
        pending = pending_retries(outcomes, retry, horizon, found.discarded_before)
        if pending.num_rows == record.pending_retries:
            return PendingWindow(outcomes, retry, pending)
        window *= WINDOW_GROWTH
    log.info(
        "status: the lake's outcomes due in the last %d days hold other pending retries than its batch "
        "record counts (%d); reading every outcome", (window // WINDOW_GROWTH).days, record.pending_retries,
    )
    return None


def _holds_through(record: BatchRecord, name: str, table: Any) -> bool:
    """Whether the snapshot ``table`` holds the recorded batch of the table ``name`` and no later batch
    of its query (the engine records a batch, then commits it to each table it wrote to)."""
    version = table.transaction_version(record.query_id) if table is not None else None
    if version is not None and version > record.batch_id:
        return False
    return not record.files.get(name) or version == record.batch_id


def _metrics_through(record: BatchRecord, table: Any) -> bool:
    """Whether the METRICS snapshot ``table`` holds the counts of the recorded batch and no later batch
    of its query. A batch that wrote outcome or retry rows appends METRICS rows (it counted them) after
    its record, so its transaction must be there; a batch that wrote neither may have appended none."""
    if table is None:
        return False
    version = table.transaction_version(record.query_id)
    if version is not None and version > record.batch_id:
        return False
    wrote = bool(record.files.get(OUTCOMES.name) or record.files.get(RETRY.name))
    return version == record.batch_id or not wrote


def _since(table: Table, column: str, since: dt.datetime) -> pc.Expression:
    return pc.field(column) >= pa.scalar(since, table[column].type)


def _retries_decided(config: EngineConfig, table: Any, since: dt.datetime) -> pa.Table:
    """The retry outcomes of the snapshot ``table`` due at or after ``since``."""
    table_def, columns = _COLUMNS["outcomes"]
    if table is None:
        return _empty(table_def, columns)
    files = [("due_at", ">=", stats_from(since))]
    rows = (pc.field("outcome") == OUTCOME_RETRY) & _since(table_def, "due_at", since)
    return _columns_of(table, config.table_path(OUTCOMES.name), table_def, columns, files=files, rows=rows)


def _retry_rows(config: EngineConfig, table: Any, since: dt.datetime, delivered_since: dt.datetime) -> pa.Table:
    """The rows of the snapshot ``table`` due at or after ``since`` or delivered at or after ``delivered_since``."""
    table_def, columns = _COLUMNS["retry"]
    if table is None:
        return _empty(table_def, columns)
    files = [[("due_at", ">=", stats_from(since))], [("delivered_at", ">=", stats_from(delivered_since))]]
    rows = _since(table_def, "due_at", since) | _since(table_def, "delivered_at", delivered_since)
    return _columns_of(table, config.table_path(RETRY.name), table_def, columns, files=files, rows=rows)


def rows_since(config: EngineConfig, name: str, column: str, since: dt.datetime, *, table: Any = None) -> pa.Table:
    """What status and plots read of the table ``name`` (its :data:`_COLUMNS`), of the rows whose
    ``column`` is at or after ``since``: only the files whose statistics may hold one, then the row
    groups, then the rows. ``table``: a snapshot already open (else the table's latest version); no
    table is an empty one. A column of another type (a table another writer made) cannot prune: every
    row is read and cast (:func:`_columns_of`; without the column: :class:`SchemaMismatchError`)."""
    table_def, columns = _COLUMNS[name]
    path = config.table_path(name)
    delta = table if table is not None else open_table(path)
    if delta is None:
        return _empty(table_def, columns)
    files = [(column, ">=", stats_from(since))]
    return _columns_of(delta, path, table_def, columns, files=files, rows=_since(table_def, column, since))


# -- output ---------------------------------------------------------------------
def _iso(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _num(value: float | int | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"  # another writer's NaN or infinite rate is no figure
    if isinstance(value, float):
        return f"{value:,.1f}{unit}"
    return f"{value:,}{unit}"


# The text output's tables show at most this many rows, those of the largest figures (a lake of 1,000
# groups printed 2,000 lines); `status --json` has every one.
TEXT_TABLE_ROWS = 25
# A cell longer than this (a group name of up to 255 characters widened every row) is cut.
TEXT_CELL_WIDTH = 60


def _largest(
    headers: list[str],
    rows: list[list[str]],
    weights: list[float | int | None],
    what: str,
    *,
    pinned: int = 0,
) -> list[str]:
    """:func:`_table` of ``rows``, or of the first ``pinned`` (a total's row) and the :data:`TEXT_TABLE_ROWS`
    of the largest ``weights`` among the others (in their order), and a line saying how many more there are."""
    if len(rows) <= pinned + TEXT_TABLE_ROWS:
        return _table(headers, rows)
    ranked = sorted(range(pinned, len(rows)), key=lambda i: -(weights[i] or 0))[:TEXT_TABLE_ROWS]
    more = len(rows) - pinned - TEXT_TABLE_ROWS
    return [*_table(headers, [rows[i] for i in [*range(pinned), *sorted(ranked)]]),
            f"  ... and {more:,} more {what} (the {TEXT_TABLE_ROWS} largest shown; status --json has every one)"]


def _cell(text: str) -> str:
    """A cell's text, escaped; a long one cut in its middle (two long names that begin alike stay apart)."""
    if len(text) > TEXT_CELL_WIDTH:
        keep = (TEXT_CELL_WIDTH - 3) // 2
        text = text[:keep] + "..." + text[-keep:]
    return printable(text)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    rows = [[_cell(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = ["  " + line.rstrip()]
    out += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    return out


def format_status(status: Status) -> str:
    """Human-readable status (the CLI's default output)."""
    lines = [
        f"query       {status.state}: {printable(status.state_reason)}",
        f"query id    {printable(status.query_id or '-')}",
        f"checked at  {_iso(status.checked_at)}",
    ]
    if status.failures_24h:
        lines.append(
            f"failures    {status.failures_24h} in the last 24 h (`run` restarts a failed query); "
            f"the last at {_iso(status.last_failure_at)}: {printable(status.last_failure or '-')}"
        )
    lines += [_standby_line(e, status.checked_at) for e in status.standbys]
    batch = status.last_batch
    if batch is None:
        lines.append("last batch  -")
    else:
        lines.append(
            f"last batch  #{'-' if batch.batch_id is None else batch.batch_id} at {_iso(batch.started_at)}: {_num(batch.duration_ms, ' ms')}, "
            f"{_num(batch.input_rows)} rows in, {_num(batch.processed_rows_per_second, ' rows/s')}, "
            f"state {_num(batch.state_rows)} rows / {_num(batch.state_memory_bytes, ' B')}"
        )
    counts = ", ".join(f"{k} {v:,}" for k, v in status.outcomes.items()) or "-"
    lines.append(f"outcomes    {counts}")
    lines.append("")
    pending = sum(e.pending for e in status.backlog)
    lines.append(f"backlog     {pending:,} retries pending in the schedule stage")
    if status.backlog:
        lines += _largest(
            ["group", "level", "pending", "oldest due"],
            [
                [e.consumer_group, _num(e.delay_level), _num(e.pending), _iso(e.oldest_due_at)]
                for e in status.backlog
            ],
            [e.pending for e in status.backlog],
            "groups and levels",
        )
    overdue = f" (overdue by {status.overdue_ms:,} ms)" if status.overdue_ms is not None else ""
    lines.append(f"oldest due  {_iso(status.oldest_due_at)}{overdue}")
    lines.append("")
    lines.append("lateness    delivered_at - due_at of retries released in the last 24 h")
    if status.lateness:
        lines += _largest(
            ["group", "deliveries", "p50 ms", "p99 ms", "max ms"],
            [
                [
                    shown_group(e.consumer_group),
                    _num(e.deliveries),
                    _num(e.p50_ms),
                    _num(e.p99_ms),
                    _num(e.max_ms),
                ]
                for e in status.lateness
            ],
            [e.p99_ms for e in status.lateness],
            "groups",
            pinned=1,  # lateness() puts every group's row (ALL_GROUPS) first
        )
    else:
        lines.append("  no retries released in the last 24 h")
    lines.append("")
    lines += _format_lag(status.lag)
    lines.append("")
    total = sum(e.count for e in status.dead_letters)
    ever = status.outcomes.get(DEAD_LETTER, 0)
    lines.append(f"dead letters {total:,} in the last 24 h, {ever:,} since the first batch")
    if status.dead_letters:
        lines += _largest(
            ["group", "reason", "error class", "count"],
            [
                [shown_group(e.consumer_group), e.reason_code or "-", e.error_class or "-", _num(e.count)]
                for e in status.dead_letters
            ],
            [e.count for e in status.dead_letters],
            "groups, reasons and error classes",
        )
    return "\n".join(lines) + "\n"


def _standby_line(entry: StandbyEntry, now: dt.datetime) -> str:
    """One line per standby note; what anyone may have written there is shown escaped, on one line."""
    note = entry.note
    if note is None:
        return f"standby     {printable(entry.file)}: unreadable ({printable(entry.problem or '')})"
    seen = max(0, int((now - note.seen_at).total_seconds()))
    state = "polling the lease" if entry.live else "stale: not renewed; stopped, killed, or cut off from the lake"
    return (
        f"standby     {printable(note.host)} pid {note.pid}, waiting since {_iso(note.since)}, last seen {seen} s "
        f"ago ({state}), checkpoint {printable(note.checkpoint)}"
    )


def shown_group(group: str | None) -> str:
    """A group as status and the plots show it: rows without one (another writer's) under :data:`NO_GROUP`."""
    return group if group is not None else NO_GROUP


def printable(text: str) -> str:
    """``text`` safe to print on a terminal, on one line: unchanged when every character is printable, else
    escaped as a Python literal (``\\x1b``, ``\\n``). What another writer put in a table is shown through
    this (``status``, ``dlq list``, ``dlq show``), never raw: an escape sequence would drive the terminal."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _format_lag(entries: list[LagEntry]) -> list[str]:
    behind = sum(e.results_behind for e in entries)
    lines = [f"lag         {behind:,} consume results not decided yet; retries due vs released"]
    if not entries:
        return [*lines, "  no consume results yet"]
    return lines + _largest(
        ["group", "results written", "decided", "behind", "retries due", "released", "due, not released"],
        [
            [
                shown_group(e.consumer_group),
                _num(e.results_written),
                _num(e.results_decided),
                _num(e.results_behind),
                _num(e.retries_due),
                _num(e.retries_released),
                _num(e.retries_overdue),
            ]
            for e in entries
        ],
        [e.results_behind + e.retries_overdue for e in entries],
        "groups",
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return _iso(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN or infinity (a strict parser rejects Python's bare NaN)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def status_json(status: Status) -> dict[str, Any]:
    """The status as JSON-ready data (timestamps as ISO 8601 UTC strings, a number that is not finite as null)."""
    result: dict[str, Any] = _jsonable(dataclasses.asdict(status))
    return result
