"""The lake's counts kept with its batch record (retry_engine.core.totals; #14, B7)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from retry_engine.core import metrics
from retry_engine.core.lease import BatchRecord, EngineState
from retry_engine.core.totals import MAX_GROUP_CHARS, MAX_KEYS, Totals, carried


def counts(*rows: tuple[str | None, str, int | None, str, int]) -> pa.Table:
    """A batch's merged counts: (group, topic, level, metric, value)."""
    names = ("consumer_group", "retry_topic", "delay_level", "metric", "value")
    return pa.Table.from_pylist(
        [dict(zip(names, r, strict=True)) | {"batch_time": None} for r in rows], schema=metrics.COUNTS_SCHEMA
    )


def test_batches_add_up_per_group_and_metric_and_lateness_is_not_counted() -> None:
    first = counts(("G", "T", 3, "retry", 2), ("G", "T", 4, "retry", 1), ("G", "T", None, "acknowledged", 5),
                   (None, "T", None, "quarantined", 1), ("G", None, None, metrics.LATENESS_MS_MAX, 900))
    second = counts(("G", "T", 3, metrics.DELIVERED, 2), ("H", "U", None, "dead_letter", 1))
    totals = Totals.empty().plus(first).plus(second)
    assert totals.counts == {("G", "retry"): 3, ("G", "acknowledged"): 5, (None, "quarantined"): 1,
                             ("G", metrics.DELIVERED): 2, ("H", "dead_letter"): 1}
    assert totals.outcomes() == {"acknowledged": 5, "dead_letter": 1, "quarantined": 1, "retry": 3}
    assert totals.decided() == {"G": 8, None: 1, "H": 1}
    assert totals.of_metric(metrics.DELIVERED) == {"G": 2}
    assert Totals.empty().plus(counts()) == Totals.empty()


def test_the_record_keeps_them_through_its_row() -> None:
    totals = Totals.of([("G", "retry", 3), (None, "quarantined", 1), ("g\u00e9\"", metrics.DELIVERED, 2)])
    assert Totals.from_json(totals.to_json()) == totals
    batch = BatchRecord("q", 7, None, {}, pending_retries=1, totals=totals)
    state = EngineState(1, None, None, False, batch)
    (row,) = state.to_arrow().to_pylist()
    assert EngineState.from_row(row).last_batch == batch
    # A row of an earlier release: no totals column, no totals.
    del row["totals"]
    assert EngineState.from_row(row).last_batch == BatchRecord("q", 7, None, {}, pending_retries=1)


@pytest.mark.parametrize(
    "text",
    [
        "not json", "{}", '{"G": 1}', "[1]", '[["G", "retry"]]', '[["G", "retry", 1, 2]]', '[[1, "retry", 1]]',
        '[["G", "made_up", 1]]', '[["G", "retry", -1]]', '[["G", "retry", 1.5]]', '[["G", "retry", true]]',
        '[["G", "retry", "3"]]', 7, b"\xff", "[" * 100_000 + "]" * 100_000,
    ],
)
def test_a_hostile_record_yields_no_totals_so_they_are_counted_from_the_tables(text: object, caplog: pytest.LogCaptureFixture) -> None:
    assert Totals.from_json(text) is None
    assert "counting from the tables instead" in caplog.text


def test_json_is_compact_and_sorted_with_the_null_group_last() -> None:
    totals = Totals.of([(None, "retry", 1), ("b", "retry", 2), ("a", "acknowledged", 3), ("b", "retry", 0)])
    assert totals.to_json() == '[["a","acknowledged",3],["b","retry",2],[null,"retry",1]]'  # a zero is not kept


def test_ever_new_or_huge_group_names_stop_the_record_keeping_totals(caplog: pytest.LogCaptureFixture) -> None:
    """Bad input: a quarantined row's group is whatever the input held, and the record is rewritten every
    batch, so totals past MAX_KEYS counts or with a group name past MAX_GROUP_CHARS are dropped (status
    then counts the tables) instead of growing every batch's record."""
    many = Totals.of([(f"g{i}", "quarantined", 1) for i in range(MAX_KEYS)])
    assert many.bounded and carried(many, counts(("g0", "T", None, "quarantined", 1))) == Totals.of(
        [(f"g{i}", "quarantined", 2 if i == 0 else 1) for i in range(MAX_KEYS)]
    )
    assert carried(many, counts(("one-more", "T", None, "quarantined", 1))) is None
    assert "stops keeping them" in caplog.text
    huge = "x" * (MAX_GROUP_CHARS + 1)
    assert carried(Totals.empty(), counts((huge, "T", None, "quarantined", 1))) is None
    assert carried(Totals.empty(), counts((huge[:-1], "T", None, "quarantined", 1))) is not None
    assert carried(None, counts(("G", "T", None, "acknowledged", 1))) is None
    assert Totals.from_json(json.dumps([[huge, "quarantined", 1]])) is None
