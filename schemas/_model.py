"""The small vocabulary every table definition in this package is written in.

A :class:`Column` is defined once (in :mod:`columns`) and reused by every table
that carries it; a :class:`Table` is an ordered tuple of columns plus its
partitioning. The Arrow schema is the canonical form; the Spark and pydantic
views are derived from it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pydantic

if TYPE_CHECKING:
    from pyspark.sql.types import StructType


@dataclass(frozen=True)
class Column:
    """One column: name, Arrow type, nullability and a one-line meaning."""

    name: str
    type: pa.DataType
    doc: str
    nullable: bool = True

    @property
    def field(self) -> pa.Field:
        return pa.field(self.name, self.type, nullable=self.nullable)

    def variant(self, *, doc: str | None = None, nullable: bool | None = None) -> Column:
        """The same column as seen by another table (its own doc or nullability)."""
        return replace(
            self,
            doc=self.doc if doc is None else doc,
            nullable=self.nullable if nullable is None else nullable,
        )


@dataclass(frozen=True)
class Table:
    """A table: its logical name, columns in order, and partition columns."""

    name: str
    doc: str
    columns: tuple[Column, ...]
    partition_by: tuple[str, ...] = ()
    _by_name: dict[str, Column] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {c.name: c for c in self.columns}
        if len(by_name) != len(self.columns):
            raise ValueError(f"table {self.name} repeats a column name")
        missing = [p for p in self.partition_by if p not in by_name]
        if missing:
            raise ValueError(f"table {self.name}: partition columns {missing} are not columns")
        object.__setattr__(self, "_by_name", by_name)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def __getitem__(self, name: str) -> Column:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([c.field for c in self.columns])

    @cached_property
    def spark_schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self.arrow_schema)

    @cached_property
    def pydantic_model(self) -> type[pydantic.BaseModel]:
        """A pydantic model of one row: validates a dict before it is written."""
        fields: dict[str, Any] = {}
        for c in self.columns:
            py = _python_type(c.type)
            fields[c.name] = (py, ...) if not c.nullable else (py | None, None)
        model: type[pydantic.BaseModel] = pydantic.create_model(
            f"{_camel(self.name)}Row",
            __config__=pydantic.ConfigDict(extra="forbid", strict=False),
            **fields,
        )
        return model


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _python_type(t: pa.DataType) -> Any:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return str
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return bytes
    if pa.types.is_integer(t):
        return int
    if pa.types.is_floating(t):
        return float
    if pa.types.is_boolean(t):
        return bool
    if pa.types.is_timestamp(t):
        return dt.datetime
    if pa.types.is_map(t):
        return dict[_python_type(t.key_type), _python_type(t.item_type) | None]  # type: ignore[misc]
    if pa.types.is_list(t):
        return list[_python_type(t.value_type)]  # type: ignore[misc]
    if pa.types.is_struct(t):
        return dict[str, Any]
    raise TypeError(f"no Python type for Arrow type {t}")
