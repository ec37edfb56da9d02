"""Synthetic consume results for the benchmarks (about 230 bytes a row)."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from retry_engine.schemas import CONSUME_RESULTS


def consume_results(
    n: int,
    *,
    failure_rate: float,
    seed: int = 7,
    groups: int = 4,
    offset: int = 0,
    arrival_rate: float | None = None,
    start: dt.datetime | None = None,
    body_bytes: int = 64,
) -> pa.Table:
    """``n`` results with msg ids ``offset..offset+n``; a share ``failure_rate`` failed; bodies of ``body_bytes``.

    With ``arrival_rate`` (messages/s) store timestamps advance from ``start`` at
    that rate, as a live topic's would (so they fall into realistic state
    buckets); otherwise every row has the same timestamp.
    """
    rng = np.random.default_rng(seed)
    now = start or dt.datetime.now(dt.UTC)
    ids = [f"{i:032X}" for i in range(offset, offset + n)]
    failed = rng.random(n) < failure_rate
    if arrival_rate:
        base_us = int(now.timestamp() * 1_000_000)
        step = np.arange(n, dtype=np.int64) * int(1_000_000 / arrival_rate)
        ts = pa.array(base_us + step, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    else:
        ts = pa.array([now] * n, pa.timestamp("us", tz="UTC"))
    columns = {
        "result_id": pa.array([f"r{i}" for i in range(offset, offset + n)]),
        "consumer_group": pa.array([f"group_{i % groups}" for i in range(n)]),
        "consumer_id": pa.array(["consumer-1@10.0.0.9"] * n),
        "message_model": pa.array(["CLUSTERING"] * n),
        "status": pa.array(np.where(failed, "RECONSUME_LATER", "CONSUME_SUCCESS")),
        "error_class": pa.array(np.where(failed, "java.lang.IllegalStateException", None)),
        "consumed_at": ts,
        "msg_id": pa.array(ids),
        "topic": pa.array([f"topic_{i % 8}" for i in range(n)]),
        "tags": pa.array(["TagA"] * n),
        "body": pa.array([b"x" * body_bytes] * n, pa.binary()),
        "born_timestamp": ts,
        "born_host": pa.array(["10.0.0.1:5000"] * n),
        "store_timestamp": ts,
        "reconsume_times": pa.array(np.zeros(n, dtype=np.int32)),
    }
    return pa.table({f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in CONSUME_RESULTS.arrow_schema},
                    schema=CONSUME_RESULTS.arrow_schema)


def write_table(path: Path, data: pa.Table, *, files: int) -> None:
    shutil.rmtree(path, ignore_errors=True)
    step = max(1, data.num_rows // files)
    for start in range(0, data.num_rows, step):
        write_deltalake(str(path), data.slice(start, step), mode="append")


def fill(schema: pa.Schema, columns: dict[str, pa.Array], n: int) -> pa.Table:
    """``n`` rows of ``schema``: ``columns`` where given, nulls elsewhere."""
    arrays = [columns[f.name] if f.name in columns else pa.nulls(n, f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)
