"""Compaction by windows of time against Delta's OPTIMIZE, side by side (#14: months on a lake).

    python bench/bench_compaction.py [--files 1440] [--rows-per-file 200] [--body-bytes 256] [--rounds 2]

The producers' messages table as a day of appends leaves it: ``--files`` small files (one topic)
whose ``store_timestamp`` spans the last 24 hours, bodies of ``--body-bytes``, copied once per
variant and round; ``maintain`` runs on each copy, with no retention (delta-rs's OPTIMIZE, what a
table without a retention gets) and with ``messages_retention = "3d"`` (compacted by 3-hour windows
in Python: read with the source's file reader, written with the sink's writer). Rounds alternate
the order. Printed per run: time, files and bytes after; then windowed / OPTIMIZE ratios of the
medians, and that both hold the same rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from retry_engine.delta.tables import append_arrow, ensure_table
from retry_engine.ops.maintenance import compaction_window, maintain_table
from retry_engine.schemas import MESSAGES

WEEK_HOURS = 168


def build(path: str, files: int, rows_per_file: int, body_bytes: int) -> int:
    ensure_table(path, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
    rng = np.random.default_rng(7)
    start = int((dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).timestamp() * 1_000_000)
    step = 86_400 * 1_000_000 // (files * rows_per_file)
    for f in range(files):
        first = f * rows_per_file
        micros = start + (first + np.arange(rows_per_file, dtype=np.int64)) * step
        times = pa.array(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        bodies = [rng.bytes(body_bytes) for _ in range(rows_per_file)]
        columns = {
            "msg_id": pa.array([f"{first + i:032X}" for i in range(rows_per_file)]),
            "topic": pa.array(["orders"] * rows_per_file),
            "body": pa.array(bodies, pa.binary()),
            "store_timestamp": times,
            "born_timestamp": times,
            "queue_id": pa.array(np.zeros(rows_per_file, np.int32)),
        }
        table = pa.table({name: columns.get(name, pa.nulls(rows_per_file, MESSAGES.arrow_schema.field(name).type))
                          for name in MESSAGES.names}, schema=MESSAGES.arrow_schema)
        append_arrow(path, table)
    return files * rows_per_file


def run(source: str, work: Path, name: str, windowed: bool) -> tuple[float, int, int, int]:
    path = str(work / name)
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(source, path)
    window = compaction_window(dt.timedelta(days=3), "store_timestamp") if windowed else None
    started = time.perf_counter()
    report = maintain_table("messages", path, retention_hours=WEEK_HOURS, window=window)
    seconds = time.perf_counter() - started
    assert report.error is None, report.error
    rows = DeltaTable(path).to_pyarrow_table(columns=["msg_id"]).num_rows
    return seconds, int(report.files_after or 0), int(report.bytes_after or 0), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1440)
    parser.add_argument("--rows-per-file", type=int, default=200)
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-compaction-") as tmp:
        work = Path(tmp)
        source = str(work / "source")
        rows = build(source, args.files, args.rows_per_file, args.body_bytes)
        print(f"messages: {args.files} files, {rows} rows over 24 h, bodies {args.body_bytes} B")
        results: dict[bool, list[tuple[float, int, int, int]]] = {False: [], True: []}
        for r in range(args.rounds):
            for windowed in ((False, True) if r % 2 == 0 else (True, False)):
                result = run(source, work, f"r{r}-{'w' if windowed else 'o'}", windowed)
                results[windowed].append(result)
                label = "windowed (3 h)" if windowed else "OPTIMIZE"
                print(f"round {r + 1} {label:15} {result[0]:6.2f} s  files after {result[1]:5}  "
                      f"bytes after {result[2] / 1e6:7.1f} MB  rows {result[3]}")
        t_o = statistics.median(x[0] for x in results[False])
        t_w = statistics.median(x[0] for x in results[True])
        f_o, f_w = results[False][0][1], results[True][0][1]
        b_o, b_w = results[False][0][2], results[True][0][2]
        same = {x[3] for x in results[False] + results[True]} == {rows}
        print(f"windowed / OPTIMIZE: time {t_w / t_o:.2f}x ({t_o:.2f} -> {t_w:.2f} s), files {f_w} vs {f_o}, "
              f"bytes {b_w / b_o:.2f}x; every copy holds all {rows} rows: {same}")


if __name__ == "__main__":
    sys.exit(main())
