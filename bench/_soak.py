"""The soak benchmark's verdict, as pure functions over per-batch series (no Spark, no I/O).

A soak holds when the engine does not age: the last tenth of its batches is
within ``limit`` (1.2x) of the first tenth on batch time and RSS, and the
files and ``_delta_log`` entries of every table stay bounded.

* :func:`window` is a tenth of the batches (at least one);
* :func:`ratio` compares the last window with the first one (median or mean);
* :func:`growth` is the largest value of the last window over the largest
  value of the first half of the run. A count that grows without bound (one
  file per batch, say) ends near twice its mid-run peak, so about 2.0; a count
  that maintenance keeps in a sawtooth has the same peaks in both, so about
  1.0. The first half, not the first tenth, is the reference because a
  bounded count first has to climb to its level.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

LIMIT = 1.2
Stat = Literal["median", "mean"]


def window(n: int) -> int:
    """Batches in the first (and the last) tenth of a run of ``n`` batches: ``n // 10``, at least 1."""
    return max(1, n // 10)


def _stat(values: Sequence[float], stat: Stat) -> float:
    return float(statistics.median(values) if stat == "median" else statistics.fmean(values))


def _divide(last: float, first: float) -> float:
    if first == 0:
        return 1.0 if last == 0 else math.inf
    return last / first


@dataclass(frozen=True)
class Ratio:
    """One measure of one run: its first and last windows and their ratio; ``limit`` None = reported only."""

    name: str
    first: float
    last: float
    ratio: float
    limit: float | None = None

    @property
    def holds(self) -> bool | None:
        return None if self.limit is None else self.ratio <= self.limit


def ratio(name: str, values: Sequence[float], *, stat: Stat = "median", limit: float | None = LIMIT) -> Ratio:
    """``stat`` of the last tenth of ``values`` over ``stat`` of the first tenth."""
    if not values:
        raise ValueError(f"{name}: no values")
    k = window(len(values))
    first, last = _stat(values[:k], stat), _stat(values[-k:], stat)
    return Ratio(name, first, last, _divide(last, first), limit)


def growth(name: str, values: Sequence[float], *, limit: float | None = LIMIT) -> Ratio:
    """Largest value of the last tenth over the largest of the first half: bounded when ``<= limit``."""
    if not values:
        raise ValueError(f"{name}: no values")
    k = window(len(values))
    first, last = max(values[: max(1, len(values) // 2)]), max(values[-k:])
    return Ratio(name, first, last, _divide(last, first), limit)


def steady(rows: Sequence[dict[str, float]], after: int = 0) -> list[dict[str, float]]:
    """The per-batch rows after batch ``after`` (the warm-up), and never batch 0 (start-up, #14 part 3)."""
    return [r for r in rows if r["batch_id"] > max(after, 0)]


def verdict(ratios: Sequence[Ratio]) -> bool:
    """True when every judged ratio holds."""
    return all(r.holds for r in ratios if r.holds is not None)


def format_side_by_side(runs: dict[str, Sequence[Ratio]]) -> str:
    """A Markdown table: one row per measure, ``last/first (first -> last)`` per run, the limit."""
    names = list(dict.fromkeys(r.name for ratios in runs.values() for r in ratios))
    by_run = {run: {r.name: r for r in ratios} for run, ratios in runs.items()}
    width = max([len(n) for n in names] + [7])
    header = f"| {'measure':{width}} | " + " | ".join(f"{'maintenance ' + run:>30}" for run in runs) + " | limit |"
    lines = [header, "|" + "|".join(["-" * (width + 2)] + ["-" * 32] * len(runs) + ["-------"]) + "|"]
    for name in names:
        cells = []
        limit = ""
        for run in runs:
            r = by_run[run].get(name)
            if r is None:
                cells.append(f"{'-':>30}")
                continue
            mark = "" if r.holds is None else (" ok" if r.holds else " NO")
            cells.append(f"{f'{r.ratio:.2f}x ({_num(r.first)} -> {_num(r.last)}){mark}':>30}")
            limit = f"<= {r.limit:g}" if r.limit is not None else limit
        lines.append(f"| {name:{width}} | " + " | ".join(cells) + f" | {limit:>5} |")
    return "\n".join(lines) + "\n"


def _num(value: float) -> str:
    if math.isinf(value):
        return "inf"
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.1f}"
