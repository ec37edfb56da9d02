"""A DLQ written with delta-rs (no Spark), for the operator tools' tests (re-drive, tasks, resolve)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa

from retry_engine.config import EngineConfig, parse_config
from retry_engine.delta import append_arrow
from retry_engine.schemas import DLQ

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def dead_letter(i: int, *, group: str = "billing", msg_id: str | None = None) -> dict[str, Any]:
    """Dead letter ``i``: even ones are timeouts, odd ones bad JSON; one second apart from :data:`T0`."""
    error = "com.acme.Timeout" if i % 2 == 0 else "com.acme.BadJson"
    return {
        "msg_id": msg_id or f"DLQ-{i:03d}",
        "topic": f"%DLQ%{group}",
        "body": f"order-{i}".encode(),
        "properties": [("a", "b")],
        "born_timestamp": T0,
        "store_timestamp": T0,
        "reconsume_times": 16,
        "origin_msg_id": f"ORIGIN-{i:03d}",
        "retry_topic": "orders",
        "consumer_group": group,
        "dead_lettered_at": T0 + dt.timedelta(seconds=i),
        "reason_code": "MAX_RECONSUME_TIMES",
        "error_class": error,
        "error_message": f"{error} on order {i}",
        "delivery_key": f"ORIGIN-{i:03d}:16",
    }


def dlq_lake(root: str, rows: list[dict[str, Any]], **engine: Any) -> EngineConfig:
    """A config on ``root`` whose DLQ holds ``rows``."""
    config = parse_config({"engine": {"lake": root, **engine}})
    append_arrow(
        config.table_path("dlq"),
        pa.Table.from_pylist(rows, schema=DLQ.arrow_schema),
        partition_by=DLQ.partition_by,
    )
    return config
