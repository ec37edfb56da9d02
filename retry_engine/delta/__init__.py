"""Delta tables in Spark without the Delta jars: the ``deltars`` data source over delta-rs.

``register(spark)`` makes ``format("deltars")`` available; the helpers work on
tables from plain Python.

The names below are imported on first use: importing a submodule (``storage`` for
the configuration, ``_log`` for Spark's planner processes) runs this file first,
and importing the data source, sink and source here made every one of those import
PySpark's data source API and Arrow's compute kernels (~0.1 s a process).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from retry_engine.delta._checkpoint import ensure_query_id, read_query_id
    from retry_engine.delta._options import FORMAT_NAME
    from retry_engine.delta.datasource import DeltaRsDataSource
    from retry_engine.delta.sink import (
        DeltaBatchWriter,
        DeltaStreamWriter,
        SinkOptions,
        write_stream,
    )
    from retry_engine.delta.source import (
        DEFAULT_MAX_FILES_PER_TRIGGER,
        DeltaBatchReader,
        DeltaStreamReader,
        SourceOptions,
    )
    from retry_engine.delta.tables import (
        append_arrow,
        ensure_readable_table,
        ensure_table,
        read_table,
        report_drift,
        table_version,
    )

# Public name -> the submodule that defines it.
_HOMES = {
    "ensure_query_id": "_checkpoint",
    "read_query_id": "_checkpoint",
    "FORMAT_NAME": "_options",
    "DeltaRsDataSource": "datasource",
    "DeltaBatchWriter": "sink",
    "DeltaStreamWriter": "sink",
    "SinkOptions": "sink",
    "write_stream": "sink",
    "DEFAULT_MAX_FILES_PER_TRIGGER": "source",
    "DeltaBatchReader": "source",
    "DeltaStreamReader": "source",
    "SourceOptions": "source",
    "append_arrow": "tables",
    "ensure_readable_table": "tables",
    "ensure_table": "tables",
    "read_table": "tables",
    "report_drift": "tables",
    "table_version": "tables",
}


def register(spark: SparkSession) -> None:
    """Make ``format("deltars")`` available on ``spark`` (idempotent)."""
    from retry_engine.delta.datasource import DeltaRsDataSource

    spark.dataSource.register(DeltaRsDataSource)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Every public name, loaded or not (a notebook's tab completion lists them all)."""
    return sorted({*globals(), *_HOMES})


__all__ = [
    "DEFAULT_MAX_FILES_PER_TRIGGER",
    "DeltaBatchReader",
    "DeltaBatchWriter",
    "DeltaRsDataSource",
    "DeltaStreamReader",
    "DeltaStreamWriter",
    "FORMAT_NAME",
    "SinkOptions",
    "SourceOptions",
    "append_arrow",
    "ensure_query_id",
    "ensure_readable_table",
    "ensure_table",
    "read_query_id",
    "read_table",
    "register",
    "report_drift",
    "table_version",
    "write_stream",
]
