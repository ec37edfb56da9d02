"""WORK rows packed for their trip through Spark: one row per state key and chunk.

Every JVM <-> Python crossing of a wide WORK row (maps, nested history,
thirty-odd columns) costs Spark a per-row conversion; with three Python steps
in the engine (decide, schedule stage, writer) that conversion, not our code,
was most of a micro-batch. So between the steps WORK rows travel packed: each
Spark row holds a state key (``route``, ``bucket``) and a ``payload``, an Arrow
IPC stream of the WORK rows of that key from one Arrow batch. Spark shuffles
a handful of rows per task and never looks inside them.

Order: :func:`pack` keeps input order within a key, and :func:`unpack`
concatenates payloads in the order given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from retry_engine._arrow_ipc import from_ipc, to_ipc
from retry_engine.schemas import WORK

PACKED_SCHEMA: Final = "route string, bucket long, payload binary"
PACKED_ARROW_SCHEMA: Final = pa.schema(
    [pa.field("route", pa.string()), pa.field("bucket", pa.int64()), pa.field("payload", pa.binary())]
)
KEY_COLUMNS: Final = ("route", "bucket")


def packed_batch(keys: Sequence[tuple[str, int]], payloads: Sequence[bytes]) -> pa.RecordBatch:
    """Packed rows from their keys and payloads."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([k[0] for k in keys], pa.string()),
            pa.array([int(k[1]) for k in keys], pa.int64()),
            pa.array(payloads, pa.binary()),
        ],
        schema=PACKED_ARROW_SCHEMA,
    )


def pack(work: pa.Table | pa.RecordBatch) -> pa.RecordBatch:
    """``work`` as packed rows, one per distinct (route, bucket), rows in input order within each."""
    table = work if isinstance(work, pa.Table) else pa.Table.from_batches([work])
    if table.num_rows == 0:
        return _empty()
    # sort_indices is stable: rows of one key keep their input order.
    order = pc.sort_indices(table, sort_keys=[(k, "ascending") for k in KEY_COLUMNS])
    ordered = table.take(order)
    routes = ordered.column("route").to_numpy(zero_copy_only=False)
    buckets = ordered.column("bucket").to_numpy(zero_copy_only=False)
    change = np.flatnonzero((routes[1:] != routes[:-1]) | (buckets[1:] != buckets[:-1])) + 1
    starts = [0, *change.tolist()]
    ends = [*change.tolist(), ordered.num_rows]
    keys = [(str(routes[s]), int(buckets[s])) for s in starts]
    payloads = [to_ipc(ordered.slice(s, e - s)) for s, e in zip(starts, ends, strict=True)]
    return packed_batch(keys, payloads)


def _empty() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in PACKED_ARROW_SCHEMA], schema=PACKED_ARROW_SCHEMA)


def unpack(payloads: Iterable[bytes]) -> pa.Table:
    """The WORK rows of ``payloads``, concatenated in order."""
    tables = [from_ipc(p) for p in payloads]
    if not tables:
        return WORK.arrow_schema.empty_table()
    return pa.concat_tables(tables)


__all__ = ["KEY_COLUMNS", "PACKED_ARROW_SCHEMA", "PACKED_SCHEMA", "pack", "packed_batch", "unpack"]
