"""Where an engine's start-up time goes, from its process start to its first committed batch (#14 part 3).

``retry-engine run`` times each step of start-up with a :class:`Startup` and,
once the first micro-batch commits, logs one line that says where the time
went::

    start-up: first batch committed 13.9 s after the process started: process and imports 0.7 s,
    spark session 6.1 s, lease 0.0 s, table layout 0.0 s, resume point 0.0 s, query start 2.1 s,
    first batch 5.0 s (planning 0.3 s, execution 4.5 s, commit 0.2 s; 40,000 consume results)

The first batch's parts are Spark's own ``durationMs`` of that batch:
planning is ``latestOffset`` + ``getBatch`` + ``queryPlanning``, execution
``addBatch`` (the Python workers start there), commit ``walCommit`` +
``commitOffsets``. ``bench/bench_startup.py`` reads the line.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

log = logging.getLogger(__name__)

LINE_PREFIX = "start-up: "
# Spark's durationMs keys of one micro-batch, by the part of the first batch they belong to.
BATCH_PARTS = {
    "planning": ("latestOffset", "getBatch", "queryPlanning"),
    "execution": ("addBatch",),
    "commit": ("walCommit", "commitOffsets"),
}


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``), or None where that is not known."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            # Field 22, after the parenthesised command name (which may hold spaces).
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as uptime:
            up_s = float(uptime.read().split()[0])
        return max(0.0, up_s - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class Startup:
    """The timed steps of one engine start, in order, and the summary of its first batch."""

    def __init__(self) -> None:
        self._began = time.monotonic()
        age = process_age_s()
        # What ran before this object existed: the interpreter, imports, config loading.
        self._before_s = age or 0.0
        self.steps: list[tuple[str, float]] = [] if age is None else [("process and imports", age)]
        self._lock = threading.Lock()
        self._reported = False

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self.steps.append((name, time.monotonic() - began))

    def elapsed_s(self) -> float:
        """Seconds since the process started (or since this object, where the process start is unknown)."""
        return self._before_s + time.monotonic() - self._began

    def first_batch(self, durations_ms: Mapping[str, int], input_rows: int | None) -> str | None:
        """The summary line for the first committed batch; None after the first call."""
        with self._lock:
            if self._reported:
                return None
            self._reported = True
            steps = list(self.steps)
        total = self.elapsed_s()
        parts = ", ".join(
            f"{part} {sum(int(durations_ms.get(k, 0)) for k in keys) / 1000:.1f} s"
            for part, keys in BATCH_PARTS.items()
        )
        rows = "" if input_rows is None else f"; {input_rows:,} consume results"
        done = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in steps)
        batch_s = int(durations_ms.get("triggerExecution", 0)) / 1000
        return (
            f"{LINE_PREFIX}first batch committed {total:.1f} s after the process started: {done}, "
            f"first batch {batch_s:.1f} s ({parts}{rows})"
        )
