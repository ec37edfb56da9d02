"""Re-drive throughput next to a plain delta-rs append of the same messages.

    python bench/bench_redrive.py [--rows 20000] [--chunk-size 1000] [--repeat 2]

On one synthetic DLQ (about 230-byte rows, no Spark):

(a) plain: ``write_deltalake`` appending the same number of messages to a
    messages table in the same number of commits (the floor: what any writer pays);
(b) dry run: select and plan the whole DLQ, writing nothing;
(c) re-drive to the original topic: audit commit + target commit per chunk,
    with the exactly-once checks.

Reported as messages per second and as ratios to (a). Best of ``--repeat``.

    python bench/bench_redrive.py --select 10 --lake DIR [--rows 200000] [--body-bytes 1024]

A few dead letters out of a big DLQ instead: builds a DLQ of ``--rows`` dead letters with bodies
of ``--body-bytes`` over 20 days in 100 files under ``DIR`` (once; kept for the next run), then
re-drives ``--select`` of them (``--force``, so every run moves them again) and prints the time
and this process's peak RSS. Run it once per release being compared, on the same ``DIR``
(``PYTHONPATH`` at the other release's checkout). ``--window-hours H`` plans (a dry run) the
re-drive of the group's last ``H`` hours instead: a selection by time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from retry_engine.clients.dlq import Selection
from retry_engine.config import parse_config
from retry_engine.ops.redrive import redrive
from retry_engine.schemas import DLQ, MESSAGES


def dlq_rows(n: int) -> pa.Table:
    now = dt.datetime.now(dt.UTC)
    rows = {
        "msg_id": [f"{i:032X}" for i in range(n)],
        "topic": ["%DLQ%group_0"] * n,
        "tags": ["TagA"] * n,
        "body": [b"x" * 64] * n,
        "properties": [[("k", "v")]] * n,
        "born_timestamp": [now] * n,
        "born_host": ["10.0.0.1:5000"] * n,
        "store_timestamp": [now] * n,
        "queue_id": [0] * n,
        "reconsume_times": [17] * n,
        "origin_msg_id": [f"O{i:031X}" for i in range(n)],
        "retry_topic": [f"topic_{i % 8}" for i in range(n)],
        "consumer_group": ["group_0"] * n,
        "dead_lettered_at": [now] * n,
        "reason_code": ["MAX_RECONSUME_TIMES"] * n,
        "error_class": ["java.lang.IllegalStateException"] * n,
        "error_message": ["boom"] * n,
        "delivery_key": [f"O{i:031X}:17" for i in range(n)],
    }
    return pa.table({f.name: pa.array(rows.get(f.name, [None] * n), f.type) for f in DLQ.arrow_schema}, schema=DLQ.arrow_schema)


def best(repeat: int, setup: Callable[[], Path], run: Callable[[Path], None]) -> float:
    times = []
    for _ in range(repeat):
        root = setup()
        start = time.perf_counter()
        run(root)
        times.append(time.perf_counter() - start)
        shutil.rmtree(root)
    return min(times)


def selected(lake: Path, rows: int, body_bytes: int, select: int, window_hours: float | None = None) -> None:
    """Re-drive ``select`` dead letters of a DLQ of ``rows`` (built under ``lake`` if missing); with
    ``window_hours``, plan instead (a dry run) the re-drive of one group's last ``window_hours``."""
    if not (lake / "dlq").exists():
        for n, part in enumerate(range(0, rows, -(-rows // 100))):
            chunk = dlq_rows(min(-(-rows // 100), rows - part))
            ids = [f"{part + i:032X}" for i in range(chunk.num_rows)]
            at = dt.datetime.now(dt.UTC) - dt.timedelta(days=20) + dt.timedelta(hours=n * 4.8)
            chunk = chunk.set_column(chunk.schema.get_field_index("msg_id"), "msg_id", pa.array(ids))
            chunk = chunk.set_column(chunk.schema.get_field_index("body"), "body", pa.array([b"x" * body_bytes] * chunk.num_rows))
            chunk = chunk.set_column(
                chunk.schema.get_field_index("dead_lettered_at"), "dead_lettered_at",
                pa.array([at] * chunk.num_rows, DLQ.arrow_schema.field("dead_lettered_at").type),
            )
            write_deltalake(str(lake / "dlq"), chunk, mode="append", partition_by=["consumer_group"])
    config = parse_config({"engine": {"lake": str(lake)}})
    start = time.perf_counter()
    if window_hours is None:
        ids = tuple(f"{i:032X}" for i in range(rows // 2, rows // 2 + select))
        report = redrive(config, Selection(ids=ids), target="topic", force=True, operator="bench")
        what = f"re-drive of {select}"
        if report.moved != select:
            raise SystemExit(f"moved {report.moved} of {select}")
    else:
        since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=window_hours)
        report = redrive(config, Selection(group="group_0", since=since), target="topic", force=True, dry_run=True)
        what = f"plan (dry run) of the last {window_hours:g} h ({report.matched:,} dead letters)"
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{what} of {rows:,} dead letters ({body_bytes} B bodies): {seconds:.2f} s, peak RSS {peak:,.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--chunk-size", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--select", type=int, help="re-drive this many dead letters of a DLQ of --rows under --lake")
    parser.add_argument("--lake", type=Path, help="where --select builds (or finds) its DLQ")
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--window-hours", type=float, help="with --select: plan the re-drive of the last this many hours instead")
    args = parser.parse_args()
    if args.select is not None:
        if args.lake is None:
            parser.error("--select needs --lake")
        selected(args.lake, args.rows, args.body_bytes, args.select, args.window_hours)
        return
    source = dlq_rows(args.rows)
    base = Path(tempfile.mkdtemp(prefix="bench-redrive-"))

    def setup() -> Path:
        root = Path(tempfile.mkdtemp(dir=base))
        write_deltalake(str(root / "dlq"), source, mode="append", partition_by=["consumer_group"])
        return root

    def plain(root: Path) -> None:
        messages = pa.table(
            {f.name: source.column(f.name) if f.name in source.column_names else pa.nulls(args.rows, f.type) for f in MESSAGES.arrow_schema},
            schema=MESSAGES.arrow_schema,
        )
        for start in range(0, args.rows, args.chunk_size):
            write_deltalake(str(root / "messages"), messages.slice(start, args.chunk_size), mode="append", partition_by=["topic"])

    def run(dry_run: bool) -> Callable[[Path], None]:
        def go(root: Path) -> None:
            config = parse_config({"engine": {"lake": str(root)}})
            report = redrive(config, Selection(group="group_0"), target="topic", chunk_size=args.chunk_size, dry_run=dry_run)
            if report.plan.shape[0] != args.rows:
                raise SystemExit(f"planned {report.plan.shape[0]} of {args.rows}")

        return go

    results = {
        "plain append": best(args.repeat, setup, plain),
        "dry run": best(args.repeat, setup, run(True)),
        "re-drive to topic": best(args.repeat, setup, run(False)),
    }
    floor = results["plain append"]
    print(f"{args.rows} messages, chunks of {args.chunk_size} ({-(-args.rows // args.chunk_size)} commits per table)")
    for name, seconds in results.items():
        print(f"{name:18} {seconds:7.2f} s  {args.rows / seconds:10,.0f} msg/s  {seconds / floor:5.2f}x plain append")
    shutil.rmtree(base)


if __name__ == "__main__":
    main()
