"""Engine throughput and delivery lateness, measured side by side in one run.

    python bench/bench_engine.py [--rows 200000]

1. Throughput (consume results/s) of the engine at 10% and 100% failures, as a
   ratio to the raw Delta-to-Delta copy through the same source and sink, and
   to a naive one-key-per-message applyInPandasWithState baseline.
2. Lateness of released retries (delivered_at - due_at, on the micro-batch
   clock) against the trigger interval and batch duration, with a count of
   early deliveries.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import consume_results, write_table  # noqa: E402

from retry_engine import engine  # noqa: E402
from retry_engine.config import parse_config  # noqa: E402
from retry_engine.delta import write_stream  # noqa: E402
from retry_engine.session import build_session  # noqa: E402


def _naive(key: tuple[str], frames: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
    """One key per message: count attempts in state, emit one row."""
    n = sum(len(f) for f in frames)
    state.update(((state.get[0] if state.exists else 0) + n,))
    state.setTimeoutDuration(60_000)
    yield pd.DataFrame({"msg_id": [key[0]], "attempts": [n]})


def _progress(results: dict[str, float]) -> None:
    name, value = list(results.items())[-1]
    print(f"  measured {name}: {value:,.0f} results/s", file=sys.stderr, flush=True)


def throughput(spark, work: Path, rows: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    out: dict[str, float] = {}
    for label, rate in (("10%", 0.1), ("100%", 1.0)):
        src = work / f"results_{label.rstrip('%')}"
        write_table(src, consume_results(rows, failure_rate=rate), files=8)
        # Raw copy through the same source and sink.
        t = time.perf_counter()
        df = spark.readStream.format("deltars").option("path", str(src)).load()
        write_stream(df, str(work / f"copy_{label[:-1]}"), checkpoint=str(work / f"ck_copy_{label[:-1]}")) \
            .trigger(availableNow=True).start().awaitTermination()
        out[f"raw copy ({label})"] = rows / (time.perf_counter() - t)
        _progress(out)
        # The engine.
        config = parse_config({"engine": {"lake": str(work / f"lake_{label[:-1]}")},
                               "tables": {"consume_results": str(src)}})
        t = time.perf_counter()
        engine.run_once(spark, config)
        out[f"engine ({label})"] = rows / (time.perf_counter() - t)
        _progress(out)
        if label == "10%":
            t = time.perf_counter()
            naive = (spark.readStream.format("deltars").option("path", str(src)).load()
                     .groupBy("msg_id").applyInPandasWithState(_naive, "msg_id string, attempts long", "n long",
                                                               "append", GroupStateTimeout.ProcessingTimeTimeout)
                     .writeStream.format("noop").option("checkpointLocation", str(work / "ck_naive"))
                     .trigger(processingTime="500 milliseconds").start())
            # AvailableNow never ends with processing-time timeouts; wait until idle instead.
            engine.wait_until_idle(naive)
            out["naive key-per-message (10%)"] = rows / (time.perf_counter() - t)
            _progress(out)
            naive.stop()
    return out


def lateness(spark, work: Path, seconds: int, per_second: int, trigger_ms: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    lake = work / "lake_late"
    config = parse_config({"engine": {"lake": str(lake), "trigger_interval": f"{trigger_ms}ms",
                                      "message_delay_level": "1s 1s 2s 3s", "state_bucket": "1s"}})
    query = engine.start(spark, config)
    src = config.table_path("consume_results")
    try:
        for i in range(seconds * 2):
            chunk = consume_results(per_second // 2, failure_rate=1.0, seed=i)
            chunk = chunk.set_column(chunk.schema.get_field_index("msg_id"), "msg_id",
                                     [[f"L{i}-{j}" for j in range(chunk.num_rows)]])
            write_deltalake(src, chunk, mode="append")
            time.sleep(0.5)
        expected = seconds * 2 * (per_second // 2)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if DeltaTable(config.table_path("retry")).to_pyarrow_table(columns=["msg_id"]).num_rows >= expected:
                    break
            except Exception:
                pass
            time.sleep(1)
        durations = [p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress]
    finally:
        query.stop()
    retry = DeltaTable(config.table_path("retry"))
    rows = retry.to_pyarrow_table(columns=["due_at", "delivered_at"]).to_pandas()
    late_ms = (rows["delivered_at"] - rows["due_at"]).dt.total_seconds().to_numpy() * 1000
    return {
        "retries": float(len(rows)),
        "early deliveries": float((late_ms < 0).sum()),
        "lateness p50 ms": float(np.percentile(late_ms, 50)),
        "lateness p99 ms": float(np.percentile(late_ms, 99)),
        "lateness max ms": float(late_ms.max()),
        "trigger interval ms": float(trigger_ms),
        "batch duration p50 ms": float(np.percentile(durations, 50)) if durations else 0.0,
        "batch duration p99 ms": float(np.percentile(durations, 99)) if durations else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--late-seconds", type=int, default=20)
    parser.add_argument("--late-rate", type=int, default=2000)
    parser.add_argument("--trigger-ms", type=int, default=1000)
    parser.add_argument("--lateness-only", action="store_true", help="skip the throughput runs")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    spark = build_session(app_name="bench-engine", log_level="ERROR")
    if args.lateness_only:
        _print_lateness(lateness(spark, work, args.late_seconds, args.late_rate, args.trigger_ms))
        spark.stop()
        return
    # Warm up JVM and Python workers on a small run.
    throughput(spark, work / "warm", 2000)
    rates = throughput(spark, work / "run", args.rows)
    late = lateness(spark, work, args.late_seconds, args.late_rate, args.trigger_ms)
    spark.stop()
    print(f"consume results: {args.rows:,} per run, local[2]")
    print(f"{'pipeline':32} {'results/s':>12}")
    for name, rate in rates.items():
        print(f"{name:32} {rate:12,.0f}")
    print(f"engine / raw copy (10%)         = {rates['engine (10%)'] / rates['raw copy (10%)']:.2f}")
    print(f"engine / raw copy (100%)        = {rates['engine (100%)'] / rates['raw copy (100%)']:.2f}")
    print(f"engine / naive baseline (10%)   = {rates['engine (10%)'] / rates['naive key-per-message (10%)']:.1f}x")
    _print_lateness(late)


def _print_lateness(late: dict[str, float]) -> None:
    print("lateness of released retries (delivered_at - due_at):")
    for name, value in late.items():
        print(f"  {name:24} {value:10.0f}")
    budget = late["trigger interval ms"] + late["batch duration p99 ms"]
    print(f"  p99 within trigger + p99 batch ({budget:.0f} ms): {late['lateness p99 ms'] <= budget}")


if __name__ == "__main__":
    main()
