"""What a lake has decided and released since its first batch: counts per group, kept with the batch record.

``retry-engine status`` shows all-time counts (outcomes, results decided and
retries released per group). Counting them from the outcome and retry tables
reads every row the lake ever wrote, which grows with the lake's age. The
engine already counts every batch (:mod:`retry_engine.core.metrics`), so it
adds each recorded batch's counts to the lake's :class:`Totals`, kept in the
batch record (:class:`~retry_engine.core.lease.BatchRecord`, the
``engine_state`` row) next to ``pending_retries``.

Replay: the record is written once per batch (a replayed batch the lake
already records is not recorded again), so a replay never adds twice. A lake
recorded by a release without totals gets them counted from its tables at the
engine's next start (:func:`retry_engine.ops.status.lake_counts`). Totals past
:data:`MAX_KEYS` or :data:`MAX_GROUP_CHARS` are not kept (:func:`carried`).

Spark-free and pure (but for a warning logged).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from retry_engine.core.metrics import DELIVERED, OUTCOME_METRICS

log = logging.getLogger(__name__)

COUNTED: Final = (*OUTCOME_METRICS, DELIVERED)
"""The metrics totals keep: an outcome per consume result, and each retry released."""

MAX_KEYS: Final = 10_000
"""Most (group, metric) counts the record keeps; the record is rewritten every batch."""
MAX_GROUP_CHARS: Final = 1_024
"""Longest group name the record keeps (a quarantined row's group is whatever the input held)."""

Key = tuple[str | None, str]


@dataclass(frozen=True)
class Totals:
    """Counts per (consumer group, metric of :data:`COUNTED`); a null group is a result without one."""

    counts: Mapping[Key, int]

    @classmethod
    def empty(cls) -> Totals:
        return cls({})

    @classmethod
    def of(cls, rows: Iterable[tuple[str | None, str, int]]) -> Totals:
        counts: dict[Key, int] = {}
        for group, metric, value in rows:
            if value:
                counts[(group, metric)] = counts.get((group, metric), 0) + int(value)
        return cls(counts)

    def plus(self, batch: pa.Table) -> Totals:
        """These totals and one batch's merged counts (:data:`~retry_engine.core.metrics.COUNTS_SCHEMA`)."""
        added = [
            (group, metric, int(value))
            for group, metric, value in zip(
                batch.column("consumer_group").to_pylist(),
                batch.column("metric").to_pylist(),
                batch.column("value").to_pylist(),
                strict=True,
            )
            if metric in COUNTED
        ]
        if not added:
            return self
        return Totals.of([*((g, m, n) for (g, m), n in self.counts.items()), *added])

    @property
    def bounded(self) -> bool:
        """Whether the record may keep these totals: at most :data:`MAX_KEYS` counts, no group name
        longer than :data:`MAX_GROUP_CHARS`. Input with ever new or huge group names (quarantined, or
        a producer's bug) would otherwise make every batch's record bigger."""
        return len(self.counts) <= MAX_KEYS and all(
            group is None or len(group) <= MAX_GROUP_CHARS for group, _ in self.counts
        )

    def of_metric(self, metric: str) -> dict[str | None, int]:
        """``metric``'s count per group."""
        return {group: n for (group, m), n in self.counts.items() if m == metric}

    def outcomes(self) -> dict[str, int]:
        """Consume results per outcome, every group together (outcomes never seen left out)."""
        return dict(sorted(self._outcomes_by(lambda key: key[1]).items()))

    def decided(self) -> dict[str | None, int]:
        """Consume results decided per group (each has exactly one outcome)."""
        return self._outcomes_by(lambda key: key[0])

    def _outcomes_by(self, part: Callable[[Key], Any]) -> dict[Any, int]:
        summed: dict[Any, int] = {}
        for key, n in self.counts.items():
            if key[1] in OUTCOME_METRICS:
                summed[part(key)] = summed.get(part(key), 0) + n
        return summed

    def to_json(self) -> str:
        rows = sorted(self.counts.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or "", kv[0][1]))
        return json.dumps([[group, metric, n] for (group, metric), n in rows], separators=(",", ":"))

    @classmethod
    def from_json(cls, text: Any) -> Totals | None:
        """The totals ``text`` holds, or None (with a warning) when it is not what :meth:`to_json` writes:
        whoever reads them then counts from the tables instead."""
        if text is None:
            return None
        try:
            rows = json.loads(text)
            if not isinstance(rows, list):
                raise ValueError("not a list")
            parsed = []
            for row in rows:
                if not (isinstance(row, list) and len(row) == 3):
                    raise ValueError(f"row {row!r} is not [group, metric, count]")
                group, metric, n = row
                if not (group is None or isinstance(group, str)) or metric not in COUNTED:
                    raise ValueError(f"row {row!r}: group must be text or null, metric one of {list(COUNTED)}")
                if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                    raise ValueError(f"row {row!r}: the count must be a whole number >= 0")
                parsed.append((group, metric, n))
        except (TypeError, ValueError, RecursionError) as exc:
            log.warning("the lake's recorded totals are unreadable (%s); counting from the tables instead", exc)
            return None
        totals = cls.of(parsed)
        if not totals.bounded:
            log.warning("the lake's recorded totals are beyond the record's bounds; counting from the tables instead")
            return None
        return totals


def carried(totals: Totals | None, batch: pa.Table) -> Totals | None:
    """``totals`` and one batch's counts, for the batch's record; None when ``totals`` is (the lake's
    counts are not known) or the sum is not :attr:`~Totals.bounded` (then `status` counts the tables)."""
    if totals is None:
        return None
    added = totals.plus(batch)
    if not added.bounded:
        log.warning(
            "the lake's totals passed %d group and metric counts or a group name of %d characters; the batch "
            "record stops keeping them, and `status` counts the tables", MAX_KEYS, MAX_GROUP_CHARS,
        )
        return None
    return added


__all__ = ["COUNTED", "MAX_GROUP_CHARS", "MAX_KEYS", "Totals", "carried"]
