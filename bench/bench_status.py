"""Cost of ``retry-engine status`` next to just reading the columns it needs.

    python bench/bench_status.py [--outcomes 1000000] [--days 30] [--progress 50000] [--repeat 3] [--keep DIR]

One synthetic lake (no Spark) of ``--days`` of decisions ending now: ``--outcomes`` outcome rows
(10 % retries, 2 % dead letters, 4 groups, levels 3..6) appended in 100 files, oldest first, as
batches write them (or maintenance compacts them); the retry table with every retry due by now
released (those due later are pending), the DLQ (in 100 appends), ``--outcomes`` consume results (a file per group
of each chunk, as consumers write them), METRICS (a row per second, group, outcome and retry
level), ``--progress`` progress rows (50,000), and the lake's batch record with its totals, as the
engine records it. Reported side by side, best of ``--repeat``:

(0) reading, in full, the columns every table's summary needs (what status read before it left
    METRICS to the plots and counted consume results from the Delta log);
(e) status from every outcome and retry row (what it did before it used the batch record's totals,
    and what it does on a lake whose record cannot vouch for them);
(a) reading what status reads (``read_tables`` of its tables, outcomes and retries from the record's
    window);
(b) (a) plus summarising (``status``: backlog anti-join, lateness
    percentiles, dead-letter and outcome counts);
(c) (b) plus formatting the text output;

and the ratios (b)/(a), (c)/(a), (b)/(e). Then ``plots``' data (METRICS has a row per batch, group,
outcome and level, and ``delivered`` rows per batch that released retries, in 100 files):

(p0) every METRICS, retry and DLQ row (``plots --since all``);
(p1) the last ``--plots-days`` (7) from the record (``plots``' default: the window's METRICS rows
     anchored on the backlog at the recorded batch, the window's releases and dead letters);
(p2) the same window from every row (what ``plots`` reads when the record cannot vouch), and
     whether (p1) and (p2) are the same data; then the charts drawn, all and the window.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from retry_engine.config import EngineConfig, parse_config
from retry_engine.core.lease import STATE_DIR, BatchRecord, EngineState, Owner
from retry_engine.ops.plots import PLOT_TABLES, plot_data, read_plot_data, render
from retry_engine.ops.status import (
    _COLUMNS,
    STATUS_TABLES,
    Status,
    _recorded_tables,
    format_status,
    read_tables,
    status,
    summarise,
    totals_of,
)
from retry_engine.schemas import CONSUME_RESULTS, DLQ, METRICS, OUTCOMES, PROGRESS, RETRY

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import fill  # noqa: E402

T0 = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)


def _ts(offsets_ms: np.ndarray) -> pa.Array:
    base = int(T0.timestamp() * 1_000_000)
    return pa.array(base + offsets_ms.astype(np.int64) * 1000, pa.timestamp("us", tz="UTC"))


def build_lake(root: Path, n: int, *, days: float = 30, progress_rows: int = 50_000, seed: int = 7) -> None:
    rng = np.random.default_rng(seed)
    groups = np.array(["billing", "orders", "search", "audit"])[rng.integers(0, 4, n)]
    draw = rng.random(n)
    outcome = np.where(draw < 0.10, "retry", np.where(draw < 0.12, "dead_letter", "acknowledged"))
    level = rng.integers(3, 7, n).astype(np.int32)
    now_ms = int((dt.datetime.now(dt.UTC) - T0).total_seconds() * 1000)
    span_ms = int(days * 86_400_000)
    decided = np.sort(rng.integers(now_ms - span_ms, now_ms, n))
    due = decided + 1000 * level
    ids = np.char.add("out-", np.arange(n).astype(str))
    is_retry = outcome == "retry"
    outcomes = fill(OUTCOMES.arrow_schema, {
        "consumer_group": pa.array(groups), "outcome": pa.array(outcome),
        "output_msg_id": pa.array(np.where(outcome == "acknowledged", None, ids)),
        "delay_level": pa.array(np.where(is_retry, level, 0), pa.int32()),
        "due_at": _ts(due), "decided_at": _ts(decided), "batch_id": pa.array(decided // 1000),
    }, n)
    released = np.flatnonzero(is_retry & (due <= now_ms - 500))
    m = released.size
    retry = fill(RETRY.arrow_schema, {
        "msg_id": pa.array(ids[released]), "topic": pa.array(np.char.add("%RETRY%", groups[released])),
        "consumer_group": pa.array(groups[released]), "delay_level": pa.array(level[released], pa.int32()),
        "due_at": _ts(due[released]), "delivered_at": _ts(due[released] + rng.integers(0, 400, m)),
        "delivery_key": pa.array(ids[released]),
    }, m)
    for part in np.array_split(np.arange(n), 100):
        write_deltalake(str(root / "outcomes"), outcomes.take(part), mode="append")
    for part in np.array_split(np.arange(m), 100):
        write_deltalake(str(root / "retry"), retry.take(part), mode="append", partition_by=["consumer_group"])
    # The record the engine keeps of its last batch (every batch committed: no files to wait for).
    totals = totals_of(outcomes, retry)
    record = BatchRecord("q", int(decided[-1] // 1000), None, {}, pending_retries=int(is_retry.sum()) - m, totals=totals)
    owner = Owner("bench", 1, "q", str(root / "_checkpoints"), dt.datetime.now(dt.UTC))
    state = EngineState(1, owner, dt.datetime.now(dt.UTC), True, record)
    write_deltalake(str(root / STATE_DIR), state.to_arrow())
    dead = np.flatnonzero(outcome == "dead_letter")
    k = dead.size
    dlq = fill(DLQ.arrow_schema, {
        "msg_id": pa.array(ids[dead]), "topic": pa.array(np.char.add("%DLQ%", groups[dead])),
        "consumer_group": pa.array(groups[dead]),
        "reason_code": pa.array(np.array(["MAX_RECONSUME_TIMES", "NON_RETRYABLE"])[rng.integers(0, 2, k)]),
        "error_class": pa.array(np.array(["E1", "E2", "E3"])[rng.integers(0, 3, k)]),
        "dead_lettered_at": _ts(decided[dead]), "delivery_key": pa.array(ids[dead]),
    }, k)
    for part in np.array_split(np.arange(k), 100):  # oldest first, as batches write them
        write_deltalake(str(root / "dlq"), dlq.take(part), mode="append", partition_by=["consumer_group"])
    # What consumers wrote: a file per group and chunk (400 files), as the Consumer client writes them, and a
    # Delta checkpoint, as maintenance writes one.
    for rows in np.array_split(np.arange(n), 100):
        for group in np.unique(groups[rows]):
            mine = rows[groups[rows] == group]
            write_deltalake(str(root / "consume_results"), fill(CONSUME_RESULTS.arrow_schema, {
                "msg_id": pa.array(np.char.add("m-", mine.astype(str))), "consumer_group": pa.array(groups[mine]),
                "status": pa.array(np.where(outcome[mine] == "acknowledged", "CONSUME_SUCCESS", "RECONSUME_LATER")),
                "consumed_at": _ts(decided[mine]),
            }, mine.size), mode="append")
    DeltaTable(str(root / "consume_results")).create_checkpoint()
    # METRICS: per batch (a second) that decided something, a row per group and outcome, retries per level;
    # per batch that released retries, ``delivered`` per group and level. Appended in 100 files, oldest first.
    delivered_ms = (retry["delivered_at"].cast(pa.int64()).to_numpy() // 1000) - int(T0.timestamp() * 1000)
    keys = pa.concat_tables([
        pa.table({"batch_id": pa.array(decided // 1000), "consumer_group": pa.array(groups), "metric": pa.array(outcome),
                  "delay_level": pa.array(np.where(is_retry, level, -1), pa.int32())}),
        pa.table({"batch_id": pa.array(delivered_ms // 1000), "consumer_group": pa.array(groups[released]),
                  "metric": pa.array(["delivered"] * m), "delay_level": pa.array(level[released], pa.int32())}),
    ])
    counted = keys.group_by(["batch_id", "consumer_group", "metric", "delay_level"]).aggregate([([], "count_all")])
    counted = counted.sort_by("batch_id")
    c = counted.num_rows
    metrics = fill(METRICS.arrow_schema, {
        "batch_id": counted["batch_id"], "batch_time": _ts(counted["batch_id"].to_numpy() * 1000),
        "consumer_group": counted["consumer_group"], "retry_topic": pa.array(["orders"] * c),
        "delay_level": pc.if_else(pc.equal(counted["delay_level"], -1), None, counted["delay_level"]),
        "metric": counted["metric"], "value": counted["count_all"],
    }, c)
    for part in np.array_split(np.arange(c), 100):
        write_deltalake(str(root / "metrics"), metrics.take(part), mode="append")
    # One batch a second, the last one just now.
    p = progress_rows
    seconds = np.arange(p) - p + int((dt.datetime.now(dt.UTC) - T0).total_seconds())
    write_deltalake(str(root / "progress"), fill(PROGRESS.arrow_schema, {
        "query_id": pa.array(["q"] * p), "run_id": pa.array(["r"] * p), "event": pa.array(["progress"] * p),
        "batch_id": pa.array(np.arange(p)), "event_time": _ts(seconds * 1000),
        "recorded_at": _ts(seconds * 1000 + 5), "batch_duration_ms": pa.array(np.full(p, 180)),
        "num_input_rows": pa.array(np.full(p, n // p)),
    }, p))


def _every_row(root: Path) -> None:
    """What status read before it skipped METRICS and counted consume results from the log."""
    for name, (_, columns) in _COLUMNS.items():
        DeltaTable(str(root / name)).to_pyarrow_table(columns=list(columns))


def _from_every_row(config: EngineConfig, now: dt.datetime | None = None) -> Status:
    now = now or dt.datetime.now(dt.UTC)
    return dataclasses.replace(
        summarise(read_tables(config, now=now, names=STATUS_TABLES), now=now, trigger_interval_ms=1000, flush_interval_ms=5000),
        checked_at=now,
    )


def _what_status_reads(config: EngineConfig) -> None:
    now = dt.datetime.now(dt.UTC)
    recorded = _recorded_tables(config, now)
    assert recorded is not None, "the bench's batch record should vouch for the window"
    read_tables(config, now=now, names=STATUS_TABLES, given={"outcomes": recorded.outcomes, "retry": recorded.retry})


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outcomes", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--days", type=float, default=30, help="the days the outcomes span, ending now")
    parser.add_argument("--progress", type=int, default=50_000, help="progress rows (one per batch: 86,400 a day at 1 s)")
    parser.add_argument("--plots-days", type=float, default=7, help="`plots --since`: the window of (p1), (p2)")
    parser.add_argument("--keep", help="build the lake in this folder and keep it (reused if it holds one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-status-") as tmp:
        root = Path(args.keep or tmp)
        if not (root / "outcomes").exists():
            build_lake(root, args.outcomes, days=args.days, progress_rows=args.progress)
        config = parse_config({"engine": {"lake": str(root)}})
        every_row = best(lambda: _every_row(root), args.repeat)
        every_outcome = best(lambda: _from_every_row(config), args.repeat)
        read = best(lambda: _what_status_reads(config), args.repeat)
        summarise = best(lambda: status(config), args.repeat)
        formatted = best(lambda: format_status(status(config)), args.repeat)
        now = dt.datetime.now(dt.UTC)
        same = dataclasses.replace(status(config, now=now), checked_at=now) == _from_every_row(config, now)
        print(f"outcomes rows             {args.outcomes:,} over {args.days:g} days")
        print(f"progress rows             {args.progress:,}")
        print(f"(0) every row it needs    {every_row:.3f} s   (the columns status reads, of every table, in full)")
        print(f"(e) status, every row     {every_outcome:.3f} s   (no batch record)")
        print(f"(a) read_tables           {read:.3f} s")
        print(f"(b) status                {summarise:.3f} s   (b)/(a) = {summarise / read:.2f}")
        print(f"(c) status + format       {formatted:.3f} s   (c)/(a) = {formatted / read:.2f}")
        print(f"status / every row        {summarise / every_row:.2f}")
        print(f"(b)/(e)                   {summarise / every_outcome:.2f}   same status: {same}")
        _plots(config, args.plots_days, args.repeat)


def _plots(config: EngineConfig, days: float, repeat: int) -> None:
    """``plots``' data: every row, the window from the record, the window from every row; then drawing."""
    since = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
    metrics_rows = DeltaTable(config.table_path("metrics")).to_pyarrow_dataset().count_rows()
    every = best(lambda: read_plot_data(config, since=None), repeat)
    window = best(lambda: read_plot_data(config, since=since), repeat)
    window_every = best(lambda: plot_data(read_tables(config, names=PLOT_TABLES), since), repeat)
    fast, slow = read_plot_data(config, since=since), plot_data(read_tables(config, names=PLOT_TABLES), since)
    same = (fast.backlog, fast.dead_letters, sorted(fast.lateness_ms)) == (slow.backlog, slow.dead_letters, sorted(slow.lateness_ms))
    assert fast.backlog_source.endswith("batch record"), fast.backlog_source
    with tempfile.TemporaryDirectory(prefix="bench-plots-") as out:
        draw_all = best(lambda: render(read_plot_data(config, since=None), out), 1)
        draw_window = best(lambda: render(read_plot_data(config, since=since), out), repeat)
    print(f"METRICS rows              {metrics_rows:,}")
    print(f"(p0) plots data, all      {every:.3f} s   (every METRICS, retry and DLQ row)")
    print(f"(p1) plots data, {days:g} d     {window:.3f} s   (the window's rows, anchored on the batch record)")
    print(f"(p2) plots data, {days:g} d     {window_every:.3f} s   (every row, folded to the window)   same: {same}")
    print(f"(p1)/(p0)                 {window / every:.2f}    (p1)/(p2) {window / window_every:.2f}")
    print(f"plots with drawing        all {draw_all:.3f} s, {days:g} d {draw_window:.3f} s")


if __name__ == "__main__":
    main()
