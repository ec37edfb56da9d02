"""Writing one micro-batch of engine output to its Delta tables.

The stateful stage emits rows of the internal ``WORK`` schema; this module
projects them onto the retry, DLQ, quarantine and outcomes tables and commits
each with Delta's idempotent-write protocol (``txnAppId`` = the query id,
``txnVersion`` = the batch id). A replayed batch is therefore skipped by every
table that already committed it and written by the others (B1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from retry_engine.config import EngineConfig
from retry_engine.decide import DEAD_LETTER, KIND_DELIVERY, KIND_OUTCOME, QUARANTINED
from retry_engine.delta import FORMAT_NAME
from retry_engine.schemas import DLQ, OUTCOMES, QUARANTINE, RETRY, Table

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class _Target:
    table: Table
    path: str
    where: Column
    renames: dict[str, Column]


def _project(df: DataFrame, table: Table, renames: dict[str, Column]) -> DataFrame:
    cols = [
        (renames[c.name] if c.name in renames else F.col(c.name)).cast(table.spark_schema[c.name].dataType).alias(c.name)
        for c in table.columns
    ]
    return df.select(*cols)


@dataclass(frozen=True)
class BatchWriter:
    """``foreachBatch`` function: writes one micro-batch to every output table."""

    config: EngineConfig
    app_id: str
    on_counts: Callable[[int, list[tuple[str, str, str, int]]], None] | None = None

    def targets(self) -> list[_Target]:
        outcome = F.col("kind") == KIND_OUTCOME
        return [
            _Target(RETRY, self.config.table_path("retry"), F.col("kind") == KIND_DELIVERY, {}),
            _Target(DLQ, self.config.table_path("dlq"), outcome & (F.col("outcome") == DEAD_LETTER), {}),
            _Target(
                QUARANTINE,
                self.config.table_path("quarantine"),
                outcome & (F.col("outcome") == QUARANTINED),
                {"msg_id": F.col("consumed_msg_id")},
            ),
            _Target(
                OUTCOMES,
                self.config.table_path("outcomes"),
                outcome,
                {
                    "msg_id": F.col("consumed_msg_id"),
                    "origin_msg_id": F.col("consumed_origin_msg_id"),
                    "reconsume_times": F.col("consumed_reconsume_times"),
                },
            ),
        ]

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Write batch ``batch_id``. Replayed: tables that committed it skip it."""
        batch = batch.withColumn("batch_id", F.lit(batch_id).cast("long"))
        batch.persist()
        try:
            # Most batches of an idle engine only fire timeouts and release nothing:
            # skip the four writes (each a Spark job) when there is nothing to write.
            if batch.isEmpty():
                return
            for target in self.targets():
                rows = _project(batch.filter(target.where), target.table, target.renames)
                writer = (
                    rows.write.format(FORMAT_NAME)
                    .mode("append")
                    .option("path", target.path)
                    .option("txnAppId", self.app_id)
                    .option("txnVersion", str(batch_id))
                )
                if target.table.partition_by:
                    writer = writer.option("partitionBy", ",".join(target.table.partition_by))
                writer.save()
            counts = (
                batch.filter(F.col("kind") == KIND_OUTCOME)
                .groupBy("consumer_group", "retry_topic", "outcome")
                .count()
                .collect()
            )
        finally:
            batch.unpersist()
        summary = [(r["consumer_group"] or "", r["retry_topic"] or "", r["outcome"], int(r["count"])) for r in counts]
        if summary:
            log.info("batch %d: %s", batch_id, ", ".join(f"{g}/{t}/{o}={n}" for g, t, o, n in summary))
        if self.on_counts is not None:
            self.on_counts(batch_id, summary)
