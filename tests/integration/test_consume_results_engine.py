"""#13 part 1 on real Spark: what the helper writes the engine decides, the engine says where its tables are,
and `retry-engine schema --format spark-ddl` is DDL that Spark parses into the tables' own schemas.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from retry_engine import append_consume_results
from retry_engine.core import engine
from retry_engine.ops.schema_text import spark_ddl
from retry_engine.schemas import ALL_TABLES
from tests.lakehouse import Lake, wait_for


def test_spark_ddl_parses_back_to_every_tables_spark_schema(spark: Any) -> None:
    """#13 part 1: the spark-ddl format is exact (types, NOT NULL, nested types), checked by Spark's parser."""
    for table in ALL_TABLES:
        assert spark.createDataFrame([], spark_ddl(table)).schema == table.spark_schema, table.name


@pytest.mark.slow
def test_engine_decides_helper_rows_and_logs_its_tables_at_start(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """#13 part 1: rows from append_consume_results are decided (R1: success acks, failure retries, null
    status fails); the engine logs every table it reads and writes with its location at start."""
    lake = Lake.make(tmp_path / "my lake")
    append_consume_results(
        lake.config,
        pd.DataFrame(
            {
                "consumer_group": ["billing"] * 3,
                "msg_id": ["OK", "LATER", "NULL"],
                "topic": ["orders"] * 3,
                "status": ["CONSUME_SUCCESS", "RECONSUME_LATER", None],
            }
        ),
    )
    with caplog.at_level(logging.INFO, logger="retry_engine.core.engine"):
        query = engine.start(spark, lake.config)
    try:
        wait_for(lambda: len(lake.rows("outcomes")) >= 3, timeout=300, what="an outcome for every helper row")
    finally:
        engine.stop(query)

    outcomes = {o["msg_id"]: o["outcome"] for o in lake.rows("outcomes")}
    assert outcomes == {"OK": "acknowledged", "LATER": "retry", "NULL": "retry"}
    (block,) = [r.getMessage() for r in caplog.records if "retry engine starting on lake" in r.getMessage()]
    lines = block.splitlines()
    assert lines[0] == f"retry engine starting on lake {tmp_path / 'my lake'}; tables:"
    by_name = {line.split()[1]: line.split()[0] for line in lines[1:]}
    for name in ("retry", "dlq", "quarantine", "outcomes", "metrics", "progress"):
        assert by_name[name] == "writes" and any(line.endswith(f"  {lake.path(name)}") for line in lines), name
    assert by_name["consume_results"] == "reads"
    assert any(line.endswith(f"  {lake.path('consume_results')}") for line in lines)
    assert any(line.endswith(f"  {lake.config.checkpoint_path}") for line in lines)
