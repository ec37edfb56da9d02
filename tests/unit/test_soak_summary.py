"""The soak benchmark's verdict (#14 part 2): first tenth vs last tenth, and bounded growth.

Expected values are computed by hand in the comments.
"""

from __future__ import annotations

import math

import pytest

from bench._soak import LIMIT, format_side_by_side, growth, ratio, steady, verdict, window


@pytest.mark.parametrize(("n", "k"), [(0, 1), (1, 1), (9, 1), (10, 1), (25, 2), (5000, 500)])
def test_the_window_is_a_tenth_of_the_batches_and_at_least_one(n: int, k: int) -> None:
    assert window(n) == k


# 30 batches: windows of 3. First [100, 300, 110]: median 110, mean 170.
# Last [120, 130, 500]: median 130, mean 250. The middle never counts.
TIMES = [100.0, 300.0, 110.0] + [9999.0] * 24 + [120.0, 130.0, 500.0]


def test_batch_time_ratio_compares_the_last_tenth_with_the_first() -> None:
    median = ratio("batch ms", TIMES)
    assert (median.first, median.last) == (110.0, 130.0)
    assert median.ratio == pytest.approx(130 / 110)  # 1.18
    assert median.holds is True


def test_the_mean_counts_a_slow_batch_the_median_ignores() -> None:
    mean = ratio("batch ms", TIMES, stat="mean")
    assert (mean.first, mean.last) == (170.0, 250.0)
    assert mean.ratio == pytest.approx(250 / 170)  # 1.47 > 1.2
    assert mean.holds is False
    assert verdict([ratio("batch ms", TIMES), mean]) is False


def test_a_ratio_without_limit_is_reported_not_judged() -> None:
    rows = ratio("input rows/s", TIMES, limit=None)
    assert rows.holds is None
    assert verdict([rows]) is True


def test_a_count_that_grows_every_batch_is_not_bounded() -> None:
    # 1..20: first half max 10, last two [19, 20] max 20 -> 2.0.
    linear = growth("files", [float(i) for i in range(1, 21)])
    assert (linear.first, linear.last, linear.ratio) == (10.0, 20.0, 2.0)
    assert linear.holds is False


def test_a_sawtooth_kept_down_by_maintenance_is_bounded() -> None:
    # [1..5] four times: first half max 5, last two [4, 5] max 5 -> 1.0.
    saw = growth("files", [1.0, 2.0, 3.0, 4.0, 5.0] * 4)
    assert (saw.first, saw.last, saw.ratio) == (5.0, 5.0, 1.0)
    assert saw.holds is True


def test_growth_just_over_the_limit_fails() -> None:
    # 10 values: first half [10]*5 max 10, last one 13 -> 1.3.
    over = growth("log entries", [10.0] * 9 + [13.0])
    assert over.ratio == pytest.approx(1.3) and over.ratio > LIMIT
    assert over.holds is False


def test_zero_stays_bounded_and_growth_from_zero_is_infinite() -> None:
    assert growth("files", [0.0] * 10).ratio == 1.0
    assert math.isinf(growth("files", [0.0] * 9 + [3.0]).ratio)
    assert math.isinf(ratio("rss", [0.0] * 9 + [3.0]).ratio)


def test_no_values_is_an_error_naming_the_measure() -> None:
    with pytest.raises(ValueError, match="batch ms: no values"):
        ratio("batch ms", [])


def test_side_by_side_table_marks_each_run() -> None:
    text = format_side_by_side({
        "on": [growth("files", [1.0, 2.0, 3.0, 4.0, 5.0] * 4)],
        "off": [growth("files", [float(i) for i in range(1, 21)])],
    })
    row = next(line for line in text.splitlines() if line.startswith("| files"))
    assert "1.00x (5 -> 5) ok" in row and "2.00x (10 -> 20) NO" in row and "<= 1.2" in row


def test_the_warm_up_is_left_out_of_the_judged_batches() -> None:
    """A run whose batches get slower while the dedup window first fills (batches 1-300: 500 -> 800 ms),
    then flat at 800 ms: judged after the warm-up it holds (1.00x); the whole run does not (1.23x)."""
    rows = [{"batch_id": 0.0, "batch_ms": 4000.0}]
    rows += [{"batch_id": float(b), "batch_ms": 500.0 + b} for b in range(1, 301)]
    rows += [{"batch_id": float(b), "batch_ms": 800.0} for b in range(301, 3001)]
    judged = steady(rows, after=300)
    assert judged[0]["batch_id"] == 301 and len(judged) == 2700
    assert ratio("batch ms", [r["batch_ms"] for r in judged]).ratio == 1.0
    whole = steady(rows)
    assert whole[0]["batch_id"] == 1  # batch 0 is never judged
    # first tenth: batches 1-300, median 650.5; last tenth 800: 1.23x
    assert ratio("batch ms", [r["batch_ms"] for r in whole]).ratio == pytest.approx(800 / 650.5)
    assert steady(rows, after=-5) == whole
