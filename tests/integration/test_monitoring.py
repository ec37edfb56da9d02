"""Progress listener, ``status`` and ``plots`` against one real engine run (B7).

One module-scoped engine run on real Spark and Delta: several groups, retries
released on fast levels, retries held on a 3 h level (the backlog), dead
letters of three kinds and one quarantined row. The tests then read what the
listener recorded and what the commands print and draw.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from retry_engine.core import checkpoint_lake, engine
from retry_engine.core.delays import parse_duration_ms
from retry_engine.delta import read_query_id
from retry_engine.errors import LakeResumeError, SchemaMismatchError
from retry_engine.ops import monitor, plots, status
from retry_engine.ops.cli import EXIT_OK, main
from retry_engine.ops.plots import (
    BACKLOG_FILE,
    DEAD_LETTERS_FILE,
    LATENESS_FILE,
    backlog_from_ledger,
    backlog_from_metrics,
    render,
)
from retry_engine.ops.status import read_tables
from retry_engine.schemas import ENGINE_STATE
from tests.builders import Result
from tests.lakehouse import Lake, wait_for
from tests.streaming import running

pytestmark = pytest.mark.slow

INVALID_ORDER = "com.acme.InvalidOrder"


def inputs() -> list[Result]:
    g_fail = [Result.of(f"GF{i}").failed() for i in range(3)]
    return [
        *[Result.of(f"GA{i}").ok() for i in range(3)],
        *g_fail,
        *[Result.of(f"GD{i}").failed(delay_level_when_next_consume=-1, error_class="java.lang.IllegalStateException")
          for i in range(2)],
        Result.of("GX").failed(reconsume_times=16),
        *[Result.of(f"SN{i}", group="strict").failed(error_class=INVALID_ORDER) for i in range(2)],
        Result.of("SA", group="strict").ok(),
        *[Result.of(f"LF{i}", group="slow").failed() for i in range(2)],
        Result.of("Q1").with_(status="WHATEVER"),
    ]


@contextmanager
def capture_recorders() -> Iterator[list[monitor.ProgressRecorder]]:
    """The recorders ``engine.start`` attaches inside the block (the real ones, only noted)."""
    recorders: list[monitor.ProgressRecorder] = []
    attach = monitor.attach

    def noting(*args: Any, **kwargs: Any) -> monitor.ProgressRecorder:
        recorders.append(attach(*args, **kwargs))
        return recorders[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(monitor, "attach", noting)
        yield recorders


@dataclass
class Run:
    lake: Lake
    conf: Path
    n_inputs: int
    query_id: str
    live: status.Status  # status() read while the query was running
    live_exit: int  # `retry-engine status` exit code while the query was running
    released_at: Any  # when the last of the three fast retries was released


@pytest.fixture(scope="module")
def run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("monitoring")
    lake = Lake.make(
        root / "lake",
        engine={"progress_flush_interval": "300ms"},
        groups={
            "slow": {"backoff": {"levels": "1h 2h 3h"}},
            "strict": {"non_retryable": {"error_classes": [INVALID_ORDER]}},
        },
    )
    conf = root / "retry-engine.toml"
    conf.write_text(f'[engine]\nlake = "{lake.root}"\ntrigger_interval = "200ms"\nprogress_flush_interval = "300ms"\n')
    batch = inputs()
    lake.write_results(batch)
    with capture_recorders() as recorders, running(engine.start(spark, lake.config)) as query:
        wait_for(lambda: len(lake.rows("outcomes")) >= len(batch), timeout=180, what="an outcome per input row")
        wait_for(lambda: len(lake.rows("retry")) >= 3, timeout=120, what="the three fast retries")
        released_at = max(r["delivered_at"] for r in lake.rows("retry"))
        # A batch that started after the releasing one means that one completed and was recorded.
        wait_for(
            lambda: any(r["event"] == "progress" and r["event_time"] > released_at for r in lake.rows("progress")),
            timeout=120,
            what="the progress of the batch after the releases",
        )
        live = status.status(lake.config)
        live_exit = main(["status", "--config", str(conf)])
        query_id = str(query.id)
    wait_for(lambda: any(r["event"] == "terminated" for r in lake.rows("progress")), what="the terminated event")
    (recorder,) = recorders
    wait_for(lambda: recorder.closed, what="the recorder to close")
    assert recorder.unregistered and recorder.rows_dropped == 0
    return Run(lake, conf, len(batch), query_id, live, live_exit, released_at)


def test_progress_rows_record_every_batch_of_the_run(run: Run) -> None:
    rows = sorted(run.lake.rows("progress"), key=lambda r: r["recorded_at"])
    assert rows[0]["event"] == "started" and rows[-1]["event"] == "terminated"
    assert rows[-1]["exception"] is None
    assert {r["query_id"] for r in rows} == {run.query_id} == {read_query_id(run.lake.config.checkpoint_path)}
    assert len({r["run_id"] for r in rows}) == 1
    batches = [r for r in rows if r["event"] == "progress"]
    ids = [r["batch_id"] for r in batches]
    assert ids == list(range(len(ids))) and len(ids) >= 2
    # Every input row was read by exactly one recorded batch.
    assert sum(r["num_input_rows"] for r in batches) == run.n_inputs
    first = batches[0]
    assert first["num_input_rows"] == run.n_inputs
    parts = dict(first["duration_ms"])
    assert first["batch_duration_ms"] >= parts["addBatch"] > 0 and parts["triggerExecution"] > 0
    assert first["state_rows_total"] >= 1 and first["state_memory_bytes"] > 0
    assert first["source_end_offset"] and first["processed_rows_per_second"] > 0
    assert all(r["event_time"] <= r["recorded_at"] for r in batches)


def test_status_while_running(run: Run) -> None:
    assert run.live.state == "running", run.live.state_reason
    assert run.live_exit == EXIT_OK
    assert run.live.query_id == run.query_id
    # status read the progress table after a batch that started past the last release was recorded:
    # its last batch is that one or a later one, and a batch the run really recorded.
    progress = [r for r in run.lake.rows("progress") if r["event"] == "progress"]
    waited_for = min(r["batch_id"] for r in progress if r["event_time"] > run.released_at)
    assert run.live.last_batch is not None
    assert waited_for <= run.live.last_batch.batch_id <= max(r["batch_id"] for r in progress)


def test_status_text_after_the_run(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    # A clean stop exits 0 (#13 part 2: `status` after a stop reports stopped, exit 0).
    assert main(["status", "--config", str(run.conf)]) == EXIT_OK
    out = capsys.readouterr().out
    last = max(r["batch_id"] for r in run.lake.rows("progress") if r["event"] == "progress")
    assert out.startswith("query       stopped: stopped at ")
    assert f"last batch  #{last} at " in out
    assert "backlog     2 retries pending in the schedule stage" in out
    slow_due = min(o["due_at"] for o in run.lake.rows("outcomes") if o["consumer_group"] == "slow")
    assert f"slow   3      2        {slow_due.isoformat(timespec='milliseconds').replace('+00:00', 'Z')}" in out
    assert "dead letters 5 in the last 24 h, 5 since the first batch" in out
    assert "NON_RETRYABLE        com.acme.InvalidOrder" in out


def test_status_json_after_the_run(run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--config", str(run.conf), "--json"]) == EXIT_OK
    got = json.loads(capsys.readouterr().out)
    assert got["state"] == "stopped" and got["query_id"] == run.query_id
    assert got["outcomes"] == dict(Counter(o["outcome"] for o in run.lake.rows("outcomes")))
    assert got["outcomes"]["dead_letter"] == 5 and got["outcomes"]["quarantined"] == 1
    assert [(b["consumer_group"], b["delay_level"], b["pending"]) for b in got["backlog"]] == [("slow", 3, 2)]
    # 3 h out: the oldest pending retry is not due yet, so nothing is overdue.
    assert got["overdue_ms"] is None
    assert dt.datetime.fromisoformat(got["oldest_due_at"]) > dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    retries = run.lake.rows("retry")
    late_ms = [(r["delivered_at"] - r["due_at"]) / dt.timedelta(milliseconds=1) for r in retries]
    overall = got["lateness"][0]
    assert overall["consumer_group"] == "*" and overall["deliveries"] == len(retries) == 3
    assert overall["max_ms"] == max(late_ms) and min(late_ms) >= 0  # R8: never early
    dead = {(d["consumer_group"], d["reason_code"], d["error_class"]): d["count"] for d in got["dead_letters"]}
    assert dead == {
        ("G", "DLQ_REQUESTED", "java.lang.IllegalStateException"): 2,
        ("strict", "NON_RETRYABLE", INVALID_ORDER): 2,
        ("G", "MAX_RECONSUME_TIMES", "java.lang.RuntimeException"): 1,
    }


def test_status_lag_per_group_on_the_engine_lake(run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """#13 part 5: consumer lag per group in ``status`` (table and JSON) on the engine's real lake.

    Every input row got one outcome (bad-input rule), so after the run nothing is behind;
    three results written after the engine stopped are. G's three failures were retried at
    level 3 of 18 fast levels (R5: 3 + reconsume_times 0) and released (R8); slow's two wait
    3 h (level 3 of its own "1h 2h 3h", B2): due only once the clock passes them.
    """
    root = tmp_path / "lake"
    shutil.copytree(run.lake.root, root, ignore=shutil.ignore_patterns("_checkpoints"))
    lake = Lake.make(root)
    lake.write_results([Result.of("NEW1").failed(), Result.of("NEW2").ok(), Result.of("LATE1", group="late").ok()])
    conf = tmp_path / "retry-engine.toml"
    conf.write_text(f'[engine]\nlake = "{root}"\n')

    assert main(["status", "--config", str(conf), "--json"]) == EXIT_OK  # a clean stop
    got = {e["consumer_group"]: e for e in json.loads(capsys.readouterr().out)["lag"]}
    columns = ("results_written", "results_decided", "results_behind", "retries_due", "retries_released", "retries_overdue")
    assert list(got) == ["G", "late", "slow", "strict"]
    assert {g: tuple(e[c] for c in columns) for g, e in got.items()} == {
        "G": (12, 10, 2, 3, 3, 0),
        "late": (1, 0, 1, 0, 0, 0),
        "slow": (2, 2, 0, 0, 0, 0),
        "strict": (3, 3, 0, 0, 0, 0),
    }

    assert main(["status", "--config", str(conf)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "lag         3 consume results not decided yet; retries due vs released" in out
    assert re.search(r"^  G +12 +10 +2 +3 +3 +0$", out, re.MULTILINE), out

    later = status.status(lake.config, now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=4))
    slow = next(e for e in later.lag if e.consumer_group == "slow")
    assert (slow.retries_due, slow.retries_released, slow.retries_overdue) == (2, 0, 2)


def _ink(path: Path) -> tuple[float, int]:
    """Share of non-white pixels and number of distinct colours of a PNG."""
    image = mpimg.imread(path)[:, :, :3]
    ink = float((image.min(axis=2) < 0.95).mean())
    colours = len(np.unique((image * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    return ink, colours


def test_plots_command_writes_three_non_trivial_pngs(run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plots"
    assert main(["plots", "--config", str(run.conf), "--out", str(out)]) == EXIT_OK
    printed = capsys.readouterr().out
    for name in (BACKLOG_FILE, LATENESS_FILE, DEAD_LETTERS_FILE):
        path = out / name
        assert str(path) in printed
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        ink, colours = _ink(path)
        assert ink > 0.02 and colours > 20, (name, ink, colours)
    lake = read_tables(run.lake.config)
    plots = {p.name: p for p in render(lake, tmp_path / "again")}
    # With the engine's METRICS rows the backlog is drawn from them, and ends where the ledger says.
    assert plots["backlog"].source == "metrics"
    final = {(s.consumer_group, s.delay_level): s.pending[-1] for s in backlog_from_metrics(lake.metrics)}
    assert final == {(s.consumer_group, s.delay_level): s.pending[-1] for s in backlog_from_ledger(lake.outcomes, lake.retry)}
    assert final == {("G", 3): 0, ("slow", 3): 2}
    # One line per (group, level) with retries: G level 3 (released) and slow level 3 (held).
    assert plots["backlog"].elements == 2
    assert plots["lateness"].elements >= 1
    # Bars: IllegalStateException/G, InvalidOrder/strict, RuntimeException/G.
    assert plots["dead_letters"].elements == 3


def test_plots_since_reads_its_window_and_draws_what_every_row_draws(run: Run, tmp_path: Path) -> None:
    """#14 (reads that get slower with the lake's age): ``plots --since`` reads the METRICS rows of its
    window only, anchored on the backlog at the lake's recorded batch, and the retries released and
    dead letters of the window. It draws what the METRICS table read whole draws from the window's
    start; a record that cannot vouch for the backlog (METRICS past it) makes it read every row."""
    config = run.lake.config
    metrics = DeltaTable(run.lake.path("metrics")).to_pyarrow_table()
    released = min(m["batch_time"] for m in metrics.to_pylist() if m["metric"] == "delivered")
    whole = read_tables(config)
    for since in (min(metrics["batch_time"].to_pylist()) - dt.timedelta(seconds=1), released - dt.timedelta(milliseconds=1)):
        fast = plots.read_plot_data(config, since=since)
        assert fast.backlog_source == "metrics, from the lake's batch record", since
        every = plots.plot_data(whole, since)
        assert (fast.backlog, fast.dead_letters) == (every.backlog, every.dead_letters), since
        assert sorted(fast.lateness_ms) == sorted(every.lateness_ms), since
        lines = {(s.consumer_group, s.delay_level): s for s in fast.backlog}
        assert set(lines) == {("G", 3), ("slow", 3)} and lines["G", 3].pending[-1] == 0
        assert lines["slow", 3].pending[-1] == 2 and all(t >= since for s in fast.backlog for t in s.times)
        assert all(line.times[0] == since for line in fast.backlog)
    # From just before the releasing batch: the retries decided before it are held at the start, G's then released.
    assert (lines["G", 3].pending[0], lines["slow", 3].pending) == (3, [2] * len(lines["slow", 3].pending))
    earliest = plots.read_plot_data(config, since=min(metrics["batch_time"].to_pylist()) - dt.timedelta(seconds=1))
    assert len(earliest.lateness_ms) == 3 and sum(sum(g.values()) for g in earliest.dead_letters.values()) == 5
    # Nothing before it: the whole history, from a start at 0.
    assert [(s.times[1:], s.pending[1:]) for s in earliest.backlog] == [
        (s.times, s.pending) for s in plots.backlog_from_metrics(metrics)
    ]
    assert {s.pending[0] for s in earliest.backlog} == {0}
    later = plots.read_plot_data(config, since=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    assert [(s.consumer_group, s.pending) for s in later.backlog] == [("slow", [2])]  # held, nothing else
    assert later.lateness_ms.size == 0 and later.dead_letters == {}

    root = tmp_path / "lake"
    shutil.copytree(run.lake.root, root, ignore=shutil.ignore_patterns("_checkpoints"))
    lake = Lake.make(root)
    state = DeltaTable(str(root / "_engine_state")).to_pyarrow_table().to_pylist()[0]
    write_deltalake(
        str(root / "metrics"), metrics.slice(0, 1), mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(state["batch_query_id"], state["batch_id"] + 1)]),
    )
    assert status.recorded_snapshot(lake.config, metrics=True) is None
    assert status.recorded_snapshot(lake.config) is not None  # status itself still may use the record
    moved = plots.read_plot_data(lake.config, since=released)
    assert moved.backlog_source == "metrics"
    assert moved.backlog == plots.plot_data(read_tables(lake.config), released).backlog

    # METRICS behind the record: a batch recorded with outcome rows whose METRICS rows (appended after
    # the record) are not there yet. The record is not used for the backlog; every row is read.
    behind = tmp_path / "behind"
    shutil.copytree(run.lake.root, behind, ignore=shutil.ignore_patterns("_checkpoints"))
    lake = Lake.make(behind)
    outcomes = DeltaTable(str(behind / "outcomes")).to_pyarrow_table()
    acked = outcomes.filter(pa.compute.equal(outcomes["outcome"], "acknowledged")).slice(0, 1)
    write_deltalake(
        str(behind / "outcomes"), acked, mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(state["batch_query_id"], state["batch_id"] + 1)]),
    )
    _with_record(behind, lambda r: r | {"batch_id": r["batch_id"] + 1, "batch_files": '{"outcomes": [{"path": "x"}]}'})
    assert status.recorded_snapshot(lake.config) is not None
    assert status.recorded_snapshot(lake.config, metrics=True) is None
    assert plots.read_plot_data(lake.config, since=released).backlog_source == "metrics"


def test_plots_after_maintenance_expired_metrics_rows_draw_from_the_ledger_before_the_cut(
    run: Run, tmp_path: Path
) -> None:
    """#14 (months on a lake): maintenance removes METRICS rows past `metrics_retention`, after writing
    an `expired_before` row at the cut. The plots' running sums no longer start at 0 before it: a
    window from the cut on draws from the METRICS rows (the record's fast path) what it drew before;
    a window from before the cut, and the whole history, draw from the ledger what the ledger drew
    before. Without the marker, the whole history would start every line at 0 at the first kept row."""
    from retry_engine.core.metrics import EXPIRED
    from retry_engine.ops import maintenance

    root = tmp_path / "lake"
    shutil.copytree(run.lake.root, root, ignore=shutil.ignore_patterns("_checkpoints"))
    lake = Lake.make(root)
    config = lake.config
    metrics = DeltaTable(str(root / "metrics")).to_pyarrow_table()
    released = min(m["batch_time"] for m in metrics.to_pylist() if m["metric"] == "delivered")
    first = min(metrics["batch_time"].to_pylist()) - dt.timedelta(seconds=1)
    before = {since: plots.read_plot_data(config, since=since) for since in (None, first, released)}
    ledger = {since: plots.plot_data(dataclasses.replace(read_tables(config), metrics=metrics.slice(0, 0)), since)
              for since in (None, first)}

    files, rows = maintenance.expire_rows(str(root / "metrics"), "batch_time", released, marked=True)
    assert files > 0 and 0 < rows < metrics.num_rows
    kept = DeltaTable(str(root / "metrics")).to_pyarrow_table()
    marks = kept.filter(pa.compute.equal(kept["metric"], EXPIRED)).to_pylist()
    assert [(m["batch_time"], m["value"], m["batch_id"]) for m in marks] == [(released, float(rows), -1)]
    assert kept.num_rows == metrics.num_rows - rows + 1

    after = plots.read_plot_data(config, since=released)
    assert after.backlog_source == "metrics, from the lake's batch record"
    assert after.backlog == before[released].backlog
    for since in (None, first):
        drawn = plots.read_plot_data(config, since=since)
        assert drawn.backlog_source == "outcomes+retry", since
        assert drawn.backlog == ledger[since].backlog and drawn.dead_letters == before[since].dead_letters
    assert before[None].backlog_source == "metrics" and ledger[None].backlog_source == "outcomes+retry"
    # The ledger's lines hold the same pending counts at the end as the METRICS lines did.
    assert {(s.consumer_group, s.delay_level): s.pending[-1] for s in ledger[None].backlog} == {
        (s.consumer_group, s.delay_level): s.pending[-1] for s in before[None].backlog
    }


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_engine_on_another_lakes_checkpoint_refuses_to_start_and_writes_nothing(
    run: Run, spark: Any, tmp_path: Path
) -> None:
    """A second engine (a config copied with only the lake changed, B8): started on the checkpoint the
    run's engine recorded its lake in, it stops before it takes a lease or touches the checkpoint."""
    run_checkpoint = run.lake.config.checkpoint_path
    checkpoint = Path(run_checkpoint)
    recorded = checkpoint_lake.read(run_checkpoint)
    assert recorded == checkpoint_lake.CheckpointLake(checkpoint_lake.lake_id(str(run.lake.root)) or "", str(run.lake.root))
    before = _files(checkpoint)
    other = Lake.make(tmp_path / "other", engine={"checkpoint": run_checkpoint})
    other.write_results([Result.of("B1").failed()])
    with pytest.raises(LakeResumeError, match=r"\[CHECKPOINT_OF_ANOTHER_LAKE\] the checkpoint .* runs the lake at "):
        engine.start(spark, other.config)
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["consume_results"]  # no lease, no table
    assert _files(checkpoint) == before


def test_a_query_that_fails_to_start_leaves_no_listener(spark: Any, tmp_path: Path) -> None:
    lake = Lake.make(tmp_path)
    write_deltalake(lake.path("consume_results"), pa.table({"x": [1]}))
    with capture_recorders() as recorders, pytest.raises(SchemaMismatchError, match="CONSUME_RESULTS_COLUMN_MISSING"):
        engine.start(spark, lake.config)
    (recorder,) = recorders
    assert recorder.closed and recorder.unregistered
    assert lake.rows("progress") == []


def _everything(config: Any, now: dt.datetime) -> status.Status:
    """The status from every row of every table (no batch record)."""
    return status.summarise(
        read_tables(config, now=now, names=status.STATUS_TABLES),
        now=now,
        trigger_interval_ms=config.trigger_interval_ms,
        flush_interval_ms=parse_duration_ms(config.engine.progress_flush_interval),
    )


def _with_record(root: Path, change: Any) -> None:
    """Rewrite the lake's engine-state row through ``change`` (an operator's or a bug's doing)."""
    path = str(root / "_engine_state")
    (row,) = DeltaTable(path).to_pyarrow_table().to_pylist()
    write_deltalake(path, pa.Table.from_pylist([change(row)], schema=ENGINE_STATE.arrow_schema), mode="overwrite")


def test_status_counts_from_the_batch_record_as_from_every_row(run: Run, tmp_path: Path) -> None:
    """#14 (reads that get slower with the lake's age): ``status`` takes the all-time counts from the
    lake's batch record (the engine adds each recorded batch's counts, B7) and reads pending retries
    only among those due in a recent window, widened until it holds as many as the record counts.
    What it shows is what every row of every table shows: now, once the slow retries are due (4 h),
    and a month on (the window widens three times to reach them). A record it cannot vouch for (the
    tables moved past it, totals unreadable, another pending count) makes it read every row."""
    config = run.lake.config
    recorded = status._recorded_tables(config, dt.datetime.now(dt.UTC))
    assert recorded is not None  # the engine recorded totals; status used them
    outcomes, retry = (DeltaTable(run.lake.path(name)).to_pyarrow_table() for name in ("outcomes", "retry"))
    assert recorded.totals == status.totals_of(outcomes, retry)
    assert recorded.totals.outcomes() == dict(Counter(o["outcome"] for o in run.lake.rows("outcomes")))
    assert set(recorded.outcomes["outcome"].to_pylist()) == {"retry"}  # of the outcomes, only retries are read
    for later in (dt.timedelta(0), dt.timedelta(hours=4), dt.timedelta(days=30)):
        now = dt.datetime.now(dt.UTC) + later
        assert status._recorded_tables(config, now) is not None, later
        fast = dataclasses.replace(status.status(config, now=now), checked_at=now)
        assert fast == dataclasses.replace(_everything(config, now), checked_at=now), later
    assert [(b.consumer_group, b.pending) for b in fast.backlog] == [("slow", 2)]
    assert fast.lateness == []  # nothing released in the 24 h before a month on

    root = tmp_path / "lake"
    shutil.copytree(run.lake.root, root, ignore=shutil.ignore_patterns("_checkpoints"))
    lake = Lake.make(root)
    now = dt.datetime.now(dt.UTC)
    # The tables hold a batch of the record's query past the record (an engine between its commits and
    # the next record is never seen like this: it records first): every row is read, one more retry.
    state = DeltaTable(str(root / "_engine_state")).to_pyarrow_table().to_pylist()[0]
    extra = outcomes.slice(0, 1).to_pylist()[0] | {"msg_id": "X1", "outcome": "retry", "output_msg_id": "X1-out",
                                                   "consumer_group": "slow", "due_at": now + dt.timedelta(hours=1)}
    write_deltalake(
        str(root / "outcomes"), pa.Table.from_pylist([extra], schema=outcomes.schema), mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(state["batch_query_id"], state["batch_id"] + 1)]),
    )
    assert status._recorded_tables(lake.config, now) is None
    moved = status.status(lake.config, now=now)
    assert moved == dataclasses.replace(_everything(lake.config, now), checked_at=moved.checked_at)
    assert sum(b.pending for b in moved.backlog) == 3
    _with_record(root, lambda r: r | {"batch_id": r["batch_id"] + 1, "batch_files": "{}"})  # the record catches up
    assert status._recorded_tables(lake.config, now) is None  # it counts 2 pending, the tables 3
    for totals in ("not json", '{"a": 1}', '[["G", "retry", -1]]', '[["G", "nonsense", 1]]', '[[7, "retry", 1]]'):
        _with_record(root, lambda r, t=totals: r | {"pending_retries": 3, "totals": t})
        assert status._recorded_tables(lake.config, now) is None, totals
        assert status.status(lake.config, now=now).outcomes == _everything(lake.config, now).outcomes
    good = status.totals_of(DeltaTable(lake.path("outcomes")).to_pyarrow_table(), retry).to_json()
    _with_record(root, lambda r: r | {"pending_retries": 3, "totals": good, "batch_files": "null"})
    assert status._recorded_tables(lake.config, now) is None  # a record it cannot read: no crash
    _with_record(root, lambda r: r | {"batch_files": "{}"})
    assert status._recorded_tables(lake.config, now) is not None  # a record that agrees again is used
