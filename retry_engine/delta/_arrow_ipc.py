"""Arrow tables as bytes (IPC stream format): state blobs, task results and packed payloads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import pyarrow as pa

_Rows: TypeAlias = pa.Table | pa.RecordBatch
# One binary array's values end at an int32 offset.
_BINARY_MAX_BYTES = 2**31 - 1


def _write(sink: pa.NativeFile, table: _Rows) -> None:
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write(table)


def to_ipc(table: _Rows) -> bytes:
    """``table`` as one IPC stream."""
    sink = pa.BufferOutputStream()
    _write(sink, table)
    return bytes(sink.getvalue().to_pybytes())


def from_ipc(blob: bytes) -> pa.Table:
    """The table :func:`to_ipc` wrote."""
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


def ipc_slices(table: _Rows, *, max_rows: int, max_bytes: int) -> list[_Rows]:
    """``table`` cut in order into slices of at most ``max_rows`` rows and about ``max_bytes`` each.

    The byte bound goes by the table's average row size, so a slice of unusually
    wide rows can exceed it; a row wider than ``max_bytes`` travels alone.
    """
    n = table.num_rows
    if n == 0:
        return []
    row_bytes = max(1, table.nbytes // n)
    step = max(1, min(max_rows, max_bytes // row_bytes))
    return [table.slice(start, step) for start in range(0, n, step)]


def ipc_chunks(table: _Rows, *, max_rows: int, max_bytes: int) -> list[bytes]:
    """:func:`ipc_slices` of ``table``, each as one IPC stream."""
    return [to_ipc(part) for part in ipc_slices(table, max_rows=max_rows, max_bytes=max_bytes)]


def ipc_array(tables: Sequence[_Rows]) -> pa.Array:
    """Each of ``tables`` as one IPC stream (the bytes :func:`to_ipc` gives), as one binary array.

    The streams are written once, into one buffer of their measured size that
    the array's values share: no Python ``bytes`` per stream and no copy of them
    into the array (``pa.array`` of the bytes was 15% of a decide task at 100%
    failures, #14 part 5). Past 2 GiB in all, which one binary array cannot
    hold, the bytes go through ``pa.array`` as before.
    """
    sizes = []
    for table in tables:
        counter = pa.MockOutputStream()
        _write(counter, table)
        sizes.append(counter.size())
    total = sum(sizes)
    if total > _BINARY_MAX_BYTES:
        return pa.array([to_ipc(table) for table in tables], pa.binary())
    data = pa.allocate_buffer(total)
    sink = pa.FixedSizeBufferWriter(data)
    for table in tables:
        _write(sink, table)
    if sink.tell() != total:  # the writer is deterministic; never half-filled values
        raise AssertionError(f"IPC streams took {sink.tell()} bytes, measured {total}")
    offsets = np.zeros(len(sizes) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(sizes), [None, pa.py_buffer(offsets), data])
