"""The Python worker's heap is frozen once (retry_engine.delta._worker_heap), the driver's never.

PySpark's daemon runs a full ``gc.collect()`` after every task of a reused
worker; freezing the start-up heap makes that walk only what tasks allocate
(#15 goal 3, the fixed cost per micro-batch; measured in bench/RESULTS.md).
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from retry_engine.delta import _worker_heap


def _fresh_heap() -> None:
    """In a worker: undo what earlier tasks of this reused worker settled, as if it had just started."""
    from retry_engine.delta import _worker_heap as heap

    gc.unfreeze()
    heap._settled_at, heap._settles = -1, 0


def _report(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In a worker: run the engine's decide stage (on no rows), never ``settle`` itself, and report.

    Workers are reused across tasks and tests, so an earlier task of this one may have settled it
    already (with a smaller heap than now): undo that first, so only the decide stage can freeze.
    """
    from retry_engine.core import engine
    from retry_engine.delta import _worker_heap as heap

    for _ in batches:
        pass
    _fresh_heap()
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


# Stdlib modules a Python worker of this suite has not imported (the first one absent is used).
_LATE_MODULES = ("xml.dom.minidom", "email.mime.multipart", "http.cookiejar", "mailbox", "imaplib", "wave")


def _late_import(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """In a worker: settle, import modules it had not loaded (as a later stage of another kind does), settle again."""
    import importlib
    import sys

    from retry_engine.delta import _worker_heap as heap

    for _ in batches:
        pass
    _fresh_heap()
    heap.settle()  # the first stage this worker runs
    first = gc.get_freeze_count()
    late = [m for m in _LATE_MODULES if m not in sys.modules]
    for name in late:
        importlib.import_module(name)
    grown = len(gc.get_objects())
    heap.settle()  # a stage whose task imported more than the first one did
    yield pa.RecordBatch.from_pydict({
        "late": [len(late)],
        "first": [first],
        "frozen": [gc.get_freeze_count()],
        "grown": [grown],
        "tracked": [len(gc.get_objects())],
    })


def test_a_worker_that_imports_more_for_a_later_stage_freezes_that_too(spark: SparkSession) -> None:
    """A reused worker whose later task imports new modules (the schedule stage's pandas after the
    source's read) freezes them too, so PySpark's per-task collection does not walk them again."""
    rows = (
        spark.range(4, numPartitions=2)
        .mapInArrow(_late_import, "late long, first long, frozen long, grown long, tracked long")
        .collect()
    )
    assert len(rows) == 2
    for row in rows:
        assert row.late > 0, row  # some module was new to the worker
        assert row.frozen > row.first, row  # the second settle froze what the imports added
        assert row.tracked < row.grown, row  # and a collection no longer walks it


def test_a_worker_freezes_only_after_new_imports_and_at_most_max_settles_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No import since the last freeze: no freeze; and a process whose module count keeps changing
    freezes at most MAX_SETTLES times (each freeze keeps the cycles alive at that moment).

    Freezes are counted by call, not by ``gc.get_freeze_count()``: frozen objects can still be
    freed by reference counting, so that count moves on its own (CI: 304,691 -> 304,687)."""
    freezes: list[int] = []
    monkeypatch.setattr(_worker_heap, "_settled_at", -1)
    monkeypatch.setattr(_worker_heap, "_settles", 0)
    monkeypatch.setattr(_worker_heap, "in_python_worker", lambda: True)
    monkeypatch.setattr(gc, "collect", lambda *args: 0)
    monkeypatch.setattr(gc, "freeze", lambda: freezes.append(len(sys.modules)))
    _worker_heap.settle()
    _worker_heap.settle()
    assert len(freezes) == 1
    for i in range(_worker_heap.MAX_SETTLES + 5):
        monkeypatch.setitem(sys.modules, f"_retry_engine_heap_test_{i}", types.ModuleType("m"))
        _worker_heap.settle()
    assert len(freezes) == _worker_heap.MAX_SETTLES
    assert _worker_heap._settles == _worker_heap.MAX_SETTLES


def test_the_driver_is_not_a_worker_and_keeps_its_heap_collectable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_worker_heap, "_settled_at", -1)  # as if nothing had settled in this process yet
    monkeypatch.setattr(_worker_heap, "_settles", 0)
    frozen = gc.get_freeze_count()
    assert _worker_heap.in_python_worker() is False
    _worker_heap.settle()
    assert gc.get_freeze_count() == frozen
