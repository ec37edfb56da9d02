"""Table maintenance around and inside a running engine, on real Spark and Delta (#14 part 1).

One engine run shared by every assertion: the engine maintains its tables
(and, asked to, consume_results) between batches while it streams; then
`retry-engine maintain` compacts and vacuums everything with a zero retention
(the harshest case: every replaced file is deleted at once); then the engine
goes on from its checkpoint. Each consume result must end in exactly one
outcome (SPEC B1, bad-input rule: no row reprocessed, none skipped), and
every reader must see the same rows as before maintenance.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from retry_engine.clients.producer import Message, Producer
from retry_engine.core import engine
from retry_engine.core.metrics import EXPIRED
from retry_engine.delta import register
from retry_engine.delta.tables import append_arrow, ensure_table
from retry_engine.ops.cli import EXIT_OK, main
from retry_engine.ops.maintenance import ENGINE_TABLES, RECORD_TABLE, maintenance_path
from retry_engine.ops.monitor import ensure_progress_table
from retry_engine.schemas import METRICS, PROGRESS
from tests.builders import Result, message_rows, outcome_rows, retry_rows
from tests.lakehouse import Lake, wait_for

pytestmark = pytest.mark.slow

# Group "slow" retries after an hour: its failures stay pending, each with one "retry" outcome.
SLOW = {"slow": {"backoff": {"levels": "1h"}}}
# A key column per table that identifies its rows, for readers that convert nested columns their own way.
KEYS = {
    "consume_results": "result_id",
    "outcomes": "result_id",
    "dlq": "msg_id",
    "quarantine": "result_id",
    "metrics": "batch_id",
}


def phase(tag: str, commits: int) -> list[list[Result]]:
    """``commits`` small commits of results that settle at once, plus one pending retry each."""
    return [
        [
            Result.of(f"{tag}{i}-ok").ok(),
            Result.of(f"{tag}{i}-dlq").failed(
                delay_level_when_next_consume=-1
            ),  # R5: < 0 goes to the DLQ
            Result.of(f"{tag}{i}-bad").with_(status="WHATEVER"),  # quarantined
            Result.of(f"{tag}{i}-slow", group="slow").failed(),
        ]
        for i in range(commits)
    ]


def write(lake: Lake, commits: list[list[Result]]) -> int:
    for results in commits:
        lake.write_results(results)
    return DeltaTable(lake.path("consume_results")).version()


def delta_rows(lake: Lake, table: str) -> list[str]:
    return sorted(json.dumps(row, default=str, sort_keys=True) for row in lake.rows(table))


def _rows(lake: Lake) -> list[dict[str, Any]]:
    path = maintenance_path(str(lake.root))
    return DeltaTable(path).to_pyarrow_table().to_pylist() if DeltaTable.is_deltatable(path) else []


def readers(spark: Any, lake: Lake, table: str) -> dict[str, list[Any]]:
    """The table's keys through Spark (deltars), delta-rs, pandas and, when installed, Polars."""
    path, key = lake.path(table), KEYS[table]
    seen = {
        "spark": sorted(
            r[key]
            for r in spark.read.format("deltars").option("path", path).load().select(key).collect()
        ),
        "delta-rs": sorted(DeltaTable(path).to_pyarrow_table().column(key).to_pylist()),
        "pandas": sorted(DeltaTable(path).to_pandas()[key].tolist()),
    }
    try:
        import polars as pl
    except ImportError:
        pass  # Polars comes with another change; the lead checks this reader once it is there
    else:
        seen["polars"] = sorted(pl.read_delta(path)[key].to_list())
    return seen


def test_maintenance_in_and_around_the_engine_loses_and_repeats_nothing(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#14 part 1 (SPEC B1, bad-input rule): in-engine maintenance every batch (consume_results
    included) while the engine streams small commits, then `retry-engine maintain --retention 0
    --force`, then more input: every consume result has exactly one outcome, every dead letter
    exists once, and Spark, delta-rs, pandas (and Polars) read the same rows before and after."""
    register(spark)
    lake = Lake.make(
        tmp_path / "lake",
        engine={"max_files_per_trigger": 2},
        maintenance={"every_batches": 1, "consume_results": True, "messages": True, "outcomes_retention": "30d",
                     "retry_retention": "3d", "messages_retention": "3d"},
        groups=SLOW,
    )
    first, second, third = phase("a", 6), phase("b", 3), phase("c", 2)
    # A lake months old: progress and metrics rows of 40 days ago, past the 30-day row retentions.
    long_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=40)
    ensure_progress_table(lake.path("progress"))
    append_arrow(lake.path("progress"), pa.Table.from_pylist(
        [{**dict.fromkeys(PROGRESS.names), "query_id": "old", "run_id": "old-run", "event": "progress",
          "batch_id": i, "event_time": long_ago, "recorded_at": long_ago} for i in range(3)],
        schema=PROGRESS.arrow_schema))
    ensure_table(lake.path("metrics"), METRICS.arrow_schema)
    append_arrow(lake.path("metrics"), pa.Table.from_pylist(
        [{**dict.fromkeys(METRICS.names), "batch_id": 9000, "batch_time": long_ago, "consumer_group": "slow",
          "delay_level": 3, "metric": "retry", "value": 1.0}], schema=METRICS.arrow_schema))

    # The producers' messages table, a commit per send: the engine maintains it too when asked.
    producer = Producer(lake.path("messages"))
    sent = sorted(producer.send_batch([Message("orders", f"m{i}")]).msg_ids[0] for i in range(4))

    through = write(lake, first)
    query = engine.start(spark, lake.config)
    try:
        engine.wait_until_idle(query, through_version=through)
        # A ledger and topic months old (written once the lake records batches: a fresh checkpoint
        # refuses outcomes no batch record vouches for): past the retentions, they go in the engine.
        append_arrow(lake.path("outcomes"), outcome_rows(long_ago, {"old-r1": dt.timedelta(minutes=1)}, acks=2))
        append_arrow(lake.path("retry"), retry_rows(long_ago + dt.timedelta(minutes=1), ["old-r1"], group="slow"))
        append_arrow(lake.path("messages"), message_rows(["old-m1", "old-m2"], [long_ago, long_ago]))
        wait_for(
            lambda: {r["table_name"] for r in _rows(lake) if r["trigger"] == "engine" and r["rows_expired"]}
            >= {"outcomes", "retry", "messages"},
            what="in-engine maintenance to expire the old ledger and messages",
        )
        wait_for(
            lambda: (
                {r["table_name"] for r in _rows(lake) if r["trigger"] == "engine"}
                >= {"consume_results", "outcomes", "messages"}
            ),
            what="in-engine maintenance of consume_results, messages and outcomes",
        )
        # Input committed after the engine compacted consume_results: read once, like the rest.
        through = write(lake, second)
        engine.wait_until_idle(query, through_version=through)
    finally:
        engine.stop(query)
    engine_runs = [r for r in _rows(lake) if r["trigger"] == "engine"]
    assert engine_runs and all(r["error"] is None for r in engine_runs)
    assert {r["table_name"] for r in engine_runs} <= {"consume_results", "messages", *ENGINE_TABLES, RECORD_TABLE}
    for table in ("consume_results", "messages"):
        assert any(r["files_compacted"] > 0 for r in engine_runs if r["table_name"] == table), table
    assert sorted(r["msg_id"] for r in lake.rows("messages")) == sent
    assert len(DeltaTable(lake.path("messages")).file_uris()) == 1
    # The old rows went while the engine recorded its own beside them (#14: row retention).
    expired = {r["table_name"]: r["rows_expired"] for r in engine_runs if r["rows_expired"]}
    assert expired == {"progress": 3, "metrics": 1, "outcomes": 3, "retry": 1, "messages": 2}
    progress = lake.rows("progress")
    assert progress and all(r["run_id"] != "old-run" for r in progress)
    marks = [r for r in lake.rows("metrics") if r["metric"] == EXPIRED]
    assert [r["value"] for r in marks] == [1.0] and 9000 not in {r["batch_id"] for r in lake.rows("metrics")}

    before = {table: delta_rows(lake, table) for table in KEYS}
    keys_before = {table: readers(spark, lake, table) for table in KEYS}
    for table, seen in keys_before.items():
        assert len({json.dumps(v, default=str) for v in seen.values()}) == 1, (table, seen)

    assert main(["maintain", "--lake", str(lake.root), "--retention", "0", "--force"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "consume_results" in out and "outcomes" in out and "FAILED" not in out
    command_runs = [r for r in _rows(lake) if r["trigger"] == "command"]
    assert {r["table_name"] for r in command_runs} >= {
        "consume_results",
        "outcomes",
        "dlq",
        "quarantine",
        "metrics",
    }
    assert sum(r["files_vacuumed"] for r in command_runs) > 0

    assert {table: delta_rows(lake, table) for table in KEYS} == before
    assert {table: readers(spark, lake, table) for table in KEYS} == keys_before

    write(lake, third)
    engine.run_once(spark, lake.config)

    results = [r.values["result_id"] for commit in first + second + third for r in commit]
    outcomes = Counter(r["result_id"] for r in lake.rows("outcomes"))
    assert outcomes == Counter({rid: 1 for rid in results})
    dead = Counter(r["source_result_id"] for r in lake.rows("dlq"))
    assert len(dead) == 11 and set(dead.values()) == {1}
    assert len(lake.rows("quarantine")) == 11
