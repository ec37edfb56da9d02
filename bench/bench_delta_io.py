"""Throughput of the deltars source and sink against pyarrow on the same Parquet files.

Prints rows/s and ratios measured side by side in one run:
    python bench/bench_delta_io.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from deltalake import DeltaTable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import consume_results, write_table  # noqa: E402

from retry_engine.delta import write_stream  # noqa: E402
from retry_engine.session import build_session  # noqa: E402


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-delta-io-"))
    data = consume_results(args.rows, failure_rate=0.1)
    src = work / "src"
    write_table(src, data, files=args.files)
    files = DeltaTable(str(src)).file_uris()
    row_bytes = data.nbytes / args.rows
    spark = build_session(app_name="bench-delta-io", log_level="ERROR")

    def pyarrow_read() -> None:
        for f in files:
            pq.read_table(f)

    def source_read() -> None:
        q = (spark.readStream.format("deltars").option("path", str(src)).load()
             .writeStream.format("noop").trigger(availableNow=True).start())
        q.awaitTermination()

    def pyarrow_copy() -> None:
        out = work / "pa_copy"
        out.mkdir(exist_ok=True)
        for i, f in enumerate(files):
            pq.write_table(pq.read_table(f), out / f"{i}.parquet", compression="snappy")

    def sink_copy(run: list[int] = [0]) -> None:  # noqa: B006
        run[0] += 1
        df = spark.readStream.format("deltars").option("path", str(src)).load()
        q = write_stream(df, str(work / f"copy{run[0]}"), checkpoint=str(work / f"ck{run[0]}")).trigger(availableNow=True).start()
        q.awaitTermination()

    source_read()  # warm up the JVM and Python workers
    results = {}
    for name, fn in (("pyarrow read", pyarrow_read), ("deltars source", source_read),
                     ("pyarrow read+write", pyarrow_copy), ("deltars source+sink", sink_copy)):
        results[name] = min(timed(fn) for _ in range(2))
    spark.stop()
    print(f"rows: {args.rows:,} in {len(files)} files, ~{row_bytes:.0f} bytes/row as Arrow")
    print(f"{'path':24} {'seconds':>8} {'rows/s':>12}")
    for name, secs in results.items():
        print(f"{name:24} {secs:8.2f} {args.rows / secs:12,.0f}")
    print(f"source / pyarrow read        = {results['pyarrow read'] / results['deltars source']:.2f}")
    print(f"source+sink / pyarrow copy   = {results['pyarrow read+write'] / results['deltars source+sink']:.2f}")


if __name__ == "__main__":
    main()
