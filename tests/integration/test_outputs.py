"""The one-job batch writer and the METRICS table on real Spark and real Delta tables (B1, B7)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from retry_engine.core import engine
from retry_engine.core.metrics import DELIVERED, LATENESS_MS_MIN, OUTCOME_METRICS
from retry_engine.core.outputs import WRITTEN_ROUTE, BatchWriter, route
from retry_engine.core.packed import pack
from retry_engine.delta import append_arrow
from retry_engine.schemas import OUTCOMES
from tests.builders import T0, Result, delivered, work_rows
from tests.lakehouse import Lake, wait_for

TABLES = ("retry", "dlq", "quarantine", "outcomes", "metrics")


def _batch(spark: Any) -> tuple[Any, pa.Table]:
    work = work_rows(
        [Result.of().ok(), Result.of().failed(), Result.of().failed(delay_level_when_next_consume=-1),
         Result.of().with_(status="WHAT"), Result.of(group="H").failed()],
        batch_ts=T0,
    )
    rows = pa.concat_tables([work, delivered(work, late_ms=[5, 7])])
    # As the schedule stage hands them over: packed, a few rows per key (retry_engine.core.packed).
    return spark.createDataFrame(pa.Table.from_batches([pack(rows)])).repartition(2), rows


def _counts(lake: Lake) -> dict[str, int]:
    return {t: len(lake.rows(t)) for t in TABLES}


def test_b1_replayed_batch_id_writes_nothing_twice(spark: Any, tmp_path: Path) -> None:
    lake = Lake.make(tmp_path)
    df, rows = _batch(spark)
    expected = {name: table.num_rows for name, table in route(rows, 0).items()}
    writer = BatchWriter(lake.config, "app-1")
    writer(df, 0)
    first = _counts(lake)
    assert {t: first[t] for t in expected} == expected
    assert first["metrics"] > 0
    writer(df, 0)  # replayed by the same writer
    BatchWriter(lake.config, "app-1")(df, 0)  # and after a restart
    assert _counts(lake) == first
    # A crash after only the outcomes table committed batch 1: the replay fills the others once.
    append_arrow(lake.path("outcomes"), route(rows, 1)["outcomes"].cast(OUTCOMES.arrow_schema),
                 app_id="app-1", txn_version=1)
    BatchWriter(lake.config, "app-1")(df, 1)
    after = _counts(lake)
    assert after == {t: 2 * n for t, n in first.items()}
    assert DeltaTable(lake.path("metrics")).transaction_version("app-1") == 1
    # The skipped attempts left no data file behind.
    _assert_no_orphan_files(lake)


def _assert_no_orphan_files(lake: Lake) -> None:
    """Every Parquet file on disk is referenced by the table."""
    for table in TABLES:
        live = pa.table(DeltaTable(lake.path(table)).get_add_actions(flatten=True)).column("path").to_pylist()
        on_disk = [str(p.relative_to(lake.path(table))) for p in Path(lake.path(table)).rglob("*.parquet")]
        assert sorted(on_disk) == sorted(live), table


def test_b1_a_table_that_got_the_batch_elsewhere_meanwhile_drops_the_files_written_for_it(
    spark: Any, tmp_path: Path
) -> None:
    """The commit-time check: a new batch id is not checked before the job, so its files are written first."""
    lake = Lake.make(tmp_path)
    df, rows = _batch(spark)
    writer = BatchWriter(lake.config, "app-1")
    writer(df, 0)
    first = _counts(lake)
    # Batch 1 reaches the outcomes table from elsewhere (e.g. a second copy of the query).
    append_arrow(lake.path("outcomes"), route(rows, 1)["outcomes"].cast(OUTCOMES.arrow_schema),
                 app_id="app-1", txn_version=1)
    writer(df, 1)
    assert _counts(lake) == {t: 2 * n for t, n in first.items()}
    _assert_no_orphan_files(lake)


@pytest.mark.parametrize("parallel", [True, False])
def test_a_batchs_tables_commit_side_by_side_and_a_failed_commit_loses_nothing(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: bool
) -> None:
    """On object storage a commit is several round trips, so a batch's transactions (each routed table's
    and the metrics append) run at once: every one of them waits here until all have started, which one
    after another would never happen. A commit that fails (the DLQ's, a storage error) fails the batch;
    its files are deleted, the tables that committed keep the batch, and the replay fills in the DLQ
    once. In order (``PARALLEL_COMMITS = False``) the tables after the failed one are not attempted."""
    import threading

    from retry_engine.core import outputs

    lake = Lake.make(tmp_path)
    df, rows = _batch(spark)
    expected = {name: table.num_rows for name, table in route(rows, 0).items()}
    assert set(expected) == {"retry", "dlq", "quarantine", "outcomes"}
    monkeypatch.setattr(outputs, "PARALLEL_COMMITS", parallel)
    started = threading.Barrier(len(expected) + 1, timeout=30)  # the four tables and the metrics
    real_commit, real_append = outputs.commit_files, outputs.append_arrow
    failing = {"dlq"}

    def commit(location: Any, *args: Any, **kwargs: Any) -> Any:
        if parallel:
            started.wait()
        if failing and location.uri.endswith("/dlq"):
            raise OSError("storage unavailable")
        return real_commit(location, *args, **kwargs)

    def append(path: str, *args: Any, **kwargs: Any) -> Any:
        if parallel:
            started.wait()
        return real_append(path, *args, **kwargs)

    monkeypatch.setattr(outputs, "commit_files", commit)
    monkeypatch.setattr(outputs, "append_arrow", append)
    writer = BatchWriter(lake.config, "app-1")
    with pytest.raises(OSError, match="storage unavailable"):
        writer(df, 0)
    counts = _counts(lake)
    assert counts["dlq"] == 0
    # Routed tables commit in table order (retry, dlq, quarantine, outcomes), then the metrics.
    committed = {"retry", "quarantine", "outcomes", "metrics"} if parallel else {"retry"}
    assert {t for t, n in counts.items() if n} == committed
    _assert_no_orphan_files(lake)
    failing.clear()
    if parallel:
        started = threading.Barrier(1)  # the replay commits only what is missing
    writer(df, 0)
    after = _counts(lake)
    assert {t: after[t] for t in expected} == expected and after["metrics"] > 0
    _assert_no_orphan_files(lake)


def _decided_by_a_task(writer: BatchWriter, work: pa.Table, batch_id: int, *, min_rows: int = 1) -> pa.Table:
    """``work`` as one decide task hands it on with stateless writes: stateful rows packed, and a
    packed row of what the task wrote itself (retry_engine.core.outputs.StatelessWrites)."""
    plan = dataclasses.replace(writer.stateless_writes(), min_rows=min_rows)
    task = plan.task(batch_id)
    parts = [pack(task.keep_stateful(work)), *task.finish()]
    return pa.Table.from_batches(parts)


def test_b1_rows_a_decide_task_wrote_are_committed_with_the_batch_and_dropped_on_replay(
    spark: Any, tmp_path: Path
) -> None:
    """#15 goal 2: acknowledgements, drops and quarantined input written by the decide task itself
    reach their tables once with the batch; a replay's copies of them are deleted at commit, not committed twice."""
    lake = Lake.make(tmp_path)
    _, rows = _batch(spark)
    expected = {name: table.num_rows for name, table in route(rows, 0).items()}
    writer = BatchWriter(lake.config, "app-1")

    def attempt(batch_id: int) -> Any:
        packed = _decided_by_a_task(writer, rows, batch_id)
        assert WRITTEN_ROUTE in packed.column("route").to_pylist()
        return spark.createDataFrame(packed).repartition(2)

    writer(attempt(0), 0)
    first = _counts(lake)
    assert {t: first[t] for t in expected} == expected
    acks = [o for o in lake.rows("outcomes") if o["outcome"] == "acknowledged"]
    assert len(acks) == 1 and acks[0]["batch_id"] == 0
    assert sum(m["value"] for m in lake.rows("metrics") if m["metric"] == "acknowledged") == 1
    writer(attempt(0), 0)  # replayed: every table has it, the task's new files go
    assert _counts(lake) == first
    _assert_no_orphan_files(lake)
    # Batch 1 reached the outcomes table elsewhere: the task's outcome files go, the rest commit.
    append_arrow(lake.path("outcomes"), route(rows, 1)["outcomes"].cast(OUTCOMES.arrow_schema),
                 app_id="app-1", txn_version=1)
    writer(attempt(1), 1)
    assert _counts(lake) == {t: 2 * n for t, n in first.items()}
    _assert_no_orphan_files(lake)


def test_a_quarantined_result_of_group_written_is_written_as_a_row_not_taken_for_files(
    spark: Any, tmp_path: Path
) -> None:
    """Bad input: a consume result's group is any string, "/written" (the route of a task's file
    rows) too; it is quarantined like any invalid group and the batch goes on."""
    lake = Lake.make(tmp_path)
    work = work_rows([Result.of("W", group="/written").failed(), Result.of("A").ok()], batch_ts=T0)
    packed = _decided_by_a_task(BatchWriter(lake.config, "app-1"), work, 0, min_rows=100)
    assert "/written" in packed.column("route").to_pylist()
    BatchWriter(lake.config, "app-1")(spark.createDataFrame(packed), 0)
    (bad,) = lake.rows("quarantine")
    assert bad["consumer_group"] == "/written" and bad["msg_id"] == "W"
    assert sorted(o["outcome"] for o in lake.rows("outcomes")) == ["acknowledged", "quarantined"]


@pytest.mark.slow
@pytest.mark.parametrize("direct", [False, True], ids=["stateless-rows-shuffled", "stateless-rows-written-by-decide"])
def test_b7_metrics_account_for_every_input_row(spark: Any, tmp_path: Path, direct: bool) -> None:
    """B7, and #12 item 17's batch bound: the input is three commits of 4 rows waiting before the engine
    starts, which engine.max_rows_per_trigger = 5 admits one commit per micro-batch (without it the first
    batch took all 12). Both ways stateless rows can take (#15 goal 2): sent on to the writer (a task
    with fewer than engine.direct_write_rows of them), or written by the decide task; a result of group
    "/written" (the route of a task's file rows) is quarantined either way."""
    lake = Lake.make(
        tmp_path,
        engine={"auto_create_groups": False, "max_rows_per_trigger": 5, "direct_write_rows": 1 if direct else 8192},
        groups={"G": {}, "H": {"retry_max_times": 1}},
    )
    failing = Result.of("DUP").failed()
    batch = [
        *(Result.of().ok() for _ in range(4)),
        Result.of(group="/written").failed(),
        failing,
        failing.with_(result_id="again"),
        Result.of(topic="pay").failed(),
        Result.of(group="H").failed(reconsume_times=1),
        Result.of().failed(message_model="BROADCASTING"),
        Result.of(group="ghost").failed(),
        Result.of(None).with_(msg_id=None),
    ]
    for start in range(0, len(batch), 4):
        lake.write_results(batch[start : start + 4])
    query = engine.start(spark, lake.config)
    try:
        # The metrics rows are the batch's last commit: wait for them, not for the retry table.
        wait_for(lambda: sum(m["value"] for m in lake.rows("metrics") if m["metric"] == DELIVERED) >= 2,
                 what="both deliveries counted")
    finally:
        query.stop()
    outcomes, retries, metric_rows = lake.rows("outcomes"), lake.rows("retry"), lake.rows("metrics")
    assert sorted(Counter(o["batch_id"] for o in outcomes).values()) == [4, 4, 4]
    by_metric: Counter[str] = Counter()
    for m in metric_rows:
        by_metric[m["metric"]] += int(m["value"])
    outcome_total = sum(by_metric[name] for name in OUTCOME_METRICS)
    assert outcome_total == len(outcomes) == len(batch)
    assert Counter({o: n for o, n in Counter(r["outcome"] for r in outcomes).items()}) == Counter(
        {name: by_metric[name] for name in OUTCOME_METRICS if by_metric[name]}
    )
    # Backlog per (group, level) = retries scheduled - delivered: zero once everything is out.
    backlog: Counter[tuple[str, int]] = Counter()
    for m in metric_rows:
        if m["metric"] == "retry":
            backlog[(m["consumer_group"], m["delay_level"])] += int(m["value"])
        elif m["metric"] == DELIVERED:
            backlog[(m["consumer_group"], m["delay_level"])] -= int(m["value"])
    assert by_metric[DELIVERED] == len(retries) == 2 and set(backlog.values()) == {0}
    lateness = [m["value"] for m in metric_rows if m["metric"] == LATENESS_MS_MIN]
    assert lateness and min(lateness) >= 0  # R8: never early
    # Every row of a batch carries that batch's clock.
    per_batch = {(m["batch_id"], m["batch_time"]) for m in metric_rows}
    assert len(per_batch) == len({b for b, _ in per_batch})
    # ... the micro-batch's own timestamp: the decision time of its outcomes, the release time of its retries.
    decided = {(r["batch_id"], r["decided_at"]) for r in outcomes}
    released = {r["delivered_at"] for r in retries}
    for batch_id, batch_time in per_batch:
        if any(b == batch_id for b, _ in decided):
            assert (batch_id, batch_time) in decided
        else:
            assert batch_time in released


def test_b8_a_batch_record_that_lands_while_delta_rs_raises_keeps_the_batchs_files(
    spark: Any, tmp_path: Path
) -> None:
    """B1/B8 (found by a review): the lease's table is checkpointed after every 10th commit, once the
    commit is in the log; a storage error there raised for a batch record that stands. The writer took
    it for a failed record and deleted the batch's files, and the next start's roll-forward committed
    the recorded (deleted) paths: the batch's retries, dead letters and outcomes lost, and every reader
    of those tables failing for good. The hook fails here as a storage error would: ``_last_checkpoint``
    is a folder, so its rename fails."""
    from retry_engine.core.lease import LakeLease, Owner, read_state, state_path
    from retry_engine.core.outputs import roll_forward

    lake = Lake.make(tmp_path)
    df, rows = _batch(spark)
    lease = LakeLease(
        lake.config.engine.lake, Owner.this_process(query_id="app-1", checkpoint=str(tmp_path / "c")), timeout_ms=60_000
    )
    lease.acquire()
    writer = BatchWriter(lake.config, "app-1", lease=lease)
    batch_id = 0
    while (DeltaTable(state_path(lake.config.engine.lake)).version() + 2) % 10:  # the next record checkpoints
        writer(df, batch_id)
        batch_id += 1
    marker = Path(state_path(lake.config.engine.lake)) / "_delta_log" / "_last_checkpoint"
    marker.unlink(missing_ok=True)
    marker.mkdir()
    before = _counts(lake)
    writer(df, batch_id)  # no error: the record is committed
    marker.rmdir()
    state = read_state(lake.config.engine.lake)
    assert state is not None and state.last_batch is not None and state.last_batch.batch_id == batch_id
    per_batch = {name: table.num_rows for name, table in route(rows, 0).items()}
    assert {t: _counts(lake)[t] - before[t] for t in per_batch} == per_batch
    assert roll_forward(lake.config, state.last_batch) == []  # a restart finds every table has it
    _assert_no_orphan_files(lake)


def test_b8_a_failed_record_deletes_the_batchs_files_only_when_the_lake_does_not_record_them(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record that raised after it landed (any error delta-rs or the store gives after the commit) keeps
    the files the lake names: the next start commits them (roll-forward). One that raised without landing
    deletes them, as before."""
    from retry_engine.core.lease import LakeLease, Owner, read_state
    from retry_engine.core.outputs import roll_forward

    lake = Lake.make(tmp_path)
    df, rows = _batch(spark)
    lease = LakeLease(
        lake.config.engine.lake, Owner.this_process(query_id="app-1", checkpoint=str(tmp_path / "c")), timeout_ms=60_000
    )
    lease.acquire()
    real = lease.record_batch
    landed = [True, False]

    def raising(*args: Any, **kwargs: Any) -> bool:
        if landed.pop(0):
            real(*args, **kwargs)
        raise OSError("the store failed after the commit")

    monkeypatch.setattr(lease, "record_batch", raising)
    writer = BatchWriter(lake.config, "app-1", lease=lease)
    with pytest.raises(OSError, match="after the commit"):
        writer(df, 0)
    state = read_state(lake.config.engine.lake)
    assert state is not None and state.last_batch is not None and state.last_batch.batch_id == 0
    assert sorted(roll_forward(lake.config, state.last_batch)) == ["dlq", "outcomes", "quarantine", "retry"]
    per_batch = {name: table.num_rows for name, table in route(rows, 0).items()}
    assert {t: _counts(lake)[t] for t in per_batch} == per_batch
    with pytest.raises(OSError, match="after the commit"):
        writer(df, 1)  # not recorded: its files go
    _assert_no_orphan_files(lake)
