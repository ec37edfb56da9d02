"""Table definitions of retry-engine: one per table, Arrow first.

Installed as ``retry_engine.schemas``. Each :class:`Table` gives its
``arrow_schema``, ``spark_schema`` and ``pydantic_model``.
"""

from __future__ import annotations

from ._model import Column, Table
from .tables import (
    ALL_TABLES,
    CONSUME_RESULTS,
    DLQ,
    ENGINE_STATE,
    MAINTENANCE,
    MESSAGE_COLUMNS,
    MESSAGES,
    METRICS,
    OUTCOMES,
    PROGRESS,
    QUARANTINE,
    REDRIVE_AUDIT,
    REDRIVE_TASKS,
    RETRY,
    WORK,
)

__all__ = [
    "ALL_TABLES",
    "CONSUME_RESULTS",
    "Column",
    "DLQ",
    "ENGINE_STATE",
    "MAINTENANCE",
    "MESSAGES",
    "MESSAGE_COLUMNS",
    "METRICS",
    "OUTCOMES",
    "PROGRESS",
    "QUARANTINE",
    "REDRIVE_AUDIT",
    "REDRIVE_TASKS",
    "RETRY",
    "Table",
    "WORK",
]
