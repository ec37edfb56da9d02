"""Delta tables in Spark without the Delta jars: the ``deltars`` data source over delta-rs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from retry_engine.delta.sink import ensure_query_id, write_stream
from retry_engine.delta.source import FORMAT_NAME, DeltaRsDataSource
from retry_engine.delta.tables import append_arrow, ensure_table, read_table, table_version

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Make ``format("deltars")`` available on ``spark``."""
    spark.dataSource.register(DeltaRsDataSource)


__all__ = [
    "FORMAT_NAME",
    "DeltaRsDataSource",
    "append_arrow",
    "ensure_query_id",
    "ensure_table",
    "read_table",
    "register",
    "table_version",
    "write_stream",
]
