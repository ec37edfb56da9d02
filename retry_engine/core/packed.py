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

Size: a payload holds at most :data:`MAX_PAYLOAD_ROWS` rows and about
:data:`MAX_PAYLOAD_BYTES` (by average row size; wide bodies make for fewer
rows; Arrow and Java cap one binary value at 2 GiB). Spark builds
each Arrow batch it hands to Python in JVM direct memory, and a single huge
binary value (all of a busy key's rows) needs one contiguous buffer there;
the engine's query also caps the bytes per Arrow batch
(``spark.sql.execution.arrow.maxBytesPerBatch``, :func:`retry_engine.delta.session.capped_arrow_batches`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from retry_engine.delta._arrow_ipc import from_ipc, ipc_array, ipc_chunks, ipc_slices
from retry_engine.schemas import WORK

PACKED_SCHEMA: Final = "route string, bucket long, payload binary"
PACKED_ARROW_SCHEMA: Final = pa.schema(
    [pa.field("route", pa.string()), pa.field("bucket", pa.int64()), pa.field("payload", pa.binary())]
)
KEY_COLUMNS: Final = ("route", "bucket")
MAX_PAYLOAD_ROWS: Final = 4096
MAX_PAYLOAD_BYTES: Final = 4 * 1024 * 1024


def packed_batch(keys: Sequence[tuple[str, int]], payloads: Sequence[bytes] | pa.Array) -> pa.RecordBatch:
    """Packed rows from their keys and payloads (bytes, or a binary array as :func:`ipc_array` builds)."""
    return pa.RecordBatch.from_arrays(
        [
            pa.array([k[0] for k in keys], pa.string()),
            pa.array([int(k[1]) for k in keys], pa.int64()),
            payloads if isinstance(payloads, pa.Array) else pa.array(payloads, pa.binary()),
        ],
        schema=PACKED_ARROW_SCHEMA,
    )


def pack(work: pa.Table | pa.RecordBatch) -> pa.RecordBatch:
    """``work`` as packed rows: per distinct (route, bucket), its rows in input order, in
    :func:`payload_chunks`."""
    table = work if isinstance(work, pa.Table) else pa.Table.from_batches([work])
    if table.num_rows == 0:
        return packed_batch([], [])
    # sort_indices is stable: rows of one key keep their input order.
    order = pc.sort_indices(table, sort_keys=[(k, "ascending") for k in KEY_COLUMNS])
    ordered = table.take(order)
    routes = ordered.column("route").to_numpy(zero_copy_only=False)
    buckets = ordered.column("bucket").to_numpy(zero_copy_only=False)
    change = np.flatnonzero((routes[1:] != routes[:-1]) | (buckets[1:] != buckets[:-1])) + 1
    starts = [0, *change.tolist()]
    ends = [*change.tolist(), ordered.num_rows]
    keys: list[tuple[str, int]] = []
    parts: list[pa.Table] = []
    for start, end in zip(starts, ends, strict=True):
        chunks = payload_slices(ordered.slice(start, end - start))
        keys += [(str(routes[start]), int(buckets[start]))] * len(chunks)
        parts += chunks
    return packed_batch(keys, ipc_array(parts))


def payload_slices(rows: pa.Table) -> list[pa.Table]:
    """``rows`` cut as :func:`payload_chunks` cuts them, not yet written (for :func:`~retry_engine.delta._arrow_ipc.ipc_array`)."""
    return ipc_slices(rows, max_rows=MAX_PAYLOAD_ROWS, max_bytes=MAX_PAYLOAD_BYTES)


def payload_chunks(rows: pa.Table) -> list[bytes]:
    """``rows`` as payloads of at most :data:`MAX_PAYLOAD_ROWS` rows and about :data:`MAX_PAYLOAD_BYTES`, in order."""
    return ipc_chunks(rows, max_rows=MAX_PAYLOAD_ROWS, max_bytes=MAX_PAYLOAD_BYTES)


def unpack(payloads: Iterable[bytes]) -> pa.Table:
    """The WORK rows of ``payloads``, concatenated in order."""
    tables = [as_work(from_ipc(p)) for p in payloads]
    if not tables:
        return WORK.arrow_schema.empty_table()
    return pa.concat_tables(tables)


def as_work(rows: pa.Table) -> pa.Table:
    """A payload's rows in all of WORK's columns.

    A payload may carry only some of them (an outcome row that goes to the ledger only,
    :func:`retry_engine.core.schedule.ledger_only`): the others come back null, built here
    instead of crossing Spark and two Python workers as columns of nulls (#14 part 5).
    """
    if rows.schema.names == _WORK_NAMES:
        return rows
    present = set(rows.schema.names)
    n = rows.num_rows
    return pa.Table.from_arrays(
        [
            rows.column(f.name) if f.name in present else pa.nulls(n, f.type)
            for f in WORK.arrow_schema
        ],
        schema=WORK.arrow_schema,
    )


_WORK_NAMES: Final = WORK.arrow_schema.names


__all__ = ["KEY_COLUMNS", "MAX_PAYLOAD_BYTES", "MAX_PAYLOAD_ROWS", "PACKED_ARROW_SCHEMA", "PACKED_SCHEMA", "as_work", "pack", "packed_batch", "payload_chunks", "payload_slices", "unpack"]
