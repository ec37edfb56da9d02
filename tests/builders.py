"""Small chained builders of consume results for tests."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from retry_engine.schemas import CONSUME_RESULTS, MESSAGES, OUTCOMES, RETRY

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


def retry_rows(delivered: dt.datetime, ids: list[str], group: str = "G") -> pa.Table:
    """Rows of %RETRY%G's table as the engine releases them at ``delivered`` (message ``ids``)."""
    rows = [
        {**dict.fromkeys(RETRY.names), "msg_id": i, "topic": f"%RETRY%{group}", "consumer_group": group,
         "delay_level": 3, "scheduled_at": delivered - dt.timedelta(seconds=10), "due_at": delivered,
         "delivered_at": delivered, "delivery_key": f"key-{i}", "body": b"x", "origin_msg_id": f"origin-{i}",
         "reconsume_times": 1, "queue_id": 0}
        for i in ids
    ]
    return pa.Table.from_pylist(rows, schema=RETRY.arrow_schema)


def outcome_rows(decided: dt.datetime, retries: dict[str, dt.timedelta], acks: int = 0, group: str = "G") -> pa.Table:
    """Outcome rows decided at ``decided``: a retry per output id (due after its delay), and ``acks``."""
    rows = [
        {**dict.fromkeys(OUTCOMES.names), "result_id": f"res-{out}", "consumer_group": group, "retry_topic": "T",
         "outcome": "retry", "output_msg_id": out, "delay_level": 3, "due_at": decided + delay,
         "batch_id": 0, "decided_at": decided, "reconsume_times": 0}
        for out, delay in retries.items()
    ]
    rows += [
        {**dict.fromkeys(OUTCOMES.names), "result_id": f"ack-{decided.timestamp()}-{i}", "consumer_group": group,
         "retry_topic": "T", "outcome": "acknowledged", "batch_id": 0, "decided_at": decided, "reconsume_times": 0}
        for i in range(acks)
    ]
    return pa.Table.from_pylist(rows, schema=OUTCOMES.arrow_schema)


def message_rows(ids: list[str], stored: list[dt.datetime], topic: str = "orders") -> pa.Table:
    """Rows of the producers' messages table, stored at ``stored``."""
    return pa.Table.from_pylist(
        [{**dict.fromkeys(MESSAGES.names), "msg_id": i, "topic": topic, "body": b"x", "store_timestamp": t,
          "born_timestamp": t, "queue_id": 0} for i, t in zip(ids, stored, strict=True)],
        schema=MESSAGES.arrow_schema,
    )


def work_rows(results: list[Result], *, batch_ts: dt.datetime, config: Any = None) -> pa.Table:
    """WORK rows as the decision step makes them from ``results`` at micro-batch time ``batch_ts``."""
    from retry_engine.config import parse_config
    from retry_engine.core.decide import BATCH_TS, POSITION, Decider

    table = results_table(results)
    n = table.num_rows
    table = table.append_column(POSITION, pa.array([f"p{i:06d}" for i in range(n)])).append_column(
        BATCH_TS, pa.array([batch_ts] * n, type=pa.timestamp("us", tz="UTC"))
    )
    return pa.Table.from_batches([Decider(config or parse_config({}))(table.to_batches()[0])])


def delivered(work: pa.Table, *, late_ms: list[int]) -> pa.Table:
    """The retry outcomes of ``work`` as the schedule stage releases them, ``late_ms`` after due."""
    import pyarrow.compute as pc

    retries = work.filter(pc.equal(work.column("outcome"), "retry"))
    due = retries.column("due_at").to_pylist()
    at = pa.array([d + dt.timedelta(milliseconds=ms) for d, ms in zip(due, late_ms, strict=True)], pa.timestamp("us", tz="UTC"))
    retries = retries.set_column(retries.schema.get_field_index("kind"), "kind", pa.array(["delivery"] * len(due)))
    i = retries.schema.get_field_index("delivered_at")
    return retries.set_column(i, retries.schema.field(i), at).cast(work.schema)


def with_unvalidated_group(config: Any, name: str, **fields: Any) -> Any:
    """``config`` with group ``name``'s fields replaced WITHOUT validation.

    Config loading refuses such values; tests use this to make decide meet a
    value nobody anticipated (the general bad-input rule, #12 item 3).
    """
    group = config.groups[name].model_copy(update=fields)
    return config.model_copy(update={"groups": {**config.groups, name: group}})


def hostile_array(values: list[int], *, extension: str, message: str) -> pa.ExtensionArray:
    """An int64 column of an extension type decide knows nothing about, whose values raise
    ``RuntimeError(message)`` when read (the bad-input rule's "any value" cases)."""

    class _HostileScalar(pa.ExtensionScalar):
        def as_py(self, **_: Any) -> Any:
            raise RuntimeError(message)

    class _HostileType(pa.ExtensionType):
        def __init__(self) -> None:
            super().__init__(pa.int64(), extension)

        def __arrow_ext_serialize__(self) -> bytes:
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> _HostileType:
            return cls()

        def __arrow_ext_scalar_class__(self) -> type[pa.ExtensionScalar]:
            return _HostileScalar

    return pa.ExtensionArray.from_storage(_HostileType(), pa.array(values, pa.int64()))


def append_at_once(path: str, tables: list[pa.Table]) -> list[BaseException]:
    """Append each of ``tables`` to the Delta table at ``path`` from its own thread, all released
    at the same moment (a barrier); what they raised (B8's races: two writers meeting a table that
    does not exist yet)."""
    from retry_engine.delta.tables import append_arrow

    barrier = threading.Barrier(len(tables))
    errors: list[BaseException] = []

    def append(table: pa.Table) -> None:
        try:
            barrier.wait(timeout=60)
            append_arrow(path, table)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(t,)) for t in tables]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors
