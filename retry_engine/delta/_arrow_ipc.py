"""Arrow tables as bytes (IPC stream format): state blobs and task results."""

from __future__ import annotations

import pyarrow as pa


def to_ipc(table: pa.Table | pa.RecordBatch) -> bytes:
    """``table`` as one IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write(table)
    return bytes(sink.getvalue().to_pybytes())


def from_ipc(blob: bytes) -> pa.Table:
    """The table :func:`to_ipc` wrote."""
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


def ipc_chunks(table: pa.Table | pa.RecordBatch, *, max_rows: int, max_bytes: int) -> list[bytes]:
    """``table`` as IPC streams of at most ``max_rows`` rows and about ``max_bytes`` each, in order.

    The byte bound goes by the table's average row size, so a chunk of unusually
    wide rows can exceed it; a row wider than ``max_bytes`` travels alone.
    """
    n = table.num_rows
    if n == 0:
        return []
    row_bytes = max(1, table.nbytes // n)
    step = max(1, min(max_rows, max_bytes // row_bytes))
    return [to_ipc(table.slice(start, step)) for start in range(0, n, step)]
