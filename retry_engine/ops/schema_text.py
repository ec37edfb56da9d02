"""The tables' schemas as text (``retry-engine schema``): Arrow, Spark DDL or JSON.

Everything is derived from :mod:`retry_engine.schemas`, the one definition of
each table; the required consume_results columns come from the engine's
decide step. No Spark session (the Spark types are pure Python).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pyspark.sql import types as T

from retry_engine.core.decide import REQUIRED_COLUMNS
from retry_engine.ops.terms import SchemaFormat
from retry_engine.schemas import ALL_TABLES, CONSUME_RESULTS, Table

TABLES: dict[str, Table] = {table.name: table for table in ALL_TABLES}


def spark_ddl_type(data_type: T.DataType) -> str:
    """``data_type`` in Spark SQL's DDL spelling (what ``spark.createDataFrame(rows, ddl)`` parses)."""
    if isinstance(data_type, T.StructType):
        fields = ", ".join(f"{_quote(f.name)}: {_ddl_field_type(f)}" for f in data_type.fields)
        return f"STRUCT<{fields}>"
    if isinstance(data_type, T.ArrayType):
        return f"ARRAY<{spark_ddl_type(data_type.elementType)}>"
    if isinstance(data_type, T.MapType):
        return f"MAP<{spark_ddl_type(data_type.keyType)}, {spark_ddl_type(data_type.valueType)}>"
    return data_type.simpleString().upper()


def _ddl_field_type(field: T.StructField) -> str:
    return spark_ddl_type(field.dataType) + ("" if field.nullable else " NOT NULL")


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def spark_ddl(table: Table) -> str:
    """The table's columns as one Spark DDL schema string."""
    return ", ".join(f"{_quote(f.name)} {_ddl_field_type(f)}" for f in table.spark_schema.fields)


def is_required(table: Table, column: str) -> bool:
    """Whether a writer must give ``column``: consume_results' required inputs, elsewhere the NOT NULL columns."""
    if table.name == CONSUME_RESULTS.name:
        return column in REQUIRED_COLUMNS
    return not table[column].nullable


def _header(table: Table) -> str:
    lines = [f"-- {table.name}: {table.doc}"]
    if table.partition_by:
        lines.append(f"-- partitioned by {', '.join(table.partition_by)}")
    if table.name == CONSUME_RESULTS.name:
        lines.append(
            f"-- required columns: {', '.join(REQUIRED_COLUMNS)}; every other column may be left out (null)"
        )
    return "\n".join(lines)


def _as_json(table: Table) -> dict[str, Any]:
    spark = {f.name: f for f in table.spark_schema.fields}
    return {
        "name": table.name,
        "doc": table.doc,
        "partition_by": list(table.partition_by),
        "columns": [
            {
                "name": column.name,
                "arrow_type": str(column.type),
                "spark_type": spark_ddl_type(spark[column.name].dataType),
                "nullable": column.nullable,
                "required": is_required(table, column.name),
                "doc": column.doc,
            }
            for column in table.columns
        ],
    }


def format_schemas(names: Sequence[str], fmt: SchemaFormat) -> str:
    """The schemas of the tables ``names`` (keys of :data:`TABLES`) as text ending in a newline."""
    tables = [TABLES[name] for name in names]
    if fmt == "json":
        return json.dumps({"tables": [_as_json(t) for t in tables]}, indent=2) + "\n"
    blocks = []
    for table in tables:
        body = (
            spark_ddl(table)
            if fmt == "spark-ddl"
            else table.arrow_schema.to_string(show_schema_metadata=False)
        )
        blocks.append(f"{_header(table)}\n{body}\n")
    return "\n".join(blocks)
