"""The PROGRESS rows read from Spark's progress JSON equal those of PySpark's own reading (#15).

The engine's listener reads each progress event from its JSON
(:func:`~retry_engine.ops.monitor.progress_from_json`: a few py4j calls instead
of hundreds). Here both readings of the same real events, from a stateful query
on the deltars source and an unnamed one, must give the same PROGRESS row:
durations, rates (NaN where Spark has none), state operators, the source's end
offset.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from deltalake import write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryProgressEvent,
)

from retry_engine.delta import register, write_stream
from retry_engine.ops import monitor
from tests.builders import Result, results_table

RATES = ("input_rows_per_second", "processed_rows_per_second")


class _Both(JStreamingQueryListener):
    """Records each progress event read both ways, in its listener's ``seen``."""

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        ours = monitor.progress_from_json(jevent.progress())
        theirs = QueryProgressEvent.fromJObject(jevent).progress
        self.pylistener.seen.append((row(ours), row(theirs)))  # type: ignore[attr-defined]


def row(progress: Any) -> dict[str, Any]:
    values = monitor.progress_row(progress, recorded_at=monitor._now())
    values.pop("recorded_at")
    return {k: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in values.items()}


class _Listener(monitor.JsonProgressListener):
    """The engine's listener bridge (JsonProgressListener), with the bridge that reads events both ways."""

    _bridge = _Both

    def __init__(self, seen: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        self.seen = seen

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass


def test_progress_rows_from_json_equal_pysparks_reading(spark: SparkSession, tmp_path: Path) -> None:
    register(spark)
    src = tmp_path / "in"
    for i in range(3):
        write_deltalake(str(src), results_table([Result.of(f"M{i}-{k}").failed() for k in range(5)]), mode="append")
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []
    listener = _Listener(seen)
    spark.streams.addListener(listener)
    try:
        counted = (
            spark.readStream.format("deltars").option("path", str(src)).option("maxFilesPerTrigger", "1").load()
            .groupBy("consumer_group").count()
        )
        named = (counted.writeStream.queryName("progress_json").outputMode("complete").format("noop")
                 .option("checkpointLocation", str(tmp_path / "ck1")).trigger(availableNow=True).start())
        named.awaitTermination()
        unnamed = write_stream(
            spark.readStream.format("deltars").option("path", str(src)).load(), str(tmp_path / "out"),
            checkpoint=str(tmp_path / "ck2"),
        ).trigger(availableNow=True).start()
        unnamed.awaitTermination()
        deadline = time.monotonic() + 30
        while len(seen) < 4 and time.monotonic() < deadline:  # events reach listeners asynchronously
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
    assert len(seen) >= 4, seen
    names = {ours["query_name"] for ours, _ in seen}
    assert names == {"progress_json", None}, names
    assert any(ours["state_rows_total"] for ours, _ in seen)  # the stateful query's operator is read
    assert all(ours["source_end_offset"] for ours, _ in seen)
    for ours, theirs in seen:
        # Spark's JSON rounds rates to one decimal place; everything else is exact.
        for rate in RATES:
            a, b = ours.pop(rate), theirs.pop(rate)
            assert a == b or abs(a - b) <= 0.05 + 1e-9, (rate, a, b)
        assert ours == theirs
