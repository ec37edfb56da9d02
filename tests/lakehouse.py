"""A test lake: engine config pointing at a temp folder, plus read/write helpers."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from retry_engine.config import EngineConfig, parse_config
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import Result, results_table

# What a command stopped on a signal must never print (#13 part 2): a Python traceback, py4j or Java
# stacks, an abort at exit, and no error at all ("ERROR ": Python's logging and log4j alike;
# Spark's `ERROR TorrentBroadcast: Store broadcast ... fail` was printed at every stop).
STOP_NOISE = (
    "Traceback",
    "py4j",
    "at org.apache",
    "Exception in thread",
    "SPARK_JOB_CANCELLED",
    "terminate called",
    "TorrentBroadcast",
    "ERROR ",
)

# 18 fast levels so the full RocketMQ ladder (levels 3..18) runs in seconds.
FAST_LEVELS = " ".join(f"{100 + 10 * i}ms" for i in range(18))


@dataclass
class Lake:
    root: Path
    config: EngineConfig

    @classmethod
    def make(cls, root: Path, **overrides: Any) -> Lake:
        engine = {
            "lake": str(root),
            "trigger_interval": "200ms",
            "message_delay_level": FAST_LEVELS,
            "state_bucket": "1s",
            **overrides.pop("engine", {}),
        }
        return cls(root, parse_config({"engine": engine, **overrides}))

    def path(self, table: str) -> str:
        return self.config.table_path(table)

    def engine_toml(self, path: Path, **extra: str) -> Path:
        """A config file for an engine process on this lake (fast levels, 200 ms trigger), ``extra``
        more ``[engine]`` settings given as TOML values (``lease_timeout='"20s"'``)."""
        lines = [
            "[engine]", f'lake = "{self.root}"', 'trigger_interval = "200ms"', 'state_bucket = "1s"',
            f'message_delay_level = "{FAST_LEVELS}"', *(f"{key} = {value}" for key, value in extra.items()),
        ]
        path.write_text("\n".join(lines) + "\n")
        return path

    def write_results(
        self, results: list[Result], schema: pa.Schema = CONSUME_RESULTS.arrow_schema
    ) -> None:
        write_deltalake(self.path("consume_results"), results_table(results, schema), mode="append")

    def rows(self, table: str) -> list[dict[str, Any]]:
        try:
            return DeltaTable(self.path(table)).to_pyarrow_table().to_pylist()
        except TableNotFoundError:  # the engine has not created it yet
            return []


def wait_for(
    predicate: Callable[[], Any], *, timeout: float = 240.0, what: str = "condition"
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.2)


def start_consumer(instance: Any, queries: list[Any]) -> Any:
    """Start ``instance`` and wait for its first progress, one query at a time.

    Python workers spawned by overlapping starts on a busy machine fail
    ("Python worker failed to connect back", see test_clients). Only that
    failure, before any batch, is retried: the instance leaves and rejoins.
    """
    for attempt in range(3):
        query = instance.start()
        queries.append(query)
        wait_for(lambda q=query: q.exception() or q.lastProgress, timeout=300, what=f"{query.name} to start")
        error = query.exception()
        if error is None or "failed to connect back" not in str(error) or attempt == 2:
            return query
        queries.remove(query)
        instance.shutdown(query)
        instance.heartbeat()
    raise AssertionError("unreachable")
