"""``retry-engine plots``: PNG charts of the engine's behaviour (B7).

* ``backlog_by_level.png``: retries pending in the schedule stage over time,
  one line per (group, delay level). From the METRICS table (running sum of
  ``retry`` - ``delivered``) when it has rows, else, or once ``run
  --discard-pending`` gave retries up, from the ledger (outcomes decided as
  ``retry`` minus retries released or given up).
* ``lateness.png``: distribution of ``delivered_at - due_at`` over the
  retries the schedule stage released (not re-drives' or resends' rows), with
  p50 and p99 marked.
* ``dead_letters_by_error_class.png``: dead letters per error class, stacked
  by group.

Each chart covers a window, the last 7 days by default (``--since``; ``all``
for the lake's whole life): a lake months old holds tens of millions of
METRICS and ledger rows, and the command reads only the window's
(:func:`read_plot_data`). The backlog's lines start at the window's start with
the backlog then, whichever way it is read.

:func:`plot_panels` draws any per-batch series as a grid of line charts (the
soak benchmark's, ``bench/bench_soak.py``).

No Spark: tables are read with delta-rs (:func:`retry_engine.ops.status.read_tables`);
matplotlib runs on the non-interactive Agg backend.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
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
from retry_engine.core.metrics import DELIVERED, EXPIRED, nearest_rank  # noqa: E402
from retry_engine.errors import ConfigError  # noqa: E402
from retry_engine.ops.status import (  # noqa: E402
    EngineTables,
    at_or_after,
    backlog,
    discarded_before,
    lateness_ms,
    pending_window,
    read_tables,
    recorded_snapshot,
    released_horizon,
    retry_fates,
    rows_since,
    schedule_releases,
    shown_group,
)
from retry_engine.schemas import DLQ, METRICS, OUTCOMES, RETRY  # noqa: E402

BACKLOG_FILE = "backlog_by_level.png"
LATENESS_FILE = "lateness.png"
DEAD_LETTERS_FILE = "dead_letters_by_error_class.png"

BacklogSource = Literal["metrics", "ledger"]
# What `plots` reads whole without a window, or where the lake's record cannot vouch for the backlog
# (plus the outcomes, for a lake without METRICS rows).
PLOT_TABLES = ("metrics", "retry", "dlq")
# A line with more points than this is drawn without a marker on each.
MARKED_POINTS = 500
DPI = 100

log = logging.getLogger(__name__)


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


# Signed changes of the backlog: at ``time``, ``delta`` retries more (or fewer) pending of (group, level).
CHANGES = pa.schema(
    [
        pa.field("time", pa.timestamp("us", tz="UTC")),
        pa.field("consumer_group", pa.string()),
        pa.field("delay_level", pa.int64()),
        pa.field("delta", pa.int64()),
    ]
)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _changes(time: Any, group: Any, level: Any, delta: Any) -> pa.Table:
    return pa.table(
        [
            pc.cast(time, CHANGES.field("time").type),
            pc.fill_null(pc.cast(group, pa.string()), ""),
            pc.cast(level, pa.int64()),
            pc.cast(delta, pa.int64()),
        ],
        schema=CHANGES,
    )


def _series_from_changes(changes: pa.Table) -> list[BacklogSeries]:
    """Running sum per (group, level) of :data:`CHANGES` rows, one point per distinct time, every line
    carried to the last change of any line (a backlog that is still held shows as held)."""
    if changes.num_rows == 0:
        return []
    summed = changes.group_by(["consumer_group", "delay_level", "time"], use_threads=False).aggregate(
        [("delta", "sum")]
    )
    groups = summed["consumer_group"].to_numpy(zero_copy_only=False).astype(str)
    levels = summed["delay_level"]
    level_null = pc.is_null(levels).to_numpy(zero_copy_only=False)
    level_key = pc.fill_null(levels, 0).to_numpy(zero_copy_only=False)
    times = pc.cast(summed["time"], pa.int64()).to_numpy(zero_copy_only=False)
    names, group_code = np.unique(groups, return_inverse=True)
    order = np.lexsort((times, level_null, level_key, group_code))
    group_code, level_key, level_null = group_code[order], level_key[order], level_null[order]
    deltas = summed["delta_sum"].to_numpy(zero_copy_only=False)[order]
    # datetimes from microseconds: 5x faster than pyarrow's to_pylist of a zoned column.
    when = [_EPOCH + dt.timedelta(microseconds=us) for us in times[order].tolist()]
    starts = np.flatnonzero(
        np.r_[True, (group_code[1:] != group_code[:-1]) | (level_key[1:] != level_key[:-1]) | (level_null[1:] != level_null[:-1])]
    )
    ends = np.r_[starts[1:], len(order)]
    series = [
        BacklogSeries(
            str(names[group_code[a]]),
            None if level_null[a] else int(level_key[a]),
            when[a:b],
            np.cumsum(deltas[a:b]).tolist(),
        )
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    ]
    end = max(s.times[-1] for s in series)
    for s in series:
        if s.times[-1] < end:
            s.times.append(end)
            s.pending.append(s.pending[-1])
    return series


def metrics_changes(metrics: pa.Table) -> pa.Table:
    """:data:`CHANGES` of METRICS rows: + ``retry`` (decided), - ``delivered`` (released), at the batch's time.
    A value that is no count (:func:`_counts`) is left out, with a warning."""
    rows = _counts(metrics.filter(pc.is_in(metrics["metric"], pa.array([OUTCOME_RETRY, DELIVERED]))))
    value = rows["value"].cast(pa.int64())
    signed = pc.if_else(pc.equal(rows["metric"], OUTCOME_RETRY), value, pc.negate(value))
    return _changes(rows["batch_time"], rows["consumer_group"], rows["delay_level"], signed)


def _counts(rows: pa.Table) -> pa.Table:
    """The METRICS ``rows`` whose value is a count: a finite whole number within int64. Another writer's
    NaN, 2.5 or 1e300 is none (a count cannot be read from it); they are left out, with one warning."""
    value = rows["value"]
    whole = pc.and_(pc.is_finite(value), pc.equal(value, pc.floor(value)))
    counts = pc.fill_null(pc.and_(whole, pc.less(pc.abs(value), 2.0**63)), False)
    left_out = rows.num_rows - (pc.sum(counts).as_py() or 0)
    if left_out:
        log.warning("plots: %d METRICS row(s) of retries decided or released hold no count (null, not finite, "
                    "not whole, or past int64); the backlog leaves them out", left_out)
    return rows.filter(counts)


def ledger_changes(
    outcomes: pa.Table,
    retry: pa.Table,
    released_before: dt.datetime | None = None,
    discarded_before: dt.datetime | None = None,
) -> pa.Table:
    """:data:`CHANGES` of the ledger: +1 when a retry is decided, -1 when it is released, or when a new
    checkpoint gave it up (``discarded_before``, see :func:`~retry_engine.ops.status.discarded_before`).

    Under a row retention (``[maintenance] outcomes_retention`` / ``retry_retention``) either row of a
    retry may be gone: a release counts only with its decision, and a decision without its release
    counts only if it is still pending by :func:`~retry_engine.ops.status.released_horizon`
    (``released_before``); what was decided and released before the tables start is no change at all.
    """
    fates = retry_fates(outcomes, retry, released_before, discarded_before)
    kept = pc.invert(fates.expired)
    decided, given_up = fates.decided.filter(kept), fates.decided.filter(fates.given_up)
    # A re-drive's row, or a release whose decision the outcomes table no longer holds.
    retry = retry.filter(
        pc.fill_null(pc.is_in(retry["msg_id"], value_set=decided["output_msg_id"].combine_chunks()), False)
    )
    marks = pa.array([discarded_before] * given_up.num_rows, pa.timestamp("us", tz="UTC"))
    return pa.concat_tables(
        [
            _changes(decided["decided_at"], decided["consumer_group"], decided["delay_level"], _ones(decided.num_rows)),
            _changes(retry["delivered_at"], retry["consumer_group"], retry["delay_level"], _ones(retry.num_rows, -1)),
            _changes(marks, given_up["consumer_group"], given_up["delay_level"], _ones(given_up.num_rows, -1)),
        ]
    )


def _ones(n: int, sign: int = 1) -> pa.Array:
    return pa.array(np.full(n, sign, dtype=np.int64))


def backlog_from_metrics(metrics: pa.Table) -> list[BacklogSeries]:
    """Backlog by (group, level) per batch: running sum of ``retry`` - ``delivered``."""
    return _series_from_changes(metrics_changes(metrics))


def backlog_from_ledger(
    outcomes: pa.Table,
    retry: pa.Table,
    released_before: dt.datetime | None = None,
    discarded_before: dt.datetime | None = None,
) -> list[BacklogSeries]:
    """Backlog by (group, level): +1 when a retry is decided, -1 when it is released (:func:`ledger_changes`)."""
    return _series_from_changes(ledger_changes(outcomes, retry, released_before, discarded_before))


def _key_sums(changes: pa.Table) -> dict[tuple[str, int | None], int]:
    summed = changes.group_by(["consumer_group", "delay_level"], use_threads=False).aggregate([("delta", "sum")])
    return {
        (g, level): int(n)
        for g, level, n in zip(
            summed["consumer_group"].to_pylist(), summed["delay_level"].to_pylist(), summed["delta_sum"].to_pylist(),
            strict=True,
        )
    }


def _seeded(window: pa.Table, since: dt.datetime, start: dict[tuple[str, int | None], int]) -> pa.Table:
    """``window`` (changes at or after ``since``) with one change at ``since`` per (group, level) that
    has a backlog then (``start``) or a change in the window: its backlog at ``since``."""
    keys = sorted({k for k, n in start.items() if n} | set(_key_sums(window)), key=lambda k: (k[0], k[1] or 0))
    seeds = _changes(
        pa.array([since] * len(keys), pa.timestamp("us", tz="UTC")),
        pa.array([k[0] for k in keys], pa.string()),
        pa.array([k[1] for k in keys], pa.int64()),
        pa.array([start.get(k, 0) for k in keys], pa.int64()),
    )
    return pa.concat_tables([seeds, window])


def backlog_since(changes: pa.Table, since: dt.datetime | None) -> list[BacklogSeries]:
    """The backlog series of every change (``changes``, from the first), drawn from ``since`` on: the
    changes before it fold into each line's backlog at ``since``."""
    if since is None:
        return _series_from_changes(changes)
    before = pc.less(changes["time"], pa.scalar(since, CHANGES.field("time").type))
    return _series_from_changes(_seeded(changes.filter(pc.invert(before)), since, _key_sums(changes.filter(before))))


def backlog_anchored(
    window: pa.Table, since: dt.datetime, pending: dict[tuple[str, int | None], int]
) -> list[BacklogSeries]:
    """The backlog series from ``since`` on, from the changes at or after it (``window``) and the backlog
    at their end (``pending``, per (group, level)): what :func:`backlog_since` draws from every change,
    without reading the changes before ``since``."""
    moved = _key_sums(window)
    start = {k: pending.get(k, 0) - moved.get(k, 0) for k in set(pending) | set(moved)}
    return _series_from_changes(_seeded(window, since, start))


def dead_letters_by_class(dlq: pa.Table) -> dict[str, dict[str, int]]:
    """``{error_class: {group: count}}``; a missing class is ``(none)``, a missing group
    :data:`~retry_engine.ops.status.NO_GROUP`."""
    result: dict[str, dict[str, int]] = {}
    for r in dlq.select(["error_class", "consumer_group"]).to_pylist():
        per_group = result.setdefault(r["error_class"] or "(none)", {})
        group = shown_group(r["consumer_group"])
        per_group[group] = per_group.get(group, 0) + 1
    return result


# -- drawing ----------------------------------------------------------------------
def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} yet", ha="center", va="center", transform=ax.transAxes, color="grey")


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


# A chart draws at most this many series (backlog lines, dead-letter groups; error classes: twice as many),
# those of the largest figures: a lake of 1,000 groups drew a legend over the whole chart (14 s, 684 MB).
MAX_SERIES = 10


def largest_series(series: list[BacklogSeries]) -> tuple[list[BacklogSeries], str]:
    """The :data:`MAX_SERIES` of the highest backlog (in their order), and what the title says of them."""
    if len(series) <= MAX_SERIES:
        return series, ""
    largest = sorted(range(len(series)), key=lambda i: -max(series[i].pending, default=0))[:MAX_SERIES]
    return [series[i] for i in sorted(largest)], f"; the {MAX_SERIES} largest of {len(series):,} series"


def plot_backlog(series: list[BacklogSeries], path: Path, since: str = "") -> int:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    drawn = 0
    series, note = largest_series(series)
    since += note
    for s in series:
        label = f"{s.consumer_group} level {s.delay_level if s.delay_level is not None else '-'}"
        naive_utc = [t.astimezone(dt.UTC).replace(tzinfo=None) for t in s.times]
        marker = "." if len(s.times) <= MARKED_POINTS else None
        ax.step(np.array(naive_utc, dtype="datetime64[ms]"), s.pending, where="post", label=label, marker=marker)
        drawn += 1
    if drawn:
        top = max(max(s.pending) for s in series)
        ax.set_ylim(bottom=0, top=max(1, top) * 1.3)
        ax.legend(loc="upper right", fontsize="small", ncol=2)
        fig.autofmt_xdate()
    else:
        _no_data(ax, "retries")
    ax.set_title(f"Schedule backlog by delay level{since}")
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("retries pending")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _save(fig, path)
    return drawn


def plot_lateness(values: np.ndarray[Any, Any], path: Path, since: str = "") -> int:
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
    ax.set_title(f"Delivery lateness (delivered_at - due_at), {values.size:,} retries{since}")
    ax.set_xlabel("ms after due time")
    ax.set_ylabel("retries")
    _save(fig, path)
    return drawn


def plot_dead_letters(by_class: dict[str, dict[str, int]], path: Path, since: str = "") -> int:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    drawn = 0
    by_class = _largest_kept(by_class)
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
    ax.set_title(f"Dead letters by error class{since}")
    ax.set_xlabel("dead letters")
    _save(fig, path)
    return drawn


OTHER_GROUPS = "other groups"
OTHER_CLASSES = "other error classes"


def _largest_kept(by_class: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """``by_class`` (error class -> group -> count) with the groups past the :data:`MAX_SERIES` largest
    merged as :data:`OTHER_GROUPS` and the classes past twice that as :data:`OTHER_CLASSES`."""
    per_group: dict[str, int] = {}
    for per in by_class.values():
        for group, n in per.items():
            per_group[group] = per_group.get(group, 0) + n
    kept_groups = set(sorted(per_group, key=lambda g: (-per_group[g], g))[:MAX_SERIES])
    kept_classes = set(sorted(by_class, key=lambda c: (-sum(by_class[c].values()), c))[: 2 * MAX_SERIES])
    merged: dict[str, dict[str, int]] = {}
    for error_class, per in by_class.items():
        into = merged.setdefault(error_class if error_class in kept_classes else OTHER_CLASSES, {})
        for group, n in per.items():
            name = group if group in kept_groups else OTHER_GROUPS
            into[name] = into.get(name, 0) + n
    return merged


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


@dataclass(frozen=True)
class PlotData:
    """What the three charts draw, from ``since`` on (None: from the lake's first batch)."""

    since: dt.datetime | None
    backlog: list[BacklogSeries]
    backlog_source: str
    lateness_ms: np.ndarray[Any, Any]
    dead_letters: dict[str, dict[str, int]]


def metrics_hold(metrics: pa.Table, since: dt.datetime | None) -> bool:
    """Whether the METRICS rows ``metrics`` hold every change from ``since`` on (None: from the lake's
    start): no maintenance removed rows after it (its :data:`~retry_engine.core.metrics.EXPIRED` rows
    say up to when it did), and there are rows at all (a native Delta engine writes none)."""
    if not metrics.num_rows:
        return False
    marks = metrics.filter(pc.equal(metrics["metric"], EXPIRED))["batch_time"]
    if not len(marks):
        return True
    return since is not None and since >= pc.max(marks).as_py()


def backlog_source(lake: EngineTables, since: dt.datetime | None) -> BacklogSource:
    """Where the backlog from ``since`` on is drawn from: the METRICS rows where they hold it
    (:func:`metrics_hold`) and no new checkpoint gave retries up (``run --discard-pending``, the lake's
    ``discarded_before``: no METRICS row counts them out, so their line would never drop), else the ledger
    (:func:`ledger_changes` drops them at the mark)."""
    return "metrics" if metrics_hold(lake.metrics, since) and lake.discarded_before is None else "ledger"


def plot_data(lake: EngineTables, since: dt.datetime | None = None) -> PlotData:
    """The charts' data from tables read whole (:func:`~retry_engine.ops.status.read_tables`). The
    backlog comes from the METRICS rows or the ledger (:func:`backlog_source`)."""
    source = backlog_source(lake, since)
    changes = (
        metrics_changes(lake.metrics)
        if source == "metrics"
        else ledger_changes(lake.outcomes, lake.retry, lake.released_before, lake.discarded_before)
    )
    retry, dlq = lake.retry, lake.dlq
    if since is not None:
        retry = at_or_after(retry, "delivered_at", since)
        dlq = at_or_after(dlq, "dead_lettered_at", since)
    return PlotData(
        since,
        backlog_since(changes, since),
        "metrics" if source == "metrics" else "outcomes+retry",
        _lateness_values(retry),
        dead_letters_by_class(dlq),
    )


def _lateness_values(retry: pa.Table) -> np.ndarray[Any, Any]:
    """The lateness of the schedule stage's releases among ``retry`` (not a re-drive's or resend's rows:
    :func:`~retry_engine.ops.status.schedule_releases`)."""
    released = schedule_releases(retry)
    return lateness_ms(released).to_numpy(zero_copy_only=False) if released.num_rows else np.array([])


def _recorded_backlog(config: EngineConfig, since: dt.datetime, now: dt.datetime) -> list[BacklogSeries] | None:
    """The backlog from ``since`` on without reading what came before it: the METRICS rows from
    ``since`` on, anchored on the retries pending at the lake's recorded batch (``status``'s own
    window, :func:`~retry_engine.ops.status.recorded_snapshot`), both of that batch. None when the
    record cannot vouch for it (see ``status``; also without METRICS rows of that batch), and when a new
    checkpoint gave retries up at or after ``since`` (no METRICS row counts them out of the window)."""
    try:
        found = recorded_snapshot(config, metrics=True)
        if found is None:
            return None
        if found.discarded_before is not None and found.discarded_before >= since:
            log.info("plots: a new checkpoint gave retries up in the window (run --discard-pending at %s); "
                     "drawing the backlog from the ledger", found.discarded_before)
            return None
        window = pending_window(config, found, now)
        if window is None:
            return None
        pending = {(e.consumer_group, e.delay_level): e.pending for e in backlog(window.pending)}
        metrics = rows_since(config, METRICS.name, "batch_time", since, table=found.tables[METRICS.name])
        if not metrics_hold(metrics, since) and metrics.num_rows:
            log.info("plots: maintenance removed METRICS rows after %s; drawing the backlog from the ledger", since)
            return None
        return backlog_anchored(metrics_changes(metrics), since, pending)
    except Exception as exc:  # noqa: BLE001 - a shortcut only: whatever stops it, every row is read
        log.warning("plots: the lake's batch record could not be used (%s: %s); reading every METRICS row",
                    type(exc).__name__, exc)
        return None


def read_plot_data(config: EngineConfig, *, since: dt.datetime | None, now: dt.datetime | None = None) -> PlotData:
    """The charts' data of the lake from ``since`` on (None: everything).

    With ``since``, only rows from ``since`` on are read (files pruned by their statistics): the retries
    released and the dead letters since then, and the METRICS rows since then, anchored on the backlog
    at the lake's recorded batch (:func:`_recorded_backlog`). Where the record cannot vouch for that
    backlog, every METRICS row (or, where they do not hold it, every outcome: :func:`backlog_source`) is
    read, as without ``since``, and what came before ``since`` folds into the lines' start: both ways draw
    the same lines.
    """
    now = now or dt.datetime.now(dt.UTC)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=dt.UTC)  # as the command line reads a time without a zone
    if since is not None:
        series = _recorded_backlog(config, since, now)
        if series is not None:
            retry = rows_since(config, RETRY.name, "delivered_at", since)
            dlq = rows_since(config, DLQ.name, "dead_lettered_at", since)
            return PlotData(
                since, series, "metrics, from the lake's batch record", _lateness_values(retry), dead_letters_by_class(dlq)
            )
    released, discarded = released_horizon(config), discarded_before(config)
    lake = replace(read_tables(config, names=PLOT_TABLES), released_before=released, discarded_before=discarded)
    if backlog_source(lake, since) == "ledger":  # no METRICS rows (a native Delta engine), expired, or given up
        given = {name: getattr(lake, name) for name in PLOT_TABLES}
        lake = replace(
            read_tables(config, names=(*PLOT_TABLES, OUTCOMES.name), given=given),
            released_before=released,
            discarded_before=discarded,
        )
    return plot_data(lake, since)


def render(lake: EngineTables | PlotData, out_dir: str | os.PathLike[str]) -> list[Plot]:
    """Write the three charts of ``lake`` into ``out_dir`` (created if missing)."""
    data = lake if isinstance(lake, PlotData) else plot_data(lake)
    folder = Path(out_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ConfigError(f"--out {folder} is a file, or inside one: give a folder for the charts",
                          code="INVALID_ARGUMENT") from None
    since = "" if data.since is None else f", since {data.since.astimezone(dt.UTC):%Y-%m-%d %H:%M} UTC"
    return [
        Plot("backlog", folder / BACKLOG_FILE, plot_backlog(data.backlog, folder / BACKLOG_FILE, since), data.backlog_source),
        Plot("lateness", folder / LATENESS_FILE, plot_lateness(data.lateness_ms, folder / LATENESS_FILE, since), "retry table"),
        Plot(
            "dead_letters",
            folder / DEAD_LETTERS_FILE,
            plot_dead_letters(data.dead_letters, folder / DEAD_LETTERS_FILE, since),
            "dlq table",
        ),
    ]


def write_plots(
    config: EngineConfig, out_dir: str | os.PathLike[str], *, since: dt.datetime | None = None
) -> list[Plot]:
    """Read the engine's tables (from ``since`` on; None: all) and write the charts into ``out_dir``."""
    return render(read_plot_data(config, since=since), out_dir)
