"""Metric derivation (B7) on plain Arrow: counts by group, topic and level; lateness percentiles."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from retry_engine.config import parse_config
from retry_engine.core import metrics
from retry_engine.schemas import METRICS
from tests.builders import T0, Result, delivered, work_rows

NOW = T0 + dt.timedelta(seconds=2)


def _rows(table: pa.Table) -> dict[tuple[object, ...], float]:
    return {(r["consumer_group"], r["retry_topic"], r["delay_level"], r["metric"]): r["value"] for r in table.to_pylist()}


def _mixed() -> pa.Table:
    config = parse_config({"engine": {"auto_create_groups": False}, "groups": {"G": {}, "H": {}}})
    return work_rows(
        [
            Result.of().ok(),
            Result.of().ok(),
            Result.of(topic="pay").ok(),
            Result.of().failed(),  # level 3
            Result.of().failed(reconsume_times=2),  # level 5
            Result.of().failed(reconsume_times=2),
            Result.of(group="H").failed(),
            Result.of().failed(delay_level_when_next_consume=-1),
            Result.of().failed(message_model="BROADCASTING"),
            Result.of(group="ghost").failed(),
            Result.of().with_(status="WHAT"),
        ],
        batch_ts=NOW,
        config=config,
    )


def test_outcomes_by_group_topic_and_retry_level() -> None:
    work = _mixed()
    rows = _rows(metrics.metric_rows([metrics.partial_counts(work)], [], batch_id=3, batch_time=NOW))
    assert rows == {
        ("G", "orders", None, "acknowledged"): 2,
        ("G", "pay", None, "acknowledged"): 1,
        ("G", "orders", 3, "retry"): 1,
        ("G", "orders", 5, "retry"): 2,
        ("H", "orders", 3, "retry"): 1,
        ("G", "orders", None, "dead_letter"): 1,
        ("G", "orders", None, "dropped"): 1,
        ("ghost", "orders", None, "quarantined"): 1,
        ("G", "orders", None, "quarantined"): 1,
    }
    assert sum(rows.values()) == work.num_rows


def test_partials_of_several_tasks_sum_to_the_whole() -> None:
    work = _mixed()
    whole = metrics.metric_rows([metrics.partial_counts(work)], [], batch_id=1, batch_time=NOW)
    parts = [metrics.partial_counts(work.slice(0, 4)), metrics.partial_counts(work.slice(4))]
    split = metrics.metric_rows(parts, [], batch_id=1, batch_time=NOW)
    assert _rows(split) == _rows(whole)
    assert split.schema == METRICS.arrow_schema
    assert set(split.column("batch_time").to_pylist()) == {NOW}  # the rows' clock, not the fallback
    assert set(split.column("batch_id").to_pylist()) == {1}


def test_deliveries_per_level_and_lateness_per_group() -> None:
    work = _mixed()
    out = delivered(work, late_ms=[0, 10, 250, 40])  # G:3, G:5, G:5, H:3
    released_at = max(out.column("delivered_at").to_pylist())
    table = metrics.metric_rows([metrics.partial_counts(out)], [metrics.lateness_samples(out)], batch_id=9,
                                batch_time=NOW)
    rows = _rows(table)
    assert rows == {
        ("G", "orders", 3, "delivered"): 1,
        ("G", "orders", 5, "delivered"): 2,
        ("H", "orders", 3, "delivered"): 1,
        ("G", None, None, "lateness_ms_min"): 0,
        ("G", None, None, "lateness_ms_p50"): 10,
        ("G", None, None, "lateness_ms_p99"): 250,
        ("G", None, None, "lateness_ms_max"): 250,
        ("H", None, None, "lateness_ms_min"): 40,
        ("H", None, None, "lateness_ms_p50"): 40,
        ("H", None, None, "lateness_ms_p99"): 40,
        ("H", None, None, "lateness_ms_max"): 40,
    }
    assert set(table.column("batch_time").to_pylist()) == {released_at}


def test_early_delivery_shows_as_negative_lateness() -> None:
    out = delivered(work_rows([Result.of().failed()], batch_ts=NOW), late_ms=[-1])
    out = out.set_column(out.schema.get_field_index("delivered_at"), "delivered_at",
                         pa.array([out.column("due_at")[0].as_py() - dt.timedelta(microseconds=300)],
                                  pa.timestamp("us", tz="UTC")))
    (sample,) = metrics.lateness_samples(out).column("lateness_ms").to_pylist()
    assert sample == -1  # floor, so a sub-millisecond early delivery is still < 0


@pytest.mark.parametrize(("fraction", "expected"), [(0.5, 50), (0.99, 99), (1.0, 100), (0.001, 1)])
def test_nearest_rank(fraction: float, expected: int) -> None:
    assert metrics.nearest_rank(np.arange(1, 101), fraction) == expected


def test_no_rows_no_metrics() -> None:
    empty = work_rows([Result.of().ok()], batch_ts=NOW).slice(0, 0)
    assert metrics.partial_counts(empty).num_rows == 0
    assert metrics.metric_rows([metrics.partial_counts(empty)], [metrics.lateness_samples(empty)], batch_id=0,
                               batch_time=NOW).num_rows == 0


def test_outcome_summary_sums_levels() -> None:
    merged = metrics.merge_counts([metrics.partial_counts(_mixed())])
    summary = metrics.outcome_summary(merged)
    assert ("G", "orders", "retry", 3) in summary
    assert sum(n for *_, n in summary) == _mixed().num_rows


# -- issue #16: mutations the tests above let through ----------------------------------------------------------


def test_b7_the_batch_time_of_the_rows_wins_over_the_fallback() -> None:
    """B7: outcome rows carry the micro-batch clock (decided_at); the batch_time argument is only a fallback."""
    work = work_rows([Result.of().failed()], batch_ts=NOW)
    later = NOW + dt.timedelta(hours=1)
    table = metrics.metric_rows([metrics.partial_counts(work)], [], batch_id=4, batch_time=later)
    assert table.to_pylist() == [
        {"batch_id": 4, "batch_time": NOW, "consumer_group": "G", "retry_topic": "orders", "delay_level": 3,
         "metric": "retry", "value": 1.0}
    ]


def test_b7_lateness_rows_come_in_group_order() -> None:
    """B7: the METRICS rows of a batch are in a stable order (a replay writes the same rows in the same order)."""
    samples = pa.table({"consumer_group": ["b", "a", "b"], "lateness_ms": [5, 7, 9]}, schema=metrics.SAMPLES_SCHEMA)
    table = metrics.metric_rows([], [samples], batch_id=1, batch_time=NOW)
    assert [(r["consumer_group"], r["metric"], r["value"]) for r in table.to_pylist()] == [
        ("a", "lateness_ms_min", 7.0), ("a", "lateness_ms_p50", 7.0), ("a", "lateness_ms_p99", 7.0),
        ("a", "lateness_ms_max", 7.0),
        ("b", "lateness_ms_min", 5.0), ("b", "lateness_ms_p50", 5.0), ("b", "lateness_ms_p99", 9.0),
        ("b", "lateness_ms_max", 9.0),
    ]


def test_b7_outcome_summary_of_one_row_and_of_rows_without_group_or_topic() -> None:
    """B7 (the per-batch log line): a missing group or topic is shown empty, one row is still a row."""
    one = metrics.merge_counts([metrics.partial_counts(work_rows([Result.of().failed()], batch_ts=NOW))])
    assert metrics.outcome_summary(one) == [("G", "orders", "retry", 1)]
    bad = work_rows([Result.of().with_(consumer_group=None), Result.of().with_(topic=None)], batch_ts=NOW)
    assert metrics.outcome_summary(metrics.merge_counts([metrics.partial_counts(bad)])) == [
        ("G", "", "quarantined", 1), ("", "orders", "quarantined", 1)]  # sorted, a missing value last
