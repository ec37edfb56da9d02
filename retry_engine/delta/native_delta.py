"""Native Delta I/O: Spark's own ``delta`` format, for clusters that have the Delta Lake jars.

Selected by ``engine.table_format = "delta"`` (the default ``"deltars"`` is the
delta-rs bridge in :mod:`retry_engine.delta`). The engine reads the
consume-result table with ``spark.readStream.format("delta")`` and writes each
micro-batch with :class:`NativeBatchWriter`, which commits every output table
with Delta's own idempotent-write options (``txnAppId`` = the query id,
``txnVersion`` = the batch id).

:func:`require_delta` runs at engine start: without the jars or the two
session settings Delta needs, the engine stops with a
:class:`~retry_engine.errors.EnvironmentProblem` that says what is missing and
how to add it, instead of a Py4J stack trace at the first read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from retry_engine.config import EngineConfig
from retry_engine.core.outputs import ROUTED_TABLES, route_to
from retry_engine.core.packed import unpack
from retry_engine.delta._files import POSITION_ROW_DIGITS
from retry_engine.errors import EnvironmentProblem
from retry_engine.schemas import Table

log = logging.getLogger(__name__)

DELTA_FORMAT = "delta"
DELTA_PACKAGE = "io.delta:delta-spark_2.13"
EXTENSION_CLASS = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG_CLASS = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
EXTENSIONS_KEY = "spark.sql.extensions"
CATALOG_KEY = "spark.sql.catalog.spark_catalog"
DELTA_RELEASES = "https://docs.delta.io/latest/releases.html"


def delta_problems(*, loadable: Callable[[str], bool], conf: Mapping[str, str]) -> list[str]:
    """What keeps Spark from using ``format("delta")``: missing classes, then missing settings."""
    missing = [name for name in (EXTENSION_CLASS, CATALOG_CLASS) if not loadable(name)]
    if missing:
        return [f"the Delta Lake jars are not on the classpath (class {name} not found)" for name in missing]
    problems = []
    extensions = [e.strip() for e in conf.get(EXTENSIONS_KEY, "").split(",") if e.strip()]
    if EXTENSION_CLASS not in extensions:
        problems.append(f"{EXTENSIONS_KEY} does not include {EXTENSION_CLASS} (it is {extensions or 'unset'})")
    if conf.get(CATALOG_KEY) != CATALOG_CLASS:
        problems.append(f"{CATALOG_KEY} is {conf.get(CATALOG_KEY) or 'unset'}, not {CATALOG_CLASS}")
    return problems


def how_to_enable(spark_version: str) -> str:
    """The spark-submit arguments that make ``format("delta")`` work."""
    major_minor = ".".join(spark_version.split(".")[:2])
    return (
        f"start the job with --packages {DELTA_PACKAGE}:<version> (the Delta release built for "
        f"Spark {major_minor}, see {DELTA_RELEASES}) --conf {EXTENSIONS_KEY}={EXTENSION_CLASS} "
        f"--conf {CATALOG_KEY}={CATALOG_CLASS}; or set engine.table_format = \"deltars\" "
        "to use the delta-rs bridge, which needs no jars"
    )


def _jvm(spark: SparkSession) -> Any:
    jvm = spark.sparkContext._jvm
    if jvm is None:
        raise EnvironmentProblem("native Delta needs a classic Spark session with a JVM", code="DELTA_NOT_CONFIGURED")
    return jvm


def require_delta(spark: SparkSession) -> None:
    """Raise :class:`EnvironmentProblem` (``DELTA_JARS_MISSING`` / ``DELTA_NOT_CONFIGURED``) unless Delta is usable."""
    utils = _jvm(spark).org.apache.spark.util.Utils
    conf = {key: spark.conf.get(key, "") or "" for key in (EXTENSIONS_KEY, CATALOG_KEY)}
    problems = delta_problems(loadable=lambda name: bool(utils.classIsLoadable(name)), conf=conf)
    if problems:
        code = "DELTA_JARS_MISSING" if "classpath" in problems[0] else "DELTA_NOT_CONFIGURED"
        raise EnvironmentProblem(
            f'engine.table_format = "delta" but {"; ".join(problems)}: {how_to_enable(spark.version)}',
            code=code,
        )


def ensure_table(spark: SparkSession, path: str, table: Table) -> None:
    """Create an empty Delta table at ``path`` with ``table``'s schema unless one exists."""
    if _jvm(spark).io.delta.tables.DeltaTable.isDeltaTable(spark._jsparkSession, path):
        return
    writer = spark.createDataFrame([], table.spark_schema).write.format(DELTA_FORMAT).mode("append")
    if table.partition_by:
        writer = writer.partitionBy(*table.partition_by)
    writer.save(path)
    log.info("created Delta table %s", path)


def read_stream(
    spark: SparkSession,
    path: str,
    *,
    max_files_per_trigger: int,
    position_column: str,
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """Stream the Delta table at ``path``, with a stream-ordered position string per row.

    The position (file modification time, file name, row index in the file)
    plays the part of the deltars source's ``sourcePositionColumn``: it depends
    only on the file and row, so it is the same when a batch is replayed and so
    are ids derived from it. ``options`` are more of Delta's source options
    (``startingVersion``, ``skipChangeCommits``, ...). Untested: needs the Delta jars.
    """
    frame = (
        spark.readStream.format(DELTA_FORMAT)
        .option("maxFilesPerTrigger", str(max_files_per_trigger))
        .options(**dict(options or {}))
        .load(path)
    )
    position = F.concat_ws(
        "/",
        F.lpad(F.unix_millis(F.col("_metadata.file_modification_time")).cast("string"), 15, "0"),
        F.col("_metadata.file_name"),
        F.lpad(F.col("_metadata.row_index").cast("string"), POSITION_ROW_DIGITS, "0"),
    )
    return frame.withColumn(position_column, position)


def routed_rows(table: Table, batch_id: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` function from packed WORK rows to the rows of ``table`` (the deltars writer's :func:`route`)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from route_to(unpack(batch.column("payload").to_pylist()), table, batch_id).to_batches()

    return run


@dataclass(frozen=True)
class NativeBatchWriter:
    """``foreachBatch`` function writing the engine's output tables with ``format("delta")``.

    Rows go to tables by the same :func:`~retry_engine.core.outputs.route` as the
    deltars writer. One Spark job per table (Delta's writer commits each
    ``save`` on its own); the METRICS table is not written in this mode.
    """

    config: EngineConfig
    app_id: str

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Write batch ``batch_id``. Replayed: Delta skips it on every table whose
        last ``txnVersion`` for ``txnAppId`` is at least ``batch_id``, and writes it to the others."""
        batch.persist()
        try:
            if batch.isEmpty():
                return
            for table in ROUTED_TABLES:
                writer = (
                    batch.mapInArrow(routed_rows(table, batch_id), table.spark_schema)
                    .write.format(DELTA_FORMAT)
                    .mode("append")
                    .option("txnAppId", self.app_id)
                    .option("txnVersion", str(batch_id))
                )
                if table.partition_by:
                    writer = writer.partitionBy(*table.partition_by)
                writer.save(self.config.table_path(table.name))
            log.info("batch %d written to native Delta tables", batch_id)
        finally:
            batch.unpersist()
