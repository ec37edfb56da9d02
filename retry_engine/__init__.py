"""retry-engine: RocketMQ's consumer retry and dead-letter machinery on Spark and Delta Lake.

The package imports nothing itself: Spark starts several Python processes that
only unpickle the ``deltars`` data source (its planner, the streaming source
runner), and each paid ~90 ms of CPU for this name's configuration models
(pydantic) before; ``append_consume_results`` is imported when first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from retry_engine.clients.consume_results import append_consume_results

__all__ = ["append_consume_results"]


def __getattr__(name: str) -> Any:
    if name == "append_consume_results":
        from retry_engine.clients.consume_results import append_consume_results

        return append_consume_results
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
