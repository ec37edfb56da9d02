"""What a row retention does to a months-old lake, side by side (#14: months on a lake).

    python bench/bench_retention.py [--days 60] [--per-second 1] [--files-per-day 24]
    python bench/bench_retention.py --table ledger [--days 60] [--per-second 2] [--retries 0.2] [--body-bytes 256]

One progress table of ``--days`` of rows at ``--per-second`` (an engine at a 1 s trigger records a row
a batch), appended as ``--files-per-day`` files a day (what in-engine maintenance leaves of a day
when it compacts every hour), copied twice; ``retry-engine maintain`` runs on each copy, once with
``progress_retention = "off"`` (what every release before it did) and once with the default
``"30d"``. Printed for each: the run's time, files, bytes and rows before and after, and what the
expiry removed; then after/before ratios of the two.

``--table ledger``: the outcomes table (a row per consume result, ``--per-second`` of them, a share
``--retries`` of them retries) and the retry table (each retry released a minute later, with a body of
``--body-bytes``) of ``--days``, the last hour's retries still waiting; maintain runs on one copy with
both retentions "off" and on one with ``outcomes_retention = "30d"``, ``retry_retention = "3d"``
(RocketMQ's 72 h). Printed per copy and table as above, and what a reader of the whole ledger then
takes: the lake's counts a new checkpoint reads when it takes over (``lake_counts``) and their pending
retries (the same on both copies: the rows still waiting are never removed). The lake records an
engine's batch just before (the retention counts back from the last recorded batch).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from retry_engine.config import parse_config
from retry_engine.core.lease import BatchRecord, LakeLease, Owner
from retry_engine.delta.tables import append_arrow, ensure_table
from retry_engine.ops.maintenance import TableReport, run_maintenance
from retry_engine.ops.monitor import ensure_progress_table
from retry_engine.ops.status import lake_counts
from retry_engine.schemas import OUTCOMES, PROGRESS, RETRY

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import fill  # noqa: E402


def build(path: str, days: int, per_second: float, files_per_day: int) -> int:
    """The progress table of ``days`` ending now; its number of rows."""
    ensure_progress_table(path)
    rows_per_file = max(1, int(86_400 * per_second / files_per_day))
    start = int((dt.datetime.now(dt.UTC) - dt.timedelta(days=days)).timestamp() * 1_000_000)
    step = int(1_000_000 / per_second)
    total = 0
    for f in range(days * files_per_day):
        first = f * rows_per_file
        micros = start + (first + np.arange(rows_per_file, dtype=np.int64)) * step
        times = pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        n = rows_per_file
        table = fill(PROGRESS.arrow_schema, {
            "query_id": pa.array(["q"] * n), "run_id": pa.array(["r"] * n), "event": pa.array(["progress"] * n),
            "batch_id": pa.array(np.arange(first, first + n, dtype=np.int64)), "event_time": times,
            "recorded_at": times, "batch_duration_ms": pa.array(np.full(n, 250, dtype=np.int64)),
        }, n)
        append_arrow(path, table)
        total += n
    return total


def run(root: str, retention: str) -> tuple[float, TableReport, int]:
    config = parse_config({"engine": {"lake": root}, "maintenance": {"progress_retention": retention}})
    began = time.perf_counter()
    report = next(r for r in run_maintenance(config, tables=["progress"]) if r.table_name == "progress")
    took = time.perf_counter() - began
    rows = DeltaTable(f"{root}/progress").to_pyarrow_dataset().count_rows()
    return took, report, rows


LEDGER_RETENTION = {"outcomes_retention": "30d", "retry_retention": "3d"}


def _bodies(rng: np.random.Generator, n: int, size: int) -> list[bytes]:
    raw = rng.integers(0, 256, n * size, dtype=np.uint8).tobytes()
    return [raw[i * size:(i + 1) * size] for i in range(n)]


def build_ledger(root: Path, days: int, per_second: float, files_per_day: int, retries: float, body_bytes: int) -> tuple[int, int]:
    """The outcomes and retry tables of ``days`` ending now; their rows."""
    outcomes_path, retry_path = str(root / "outcomes"), str(root / "retry")
    rng = np.random.default_rng(7)
    per_file = max(1, int(86_400 * per_second / files_per_day))
    step = int(1_000_000 / per_second)
    now_us = int(dt.datetime.now(dt.UTC).timestamp() * 1_000_000)
    start = now_us - days * 86_400_000_000
    minute = 60_000_000
    totals = [0, 0]
    for f in range(days * files_per_day):
        first = f * per_file
        index = first + np.arange(per_file, dtype=np.int64)
        micros = start + index * step
        retried = rng.random(per_file) < retries
        ids = pa.array([f"{i:032X}" for i in index])
        out_ids = pa.array([f"R{i:031X}" if r else None for i, r in zip(index, retried, strict=True)])
        ts = pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        due = pa.array(micros + minute, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        n = per_file
        outcome = pa.array(np.where(retried, "retry", "acknowledged"))
        append_arrow(outcomes_path, fill(OUTCOMES.arrow_schema, {
            "result_id": ids, "consumer_group": pa.array(["G"] * n), "retry_topic": pa.array(["orders"] * n),
            "msg_id": ids, "reconsume_times": pa.array(np.zeros(n, dtype=np.int32)), "outcome": outcome,
            "output_msg_id": out_ids, "delay_level": pa.array(np.where(retried, 3, 0).astype(np.int32)).cast(
                OUTCOMES.arrow_schema.field("delay_level").type),
            "due_at": pc.if_else(pa.array(retried), due, pa.nulls(n, due.type)),
            "batch_id": pa.array(index), "decided_at": ts,
        }, n))
        totals[0] += n
        # Released a minute after the decision, unless that is still to come (the last minute's wait).
        released = retried & (micros + minute < now_us - minute)
        m = int(released.sum())
        if m:
            chosen = pa.array(np.flatnonzero(released))
            delivered = due.take(chosen)
            append_arrow(retry_path, fill(RETRY.arrow_schema, {
                "msg_id": out_ids.take(chosen), "topic": pa.array(["%RETRY%G"] * m), "queue_id": pa.array(
                    np.zeros(m, dtype=np.int32)).cast(RETRY.arrow_schema.field("queue_id").type),
                "body": pa.array(_bodies(rng, m, body_bytes), RETRY.arrow_schema.field("body").type),
                "origin_msg_id": ids.take(chosen), "reconsume_times": pa.array(np.ones(m, dtype=np.int32)).cast(
                    RETRY.arrow_schema.field("reconsume_times").type),
                "consumer_group": pa.array(["G"] * m), "delay_level": pa.array(np.full(m, 3, dtype=np.int32)).cast(
                    RETRY.arrow_schema.field("delay_level").type),
                "scheduled_at": ts.take(chosen), "due_at": delivered, "delivered_at": delivered,
                "delivery_key": pa.array([f"k{i}" for i in chosen.to_pylist()]),
            }, m))
            totals[1] += m
    return totals[0], totals[1]


def run_ledger(root: str, retention: dict[str, str]) -> tuple[float, dict[str, TableReport], float, int | None]:
    config = parse_config({"engine": {"lake": root}, "maintenance": retention})
    began = time.perf_counter()
    reports = {r.table_name: r for r in run_maintenance(config, tables=["outcomes", "retry"])}
    took = time.perf_counter() - began
    began = time.perf_counter()
    _, pending = lake_counts(config)
    return took, reports, time.perf_counter() - began, pending


def ledger_main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-retention-"))
    try:
        base = work / "base"
        for path, table in ((base / "outcomes", OUTCOMES), (base / "retry", RETRY)):
            ensure_table(str(path), table.arrow_schema, partition_by=table.partition_by)
        outcome_rows, retry_rows = build_ledger(
            base, args.days, args.per_second, args.files_per_day, args.retries, args.body_bytes
        )
        # The engine's last batch, just now: the ledger's retention counts back from it.
        lease = LakeLease(str(base), Owner("bench", 1, "bench", str(work / "checkpoint"), dt.datetime.now(dt.UTC)))
        lease.acquire()
        lease.record_batch(BatchRecord("bench", 0, None, {}, 0))
        lease.release()
        results = {}
        for name, retention in (("off", {}), ("30d / 3d", LEDGER_RETENTION)):
            root = work / name.replace(" / ", "-")
            shutil.copytree(base, root)
            results[name] = run_ledger(str(root), retention)
        print(f"ledger: {args.days} days, {outcome_rows:,} outcome rows, {retry_rows:,} retry rows "
              f"({args.body_bytes} B bodies), {args.days * args.files_per_day:,} files each; maintain on a copy each")
        print("| outcomes / retry retention | table | maintain s | files before -> after | MB before -> after | "
              "expired files (rows) | lake_counts s | pending |")
        print("|---|---|---|---|---|---|---|---|")
        for name, (took, reports, counted, pending) in results.items():
            for table, r in reports.items():
                if table not in ("outcomes", "retry"):
                    continue
                print(f"| {name} | {table} | {took:.2f} | {r.files_before} -> {r.files_after} | "
                      f"{(r.bytes_before or 0) / 2**20:.1f} -> {(r.bytes_after or 0) / 2**20:.1f} | "
                      f"{r.files_expired} ({r.rows_expired:,}) | {counted:.2f} | {pending} |")
        off, on = results["off"], results["30d / 3d"]
        after = {k: sum((r.bytes_after or 0) for t, r in v[1].items() if t in ("outcomes", "retry")) for k, v in results.items()}
        print(f"30d / 3d against off: maintain time {on[0] / off[0]:.2f}x, ledger bytes after "
              f"{after['30d / 3d'] / max(after['off'], 1):.2f}x, lake_counts {on[2] / off[2]:.2f}x; "
              f"pending {on[3]} and {off[3]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--per-second", type=float, default=1.0)
    parser.add_argument("--files-per-day", type=int, default=24)
    parser.add_argument("--table", choices=("progress", "ledger"), default="progress")
    parser.add_argument("--retries", type=float, default=0.2)
    parser.add_argument("--body-bytes", type=int, default=256)
    args = parser.parse_args()
    if args.table == "ledger":
        ledger_main(args)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-retention-"))
    try:
        rows = build(str(work / "base" / "progress"), args.days, args.per_second, args.files_per_day)
        results = {}
        for retention in ("off", "30d"):
            root = work / retention
            shutil.copytree(work / "base", root)
            results[retention] = run(str(root), retention)
        print(f"progress table: {args.days} days, {rows:,} rows, {args.days * args.files_per_day:,} files; "
              "`retry-engine maintain` on a copy each")
        print("| progress_retention | maintain s | files before -> after | MB before -> after | rows after | expired files (rows) |")
        print("|---|---|---|---|---|---|")
        for retention, (took, r, left) in results.items():
            print(f"| {retention} | {took:.2f} | {r.files_before} -> {r.files_after} | "
                  f"{(r.bytes_before or 0) / 2**20:.1f} -> {(r.bytes_after or 0) / 2**20:.1f} | {left:,} | "
                  f"{r.files_expired} ({r.rows_expired:,}) |")
        (t_off, off, rows_off), (t_on, on, rows_on) = results["off"], results["30d"]
        print(f"30d / off: maintain time {t_on / t_off:.2f}x, bytes after {(on.bytes_after or 0) / (off.bytes_after or 1):.2f}x, "
              f"rows after {rows_on / max(rows_off, 1):.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
