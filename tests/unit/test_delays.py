from __future__ import annotations

import pytest

from retry_engine.core.delays import (
    DEFAULT_DELAY_LEVELS,
    ExponentialPolicy,
    LevelPolicy,
    bounded_duration_ms,
    next_level,
    parse_delay_levels,
    parse_duration_ms,
    schedule_queue_id,
)
from retry_engine.errors import DelayLevelError, DurationError


def test_r4_default_levels_parse_to_eighteen_delays() -> None:
    delays = parse_delay_levels(DEFAULT_DELAY_LEVELS)
    assert len(delays) == 18
    assert delays[:4] == (1000, 5000, 10000, 30000)
    assert delays[4] == 60_000 and delays[16] == 3_600_000 and delays[17] == 7_200_000


def test_r4_units_include_days_and_ms() -> None:
    assert parse_delay_levels("250ms 2d") == (250, 2 * 86_400_000)


@pytest.mark.parametrize("bad", ["1s 5x", "1s -5s", "1s 0s", "1s s", "1.5s", ""])
def test_r4_malformed_string_names_the_token(bad: str) -> None:
    with pytest.raises(DelayLevelError, match="INVALID_DELAY_LEVEL"):
        parse_delay_levels(bad)


def test_r4_error_names_bad_token_and_position() -> None:
    with pytest.raises(ValueError, match=r"level 2 of .*'5x'"):
        parse_delay_levels("1s 5x 10s")


def test_r5_broker_picks_three_plus_reconsume_times() -> None:
    policy = LevelPolicy.parse(DEFAULT_DELAY_LEVELS)
    assert [next_level(policy, requested=0, reconsume_times=n) for n in range(16)] == list(range(3, 19))


def test_r5_requested_level_is_used_and_clamped() -> None:
    policy = LevelPolicy.parse("1s 2s 3s")
    assert next_level(policy, requested=2, reconsume_times=9) == 2
    assert next_level(policy, requested=7, reconsume_times=0) == 3
    assert next_level(policy, requested=0, reconsume_times=5) == 3
    assert policy.delay_ms(99) == 3000


def test_r8_schedule_queue_is_level_minus_one() -> None:
    assert schedule_queue_id(1) == 0 and schedule_queue_id(18) == 17


def test_b2_exponential_policy_grows_and_caps() -> None:
    policy = ExponentialPolicy(initial_ms=100, multiplier=2.0, max_ms=1000)
    delays = [policy.delay_ms(next_level(policy, requested=0, reconsume_times=n)) for n in range(8)]
    assert delays == [100, 200, 400, 800, 1000, 1000, 1000, 1000]


def test_r4_error_messages_name_the_bad_value_and_the_valid_units() -> None:
    """R4: a malformed string is a startup error naming the bad token (STYLE: and what is valid)."""
    with pytest.raises(DelayLevelError) as info:
        parse_delay_levels(" ")
    assert str(info.value) == (
        "[INVALID_DELAY_LEVEL] delay level string is empty; expected e.g. "
        "'1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h'"
    )
    with pytest.raises(DelayLevelError) as info:
        parse_duration_ms(5, delay=True)  # type: ignore[arg-type]
    assert str(info.value) == (
        "[INVALID_DELAY_LEVEL] bad delay token 5: expected a positive integer followed by one of ms, s, m, h, d "
        "(e.g. '10s')"
    )


@pytest.mark.parametrize("bad", ["0d", "soon", "7", "-1h", 5])
def test_a_duration_that_is_no_delay_is_not_called_a_delay_token(bad: object) -> None:
    """A retention, window or timeout (`dlq expire --retention 0d`) is a duration, not a delay level's
    token: its error says so and has its own code (it said "bad delay token", INVALID_DELAY_LEVEL)."""
    for parse in (parse_duration_ms, bounded_duration_ms):
        with pytest.raises(DurationError) as info:
            parse(bad)  # type: ignore[arg-type]
        assert not isinstance(info.value, DelayLevelError)
        assert str(info.value).startswith(f"[INVALID_DURATION] bad duration {bad!r}: expected a positive integer")
