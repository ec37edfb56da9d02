"""The Python worker's heap is frozen once (retry_engine.delta._worker_heap), the driver's never.

PySpark's daemon runs a full ``gc.collect()`` after every task of a reused
worker; freezing the start-up heap makes that walk only what tasks allocate
(#15 goal 3, the fixed cost per micro-batch; measured in bench/RESULTS.md).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from retry_engine.delta import _worker_heap


def _report(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In a worker: run the engine's decide stage (on no rows), never ``settle`` itself, and report.

    Workers are reused across tasks and tests, so an earlier task of this one may have settled it
    already (with a smaller heap than now): undo that first, so only the decide stage can freeze.
    """
    from retry_engine.core import engine
    from retry_engine.delta import _worker_heap as heap

    for _ in batches:
        pass
    gc.unfreeze()
    heap._settled = False
    assert gc.get_freeze_count() == 0
    # The stage's mapInArrow function, as the engine hands it to Spark; its decider and
    # state-key split are only used for rows, and it gets none.
    assert list(engine._decide_batches(None, None)(iter(()))) == []  # type: ignore[arg-type]
    yield pa.RecordBatch.from_pydict({
        "worker": [heap.in_python_worker()],
        "frozen": [gc.get_freeze_count()],
        "tracked": [len(gc.get_objects())],
    })


def test_the_decide_stage_freezes_its_workers_start_up_heap(spark: SparkSession) -> None:
    """A worker that ran an engine stage has its start-up heap frozen; collections walk only the rest."""
    rows = (
        spark.range(4, numPartitions=2)
        .mapInArrow(_report, "worker boolean, frozen long, tracked long")
        .collect()
    )
    assert len(rows) == 2
    for row in rows:
        assert row.worker is True
        # the start-up heap (pyspark, pandas, pyarrow, this package) sits in the permanent
        # generation; what a full collection still walks (allocated since) is a small part of it
        assert row.frozen > 20_000, row
        assert row.tracked < row.frozen / 2, row


def test_the_driver_is_not_a_worker_and_keeps_its_heap_collectable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_worker_heap, "_settled", False)  # as if nothing had settled in this process yet
    frozen = gc.get_freeze_count()
    assert _worker_heap.in_python_worker() is False
    _worker_heap.settle()
    assert gc.get_freeze_count() == frozen
