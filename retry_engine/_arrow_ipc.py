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
