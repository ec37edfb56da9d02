"""Native Delta mode without Spark: config validation and the startup diagnosis."""

from __future__ import annotations

import pytest

from retry_engine.config import parse_config
from retry_engine.delta.native_delta import (
    CATALOG_CLASS,
    CATALOG_KEY,
    EXTENSION_CLASS,
    EXTENSIONS_KEY,
    delta_problems,
    how_to_enable,
)
from retry_engine.errors import ConfigError

DELTA_CONF = {EXTENSIONS_KEY: EXTENSION_CLASS, CATALOG_KEY: CATALOG_CLASS}


def test_table_format_defaults_to_deltars_and_accepts_delta() -> None:
    assert parse_config({}).engine.table_format == "deltars"
    assert parse_config({"engine": {"table_format": "delta"}}).engine.table_format == "delta"


def test_unknown_table_format_names_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"engine.table_format.*'deltars' or 'delta'.*got 'parquet'"):
        parse_config({"engine": {"table_format": "parquet"}})


def test_missing_jars_are_named_before_settings() -> None:
    problems = delta_problems(loadable=lambda name: False, conf={})
    assert problems == [
        f"the Delta Lake jars are not on the classpath (class {EXTENSION_CLASS} not found)",
        f"the Delta Lake jars are not on the classpath (class {CATALOG_CLASS} not found)",
    ]


def test_jars_without_settings_name_each_missing_setting() -> None:
    problems = delta_problems(loadable=lambda name: True, conf={EXTENSIONS_KEY: "com.acme.Ext"})
    assert len(problems) == 2
    assert f"{EXTENSIONS_KEY} does not include {EXTENSION_CLASS}" in problems[0] and "com.acme.Ext" in problems[0]
    assert problems[1] == f"{CATALOG_KEY} is unset, not {CATALOG_CLASS}"


def test_delta_extension_among_several_is_enough() -> None:
    conf = {**DELTA_CONF, EXTENSIONS_KEY: f"com.acme.Ext, {EXTENSION_CLASS}"}
    assert delta_problems(loadable=lambda name: True, conf=conf) == []


def test_how_to_enable_gives_package_and_both_settings() -> None:
    advice = how_to_enable("4.3.0")
    assert "--packages io.delta:delta-spark_2.13:<version>" in advice and "Spark 4.3" in advice
    assert f"--conf {EXTENSIONS_KEY}={EXTENSION_CLASS}" in advice
    assert f"--conf {CATALOG_KEY}={CATALOG_CLASS}" in advice
