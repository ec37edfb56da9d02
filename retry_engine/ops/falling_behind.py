"""When the engine falls behind its trigger interval: one warning per episode, not one per batch.

Spark's ``ProcessingTimeExecutor`` warns "Current batch is falling behind"
after every micro-batch that took longer than the trigger interval; an
engine catching up on a backlog repeats it for every batch. An *episode*
starts with the first late batch and ends after :data:`RECOVERED_AFTER`
on-time batches in a row (so one on-time batch amid late ones does not end
it). :class:`FallingBehind` is the Spark-free rule; the progress recorder
(:mod:`retry_engine.ops.monitor`) feeds it every batch and logs what it returns.

Runs on the driver after a batch (from its progress event), never inside one;
a replayed batch reports its own duration and counts as one more batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# On-time batches in a row that end an episode.
RECOVERED_AFTER = 3

Change = Literal["started", "recovered"]


@dataclass
class Episode:
    """A run of late batches: the first one, how many, the slowest."""

    first_batch_id: int
    late_batches: int
    slowest_ms: int


class FallingBehind:
    """Tracks episodes of batches slower than ``trigger_interval_ms``; see the module docstring."""

    def __init__(self, trigger_interval_ms: int, *, recovered_after: int = RECOVERED_AFTER) -> None:
        if trigger_interval_ms < 0 or recovered_after < 1:
            raise ValueError(
                f"trigger_interval_ms={trigger_interval_ms} must be >= 0 and recovered_after={recovered_after} >= 1"
            )
        self.trigger_interval_ms = trigger_interval_ms
        self.recovered_after = recovered_after
        # The episode under way, and the last one that ended.
        self.episode: Episode | None = None
        self.ended: Episode | None = None
        self._on_time = 0
        self._warm = False

    def observe(self, batch_id: int, duration_ms: int) -> Change | None:
        """Record one finished batch; ``"started"`` or ``"recovered"`` when an episode begins or ends.

        The first batch after a start is not judged: it pays for the start itself (Python workers, the
        JVM's first run of each code path: 2-4 s here), which every `run --once` reported as falling behind.
        """
        if not self._warm:
            self._warm = True
            return None
        if duration_ms > self.trigger_interval_ms:
            self._on_time = 0
            if self.episode is None:
                self.episode = Episode(batch_id, 1, duration_ms)
                return "started"
            self.episode.late_batches += 1
            self.episode.slowest_ms = max(self.episode.slowest_ms, duration_ms)
            return None
        if self.episode is None:
            return None
        self._on_time += 1
        if self._on_time < self.recovered_after:
            return None
        self._on_time = 0
        self.ended, self.episode = self.episode, None
        return "recovered"

    def message(self, change: Change, *, query_id: str, batch_id: int, duration_ms: int) -> str:
        """The log line for ``change`` (returned by :meth:`observe` for this batch)."""
        if change == "started":
            return (
                f"engine query {query_id} is falling behind: batch {batch_id} took {duration_ms} ms, longer than "
                f"the {self.trigger_interval_ms} ms trigger interval, so due retries are released late until it "
                "catches up (said once until it recovers; `retry-engine status` shows the lateness)"
            )
        ended = self.ended
        if ended is None:
            return f"engine query {query_id} caught up at batch {batch_id}"
        return (
            f"engine query {query_id} caught up at batch {batch_id}: {ended.late_batches} late batches since "
            f"batch {ended.first_batch_id}, the slowest took {ended.slowest_ms} ms"
        )
