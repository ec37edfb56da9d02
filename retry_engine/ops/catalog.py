"""``retry-engine catalog-ddl``: register the lake's tables in a metastore or Unity Catalog.

Prints one ``CREATE TABLE IF NOT EXISTS <name> USING DELTA LOCATION '<uri>'``
per table, so a Spark SQL user (or Databricks) can query ``dlq`` by name
instead of by path. Nothing is executed here: names are quoted and locations
escaped for Spark SQL's parser, and the statements are only text.
"""

from __future__ import annotations

import os
import re

from retry_engine.config import EngineConfig
from retry_engine.core.names import TABLE_NAMES
from retry_engine.errors import ConfigError

# A URI scheme of two or more characters ("s3a://", "abfss://", "file:/"); one letter is a Windows drive.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Spark SQL string literals: backslash escapes are processed (spark.sql.parser.escapedStringLiterals=false).
_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote_identifier(name: str, *, what: str = "name") -> str:
    """``name`` as one back-quoted Spark SQL identifier part (a back quote inside is doubled).

    Raises :class:`ConfigError` for an empty name or one with control
    characters, which no catalog accepts as a table or schema name.
    """
    if not isinstance(name, str) or not name or _CONTROL.search(name):
        raise ConfigError(
            f"{what} {name!r} must be a non-empty name without control characters", code="INVALID_IDENTIFIER"
        )
    return "`" + name.replace("`", "``") + "`"


def sql_string(text: str) -> str:
    """``text`` as a single-quoted Spark SQL string literal that parses back to ``text``."""
    escaped = "".join(_ESCAPES.get(ch, ch) for ch in text)
    if _CONTROL.search(escaped):
        raise ConfigError(f"location {text!r} has control characters; no table can be registered there", code="INVALID_LOCATION")
    return f"'{escaped}'"


def table_location(path: str) -> str:
    """The location to register: a URI as configured, a local path as an absolute ``file:`` URI.

    A local path is made absolute (a metastore resolves a relative one against
    its own working directory) and gets ``file:``, so a cluster whose default
    file system is HDFS still finds it. It is not percent-encoded: Hadoop
    reads ``file:/a b`` as the folder ``/a b``.
    """
    if _SCHEME.match(path):
        return path
    return "file:" + os.path.abspath(path)


def catalog_ddl(
    config: EngineConfig, *, catalog: str | None = None, schema: str | None = None, table_prefix: str = ""
) -> list[str]:
    """One ``CREATE TABLE IF NOT EXISTS ... USING DELTA LOCATION ...`` per table of the lake.

    The name is ``[catalog.][schema.]<table_prefix><table>`` (``dlq``,
    ``retry``, ...), each part quoted. ``catalog`` needs ``schema`` (Unity
    Catalog's three-level names). Each statement ends with ``;``.
    """
    if catalog is not None and schema is None:
        raise ConfigError(f"catalog {catalog!r} needs a schema too (catalog.schema.table)", code="INVALID_IDENTIFIER")
    prefix = [quote_identifier(part, what=what) for part, what in ((catalog, "catalog"), (schema, "schema")) if part is not None]
    statements = []
    for table in TABLE_NAMES:
        name = ".".join([*prefix, quote_identifier(table_prefix + table, what="table name")])
        location = sql_string(table_location(config.table_path(table)))
        statements.append(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA LOCATION {location};")
    return statements
