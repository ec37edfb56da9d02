"""Start-up benchmark (#14 part 3): from ``retry-engine run`` to the first committed batch, and after a restart.

    python bench/bench_startup.py [--rows 40000] [--rounds 2] [--steady 3]

Each round, in a fresh temporary lake:

1. **cold**: ``--rows`` consume results (10% failed) are in consume_results;
   ``retry-engine run`` starts on a new lake and checkpoint. Timed from the
   moment the command is launched to its start-up line
   (:mod:`retry_engine.core.startup`), which also gives the breakdown: process
   and imports, Spark session, lease, table layout, resume point, query start,
   first batch (planning, execution, commit).
2. **steady**: ``--steady`` more commits of ``--rows`` each, one at a time;
   each batch's ``triggerExecution`` from the PROGRESS table. Their median is
   the steady batch of the same size the first batch is compared with.
3. **restart**: SIGTERM (a clean stop), one more commit of ``--rows``, and the
   same command again on the existing lake and checkpoint: restart to first
   commit, with its breakdown. That first commit is often a batch without input:
   the batch Spark had planned when the stop came (an idle one, the schedule
   stage's timeouts run every trigger) is replayed first, exactly once. So the
   restart is also timed to the commit of its first batch *with* input (the new
   rows; from the PROGRESS table's trigger time plus batch duration, against the
   launch's wall clock).

Each round runs every variant, interleaved, so they share the machine's load:

* ``before``: Spark's own ``SPARK_HOME``, so every Python process Spark
  starts compiles pyspark from ``python/lib/pyspark.zip`` (what main did);
* ``after``: the engine's default, which points ``SPARK_HOME`` at links to
  the installed pyspark without that zip
  (:func:`retry_engine.delta.session.worker_spark_home`) and maps the JVM
  class archive that ``retry-engine prepare`` wrote (run it first);
* ``no-class-archive``: ``after`` without the class archive
  (``RETRY_ENGINE_CLASS_ARCHIVE=off``);
* ``filecontext-checkpoint``: ``after`` with Spark's default checkpoint manager;
* ``pyspark-daemon``: ``after`` with PySpark's own worker daemon, whose workers
  import their modules after each fork (the engine's default is
  :mod:`retry_engine.delta._daemon`, which imports them once before);
* ``no-warm-workers``: ``after`` without the one-row Python job that starts
  the worker daemon while the query starts (``RETRY_ENGINE_WARM_WORKERS=off``);
* ``full-jit``: ``after`` with the JVM's default compilers, C1 and C2
  (``RETRY_ENGINE_QUICK_JIT=off``; the engine's default is C1 only);
* ``parallel-gc``: ``after`` with the parallel garbage collector instead of G1.

Printed per variant: the breakdown of each start (median over rounds), the
first batch as a ratio of the steady batch (target <= 2x), and restart to
first commit (target <= 10 s on the 2-core machine). Every figure is from this
one run.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import consume_results  # noqa: E402
from bench_engine import log  # noqa: E402
from deltalake import DeltaTable, write_deltalake  # noqa: E402

from retry_engine.core.startup import LINE_PREFIX  # noqa: E402
from retry_engine.delta import _class_archive as class_archive  # noqa: E402
from retry_engine.delta import (
    session,  # noqa: E402
    storage,  # noqa: E402
)

CLI = [sys.executable, "-m", "retry_engine.ops.cli"]
STEP = re.compile(r"([a-z][a-z ]+?) (\d+\.\d) s")
TOTAL = re.compile(r"first batch committed (\d+\.\d) s after the process started")


@dataclass
class Start:
    """One ``retry-engine run`` start: its start-up line, parsed, and the wall time to it."""

    wall_s: float
    total_s: float
    steps: dict[str, float]
    line: str


@dataclass
class Round:
    cold: Start
    restart: Start
    steady_ms: list[int] = field(default_factory=list)
    # Restart: launch to the commit of its first batch with input, and that batch's duration.
    restart_rows_s: float = float("nan")
    restart_rows_batch_s: float = float("nan")


class Engine:
    """``retry-engine run`` in a child process; its stderr is read on a thread."""

    def __init__(self, config: Path, env: dict[str, str]) -> None:
        self.began = time.monotonic()
        self.launched = time.time()
        self.proc = subprocess.Popen(
            [*CLI, "run", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self.startup: Start | None = None
        self._seen = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if LINE_PREFIX in line and self.startup is None:
                self.startup = parse(line[line.index(LINE_PREFIX):], time.monotonic() - self.began)
                self._seen.set()

    def wait_started(self, timeout: float = 300) -> Start:
        if not self._seen.wait(timeout) or self.startup is None:
            self.stop()
            raise RuntimeError("no start-up line; the engine said:\n" + "\n".join(self.lines[-30:]))
        return self.startup

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def parse(line: str, wall_s: float) -> Start:
    total = TOTAL.search(line)
    body = line.split("after the process started:", 1)[-1]
    steps = {name.strip(): float(s) for name, s in STEP.findall(body)}
    return Start(wall_s=wall_s, total_s=float(total.group(1)) if total else float("nan"), steps=steps, line=line)


# Variant filecontext-checkpoint: Spark's default checkpoint manager, named on the session so the
# engine keeps it rather than picking the FileSystem-based one for a local checkpoint.
FILECONTEXT_CHECKPOINTS = {
    storage.CHECKPOINT_FILE_MANAGER:
        "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager",
}


def write_config(work: Path, spark_conf: dict[str, str] | None = None) -> Path:
    config = work / "retry-engine.toml"
    conf = ", ".join(f'"{k}" = "{v}"' for k, v in (spark_conf or {}).items())
    config.write_text(
        "[engine]\n"
        f'lake = "{work / "lake"}"\n'
        'trigger_interval = "200ms"\n'
        'progress_flush_interval = "1s"\n'
        'message_delay_level = "1s 1s 1s 1s"\n'
        + (f"spark_conf = {{ {conf} }}\n" if conf else "")
        + "[maintenance]\n"
        "engine_tables = false\n"
    )
    return config


def append(work: Path, rows: int, offset: int) -> None:
    write_deltalake(str(work / "lake" / "consume_results"), consume_results(rows, failure_rate=0.1, offset=offset),
                    mode="append")


def progress_rows(work: Path) -> list[dict[str, object]]:
    path = work / "lake" / "progress"
    if not (path / "_delta_log").exists():
        return []
    table = DeltaTable(str(path)).to_pyarrow_table(
        columns=["event", "batch_id", "num_input_rows", "duration_ms", "event_time", "batch_duration_ms"]
    )
    return [r for r in table.to_pylist() if r["event"] == "progress"]


def wait_for_batches_with_input(work: Path, count: int, timeout: float = 300) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = [r for r in progress_rows(work) if (r["num_input_rows"] or 0) > 0]
        if len(rows) >= count:
            return rows
        time.sleep(0.5)
    raise RuntimeError(f"fewer than {count} batches with input in {timeout} s")

VARIANT_CONF = {
    "filecontext-checkpoint": FILECONTEXT_CHECKPOINTS,
    "pyspark-daemon": {session.DAEMON_MODULE_KEY: "pyspark.daemon"},
    "parallel-gc": {session.DRIVER_JAVA_OPTIONS_KEY: session.DRIVER_JAVA_OPTIONS + " -XX:+UseParallelGC"},
}


def variant_env(variant: str) -> dict[str, str]:
    """The child's environment: ``before`` pins Spark's own SPARK_HOME (the zip); ``after`` leaves it unset."""
    import pyspark

    env = {k: v for k, v in os.environ.items() if k != "SPARK_HOME"}
    if variant == "before":
        env["SPARK_HOME"] = str(Path(pyspark.__file__).parent)
    if variant == "no-warm-workers":
        env[session.WARM_WORKERS_ENV] = "off"
    if variant == "no-class-archive":
        env[class_archive.SWITCH_ENV] = "off"
    if variant == "full-jit":
        env[session.QUICK_JIT_ENV] = "off"
    return env


def one_round(work: Path, rows: int, steady: int, variant: str) -> Round:
    config = write_config(work, VARIANT_CONF.get(variant))
    append(work, rows, 0)
    env = variant_env(variant)
    engine = Engine(config, env)
    try:
        cold = engine.wait_started()
        wait_for_batches_with_input(work, 1)
        for i in range(1, steady + 1):
            append(work, rows, i * rows)
            wait_for_batches_with_input(work, i + 1)
    finally:
        engine.stop()
    cold_rows = progress_rows(work)
    with_input = sorted((r for r in cold_rows if (r["num_input_rows"] or 0) > 0),
                        key=lambda r: int(r["batch_id"]))  # type: ignore[arg-type]
    steady_ms = [int(dict(r["duration_ms"])["triggerExecution"]) for r in with_input[1:]]  # type: ignore[arg-type]
    last_cold = max(int(r["batch_id"]) for r in cold_rows)  # type: ignore[arg-type]
    append(work, rows, (steady + 1) * rows)
    again = Engine(config, env)
    try:
        restart = again.wait_started()
        new = [r for r in wait_for_batches_with_input(work, len(with_input) + 1)
               if int(r["batch_id"]) > last_cold]  # type: ignore[arg-type]
    finally:
        again.stop()
    first = min(new, key=lambda r: int(r["batch_id"]))  # type: ignore[arg-type]
    duration_s = int(first["batch_duration_ms"]) / 1000  # type: ignore[arg-type]
    committed = first["event_time"].timestamp() + duration_s  # type: ignore[union-attr]
    return Round(cold=cold, restart=restart, steady_ms=steady_ms,
                 restart_rows_s=committed - again.launched, restart_rows_batch_s=duration_s)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(results: dict[str, list[Round]], rows: int) -> None:
    variants = list(results)
    names: list[str] = []
    for rounds in results.values():
        for r in rounds:
            for start in (r.cold, r.restart):
                names += [n for n in start.steps if n not in names]
    count = len(next(iter(results.values())))
    print(f"\nretry-engine start-up: {count} rounds, {rows:,} consume results per batch, "
          f"load average {os.getloadavg()[0]:.1f} at the end; medians over rounds (s)")
    heads = [f"{v} {kind}" for v in variants for kind in ("cold", "restart")]
    print("| " + f"{'step':<34} | " + " | ".join(f"{h:>14}" for h in heads) + " |")
    print(f"|{'-' * 36}|" + "|".join("-" * 16 for _ in heads) + "|")

    def line(label: str, value: Callable[[Start], float]) -> None:
        cells = [_median([value(getattr(r, kind)) for r in results[v]])
                 for v in variants for kind in ("cold", "restart")]
        print(f"| {label:<34} | " + " | ".join(f"{c:>14.1f}" for c in cells) + " |")

    for name in names:
        line(name, lambda start, n=name: start.steps.get(n, float("nan")))  # type: ignore[misc]
    line("to first commit (engine line)", lambda start: start.total_s)
    line("to first commit (launch to line)", lambda start: start.wall_s)
    for label, attr in (("restart: to first batch with input", "restart_rows_s"),
                        ("restart: that batch", "restart_rows_batch_s")):
        cells = [_median([getattr(r, attr) for r in results[v]]) for v in variants]
        print(f"| {label:<34} | " + " | ".join(f"{'':>14} | {c:>14.1f}" for c in cells) + " |")
    print()
    for v in variants:
        rounds = results[v]
        steady_s = _median([ms / 1000 for r in rounds for ms in r.steady_ms])
        cold_first = _median([r.cold.steps.get("first batch", float("nan")) for r in rounds])
        restart_first = _median([r.restart.steps.get("first batch", float("nan")) for r in rounds])
        restart_total = _median([r.restart.total_s for r in rounds])
        restart_rows = _median([r.restart_rows_s for r in rounds])
        restart_rows_batch = _median([r.restart_rows_batch_s for r in rounds])
        print(f"{v}: steady batch of {rows:,} results {steady_s:.2f} s; first batch / steady batch: cold "
              f"{cold_first / steady_s:.1f}x (target <= 2x), restart {restart_first / steady_s:.1f}x "
              f"(its first batch, often a replayed one without input), the restart's first batch with input "
              f"{restart_rows_batch / steady_s:.1f}x; restart to first commit {restart_total:.1f} s, to the "
              f"first commit with input {restart_rows:.1f} s (target <= 10 s)")
    if len(variants) == 2:
        a, b = variants
        for kind in ("cold", "restart"):
            ta = _median([getattr(r, kind).total_s for r in results[a]])
            tb = _median([getattr(r, kind).total_s for r in results[b]])
            print(f"{kind} start to first commit, {b} / {a}: {tb / ta:.2f}x ({ta:.1f} s -> {tb:.1f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=40_000, help="consume results per batch")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steady", type=int, default=3, help="batches of --rows after the first, per round")
    parser.add_argument("--variants", default="before,after",
                        help="comma-separated: before, after, no-class-archive, filecontext-checkpoint, pyspark-daemon, "
                             "no-warm-workers "
                             "(see above)")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - {"before", "after", "no-class-archive", "no-warm-workers", "full-jit", *VARIANT_CONF}
    if unknown:
        parser.error(f"unknown variant {sorted(unknown)[0]!r}")
    results: dict[str, list[Round]] = {v: [] for v in variants}
    for i in range(args.rounds):
        for variant in variants:
            with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
                log(f"round {i + 1}/{args.rounds}, {variant}, in {tmp}")
                results[variant].append(one_round(Path(tmp), args.rows, args.steady, variant))
    report(results, args.rows)


if __name__ == "__main__":
    main()
