"""Soak benchmark (#14 part 2): the engine for thousands of micro-batches, with and without maintenance.

    python bench/bench_soak.py [--batches 5000] [--maintenance on|off|both] [--out bench/out] [--minutes M]

A feeder process appends ``--rows-per-tick`` consume results (``--failure-rate``
failed) to consume_results every ``--tick-ms``, with store times advancing at
that rate, and answers every retry the engine releases: retries of
``--ladder-group`` (``retry_max_times = 2``) fail again, so they climb the
ladder to the DLQ; the other groups' retries succeed. Delay levels are ``1s``
and the trigger is 200 ms, so a message reaches the DLQ a few seconds after
its first failure.

Per micro-batch (when its commit appears in the Spark checkpoint) the main
loop samples the RSS of this driver, the JVM and its Python workers
(``RssSampler``) and, per Delta table under the lake, the files and bytes of
its live snapshot (by tailing its commits), its ``_delta_log`` entries, and
every ``--disk-every`` batches the data files and bytes on disk. After the run
the batch durations, input rows and state size come from the engine's own
PROGRESS table, the outcomes from METRICS, the maintenance runs from
``_maintenance``.

Warm-up: the first ``--warmup-minutes`` (default 10, the dedup window) are
run but not judged; ``--batches`` judged batches follow. In S5 the first tenth
of the batches fell inside the dedup window's first fill (state rows 35 ->
245 over batches 1-1,000, then flat), so it measured the warm-up, not the
start of a steady run. The report prints the whole run's ratios beside the
judged ones.

``--maintenance both`` runs ``on`` and then ``off`` in two child processes
(a fresh JVM each, one after the other), then prints the ratios of
:mod:`_soak` side by side and plots the series with
:func:`retry_engine.ops.plots.plot_panels`. Batch 0 (start-up) is left out of
the ratios.

Table log retention: every table is created with ``delta.logRetentionDuration``
= ``--log-retention`` (both modes). Delta's default, 30 days, expires nothing
within a run of an hour, so the log could only look unbounded; the soak
compresses time instead. Vacuum keeps the 1h minimum the engine accepts for
this config, so within a run shorter than that no replaced file leaves the
disk: files on disk are reported, not judged.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import consume_results  # noqa: E402
from _soak import Ratio, format_side_by_side, growth, ratio, steady, verdict  # noqa: E402
from bench_engine import RssSampler, engine_config, log  # noqa: E402

from retry_engine.config import EngineConfig  # noqa: E402
from retry_engine.core import engine  # noqa: E402
from retry_engine.core.lease import state_path  # noqa: E402
from retry_engine.core.metrics import DEAD_LETTER, DELIVERED, OUTCOME_METRICS  # noqa: E402
from retry_engine.delta._log import LOG_DIR, data_file_path, parse_commit  # noqa: E402
from retry_engine.delta.session import build_session  # noqa: E402
from retry_engine.delta.storage import create_delta  # noqa: E402
from retry_engine.ops.maintenance import maintenance_path  # noqa: E402
from retry_engine.ops.plots import Line, Panel, plot_panels  # noqa: E402
from retry_engine.schemas import (  # noqa: E402
    CONSUME_RESULTS,
    DLQ,
    ENGINE_STATE,
    MAINTENANCE,
    METRICS,
    OUTCOMES,
    PROGRESS,
    QUARANTINE,
    RETRY,
)

MODES = ("on", "off")
COMMIT_FILE = re.compile(r"[0-9]{20}\.json")
# Tables the engine writes in this run, created up front with the soak's log retention.
CREATED = (CONSUME_RESULTS, RETRY, DLQ, QUARANTINE, OUTCOMES, METRICS, PROGRESS)
LADDER_MAX_TIMES = 2
PLOT_FILE = "soak.png"


# --------------------------------------------------------------------------- the feeder


@dataclass
class CommitTail:
    """The rows each new commit of a table adds (dataChange adds only, as a streaming reader sees them)."""

    path: str
    version: int = -1

    def new_rows(self) -> pa.Table | None:
        log_dir = os.path.join(self.path, LOG_DIR)
        if not os.path.isdir(log_dir):
            return None
        versions = sorted(int(n[:20]) for n in os.listdir(log_dir) if COMMIT_FILE.fullmatch(n))
        parts = []
        for version in (v for v in versions if v > self.version):
            with open(os.path.join(log_dir, f"{version:020d}.json")) as f:
                commit = parse_commit(version, f)
            for add in commit.adds:
                part = pq.read_table(os.path.join(self.path, data_file_path(add["path"])))
                for name, value in (add.get("partitionValues") or {}).items():
                    part = part.append_column(name, pa.array([value] * part.num_rows, pa.string()))
                parts.append(part)
            self.version = version
        return pa.concat_tables(parts, promote_options="default") if parts else None


def answers(retries: pa.Table, *, ladder_group: str, now: dt.datetime) -> pa.Table:
    """What the consumers of the released ``retries`` write back: failures for ``ladder_group``, else successes."""
    n = retries.num_rows
    fail = pc.equal(retries["consumer_group"], ladder_group)
    computed = {
        "result_id": pc.binary_join_element_wise(
            "a", retries["msg_id"], pc.cast(retries["reconsume_times"], pa.string()), "-"),
        "consumer_id": pa.array(["consumer-1@10.0.0.9"] * n),
        "message_model": pa.array(["CLUSTERING"] * n),
        "status": pc.if_else(fail, "RECONSUME_LATER", "CONSUME_SUCCESS"),
        "error_class": pc.if_else(fail, pa.scalar("java.lang.IllegalStateException"), pa.scalar(None, pa.string())),
        "error_message": pc.if_else(fail, pa.scalar("still failing"), pa.scalar(None, pa.string())),
        "consumed_at": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
    }
    columns = []
    for f in CONSUME_RESULTS.arrow_schema:
        if f.name in computed:
            columns.append(computed[f.name].cast(f.type))
        elif f.name in retries.column_names and f.name not in ("error_class", "error_message"):
            columns.append(retries[f.name].cast(f.type))
        else:
            columns.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(columns, schema=CONSUME_RESULTS.arrow_schema)


def feed(src: str, retry: str, stop: Any, counts: Any, *, rows: int, tick_s: float, failure_rate: float,
         ladder_group: str) -> None:
    """The feeder process: one commit per tick of new results plus the answers to released retries."""
    tail = CommitTail(retry)
    offset = tick = 0
    due = time.monotonic()
    while not stop.is_set():
        now = dt.datetime.now(dt.UTC)
        fresh = consume_results(rows, failure_rate=failure_rate, seed=tick, offset=offset,
                                arrival_rate=rows / tick_s, start=now)
        released = tail.new_rows()
        answered = answers(released, ladder_group=ladder_group, now=now) if released is not None else None
        write_deltalake(src, pa.concat_tables([fresh, answered]) if answered is not None else fresh, mode="append")
        offset += rows
        tick += 1
        with counts.get_lock():
            counts[0] += rows
            counts[1] += answered.num_rows if answered is not None else 0
        due += tick_s
        pause = due - time.monotonic()
        if pause > 0:
            stop.wait(pause)
        else:  # behind: no catch-up burst, the input stays steady
            due = time.monotonic()


# --------------------------------------------------------------------------- sampling the lake


@dataclass
class TableWatch:
    """One Delta table's live files (tailed from its log), ``_delta_log`` entries, and files on disk."""

    path: str
    version: int = -1
    live: dict[str, int] = field(default_factory=dict)

    def _reload(self) -> None:
        table = DeltaTable(self.path)
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        self.live = {data_file_path(a["path"]): int(a["size_bytes"]) for a in actions}
        self.version = table.version()

    def sample(self, *, disk: bool) -> dict[str, float]:
        log_dir = os.path.join(self.path, LOG_DIR)
        try:
            entries = [e for e in os.scandir(log_dir) if e.is_file()]
        except FileNotFoundError:
            return {}
        versions = sorted(int(e.name[:20]) for e in entries if COMMIT_FILE.fullmatch(e.name))
        new = [v for v in versions if v > self.version]
        if new and new[0] != self.version + 1:  # commits cleaned before they were read: start from the snapshot
            self._reload()
            new = [v for v in versions if v > self.version]
        for version in new:
            try:
                with open(os.path.join(log_dir, f"{version:020d}.json")) as f:
                    lines = f.readlines()
            except FileNotFoundError:
                self._reload()
                break
            for line in lines:
                action = json.loads(line) if line.strip() else {}
                if "add" in action:
                    self.live[data_file_path(action["add"]["path"])] = int(action["add"].get("size") or 0)
                elif "remove" in action:
                    self.live.pop(data_file_path(action["remove"]["path"]), None)
            self.version = version
        out = {"files": float(len(self.live)), "bytes": float(sum(self.live.values())), "log": float(len(entries))}
        if disk:
            files, size = _walk(self.path, skip=LOG_DIR)
            out.update({"disk_files": float(files), "disk_bytes": float(size)})
        return out


def _walk(root: str, *, skip: str | None = None) -> tuple[int, int]:
    files = size = 0
    todo = [root]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except FileNotFoundError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                if e.name != skip:
                    todo.append(e.path)
            elif e.is_file(follow_symlinks=False):
                files += 1
                try:
                    size += e.stat().st_size
                except FileNotFoundError:
                    files -= 1
    return files, size


class LakeWatch:
    """Every Delta table of the lake (found as it appears) and the Spark checkpoint."""

    def __init__(self, config: EngineConfig) -> None:
        self.lake = config.engine.lake
        self.checkpoint = config.checkpoint_path
        self.tables: dict[str, TableWatch] = {}

    def sample(self, *, disk: bool) -> dict[str, float]:
        for entry in os.scandir(self.lake):
            if entry.name not in self.tables and os.path.isdir(os.path.join(entry.path, LOG_DIR)):
                self.tables[entry.name] = TableWatch(entry.path)
        out: dict[str, float] = {}
        for name, watch in sorted(self.tables.items()):
            out.update({f"{name}.{k}": v for k, v in watch.sample(disk=disk).items()})
        if disk:
            files, size = _walk(self.checkpoint)
            out.update({"checkpoint.disk_files": float(files), "checkpoint.disk_bytes": float(size)})
        return out


def last_committed_batch(checkpoint: str) -> int:
    """The highest batch id Spark has committed in ``checkpoint`` (-1 before the first)."""
    try:
        names = os.listdir(os.path.join(checkpoint, "commits"))
    except FileNotFoundError:
        return -1
    return max((int(n) for n in names if n.isdigit()), default=-1)


# --------------------------------------------------------------------------- one run


def soak_config(lake: Path, mode: str, args: argparse.Namespace) -> EngineConfig:
    section = (
        {"engine_tables": True, "consume_results": True, "interval": "off",
         "every_batches": args.maintain_every, "retention": args.retention,
         **{f"{table}_retention": args.row_retention for table in ROW_RETENTION_TABLES}}
        if mode == "on" else {"engine_tables": False, "consume_results": False}
    )
    return engine_config(
        lake, trigger_interval=args.trigger, message_delay_level="1s 1s 1s 1s", state_bucket="10s",
        sections={"maintenance": section, "groups": {args.ladder_group: {"retry_max_times": LADDER_MAX_TIMES}}},
    )


# The engine's tables whose rows ``--row-retention`` keeps (mode on): compacted by windows of time.
ROW_RETENTION_TABLES = ("outcomes", "retry", "progress", "metrics")


def accounting(config: EngineConfig) -> dict[str, int]:
    """Every consume result fed has exactly one outcome row, and no retry was delivered twice.

    Read after the engine processed the last input, with delta-rs: ``missing`` (results
    without an outcome), ``doubled`` (results with more than one), ``unknown`` (outcomes of no
    fed result) and ``retry_doubled`` (retry rows sharing a msg id) are all 0 when the run
    lost and repeated nothing, whatever maintenance rewrote under it.
    """
    fed = DeltaTable(config.table_path("consume_results")).to_pyarrow_table(columns=["result_id"])["result_id"]
    decided = DeltaTable(config.table_path("outcomes")).to_pyarrow_table(columns=["result_id"])["result_id"]
    retry = DeltaTable(config.table_path("retry")).to_pyarrow_table(columns=["msg_id"])["msg_id"]
    counts = pa.table({"id": decided}).group_by("id").aggregate([("id", "count")])
    fed_ids = pc.unique(fed)
    return {
        "results": len(fed),
        "results_distinct": len(fed_ids),
        "outcome_rows": len(decided),
        "missing": int(pc.sum(pc.invert(pc.is_in(fed_ids, value_set=counts["id"]))).as_py() or 0),
        "doubled": int(pc.sum(pc.greater(counts["id_count"], 1)).as_py() or 0),
        "unknown": int(pc.sum(pc.invert(pc.is_in(counts["id"], value_set=fed_ids))).as_py() or 0),
        "retry_rows": len(retry),
        "retry_doubled": len(retry) - len(pc.unique(retry)),
    }


def drain(query: Any, config: EngineConfig, timeout_s: float = 180) -> bool:
    """Wait until the engine has processed every consume result fed (False: not within ``timeout_s``)."""
    version = DeltaTable(config.table_path("consume_results")).version()
    deadline = time.monotonic() + timeout_s
    return engine.wait_until_idle(
        query, through_version=version, wait=lambda s: time.sleep(s) or time.monotonic() > deadline
    )


def create_tables(config: EngineConfig, log_retention: str) -> None:
    """Create the run's tables with ``delta.logRetentionDuration`` (the engine finds them and goes on)."""
    settings = {"delta.logRetentionDuration": f"interval {log_retention}"}
    for table in CREATED:
        create_delta(config.table_path(table.name), table.arrow_schema, mode="ignore",
                     partition_by=list(table.partition_by) or None, configuration=settings)
    create_delta(state_path(config.engine.lake), ENGINE_STATE.arrow_schema, mode="ignore", configuration=settings)
    # The maintenance record too (S5: created by the first run without the setting, its log kept 30 days' worth).
    create_delta(maintenance_path(config.engine.lake), MAINTENANCE.arrow_schema, mode="ignore", configuration=settings)


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_mode(mode: str, args: argparse.Namespace) -> None:
    """One soak run; writes ``soak_<mode>.csv`` (one row per batch) and ``soak_<mode>.json`` into ``--out``."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"bench-soak-{mode}-"))
    config = soak_config(work / "lake", mode, args)
    create_tables(config, args.log_retention)
    meta: dict[str, Any] = {"mode": mode, "batches_asked": args.batches, "lake": str(work / "lake"),
                            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "load_start": _loadavg(),
                            "args": {k: v for k, v in vars(args).items() if k != "maintenance"}}
    log(f"maintenance {mode}: lake {work / 'lake'}")
    spark = build_session(app_name=f"bench-soak-{mode}", log_level="ERROR")
    rss = RssSampler()
    watch = LakeWatch(config)
    ctx = mp.get_context("spawn")
    stop, counts = ctx.Event(), ctx.Array("q", 2)
    feeder = ctx.Process(
        target=feed, name="soak-feeder", daemon=True,
        args=(config.table_path("consume_results"), config.table_path("retry"), stop, counts),
        kwargs={"rows": args.rows_per_tick, "tick_s": args.tick_ms / 1000, "failure_rate": args.failure_rate,
                "ladder_group": args.ladder_group})
    samples: dict[int, dict[str, float]] = {}
    began = time.monotonic()
    budget = args.minutes * 60 if args.minutes else math.inf
    stopped_by, failed = "batches", False
    warmup: int | None = None  # the last batch of the warm-up, once --warmup-minutes have passed
    query = engine.start(spark, config)
    try:
        last, checked = -1, 0.0
        while warmup is None or last < warmup + args.batches:
            now = time.monotonic()
            if now - checked > 2:
                checked = now
                # A failure ends the run but keeps what was sampled (S3 lost 93 minutes to a raise here).
                if query.exception() is not None:
                    stopped_by, failed = f"engine failed: {query.exception()}", True
                    break
                if not feeder.is_alive() and feeder.exitcode is not None:
                    stopped_by, failed = f"feeder died (exit code {feeder.exitcode}; its traceback is above)", True
                    break
            if now - began > budget:
                stopped_by = f"time budget ({args.minutes} min)"
                break
            done = last_committed_batch(config.checkpoint_path)
            if done <= last:
                time.sleep(0.05)
                continue
            if feeder.pid is None:  # the input starts once start-up (batch 0) is over
                feeder.start()
            last = done
            sample = {"t": round(now - began, 3), "load1": os.getloadavg()[0],
                      **{f"rss.{k}": round(v, 1) for k, v in rss.now().items()}}
            sample.update(watch.sample(disk=done % args.disk_every == 0))
            samples[done] = sample
            if warmup is None and now - began >= args.warmup_minutes * 60:
                warmup = done  # judged: the batches after this one
                log(f"maintenance {mode}: warm-up over at batch {done}; {args.batches} judged batches follow")
            if done % 250 == 0:
                log(f"maintenance {mode}: batch {done}, {(now - began) / 60:.1f} min, load {_loadavg()[0]}")
    except KeyboardInterrupt:
        # Stopped by hand: what was sampled so far is still written (S5's off run lost its samples so).
        stopped_by = "interrupted (Ctrl-C)"
    finally:
        stop.set()
        if feeder.pid is not None:
            feeder.join(timeout=60)
        meta["wall_s"] = round(time.monotonic() - began, 1)
        drained = False
        if not failed and query.isActive:
            try:
                drained = drain(query, config)
            except Exception as exc:  # noqa: BLE001 - reported with the run, not raised over its samples
                stopped_by, failed = f"engine failed while draining: {exc}", True
        engine.stop(query, finish_batch_s=30)
        spark.stop()
    meta.update(warmup_batches=warmup or 0, stopped_by=stopped_by, failed=failed, ended=time.strftime("%Y-%m-%d %H:%M:%S"), load_end=_loadavg(),
                fed_rows=int(counts[0]), answered_rows=int(counts[1]))
    if drained:
        meta["accounting"] = accounting(config)
        wrong = {k: v for k, v in meta["accounting"].items() if k in ("missing", "doubled", "unknown", "retry_doubled") and v}
        if wrong or meta["accounting"]["results"] != meta["accounting"]["results_distinct"]:
            stopped_by, failed = f"accounting: {meta['accounting']}", True
        log(f"maintenance {mode}: accounting {meta['accounting']}")
    elif not failed:
        stopped_by, failed = "the engine did not process the last input within 180 s of the feeder's stop", True
    meta.update(stopped_by=stopped_by, failed=failed)
    final = watch.sample(disk=True)
    rows = _per_batch(config, samples)
    meta.update(_totals(config), batches_done=len(rows), final=final)
    _write_csv(out / f"soak_{mode}.csv", rows)
    (out / f"soak_{mode}.json").write_text(json.dumps(meta, indent=1))
    log(f"maintenance {mode}: {len(rows)} batches in {meta['wall_s'] / 60:.1f} min ({stopped_by})")
    if failed:
        raise RuntimeError(f"soak {mode}: {stopped_by}; samples so far in {out}, lake kept in {work}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def _per_batch(config: EngineConfig, samples: dict[int, dict[str, float]]) -> list[dict[str, Any]]:
    """One row per batch: the PROGRESS table's figures joined with the samples taken at that batch."""
    progress = DeltaTable(config.table_path("progress")).to_pyarrow_table(
        columns=["event", "batch_id", "batch_duration_ms", "num_input_rows", "input_rows_per_second",
                 "processed_rows_per_second", "state_rows_total", "state_memory_bytes"]).to_pylist()
    rows = []
    for p in sorted((p for p in progress if p["event"] == "progress"), key=lambda p: p["batch_id"]):
        rows.append({
            "batch_id": p["batch_id"],
            "batch_ms": p["batch_duration_ms"],
            "input_rows": p["num_input_rows"],
            "input_rows_per_s": p["input_rows_per_second"],
            "processed_rows_per_s": p["processed_rows_per_second"],
            "state_rows": p["state_rows_total"],
            "state_memory_bytes": p["state_memory_bytes"],
            **samples.get(p["batch_id"], {}),
        })
    return rows


def _totals(config: EngineConfig) -> dict[str, Any]:
    metrics = DeltaTable(config.table_path("metrics")).to_pyarrow_table(columns=["metric", "value"]).to_pandas()
    by_metric = metrics.groupby("metric")["value"].sum().to_dict()
    runs: dict[str, Any] = {"maintenance_runs": 0, "maintenance_errors": 0}
    if DeltaTable.is_deltatable(maintenance_path(config.engine.lake)):
        record = DeltaTable(maintenance_path(config.engine.lake)).to_pyarrow_table(
            columns=["run_id", "error"]).to_pylist()
        runs = {"maintenance_runs": len({r["run_id"] for r in record}),
                "maintenance_errors": sum(1 for r in record if r["error"])}
    return {
        "decided": int(sum(by_metric.get(m, 0) for m in OUTCOME_METRICS)),
        "outcomes": {m: int(by_metric.get(m, 0)) for m in OUTCOME_METRICS},
        "released": int(by_metric.get(DELIVERED, 0)),
        "dead_letters": int(by_metric.get(DEAD_LETTER, 0)),
        **runs,
    }


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    names = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=names)
        writer.writeheader()
        writer.writerows(rows)


# --------------------------------------------------------------------------- the report


def read_csv(path: Path) -> list[dict[str, float]]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in r.items() if v not in ("", None)} for r in csv.DictReader(f)]


def series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    """(batch ids, values) of ``key`` over the batches that have it."""
    have = [r for r in rows if key in r]
    return [r["batch_id"] for r in have], [r[key] for r in have]


def _tables(rows: list[dict[str, float]]) -> list[str]:
    return sorted({k.split(".")[0] for r in rows for k in r if k.endswith(".log")})


def _total(rows: list[dict[str, float]], suffix: str) -> tuple[list[float], list[float]]:
    have = [r for r in rows if any(k.endswith(suffix) for k in r)]
    return [r["batch_id"] for r in have], [sum(v for k, v in r.items() if k.endswith(suffix)) for r in have]


def summarize(rows: list[dict[str, float]], *, after: int = 0) -> list[Ratio]:
    """The soak's ratios over the batches after batch ``after`` (the warm-up)."""
    rows = steady(rows, after)
    ms = series(rows, "batch_ms")[1]
    rate = [r["input_rows"] / (r["batch_ms"] / 1000) for r in rows if r.get("batch_ms")]
    out = [
        ratio("batch time, median (ms)", ms),
        ratio("batch time, mean (ms)", ms, stat="mean"),
        ratio("input rows/s per batch, mean", rate, stat="mean", limit=None),
        ratio("RSS JVM (driver), mean MB", series(rows, "rss.JVM")[1], stat="mean"),
        ratio("RSS Python driver, mean MB", series(rows, "rss.python driver")[1], stat="mean"),
        ratio("RSS Python workers, mean MB", series(rows, "rss.python workers")[1], stat="mean"),
        ratio("state rows, mean", series(rows, "state_rows")[1], stat="mean", limit=None),
        ratio("state memory, mean MB", [v / 2**20 for v in series(rows, "state_memory_bytes")[1]], stat="mean",
              limit=None),
        growth("live files, all tables (peak)", _total(rows, ".files")[1]),
        growth("_delta_log entries, all tables (peak)", _total(rows, ".log")[1]),
        growth("files on disk, all tables (peak)", _total(rows, ".disk_files")[1], limit=None),
    ]
    for table in _tables(rows):
        out.append(growth(f"{table}: live files (peak)", series(rows, f"{table}.files")[1]))
        out.append(growth(f"{table}: _delta_log entries (peak)", series(rows, f"{table}.log")[1]))
    return out


def _start_end(rows: list[dict[str, float]], key: str) -> str:
    values = series(steady(rows), key)[1]
    return f"{values[0]:,.0f} -> {values[-1]:,.0f} (max {max(values):,.0f})" if values else "-"


def _mb(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def report(out: Path, modes: list[str]) -> None:
    runs = {m: read_csv(out / f"soak_{m}.csv") for m in modes}
    metas = {m: json.loads((out / f"soak_{m}.json").read_text()) for m in modes}
    warmups = {m: int(metas[m].get("warmup_batches", 0)) for m in modes}
    # Judged: the batches after the warm-up. Beside them the whole run, warm-up included, as the issue's
    # literal rule reads it (S5: the first tenth then falls inside the dedup window's first fill).
    ratios = {m: summarize(rows, after=warmups[m]) for m, rows in runs.items()}
    whole = {f"{m}, whole run": summarize(rows) for m, rows in runs.items() if warmups[m]}
    print()
    for m in modes:
        meta = metas[m]
        print(f"maintenance {m}: {meta['batches_done']:,} batches (asked {meta['batches_asked']:,}, stopped by "
              f"{meta['stopped_by']}) in {meta['wall_s'] / 60:.1f} min, {meta['started']} - {meta['ended']}, load "
              f"average {meta['load_start'][0]} at the start, {meta['load_end'][0]} at the end; fed "
              f"{meta['fed_rows']:,} results ({meta['fed_rows'] / meta['wall_s']:,.0f}/s, asked "
              f"{meta['args']['rows_per_tick'] * 1000 / meta['args']['tick_ms']:,.0f}/s) + "
              f"{meta['answered_rows']:,} answers to retries; decided "
              f"{meta['decided']:,}, released {meta['released']:,} retries, {meta['dead_letters']:,} dead letters; "
              f"{meta['maintenance_runs']} maintenance runs ({meta['maintenance_errors']} table errors)")
    print()
    print("Last 10% of batches over the first 10% (batch time, RSS, state); peak of the last 10% over the peak "
          "of the first half (files, log entries). Judged: the batches after the warm-up ("
          + ", ".join(f"{m}: batches 1-{warmups[m]}" if warmups[m] else f"{m}: none" for m in modes) + "); batch 0 (start-up) always excluded.")
    print(format_side_by_side({**ratios, **whole}), end="")
    for m in modes:
        print(f"maintenance {m}: {'HOLDS' if verdict(ratios[m]) else 'does NOT hold'} "
              f"({', '.join(r.name for r in ratios[m] if r.holds is False) or 'every judged ratio within 1.2'})")
    print()
    print("By tenth of each run's wall time: batches, input rows/s, batch ms p50, load average, JVM RSS MB, "
          "live files and _delta_log entries (all tables) at the end of the tenth")
    for m in modes:
        for line in by_tenth(runs[m]):
            print(f"  {m:3} {line}")
    print()
    print("Per table, batch 1 -> last batch (max): live files | _delta_log entries | files on disk | live bytes")
    for m in modes:
        rows = runs[m]
        for table in _tables(rows):
            live = series(steady(rows), f"{table}.bytes")[1]
            print(f"  {m:3} {table:16} files {_start_end(rows, f'{table}.files'):28} log "
                  f"{_start_end(rows, f'{table}.log'):28} disk {_start_end(rows, f'{table}.disk_files'):28} "
                  f"bytes {_mb(live[0]) if live else '-'} -> {_mb(live[-1]) if live else '-'}")
        print(f"  {m:3} {'spark checkpoint':16} disk {_start_end(rows, 'checkpoint.disk_files')}")
    path = plot(out, runs, ratios)
    print(f"\nplot: {path}; samples: {', '.join(str(out / f'soak_{m}.csv') for m in modes)}")


def _smoothing(n: int) -> int:
    """Rolling-median width for ``n`` batches: a twentieth of them, 1 to 25."""
    return max(1, min(25, n // 20))


def by_tenth(rows: list[dict[str, float]]) -> list[str]:
    """One line per tenth of the run's wall time (sampled batches only)."""
    have = [r for r in steady(rows) if "t" in r]
    if not have:
        return []
    start, end = have[0]["t"], have[-1]["t"]
    step = (end - start) / 10 or 1.0
    lines = []
    for i in range(10):
        part = [r for r in have if start + i * step <= r["t"] < start + (i + 1) * step or (i == 9 and r["t"] == end)]
        if not part:
            continue
        files = sum(v for k, v in part[-1].items() if k.endswith(".files"))
        logs = sum(v for k, v in part[-1].items() if k.endswith(".log"))
        lines.append(
            f"{(part[0]['t'] - start) / 60:5.1f}-{(part[-1]['t'] - start) / 60:4.1f} min: {len(part):3} batches, "
            f"{sum(r['input_rows'] for r in part) / step:6,.0f} rows/s, "
            f"{statistics.median(r['batch_ms'] for r in part):6,.0f} ms, load {statistics.fmean(r['load1'] for r in part):4.1f}, "
            f"JVM {statistics.fmean(r['rss.JVM'] for r in part):5,.0f}, files {files:6,.0f}, log {logs:6,.0f}")
    return lines


def _rolling_median(values: list[float], width: int) -> list[float]:
    if len(values) < width:
        return values
    arr = np.asarray(values)
    windows = np.lib.stride_tricks.sliding_window_view(arr, width)
    return [float(v) for v in np.median(windows, axis=1)]


def plot(out: Path, runs: dict[str, list[dict[str, float]]], ratios: dict[str, list[Ratio]]) -> Path:
    def title(what: str, name: str) -> str:
        found = {m: next((r for r in ratios[m] if r.name == name), None) for m in runs}
        return what + " (" + ", ".join(f"{m} {r.ratio:.2f}x" for m, r in found.items() if r) + ")"

    def lines(key: str, *, scale: float = 1.0, smooth: bool = False, total: bool = False) -> list[Line]:
        drawn = []
        for m, rows in runs.items():
            x, y = _total(steady(rows), key) if total else series(steady(rows), key)
            y = [v / scale for v in y]
            if smooth:
                y = _rolling_median(y, _smoothing(len(y)))
                x = x[len(x) - len(y):]
            drawn.append(Line(f"maintenance {m}", x, y))
        return drawn

    panels = [
        Panel(title("batch time, rolling median", "batch time, median (ms)"), "ms", lines("batch_ms", smooth=True)),
        Panel(title("RSS JVM (driver)", "RSS JVM (driver), mean MB"), "MB", lines("rss.JVM")),
        Panel(title("RSS Python workers", "RSS Python workers, mean MB"), "MB", lines("rss.python workers")),
        Panel(title("state memory", "state memory, mean MB"), "MiB", lines("state_memory_bytes", scale=2**20)),
        Panel(title("live files, all tables", "live files, all tables (peak)"), "files",
              lines(".files", total=True)),
        Panel(title("_delta_log entries, all tables", "_delta_log entries, all tables (peak)"), "entries",
              lines(".log", total=True)),
        Panel(title("files on disk, all tables", "files on disk, all tables (peak)"), "files",
              lines(".disk_files", total=True)),
        Panel(title("input rows/s per batch, rolling median", "input rows/s per batch, mean"), "rows/s",
              [Line(ln.label, ln.x, ln.y) for ln in _rate_lines(runs)]),
    ]
    path = out / PLOT_FILE
    plot_panels(panels, path, title="retry-engine soak: maintenance on vs off (ratios: last 10% / first 10%, "
                                     "files and logs: last-10% peak / first-half peak)")
    return path


def _rate_lines(runs: dict[str, list[dict[str, float]]]) -> list[Line]:
    drawn = []
    for m, rows in runs.items():
        have = [r for r in steady(rows) if r.get("batch_ms")]
        y = _rolling_median([r["input_rows"] / (r["batch_ms"] / 1000) for r in have], _smoothing(len(have)))
        x = [r["batch_id"] for r in have][len(have) - len(y):]
        drawn.append(Line(f"maintenance {m}", x, y))
    return drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=5000, help="judged micro-batches per run, after the warm-up")
    parser.add_argument("--maintenance", choices=[*MODES, "both"], default="both")
    parser.add_argument("--out", default="bench/out", help="folder for soak_<mode>.csv/.json and soak.png")
    parser.add_argument("--warmup-minutes", type=float, default=10,
                        help="run this long before the judged --batches (default: the dedup window, 10 min)")
    parser.add_argument("--minutes", type=float, default=0, help="stop a run after this long (0: no limit)")
    parser.add_argument("--rows-per-tick", type=int, default=300, help="new consume results per feeder commit")
    parser.add_argument("--tick-ms", type=int, default=200, help="one feeder commit this often")
    parser.add_argument("--failure-rate", type=float, default=0.1)
    parser.add_argument("--ladder-group", default="group_0",
                        help=f"its retries fail again (retry_max_times {LADDER_MAX_TIMES}): the DLQ ladder")
    parser.add_argument("--trigger", default="200ms", help="engine.trigger_interval")
    parser.add_argument("--maintain-every", type=int, default=50, help="[maintenance] every_batches (mode on)")
    parser.add_argument("--retention", default="1h", help="[maintenance] retention (vacuum), mode on")
    parser.add_argument("--row-retention", default="off",
                        help="[maintenance] <table>_retention of outcomes, retry, progress and metrics (mode on; "
                             "at least 1d: compacted by windows of a 24th of it)")
    parser.add_argument("--log-retention", default="5 minutes", help="delta.logRetentionDuration of every table")
    parser.add_argument("--disk-every", type=int, default=10, help="walk the files on disk every this many batches")
    parser.add_argument("--keep", action="store_true", help="keep the lakes (temporary folders)")
    parser.add_argument("--report-only", action="store_true", help="only print and plot the CSVs in --out")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one mode of `both`: no report
    args = parser.parse_args()
    modes = list(MODES) if args.maintenance == "both" else [args.maintenance]
    out = Path(args.out)
    if not args.report_only:
        if len(modes) == 1:
            run_mode(modes[0], args)
        else:
            for mode in modes:  # a fresh JVM per mode: RSS and caches do not carry over
                subprocess.run([sys.executable, __file__, *sys.argv[1:], "--maintenance", mode, "--child"], check=True)
    if not args.child:
        report(out, modes)


if __name__ == "__main__":
    main()
