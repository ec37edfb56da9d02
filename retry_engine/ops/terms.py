"""The words the command line shares with the library: summary keys, re-drive targets, task states, schema formats, progress events.

Kept apart (no pandas, no Arrow, no Spark, no pydantic) so the command line builds
its parsers without importing the modules that do the work: every ``retry-engine``
command builds every parser, and those imports cost ~0.5 s a command (the DLQ
client's pandas, the schema text's PySpark). The table names are in
:mod:`retry_engine.core.names`.
"""

from __future__ import annotations

from typing import Literal

# ``dlq stats --by`` / :func:`retry_engine.clients.dlq.summary`: key -> the DLQ column counted by.
SummaryKey = Literal["group", "topic", "error_class", "reason_code", "day"]
SUMMARY_KEYS: dict[str, str] = {
    "group": "consumer_group",
    "topic": "retry_topic",
    "error_class": "error_class",
    "reason_code": "reason_code",
    "day": "day",
}
DEFAULT_SUMMARY: tuple[SummaryKey, ...] = ("group", "topic", "error_class", "day")

# The audit ``target`` of a re-drive, and of a resolution.
# "consumer" is ``dlq resend`` (one dead letter to one consumer instance): a move like a re-drive's,
# but not a ``--to`` of ``dlq redrive``.
RedriveTarget = Literal["topic", "retry", "consumer"]
REDRIVE_TARGETS: tuple[RedriveTarget, ...] = ("topic", "retry")
RESEND_TARGET: RedriveTarget = "consumer"
DEFAULT_CHUNK_SIZE = 100

# A re-drive task's state (:mod:`retry_engine.ops.redrive_tasks`).
TaskState = Literal["running", "cancelling", "finished", "interrupted", "cancelled"]
TASK_STATES: tuple[TaskState, ...] = ("running", "cancelling", "finished", "interrupted", "cancelled")


# ``retry-engine schema --format`` (:mod:`retry_engine.ops.schema_text`).
SchemaFormat = Literal["arrow", "spark-ddl", "json"]
SCHEMA_FORMATS: tuple[SchemaFormat, ...] = ("arrow", "spark-ddl", "json")

# The progress table's events (:mod:`retry_engine.ops.monitor` writes them, ``status`` reads them).
STARTED = "started"
PROGRESS_EVENT = "progress"
IDLE = "idle"
TERMINATED = "terminated"

# Why a query terminated (the ``reason`` of its terminated event).
StopReason = Literal["stopped", "finished", "failed", "lease_lost"]
# Stopped on request: a signal, engine.stop(), or the API's query.stop().
STOPPED: StopReason = "stopped"
# `run --once` processed the input it was started for.
FINISHED: StopReason = "finished"
# The query died with an exception.
FAILED: StopReason = "failed"
# Another engine took the lake over (this one was fenced and stopped).
LEASE_LOST: StopReason = "lease_lost"
STOP_REASONS: tuple[StopReason, ...] = (STOPPED, FINISHED, FAILED, LEASE_LOST)
