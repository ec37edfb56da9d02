"""Re-drive tasks: which re-drives run, what they moved, and cancelling one from another process.

A re-drive run writes events to the ``redrive_tasks`` Delta table (append
only, so it works on object storage and across machines): ``started`` (with
what it plans to move), ``alive`` heartbeats at most every
:data:`HEARTBEAT_S` seconds, and one end event: ``finished``, ``stopped``
(an error or Ctrl-C interrupted it) or ``cancelled``. ``retry-engine redrive
cancel ID`` appends a ``cancel`` event naming each running run of that
re-drive; a run looks for one before each chunk and while it waits for the
rate limit, and stops there: the chunks it moved stay moved (they are in the
audit table), nothing else is claimed.

What moved is never read from these events: the audit table is the truth
(see :mod:`retry_engine.ops.audit`); the events add the run's state, its planned
total and who cancelled it. A run killed without a chance to write its end
event shows ``interrupted`` once it has been silent for :data:`STALE_AFTER_S`.
No Spark here.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from retry_engine.config import EngineConfig
from retry_engine.core.names import FUTURE_EVENTS
from retry_engine.delta.tables import append_arrow, open_table, pyarrow_dataset, require_columns
from retry_engine.errors import RedriveError
from retry_engine.ops.audit import MOVED, read_audit, redrive_rows
from retry_engine.ops.terms import TASK_STATES, TaskState
from retry_engine.schemas import REDRIVE_TASKS

log = logging.getLogger(__name__)

TASKS_TABLE = "redrive_tasks"
TaskEvent = Literal["started", "alive", "finished", "stopped", "cancel", "cancelled"]
State = TaskState
STATES: tuple[State, ...] = TASK_STATES
# A run writes a heartbeat at most this often (one small commit), so a listing can tell a
# run that is still going from one that was killed.
HEARTBEAT_S = 15.0
# A run silent for this long (8 missed heartbeats: a slow chunk on object storage fits) was killed.
STALE_AFTER_S = 120.0
# How often a run waiting for the rate limit looks for a cancel.
CANCEL_POLL_S = 2.0

TASK_COLUMNS = (
    "redrive_id",
    "state",
    "target",
    "moved",
    "total",
    "operator",
    "started_at",
    "ended_at",
    "selection",
    "detail",
)


class Cancelled(Exception):
    """Raised inside a run when a ``cancel`` event names it; the re-drive stops cleanly."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _host() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def read_events(config: EngineConfig, redrive_id: str | None = None) -> pa.Table:
    """The task events (of one re-drive when ``redrive_id`` is given); empty when there are none."""
    table = open_table(config.table_path(TASKS_TABLE))
    if table is None:
        return REDRIVE_TASKS.arrow_schema.empty_table()
    require_columns(table, REDRIVE_TASKS.names, TASKS_TABLE)
    # The filter prunes files on their stats, so polling for a cancel stays cheap as the table grows.
    where = None if redrive_id is None else pc.field("redrive_id") == redrive_id
    # Files come back in any order: readers want the events in the order they happened.
    return (
        pyarrow_dataset(table).to_table(filter=where).select(REDRIVE_TASKS.names).sort_by("at")
    )


def _append(config: EngineConfig, **row: object) -> None:
    # Plain appends: every event is its own row, and appends never conflict with each other.
    values = {name: row.get(name) for name in REDRIVE_TASKS.names}
    append_arrow(
        config.table_path(TASKS_TABLE),
        pa.Table.from_pylist([values], schema=REDRIVE_TASKS.arrow_schema),
    )


class RunTracker:
    """One run of a re-drive as other processes see it: start, heartbeats, cancel checks, end.

    Only the run that owns it calls it, from the re-drive's loop. Writes are
    events, never updates, so a replayed or doubled event only repeats a fact.
    """

    def __init__(
        self,
        config: EngineConfig,
        redrive_id: str,
        *,
        operator: str,
        selection: str | None,
        target: str,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self.redrive_id = redrive_id
        self.run_id = uuid.uuid4().hex
        self.operator = operator
        self.selection = selection
        self.target = target
        self._clock = clock
        self._sleep = sleep
        self._last_write = clock()
        self.started = False

    def _event(
        self,
        event: TaskEvent,
        *,
        moved: int | None = None,
        total: int | None = None,
        detail: str | None = None,
    ) -> None:
        _append(
            self.config,
            redrive_id=self.redrive_id,
            run_id=self.run_id,
            event=event,
            at=_now(),
            operator=self.operator,
            selection=self.selection,
            target=self.target,
            moved=moved,
            total=total,
            detail=detail,
            host=_host(),
        )
        self._last_write = self._clock()

    def start(self, *, moved: int, total: int) -> None:
        self._event("started", moved=moved, total=total)
        self.started = True

    def alive(self, moved: int) -> None:
        """A heartbeat, when the last write is :data:`HEARTBEAT_S` old."""
        if self.started and self._clock() - self._last_write >= HEARTBEAT_S:
            self._event("alive", moved=moved)

    def check_cancel(self) -> None:
        """Raise :class:`Cancelled` when someone asked to cancel this run: a ``cancel`` for it, or a
        ``cancelled`` a canceller wrote itself because the run looked stopped (silent for
        :data:`STALE_AFTER_S`: a slow commit, a long read, a clock ahead) while it was not."""
        if not self.started:
            return
        events = read_events(self.config, self.redrive_id)
        asked = events.filter(
            pc.and_(
                pc.is_in(events.column("event"), pa.array(["cancel", "cancelled"])),
                pc.equal(events.column("run_id"), self.run_id),
            )
        )
        if asked.num_rows:
            row = asked.slice(0, 1).to_pylist()[0]
            raise Cancelled(
                f"cancelled by {row['operator']} at {row['at'].isoformat()}: {row['detail'] or 'no reason given'}"
            )

    def wait(self, seconds: float, moved: int) -> None:
        """Sleep ``seconds`` (the rate limit), looking for a cancel and heartbeating meanwhile."""
        end = self._clock() + seconds
        while (left := end - self._clock()) > 0:
            self._sleep(min(left, CANCEL_POLL_S))
            self.check_cancel()
            self.alive(moved)

    def end(
        self,
        event: Literal["finished", "stopped", "cancelled"],
        *,
        moved: int,
        detail: str | None = None,
    ) -> None:
        if not self.started:
            return
        try:
            self._event(event, moved=moved, detail=detail)
        except (
            Exception
        ):  # the run's outcome is in the audit table; a lost end event reads as interrupted
            log.exception(
                "re-drive %s: could not record that run %s %s", self.redrive_id, self.run_id, event
            )


# -- reading the tasks ---------------------------------------------------------------


@dataclass(frozen=True)
class CancelResult:
    redrive_id: str
    state: State
    runs: int
    """Running runs the cancel was sent to (0: none was running)."""


def _run_state(
    events: list[dict[str, Any]], now: dt.datetime
) -> tuple[State, dt.datetime | None, str | None]:
    """State, end time and detail of one run from its events (in commit order)."""
    ends = [e for e in events if e["event"] in ("finished", "stopped", "cancelled")]
    if ends:
        last = ends[-1]
        ended: dict[str, State] = {
            "finished": "finished",
            "stopped": "interrupted",
            "cancelled": "cancelled",
        }
        return ended[last["event"]], last["at"], last["detail"]
    asked = [e for e in events if e["event"] == "cancel"]
    # A sign of life dated further ahead than FUTURE_EVENTS (a clock ahead, or another writer) is none:
    # it would keep a killed run "running" until that time, and a cancel would wait for it in vain.
    times = [e["at"] for e in events if isinstance(e["at"], dt.datetime) and e["at"] <= now + FUTURE_EVENTS]
    if not times:
        return "interrupted", None, f"no event dated before {FUTURE_EVENTS} from now (a clock ahead, or another writer)"
    seen = max(times)
    alive = (now - seen).total_seconds() < STALE_AFTER_S
    if asked:
        return (
            ("cancelling" if alive else "cancelled"),
            (None if alive else seen),
            asked[-1]["detail"],
        )
    if alive:
        return "running", None, None
    return "interrupted", seen, f"no sign of life since {seen.isoformat()} (killed?)"


def tasks(config: EngineConfig, *, now: dt.datetime | None = None) -> pd.DataFrame:
    """Every re-drive, newest first: :data:`TASK_COLUMNS`.

    ``moved`` counts the audit rows that reached the target (all runs);
    ``total`` is what the latest run planned, plus what moved before it.
    Re-drives from before this table existed are listed from the audit alone
    (finished, or interrupted when some chunk did not move).
    """
    now = now or _now()
    audit = redrive_rows(read_audit(config))
    moved: dict[str, int] = {}
    planned: dict[str, int] = {}
    first_at: dict[str, dt.datetime] = {}
    last_at: dict[str, dt.datetime] = {}
    first_row: dict[str, dict[str, Any]] = {}
    for row in audit.select(
        ["redrive_id", "redriven_at", MOVED, "operator", "target", "selection"]
    ).to_pylist():
        rid = row["redrive_id"]
        planned[rid] = planned.get(rid, 0) + 1
        moved[rid] = moved.get(rid, 0) + int(row[MOVED])
        first_at[rid] = min(first_at.get(rid, row["redriven_at"]), row["redriven_at"])
        last_at[rid] = max(last_at.get(rid, row["redriven_at"]), row["redriven_at"])
        first_row.setdefault(rid, row)

    by_run: dict[str, list[dict[str, Any]]] = {}
    for event in read_events(config).to_pylist():
        by_run.setdefault(str(event["run_id"]), []).append(event)
    runs_of: dict[str, list[list[dict[str, Any]]]] = {}
    for events in by_run.values():
        runs_of.setdefault(str(events[0]["redrive_id"]), []).append(events)

    out = []
    for rid in sorted(set(planned) | set(runs_of)):
        runs = [r for r in runs_of.get(rid, []) if any(e["event"] == "started" for e in r)]
        if not runs and rid not in planned:
            continue  # only stray events (a run's "started" never landed): nothing to show
        if not runs:
            done = moved.get(rid, 0)
            row = first_row[rid]
            out.append(
                {
                    "redrive_id": rid,
                    "state": "finished" if done == planned[rid] else "interrupted",
                    "target": row["target"],
                    "moved": done,
                    "total": planned[rid],
                    "operator": row["operator"],
                    "started_at": first_at[rid],
                    "ended_at": last_at[rid],
                    "selection": row["selection"],
                    "detail": None,
                }
            )
            continue
        runs.sort(key=lambda r: r[0]["at"])
        states = [_run_state(r, now) for r in runs]
        live = [s for s in states if s[0] in ("running", "cancelling")]
        state, ended, detail = live[0] if live else states[-1]
        start = next(e for e in runs[-1] if e["event"] == "started")
        done = moved.get(rid, 0)
        out.append(
            {
                "redrive_id": rid,
                "state": state,
                "target": start["target"],
                "moved": done,
                "total": max(int(start["total"] or 0), done),
                "operator": start["operator"],
                "started_at": min(runs[0][0]["at"], first_at.get(rid, runs[0][0]["at"])),
                "ended_at": ended,
                "selection": start["selection"],
                "detail": detail,
            }
        )
    frame = pd.DataFrame(out, columns=list(TASK_COLUMNS))
    if frame.empty:
        return frame
    return frame.sort_values(["started_at", "redrive_id"], ascending=False, ignore_index=True)


def task(
    config: EngineConfig, redrive_id: str, *, now: dt.datetime | None = None
) -> dict[str, Any]:
    """One re-drive's row of :func:`tasks`; :class:`RedriveError` ``REDRIVE_NOT_FOUND`` naming the known ids."""
    _check_id(redrive_id)
    frame = tasks(config, now=now)
    found = frame[frame["redrive_id"] == redrive_id]
    if found.empty:
        known = ", ".join(frame["redrive_id"].head(10)) or "none"
        raise RedriveError(
            f"no re-drive {redrive_id!r}; known (newest first): {known} (see retry-engine redrive list)",
            code="REDRIVE_NOT_FOUND",
        )
    return dict(found.iloc[0])


def cancel(
    config: EngineConfig,
    redrive_id: str,
    *,
    operator: str,
    reason: str | None = None,
    now: dt.datetime | None = None,
) -> CancelResult:
    """Ask every running run of ``redrive_id`` to stop at its next chunk; record who asked and why.

    A re-drive that is not running (interrupted, killed) is marked cancelled
    at once; a finished or already cancelled one is an error
    (``REDRIVE_NOT_RUNNING``) that says so.
    """
    now = now or _now()
    row = task(config, redrive_id, now=now)
    state = row["state"]
    if state in ("finished", "cancelled"):
        raise RedriveError(
            f"re-drive {redrive_id} is {state}: nothing to cancel", code="REDRIVE_NOT_RUNNING"
        )
    by_run: dict[str, list[dict[str, Any]]] = {}
    for event in read_events(config, redrive_id).to_pylist():
        by_run.setdefault(str(event["run_id"]), []).append(event)
    running = [
        run_id
        for run_id, events in by_run.items()
        if _run_state(events, now)[0] in ("running", "cancelling")
    ]
    if running:
        for run_id in running:
            _append(
                config,
                redrive_id=redrive_id,
                run_id=run_id,
                event="cancel",
                at=now,
                operator=operator,
                detail=reason,
                host=_host(),
            )
        log.info(
            "re-drive %s: cancel asked by %s for %d running run(s)",
            redrive_id,
            operator,
            len(running),
        )
        return CancelResult(redrive_id, "cancelling", len(running))
    # Nothing runs it: mark the latest run (or, for a re-drive known only from the audit, a new one) cancelled.
    latest = max(by_run.values(), key=lambda events: events[0]["at"], default=None)
    run_id = str(latest[0]["run_id"]) if latest else uuid.uuid4().hex
    if latest is None:
        _append(
            config,
            redrive_id=redrive_id,
            run_id=run_id,
            event="started",
            at=now,
            operator=row["operator"],
            selection=row["selection"],
            target=row["target"],
            moved=row["moved"],
            total=row["total"],
            host=_host(),
        )
    _append(
        config,
        redrive_id=redrive_id,
        run_id=run_id,
        event="cancelled",
        at=now,
        operator=operator,
        moved=row["moved"],
        detail=reason,
        host=_host(),
    )
    log.info("re-drive %s (%s, not running): marked cancelled by %s", redrive_id, state, operator)
    return CancelResult(redrive_id, "cancelled", 0)


def _check_id(redrive_id: str) -> None:
    from retry_engine.ops.redrive import REDRIVE_ID

    if not isinstance(redrive_id, str) or not REDRIVE_ID.fullmatch(redrive_id):
        raise RedriveError(
            f"{redrive_id!r} is not a re-drive id (they match {REDRIVE_ID.pattern}); see retry-engine redrive list",
            code="REDRIVE_NOT_FOUND",
        )
