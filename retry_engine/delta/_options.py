"""Parsing ``format("deltars")`` options: case-insensitive keys, typed values, clear errors."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Final

from retry_engine.errors import ConfigError

_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}

# The name Spark knows the data source by: ``spark.read.format(FORMAT_NAME)``.
FORMAT_NAME: Final = "deltars"


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    """Options with lower-case keys (Spark's are case-insensitive; a plain dict copy is not)."""
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def parse_bool(options: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = options.get(name.lower())
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option {name}={raw!r} must be 'true' or 'false'", code="INVALID_OPTION")
    return value == "true"


def parse_positive_int(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"option {name}={raw!r} must be a positive integer", code="INVALID_OPTION")
    return value


def parse_bytes(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None or raw.strip() == "":
        return None
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", raw)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _BYTE_UNITS or int(match.group(1)) < 1:
        raise ConfigError(
            f"option {name}={raw!r} must be a positive size in bytes, optionally with a unit "
            f"({', '.join(u for u in _BYTE_UNITS if u)})",
            code="INVALID_OPTION",
        )
    return int(match.group(1)) * _BYTE_UNITS[unit]


def require_path(options: Mapping[str, str]) -> str:
    path = options.get("path", "").strip()
    if not path:
        raise ConfigError(
            "format('deltars') needs option 'path': the Delta table's folder or URI "
            "(.option('path', p) or .load(p) / .save(p))",
            code="PATH_MISSING",
        )
    return path


# Delta's forms of ``startingTimestamp``: a date, or a date and time (UTC unless an offset is given).
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
TIMESTAMP_FORMS = "a date 'YYYY-MM-DD' or a timestamp 'YYYY-MM-DDTHH:MM:SS[.ffffff][Z|+HH:MM]'"


def parse_timestamp_ms(raw: str, *, name: str = "startingTimestamp") -> int:
    """Delta's ``startingTimestamp`` forms as epoch milliseconds (naive values are UTC).

    Raises :class:`ConfigError` ``INVALID_OPTION`` naming the value and the forms accepted.
    """
    return (parse_timestamp(raw, name=name) - _EPOCH) // dt.timedelta(milliseconds=1)


def parse_timestamp(raw: str, *, name: str) -> dt.datetime:
    """Delta's ``startingTimestamp`` forms as a time with its zone (naive values are UTC); see
    :func:`parse_timestamp_ms`."""
    text = raw.strip()
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}([ T][0-9:.]+(Z|[+-]\d{2}:?\d{2})?)?", text):
            raise ValueError("not a date or timestamp")
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"option {name}={raw!r} is not {TIMESTAMP_FORMS}", code="INVALID_OPTION") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)
