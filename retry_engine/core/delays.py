"""Delay levels and backoff policies (R4, R5, B2).

Pure functions over plain values: which level a failure gets and how long
that level waits. No Spark here.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Protocol

from retry_engine.errors import DelayLevelError, DurationError

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
# RocketMQ's broker picks ``3 + reconsumeTimes`` when the consumer leaves the level at 0:
# the first retry waits 10 s, skipping the 1 s and 5 s levels meant for delayed messages.
ROCKETMQ_FIRST_RETRY_LEVEL = 3

UNIT_MILLIS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_TOKEN = re.compile(r"([1-9][0-9]*)(ms|s|m|h|d)")
# A hundred years: every setting's duration is far below, and a time plus it stays a time.
MAX_DURATION_MS = 36_500 * UNIT_MILLIS["d"]
# Longer than any two dates of the calendar (years 1-9999) are apart: a delay past it ends past it.
CALENDAR_MS = 10_000 * 366 * UNIT_MILLIS["d"]


def parse_duration_ms(token: str, *, delay: bool = False) -> int:
    """``"30s"`` -> 30000. Units: ms, s, m, h, d; the number is a positive integer.

    A bad token is :class:`DurationError` (``INVALID_DURATION``); with ``delay`` (a delay level's
    token, R4) :class:`DelayLevelError` (``INVALID_DELAY_LEVEL``)."""
    match = _TOKEN.fullmatch(token) if isinstance(token, str) else None
    if match is None:
        error, what = (DelayLevelError, "delay token") if delay else (DurationError, "duration")
        raise error(
            f"bad {what} {token!r}: expected a positive integer followed by one of "
            f"{', '.join(UNIT_MILLIS)} (e.g. '10s')"
        )
    return int(match.group(1)) * UNIT_MILLIS[match.group(2)]


def bounded_duration_ms(token: str) -> int:
    """:func:`parse_duration_ms` of a setting (a window, a timeout, a retention): at most
    :data:`MAX_DURATION_MS`, past which a time plus it is no time. (A delay level may be longer: a due
    time past the calendar quarantines its row, DUE_AT_OUT_OF_RANGE.)"""
    ms = parse_duration_ms(token)
    if ms > MAX_DURATION_MS:
        raise DurationError(
            f"duration {token!r} is longer than {MAX_DURATION_MS // UNIT_MILLIS['d']}d, more than any window, "
            "timeout or retention can mean"
        )
    return ms


def parse_delay_levels(levels: str) -> tuple[int, ...]:
    """Parse a RocketMQ ``messageDelayLevel`` string into delays in ms; level i is item i-1.

    Unlike RocketMQ (which logs and carries on with a partial table), a bad
    token is an error naming the token and its position.
    """
    tokens = levels.split()
    if not tokens:
        raise DelayLevelError("delay level string is empty; expected e.g. " + repr(DEFAULT_DELAY_LEVELS))
    delays = []
    for position, token in enumerate(tokens, start=1):
        try:
            delays.append(parse_duration_ms(token, delay=True))
        except DelayLevelError as exc:
            raise DelayLevelError(f"level {position} of {levels!r}: {exc.args[0].split('] ', 1)[1]}") from None
    return tuple(delays)


def schedule_queue_id(level: int) -> int:
    """``ScheduleMessageService.delayLevel2QueueId``: one schedule queue per level."""
    return level - 1


class BackoffPolicy(Protocol):
    """How a group turns a delay level into a wait."""

    @property
    def first_level(self) -> int:
        """Level of the first retry when the consumer leaves the choice to the broker."""

    def clamp(self, level: int) -> int:
        """The level actually used for a requested positive level."""

    def delay_ms(self, level: int) -> int:
        """Delay of a (clamped) level in milliseconds."""


@dataclass(frozen=True)
class LevelPolicy:
    """RocketMQ 4's fixed levels (or a custom list): level i waits ``delays[i-1]``."""

    delays: tuple[int, ...]
    first_level: int = ROCKETMQ_FIRST_RETRY_LEVEL

    @classmethod
    def parse(cls, levels: str, *, first_level: int = ROCKETMQ_FIRST_RETRY_LEVEL) -> LevelPolicy:
        return cls(parse_delay_levels(levels), first_level)

    @property
    def max_level(self) -> int:
        return len(self.delays)

    def clamp(self, level: int) -> int:
        # CommitLog.putMessage: a level above the highest is set to the highest (R5).
        return min(level, self.max_level)

    def delay_ms(self, level: int) -> int:
        return self.delays[self.clamp(level) - 1]


@dataclass(frozen=True)
class ExponentialPolicy:
    """RocketMQ 5 / Pulsar style: level n waits ``min(initial * multiplier**(n-1), max)``."""

    initial_ms: int
    multiplier: float
    max_ms: int
    first_level: int = 1

    def __post_init__(self) -> None:
        # A delay past the calendar is one: its due time quarantines the row (DUE_AT_OUT_OF_RANGE).
        # Held at that bound, the float arithmetic below cannot overflow (10**400 days raised
        # OverflowError for every failure of the group, even its first short retry).
        object.__setattr__(self, "initial_ms", min(self.initial_ms, CALENDAR_MS))
        object.__setattr__(self, "max_ms", min(self.max_ms, CALENDAR_MS))

    def clamp(self, level: int) -> int:
        # Past the level where the cap is reached every level waits max_ms; keep the
        # number bounded so it stays a small int in the tables.
        return min(level, self.cap_level)

    @property
    def cap_level(self) -> int:
        if self.multiplier <= 1 or self.initial_ms >= self.max_ms:
            return 1
        return 1 + math.ceil(math.log(self.max_ms / self.initial_ms, self.multiplier))

    def delay_ms(self, level: int) -> int:
        raw = self.initial_ms * self.multiplier ** (self.clamp(level) - 1)
        return int(min(raw, self.max_ms))


def next_level(policy: BackoffPolicy, *, requested: int, reconsume_times: int) -> int:
    """The level of the next retry, for a failure that is not dead-lettered (R5).

    ``requested > 0`` is used as given; 0 lets the broker choose
    ``first_level + reconsume_times``. The result is clamped to the policy's top.
    Negative levels never get here: they mean "dead-letter now".
    """
    level = requested if requested > 0 else policy.first_level + reconsume_times
    return policy.clamp(level)
