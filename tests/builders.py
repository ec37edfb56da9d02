"""Small chained builders of consume results for tests."""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from retry_engine.schemas import CONSUME_RESULTS

T0 = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)
_ids = itertools.count()


@dataclass(frozen=True)
class Result:
    """One consume result; ``.failed()``, ``.ok()``, ``.with_(...)`` return new ones."""

    values: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, msg_id: str | None = None, *, group: str = "G", topic: str = "orders") -> Result:
        n = next(_ids)
        msg_id = msg_id if msg_id is not None else f"M{n:06d}"
        return cls(
            {
                "result_id": f"R-{msg_id}-{n}",
                "consumer_group": group,
                "consumer_id": "c1@host",
                "message_model": "CLUSTERING",
                "status": "RECONSUME_LATER",
                "delay_level_when_next_consume": 0,
                "max_reconsume_times": -1,
                "error_class": "java.lang.RuntimeException",
                "error_message": "boom",
                "consumed_at": T0,
                "msg_id": msg_id,
                "topic": topic,
                "tags": "TagA",
                "keys": "k1 k2",
                "body": f"body-{msg_id}".encode(),
                "flag": 7,
                "properties": [("color", "red")],
                "born_timestamp": T0 - dt.timedelta(seconds=5),
                "born_host": "10.0.0.1:5000",
                "store_timestamp": T0 - dt.timedelta(seconds=4),
                "queue_id": 1,
                "reconsume_times": 0,
                "origin_msg_id": None,
                "retry_topic": None,
                "attempts": None,
            }
        )

    def with_(self, **values: Any) -> Result:
        return replace(self, values={**self.values, **values})

    def ok(self) -> Result:
        return self.with_(status="CONSUME_SUCCESS", error_class=None, error_message=None)

    def failed(self, **values: Any) -> Result:
        return self.with_(status="RECONSUME_LATER", **values)


def results_table(results: list[Result], schema: pa.Schema = CONSUME_RESULTS.arrow_schema) -> pa.Table:
    rows = [r.values for r in results]
    return pa.Table.from_pylist(rows, schema=schema)
