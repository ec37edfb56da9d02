"""The schedule stage (R8): holds retries until they are due, on Spark's clock.

This is RocketMQ's ``SCHEDULE_TOPIC_XXXX`` rebuilt as the state of an
``applyInPandasWithState`` operator. Calling Python once per message would
cap the engine at a few thousand messages a second, so state is keyed
coarsely: by (consumer group, store-time bucket of the consumed message).
Each key holds its pending retries as one Arrow IPC blob, and the msg ids it
has already decided, so a duplicated consume result (same group and msg id,
which always lands in the same key) is recognised and recorded as a
duplicate instead of producing a second retry (B1). The key's processing-time
timeout is set to its earliest due time; a retry is released in the first
micro-batch whose timestamp is past its ``due_at``, never earlier.

Rows with ``bucket == -1`` (acknowledged, dropped, quarantined) pass through
without touching state.

Replay: Spark re-runs a micro-batch from the state of the previous version
with the same batch timestamp, and this function is deterministic in its
input (rows are sorted by source position first), so a replay emits the same
rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming.state import GroupState

from retry_engine._arrow_ipc import from_ipc, to_ipc
from retry_engine.decide import DUPLICATE, KIND_DELIVERY, NO_STATE_BUCKET, RETRY
from retry_engine.schemas import WORK

log = logging.getLogger(__name__)

STATE_SCHEMA = "pending binary, seen binary, expires_ms long"
_SEEN_SCHEMA = pa.schema([pa.field("msg_id", pa.string())])
_NS_PER_MS = 1_000_000


def _to_arrow(frame: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(frame, schema=WORK.arrow_schema, preserve_index=False)


def _to_pandas(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas(maps_as_pydicts="strict")


@dataclass(frozen=True)
class ScheduleStage:
    """The stateful function; ``dedup_window_ms`` is how long a key remembers its msg ids."""

    dedup_window_ms: int

    def __call__(
        self, key: tuple[str, int], frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        route, bucket = key
        parts = [frame for frame in frames if len(frame)]
        if int(bucket) == NO_STATE_BUCKET:
            yield from parts
            return
        now_ms = state.getCurrentProcessingTimeMs()
        if state.exists:
            pending_blob, seen_blob, expires_ms = state.get
            pending = from_ipc(pending_blob)
            seen = set(from_ipc(seen_blob).column("msg_id").to_pylist())
        else:
            pending, seen, expires_ms = WORK.arrow_schema.empty_table(), set(), 0

        if parts:
            new = pd.concat(parts, ignore_index=True).sort_values("source_position", kind="stable")
            repeated = new["consumed_msg_id"].isin(seen) | new["consumed_msg_id"].duplicated()
            if repeated.any():
                yield _as_duplicates(new[repeated])
            fresh = new[~repeated]
            if len(fresh):
                yield fresh
                seen.update(fresh["consumed_msg_id"])
                scheduled = fresh[fresh["outcome"] == RETRY]
                if len(scheduled):
                    pending = pa.concat_tables([pending, _to_arrow(scheduled)])
                expires_ms = max(int(expires_ms), now_ms + self.dedup_window_ms)

        # Wake-ups still ahead: the end of the dedup window, and the earliest pending due time.
        # A passed window is no wake-up (it would fire the key on every micro-batch, shipping
        # its whole blob each time); its msg ids are forgotten, as the window promises.
        wake_ms: list[int] = []
        if now_ms < int(expires_ms):
            wake_ms.append(int(expires_ms))
        else:
            seen = set()
        if pending.num_rows:
            due_ms = pending.column("due_at").cast(pa.int64()).to_numpy() // 1000
            is_due = due_ms <= now_ms
            if is_due.any():
                yield _as_deliveries(_to_pandas(pending.filter(pa.array(is_due))), now_ms)
                pending = pending.filter(pa.array(~is_due))
                log.debug("group %s bucket %s: released %d retries", route, bucket, int(is_due.sum()))
            if not is_due.all():
                wake_ms.append(int(due_ms[~is_due].min()))

        if not wake_ms:
            state.remove()
            return
        next_ms = min(wake_ms)
        state.update((to_ipc(pending), to_ipc(pa.table({"msg_id": sorted(seen)}, schema=_SEEN_SCHEMA)), int(expires_ms)))
        # Spark fires the timeout in the first batch whose timestamp is past now + duration.
        state.setTimeoutDuration(max(1, next_ms - now_ms))


def _as_duplicates(rows: pd.DataFrame) -> pd.DataFrame:
    """A repeated consume result: recorded in the ledger, produces nothing else."""
    out = rows.copy()
    out["reason_code"] = "DUPLICATE"
    out["reason"] = (
        "msg_id " + out["consumed_msg_id"].astype(str) + " of group " + out["consumer_group"].astype(str)
        + " was already decided; its " + out["outcome"].astype(str) + " is " + out["output_msg_id"].astype(str)
    )
    out["outcome"] = DUPLICATE
    return out


def _as_deliveries(rows: pd.DataFrame, now_ms: int) -> pd.DataFrame:
    """Retries leaving the schedule stage for %RETRY%G: stored (and delivered) now."""
    now = pd.Timestamp(now_ms * _NS_PER_MS, tz="UTC")
    rows["kind"] = KIND_DELIVERY
    rows["delivered_at"] = now
    rows["store_timestamp"] = now
    return rows


__all__ = ["STATE_SCHEMA", "ScheduleStage"]
