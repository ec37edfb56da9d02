"""Falling behind the trigger interval is reported once per episode (#13 part 6).

Spark's own executor warns after every batch slower than the trigger
interval; the engine says it once when an episode starts and once when it
ends (after RECOVERED_AFTER on-time batches in a row). B7: the lateness it
causes is what `retry-engine status` shows.
"""

from __future__ import annotations

import pytest

from retry_engine.ops.falling_behind import RECOVERED_AFTER, FallingBehind

INTERVAL = 1000


def changes(durations: list[int], *, recovered_after: int = RECOVERED_AFTER) -> list[tuple[int, str]]:
    """The changes over ``durations``, after a first batch (the start's: not judged)."""
    behind = FallingBehind(INTERVAL, recovered_after=recovered_after)
    assert behind.observe(-1, 60 * INTERVAL) is None
    return [(i, c) for i, d in enumerate(durations) if (c := behind.observe(i, d)) is not None]


def test_the_first_batch_after_a_start_is_not_judged() -> None:
    """(found by a newcomer's walk through the README) Every `run --once` warned "falling behind" on its first
    batch: it pays for the start (Python workers, the JVM's first run of each path), 2-4 s here."""
    behind = FallingBehind(INTERVAL)
    assert behind.observe(0, 4 * INTERVAL) is None and behind.observe(1, 4 * INTERVAL) == "started"


def test_a_run_of_late_batches_is_one_warning_and_one_recovery() -> None:
    late, on_time = INTERVAL + 1, INTERVAL
    durations = [on_time, late, late * 5, late, late] + [on_time] * RECOVERED_AFTER + [on_time] * 10
    assert changes(durations) == [(1, "started"), (4 + RECOVERED_AFTER, "recovered")]


def test_a_batch_exactly_as_long_as_the_interval_is_on_time() -> None:
    # Spark's executor warns only when a batch takes longer than the interval.
    assert changes([INTERVAL] * 20) == []


def test_one_on_time_batch_amid_late_ones_does_not_end_the_episode() -> None:
    late, on_time = 5000, 10
    durations = [late, on_time, late, on_time, on_time, late, late]
    assert changes(durations) == [(0, "started")]


def test_each_new_episode_warns_again() -> None:
    late, on_time = 5000, 10
    episode = [late, late] + [on_time] * 2
    assert changes(episode * 3, recovered_after=2) == [
        (0, "started"), (3, "recovered"), (4, "started"), (7, "recovered"), (8, "started"), (11, "recovered"),
    ]


def test_the_recovery_line_sums_up_the_episode() -> None:
    behind = FallingBehind(INTERVAL, recovered_after=1)
    for batch_id, duration in [(6, 5), (7, 4000), (8, 9000), (9, 2000)]:
        behind.observe(batch_id, duration)
    assert behind.observe(10, 5) == "recovered"
    line = behind.message("recovered", query_id="q", batch_id=10, duration_ms=5)
    assert "caught up at batch 10" in line and "3 late batches since batch 7" in line and "9000 ms" in line
    started = FallingBehind(INTERVAL).message("started", query_id="q", batch_id=7, duration_ms=4000)
    assert "batch 7 took 4000 ms" in started and "1000 ms trigger interval" in started


@pytest.mark.parametrize("interval, after", [(-1, 3), (1000, 0)])
def test_bad_settings_are_refused(interval: int, after: int) -> None:
    with pytest.raises(ValueError, match=f"trigger_interval_ms={interval}"):
        FallingBehind(interval, recovered_after=after)
