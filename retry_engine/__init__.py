"""retry-engine: RocketMQ's consumer retry and dead-letter machinery on Spark and Delta Lake."""

from retry_engine.clients.consume_results import append_consume_results

__all__ = ["append_consume_results"]
