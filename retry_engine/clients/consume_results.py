"""Writing consume results: the engine's input contract, checked before rows reach the lake.

:func:`append_consume_results` takes rows as a pandas DataFrame, a pyarrow
Table or RecordBatch, or a list of dicts; fills the optional columns with
null; refuses unknown columns (naming the closest known one), missing
required columns and values that do not fit a column's type without loss;
then runs the engine's own decision step over the rows and refuses any row
the engine would quarantine (blank ids, bad group or topic names, unknown
status, ...), with the engine's reason code. Only then does it append, with
delta-rs, creating the table with the engine's schema if it is missing.

The columns come from :data:`retry_engine.schemas.CONSUME_RESULTS` and the
required ones from the engine's decide step: nothing is defined twice.
No Spark here.
"""

from __future__ import annotations

import datetime as dt
import difflib
import logging
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from retry_engine.config import EngineConfig, parse_config, resolve_path
from retry_engine.core.decide import (
    BATCH_TS,
    POSITION,
    QUARANTINED,
    REQUIRED_COLUMNS,
    Decider,
    decide_or_quarantine,
)
from retry_engine.delta._schema import normalize_type, schema_drift
from retry_engine.delta.tables import append_arrow, open_table, table_arrow_schema
from retry_engine.errors import (
    ConsumeResultTypeError,
    InvalidConsumeResultError,
    SchemaMismatchError,
)
from retry_engine.schemas import CONSUME_RESULTS

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

TABLE = CONSUME_RESULTS.name
# What the engine's quarantine codes ask the writer to do.
_FIXES = {
    "MISSING_MSG_ID": "give every row its message's msg_id",
    "MISSING_GROUP": "set consumer_group to the group that consumed the message",
    "MISSING_TOPIC": "set topic to the topic the message was delivered from",
    "INVALID_GROUP_NAME": "use a group name of letters, digits, %, |, _ and - only",
    "INVALID_TOPIC_NAME": "use a topic name of letters, digits, %, |, _ and - only",
    "UNKNOWN_STATUS": "use CONSUME_SUCCESS, RECONSUME_LATER, EXCEPTION, or null for a failure",
    "UNKNOWN_MESSAGE_MODEL": "use CLUSTERING, BROADCASTING, or null for CLUSTERING",
    "BODY_TOO_LARGE": "keep the body within engine.max_body_bytes (pass the config that sets it)",
    "INVALID_RECONSUME_TIMES": "reconsume_times counts the failed deliveries before this one: 0 or more",
    "INVALID_MAX_RECONSUME_TIMES": "use -1 or null for the group's limit, else 0 or more",
    "INVALID_UTF8": "write text as valid UTF-8",
}


def append_consume_results(
    lake: str | os.PathLike[str] | EngineConfig,
    rows: pd.DataFrame | pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]],
) -> int:
    """Check ``rows`` against the engine's input contract and append them to ``consume_results``.

    ``lake`` is the lake folder (the table is ``<lake>/consume_results``; ``~``
    is expanded, a relative path is relative to the working directory) or an
    :class:`~retry_engine.config.EngineConfig`, whose table path and limits
    (``engine.max_body_bytes``, delay levels) are then used. ``rows`` is a
    pandas DataFrame, a pyarrow Table or RecordBatch, or a list of dicts.

    Returns the number of rows written (0 rows: nothing is written). Raises
    :class:`~retry_engine.errors.InvalidConsumeResultError` (or its
    ``TypeError`` flavour :class:`~retry_engine.errors.ConsumeResultTypeError`)
    naming the column, the row and the fix, and then writes nothing. Not
    idempotent: calling it twice writes the rows twice (the engine records a
    repeated ``(consumer_group, msg_id)`` within its dedup window as a duplicate).
    """
    config = lake if isinstance(lake, EngineConfig) else _config_for(lake)
    if (
        isinstance(rows, Sequence)
        and not isinstance(rows, (str, bytes, bytearray))
        and len(rows) == 0
    ):
        return 0
    table = conform(rows)
    if table.num_rows == 0:
        return 0
    check_values(table, config)
    path = config.table_path(TABLE)
    existing = open_table(path)
    if existing is not None:
        drifts = schema_drift(table_arrow_schema(existing), CONSUME_RESULTS.arrow_schema)
        if drifts:
            raise SchemaMismatchError(
                f"{path} does not have the engine's consume_results schema, so these rows cannot be appended "
                f"as they are: {'; '.join(d.describe() for d in drifts)}. Write to a new table (the engine reads "
                "a drifted one, but this helper writes only the engine's schema), or append with your own writer",
                code="CONSUME_RESULTS_DRIFTED",
            )
    append_arrow(path, table)
    written: int = table.num_rows
    log.info("appended %d consume results to %s", written, path)
    return written


def _config_for(lake: str | os.PathLike[str]) -> EngineConfig:
    if not isinstance(lake, (str, os.PathLike)):
        raise ConsumeResultTypeError(
            f"lake must be a folder path or an EngineConfig, got {type(lake).__name__}",
            code="INVALID_LAKE",
        )
    return parse_config(
        {"engine": {"lake": resolve_path(os.fspath(lake))}}, source="append_consume_results"
    )


# -- shape and types ------------------------------------------------------------------


def conform(rows: Any) -> pa.Table:
    """``rows`` as an Arrow table of exactly the consume_results schema (optional columns null).

    Raises on an unsupported container, an unknown or duplicated column, a
    missing required column, or a value that does not fit its column without loss.
    """
    columns = _columns(rows)
    _check_names(list(columns))
    n = _row_count(rows)
    arrays = [
        columns[f.name](f) if f.name in columns else pa.nulls(n, f.type)
        for f in CONSUME_RESULTS.arrow_schema
    ]
    return pa.Table.from_arrays(arrays, schema=CONSUME_RESULTS.arrow_schema)


class _Column:
    """One input column, converted on demand to its table field."""

    def __init__(self, name: str, values: Any, kind: str) -> None:
        self.name, self.values, self.kind = name, values, kind

    def __call__(self, field: pa.Field) -> pa.Array:
        if self.kind == "python":
            return _from_python(self.name, self.values, field.type)
        if self.kind == "pandas":
            series = self.values
            if series.dtype == object:
                return _from_python(self.name, series.tolist(), field.type, from_pandas=True)
            try:
                array = pa.Array.from_pandas(series)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
                raise ConsumeResultTypeError(
                    f"column {self.name!r} ({series.dtype}) cannot be read as Arrow: {exc}; {_want(field.type)}",
                    code="COLUMN_TYPE_MISMATCH",
                ) from None
            return _from_arrow(self.name, array, field.type)
        return _from_arrow(self.name, self.values, field.type)


def _columns(rows: Any) -> dict[str, _Column]:
    import pandas as pd

    if isinstance(rows, pd.DataFrame):
        labels = list(rows.columns)
        _check_column_labels(labels)
        return {name: _Column(name, rows[name], "pandas") for name in labels}
    if isinstance(rows, pa.RecordBatch):
        rows = pa.Table.from_batches([rows])
    if isinstance(rows, pa.Table):
        _check_column_labels(rows.column_names)
        return {
            name: _Column(name, rows.column(name).combine_chunks(), "arrow")
            for name in rows.column_names
        }
    if isinstance(rows, Sequence) and not isinstance(rows, (str, bytes, bytearray)):
        names: list[Any] = []
        seen: set[Any] = set()
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise ConsumeResultTypeError(
                    f"row {i} is a {type(row).__name__}, not a dict; pass a list of dicts (column name -> value)",
                    code="UNSUPPORTED_ROWS",
                )
            for key in row:
                if key not in seen:
                    seen.add(key)
                    names.append(key)
        _check_column_labels(names)
        return {name: _Column(name, [row.get(name) for row in rows], "python") for name in names}
    raise ConsumeResultTypeError(
        f"rows must be a pandas DataFrame, a pyarrow Table or RecordBatch, or a list of dicts; got {type(rows).__name__}",
        code="UNSUPPORTED_ROWS",
    )


def _row_count(rows: Any) -> int:
    return rows.num_rows if isinstance(rows, (pa.Table, pa.RecordBatch)) else len(rows)


def _check_column_labels(names: Sequence[Any]) -> None:
    for name in names:
        if not isinstance(name, str):
            raise ConsumeResultTypeError(
                f"column name {name!r} is a {type(name).__name__}; column names are strings "
                f"({', '.join(CONSUME_RESULTS.names)})",
                code="UNKNOWN_COLUMN",
            )
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise InvalidConsumeResultError(
            f"column {repeated[0]!r} appears more than once; give each column once",
            code="DUPLICATE_COLUMN",
        )


def _check_names(names: list[str]) -> None:
    known = CONSUME_RESULTS.names
    for name in names:
        if name not in CONSUME_RESULTS:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise InvalidConsumeResultError(
                f"column {name!r} is not a consume_results column; {hint}the engine would ignore it, so rename "
                f"or drop it. Columns: {', '.join(known)}",
                code="UNKNOWN_COLUMN",
            )
    # status must be written even though null is a valid value (a failure, R1): a forgotten
    # status column would silently turn every row into a failure.
    for name in REQUIRED_COLUMNS:
        if name not in names:
            note = " (a null status means the consumption failed)" if name == "status" else ""
            raise InvalidConsumeResultError(
                f"the rows have no column {name!r}; every consume result needs {', '.join(REQUIRED_COLUMNS)}{note}. "
                f"{name}: {CONSUME_RESULTS[name].doc}",
                code="REQUIRED_COLUMN_MISSING",
            )


def _want(t: pa.DataType) -> str:
    """What to write into a column of Arrow type ``t``, in words."""
    if pa.types.is_integer(t):
        info = {32: (-(2**31), 2**31 - 1), 64: (-(2**63), 2**63 - 1)}.get(t.bit_width)
        span = f" from {info[0]} to {info[1]}" if info else ""
        return f"write whole numbers{span} ({t}) or null"
    if pa.types.is_string(t):
        return "write text (str) or null"
    if pa.types.is_binary(t):
        return "write bytes (text is stored as its UTF-8 bytes) or null"
    if pa.types.is_timestamp(t):
        return "write datetimes (naive ones are taken as UTC) or null"
    if pa.types.is_map(t):
        return "write a dict of str to str or null"
    if pa.types.is_list(t):
        return f"write a list of dicts with keys {', '.join(f.name for f in t.value_type)} or null"
    return f"write {t} values or null"


def _loose_value(value: Any, t: pa.DataType) -> bool:
    """Whether pyarrow would accept ``value`` into a ``t`` column only by reinterpreting it.

    pyarrow truncates 2.5 to 2 in an int column and reads an int as
    microseconds in a timestamp column; both would store something else than
    was meant.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    if (
        pa.types.is_integer(t)
        and isinstance(value, numbers.Real)
        and not isinstance(value, numbers.Integral)
    ):
        return not (math.isfinite(value) and float(value).is_integer())
    if pa.types.is_timestamp(t):
        return not isinstance(value, (dt.datetime, np.datetime64))
    return False


def _from_python(
    name: str, values: list[Any], t: pa.DataType, *, from_pandas: bool = False
) -> pa.Array:
    for i, value in enumerate(values):
        if _loose_value(value, t):
            raise ConsumeResultTypeError(
                f"column {name!r}, row {i}: {_show(value)} ({type(value).__name__}) does not fit {t} without loss; "
                f"{_want(t)}",
                code="COLUMN_TYPE_MISMATCH",
            )
    try:
        return pa.array(values, type=t, from_pandas=from_pandas)
    except (
        pa.ArrowInvalid,
        pa.ArrowTypeError,
        pa.ArrowNotImplementedError,
        OverflowError,
        TypeError,
        ValueError,
    ):
        pass
    for i, value in enumerate(values):
        try:
            pa.array([value], type=t, from_pandas=from_pandas)
        except (
            pa.ArrowInvalid,
            pa.ArrowTypeError,
            pa.ArrowNotImplementedError,
            OverflowError,
            TypeError,
            ValueError,
        ) as exc:
            raise ConsumeResultTypeError(
                f"column {name!r}, row {i}: {_show(value)} ({type(value).__name__}) does not fit {t} ({exc}); "
                f"{_want(t)}",
                code="COLUMN_TYPE_MISMATCH",
            ) from None
    raise ConsumeResultTypeError(
        f"column {name!r} mixes values that do not fit {t} together; {_want(t)}",
        code="COLUMN_TYPE_MISMATCH",
    )


def _compatible(have: pa.DataType, want: pa.DataType) -> bool:
    """Whether a ``have`` column may be cast to ``want`` (values are then cast without loss, or refused)."""
    if pa.types.is_null(have):
        return True
    if pa.types.is_integer(want):
        return bool(pa.types.is_integer(have) or pa.types.is_floating(have))
    if pa.types.is_timestamp(want):
        return bool(pa.types.is_timestamp(have))
    text = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    if pa.types.is_string(want):
        return any(test(have) for test in text)
    if pa.types.is_binary(want):
        raw = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
        return any(test(have) for test in (*text, *raw))
    for nested in (pa.types.is_map, pa.types.is_struct):
        if nested(want):
            return bool(nested(have))
    if pa.types.is_list(want):
        return bool(pa.types.is_list(have) or pa.types.is_large_list(have))
    return bool(normalize_type(have) == normalize_type(want))


def _from_arrow(name: str, array: pa.Array, t: pa.DataType) -> pa.Array:
    if array.type == t:
        return array
    if not _compatible(array.type, t):
        raise ConsumeResultTypeError(
            f"column {name!r} is {array.type} in the rows but {t} in the table; {_want(t)}",
            code="COLUMN_TYPE_MISMATCH",
        )
    try:
        # safe=True: overflow, a fractional float or a sub-microsecond time is an error, never rounded.
        return array.cast(t, safe=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        error = exc
    for i in range(len(array)):
        try:
            array.slice(i, 1).cast(t, safe=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise ConsumeResultTypeError(
                f"column {name!r}, row {i}: {_show(array.slice(i, 1).to_pylist()[0])} ({array.type}) does not fit "
                f"{t} without loss ({exc}); {_want(t)}",
                code="COLUMN_TYPE_MISMATCH",
            ) from None
    raise ConsumeResultTypeError(
        f"column {name!r} ({array.type}) does not cast to {t}: {error}; {_want(t)}",
        code="COLUMN_TYPE_MISMATCH",
    )


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- values: the engine's own checks ---------------------------------------------------


def check_values(table: pa.Table, config: EngineConfig) -> None:
    """Raise for the first row the engine would quarantine, with the engine's reason code and the fix.

    Runs the engine's decision step (:func:`~retry_engine.core.decide.decide_or_quarantine`)
    over the rows, so what passes here is exactly what the engine does not
    quarantine for its content (names, ids, status, sizes, UTF-8, times).
    """
    n = table.num_rows
    batch = pa.RecordBatch.from_arrays(
        [
            *(table.column(i).combine_chunks() for i in range(table.num_columns)),
            pa.array([f"{i:020d}" for i in range(n)], pa.string()),
            pa.array([dt.datetime.now(dt.UTC)] * n, pa.timestamp("us", tz="UTC")),
        ],
        names=[*table.column_names, POSITION, BATCH_TS],
    )
    decided = decide_or_quarantine(batch, Decider(config))
    bad = decided.filter(pc.fill_null(pc.equal(decided.column("outcome"), QUARANTINED), False))
    if bad.num_rows == 0:
        return
    found = sorted(
        zip(
            (int(p) for p in bad.column("source_position").to_pylist()),
            bad.column("reason_code").to_pylist(),
            bad.column("reason").to_pylist(),
            strict=True,
        )
    )
    row, code, reason = found[0]
    more = (
        f" ({len(found) - 1} more rows are refused too, e.g. row {found[1][0]}: {found[1][2]})"
        if len(found) > 1
        else ""
    )
    fix = _FIXES.get(code, "fix the value or leave the column null")
    raise InvalidConsumeResultError(
        f"row {row}: {reason}; {fix}. Nothing was written{more}", code=code
    )


__all__ = ["REQUIRED_COLUMNS", "append_consume_results", "check_values", "conform"]
