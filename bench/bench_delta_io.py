"""Throughput of the ``deltars`` source and sink next to pyarrow on the same Parquet files.

    python bench/bench_delta_io.py [--rows 1500000] [--files 16] [--repeat 2]

In one run, on one synthetic table of about 230-byte rows:

(a) read: pyarrow reading the table's Parquet files directly, vs the deltars
    source streaming the table into Spark (Trigger.AvailableNow into the
    ``noop`` sink);
(b) write: pyarrow writing the same rows to Parquet files, vs the deltars
    sink writing them (a batch ``df.write`` from a cached DataFrame, so the
    read side is not counted), plus a streaming copy (source -> sink).

Each figure is the best of ``--repeat`` runs after a warm-up query.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from retry_engine.delta import write_stream
from retry_engine.delta.session import build_session

FORMAT = "deltars"


def synthetic_rows(n: int, *, seed: int = 7) -> pa.Table:
    """``n`` consume-result-like rows, about 230 bytes each in Arrow."""
    rng = np.random.default_rng(seed)
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ids = np.arange(n, dtype=np.int64)
    ts = pa.array(np.full(n, int(now.timestamp() * 1e6)) + rng.integers(0, 10**9, n), pa.int64()).cast(
        pa.timestamp("us", tz="UTC")
    )
    hex_ids = pa.array(np.char.zfill(np.char.mod("%X", ids), 32))
    failed = rng.random(n) < 0.1
    return pa.table(
        {
            "result_id": pa.array(np.char.add("r", ids.astype(str))),
            "consumer_group": pa.array(np.char.add("group_", (ids % 4).astype(str))),
            "msg_id": hex_ids,
            "topic": pa.array(np.char.add("topic_", (ids % 8).astype(str))),
            "tags": pa.array(np.full(n, "TagA")),
            "status": pa.array(np.where(failed, "RECONSUME_LATER", "CONSUME_SUCCESS")),
            "body": pa.array([b"x" * 85] * n, pa.binary()),
            "born_host": pa.array(np.full(n, "10.0.0.1:5000")),
            "reconsume_times": pa.array(rng.integers(0, 16, n).astype(np.int32)),
            "born_timestamp": ts,
            "store_timestamp": ts,
            "consumed_at": ts,
        }
    )


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--files", type=int, default=16, help="data files in the source table")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    work = Path(tempfile.mkdtemp(prefix="bench-delta-io-"))
    try:
        run(work, rows=args.rows, files=args.files, repeat=args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, *, rows: int, files: int, repeat: int) -> None:
    data = synthetic_rows(rows)
    src = work / "src"
    step = -(-rows // files)
    for start in range(0, rows, step):
        write_deltalake(str(src), data.slice(start, step), mode="append")
    paths = DeltaTable(str(src)).file_uris()
    spark = build_session(app_name="bench-delta-io", log_level="ERROR")
    runs = iter(range(1_000_000))

    def pyarrow_read() -> None:
        for p in paths:
            pq.read_table(p)

    def source_read() -> None:
        df = spark.readStream.format(FORMAT).option("path", str(src)).load()
        ck = work / f"ck-noop-{next(runs)}"
        query = df.writeStream.format("noop").option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
        try:
            query.awaitTermination()
        finally:
            query.stop()

    def pyarrow_write() -> None:
        out = work / f"pa-{next(runs)}"
        out.mkdir()
        for i, start in enumerate(range(0, rows, step)):
            pq.write_table(data.slice(start, step), out / f"part-{i}.parquet", compression="snappy")

    cached = spark.read.format(FORMAT).option("path", str(src)).load().cache()
    cached.count()

    def sink_write() -> None:
        cached.write.format(FORMAT).mode("append").option("path", str(work / f"sink-{next(runs)}")).save()

    def stream_copy() -> None:
        n = next(runs)
        df = spark.readStream.format(FORMAT).option("path", str(src)).load()
        query = write_stream(df, str(work / f"copy-{n}"), checkpoint=str(work / f"ck-copy-{n}"))
        started = query.trigger(availableNow=True).start()
        try:
            started.awaitTermination()
        finally:
            started.stop()

    source_read()  # warm-up: JVM, Python workers, imports
    timings = {
        "pyarrow read": best_of(repeat, pyarrow_read),
        "deltars source -> noop": best_of(repeat, source_read),
        "pyarrow write": best_of(repeat, pyarrow_write),
        "deltars sink (df.write)": best_of(repeat, sink_write),
        "deltars source -> sink": best_of(repeat, stream_copy),
    }
    copied = DeltaTable(str(work / f"copy-{next(runs) - 1}")).to_pyarrow_table().num_rows
    spark.stop()
    if copied != rows:
        raise SystemExit(f"stream copy has {copied} rows, expected {rows}")

    row_bytes = data.nbytes / rows
    print(f"\n{rows:,} rows x {row_bytes:.0f} bytes (Arrow) in {len(paths)} files; best of {repeat}; local[2]")
    print(f"{'path':26} {'seconds':>8} {'rows/s':>11}")
    for name, secs in timings.items():
        print(f"{name:26} {secs:8.2f} {rows / secs:11,.0f}")
    print(f"source / pyarrow read  = {timings['pyarrow read'] / timings['deltars source -> noop']:.2f}")
    print(f"sink / pyarrow write   = {timings['pyarrow write'] / timings['deltars sink (df.write)']:.2f}")


if __name__ == "__main__":
    main()
