"""What the progress table's row retention does to a months-old lake, side by side (#14: months on a lake).

    python bench/bench_retention.py [--days 60] [--per-second 1] [--files-per-day 24]

One progress table of ``--days`` of rows at ``--per-second`` (an engine at a 1 s trigger records a row
a batch), appended as ``--files-per-day`` files a day (what in-engine maintenance leaves of a day
when it compacts every hour), copied twice; ``retry-engine maintain`` runs on each copy, once with
``progress_retention = "off"`` (what every release before it did) and once with the default
``"30d"``. Printed for each: the run's time, files, bytes and rows before and after, and what the
expiry removed; then after/before ratios of the two.
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
from deltalake import DeltaTable

from retry_engine.config import parse_config
from retry_engine.delta.tables import append_arrow
from retry_engine.ops.maintenance import TableReport, run_maintenance
from retry_engine.ops.monitor import ensure_progress_table
from retry_engine.schemas import PROGRESS

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--per-second", type=float, default=1.0)
    parser.add_argument("--files-per-day", type=int, default=24)
    args = parser.parse_args()
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
