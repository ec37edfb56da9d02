"""Writing one micro-batch of engine output to its Delta tables, in one Spark job.

The stateful stage emits rows of the internal ``WORK`` schema, packed
(:mod:`retry_engine.core.packed`). One ``mapInArrow`` pass over them (the batch's only Spark action) routes every
row to its table(s) on the executors (retry, DLQ, quarantine, outcomes),
writes them as new Parquet files under each table, and sends back to the
driver the files' add-action fields plus the batch's partial counts and
lateness samples. The driver then commits one Delta transaction per table,
and the METRICS rows (:mod:`retry_engine.core.metrics`) as a fifth, each with
Delta's idempotent-write token (``txnAppId`` = the query id, ``txnVersion``
= the batch id). The transactions are independent of each other, so they run
side by side, one thread each (:data:`PARALLEL_COMMITS`): on object storage a
commit is several round trips, and one after another a batch paid their sum.

Replay (B1): a table that already records the batch's transaction skips it
(checked before the job, so its tasks write nothing, and again at commit);
tables that missed it get it. Files of an attempt that never commits are
deleted or, if the process dies first, left unreferenced, which no Delta
reader sees (vacuum removes them).

Exactly once per lake (B8): with a :class:`~retry_engine.core.lease.LakeLease`, the
batch is first recorded in the lake's engine-state row (the consume_results
offset it read through, its files per table, the pending retries after it),
fenced by the lease epoch; that record is the batch's commit point. The
output tables are committed after it, and whoever starts next on the lake
(this checkpoint or a new one) first commits the recorded files to any table
that lacks them (:func:`roll_forward`), then resumes after the recorded
offset. A recorded batch's files are never deleted.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Final, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from retry_engine.config import DEFAULT_DIRECT_WRITE_ROWS, EngineConfig
from retry_engine.core import metrics
from retry_engine.core._schedule_state import KIND_STATE_QUARANTINE
from retry_engine.core.decide import (
    DEAD_LETTER,
    KIND_DELIVERY,
    KIND_OUTCOME,
    NO_STATE_BUCKET,
    QUARANTINED,
)
from retry_engine.core.decide import RETRY as RETRY_OUTCOME
from retry_engine.core.lease import BatchRecord, LakeLease, read_state, written_files
from retry_engine.core.packed import as_work, pack, packed_batch
from retry_engine.core.resume import planned_end
from retry_engine.core.totals import Totals, carried
from retry_engine.delta import storage
from retry_engine.delta._arrow_ipc import from_ipc, to_ipc
from retry_engine.delta._files import PartitionedWriter, WrittenFile
from retry_engine.delta._log import TableLocation
from retry_engine.delta._worker_heap import settle
from retry_engine.delta.sink import FilesWritten, abort_files, commit_files
from retry_engine.delta.tables import append_arrow, check_writable, ensure_table, not_null_columns
from retry_engine.schemas import DLQ, METRICS, OUTCOMES, QUARANTINE, RETRY, Table

log = logging.getLogger(__name__)

_Rows = TypeVar("_Rows", pa.Table, pa.RecordBatch)

OnCounts = Callable[[int, list[tuple[str, str, str, int]]], None]

# What a write task sends back: one row per written file or per partial.
TASK_RESULT_SCHEMA: Final = "kind string, table string, payload binary"
_FILE, _COUNTS, _SAMPLES = "file", "counts", "samples"
_RESULT_NAMES: Final = ["kind", "table", "payload"]

# Table columns filled from a differently named WORK column.
_RENAMES: Final[Mapping[str, Mapping[str, str]]] = {
    QUARANTINE.name: {"msg_id": "consumed_msg_id"},
    OUTCOMES.name: {
        "msg_id": "consumed_msg_id",
        "origin_msg_id": "consumed_origin_msg_id",
        "reconsume_times": "consumed_reconsume_times",
    },
}
ROUTED_TABLES: Final = (RETRY, DLQ, QUARANTINE, OUTCOMES)
# A batch's table commits (and its metrics append) run side by side, one thread each; False: one
# after another, in table order (what bench/bench_s3.py compares against).
PARALLEL_COMMITS = True
# The WORK columns read from a row that goes to the outcomes table only (a retry's or a
# duplicate's ledger row): the table's own, under their WORK names, and what routing and the
# metrics (metrics.partial_counts, metrics.lateness_samples) read. The schedule stage sends such
# rows on with these columns only (schedule.ledger_only; packed.unpack makes the others null):
# the message itself travels with the retry held in state, not twice (#14 part 5).
LEDGER_COLUMNS: Final = frozenset(
    {_RENAMES[OUTCOMES.name].get(name, name) for name in OUTCOMES.names if name != "batch_id"}
    | {"kind", "route", "bucket", "outcome", "consumer_group", "retry_topic", "delay_level", "decided_at",
       "delivered_at", "due_at"}
)


def route(work: pa.Table, batch_id: int) -> dict[str, pa.Table]:
    """WORK rows projected onto each output table (tables with no rows left out).

    retry: deliveries; dlq: dead-letter outcomes; quarantine: quarantined
    outcomes and schedule states moved aside; outcomes: every outcome row. ``batch_id`` fills the tables'
    ``batch_id`` column.
    """
    out: dict[str, pa.Table] = {}
    for table in ROUTED_TABLES:
        rows = route_to(work, table, batch_id)
        if rows.num_rows:
            out[table.name] = rows
    return out


def route_to(work: pa.Table, table: Table, batch_id: int) -> pa.Table:
    """The rows of ``work`` that belong in ``table`` (one of :data:`ROUTED_TABLES`), projected onto it."""
    kind, outcome = work.column("kind"), work.column("outcome")
    is_outcome = pc.equal(kind, KIND_OUTCOME)
    masks = {
        RETRY.name: lambda: pc.equal(kind, KIND_DELIVERY),
        DLQ.name: lambda: pc.and_(is_outcome, pc.equal(outcome, DEAD_LETTER)),
        # A schedule state moved aside (kind state_quarantine) is quarantined but is no outcome.
        QUARANTINE.name: lambda: pc.or_(
            pc.and_(is_outcome, pc.equal(outcome, QUARANTINED)),
            pc.equal(kind, KIND_STATE_QUARANTINE),
        ),
        OUTCOMES.name: lambda: is_outcome,
    }
    return _project(work, masks[table.name](), table, batch_id)


def _project(work: pa.Table, mask: pa.ChunkedArray, table: Table, batch_id: int) -> pa.Table:
    """The rows of ``work`` under ``mask`` in ``table``'s columns; only those columns are filtered (#14 part 5)."""
    renames = _RENAMES.get(table.name, {})
    wanted = list(dict.fromkeys(renames.get(name, name) for name in table.names if name != "batch_id"))
    rows = work.select(wanted)
    kept = pc.sum(mask).as_py() or 0
    if kept < rows.num_rows:  # every row kept (all outcomes at 100% failures): no copy of the columns
        rows = rows.filter(mask) if kept else rows.slice(0, 0)
    arrays = [
        pa.repeat(pa.scalar(batch_id, pa.int64()), rows.num_rows)
        if name == "batch_id"
        else rows.column(renames.get(name, name))
        for name in table.names
    ]
    return pa.Table.from_arrays(arrays, schema=table.arrow_schema)


@dataclass(frozen=True)
class _Target:
    """One output table as the write tasks see it (pickled to the executors)."""

    name: str
    uri: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    not_null: tuple[str, ...]
    # The executors cannot see the driver's storage registry; not in repr (credentials).
    storage_options: Mapping[str, str] | None = field(default=None, repr=False, compare=False)


class _TaskFiles:
    """One task's writers to the routed tables, with the counts and lateness samples of what it wrote."""

    def __init__(self, targets: tuple[_Target, ...], batch_id: int) -> None:
        self.batch_id = batch_id
        self.writers = {
            t.name: PartitionedWriter(
                *TableLocation(t.uri, t.storage_options).filesystem(),
                t.schema,
                partition_by=t.partition_by,
                not_null=t.not_null,
                uri=t.uri,
            )
            for t in targets
        }
        self.counts: list[pa.Table] = []
        self.samples: list[pa.Table] = []

    def add(self, work: pa.Table) -> None:
        """Route ``work`` (WORK rows) to the tables and write it."""
        for name, routed in route(work, self.batch_id).items():
            if name in self.writers:
                for part in routed.to_batches():
                    self.writers[name].write(part)
        self.counts.append(metrics.partial_counts(work))
        self.samples.append(metrics.lateness_samples(work))

    def close(self) -> list[tuple[str, str, bytes]]:
        """Close the files; the task's result rows (:data:`TASK_RESULT_SCHEMA`): its files and partials."""
        files = {name: writer.close() for name, writer in self.writers.items()}
        rows: list[tuple[str, str, bytes]] = [
            (_FILE, name, json.dumps(asdict(f)).encode())
            for name, written in files.items()
            for f in written
        ]
        if self.counts:
            rows.append((_COUNTS, "", to_ipc(metrics.merge_counts(self.counts))))
            late = pa.concat_tables(self.samples)
            if late.num_rows:
                rows.append((_SAMPLES, "", to_ipc(late)))
        return rows

    def discard(self) -> None:
        for writer in self.writers.values():
            writer.discard()


def _result_batch(rows: list[tuple[str, str, bytes]]) -> pa.RecordBatch:
    kinds, tables, payloads = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(kinds, pa.string()),
            pa.array(tables, pa.string()),
            pa.array(payloads, pa.binary()),
        ],
        names=_RESULT_NAMES,
    )


@dataclass(frozen=True)
class WriteTask:
    """The ``mapInArrow`` function of one batch: route, write, count.

    Packed rows under :data:`WRITTEN_ROUTE` carry another task's result rows (files the decide
    step wrote, :class:`StatelessWrites`): they are passed on as they are.

    Replay: a replayed task writes new files with new names; only the files the
    driver commits become visible, and it commits a batch to a table once.
    """

    batch_id: int
    targets: tuple[_Target, ...]

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        settle()
        task = _TaskFiles(self.targets, self.batch_id)
        forwarded: list[pa.Table] = []
        try:
            for batch in batches:
                work: list[pa.Table] = []
                for key, payload in zip(
                    batch.column("route").to_pylist(), batch.column("payload").to_pylist(), strict=True
                ):
                    rows = from_ipc(payload)
                    # The schema decides: a quarantined consume result keeps whatever group it
                    # came with as its route, "/written" included.
                    if key == WRITTEN_ROUTE and rows.schema.names == _RESULT_NAMES:
                        forwarded.append(rows)
                    else:
                        work.append(as_work(rows))
                if work:
                    task.add(pa.concat_tables(work))
            results = task.close()
        except BaseException:
            task.discard()
            raise
        if results:
            yield _result_batch(results)
        for table in forwarded:
            yield from table.to_batches()


# Packed rows under this route carry a task's result rows (TASK_RESULT_SCHEMA as Arrow IPC),
# not WORK rows. Never a state key's route: "/" is in no valid group name.
WRITTEN_ROUTE: Final = "/written"


@dataclass(frozen=True)
class StatelessWrites:
    """The decide step writes the rows that need no state (acknowledgements, drops, quarantined
    input) to their tables itself, instead of sending them through the shuffle and the
    schedule stage to the writer (#15 goal 2, #14 part 5): at 10% failures they are nine
    rows in ten, and the decide tasks run in parallel, one per input file, where the stage
    after the shuffle has one task per state partition.

    A task writes them only once it holds ``min_rows`` of them (``engine.direct_write_rows``);
    a task with fewer sends them on packed as before, so a trickle of small input files
    adds no small files to the tables. What a task wrote travels on as its result rows (files, counts), packed
    under :data:`WRITTEN_ROUTE` with no state bucket; the schedule stage passes them
    through and the writer forwards them to the driver, which commits them with the
    batch's other files (recorded in the lake first, like them).

    Replay: a decide task cannot know which tables a replay skips, so it writes for all;
    its files for a table that already has the batch are deleted at commit, which finds the
    batch there (as for a batch that reached a table elsewhere meanwhile). An attempt whose
    task or batch fails leaves its files unreferenced (no Delta reader sees them;
    ``maintain``'s vacuum removes them).
    """

    targets: tuple[_Target, ...]
    min_rows: int = DEFAULT_DIRECT_WRITE_ROWS

    def task(self, batch_id: int) -> StatelessTask:
        return StatelessTask(self, batch_id)


class StatelessTask:
    """One decide task's stateless rows: held until :attr:`StatelessWrites.min_rows`, then written."""

    def __init__(self, plan: StatelessWrites, batch_id: int) -> None:
        self.plan = plan
        self.batch_id = batch_id
        self.held: list[pa.Table] = []
        self.held_rows = 0
        self.files: _TaskFiles | None = None

    def keep_stateful(self, work: _Rows) -> _Rows:
        """The rows of ``work`` that need state; the rest (no state bucket) are held or written."""
        stateless = pc.fill_null(pc.equal(work.column("bucket"), NO_STATE_BUCKET), False)
        n = pc.sum(stateless).as_py() or 0
        if n == 0:  # 100% failures: no copy of the batch
            return work
        if n == work.num_rows:
            rows, rest = work, work.slice(0, 0)
        elif pc.all(stateless.slice(0, n)).as_py():
            # Decided with in_order=False, acknowledgements come first: two slices, no copy.
            rows, rest = work.slice(0, n), work.slice(n)
        else:
            rows, rest = work.filter(stateless), work.filter(pc.invert(stateless))
        self._take(pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows)
        return rest

    def _take(self, rows: pa.Table) -> None:
        if self.files is not None:
            self.files.add(rows)
            return
        self.held.append(rows)
        self.held_rows += rows.num_rows
        if self.held_rows >= self.plan.min_rows:
            self.files = _TaskFiles(self.plan.targets, self.batch_id)
            self.files.add(pa.concat_tables(self.held))
            self.held, self.held_rows = [], 0

    def finish(self) -> list[pa.RecordBatch]:
        """What the task sends on at its end, packed: the rows it held, or (when it wrote them) one
        row under :data:`WRITTEN_ROUTE` with its result rows (Arrow IPC)."""
        if self.held:
            return [pack(pa.concat_tables(self.held))]
        if self.files is None:
            return []
        rows = self.files.close()
        if not rows:
            return []
        return [packed_batch([(WRITTEN_ROUTE, NO_STATE_BUCKET)], [to_ipc(_result_batch(rows))])]

    def discard(self) -> None:
        if self.files is not None:
            self.files.discard()


def pending_change(counts: pa.Table) -> int:
    """How a batch changes the number of pending retries: retry outcomes in, deliveries out."""
    change = 0
    for metric, value in zip(
        counts.column("metric").to_pylist(), counts.column("value").to_pylist(), strict=True
    ):
        if metric == RETRY_OUTCOME:
            change += int(value)
        elif metric == metrics.DELIVERED:
            change -= int(value)
    return change


def roll_forward(config: EngineConfig, batch: BatchRecord) -> list[str]:
    """Commit the recorded ``batch``'s files to every output table that lacks its transaction.

    Idempotent: tables that already record ``(batch.query_id, batch.batch_id)``
    are left alone. Returns the tables committed now.
    """
    tables = {t.name: t for t in ROUTED_TABLES}
    done = []
    for name, entries in batch.files.items():
        table = tables.get(name)
        if table is None or not entries:
            continue
        if commit_files(
            storage.location(config.table_path(name)),
            [FilesWritten(written_files(name, entries))],
            mode="append",
            partition_by=table.partition_by,
            app_id=batch.query_id,
            txn_version=batch.batch_id,
            replayed=False,  # the recorded files themselves: never deleted
        ):
            done.append(name)
    if done:
        log.warning(
            "batch %s/%d was recorded in the lake but not committed to %s: committed now",
            batch.query_id,
            batch.batch_id,
            done,
        )
    return done


@dataclass
class BatchWriter:
    """``foreachBatch`` function: every output table of one micro-batch from one Spark job.

    Tables are created when the writer is made, so readers find them before
    the first output. With ``lease`` (and the query's ``checkpoint``, for the
    batch's source offset) every batch is first recorded in the lake, fenced
    by the lease: a writer that was taken over raises
    :class:`~retry_engine.errors.LeaseLostError` and commits nothing.
    ``pending_retries`` is the lake's count after the last recorded batch, ``totals``
    its counts through it (:mod:`retry_engine.core.totals`; None: the records carry none).
    """

    config: EngineConfig
    app_id: str
    on_counts: OnCounts | None = None
    lease: LakeLease | None = None
    checkpoint: str | None = None
    pending_retries: int = 0
    totals: Totals | None = None
    # A new checkpoint that gave up the retries its predecessors left waiting (--discard-pending):
    # when, written to the lake with its first record (then None), so an old checkpoint resumed after
    # a start that never got that far still finds its retries counted as pending.
    discarded_before: dt.datetime | None = None
    _targets: tuple[_Target, ...] = field(init=False, repr=False)
    _last_batch: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        targets = []
        for table in (*ROUTED_TABLES, METRICS):
            uri = self.config.table_path(table.name)
            delta = ensure_table(
                uri,
                table.arrow_schema,
                partition_by=table.partition_by,
                add_missing=True,
                properties=storage.BATCH_TABLE_PROPERTIES,
            )
            check_writable(uri, delta)
            targets.append(
                _Target(
                    table.name,
                    uri,
                    table.arrow_schema,
                    table.partition_by,
                    not_null_columns(delta),
                    storage.options_for(uri),
                )
            )
        self._targets = tuple(targets)

    def stateless_writes(self) -> StatelessWrites:
        """What the decide step needs to write stateless rows itself (:class:`StatelessWrites`)."""
        return StatelessWrites(
            tuple(t for t in self._targets if t.name != METRICS.name),
            min_rows=self.config.engine.direct_write_rows,
        )

    def _already_committed(self, batch_id: int) -> set[str]:
        """Tables that record this batch's transaction.

        Only a batch id at or below the last one this writer handled (or the
        first batch after a start) can be a replay, so only then is the log read.
        """
        if self._last_batch is not None and batch_id > self._last_batch:
            return set()
        done = set()
        for target in self._targets:
            version = storage.open_delta(target.uri).transaction_version(self.app_id)
            if version is not None and version >= batch_id:
                done.add(target.name)
        return done

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Write batch ``batch_id``. Replayed: tables that committed it skip it, the others get it."""
        skip = self._already_committed(batch_id)
        if skip:
            log.info(
                "batch %d: already committed to %s; those tables skip it", batch_id, sorted(skip)
            )
        task = WriteTask(
            batch_id,
            tuple(t for t in self._targets if t.name not in skip and t.name != METRICS.name),
        )
        # The one Spark job of the batch: runs the stateful stage and the writes.
        result = batch.mapInArrow(task, TASK_RESULT_SCHEMA).toArrow()
        self._last_batch = batch_id if self._last_batch is None else max(self._last_batch, batch_id)
        if result.num_rows == 0:
            # An idle engine's batches only fire timeouts and release nothing: no commits.
            if self.on_counts is not None:
                self.on_counts(batch_id, [])
            return
        files: dict[str, list[WrittenFile]] = {}
        counts: list[pa.Table] = []
        samples: list[pa.Table] = []
        for kind, name, payload in zip(
            result.column("kind").to_pylist(),
            result.column("table").to_pylist(),
            result.column("payload").to_pylist(),
            strict=True,
        ):
            if kind == _FILE:
                files.setdefault(name, []).append(WrittenFile(**json.loads(payload)))
            elif kind == _COUNTS:
                counts.append(from_ipc(payload))
            else:
                samples.append(from_ipc(payload))
        merged = metrics.merge_counts(counts)
        try:
            recorded = self._record(batch_id, files, merged, counted=not skip)
        except BaseException:
            # Fenced (LeaseLostError) or the record failed: unless the record landed all the same,
            # no commit will reference these files. Kept when the lake cannot tell (the vacuum
            # deletes them if no version ever names them).
            if self._lake_records(batch_id, files) is False:
                self._abort(files)
            raise
        if not recorded:
            # Replay of a batch the lake already records: its recorded files were
            # committed at start (roll_forward); this attempt's files are dropped.
            self._abort(files)
        metric_rows = (
            metrics.metric_rows(counts, samples, batch_id=batch_id, batch_time=dt.datetime.now(dt.UTC))
            if METRICS.name not in skip
            else None
        )
        self._commit(
            batch_id,
            files if recorded else {},
            recorded=self.lease is not None,
            metric_rows=metric_rows if metric_rows is not None and metric_rows.num_rows else None,
        )
        summary = metrics.outcome_summary(merged)
        if summary:
            log.info(
                "batch %d: %s", batch_id, ", ".join(f"{g}/{t}/{o}={n}" for g, t, o, n in summary)
            )
        if self.on_counts is not None:
            self.on_counts(batch_id, summary)

    def _record(
        self, batch_id: int, files: dict[str, list[WrittenFile]], counts: pa.Table, *, counted: bool = True
    ) -> bool:
        """Record the batch in the lake (fenced); False if the lake already records this very batch.

        Replay: the lake's record of this query's batch ``batch_id`` is kept (its
        files are the ones committed), so a replay never records twice. ``counted``
        False: tables hold the batch that no record does (a writer that records no
        batches, Delta's own, wrote it), so the counts of this attempt may be in the
        lake's totals already: the record drops them (:mod:`retry_engine.core.totals`).
        """
        if self.lease is None:
            return True
        pending = self.pending_retries + pending_change(counts)
        totals = carried(self.totals, counts) if counted else None
        end = planned_end(self.checkpoint, batch_id) if self.checkpoint is not None else None
        recorded = self.lease.record_batch(
            BatchRecord(
                query_id=self.app_id,
                batch_id=batch_id,
                source_end=end,
                files=_as_recorded(files),
                pending_retries=pending,
                totals=totals,
            ),
            discarded_before=self.discarded_before,
        )
        self.discarded_before = None  # in the lake now (or already: a replay of a recorded batch)
        if not recorded:
            log.info("batch %d: already recorded in the lake; replay commits nothing new", batch_id)
            return False
        self.pending_retries, self.totals = pending, totals
        return True

    def _lake_records(self, batch_id: int, files: Mapping[str, list[WrittenFile]]) -> bool | None:
        """Whether the lake's last batch is this query's ``batch_id`` with ``files`` (None: unknown)."""
        if self.lease is None:
            return False
        try:
            state = read_state(self.lease.lake)
        except Exception as exc:  # the store failing (what may have failed the record)
            log.warning("batch %d: cannot read whether the lake records it; its files are kept: %s", batch_id, exc)
            return None
        last = state.last_batch if state is not None else None
        return (
            last is not None
            and (last.query_id, last.batch_id) == (self.app_id, batch_id)
            and last.files == _as_recorded(files)
        )

    def _commit(
        self,
        batch_id: int,
        files: dict[str, list[WrittenFile]],
        *,
        recorded: bool = False,
        metric_rows: pa.Table | None = None,
    ) -> None:
        """One idempotent transaction per routed table with ``files``, and the metrics append.

        On error, the files of every table whose commit did not land are deleted
        (none reference them), unless the batch is ``recorded`` in the lake: then
        its files stay for :func:`roll_forward`. The first error (in table order)
        is raised once every commit has ended.
        """
        commits: dict[str, Callable[[], object]] = {}
        for target in self._targets:
            if target.name in files:
                commits[target.name] = functools.partial(
                    commit_files,
                    storage.location(target.uri),
                    [FilesWritten(tuple(files[target.name]))],
                    mode="append",
                    partition_by=target.partition_by,
                    app_id=self.app_id,
                    txn_version=batch_id,
                )
        if metric_rows is not None:
            commits[METRICS.name] = functools.partial(
                append_arrow,
                self.config.table_path(METRICS.name),
                metric_rows,
                app_id=self.app_id,
                txn_version=batch_id,
            )
        failed = _run_all(commits)
        if not failed:
            return
        if not recorded:
            # Files no commit references; a later table's in sequence was never attempted.
            self._abort({name: written for name, written in files.items() if name in failed})
        raise next(iter(failed.values()))

    def _abort(self, files: Mapping[str, list[WrittenFile]]) -> None:
        """Delete ``files`` (by table name), which no commit references."""
        for name, written in files.items():
            abort_files(storage.location(self.config.table_path(name)), [FilesWritten(tuple(written))])


def _as_recorded(files: Mapping[str, list[WrittenFile]]) -> dict[str, list[dict[str, Any]]]:
    """A batch's files (by table name) as its record in the lake holds them (BatchRecord.files)."""
    return {name: [asdict(f) for f in written] for name, written in files.items()}


def _run_all(commits: Mapping[str, Callable[[], object]]) -> dict[str, BaseException]:
    """Run ``commits`` (side by side with :data:`PARALLEL_COMMITS`, else in order, stopping at the
    first error); the error of each one that failed or, in order, never ran, in ``commits``' order."""
    failed: dict[str, BaseException] = {}
    if not PARALLEL_COMMITS or len(commits) < 2:
        for name, commit in commits.items():
            if failed:
                failed[name] = next(iter(failed.values()))
                continue
            try:
                commit()
            except BaseException as exc:
                failed[name] = exc
        return failed
    with ThreadPoolExecutor(max_workers=len(commits), thread_name_prefix="retry-engine-commit") as pool:
        futures = {name: pool.submit(commit) for name, commit in commits.items()}
    for name, future in futures.items():
        if (error := future.exception()) is not None:
            failed[name] = error
    return failed


__all__ = [
    "LEDGER_COLUMNS",
    "TASK_RESULT_SCHEMA",
    "WRITTEN_ROUTE",
    "BatchWriter",
    "StatelessTask",
    "StatelessWrites",
    "WriteTask",
    "pending_change",
    "roll_forward",
    "route",
]
