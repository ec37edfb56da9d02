"""What a gaining instance's catch-up reads, side by side: the gained queues' whole table, or the files after the group's published offset.

    python bench/bench_catch_up.py [--messages 1000000] [--days 30] [--commits 200] [--recent 10000] [--body 512] [--repeat 3] [--keep DIR]

A messages table of ``--messages`` rows of topic ``orders`` (4 queues, ``--body`` random bytes each) over
``--days`` ending an hour ago, in ``--commits`` producer commits, every one consumed by group G (a
consume result each, written as consumers write them); then ``--recent`` rows in 10 commits, half of
them consumed. Instance A gains queues 2 and 3 (another instance left) and the catch-up runs, the
rows to deliver counted, on local[2] Spark through the deltars bridge; the two alternate, best of
``--repeat``:

(0) whole: no published offset (before the offsets; still so without one): every row of the table as of
    the plan's version, and the group's every consume result;
(1) after: the published offset is the version before the recent commits: the files those commits
    added, and the results since those rows were stored less the clock skew (an hour);

and the ratio (1)/(0), and whether both find the same rows to deliver.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from retry_engine.clients.consumer import DELIVERY_KEY, POSITION, QUEUE_SET, _RebalancedBatch
from retry_engine.clients.rebalance import Assignment, Membership
from retry_engine.core.decide import CLUSTERING
from retry_engine.delta.session import build_session
from retry_engine.schemas import CONSUME_RESULTS, MESSAGES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import fill  # noqa: E402

QUEUES = 4
GAINED = (2, 3)


def _ts(micros: np.ndarray) -> pa.Array:
    return pa.array(micros.astype(np.int64), pa.timestamp("us", tz="UTC"))


def _commit(root: Path, ids: np.ndarray, stored: np.ndarray, body_bytes: int, rng: np.random.Generator) -> None:
    n = ids.size
    names = np.char.add("m-", ids.astype(str))
    noise = rng.integers(0, 256, (n, body_bytes), dtype=np.uint8)
    columns = {
        "msg_id": pa.array(names), "topic": pa.array(["orders"] * n), "tags": pa.array(["TagA"] * n),
        "keys": pa.array(np.char.add("k-", names)), "body": pa.array([bytes(b) for b in noise], pa.binary()),
        "store_timestamp": _ts(stored), "born_timestamp": _ts(stored - 1000), "queue_id": pa.array(ids % QUEUES, pa.int32()),
    }
    write_deltalake(str(root / "messages"), fill(MESSAGES.arrow_schema, columns, n), mode="append",
                    partition_by=list(MESSAGES.partition_by))


def _results(root: Path, ids: np.ndarray, stored: np.ndarray) -> None:
    n = ids.size
    names = np.char.add("m-", ids.astype(str))
    columns = {
        "result_id": pa.array(np.char.add("r-", names)), "msg_id": pa.array(names), "topic": pa.array(["orders"] * n),
        "consumer_group": pa.array(["G"] * n), "consumer_id": pa.array(["B@two"] * n),
        "message_model": pa.array([CLUSTERING] * n), "status": pa.array(["CONSUME_SUCCESS"] * n),
        "consumed_at": _ts(stored + 2_000_000), "store_timestamp": _ts(stored), "queue_id": pa.array(ids % QUEUES, pa.int32()),
    }
    write_deltalake(str(root / "consume_results"), fill(CONSUME_RESULTS.arrow_schema, columns, n), mode="append")


def build(root: Path, n: int, days: float, commits: int, recent: int, body_bytes: int, seed: int = 5) -> int:
    """The tables; returns the published offset (the messages version before the recent commits)."""
    rng = np.random.default_rng(seed)
    now = int(dt.datetime.now(dt.UTC).timestamp() * 1_000_000)
    stored = np.sort(rng.integers(now - int(days * 86_400e6), now - 3_600_000_000, n))
    for rows in np.array_split(np.arange(n), commits):
        _commit(root, rows, stored[rows], body_bytes, rng)
        _results(root, rows, stored[rows])
    offset = DeltaTable(str(root / "messages")).version()
    for rows in np.array_split(np.arange(n, n + recent), 10):
        at = np.full(rows.size, now - 60_000_000) + np.arange(rows.size)
        _commit(root, rows, at, body_bytes, rng)
        _results(root, rows[::2], at[::2])
    for table in ("messages", "consume_results"):
        DeltaTable(str(root / table)).create_checkpoint()
    return offset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=30)
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--recent", type=int, default=10_000)
    parser.add_argument("--body", type=int, default=512, help="bytes of each message body (random, as compressed data is)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", help="build the tables in this folder and keep them (reused if it holds them)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-catch-up-") as tmp:
        root = Path(args.keep or tmp)
        marker = root / "published_offset"
        if not marker.exists():
            marker.write_text(str(build(root, args.messages, args.days, args.commits, args.recent, args.body)))
        offset = int(marker.read_text())
        version = DeltaTable(str(root / "messages")).version()
        spark = build_session(app_name="bench-catch-up", log_level="ERROR")
        from pyspark.sql import functions as F

        messages = str(root / "messages")
        rebalance = _RebalancedBatch(
            spark=spark, group="G", spec=None, writer=None, membership=Membership(tmp, "G", "A@one"),  # type: ignore[arg-type]
            queue_counts={"orders": QUEUES}, sources={"orders": messages},
            topic_filter=lambda topic: F.col("topic") == F.lit(topic), records=tmp,
            results_path=str(root / "consume_results"),
        )
        # The batch the gain came with: no row (its own rows would be anti-joined, as a real batch's are).
        batch = (rebalance._snapshot(messages).limit(0).withColumn(POSITION, F.lit(""))
                 .withColumn(QUEUE_SET, F.col("topic")).withColumn(DELIVERY_KEY, F.lit("")))

        def gain(after: dict[str, int]) -> Assignment:
            return Assignment(batch_id=1, members=("A@one",), queue_counts={"orders": QUEUES},
                              owned={"orders": (0, 1, 2, 3)}, catch_up={"orders": GAINED},
                              catch_up_versions={"orders": version}, windows=(), catch_up_after=after)

        def run(assignment: Assignment) -> int:
            return int(rebalance._rows(batch, assignment).count())

        variants: dict[str, Assignment] = {"whole": gain({}), "after": gain({"orders": offset})}
        runs: dict[str, list[float]] = {name: [] for name in variants}
        answers: dict[str, int] = {}
        for _ in range(args.repeat):
            for name, assignment in variants.items():
                start = time.perf_counter()
                answers[name] = run(assignment)
                runs[name].append(time.perf_counter() - start)
        best = {name: min(times) for name, times in runs.items()}
        files = {t: len(DeltaTable(str(root / t)).file_uris()) for t in ("messages", "consume_results")}
        print(f"messages {args.messages:,} over {args.days:g} days + {args.recent:,} recent; files {files}; "
              f"published offset {offset}, plan version {version}")
        print(f"(0) whole table           {best['whole']:.3f} s   (runs {', '.join(f'{t:.2f}' for t in runs['whole'])})")
        print(f"(1) after the offset      {best['after']:.3f} s   (1)/(0) = {best['after'] / best['whole']:.3f}"
              f"   (runs {', '.join(f'{t:.2f}' for t in runs['after'])})")
        print(f"rows to deliver           {answers}   same: {len(set(answers.values())) == 1}")
        spark.stop()


if __name__ == "__main__":
    main()
