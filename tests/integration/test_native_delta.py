"""Native Delta mode on a Spark without the Delta jars: a clear startup error, nothing touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from retry_engine.core import engine
from retry_engine.delta.native_delta import (
    CATALOG_CLASS,
    CATALOG_KEY,
    EXTENSION_CLASS,
    EXTENSIONS_KEY,
)
from retry_engine.errors import EnvironmentProblem
from retry_engine.ops.cli import EXIT_ERROR, main
from tests.lakehouse import Lake


def test_delta_format_without_jars_fails_at_start_naming_the_fix(spark: Any, tmp_path: Path) -> None:
    lake = Lake.make(tmp_path, engine={"table_format": "delta"})
    with pytest.raises(EnvironmentProblem, match=r"\[DELTA_JARS_MISSING\].*io\.delta\.sql\.DeltaSparkSessionExtension") as err:
        engine.start(spark, lake.config)
    message = str(err.value)
    assert "--packages io.delta:delta-spark_2.13:<version>" in message
    assert f"--conf {EXTENSIONS_KEY}={EXTENSION_CLASS}" in message
    assert f"--conf {CATALOG_KEY}={CATALOG_CLASS}" in message
    # Checked before anything is created: no checkpoint, no source table.
    assert list(tmp_path.iterdir()) == []
    assert spark.streams.active == []


def test_cli_reports_missing_jars_without_a_java_trace(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path}/lake"\ntable_format = "delta"\n')
    assert main(["run", "--config", str(conf), "--once"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("retry-engine: [DELTA_JARS_MISSING] engine.table_format = \"delta\" but the Delta Lake jars")
    assert "Py4J" not in err and "at org.apache" not in err
    spark.sparkContext.setLogLevel("ERROR")


def test_deltars_format_on_the_same_session_needs_no_jars(spark: Any, tmp_path: Path) -> None:
    lake = Lake.make(tmp_path)
    assert lake.config.engine.table_format == "deltars"
    query = engine.start(spark, lake.config)
    try:
        assert query.isActive
    finally:
        query.stop()


def test_native_writer_routes_rows_on_spark_as_the_deltars_writer_does(spark: Any) -> None:
    """The format("delta") writer splits a micro-batch by the same route() (only the save differs)."""
    import datetime as dt

    import pyarrow as pa

    from retry_engine.config import parse_config
    from retry_engine.core.outputs import ROUTED_TABLES, route
    from retry_engine.core.packed import pack
    from retry_engine.delta.native_delta import routed_rows
    from tests.builders import T0, Result, delivered, work_rows

    config = parse_config({"engine": {"auto_create_groups": False}, "groups": {"G": {}}})
    work = work_rows(
        [Result.of("A").ok(), Result.of("F").failed(), Result.of("D").failed(delay_level_when_next_consume=-1),
         Result.of("Q").with_(status="WHAT")],
        batch_ts=T0 + dt.timedelta(seconds=2),
        config=config,
    )
    rows = pa.concat_tables([work, delivered(work, late_ms=[3])])
    expected = route(rows, 7)
    batch = spark.createDataFrame(pa.Table.from_batches([pack(rows)])).repartition(2)
    for table in ROUTED_TABLES:
        got = batch.mapInArrow(routed_rows(table, 7), table.spark_schema).toArrow()
        want = expected.get(table.name, table.arrow_schema.empty_table())
        key = "msg_id"
        assert sorted(got.column(key).to_pylist()) == sorted(want.column(key).to_pylist()), table.name
        assert got.num_rows == want.num_rows
        if "batch_id" in table:
            assert set(got.column("batch_id").to_pylist()) <= {7}
