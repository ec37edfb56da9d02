"""What opening the producers' messages table costs a consumer batch, before and after `retry-engine maintain`.

    python bench/bench_messages_table.py [--commits 5000] [--rows 10] [--repeat 5] [--keep DIR]

A messages table of ``--commits`` producer sends of ``--rows`` messages each (a commit per send, as
`Producer.send_batch` makes them; delta-rs writes a log checkpoint every 100 commits), then two
copies: one as it is, one after `retry-engine maintain --table messages`. Each consumer batch
opens the table (``table_version``: the batch plan's versions) and a catch-up or a new checkpoint
lists its files (``DeltaLog.snapshot``); both are timed on each copy, alternating, best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from retry_engine.config import parse_config
from retry_engine.delta import storage, table_version
from retry_engine.delta._log import DeltaLog
from retry_engine.ops.maintenance import run_maintenance
from retry_engine.schemas import MESSAGES

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import fill  # noqa: E402


def build(path: Path, commits: int, rows: int) -> None:
    for c in range(commits):
        ids = [f"m-{c}-{i}" for i in range(rows)]
        columns = {"msg_id": pa.array(ids), "topic": pa.array(["orders"] * rows), "body": pa.array([b"x" * 64] * rows),
                   "queue_id": pa.array([i % 4 for i in range(rows)], pa.int32())}
        write_deltalake(str(path), fill(MESSAGES.arrow_schema, columns, rows), mode="append",
                        partition_by=list(MESSAGES.partition_by))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=5000)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", help="build the table in this folder and keep it (reused if it holds one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-messages-") as tmp:
        root = Path(args.keep or tmp)
        built = root / "built" / "messages"
        if not built.exists():
            build(built, args.commits, args.rows)
        lakes = {}
        for name in ("as_is", "maintained"):
            shutil.rmtree(root / name, ignore_errors=True)
            shutil.copytree(built.parent, root / name)
            lakes[name] = root / name
        start = time.perf_counter()
        (report,) = run_maintenance(parse_config({"engine": {"lake": str(lakes["maintained"])}}), tables=["messages"])
        took = time.perf_counter() - start
        runs: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeat):
            for name, lake in lakes.items():
                path = str(lake / "messages")
                for what, call in (("open", lambda p=path: table_version(p)),
                                   ("files", lambda p=path: len(DeltaLog(storage.location(p)).snapshot(table_version(p) or 0)))):
                    t0 = time.perf_counter()
                    call()
                    runs.setdefault((name, what), []).append(time.perf_counter() - t0)
        best = {k: min(v) for k, v in runs.items()}
        print(f"messages: {args.commits:,} sends of {args.rows}; maintain {took:.1f} s: files {report.files_before} -> "
              f"{report.files_after}, log entries {report.log_files_before} -> {report.log_files_after}")
        for what in ("open", "files"):
            a, m = best[("as_is", what)], best[("maintained", what)]
            print(f"{what:6} as is {a * 1000:8.1f} ms   maintained {m * 1000:8.1f} ms   maintained / as is = {m / a:.3f}")


if __name__ == "__main__":
    main()
