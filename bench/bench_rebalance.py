"""What a clustering consumer's rebalance window reads of its group's consume results, side by side.

    python bench/bench_rebalance.py [--results 1000000] [--days 30] [--body 512] [--window 10000] [--repeat 3] [--keep DIR]

One consume_results table of ``--results`` rows over ``--days`` ending now, as consumers write it: whole
messages (``--body`` random bytes, 512, keys, tags) with the listener's status, four groups, a file per
group and chunk (400 files) and a Delta checkpoint. The micro-batch being checked holds ``--window``
rows of the last hour, half of them already consumed by another instance of the group. Each read
below is the whole window check (the consumed msg ids, then the anti-join, counted) on local[2] Spark,
through the deltars bridge; the three alternate, best of ``--repeat``:

(0) every column of every file, filtered by group and model (the check before 17dbc52);
(1) the three columns that say who consumed what, every file (a catch-up, whose rows may be of
    any age, reads this);
(2) (1) of the files whose ``consumed_at`` statistics reach the batch rows' store time less the clock
    skew (an hour): a window, the usual rebalance (a restart, an instance joining);

and the ratios (1)/(0), (2)/(0), and whether the three find the same rows to deliver.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from retry_engine.clients.consumer import _RebalancedBatch
from retry_engine.core.decide import CLUSTERING
from retry_engine.delta.session import build_session
from retry_engine.schemas import CONSUME_RESULTS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import fill  # noqa: E402

GROUPS = np.array(["billing", "orders", "search", "audit"])


def _ts(micros: np.ndarray) -> pa.Array:
    return pa.array(micros.astype(np.int64), pa.timestamp("us", tz="UTC"))


def build(root: Path, n: int, days: float, body_bytes: int, seed: int = 11) -> None:
    rng = np.random.default_rng(seed)
    now = int(dt.datetime.now(dt.UTC).timestamp() * 1_000_000)
    consumed = np.sort(rng.integers(now - int(days * 86_400e6), now - 3_600_000_000, n))
    groups = GROUPS[rng.integers(0, 4, n)]
    schema = CONSUME_RESULTS.arrow_schema
    for rows in np.array_split(np.arange(n), 100):
        noise = rng.integers(0, 256, (rows.size, body_bytes), dtype=np.uint8)
        body = pa.array([bytes(b) for b in noise], pa.binary())
        for group in np.unique(groups[rows]):
            mine = rows[groups[rows] == group]
            k = mine.size
            ids = np.char.add("m-", mine.astype(str))
            columns = {
                "result_id": pa.array(np.char.add("r-", ids)), "msg_id": pa.array(ids), "topic": pa.array(["orders"] * k),
                "consumer_group": pa.array([str(group)] * k), "consumer_id": pa.array(["a@one"] * k),
                "message_model": pa.array([CLUSTERING] * k), "status": pa.array(["CONSUME_SUCCESS"] * k),
                "consumed_at": _ts(consumed[mine]), "store_timestamp": _ts(consumed[mine] - 1000),
                "body": body.take(pa.array(mine - rows[0])), "keys": pa.array(np.char.add("k-", ids)),
                "tags": pa.array(["TagA"] * k), "queue_id": pa.array(mine % 8, pa.int32()),
            }
            write_deltalake(str(root), fill(schema, columns, k), mode="append")
    DeltaTable(str(root)).create_checkpoint()


def batch_rows(spark: Any, root: Path, window: int) -> Any:
    """``window`` rows stored in the last hour: half of them already consumed (their results appended now)."""
    now = dt.datetime.now(dt.UTC)
    ids = [f"w-{i}" for i in range(window)]
    stored = [now - dt.timedelta(seconds=3000 - i % 600) for i in range(window)]
    done = ids[::2]
    k = len(done)
    columns = {
        "result_id": pa.array([f"r-{m}" for m in done]), "msg_id": pa.array(done),
        "consumer_group": pa.array(["orders"] * k), "consumer_id": pa.array(["b@two"] * k),
        "message_model": pa.array([CLUSTERING] * k), "status": pa.array(["CONSUME_SUCCESS"] * k),
        "consumed_at": pa.array([now] * k, pa.timestamp("us", tz="UTC")),
    }
    write_deltalake(str(root), fill(CONSUME_RESULTS.arrow_schema, columns, k), mode="append")
    return spark.createDataFrame(list(zip(ids, stored, strict=True)), "msg_id string, store_timestamp timestamp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--body", type=int, default=512, help="bytes of each message body (random, as compressed data is)")
    parser.add_argument("--window", type=int, default=10_000, help="rows of the micro-batch inside the window")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", help="build the table in this folder and keep it (reused if it holds one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as tmp:
        root = Path(args.keep or tmp) / "consume_results"
        if not root.exists():
            build(root, args.results, args.days, args.body)
        spark = build_session(app_name="bench-rebalance", log_level="ERROR")
        rebalance = _RebalancedBatch(
            spark=spark, group="orders", spec=None, writer=None, membership=None,  # type: ignore[arg-type]
            queue_counts={}, sources={}, topic_filter=lambda _: None, records=tmp,  # type: ignore[arg-type,return-value]
            results_path=str(root),
        )
        checked = batch_rows(spark, root, args.window).cache()
        checked.count()

        def every_column() -> int:
            from pyspark.sql import functions as F

            results = rebalance._snapshot(str(root))
            model = F.coalesce(F.col("message_model"), F.lit(CLUSTERING))
            consumed = results.filter((F.col("consumer_group") == "orders") & (model == CLUSTERING)).select("msg_id").distinct()
            return int(checked.join(consumed, "msg_id", "left_anti").count())

        def three_columns() -> int:
            return int(checked.join(rebalance._consumed(None), "msg_id", "left_anti").count())

        def window() -> int:
            found, since = rebalance._stored_since(checked)
            assert found and since is not None
            return int(checked.join(rebalance._consumed(since), "msg_id", "left_anti").count())

        runs: dict[str, list[float]] = {"every": [], "three": [], "window": []}
        answers: dict[str, int] = {}
        reads: dict[str, Callable[[], int]] = {"every": every_column, "three": three_columns, "window": window}
        for _ in range(args.repeat):
            for name, read in reads.items():
                start = time.perf_counter()
                answers[name] = read()
                runs[name].append(time.perf_counter() - start)
        best = {name: min(times) for name, times in runs.items()}
        files = len(DeltaTable(str(root)).file_uris())
        print(f"consume results           {args.results:,} over {args.days:g} days, {files} files; window rows {args.window:,}")
        print(f"(0) every column          {best['every']:.3f} s")
        print(f"(1) three columns         {best['three']:.3f} s   (1)/(0) = {best['three'] / best['every']:.3f}")
        print(f"(2) window's files        {best['window']:.3f} s   (2)/(0) = {best['window'] / best['every']:.3f}")
        print(f"rows to deliver           {answers}   same: {len(set(answers.values())) == 1}")
        spark.stop()


if __name__ == "__main__":
    main()
