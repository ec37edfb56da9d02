"""S3 requests and batch time per micro-batch: log checkpoints every 100 commits or every 10, tables reopened or kept open, commits in sequence or side by side (#14 part 4).

    python bench/bench_s3.py [--batches 120] [--rows 500] [--variants 100,10-reopen,10] [--latency-ms 0]

Every open of a Delta table reads its last checkpoint and then every commit
after it, one GET each; the engine opens each table it commits to every batch.
delta-rs checkpoints every 100 commits unless the table says otherwise (the
engine's tables of earlier releases); this release makes its own tables with
``delta.checkpointInterval = 10`` (Delta Spark's default).

One run, up to three variants, each on a new bucket of moto's S3 server behind a
counting proxy (``bench/_s3_proxy.py``): every table of the lake is created
first with the variant's properties (the engine keeps what a table has): 100
with the writers cleaning the log (delta-rs's defaults, an earlier release's
tables) or this release's ``storage.TABLE_PROPERTIES`` (10, maintenance cleans);
``10-reopen`` is 10 with every commit opening its table afresh (releases before
tables were kept open between commits, ``retry_engine.delta._handles``),
``10-serial`` commits a batch's tables one after another (releases before they
were committed side by side, ``retry_engine.core.outputs.PARALLEL_COMMITS``),
``--batches`` files of ``--rows`` consume results (10 % failures, a retry
ladder of 1 s levels) are written, and the engine reads one file per trigger
(in-engine maintenance off: it would not run within the bench anyway). After
each batch with input the proxy's counts are read, so requests are per batch.
Printed per variant: requests per batch (mean after the first batch, mean of
the last half, max), GETs of ``_delta_log`` objects per batch by table, the
median batch time; and the ratios of each variant to the first. With
``--latency-ms`` the proxy holds every request that long before forwarding it,
as a round trip to S3 would (moto itself answers in about a millisecond), so
batch times show what the request count and the order of requests cost.

``--part uploads`` times one write task's files (``--files``, one per partition,
as a batch's retry rows by consumer group) through the proxy at ``--latency-ms``,
finished one after another or side by side (``retry_engine.delta._files.PARALLEL_UPLOADS``),
interleaved, medians of ``--rounds``; no Spark.

``--part local`` instead prices the interval on a local disk, where a request
is cheap: for tables of 2,000 and 10,000 files (an engine table between two
hourly compactions), the time to write one checkpoint (paid every 10 or every
100 commits) and to open the table 5 and 50 commits after its checkpoint (the
mean replay of each interval), medians of 5.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _data import consume_results  # noqa: E402

from retry_engine.config import parse_config  # noqa: E402
from retry_engine.core import engine, outputs  # noqa: E402
from retry_engine.core.lease import state_path  # noqa: E402
from retry_engine.delta import _handles, storage  # noqa: E402
from retry_engine.delta.session import build_session  # noqa: E402
from retry_engine.schemas import ALL_TABLES, ENGINE_STATE  # noqa: E402
from tests.s3 import S3Server, free_port, moto_server  # noqa: E402

PROXY = Path(__file__).resolve().parent / "_s3_proxy.py"
INTERVAL = "delta.checkpointInterval"
TIMEOUT_S = 1800.0


@dataclass
class Variant:
    name: str
    interval: int
    # Per batch with input, after the first: requests by kind during that batch.
    batches: list[collections.Counter[str]]
    durations_ms: list[int]

    def totals(self) -> list[int]:
        return [sum(b.values()) for b in self.batches]


def _counts(port: int) -> collections.Counter[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/__counts", timeout=30) as answer:
        return collections.Counter(json.loads(answer.read()))


def _wait_for_proxy(port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            _counts(port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def run_variant(
    spark: SparkSession, server: S3Server, proxy_port: int, name: str, batches: int, rows: int
) -> Variant:
    interval, *flags = name.split("-")
    _handles.KEEP_OPEN = "reopen" not in flags
    outputs.PARALLEL_COMMITS = "serial" not in flags
    _handles.forget()
    bucket = server.new_bucket()
    options = server.storage_options()
    options["aws_endpoint_url"] = f"http://127.0.0.1:{proxy_port}"
    lake = f"s3://{bucket}/lake"
    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    config = parse_config(
        {
            "engine": {
                "lake": lake,
                "checkpoint": str(work / "checkpoint"),
                "trigger_interval": "200ms",
                "max_files_per_trigger": 1,
                "message_delay_level": "1s 1s 1s 1s",
            },
            "storage": options,
            "maintenance": {"engine_tables": False},
        }
    )
    # This release's properties, or delta-rs's defaults written out (an engine keeps what a table has).
    properties = (
        dict(storage.TABLE_PROPERTIES)
        if str(interval) == storage.TABLE_PROPERTIES[INTERVAL]
        else {INTERVAL: str(interval), "delta.enableExpiredLogCleanup": "true"}
    )
    for table in ALL_TABLES:
        storage.create_delta(
            config.table_path(table.name),
            table.arrow_schema,
            partition_by=list(table.partition_by) or None,
            # The input is written before the engine starts, one commit per file, and each write opens
            # the table: checkpointed every 10 in both variants so the setup does not grow with the
            # square of --batches. The engine reads its log incrementally (one GET per batch) either way.
            configuration=dict(storage.TABLE_PROPERTIES) if table.name == "consume_results" else properties,
        )
    storage.create_delta(state_path(lake), ENGINE_STATE.arrow_schema, configuration=properties)
    source = config.table_path("consume_results")
    for i in range(batches):
        storage.write_delta(source, consume_results(rows, failure_rate=0.1, seed=i, offset=i * rows), mode="append")
    query = engine.start(spark, config)
    seen: list[dict[str, object]] = []
    snapshots: list[collections.Counter[str]] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(seen) < batches:
            if query.exception() is not None:
                raise RuntimeError(f"engine failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(seen)} of {batches} batches in {TIMEOUT_S:.0f} s")
            fresh = [
                p
                for p in query.recentProgress
                if (p.get("numInputRows") or 0) > 0 and p["batchId"] not in {s["batchId"] for s in seen}
            ]
            if fresh:
                # Counted when the batch's progress is out: its commits are done.
                counts = _counts(proxy_port)
                for p in fresh:
                    seen.append(p)
                    snapshots.append(counts)
                    print(f"  {name}: batch {p['batchId']}: {sum(counts.values())} requests so far", flush=True)
            time.sleep(0.05)
    finally:
        engine.stop(query)
    per_batch = [snapshots[i] - snapshots[i - 1] for i in range(1, len(snapshots))]
    durations = [int(p["durationMs"]["triggerExecution"]) for p in seen[1:]]  # type: ignore[index]
    return Variant(name, int(interval), per_batch, durations)


def report(variants: list[Variant]) -> None:
    print()
    print("| variant | requests / batch (mean) | last half | max | median batch ms |")
    print("|---|---|---|---|---|")
    for v in variants:
        totals = v.totals()
        half = totals[len(totals) // 2 :]
        print(
            f"| {v.name} | {statistics.mean(totals):.0f} | {statistics.mean(half):.0f} | "
            f"{max(totals)} | {statistics.median(v.durations_ms):.0f} |"
        )
    print()
    print("GETs of _delta_log objects per batch, by table (mean):")
    tables = sorted({k.split()[1] for v in variants for b in v.batches for k in b if k.startswith("GET ")})
    for table in tables:
        means = [
            statistics.mean(sum(n for k, n in b.items() if k == f"GET {table} log") for b in v.batches)
            for v in variants
        ]
        print(f"  {table:16s} " + "  ".join(f"{v.name}: {m:6.1f}" for v, m in zip(variants, means, strict=True)))
    print()
    for label, pick in (
        ("requests per batch, mean", lambda v: statistics.mean(v.totals())),
        ("requests per batch, last half", lambda v: statistics.mean(v.totals()[len(v.totals()) // 2 :])),
        ("median batch time", lambda v: statistics.median(v.durations_ms)),
    ):
        for i, (base, new) in enumerate(zip(variants, variants[1:], strict=False)):
            print(f"ratio {label}, {new.name} / {base.name}: {pick(new) / pick(base):.2f}")
            if i:
                print(f"ratio {label}, {new.name} / {variants[0].name}: {pick(new) / pick(variants[0]):.2f}")


def _median_ms(action: Callable[[], float | None], repeat: int = 5) -> float:
    """Median over ``repeat`` calls of the time ``action`` reports, or of the call when it reports None."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        reported = action()
        times.append(reported if reported is not None else time.perf_counter() - start)
    return statistics.median(times) * 1000


def _local_costs(files: int) -> tuple[float, float, float]:
    """(checkpoint write, open 5 commits after a checkpoint, open 50 after) in ms, a table of ``files`` files."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import AddAction

    row = pa.table({"a": pa.array([1], pa.int64()), "s": ["x"]})
    stats = json.dumps(
        {"numRecords": 1, "minValues": {"a": 1, "s": "x"}, "maxValues": {"a": 1, "s": "x"}, "nullCount": {"a": 0, "s": 0}}
    )
    path = tempfile.mkdtemp(prefix="bench-s3-local-")
    try:
        DeltaTable.create(path, row.schema, configuration={INTERVAL: "1000000"})
        pq.write_table(row, f"{path}/f.parquet")
        size = os.path.getsize(f"{path}/f.parquet")
        for i in range(files):
            shutil.copy(f"{path}/f.parquet", f"{path}/f{i}.parquet")
        table = DeltaTable(path)
        adds = [AddAction(f"f{i}.parquet", size, {}, 0, True, stats) for i in range(files)]
        table.create_write_transaction(adds, mode="append", schema=table.schema())

        def checkpoint_after_a_commit() -> float:
            write_deltalake(path, row, mode="append")
            handle = DeltaTable(path)
            start = time.perf_counter()
            handle.create_checkpoint()
            return time.perf_counter() - start

        def open_latest() -> None:
            DeltaTable(path).version()

        write_ms = _median_ms(checkpoint_after_a_commit)
        opens = []
        for after in (5, 50):
            DeltaTable(path).create_checkpoint()
            for _ in range(after):
                write_deltalake(path, row, mode="append")
            opens.append(_median_ms(open_latest))
        return write_ms, opens[0], opens[1]
    finally:
        shutil.rmtree(path, ignore_errors=True)


def local_costs(sizes: tuple[int, ...] = (2_000, 10_000)) -> None:
    """Checkpoint write and table open times on a local disk (see the module's ``--part local``)."""
    print("| files | checkpoint write ms | per commit, every 10 / 100 | open 5 after ms | open 50 after ms |")
    print("|---|---|---|---|---|")
    for files in sizes:
        write_ms, open5, open50 = _local_costs(files)
        print(f"| {files:,} | {write_ms:.1f} | {write_ms / 10:.1f} / {write_ms / 100:.2f} | {open5:.1f} | {open50:.1f} |")


def upload_times(server: S3Server, proxy_port: int, *, files: int, rounds: int, latency_ms: float) -> None:
    """One write task's ``files`` Parquet files through the proxy, finished in sequence or side by side."""
    import pyarrow as pa

    from retry_engine.delta import _files

    options = server.storage_options()
    options["aws_endpoint_url"] = f"http://127.0.0.1:{proxy_port}"
    uri = f"s3://{server.new_bucket()}/uploads"
    fs, root = storage.location(uri, options).filesystem()
    rows = pa.table({"consumer_group": [f"group_{i % files}" for i in range(files * 1000)],
                     "value": list(range(files * 1000))})
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for parallel in (False, True):
            _files.PARALLEL_UPLOADS = parallel
            started = time.perf_counter()
            writer = _files.PartitionedWriter(fs, root, rows.schema, partition_by=["consumer_group"], uri=uri)
            for batch in rows.to_batches():
                writer.write(batch)
            written = writer.close()
            times[parallel].append((time.perf_counter() - started) * 1000)
            assert len(written) == files
    _files.PARALLEL_UPLOADS = True
    serial, side = statistics.median(times[False]), statistics.median(times[True])
    print(f"{files} files of a write task at {latency_ms:g} ms a request, medians of {rounds} interleaved rounds: "
          f"one after another {serial:,.0f} ms, side by side {side:,.0f} ms; side by side / in sequence "
          f"{side / serial:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=120, help="batches with input per variant")
    parser.add_argument("--rows", type=int, default=500, help="consume results per batch")
    parser.add_argument("--part", choices=("s3", "uploads", "local"), default="s3")
    parser.add_argument("--files", type=int, default=6, help="--part uploads: files a task writes")
    parser.add_argument("--rounds", type=int, default=5, help="--part uploads: interleaved rounds")
    parser.add_argument("--variants", default="100,10-reopen,10",
                        help="comma-separated: checkpoint interval, '-reopen' for tables opened afresh every commit, "
                             "'-serial' for a batch's tables committed one after another")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added to every S3 request by the proxy")
    args = parser.parse_args()
    if args.part == "local":
        local_costs()
        return
    if args.batches < 4:
        parser.error("--batches must be at least 4")
    with moto_server() as server:
        proxy_port = free_port()
        target = server.endpoint.rsplit(":", 1)[1]
        proxy = subprocess.Popen([sys.executable, str(PROXY), str(proxy_port), target, str(args.latency_ms)])
        try:
            _wait_for_proxy(proxy_port)
            if args.part == "uploads":
                upload_times(server, proxy_port, files=args.files, rounds=args.rounds, latency_ms=args.latency_ms)
                return
            spark = build_session(app_name="bench-s3", log_level="ERROR")
            try:
                variants = [
                    run_variant(spark, server, proxy_port, name, args.batches, args.rows)
                    for name in args.variants.split(",")
                ]
            finally:
                spark.stop()
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
    report(variants)


if __name__ == "__main__":
    main()
