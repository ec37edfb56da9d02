"""What the engine counts per micro-batch (B7): the rows of the METRICS table.

Spark-free: executors reduce their WORK rows to small *partials* (counts by
key, lateness samples); the driver merges every task's partials into the
METRICS rows of the batch. Counts are exact, so a reader can rebuild the
schedule backlog of a (group, level) as the running sum of ``retry`` minus
``delivered``.

Metric names (the ``metric`` column):

* one per outcome of :mod:`retry_engine.core.decide` (``acknowledged``, ``retry``,
  ``dead_letter``, ``dropped``, ``duplicate``, ``quarantined``): consume
  results of the batch with that outcome, by group and original topic;
  ``retry`` rows also by delay level (one row per level), the others with a
  null level;
* :data:`DELIVERED`: retries the schedule stage released to ``%RETRY%G`` in the
  batch, by group, original topic and delay level;
* :data:`LATENESS_METRICS`: ``delivered_at - due_at`` of those deliveries in
  milliseconds, by group (topic and level null). ``lateness_ms_min`` < 0
  would mean an early delivery (R8 says never).

Replay: every function here is a pure function of its input, so a replayed
batch yields the same rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from retry_engine.core.decide import (
    ACKNOWLEDGED,
    DEAD_LETTER,
    DROPPED,
    DUPLICATE,
    KIND_DELIVERY,
    KIND_OUTCOME,
    QUARANTINED,
    RETRY,
)
from retry_engine.schemas import METRICS

OUTCOME_METRICS: Final = (ACKNOWLEDGED, RETRY, DEAD_LETTER, DROPPED, DUPLICATE, QUARANTINED)
"""Count of consume results with that outcome (every input row has exactly one)."""

DELIVERED: Final = "delivered"
"""Count of retries released from the schedule stage to %RETRY%G, per delay level."""

LATENESS_MS_MIN: Final = "lateness_ms_min"
"""Smallest ``delivered_at - due_at`` of the batch's deliveries (ms); negative = early."""
LATENESS_MS_P50: Final = "lateness_ms_p50"
"""Median lateness (ms, nearest rank)."""
LATENESS_MS_P99: Final = "lateness_ms_p99"
"""99th-percentile lateness (ms, nearest rank: the smallest value >= 99% of samples)."""
LATENESS_MS_MAX: Final = "lateness_ms_max"
"""Largest lateness (ms)."""
LATENESS_METRICS: Final = (LATENESS_MS_MIN, LATENESS_MS_P50, LATENESS_MS_P99, LATENESS_MS_MAX)

EXPIRED: Final = "expired_before"
"""Written by maintenance (not a batch: ``batch_id`` -1) before it removes the rows older than
``batch_time`` (``[maintenance] metrics_retention``); ``value``: the rows planned to go. The table
holds every row from the latest such row's ``batch_time`` on; running sums before it cannot start at 0."""

_KEYS = ("consumer_group", "retry_topic", "delay_level", "metric")
COUNTS_SCHEMA: Final = pa.schema(
    [
        pa.field("consumer_group", pa.string()),
        pa.field("retry_topic", pa.string()),
        pa.field("delay_level", pa.int32()),
        pa.field("metric", pa.string()),
        pa.field("value", pa.int64()),
        pa.field("batch_time", METRICS["batch_time"].type),
    ]
)
"""Partial counts of one task: ``value`` rows per key, ``batch_time`` the latest row time seen."""

SAMPLES_SCHEMA: Final = pa.schema([pa.field("consumer_group", pa.string()), pa.field("lateness_ms", pa.int64())])
"""Lateness of each delivery of one task."""

_US_PER_MS = 1000


def partial_counts(work: pa.Table) -> pa.Table:
    """Counts by (group, original topic, level, metric) of WORK rows; see the module doc.

    ``batch_time`` is the micro-batch clock as the rows carry it: ``decided_at``
    of outcome rows, ``delivered_at`` of delivery rows (both are the batch's
    timestamp).
    """
    kind = work.column("kind")
    outcome = pc.equal(kind, KIND_OUTCOME)
    delivery = pc.equal(kind, KIND_DELIVERY)
    is_retry = pc.and_(outcome, pc.equal(work.column("outcome"), RETRY))
    null_level = pa.nulls(work.num_rows, pa.int32())
    keyed = pa.table(
        {
            "consumer_group": work.column("consumer_group"),
            "retry_topic": work.column("retry_topic"),
            # Only retries and deliveries are counted per level.
            "delay_level": pc.if_else(pc.or_(is_retry, delivery), work.column("delay_level"), null_level),
            "metric": pc.if_else(delivery, pa.scalar(DELIVERED), work.column("outcome")),
            "batch_time": pc.if_else(delivery, work.column("delivered_at"), work.column("decided_at")),
        }
    ).filter(pc.or_(outcome, delivery))
    if keyed.num_rows == 0:
        return COUNTS_SCHEMA.empty_table()
    grouped = keyed.group_by(list(_KEYS), use_threads=False).aggregate(
        [("metric", "count", pc.CountOptions(mode="all")), ("batch_time", "max")]
    )
    return pa.table(
        {
            **{k: grouped.column(k) for k in _KEYS},
            "value": grouped.column("metric_count").cast(pa.int64()),
            "batch_time": grouped.column("batch_time_max"),
        },
        schema=COUNTS_SCHEMA,
    )


def lateness_samples(work: pa.Table) -> pa.Table:
    """``delivered_at - due_at`` in ms of every delivery row, with its group."""
    # Only the three columns it needs are filtered: a WORK row also carries the message body.
    deliveries = work.select(["consumer_group", "delivered_at", "due_at"]).filter(
        pc.equal(work.column("kind"), KIND_DELIVERY)
    )
    late_us = pc.subtract(
        deliveries.column("delivered_at").cast(pa.int64()), deliveries.column("due_at").cast(pa.int64())
    )
    # Floor division keeps an early delivery negative (-0.5 ms -> -1 ms).
    late_ms = pa.array(np.floor_divide(late_us.to_numpy(zero_copy_only=False), _US_PER_MS), pa.int64())
    return pa.table({"consumer_group": deliveries.column("consumer_group"), "lateness_ms": late_ms}, schema=SAMPLES_SCHEMA)


def merge_counts(partials: Sequence[pa.Table]) -> pa.Table:
    """Sum the partial counts of every task (same key = same row)."""
    tables = [p for p in partials if p.num_rows]
    if not tables:
        return COUNTS_SCHEMA.empty_table()
    merged = pa.concat_tables(tables).group_by(list(_KEYS), use_threads=False).aggregate(
        [("value", "sum"), ("batch_time", "max")]
    )
    out = pa.table(
        {
            **{k: merged.column(k) for k in _KEYS},
            "value": merged.column("value_sum"),
            "batch_time": merged.column("batch_time_max"),
        },
        schema=COUNTS_SCHEMA,
    )
    return out.sort_by([(k, "ascending") for k in _KEYS])


def nearest_rank(values: np.ndarray[Any, Any], fraction: float) -> float:
    """The nearest-rank percentile of non-empty ``values`` (0 < fraction <= 1): the
    smallest observed value with at least ``fraction`` of the values at or below it.

    The one rule for lateness percentiles: the METRICS rows (whole ms), ``status``
    and ``plots`` (fractional ms, from the retry table) all use it.
    """
    ordered = np.sort(values)
    rank = int(np.ceil(fraction * len(ordered)))
    return float(ordered[max(rank, 1) - 1])


def metric_rows(
    counts: Sequence[pa.Table],
    samples: Sequence[pa.Table],
    *,
    batch_id: int,
    batch_time: dt.datetime,
) -> pa.Table:
    """The METRICS rows of one batch from every task's partials.

    ``batch_time`` is used when no partial carries a row time (a batch with no
    rows has no metrics anyway).
    """
    merged = merge_counts(counts)
    times = merged.column("batch_time")
    latest = pc.max(times).as_py() if merged.num_rows and times.null_count < merged.num_rows else None
    when = latest or batch_time
    groups: list[str | None] = []
    names: list[str] = []
    values: list[float] = []
    lateness = pa.concat_tables([s for s in samples if s.num_rows] or [SAMPLES_SCHEMA.empty_table()])
    if lateness.num_rows:
        by_group = lateness.group_by("consumer_group", use_threads=False).aggregate([("lateness_ms", "list")])
        order = np.argsort(np.array([g or "" for g in by_group.column("consumer_group").to_pylist()]), kind="stable")
        for i in order:
            group = by_group.column("consumer_group")[int(i)].as_py()
            ms = np.asarray(by_group.column("lateness_ms_list")[int(i)].values.to_numpy(), dtype=np.int64)
            for name, value in (
                (LATENESS_MS_MIN, int(ms.min())),
                (LATENESS_MS_P50, int(nearest_rank(ms, 0.5))),
                (LATENESS_MS_P99, int(nearest_rank(ms, 0.99))),
                (LATENESS_MS_MAX, int(ms.max())),
            ):
                groups.append(group)
                names.append(name)
                values.append(float(value))
    n_late = len(names)
    n = merged.num_rows + n_late
    return pa.table(
        {
            "batch_id": pa.array([batch_id] * n, pa.int64()),
            "batch_time": pa.array([when] * n, METRICS["batch_time"].type),
            "consumer_group": pa.concat_arrays(
                [merged.column("consumer_group").combine_chunks(), pa.array(groups, pa.string())]
            ),
            "retry_topic": pa.concat_arrays(
                [merged.column("retry_topic").combine_chunks(), pa.nulls(n_late, pa.string())]
            ),
            "delay_level": pa.concat_arrays(
                [merged.column("delay_level").combine_chunks(), pa.nulls(n_late, pa.int32())]
            ),
            "metric": pa.concat_arrays([merged.column("metric").combine_chunks(), pa.array(names, pa.string())]),
            "value": pa.concat_arrays(
                [merged.column("value").combine_chunks().cast(pa.float64()), pa.array(values, pa.float64())]
            ),
        },
        schema=METRICS.arrow_schema,
    )


def outcome_summary(counts: pa.Table) -> list[tuple[str, str, str, int]]:
    """(group, topic, outcome, count) of merged counts, levels summed: the per-batch log line."""
    outcomes = counts.filter(pc.is_in(counts.column("metric"), pa.array(OUTCOME_METRICS)))
    if outcomes.num_rows == 0:
        return []
    summed = outcomes.group_by(["consumer_group", "retry_topic", "metric"], use_threads=False).aggregate(
        [("value", "sum")]
    ).sort_by([("consumer_group", "ascending"), ("retry_topic", "ascending"), ("metric", "ascending")])
    return [
        (row["consumer_group"] or "", row["retry_topic"] or "", row["metric"], int(row["value_sum"]))
        for row in summed.to_pylist()
    ]


__all__ = [
    "COUNTS_SCHEMA",
    "DELIVERED",
    "LATENESS_METRICS",
    "LATENESS_MS_MAX",
    "LATENESS_MS_MIN",
    "LATENESS_MS_P50",
    "LATENESS_MS_P99",
    "OUTCOME_METRICS",
    "SAMPLES_SCHEMA",
    "lateness_samples",
    "merge_counts",
    "metric_rows",
    "nearest_rank",
    "outcome_summary",
    "partial_counts",
]
