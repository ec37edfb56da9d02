"""Synthetic consume results for the benchmarks (about 230 bytes a row)."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from retry_engine.schemas import CONSUME_RESULTS


def consume_results(n: int, *, failure_rate: float, seed: int = 7, groups: int = 4) -> pa.Table:
    rng = np.random.default_rng(seed)
    now = dt.datetime.now(dt.UTC)
    ids = [f"{i:032X}" for i in range(n)]
    failed = rng.random(n) < failure_rate
    ts = pa.array([now] * n, pa.timestamp("us", tz="UTC"))
    columns = {
        "result_id": pa.array([f"r{i}" for i in range(n)]),
        "consumer_group": pa.array([f"group_{i % groups}" for i in range(n)]),
        "consumer_id": pa.array(["consumer-1@10.0.0.9"] * n),
        "message_model": pa.array(["CLUSTERING"] * n),
        "status": pa.array(np.where(failed, "RECONSUME_LATER", "CONSUME_SUCCESS")),
        "error_class": pa.array(np.where(failed, "java.lang.IllegalStateException", None)),
        "consumed_at": ts,
        "msg_id": pa.array(ids),
        "topic": pa.array([f"topic_{i % 8}" for i in range(n)]),
        "tags": pa.array(["TagA"] * n),
        "body": pa.array([b"x" * 64] * n, pa.binary()),
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
