"""``retry-engine catalog-ddl`` statements are valid Spark SQL that name the right tables and
locations (#13 part 5). Parsed by Spark's own parser only: the Delta jars are not available here,
so nothing is executed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from retry_engine.config import TABLE_NAMES, parse_config
from retry_engine.ops.catalog import catalog_ddl

# A lake folder name with everything a string literal or identifier could trip over.
HOSTILE = "it's a `lake`; -- \\ back\\slash ünï \"q\""


def parse(spark: Any, statement: str) -> tuple[list[str], str]:
    """(name parts, location) of a CREATE TABLE as Spark's SQL parser reads it."""
    plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(statement)
    parts = plan.name().nameParts()
    return [parts.apply(i) for i in range(parts.size())], plan.tableSpec().location().get()


@pytest.mark.parametrize(
    ("catalog", "schema", "prefix"),
    [(None, None, ""), (None, "ops", "re_"), ("main", "we`ird schema", "x`; ")],
)
def test_every_statement_parses_back_to_its_table_name_and_location(
    spark: Any, tmp_path: Path, catalog: str | None, schema: str | None, prefix: str
) -> None:
    lake = tmp_path / HOSTILE
    config = parse_config({"engine": {"lake": str(lake)}, "tables": {"dlq": "s3://bucket/dead 'letters'"}})
    statements = catalog_ddl(config, catalog=catalog, schema=schema, table_prefix=prefix)
    assert len(statements) == len(TABLE_NAMES)
    for table, statement in zip(TABLE_NAMES, statements, strict=True):
        spark.sql("EXPLAIN " + statement)  # a ParseException if it is not Spark SQL
        parts, location = parse(spark, statement)
        assert parts == [p for p in (catalog, schema) if p is not None] + [prefix + table]
        expected = "s3://bucket/dead 'letters'" if table == "dlq" else f"file:{lake}/{table}"
        assert location == expected
        assert statement.startswith("CREATE TABLE IF NOT EXISTS ") and " USING DELTA LOCATION '" in statement
