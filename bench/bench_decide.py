"""The decide step alone, in one process (no Spark): CPU time to decide consume results.

    python bench/bench_decide.py [--rows 250000] [--failures 1.0] [--repeat 5] [--vs PATH]

Decides ``--rows`` results (the throughput bench's input: ``bench/_data.py``) in
32k-row slices as the engine's decide task does, ``--repeat`` times, and prints
the best CPU time. With ``--vs`` (another checkout of retry-engine, e.g. a
``git worktree`` of an earlier commit) it runs the same in a subprocess on that
code, interleaved with this one, and prints the ratio: two versions measured
side by side in one run on a noisy machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import consume_results  # noqa: E402

# The engine's decide slice (retry_engine.core.engine.DECIDE_BATCH_ROWS).
SLICE_ROWS = 32_768


def best_cpu_ms(rows: int, failures: float, repeat: int) -> float:
    """The best of ``repeat`` CPU times (ms) to decide ``rows`` results with this interpreter's retry_engine."""
    from retry_engine.config import parse_config
    from retry_engine.core.decide import BATCH_TS, POSITION, Decider

    results = consume_results(rows, failure_rate=failures, arrival_rate=10_000.0)
    n = results.num_rows
    results = results.append_column(POSITION, pa.array([f"{i:020d}" for i in range(n)])).append_column(
        BATCH_TS, pa.repeat(pa.scalar(dt.datetime.now(dt.UTC), pa.timestamp("us", tz="UTC")), n)
    )
    decider = Decider(parse_config({}))
    slices = results.to_batches(max_chunksize=SLICE_ROWS)
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        decided = sum(decider(s, in_order=False).num_rows for s in slices)
        best = min(best, (time.process_time() - started) * 1000)
        assert decided == n, (decided, n)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--failures", type=float, default=1.0, help="share of failed results")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="with --vs: interleaved rounds")
    parser.add_argument("--vs", type=Path, help="another checkout of retry-engine to compare against")
    parser.add_argument("--only", action="store_true", help=argparse.SUPPRESS)  # one measurement, printed alone
    args = parser.parse_args()
    if args.only:
        print(f"{best_cpu_ms(args.rows, args.failures, args.repeat):.1f}")
        return
    if args.vs is None:
        ms = best_cpu_ms(args.rows, args.failures, args.repeat)
        print(f"decide {args.rows:,} results ({args.failures:.0%} failed): {ms:,.1f} ms CPU (best of {args.repeat})")
        return
    here = Path(__file__).resolve().parent.parent
    command = [sys.executable, str(Path(__file__).resolve()), "--only", "--rows", str(args.rows),
               "--failures", str(args.failures), "--repeat", str(args.repeat)]
    times: dict[str, list[float]] = {"this": [], "vs": []}
    for _ in range(args.rounds):
        for name, root in (("vs", args.vs.resolve()), ("this", here)):
            env = {**os.environ, "PYTHONPATH": str(root)}
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True, cwd=root).stdout
            times[name].append(float(out.strip().splitlines()[-1]))
    this, vs = min(times["this"]), min(times["vs"])
    print(f"decide {args.rows:,} results ({args.failures:.0%} failed), best CPU ms of {args.rounds} rounds x "
          f"{args.repeat}: this {this:,.1f} (rounds {times['this']}), {args.vs} {vs:,.1f} (rounds {times['vs']}); "
          f"this / vs = {this / vs:.2f}x")


if __name__ == "__main__":
    main()
