"""The byte cap on Arrow batches is the engine query's, not the session's (#15 goal 1).

Spark measures an Arrow batch after every row when
``spark.sql.execution.arrow.maxBytesPerBatch`` is a cap (Spark 4.3's default is 64 MiB), which
made the deltars sink's wide rows 2.5x slower (bench/RESULTS.md run U); the engine's packed rows
need the cap (a few rows of up to 4 MB each, in JVM direct memory).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from retry_engine.core import engine
from retry_engine.delta import session as session_module
from tests.builders import Result
from tests.lakehouse import Lake, wait_for

KEY = session_module.ARROW_MAX_BYTES_KEY
NONE = session_module.ARROW_MAX_BYTES_NONE


def _run_one_batch(spark: SparkSession, tmp_path: Path) -> list[str]:
    lake = Lake.make(tmp_path / "lake", engine={"checkpoint": str(tmp_path / "ck")})
    lake.write_results([Result.of("cap-1").ok()])
    seen: list[str] = []

    def record(batch: DataFrame, batch_id: int) -> None:
        seen.append(batch.sparkSession.conf.get(KEY))

    query = engine.start(spark, lake.config, writer=record)
    try:
        wait_for(lambda: bool(seen), timeout=120, what="a batch")
    finally:
        engine.stop(query)
    return seen


def test_the_engine_s_batches_are_capped_and_the_session_is_not(spark: SparkSession, tmp_path: Path) -> None:
    # The session (build_session) has no cap, where Spark's default would be 64 MiB.
    assert spark.conf.get(KEY) == NONE
    seen = _run_one_batch(spark, tmp_path)
    assert set(seen) == {str(session_module.ARROW_MAX_BYTES_PER_BATCH)}
    # Restored for whatever else the session runs (the deltars sink's wide rows).
    assert spark.conf.get(KEY) == NONE


def test_a_cap_the_session_already_has_is_kept(spark: SparkSession, tmp_path: Path) -> None:
    spark.conf.set(KEY, "1048576")
    try:
        assert set(_run_one_batch(spark, tmp_path)) == {"1048576"}
        assert spark.conf.get(KEY) == "1048576"
    finally:
        spark.conf.set(KEY, NONE)


def test_a_failed_start_gives_the_session_its_setting_back(spark: SparkSession) -> None:
    with pytest.raises(RuntimeError, match="start failed"):
        with session_module.capped_arrow_batches(spark):
            assert spark.conf.get(KEY) == str(session_module.ARROW_MAX_BYTES_PER_BATCH)
            raise RuntimeError("start failed")
    assert spark.conf.get(KEY) == NONE
