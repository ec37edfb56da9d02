"""``retry-engine plots``: PNG charts of the engine's behaviour (B7).

* ``backlog_by_level.png``: retries pending in the schedule stage over time,
  one line per (group, delay level). From the METRICS table (running sum of
  ``retry`` - ``delivered``) when it has rows, else from the ledger (outcomes
  decided as ``retry`` minus retries released).
* ``lateness.png``: distribution of ``delivered_at - due_at`` over every
  released retry, with p50 and p99 marked.
* ``dead_letters_by_error_class.png``: dead letters per error class, stacked
  by group.

:func:`plot_panels` draws any per-batch series as a grid of line charts (the
soak benchmark's, ``bench/bench_soak.py``).

No Spark: tables are read with delta-rs (:func:`retry_engine.ops.status.read_tables`);
matplotlib runs on the non-interactive Agg backend.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402 (the backend is chosen first)
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from retry_engine.config import EngineConfig  # noqa: E402
from retry_engine.core.decide import RETRY as OUTCOME_RETRY  # noqa: E402
from retry_engine.core.metrics import DELIVERED, nearest_rank  # noqa: E402
from retry_engine.ops.status import EngineTables, lateness_ms, read_tables  # noqa: E402

BACKLOG_FILE = "backlog_by_level.png"
LATENESS_FILE = "lateness.png"
DEAD_LETTERS_FILE = "dead_letters_by_error_class.png"

BacklogSource = Literal["metrics", "ledger"]
DPI = 100


@dataclass(frozen=True)
class Plot:
    """One written chart: where it is and how many data elements it draws (lines, bars)."""

    name: str
    path: Path
    elements: int
    source: str


# -- data: pure functions over Arrow tables -------------------------------------
@dataclass(frozen=True)
class BacklogSeries:
    consumer_group: str
    delay_level: int | None
    times: list[dt.datetime]
    pending: list[int]


def _series_from_changes(changes: list[tuple[dt.datetime, str, int | None, int]]) -> list[BacklogSeries]:
    """Running sum per (group, level) of signed changes ``(time, group, level, delta)``."""
    by_key: dict[tuple[str, int | None], list[tuple[dt.datetime, int]]] = {}
    for time, group, level, delta in changes:
        by_key.setdefault((group, level), []).append((time, delta))
    series = []
    for (group, level), points in sorted(by_key.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        points.sort(key=lambda p: p[0])
        times: list[dt.datetime] = []
        pending: list[int] = []
        total = 0
        for time, delta in points:
            total += delta
            if times and times[-1] == time:
                pending[-1] = total
            else:
                times.append(time)
                pending.append(total)
        series.append(BacklogSeries(group, level, times, pending))
    # Carry every line to the last change of any line, so a backlog that is still held shows as held.
    end = max((s.times[-1] for s in series), default=None)
    for s in series:
        if end is not None and s.times[-1] < end:
            s.times.append(end)
            s.pending.append(s.pending[-1])
    return series


def backlog_from_metrics(metrics: pa.Table) -> list[BacklogSeries]:
    """Backlog by (group, level) per batch: running sum of ``retry`` - ``delivered``."""
    rows = metrics.filter(pc.is_in(metrics["metric"], pa.array([OUTCOME_RETRY, DELIVERED])))
    changes = [
        (r["batch_time"], r["consumer_group"] or "", r["delay_level"],
         int(r["value"]) if r["metric"] == OUTCOME_RETRY else -int(r["value"]))
        for r in rows.to_pylist()
    ]
    return _series_from_changes(changes)


def backlog_from_ledger(outcomes: pa.Table, retry: pa.Table) -> list[BacklogSeries]:
    """Backlog by (group, level): +1 when a retry is decided, -1 when it is released."""
    decided = outcomes.filter(pc.equal(outcomes["outcome"], OUTCOME_RETRY))
    changes = [
        (r["decided_at"], r["consumer_group"] or "", r["delay_level"], 1)
        for r in decided.select(["decided_at", "consumer_group", "delay_level"]).to_pylist()
    ]
    changes += [
        (r["delivered_at"], r["consumer_group"] or "", r["delay_level"], -1)
        for r in retry.select(["delivered_at", "consumer_group", "delay_level"]).to_pylist()
    ]
    return _series_from_changes(changes)


def dead_letters_by_class(dlq: pa.Table) -> dict[str, dict[str, int]]:
    """``{error_class: {group: count}}``; a missing class is ``(none)``."""
    result: dict[str, dict[str, int]] = {}
    for r in dlq.select(["error_class", "consumer_group"]).to_pylist():
        per_group = result.setdefault(r["error_class"] or "(none)", {})
        per_group[r["consumer_group"]] = per_group.get(r["consumer_group"], 0) + 1
    return result


# -- drawing ----------------------------------------------------------------------
def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", transform=ax.transAxes, color="grey")


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def plot_backlog(series: list[BacklogSeries], path: Path) -> int:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    drawn = 0
    for s in series:
        label = f"{s.consumer_group} level {s.delay_level if s.delay_level is not None else '-'}"
        naive_utc = [t.astimezone(dt.UTC).replace(tzinfo=None) for t in s.times]
        ax.step(np.array(naive_utc, dtype="datetime64[ms]"), s.pending, where="post", label=label, marker=".")
        drawn += 1
    if drawn:
        top = max(max(s.pending) for s in series)
        ax.set_ylim(bottom=0, top=max(1, top) * 1.3)
        ax.legend(loc="upper right", fontsize="small", ncol=2)
        fig.autofmt_xdate()
    else:
        _no_data(ax, "retries")
    ax.set_title("Schedule backlog by delay level")
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("retries pending")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _save(fig, path)
    return drawn


def plot_lateness(values: np.ndarray[Any, Any], path: Path) -> int:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    drawn = 0
    if values.size:
        heights, _, _ = ax.hist(values, bins=min(30, max(5, values.size // 2)), color="tab:blue", alpha=0.8)
        drawn = int(np.count_nonzero(heights))
        for q, style in ((50, "--"), (99, ":")):
            mark = nearest_rank(values, q / 100)
            ax.axvline(mark, color="tab:red", linestyle=style, label=f"p{q} = {mark:,.0f} ms")
        ax.legend(loc="upper right")
        ax.ticklabel_format(axis="x", style="plain", useOffset=False)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        _no_data(ax, "released retries")
    ax.set_title(f"Delivery lateness (delivered_at - due_at), {values.size:,} retries")
    ax.set_xlabel("ms after due time")
    ax.set_ylabel("retries")
    _save(fig, path)
    return drawn


def plot_dead_letters(by_class: dict[str, dict[str, int]], path: Path) -> int:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    drawn = 0
    classes = sorted(by_class, key=lambda c: (-sum(by_class[c].values()), c))
    groups = sorted({g for per in by_class.values() for g in per})
    left = np.zeros(len(classes))
    for group in groups:
        counts = np.array([by_class[c].get(group, 0) for c in classes], dtype=float)
        bars = ax.barh(classes, counts, left=left, label=group)
        drawn += sum(1 for b in bars if b.get_width() > 0)
        left += counts
    if drawn:
        ax.invert_yaxis()
        ax.set_xlim(0, left.max() * 1.12)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(title="group", loc="lower right", fontsize="small")
        for y, total in enumerate(left):
            ax.text(total, y, f" {int(total)}", va="center")
    else:
        _no_data(ax, "dead letters")
    ax.set_title("Dead letters by error class")
    ax.set_xlabel("dead letters")
    _save(fig, path)
    return drawn


@dataclass(frozen=True)
class Line:
    """One series of a panel: ``y`` over ``x`` (same length)."""

    label: str
    x: Sequence[float]
    y: Sequence[float]


@dataclass(frozen=True)
class Panel:
    """One chart of :func:`plot_panels`."""

    title: str
    ylabel: str
    lines: Sequence[Line]


def plot_panels(panels: Sequence[Panel], path: Path, *, title: str, xlabel: str = "batch", columns: int = 2) -> int:
    """Line charts of ``panels`` in a grid of ``columns``, under ``title``; returns the lines drawn."""
    rows = max(1, -(-len(panels) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.4 * rows), squeeze=False)
    drawn = 0
    for ax, panel in zip(axes.flat, panels, strict=False):
        for line in panel.lines:
            if len(line.x):
                ax.plot(line.x, line.y, label=line.label, linewidth=1)
                drawn += 1
        if any(len(line.x) for line in panel.lines):
            ax.legend(loc="best", fontsize="small")
            ax.set_ylim(bottom=0)
        else:
            _no_data(ax, "samples")
        ax.set_title(panel.title, fontsize="medium")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel.ylabel)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    _save(fig, path)
    return drawn


def render(lake: EngineTables, out_dir: str | os.PathLike[str]) -> list[Plot]:
    """Write the three charts of ``lake`` into ``out_dir`` (created if missing)."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    source: BacklogSource = "metrics" if lake.metrics.num_rows else "ledger"
    series = backlog_from_metrics(lake.metrics) if source == "metrics" else backlog_from_ledger(lake.outcomes, lake.retry)
    values = lateness_ms(lake.retry).to_numpy(zero_copy_only=False) if lake.retry.num_rows else np.array([])
    plots = [
        Plot("backlog", folder / BACKLOG_FILE, plot_backlog(series, folder / BACKLOG_FILE), "metrics" if source == "metrics" else "outcomes+retry"),
        Plot("lateness", folder / LATENESS_FILE, plot_lateness(values, folder / LATENESS_FILE), "retry table"),
        Plot(
            "dead_letters",
            folder / DEAD_LETTERS_FILE,
            plot_dead_letters(dead_letters_by_class(lake.dlq), folder / DEAD_LETTERS_FILE),
            "dlq table",
        ),
    ]
    return plots


def write_plots(config: EngineConfig, out_dir: str | os.PathLike[str]) -> list[Plot]:
    """Read the engine's tables and write the charts into ``out_dir``."""
    return render(read_tables(config), out_dir)
