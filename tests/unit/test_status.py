"""Status and plot data without Spark: the running rule, the summaries, the golden output."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from retry_engine.config import load_config, parse_config
from retry_engine.core.standby import StandbyEntry, StandbyNote
from retry_engine.delta._log import add_actions
from retry_engine.errors import SchemaMismatchError, TablesUnavailableError
from retry_engine.ops.cli import EXIT_NOT_RUNNING, EXIT_USAGE, main
from retry_engine.ops.monitor import lifecycle_row
from retry_engine.ops.plots import (
    CHANGES,
    backlog_anchored,
    backlog_from_ledger,
    backlog_from_metrics,
    backlog_since,
    dead_letters_by_class,
)
from retry_engine.ops.status import (
    _COLUMNS,
    RESULTS_BY_GROUP,
    BacklogEntry,
    DeadLetterEntry,
    EngineTables,
    LagEntry,
    LastBatch,
    LatenessEntry,
    Status,
    _empty,
    _results_by_group,
    backlog,
    dead_letters,
    format_status,
    lag,
    lateness,
    pending_retries,
    query_state,
    read_table_columns,
    read_tables,
    stale_after_ms,
    status,
    status_json,
    summarise,
    totals_of,
)
from retry_engine.ops.terms import PROGRESS_EVENT, STARTED, STOPPED, TERMINATED, StopReason
from retry_engine.schemas import CONSUME_RESULTS, DLQ, METRICS, OUTCOMES, PROGRESS, RETRY
from tests.lakehouse import Lake

GOLDEN = Path(__file__).parent / "golden"
T = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)


def ms(n: int) -> dt.timedelta:
    return dt.timedelta(milliseconds=n)


def event(
    kind: str,
    at: dt.datetime,
    *,
    run: str = "run-1",
    exception: str | None = None,
    reason: StopReason | None = None,
    **values: Any,
) -> dict[str, Any]:
    row = lifecycle_row(
        kind,
        query_id="q-1",
        run_id=run,
        event_time=at,
        recorded_at=at,
        exception=exception,
        reason=reason,
    )
    row.update(values)
    return row


def batch(
    batch_id: int, at: dt.datetime, *, run: str = "run-1", duration: int = 150
) -> dict[str, Any]:
    return event(
        PROGRESS_EVENT,
        at,
        run=run,
        batch_id=batch_id,
        batch_duration_ms=duration,
        duration_ms=[("addBatch", duration - 20), ("triggerExecution", duration)],
        num_input_rows=10 * batch_id,
        processed_rows_per_second=66.7,
        state_rows_total=4,
        state_memory_bytes=2048,
    )


def progress(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=PROGRESS.arrow_schema)


def judge(table: pa.Table, now: dt.datetime) -> tuple[str, str]:
    state, reason, _, _ = query_state(
        table, now=now, trigger_interval_ms=200, flush_interval_ms=500
    )
    return state, reason


# -- the running rule ---------------------------------------------------------------
def test_stale_limit_is_the_largest_of_triggers_batch_time_and_a_floor() -> None:
    assert (
        stale_after_ms(trigger_interval_ms=200, flush_interval_ms=500, last_batch_ms=None) == 30_500
    )
    assert (
        stale_after_ms(trigger_interval_ms=10_000, flush_interval_ms=500, last_batch_ms=1_000)
        == 100_500
    )
    assert (
        stale_after_ms(trigger_interval_ms=200, flush_interval_ms=0, last_batch_ms=40_000) == 80_000
    )


def test_query_state_follows_the_latest_run() -> None:
    assert judge(progress(), T)[0] == "not_started"
    live = progress(event(STARTED, T), batch(0, T + ms(100)), batch(1, T + ms(300)))
    assert judge(live, T + ms(1_000)) == ("running", "last event 700 ms ago (stale after 30500 ms)")
    assert judge(live, T + ms(31_000))[0] == "stale"
    stopped = progress(event(STARTED, T), batch(0, T + ms(100)), event(TERMINATED, T + ms(400)))
    assert judge(stopped, T + ms(500)) == (
        "stopped",
        "stopped at 2026-11-22T12:00:00.400Z (reason: stopped, on request)",
    )
    failed = progress(event(TERMINATED, T + ms(400), exception="java.lang.OOM: heap\n\tat x"))
    assert judge(failed, T + ms(500)) == (
        "failed",
        "terminated at 2026-11-22T12:00:00.400Z (reason: failed) with: java.lang.OOM: heap",
    )
    # A restart after a stop is a new run: the old terminated event no longer counts.
    restarted = progress(*stopped.to_pylist(), event(STARTED, T + ms(600), run="run-2"))
    assert judge(restarted, T + ms(700))[0] == "running"


def test_events_from_far_ahead_and_a_huge_batch_time_keep_no_stopped_engine_running() -> None:
    """Hostile input (the progress table: a host with its clock ahead, or another writer): an event
    recorded years ahead made `status` say "running" (last event -2.5e14 ms ago) with exit 0 while the
    engine had stopped, and a batch time of int64's maximum kept a silent one "running" for good. Events
    more than an hour ahead are left out (and said so); a stale limit is at most a day."""
    stopped = progress(event(STARTED, T), batch(0, T + ms(100)), event(TERMINATED, T + ms(400)))
    far = batch(1, dt.datetime(9999, 12, 31, tzinfo=dt.UTC), run="run-x")
    state, why = judge(progress(*stopped.to_pylist(), far), T + ms(500))
    assert state == "stopped" and why.endswith("(1 event(s) recorded more than 1:00:00 after this clock's now left out: "
                                                "a clock ahead, or another writer)")
    # A clock a few minutes ahead still counts.
    soon = progress(event(STARTED, T), batch(0, T + dt.timedelta(minutes=5)))
    assert judge(soon, T)[0] == "running"
    huge = progress(event(STARTED, T), batch(0, T + ms(100), duration=2**63 - 1))
    assert judge(huge, T + dt.timedelta(days=2))[0] == "stale"
    assert stale_after_ms(trigger_interval_ms=200, flush_interval_ms=0, last_batch_ms=-(2**63)) == 30_000


def test_a_failed_querys_python_error_is_shown_not_sparks_traceback_header() -> None:
    """Spark's first line of a Python data source's failure ends in "Traceback (most recent call last):";
    status shows the Python error with its chain of causes on one line instead."""
    spark_text = (
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform "
        "latestOffset: Traceback (most recent call last):\n"
        '  File "/x/retry_engine/delta/_log.py", line 461, in table\n'
        "OSError: Kernel error -> Generic S3 error\n"
        "          \x1b[31m↳\x1b[0m Connection reset by peer (os error 104)\n"
        "\n SQLSTATE: 38000\n\tat org.apache.spark.sql.errors.X(x.scala:1)\n"
    )
    failed = progress(event(TERMINATED, T + ms(400), exception=spark_text))
    assert judge(failed, T + ms(500)) == (
        "failed",
        "terminated at 2026-11-22T12:00:00.400Z (reason: failed) with: "
        "OSError: Kernel error -> Generic S3 error: Connection reset by peer (os error 104)",
    )


def test_failed_runs_of_the_last_24_hours_are_counted_while_the_restarted_query_runs() -> None:
    """`run` restarts a failed query, so `status` says running; the failures behind it are counted."""
    from retry_engine.ops.status import recent_failures

    day = dt.timedelta(hours=24)
    rows = progress(
        event(TERMINATED, T - day - ms(1), run="run-0", exception="ValueError: a day and a bit ago"),
        event(TERMINATED, T + ms(100), run="run-1", exception="OSError: store gone\n\tat x"),
        event(STARTED, T + ms(200), run="run-2"),
        event(TERMINATED, T + ms(300), run="run-2", reason=STOPPED),  # stopped on request: no failure
        event(STARTED, T + ms(400), run="run-3"),
        event(TERMINATED, T + ms(500), run="run-3", exception="retry_engine.errors.StorageError: [STORAGE_UNREACHABLE] x"),
        event(STARTED, T + ms(600), run="run-4"),
        batch(0, T + ms(700), run="run-4"),
    )
    assert judge(rows, T + ms(800))[0] == "running"
    assert recent_failures(rows, now=T + ms(800)) == (
        2, T + ms(500), "retry_engine.errors.StorageError: [STORAGE_UNREACHABLE] x"
    )
    assert recent_failures(rows, now=T + day + ms(150)) == (1, T + ms(500), "retry_engine.errors.StorageError: [STORAGE_UNREACHABLE] x")
    assert recent_failures(progress(), now=T) == (0, None, None)


@pytest.mark.parametrize(
    "reason, shown",
    [
        (
            "finished",
            "stopped at 2026-11-22T12:00:00.400Z (reason: finished, run --once processed its input)",
        ),
        (
            "lease_lost",
            "stopped at 2026-11-22T12:00:00.400Z (reason: lease_lost, another engine took the lake over)",
        ),
        # A terminated event written before the column existed: no reason to show.
        (None, "stopped at 2026-11-22T12:00:00.400Z"),
    ],
)
def test_a_stop_shows_its_reason(reason: StopReason | None, shown: str) -> None:
    """#13 part 2: `status` says why the query stopped where it shows the stop; JSON has it as stop_reason."""
    terminated = event(TERMINATED, T + ms(400))
    terminated["reason"] = reason
    lake = EngineTables(
        progress=progress(event(STARTED, T), terminated),
        **{
            name: _empty(table, columns)
            for name, (table, columns) in _COLUMNS.items()
            if name != "progress"
        },
        present=frozenset({"progress"}),
    )
    result = summarise(lake, now=T + ms(500), trigger_interval_ms=200, flush_interval_ms=500)
    assert (result.state, result.state_reason, result.stop_reason) == ("stopped", shown, reason)
    assert format_status(result).startswith(f"query       stopped: {shown}\n")
    assert status_json(result)["stop_reason"] == reason


def test_a_running_query_has_no_stop_reason() -> None:
    table = progress(
        event(STARTED, T),
        event(TERMINATED, T + ms(100), reason="finished"),
        event(STARTED, T + ms(200), run="run-2"),
    )
    state, _, last, _ = query_state(
        table, now=T + ms(300), trigger_interval_ms=200, flush_interval_ms=500
    )
    assert state == "running" and last is not None and last["reason"] is None


def test_last_batch_is_the_latest_progress_of_the_latest_run() -> None:
    table = progress(
        batch(7, T, run="old"),
        batch(0, T + ms(500), run="new"),
        batch(1, T + ms(900), run="new", duration=321),
    )
    _, _, last, last_batch = query_state(
        table, now=T + ms(1_000), trigger_interval_ms=200, flush_interval_ms=500
    )
    assert last is not None and last["run_id"] == "new"
    assert last_batch == LastBatch(1, "new", T + ms(900), 321, 10, 66.7, 4, 2048)


# -- backlog, lateness, dead letters ---------------------------------------------------
def ledger(*rows: tuple[str, str, str | None, int | None, dt.datetime | None]) -> pa.Table:
    """outcomes rows: (group, outcome, output_msg_id, delay_level, due_at)."""
    full = [
        {
            **dict.fromkeys(OUTCOMES.names),
            "consumer_group": g,
            "outcome": o,
            "output_msg_id": out,
            "delay_level": level,
            "due_at": due,
            "decided_at": T,
            "batch_id": 0,
        }
        for g, o, out, level, due in rows
    ]
    return pa.Table.from_pylist(full, schema=OUTCOMES.arrow_schema)


def released(*rows: tuple[str, str, int, dt.datetime, dt.datetime]) -> pa.Table:
    """retry rows: (msg_id, group, delay_level, due_at, delivered_at)."""
    names = ("msg_id", "consumer_group", "delay_level", "due_at", "delivered_at")
    schema = pa.schema([RETRY.arrow_schema.field(n) for n in names])
    return pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows], schema=schema)


def test_backlog_is_decided_retries_not_yet_released() -> None:
    outcomes = ledger(
        ("G", "retry", "r1", 3, T + ms(10_000)),
        ("G", "retry", "r2", 3, T + ms(5_000)),
        ("G", "retry", "r3", 4, T + ms(30_000)),
        ("H", "retry", "r4", 3, T + ms(1_000)),
        ("G", "acknowledged", None, None, None),
    )
    retry = released(
        ("r2", "G", 3, T + ms(5_000), T + ms(5_100)), ("r4", "H", 3, T + ms(1_000), T + ms(1_300))
    )
    assert backlog(pending_retries(outcomes, retry)) == [
        BacklogEntry("G", 3, 1, T + ms(10_000)),
        BacklogEntry("G", 4, 1, T + ms(30_000)),
    ]


def test_lag_counts_results_written_vs_decided_and_retries_due_vs_released() -> None:
    """#13 part 5: per group, consume results not decided yet and retries due but not released (R8).

    G wrote 6 results, 5 decided (4 retries r1-r4, 1 acknowledged); at T + 6 s r1 (due T+10 s)
    and r3 (due T+30 s) are not due, r2 (due T+5 s) and r4 (due T+1 s) are, and only r2 is in
    %RETRY%G. H's only result is undecided; two results have no group (bad input, decided:
    one quarantine outcome without a group). K has an outcome whose result was removed
    (a vacuumed consume_results table): nothing is behind, never a negative count.
    """
    outcomes = ledger(
        ("G", "retry", "r1", 3, T + ms(10_000)),
        ("G", "retry", "r2", 3, T + ms(5_000)),
        ("G", "retry", "r3", 4, T + ms(30_000)),
        ("G", "retry", "r4", 3, T + ms(1_000)),
        ("G", "acknowledged", None, None, None),
        (None, "quarantined", None, None, None),  # type: ignore[arg-type]
        ("K", "retry", "k1", 3, None),
    )
    retry = released(
        ("r2", "G", 3, T + ms(5_000), T + ms(5_100)), ("x9", "G", 3, T, T)
    )  # x9: a re-drive, not decided
    results = pa.table({"consumer_group": ["G", "H", None], "results": [6, 1, 2]}, schema=RESULTS_BY_GROUP)
    assert lag(results, totals_of(outcomes, retry), pending_retries(outcomes, retry), now=T + ms(6_000)) == [
        LagEntry(
            "G",
            results_written=6,
            results_decided=5,
            results_behind=1,
            retries_due=2,
            retries_released=1,
            retries_overdue=1,
        ),
        LagEntry(
            "H",
            results_written=1,
            results_decided=0,
            results_behind=1,
            retries_due=0,
            retries_released=0,
            retries_overdue=0,
        ),
        LagEntry(
            "K",
            results_written=0,
            results_decided=1,
            results_behind=0,
            retries_due=0,
            retries_released=0,
            retries_overdue=0,
        ),
        LagEntry(
            None,
            results_written=2,
            results_decided=1,
            results_behind=1,
            retries_due=0,
            retries_released=0,
            retries_overdue=0,
        ),
    ]
    empty = RESULTS_BY_GROUP.empty_table()
    assert lag(empty, totals_of(ledger(), released()), pending_retries(ledger(), released()), now=T) == []


def test_lateness_percentiles_overall_then_per_group() -> None:
    retry = released(
        *[(f"g{i}", "G", 3, T, T + ms(i)) for i in range(1, 101)], ("h1", "H", 3, T, T + ms(1_000))
    )
    overall, g, h = lateness(retry)
    assert overall == LatenessEntry("*", 101, 51.0, 100.0, 1000.0)
    assert g == LatenessEntry("G", 100, 50.0, 99.0, 100.0)
    assert h == LatenessEntry("H", 1, 1000.0, 1000.0, 1000.0)


def test_dead_letters_most_frequent_first() -> None:
    names = ("consumer_group", "reason_code", "error_class", "dead_lettered_at")
    schema = pa.schema([DLQ.arrow_schema.field(n) for n in names])
    rows = (
        [("G", "MAX_RECONSUME_TIMES", "E1", T)]
        + [("H", "NON_RETRYABLE", "E2", T)] * 2
        + [("G", "DLQ_REQUESTED", None, T)]
    )
    dlq = pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows], schema=schema)
    assert dead_letters(dlq) == [
        DeadLetterEntry("H", "NON_RETRYABLE", "E2", 2),
        DeadLetterEntry("G", "DLQ_REQUESTED", None, 1),
        DeadLetterEntry("G", "MAX_RECONSUME_TIMES", "E1", 1),
    ]
    assert dead_letters_by_class(dlq) == {"E1": {"G": 1}, "E2": {"H": 2}, "(none)": {"G": 1}}


def test_backlog_series_from_metrics_is_a_running_sum_of_retry_minus_delivered() -> None:
    def m(batch_id: int, level: int, metric: str, value: float) -> dict[str, Any]:
        return {
            "batch_id": batch_id,
            "batch_time": T + ms(200 * batch_id),
            "consumer_group": "G",
            "retry_topic": "orders",
            "delay_level": level,
            "metric": metric,
            "value": value,
        }

    metrics = pa.Table.from_pylist(
        [
            m(0, 3, "retry", 5),
            m(0, 3, "acknowledged", 9),
            m(1, 3, "delivered", 2),
            m(1, 4, "retry", 1),
            m(2, 3, "delivered", 3),
            m(2, 3, "retry", 1),
        ],
        schema=METRICS.arrow_schema,
    )
    level3, level4 = backlog_from_metrics(metrics)
    assert (level3.delay_level, level3.pending) == (3, [5, 3, 1])
    assert level3.times == [T, T + ms(200), T + ms(400)]
    assert (level4.delay_level, level4.pending) == (4, [1, 1])  # held until the last change


@pytest.mark.parametrize(
    "marks, since, held",
    [
        ([], None, True),
        ([T], None, False),  # rows before the cut are gone: a running sum from 0 is wrong
        ([T], T - ms(1), False),
        ([T], T, True),
        ([T - ms(5), T], T - ms(1), False),  # the latest cut counts
        ([dt.datetime(9999, 12, 31, tzinfo=dt.UTC)], T, False),  # another writer's far-future row: the ledger
        ([dt.datetime(1, 1, 1, tzinfo=dt.UTC)], T, True),
    ],
)
def test_metrics_hold_the_backlog_from_the_latest_expiry_cut_on(
    marks: list[dt.datetime], since: dt.datetime | None, held: bool
) -> None:
    """#14 (row retention): METRICS rows hold the backlog's changes from ``since`` on unless maintenance
    removed rows after it (its `expired_before` rows); an empty table holds nothing."""
    from retry_engine.core.metrics import EXPIRED
    from retry_engine.ops.plots import metrics_hold

    rows = [{"batch_id": 1, "batch_time": T + ms(100), "consumer_group": "G", "retry_topic": "o",
             "delay_level": 3, "metric": "retry", "value": 1.0}]
    rows += [{"batch_id": -1, "batch_time": t, "consumer_group": None, "retry_topic": None,
              "delay_level": None, "metric": EXPIRED, "value": 0.0} for t in marks]
    assert metrics_hold(pa.Table.from_pylist(rows, schema=METRICS.arrow_schema), since) is held
    assert metrics_hold(METRICS.arrow_schema.empty_table(), since) is False


def test_backlog_series_from_ledger_counts_up_on_decision_and_down_on_release() -> None:
    outcomes = ledger(("G", "retry", "r1", 3, T), ("G", "retry", "r2", 3, T))
    retry = released(("r1", "G", 3, T, T + ms(300)))
    (series,) = backlog_from_ledger(outcomes, retry)
    assert series.pending == [2, 1] and series.times == [T, T + ms(300)]


def test_the_ledgers_backlog_counts_a_release_only_with_its_decision_and_a_gone_row_as_released() -> None:
    """#14 (a ledger under a row retention): a retry row whose outcome row expired (r0), or a re-drive's
    row, is no release of the backlog; a retry outcome due before the horizon without its row (r2: its
    retry row expired) was released. Without a horizon r2 still waits."""
    outcomes = ledger(("G", "retry", "r1", 3, T), ("G", "retry", "r2", 3, T))
    retry = released(("r0", "G", 3, T - ms(500), T - ms(400)), ("r1", "G", 3, T, T + ms(300)))
    (series,) = backlog_from_ledger(outcomes, retry, released_before=T + ms(1))
    assert series.pending == [1, 0] and series.times == [T, T + ms(300)]
    (series,) = backlog_from_ledger(outcomes, retry)
    assert series.pending == [2, 1] and series.times == [T, T + ms(300)]
    assert pending_retries(outcomes, retry, T + ms(1)).num_rows == 0
    assert pending_retries(outcomes, retry, T).num_rows == 1  # due at the horizon: may still wait


def test_retries_a_new_checkpoint_gave_up_leave_the_backlog_when_it_gave_them_up() -> None:
    """`run --discard-pending` (#14): a retry outcome decided before the lake's discard mark and never
    released is given up: not pending, and the ledger's backlog line drops at the mark. One decided at
    or after it still waits; a released one was released."""
    outcomes = ledger(("G", "retry", "r1", 3, T), ("G", "retry", "r2", 3, T))
    retry = released(("r1", "G", 3, T, T + ms(300)))
    assert pending_retries(outcomes, retry, discarded_before=T + ms(1)).num_rows == 0
    assert pending_retries(outcomes, retry, discarded_before=T).num_rows == 1  # decided at the mark
    (series,) = backlog_from_ledger(outcomes, retry, discarded_before=T + ms(500))
    assert series.pending == [2, 1, 0] and series.times == [T, T + ms(300), T + ms(500)]


def test_backlog_series_are_carried_to_the_last_change_of_any_series() -> None:
    outcomes = ledger(("G", "retry", "r1", 3, T), ("H", "retry", "r2", 3, T))
    retry = released(("r1", "G", 3, T, T + ms(300)))
    g, h = backlog_from_ledger(outcomes, retry)
    assert (g.pending, h.pending) == ([1, 0], [1, 1]) and h.times == [T, T + ms(300)]


def _random_changes(seed: int, n: int = 400) -> pa.Table:
    """Backlog changes of 3 groups x 3 levels (one of them null) at 60 distinct times, several at a time."""
    rng = np.random.default_rng(seed)
    levels = [3, 4, None]
    return pa.table(
        {
            "time": [T + ms(1_000 * int(t)) for t in rng.integers(0, 60, n)],
            "consumer_group": [f"g{int(g)}" for g in rng.integers(0, 3, n)],
            "delay_level": [levels[int(i)] for i in rng.integers(0, 3, n)],
            "delta": rng.integers(-3, 5, n).tolist(),
        },
        schema=CHANGES,
    )


def _value_at(series: Any, when: dt.datetime) -> int:
    """A step line's value at ``when`` (0 before its first point)."""
    value = 0
    for t, v in zip(series.times, series.pending, strict=True):
        if t > when:
            break
        value = v
    return value


@pytest.mark.parametrize("seed", range(4))
def test_a_backlog_window_draws_what_the_whole_history_draws_from_its_start(seed: int) -> None:
    """#14 (reads that get slower with age): ``plots --since`` folds the changes before the window into
    each line's start, and without reading them (anchored on the backlog at the end) draws the same."""
    changes = _random_changes(seed)
    whole = {(s.consumer_group, s.delay_level): s for s in backlog_since(changes, None)}
    since = T + ms(25_500)
    windowed = backlog_since(changes, since)
    for line in windowed:
        full = whole[(line.consumer_group, line.delay_level)]
        assert line.times[0] == since and line.pending[0] == _value_at(full, since)
        assert all(t >= since for t in line.times)
        for t, v in zip(line.times, line.pending, strict=True):
            assert v == _value_at(full, t), (line.consumer_group, line.delay_level, t)
    # Every line with a backlog at the window's start or a change in it, and no other.
    late = changes.filter(pc.greater_equal(changes["time"], pa.scalar(since, CHANGES.field("time").type)))
    changed = set(zip(late["consumer_group"].to_pylist(), late["delay_level"].to_pylist(), strict=True))
    held = {k for k, line in whole.items() if _value_at(line, since)}
    assert {(line.consumer_group, line.delay_level) for line in windowed} == changed | held
    end = {k: line.pending[-1] for k, line in whole.items()}
    assert backlog_anchored(late, since, end) == windowed


@pytest.mark.parametrize(
    "since", ["0d", "-1d", "7w", "1.5d", "d", "7 d", "1000000000d", "yesterday", "", "2026-13-01", "0001-01-01T00:00+05:00"]
)
def test_plots_since_refuses_what_is_no_window(since: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["plots", "--out", "png", f"--since={since}"])
    assert usage.value.code == EXIT_USAGE
    assert "neither a duration" in capsys.readouterr().err


def test_plots_since_further_back_than_time_goes_is_the_whole_lake(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A window back past year 1 is the whole lake; the dead letter of 2020 is drawn by every window that
    reaches it, and only by those."""
    lake = Lake.make(tmp_path / "lake")
    dead = {**dict.fromkeys(DLQ.names), "msg_id": "D1", "topic": "%DLQ%G", "consumer_group": "G",
            "error_class": "E", "delivery_key": "D1:17", "dead_lettered_at": dt.datetime(2020, 1, 1, 12, tzinfo=dt.UTC)}
    write_deltalake(lake.path("dlq"), pa.Table.from_pylist([dead], schema=DLQ.arrow_schema))
    conf = tmp_path / "c.toml"
    conf.write_text(f'[engine]\nlake = "{lake.root}"\n')
    drawn = {}
    for since in ("999999999d", "all", "2020-01-01T13:00:00+01:00", "0001-01-01", "2020-01-01T12:00:00.000001", "7d"):
        assert main(["plots", "--config", str(conf), "--out", str(tmp_path / "png"), "--since", since]) == 0, since
        line = next(x for x in capsys.readouterr().out.splitlines() if "dead_letters_by_error_class.png" in x)
        drawn[since] = line.split("(")[1].split(" ")[0]  # the bars drawn
    assert drawn == {"999999999d": "1", "all": "1", "2020-01-01T13:00:00+01:00": "1", "0001-01-01": "1",
                     "2020-01-01T12:00:00.000001": "0", "7d": "0"}


# -- output ---------------------------------------------------------------------------
def sample_status() -> Status:
    return Status(
        checked_at=T + ms(1_500),
        state="running",
        state_reason="last event 700 ms ago (stale after 30500 ms)",
        stop_reason=None,
        query_id="0f6c3f4e-6d0a-4a47-9a51-5a8f0c1b2d3e",
        last_event_at=T + ms(800),
        last_batch=LastBatch(42, "run-1", T + ms(600), 187, 1200, 6417.1, 35, 1_052_856),
        outcomes={"acknowledged": 1000, "dead_letter": 5, "retry": 197},
        backlog=[
            BacklogEntry("billing", 3, 12, T + ms(9_000)),
            BacklogEntry("billing", 4, 5, T + ms(29_000)),
            BacklogEntry("orders-consumer", 3, 180, T + ms(1_000)),
        ],
        oldest_due_at=T + ms(1_000),
        overdue_ms=500,
        lateness=[
            LatenessEntry("*", 1000, 112.0, 390.0, 1210.5),
            LatenessEntry("billing", 10, 98.0, 150.0, 150.0),
        ],
        dead_letters=[
            DeadLetterEntry("billing", "NON_RETRYABLE", "com.acme.InvalidOrder", 2),
            DeadLetterEntry("orders-consumer", "MAX_RECONSUME_TIMES", None, 1),
        ],
        lag=[
            LagEntry("billing", 1_017, 1_000, 17, 12, 10, 2),
            LagEntry("orders-consumer", 183, 183, 0, 181, 181, 0),
            LagEntry(None, 2, 2, 0, 0, 0, 0),
        ],
        failures_24h=2,
        last_failure_at=T + ms(400),
        last_failure="OSError: Generic S3 error: Connection reset by peer (os error 104)",
        standbys=[
            StandbyEntry("host-b-4242.json", StandbyNote("host-b", 4242, "hdfs://nn/ckpt/engine", T - ms(60_000), T + ms(1_000), 5.0), True),
            StandbyEntry("host-c-17.json", StandbyNote("host-c", 17, "hdfs://nn/ckpt/engine", T - ms(90_000), T - ms(30_000), 5.0), False),
            StandbyEntry("junk.json", None, False, "a JSON list, not an object"),
        ],
    )


def test_format_status_matches_golden_file() -> None:
    assert format_status(sample_status()) == (GOLDEN / "status.txt").read_text()


def test_status_json_matches_golden_file() -> None:
    got = json.dumps(status_json(sample_status()), indent=2) + "\n"
    assert got == (GOLDEN / "status.json").read_text()


# -- errors ---------------------------------------------------------------------------
def test_status_of_an_empty_lake_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#13 part 4: a lake that is not there is a usage error (exit 2) naming where the commands looked.

    Was exit 1 with TABLES_UNAVAILABLE from the command line; the library call keeps that error.
    """
    conf = tmp_path / "c.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path}/nowhere"\n')
    assert main(["status", "--config", str(conf)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "[LAKE_NOT_FOUND]" in err and f"{tmp_path}/nowhere" in err and "engine.lake" in err
    assert main(["plots", "--config", str(conf), "--out", str(tmp_path / "png")]) == EXIT_USAGE
    assert "[LAKE_NOT_FOUND]" in capsys.readouterr().err
    with pytest.raises(
        TablesUnavailableError, match=r"\[TABLES_UNAVAILABLE\] no engine tables under"
    ):
        status(load_config(conf))


def test_only_a_progress_table_means_not_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = Lake.make(tmp_path)
    write_deltalake(lake.path("progress"), PROGRESS.arrow_schema.empty_table())
    conf = tmp_path / "c.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path}"\n')
    assert main(["status", "--config", str(conf), "--json"]) == EXIT_NOT_RUNNING
    assert json.loads(capsys.readouterr().out)["state"] == "not_started"


def test_a_table_without_a_needed_column_is_named(tmp_path: Path) -> None:
    path = str(tmp_path / "progress")
    write_deltalake(path, pa.table({"query_id": ["q"], "run_id": ["r"]}))
    with pytest.raises(SchemaMismatchError, match="has no column 'query_name'"):
        read_table_columns(path, PROGRESS, tuple(PROGRESS.names))
    assert issubclass(TablesUnavailableError, RuntimeError) and issubclass(
        SchemaMismatchError, ValueError
    )


def test_status_reads_a_progress_table_of_an_older_release_without_the_reason_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#13 part 2, upgrade: before the new engine's first start adds `reason`, `status` still works."""
    lake = Lake.make(tmp_path)
    old_schema = pa.schema([f for f in PROGRESS.arrow_schema if f.name != "reason"])
    rows = [event(STARTED, T), event(TERMINATED, T + ms(400))]
    write_deltalake(lake.path("progress"), pa.Table.from_pylist(rows, schema=old_schema))
    conf = tmp_path / "c.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path}"\n')
    assert main(["status", "--config", str(conf), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["state"], shown["state_reason"], shown["stop_reason"]) == (
        "stopped",
        "stopped at 2026-11-22T12:00:00.400Z",
        None,
    )


def test_consume_results_without_a_group_column_count_as_results_without_a_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#13 part 5, bad-input rule: producers write consume_results; a drifted table without
    ``consumer_group`` (whose rows the engine quarantines as MISSING_GROUP) never breaks status."""
    lake = Lake.make(tmp_path)
    write_deltalake(lake.path("consume_results"), pa.table({"msg_id": ["a", "b", "c"]}))
    conf = tmp_path / "c.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path}"\n')
    assert main(["status", "--config", str(conf), "--json"]) == EXIT_NOT_RUNNING
    (entry,) = json.loads(capsys.readouterr().out)["lag"]
    assert (entry["consumer_group"], entry["results_written"], entry["results_behind"]) == (
        None,
        3,
        3,
    )


@pytest.mark.parametrize("engine_now", ["running", "stopped three days ago"])
def test_status_reads_only_the_last_day_of_progress_and_answers_as_from_all_of_it(
    tmp_path: Path, engine_now: str
) -> None:
    """A month of PROGRESS (2.6 million rows at a batch a second, read in full: 0.61 s against 0.09 s,
    bench_status.py) is cut to the files, and row groups, that may hold the last day before its
    newest event. The status is the same as from every row: for a running engine and for one that
    stopped days ago (its last run, last batch and failures are still found)."""
    from retry_engine.delta.tables import pyarrow_dataset
    from retry_engine.ops.status import _recent_since, read_tables, status, summarise

    lake = tmp_path / "lake"
    config = load_config(None, lake=str(lake), env={})
    stop = T - dt.timedelta(days=3) if engine_now != "running" else T
    runs = [  # one file each, oldest first
        progress(event(STARTED, T - dt.timedelta(days=40), run="old"), batch(1, T - dt.timedelta(days=40), run="old"),
                 event(TERMINATED, T - dt.timedelta(days=39), run="old", exception="ValueError: long ago")),
        progress(event(STARTED, stop - dt.timedelta(days=2), run="r"), batch(2, stop - dt.timedelta(days=2), run="r")),
        progress(batch(3, stop - ms(500), run="r"),
                 event(TERMINATED, stop, run="r", reason=STOPPED) if engine_now != "running" else batch(4, stop, run="r")),
    ]
    for rows in runs:
        write_deltalake(str(lake / "progress"), rows, mode="append")
    now = T + ms(100)

    from deltalake import DeltaTable

    table = DeltaTable(str(lake / "progress"))
    since = _recent_since(table, "recorded_at", now)
    assert since == stop - dt.timedelta(days=1)
    assert len(pyarrow_dataset(table, [("recorded_at", ">=", since)]).files) == 1  # the other two are older
    everything = summarise(read_tables(config), now=now, trigger_interval_ms=1000, flush_interval_ms=5000)
    kept = {Path(f).name for f in pyarrow_dataset(table, [("recorded_at", ">=", since)]).files}
    for file in (lake / "progress").glob("*.parquet"):  # status never opens the older files
        if file.name not in kept:
            file.write_bytes(b"not parquet")
    assert status(config, now=now) == everything
    assert everything.state == ("running" if engine_now == "running" else "stopped")
    assert everything.last_batch is not None and everything.last_batch.batch_id == (4 if engine_now == "running" else 3)
    assert everything.failures_24h == 0


def test_status_breaks_down_the_last_days_dead_letters_and_reads_no_older_dlq_file(tmp_path: Path) -> None:
    """Of the DLQ, `status` reads the files (then rows) that may hold the last 24 h's dead letters: a DLQ
    of months (0.5 s for 200k dead letters' four columns, growing with every failure storm) is not read
    again; the all-time count is the outcomes'. The breakdown equals the one from every row, at the
    window's edge to the microsecond, a file without statistics is read, and older files are never opened
    (they are made unreadable)."""
    from retry_engine.ops.status import read_tables, status, summarise

    lake = tmp_path / "lake"
    config = load_config(None, lake=str(lake), env={})
    now = T + ms(100)
    edge = now - dt.timedelta(hours=24)

    def dead(i: int, at: dt.datetime | None, error: str) -> dict[str, Any]:
        return {**dict.fromkeys(DLQ.names), "msg_id": f"D{i}", "topic": "%DLQ%G", "consumer_group": "G",
                "reason_code": "NON_RETRYABLE", "error_class": error, "delivery_key": f"D{i}:1", "dead_lettered_at": at}

    files = [  # one file each, oldest first
        [dead(1, now - dt.timedelta(days=40), "Old"), dead(2, now - dt.timedelta(days=30), "Old")],
        [dead(3, now - dt.timedelta(days=2), "Old")],
        [dead(4, edge - dt.timedelta(microseconds=1), "Old"), dead(5, edge, "Edge"), dead(6, now, "New"),
         dead(7, now, "New"), dead(8, None, "NoTime")],
    ]
    for rows in files:
        write_deltalake(str(lake / "dlq"), pa.Table.from_pylist(rows, schema=DLQ.arrow_schema), mode="append")
    # A file another writer left without column statistics cannot be pruned: it is read, and its rows decide.
    # (An append's `configuration` is ignored: the table's property is what the writer follows.)
    DeltaTable(str(lake / "dlq")).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": "0"})
    write_deltalake(str(lake / "dlq"), pa.Table.from_pylist([dead(9, now, "NoStats"), dead(10, edge - ms(1), "Old")],
                    schema=DLQ.arrow_schema), mode="append")
    DeltaTable(str(lake / "dlq")).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": "32"})
    assert add_actions(DeltaTable(str(lake / "dlq")))["max.dead_lettered_at"].null_count == 1  # that file's only
    everything = summarise(read_tables(config), now=now, trigger_interval_ms=1000, flush_interval_ms=5000)
    assert everything.dead_letters == [
        DeadLetterEntry("G", "NON_RETRYABLE", "New", 2),
        DeadLetterEntry("G", "NON_RETRYABLE", "Edge", 1),
        DeadLetterEntry("G", "NON_RETRYABLE", "NoStats", 1),
    ]
    older = [f for f in (lake / "dlq").glob("*.parquet") if set(pq.read_table(f)["msg_id"].to_pylist()) <= {"D1", "D2", "D3"}]
    assert len(older) == 2
    for file in older:
        file.write_bytes(b"not parquet")
    assert status(config, now=now) == everything


@pytest.mark.parametrize("kind", ["missing", "text", "no zone"])
def test_a_dlq_another_writer_made_with_another_time_column_is_named_or_read_whole(tmp_path: Path, kind: str) -> None:
    """Hostile DLQ tables: without `dead_lettered_at` status and plots name the column; a time as text or
    without a zone cannot prune files, so every row is read and the time read as the engine reads consume
    results (no zone: UTC; text that is no time: in no window)."""
    from retry_engine.ops.plots import read_plot_data
    from retry_engine.ops.status import rows_since, status

    lake = tmp_path / "lake"
    config = load_config(None, lake=str(lake), env={})
    now = T + ms(100)
    fields = [f for f in DLQ.arrow_schema if f.name != "dead_lettered_at"]
    rows = {f.name: [None] * 3 for f in fields}
    rows.update(msg_id=["D1", "D2", "D3"], topic=["%DLQ%G"] * 3, consumer_group=["G"] * 3,
                error_class=["New", "Old", "Bad"], delivery_key=["1", "2", "3"])
    table = pa.table(rows, schema=pa.schema(fields))
    times = [now - ms(1_000), now - dt.timedelta(days=3)]
    if kind == "text":
        table = table.append_column("dead_lettered_at", pa.array([t.isoformat() for t in times] + ["not a time"]))
    elif kind == "no zone":
        naive = [t.replace(tzinfo=None) for t in times] + [None]
        table = table.append_column("dead_lettered_at", pa.array(naive, pa.timestamp("us")))
    write_deltalake(str(lake / "dlq"), table)
    day = now - dt.timedelta(days=1)
    if kind == "missing":
        for call in (lambda: status(config, now=now), lambda: read_plot_data(config, since=day, now=now)):
            with pytest.raises(SchemaMismatchError, match="dead_lettered_at"):
                call()
        return
    assert status(config, now=now).dead_letters == [DeadLetterEntry("G", None, "New", 1)]
    assert read_plot_data(config, since=day, now=now).dead_letters == {"New": {"G": 1}}  # plots' window alike
    assert rows_since(config, "dlq", "dead_lettered_at", day)["error_class"].to_pylist() == ["New"]


# -- what status reads of a lake months old ------------------------------------------------------


def _written(path: str) -> dict[str | None, int]:
    counted = _results_by_group(path)
    assert counted is not None and counted.schema == RESULTS_BY_GROUP
    return dict(zip(counted["consumer_group"].to_pylist(), counted["results"].to_pylist(), strict=True))


def test_consume_results_are_counted_per_group_from_the_log_where_a_file_holds_one_group(tmp_path: Path) -> None:
    """consume_results is as big as the outcomes: a file of one group (as consumers write them), or of
    nulls only, is counted from its add action's statistics; files of several groups, or of a group and
    nulls, have their group column read. The counts are those of every row."""
    path = str(tmp_path / "consume_results")
    long = "g" * 40  # longer than the 32 characters Spark's statistics keep of a string
    files = [
        ["G"] * 5,  # one group: counted from the log
        ["G", "G", "H", "H", "H"],  # two groups: read
        ["H", "H", None],  # a group and nulls: read
        [None] * 4,  # nulls only: counted from the log
        [long, long],  # one group: counted from the log
        [long, long + "x"],  # two groups sharing a 40-character prefix: read
    ]
    for groups in files:
        write_deltalake(path, pa.table({"consumer_group": pa.array(groups, pa.string()), "msg_id": [str(i) for i in range(len(groups))]}), mode="append")
    want: dict[str | None, int] = {}
    for groups in files:
        for g in groups:
            want[g] = want.get(g, 0) + 1
    assert _written(path) == want
    # The counted files are not read: without their data the counts are the same.
    one_group = [f for f in Path(path).glob("*.parquet")
                 if set(pq.read_table(f, columns=["consumer_group"])["consumer_group"].to_pylist()) in ({"G"}, {None}, {long})]
    assert len(one_group) == 3
    for f in one_group:
        f.unlink()
    assert _written(path) == want


def test_consume_results_without_statistics_or_partitioned_by_group_are_counted_right(tmp_path: Path) -> None:
    """Hostile layouts of a table others write: no statistics at all (every file read), and
    partitioned by the group (counted from the partition values, names that need quoting included)."""
    bare = str(tmp_path / "bare")
    for groups in (["G", "G"], ["G", "H", None]):
        write_deltalake(bare, pa.table({"consumer_group": pa.array(groups, pa.string())}), mode="append",
                        configuration={"delta.dataSkippingNumIndexedCols": "0"})
    assert _written(bare) == {"G": 3, "H": 1, None: 1}
    parted = str(tmp_path / "parted")
    groups = ["a b/%", "a b/%", "G", None, "ü=é"]
    write_deltalake(parted, pa.table({"consumer_group": pa.array(groups, pa.string()), "n": list(range(5))}),
                    partition_by=["consumer_group"])
    assert _written(parted) == {"a b/%": 2, "G": 1, None: 1, "ü=é": 1}
    for f in Path(parted).rglob("*.parquet"):
        f.unlink()  # counted from partition values: nothing is read
    assert _written(parted) == {"a b/%": 2, "G": 1, None: 1, "ü=é": 1}


def test_a_group_column_of_another_type_is_counted_as_the_engine_reads_it(tmp_path: Path) -> None:
    """A drifted writer's group column: ints are the groups the engine casts them to ("7"), from the log
    or read; bytes are cast one by one, and those with no string form are results without a group
    (the engine quarantines them).
    Status failed on the ints (its statistics were taken for strings)."""
    ints = str(tmp_path / "ints")
    write_deltalake(ints, pa.table({"consumer_group": pa.array([7, 7, 8], pa.int64())}))
    write_deltalake(ints, pa.table({"consumer_group": pa.array([9, 9], pa.int64())}), mode="append")
    assert _written(ints) == {"7": 2, "8": 1, "9": 2}
    by_int = str(tmp_path / "by_int")  # partitioned by an int group: counted from the partition values
    write_deltalake(by_int, pa.table({"consumer_group": pa.array([7, 7, 8], pa.int64()), "n": [1, 2, 3]}),
                    partition_by=["consumer_group"])
    assert _written(by_int) == {"7": 2, "8": 1}
    raw = str(tmp_path / "raw")
    write_deltalake(raw, pa.table({"consumer_group": pa.array([b"\xff", b"G"], pa.binary())}))
    assert _written(raw) == {None: 1, "G": 1}


def test_a_negative_row_count_in_the_log_is_not_trusted(tmp_path: Path) -> None:
    """A writer's statistics with numRecords -3 (a hostile log): that file is read, not counted."""
    path = tmp_path / "hostile"
    write_deltalake(str(path), pa.table({"consumer_group": pa.array(["G"] * 5, pa.string())}))
    commit = path / "_delta_log" / f"{0:020d}.json"
    lines = commit.read_text().splitlines()
    edited = []
    for line in lines:
        action = json.loads(line)
        if "add" in action:
            stats = json.loads(action["add"]["stats"])
            assert stats["numRecords"] == 5
            action["add"]["stats"] = json.dumps({**stats, "numRecords": -3})
        edited.append(json.dumps(action))
    commit.write_text("\n".join(edited) + "\n")
    assert _written(str(path)) == {"G": 5}


def test_status_does_not_read_the_metrics_table(tmp_path: Path) -> None:
    """The METRICS table (a row per group, topic, level and metric of every batch that decided
    something) is the plots': status read it whole and used none of it. A damaged one no longer
    matters to status; the plots still name it."""
    lake = Lake.make(tmp_path)
    write_deltalake(lake.path("outcomes"), ledger(("G", "acknowledged", None, None, None)))
    write_deltalake(lake.path("metrics"), pa.table({"metric": ["retry"]}))  # not the METRICS schema
    config = parse_config({"engine": {"lake": str(tmp_path)}})
    assert status(config, now=T).outcomes == {"acknowledged": 1}
    with pytest.raises(SchemaMismatchError, match="table metrics"):
        read_tables(config)


def _recorded_lake(root: Path, now: dt.datetime) -> None:
    """A lake as the engine leaves it: outcomes (released, pending and long-past retries, an ack, a
    dead letter), the released retries, the DLQ, progress, and the batch record with its totals."""
    from retry_engine.core.lease import STATE_DIR, BatchRecord, EngineState, Owner
    from retry_engine.ops.status import totals_of

    hour = dt.timedelta(hours=1)
    outcome_rows = [
        ("G", "retry", "R1", 3, now - hour, now - 2 * hour),  # released
        ("G", "retry", "R2", 4, now + hour, now - ms(500)),  # pending
        ("H", "retry", "R3", 3, now - 40 * 24 * hour, now - 40 * 24 * hour),  # released long ago
        ("H", "acknowledged", None, 0, None, now - hour),
        ("H", "dead_letter", "D1", 0, None, now - hour),
    ]
    keys = ("consumer_group", "outcome", "output_msg_id", "delay_level", "due_at", "decided_at")
    outcomes = pa.Table.from_pylist(
        [{**dict.fromkeys(OUTCOMES.names), **dict(zip(keys, r, strict=True)), "batch_id": 7} for r in outcome_rows],
        schema=OUTCOMES.arrow_schema,
    )
    retry = pa.Table.from_pylist([
        {**dict.fromkeys(RETRY.names), "msg_id": m, "topic": f"%RETRY%{g}", "consumer_group": g, "delay_level": 3,
         "due_at": due, "delivered_at": due + ms(200), "delivery_key": m}
        for m, g, due in (("R1", "G", now - hour), ("R3", "H", now - 40 * 24 * hour))
    ], schema=RETRY.arrow_schema)
    dlq = pa.Table.from_pylist([{**dict.fromkeys(DLQ.names), "msg_id": "D1", "topic": "%DLQ%H", "consumer_group": "H",
                                 "reason_code": "NON_RETRYABLE", "error_class": "E", "dead_lettered_at": now - hour,
                                 "delivery_key": "D1"}], schema=DLQ.arrow_schema)
    for name, table in (("outcomes", outcomes), ("retry", retry), ("dlq", dlq)):
        write_deltalake(str(root / name), table)
    write_deltalake(str(root / "progress"), progress(event(STARTED, now - 2 * hour), batch(7, now - ms(300))))
    record = BatchRecord("q", 7, None, {}, pending_retries=1, totals=totals_of(outcomes, retry))
    state = EngineState(1, Owner("h", 1, "q", str(root / "_checkpoints"), now), now, True, record)
    write_deltalake(str(root / STATE_DIR), state.to_arrow())


@pytest.mark.parametrize(
    ("name", "column", "kind"),
    [
        ("outcomes", "due_at", "text"), ("outcomes", "due_at", "no zone"), ("outcomes", "decided_at", "text"),
        ("outcomes", "delay_level", "text"), ("retry", "due_at", "text"), ("retry", "delivered_at", "no zone"),
        ("progress", "recorded_at", "text"), ("progress", "recorded_at", "no zone"),
        # Text without a zone is UTC too (it read as null: every such row fell out of every window).
        ("retry", "delivered_at", "zoneless text"), ("dlq", "dead_lettered_at", "zoneless text"),
    ],
)
def test_status_reads_an_engine_table_whose_column_another_writer_changed_as_the_engine_would(
    tmp_path: Path, name: str, column: str, kind: str
) -> None:
    """A concurrent operator rewrote one of the engine's tables with a column of another type (times
    as text or without a zone, a level as text): status failed with Arrow's own error (the window
    compared, or delta-rs parsed a statistics bound, of the other type). Such a table is read whole
    and cast as the engine reads consume results, and status says what it says of the original."""
    from retry_engine.ops.status import status

    now = T + ms(100)
    _recorded_lake(tmp_path, now)
    config = load_config(None, lake=str(tmp_path), env={})
    before = status(config, now=now)
    assert before.backlog and before.dead_letters  # the windows have rows to lose
    table = DeltaTable(str(tmp_path / name)).to_pyarrow_table()
    values = table[column]
    if kind == "text":
        changed = pa.array([None if v is None else (v.isoformat() if isinstance(v, dt.datetime) else str(v))
                            for v in values.to_pylist()], pa.string())
    elif kind == "zoneless text":
        changed = pa.array([None if v is None else v.replace(tzinfo=None).isoformat(sep=" ") for v in values.to_pylist()],
                           pa.string())
    else:
        changed = values.cast(pa.timestamp("us"))
    table = table.set_column(table.schema.get_field_index(column), column, changed)
    write_deltalake(str(tmp_path / name), table, mode="overwrite", schema_mode="overwrite")
    assert status(config, now=now) == before


def test_control_characters_from_the_tables_reach_the_terminal_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input: any writer's consume_results can hold a group like ``evil\\x1b[2J\\x1b]0;pwn\\x07`` (clear the
    screen, retitle the window); `status` printed it raw in its tables. Every cell and line a table fills
    is shown escaped (``printable``), on one line; ``--json`` keeps the value."""
    evil = "evil\x1b[2J\x1b]0;pwn\x07\r\nFAKE"
    lake = Lake.make(tmp_path)
    write_deltalake(lake.path("consume_results"), pa.Table.from_pylist(
        [{"result_id": "r1", "consumer_group": evil, "consumer_id": "c", "status": "RECONSUME_LATER", "msg_id": "M1",
          "topic": "orders"}], schema=CONSUME_RESULTS.arrow_schema,
    ))
    conf = tmp_path / "c.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path}"\n')
    assert main(["status", "--config", str(conf)]) == EXIT_NOT_RUNNING
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\r")
    assert "  evil\\x1b[2J\\x1b]0;pwn\\x07\\r\\nFAKE  1 " in out
    assert main(["status", "--config", str(conf), "--json"]) == EXIT_NOT_RUNNING
    assert json.loads(capsys.readouterr().out)["lag"][0]["consumer_group"] == evil
    hostile = dataclasses.replace(
        sample_status(),
        query_id="q\x1b[1A",
        state_reason="why\x07",
        last_failure="OSError: \x1b[2K",
        backlog=[BacklogEntry("g\x1b", 3, 1, T)],
        dead_letters=[DeadLetterEntry("g", "R\x1b", "E\x00", 1)],
    )
    shown = format_status(hostile)
    assert not any(c in shown for c in "\x1b\x07\x00")
    # Another writer's progress row: no batch id, a NaN or infinite rate ("#None", "nan rows/s" before).
    for rate in (math.nan, math.inf):
        odd = format_status(dataclasses.replace(
            sample_status(), last_batch=dataclasses.replace(sample_status().last_batch, batch_id=None,
                                                            processed_rows_per_second=rate)))
        line = next(x for x in odd.splitlines() if x.startswith("last batch"))
        assert line.startswith("last batch  #- at ") and "1,200 rows in, -, state" in line
        assert "nan" not in line and "inf" not in line and "None" not in line
    for escaped in ("q\\x1b[1A", "why\\x07", "OSError: \\x1b[2K", "  g\\x1b  ", "R\\x1b", "E\\x00"):
        assert escaped in shown


# -- re-drives, given-up retries and damaged rows (review f) -------------------------------------
def _nullable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column nullable: a table another writer made, without the engine's NOT NULLs."""
    return pa.schema([f.with_nullable(True) for f in schema])


def _retry_row(msg_id: str, group: str | None, due: dt.datetime | None, delivered: dt.datetime, **values: Any) -> dict[str, Any]:
    # A release of the schedule stage: the consume result that decided it is named (re-drives name none).
    return {**dict.fromkeys(RETRY.names), "msg_id": msg_id, "topic": "%RETRY%G", "consumer_group": group,
            "delay_level": 3, "due_at": due, "delivered_at": delivered, "delivery_key": msg_id,
            "source_result_id": f"result-of-{msg_id}", **values}


def _dead_letter(msg_id: str, group: str | None, at: dt.datetime) -> dict[str, Any]:
    return {**dict.fromkeys(DLQ.names), "msg_id": msg_id, "topic": "%DLQ%G", "consumer_group": group,
            "reason_code": "MAX_RECONSUME_TIMES", "error_class": "E", "delivery_key": msg_id, "dead_lettered_at": at}


def test_lateness_is_of_the_schedule_stages_releases_not_of_the_rows_re_drives_and_resends_wrote(tmp_path: Path) -> None:
    """A re-drive (or a resend) to %RETRY%G writes its row due and delivered at once. `status` and the
    plots took those rows for releases of the schedule stage: 30 re-driven dead letters beside 10
    retries released 2 s late showed 40 deliveries, p50 0 ms. They are left out; a later retry of a
    re-driven message copies its marks (R7) but was decided by the engine (it has a source result), and
    is a release like any other."""
    from retry_engine.clients.dlq import PROP_REDRIVE_ID
    from retry_engine.core.names import PROP_RESEND_MSG_ID, PROP_RESEND_TO
    from retry_engine.ops.plots import read_plot_data

    lake = Lake.make(tmp_path)
    now = T + ms(100)
    hour = dt.timedelta(hours=1)
    late = [_retry_row(f"R{i}", "G", now - hour, now - hour + ms(2_000), source_result_id=f"res-{i}") for i in range(10)]
    redriven = [_retry_row(f"X{i}", "G", now - ms(50), now - ms(50), properties=[(PROP_REDRIVE_ID, "rd-1"), ("K", "v")],
                           source_result_id=None) for i in range(30)]
    resent = _retry_row("S1", "G", now - ms(40), now - ms(40), properties=[(PROP_RESEND_TO, "c1@i1"), (PROP_RESEND_MSG_ID, "S1")],
                        source_result_id=None)
    again = _retry_row("A1", "G", now - hour, now - hour + ms(5_000), properties=[(PROP_REDRIVE_ID, "rd-1")],
                       source_result_id="res-a")
    write_deltalake(lake.path("retry"), pa.Table.from_pylist([*late, *redriven, resent, again], schema=RETRY.arrow_schema))
    write_deltalake(lake.path("progress"), progress(event(STARTED, now - 2 * hour)))
    assert status(lake.config, now=now).lateness == [
        LatenessEntry("*", 11, 2_000.0, 5_000.0, 5_000.0),
        LatenessEntry("G", 11, 2_000.0, 5_000.0, 5_000.0),
    ]
    for since in (None, now - dt.timedelta(days=7)):
        drawn = read_plot_data(lake.config, since=since, now=now).lateness_ms
        assert sorted(drawn.tolist()) == [2_000.0] * 10 + [5_000.0], since


def test_the_plots_backlog_drops_the_retries_run_discard_pending_gave_up(tmp_path: Path) -> None:
    """After `run --discard-pending` the plots' backlog from METRICS never dropped the retries given up (no
    METRICS row counts them out): 3 pending for good, and a window anchored on the batch record started
    at -3. Where METRICS rows cannot count them out the backlog is the ledger's, which drops them at the
    discard mark, as status's backlog does; a window that starts after the mark still reads METRICS."""
    from retry_engine.core.lease import STATE_DIR, BatchRecord, EngineState, Owner
    from retry_engine.core.totals import Totals
    from retry_engine.ops.plots import read_plot_data

    lake = Lake.make(tmp_path)
    now = T + ms(100)
    hour = dt.timedelta(hours=1)
    decided, released_at, mark = now - 3 * hour, now - 2 * hour, now - 90 * dt.timedelta(minutes=1)
    outcomes = [{**dict.fromkeys(OUTCOMES.names), "consumer_group": "G", "outcome": "retry", "output_msg_id": f"R{i}",
                 "delay_level": 18, "due_at": decided + 2 * hour, "decided_at": decided, "batch_id": 0} for i in range(5)]
    write_deltalake(lake.path("outcomes"), pa.Table.from_pylist(outcomes, schema=OUTCOMES.arrow_schema))
    retry = [_retry_row(f"R{i}", "G", released_at, released_at, delay_level=18) for i in range(2)]
    write_deltalake(lake.path("retry"), pa.Table.from_pylist(retry, schema=RETRY.arrow_schema))
    metrics = [{"batch_id": b, "batch_time": at, "consumer_group": "G", "retry_topic": "orders", "delay_level": 18,
                "metric": metric, "value": value} for b, at, metric, value in ((0, decided, "retry", 5.0),
                                                                               (1, released_at, "delivered", 2.0))]
    write_deltalake(lake.path("metrics"), pa.Table.from_pylist(metrics, schema=METRICS.arrow_schema))
    record = BatchRecord("q2", 0, None, {}, pending_retries=0, totals=Totals.of([("G", "retry", 5), ("G", "delivered", 2)]))
    owner = Owner("h", 1, "q2", str(tmp_path / "_checkpoints2"), mark)
    state = EngineState(2, owner, now, True, record, discarded_before=mark)
    write_deltalake(str(tmp_path / STATE_DIR), state.to_arrow())
    assert status(lake.config, now=now).backlog == []
    (whole,) = read_plot_data(lake.config, since=None, now=now).backlog
    assert (whole.times, whole.pending) == ([decided, released_at, mark], [5, 3, 0])
    week = now - dt.timedelta(days=7)
    (line,) = read_plot_data(lake.config, since=week, now=now).backlog
    assert (line.times, line.pending) == ([week, decided, released_at, mark], [0, 5, 3, 0])
    between = released_at + ms(1)
    (line,) = read_plot_data(lake.config, since=between, now=now).backlog
    assert (line.times, line.pending) == ([between, mark], [3, 0])
    after = read_plot_data(lake.config, since=mark + ms(1), now=now)
    assert (after.backlog, after.backlog_source) == ([], "metrics, from the lake's batch record")


def test_rows_without_a_group_are_shown_under_a_placeholder_never_a_traceback(tmp_path: Path) -> None:
    """A retry or dead letter without a group (a table another writer made without the NOT NULL) made
    `status` fail: Python could not sort None among the groups, nor print it. Such rows are shown under
    "(no group)", after the groups; ``--json`` has them as null."""
    lake = Lake.make(tmp_path)
    now = T + ms(100)
    retry = [_retry_row("R1", "G", now - ms(3_000), now - ms(2_000)), _retry_row("R2", None, now - ms(3_000), now - ms(1_000))]
    write_deltalake(lake.path("retry"), pa.Table.from_pylist(retry, schema=_nullable(RETRY.arrow_schema)))
    dlq = [_dead_letter("D1", None, now - ms(500)), _dead_letter("D2", "G", now)]  # as many: their groups are compared
    write_deltalake(lake.path("dlq"), pa.Table.from_pylist(dlq, schema=_nullable(DLQ.arrow_schema)))
    write_deltalake(lake.path("progress"), progress(event(STARTED, now - ms(5_000))))
    shown = status(lake.config, now=now)
    assert shown.lateness == [
        LatenessEntry("*", 2, 1_000.0, 2_000.0, 2_000.0),
        LatenessEntry("G", 1, 1_000.0, 1_000.0, 1_000.0),
        LatenessEntry(None, 1, 2_000.0, 2_000.0, 2_000.0),
    ]
    assert shown.dead_letters == [
        DeadLetterEntry("G", "MAX_RECONSUME_TIMES", "E", 1),
        DeadLetterEntry(None, "MAX_RECONSUME_TIMES", "E", 1),
    ]
    text = format_status(shown)
    assert "  (no group)  1           2,000.0" in text and "  (no group)  MAX_RECONSUME_TIMES  E            1" in text
    assert [e["consumer_group"] for e in status_json(shown)["dead_letters"]] == ["G", None]


def test_the_plots_draw_dead_letters_without_a_group_and_leave_out_metrics_values_that_are_no_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`plots` failed on a dead letter without a group (None sorted among the groups) and on a METRICS
    value that is no count (NaN, 2.5, 1e300: Arrow refused the cast to int64). The dead letter is drawn
    under "(no group)"; such values are left out of the backlog, with one warning saying how many."""
    from retry_engine.ops.plots import DEAD_LETTERS_FILE, read_plot_data, write_plots

    lake = Lake.make(tmp_path / "lake")
    now = T + ms(100)
    dlq = [_dead_letter("D1", "G", now - ms(500)), _dead_letter("D2", None, now - ms(500))]
    write_deltalake(lake.path("dlq"), pa.Table.from_pylist(dlq, schema=_nullable(DLQ.arrow_schema)))
    values = (4.0, float("nan"), 2.5, 1e300, float("-inf"))
    metrics = [{"batch_id": b, "batch_time": now - ms(1_000), "consumer_group": "G", "retry_topic": "orders",
                "delay_level": 3, "metric": "retry", "value": v} for b, v in enumerate(values)]
    write_deltalake(lake.path("metrics"), pa.Table.from_pylist(metrics, schema=METRICS.arrow_schema))
    for since in (None, now - dt.timedelta(days=7)):
        caplog.clear()
        data = read_plot_data(lake.config, since=since, now=now)
        assert data.dead_letters == {"E": {"G": 1, "(no group)": 1}}
        assert [s.pending[-1] for s in data.backlog] == [4]
        warned = [r.getMessage() for r in caplog.records if "METRICS" in r.getMessage()]
        assert len(warned) == 1 and warned[0].startswith("plots: 4 METRICS row(s)"), warned
    drawn = {p.name: p.elements for p in write_plots(lake.config, tmp_path / "png")}
    assert drawn["dead_letters"] == 2 and (tmp_path / "png" / DEAD_LETTERS_FILE).exists()


@pytest.mark.parametrize("recorded", ["null", "year 1"])
def test_status_reads_progress_with_damaged_times(tmp_path: Path, recorded: str) -> None:
    """PROGRESS rows another writer left with a null ``recorded_at`` made `status` fail with an IndexError
    (the newest of no time), and every time within a day of year 1 with an OverflowError (the day before
    it). A null time is no time (no event recorded: not started); a lake of year-1 times is read whole."""
    lake = Lake.make(tmp_path)
    now = T + ms(100)
    row = event(STARTED, now - ms(5_000))
    row["recorded_at"] = None if recorded == "null" else dt.datetime(1, 1, 1, 5, tzinfo=dt.UTC)
    write_deltalake(lake.path("progress"), pa.Table.from_pylist([row], schema=_nullable(PROGRESS.arrow_schema)))
    shown = status(lake.config, now=now)
    assert shown.state == ("not_started" if recorded == "null" else "stale")
    assert shown.last_event_at == (None if recorded == "null" else dt.datetime(1, 1, 1, 5, tzinfo=dt.UTC))


def test_lateness_leaves_out_retries_without_a_due_time_and_json_has_no_nan(tmp_path: Path) -> None:
    """One retry row without a due time (another writer's) made the group's lateness NaN, shown as "nan",
    and `status --json` printed bare NaN, which strict JSON parsers reject. Rows without a due time have no
    lateness; a number that is not finite (a batch's NaN rows per second) is null in the JSON."""
    lake = Lake.make(tmp_path)
    now = T + ms(100)
    retry = [_retry_row("R1", "G", now - ms(3_000), now - ms(1_000)), _retry_row("R2", "G", None, now - ms(1_000))]
    write_deltalake(lake.path("retry"), pa.Table.from_pylist(retry, schema=RETRY.arrow_schema))
    running = batch(3, now - ms(500))
    running["processed_rows_per_second"] = float("nan")
    write_deltalake(lake.path("progress"), progress(event(STARTED, now - ms(5_000)), running))
    shown = status(lake.config, now=now)
    assert shown.lateness == [
        LatenessEntry("*", 1, 2_000.0, 2_000.0, 2_000.0), LatenessEntry("G", 1, 2_000.0, 2_000.0, 2_000.0)
    ]
    printed = json.loads(json.dumps(status_json(shown), allow_nan=False))  # as `status --json`, strictly
    assert printed["last_batch"]["processed_rows_per_second"] is None


def test_the_text_output_shows_the_largest_rows_of_a_lake_of_many_groups() -> None:
    """A review (session 20): with 1,000 groups `status` printed 2,018 lines, and a 255-character group widened
    every row of its tables past 255 columns. Each table shows the 25 rows of the largest figures and says how
    many more there are; a long cell is cut; --json keeps every group."""
    from retry_engine.ops.status import TEXT_TABLE_ROWS

    groups = [f"g{i:04d}" for i in range(1000)]
    many = dataclasses.replace(
        sample_status(),
        backlog=[BacklogEntry(g, 3, i, T) for i, g in enumerate(groups)],
        dead_letters=[DeadLetterEntry(g, "MAX_RECONSUME_TIMES", "E", i) for i, g in enumerate(groups)],
        lag=[LagEntry(g, i, i, 0, 0, 0, 0) for i, g in enumerate(groups)] + [LagEntry("x" * 255, 5, 0, 5000, 0, 0, 0)],
    )
    shown = format_status(many)
    assert len(shown.splitlines()) < 120
    assert shown.count("  ... and 975 more ") == 2 and "... and 976 more groups" in shown
    assert "  g0999  3      999  " in shown and "  g0974  " not in shown.split("lag ")[0]  # the largest backlog
    assert max(len(line) for line in shown.splitlines()) < 200 and "x" * 28 + "..." + "x" * 28 + " " in shown
    # The all-groups lateness row stays first whatever the groups' p99 (it fell out with 25 slower groups),
    # and two long names that begin alike stay apart (cut in the middle).
    slow = dataclasses.replace(many, lateness=[LatenessEntry("*", 3000, 10.0, 50.0, 90.0)] + [
        LatenessEntry(f"g{i:04d}" + "y" * 70 + str(i), 3, 100.0, 100.0 + i, 200.0) for i in range(40)])
    table = format_status(slow).split("lateness ")[1].split("lag ")[0]
    assert table.splitlines()[2].startswith("  *  ") and "... and 15 more groups" in table
    assert len({line.split()[0] for line in table.splitlines()[3:28]}) == 25
    assert len(status_json(many)["backlog"]) == 1000 and TEXT_TABLE_ROWS == 25


def test_the_plots_of_a_lake_of_many_groups_draw_the_largest_series(tmp_path: Path) -> None:
    """A review (session 20): with 1,000 groups the legend covered the chart. The backlog draws its 10
    largest series (and says so); the dead letters merge the groups past the 10 largest and the classes past
    the 20 largest, every dead letter still counted."""
    from retry_engine.ops.plots import (
        MAX_SERIES,
        OTHER_CLASSES,
        OTHER_GROUPS,
        BacklogSeries,
        _largest_kept,
        largest_series,
        plot_backlog,
        plot_dead_letters,
    )

    series = [BacklogSeries(f"g{i:04d}", 3, [T, T + ms(1000)], [i, i + 1]) for i in reversed(range(100))]
    drawn, note = largest_series(series)
    assert [s.consumer_group for s in drawn] == [f"g{i:04d}" for i in reversed(range(90, 100))]
    assert note == "; the 10 largest of 100 series" and largest_series(series[:10]) == (series[:10], "")
    assert plot_backlog(series, tmp_path / "b.png") == MAX_SERIES and (tmp_path / "b.png").exists()
    by_class = {f"E{c}": {f"g{g:04d}": 1 + (g % 7) for g in range(0, 1000, 1 + c)} for c in range(50)}
    merged = _largest_kept(by_class)
    assert len(merged) == 2 * MAX_SERIES + 1 and OTHER_CLASSES in merged
    assert {g for per in merged.values() for g in per} - {OTHER_GROUPS} == set(sorted(
        {g for per in by_class.values() for g in per},
        key=lambda g: (-sum(per.get(g, 0) for per in by_class.values()), g))[:MAX_SERIES])
    assert sum(n for per in merged.values() for n in per.values()) == sum(n for per in by_class.values() for n in per.values())
    # One bar per (class, group) of the merged counts that is not zero.
    bars = sum(1 for per in merged.values() for n in per.values() if n)
    assert plot_dead_letters(by_class, tmp_path / "d.png") == bars and bars <= (2 * MAX_SERIES + 1) * (MAX_SERIES + 1)
