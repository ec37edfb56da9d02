"""Native Delta mode on a Spark without the Delta jars: a clear startup error, nothing touched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from retry_engine import engine
from retry_engine.cli import EXIT_ERROR, main
from retry_engine.errors import EnvironmentProblem
from retry_engine.native_delta import CATALOG_CLASS, CATALOG_KEY, EXTENSION_CLASS, EXTENSIONS_KEY
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
