"""Delta tables in Spark without the Delta jars: the ``deltars`` data source over delta-rs.

``register(spark)`` makes ``format("deltars")`` available; the helpers work on
tables from plain Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from retry_engine.delta._checkpoint import ensure_query_id, read_query_id
from retry_engine.delta._options import FORMAT_NAME
from retry_engine.delta.datasource import DeltaRsDataSource
from retry_engine.delta.sink import DeltaBatchWriter, DeltaStreamWriter, SinkOptions, write_stream
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

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Make ``format("deltars")`` available on ``spark`` (idempotent)."""
    spark.dataSource.register(DeltaRsDataSource)


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
