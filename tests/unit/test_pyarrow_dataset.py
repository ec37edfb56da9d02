"""``pyarrow_dataset``: a filtered read of a Delta table finds the rows a filter of every row finds.

deltalake 1.6 guarantees ``col >= null`` of a file without statistics of ``col`` (another writer's:
Spark with ``delta.dataSkippingNumIndexedCols``, an old writer), and a pyarrow filter on ``col``
then skips the whole file. Every filtered read of the project's tables (status, plots, the DLQ
console, history, re-drive tasks, resolve, the producer's sequence check) goes through
``retry_engine.delta.tables.pyarrow_dataset``. Drawn here: tables of a few appends, each with or
without statistics, partitioned or not (a partition value that needs quoting, a null), and filters
on the columns, with and without delta-rs's file pruning. No Spark.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retry_engine.delta.tables import pyarrow_dataset

T = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
DAYS = [T + dt.timedelta(days=d) for d in range(4)]
TIMES = [None, *DAYS]
GROUPS = [None, "a", "a b/%"]
SCHEMA = pa.schema([("n", pa.int64()), ("g", pa.string()), ("at", pa.timestamp("us", tz="UTC"))])
_tables = itertools.count()

rows = st.lists(st.tuples(st.sampled_from([None, *range(4)]), st.sampled_from(GROUPS), st.sampled_from(TIMES)),
                min_size=1, max_size=4)
appends = st.lists(st.tuples(rows, st.booleans()), min_size=1, max_size=4)  # (rows, with statistics)
when = st.sampled_from(DAYS)


@st.composite
def filters(draw: st.DrawFn) -> tuple[pc.Expression, list[tuple[str, str, Any]] | None]:
    """A row filter, and a delta-rs pruning predicate no stricter than it (or none)."""
    kind = draw(st.sampled_from(["at>=", "at<=", "n==", "g==", "g null", "and", "or"]))
    at, n, g = draw(when), draw(st.integers(0, 3)), draw(st.sampled_from(GROUPS[1:]))
    prune: list[tuple[str, str, Any]] | None = None
    if kind == "at>=":
        expr = pc.field("at") >= pa.scalar(at, SCHEMA.field("at").type)
        prune = [("at", ">=", at - dt.timedelta(days=draw(st.integers(0, 1))))]
    elif kind == "at<=":
        expr = pc.field("at") <= pa.scalar(at, SCHEMA.field("at").type)
        prune = [("at", "<=", at)]
    elif kind == "n==":
        expr = pc.field("n") == n
        prune = [("n", "=", n)]
    elif kind == "g==":
        expr = pc.field("g") == g
        prune = [("g", "=", g)]
    elif kind == "g null":
        expr = ~pc.field("g").is_valid()
    elif kind == "and":
        expr = (pc.field("at") >= pa.scalar(at, SCHEMA.field("at").type)) & (pc.field("n") > n)
        prune = [("at", ">=", at), ("n", ">", n)]
    else:
        expr = (pc.field("at") < pa.scalar(at, SCHEMA.field("at").type)) | (pc.field("g") == g)
    return expr, prune if draw(st.booleans()) else None


def _write(path: Path, drawn: list[tuple[list[tuple[Any, ...]], bool]], partitioned: bool) -> None:
    by = ["g"] if partitioned else None
    for i, (values, stats) in enumerate(drawn):
        table = pa.Table.from_pylist([dict(zip(SCHEMA.names, v, strict=True)) for v in values], schema=SCHEMA)
        config = {"delta.dataSkippingNumIndexedCols": "32" if stats else "0"}
        if i == 0:
            write_deltalake(str(path), table, partition_by=by, configuration=config)
            continue
        DeltaTable(str(path)).alter.set_table_properties(config)  # an append's own configuration is ignored
        write_deltalake(str(path), table, mode="append", partition_by=by)
    DeltaTable(str(path)).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": "32"})


def _rows(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r[c] for c in SCHEMA.names) for r in table.select(SCHEMA.names).to_pylist())


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(drawn=appends, partitioned=st.booleans(), where=filters())
def test_a_filtered_read_finds_what_a_filter_of_every_row_finds(
    tmp_path: Path, drawn: list[tuple[list[tuple[Any, ...]], bool]], partitioned: bool,
    where: tuple[pc.Expression, list[tuple[str, str, Any]] | None],
) -> None:
    path = tmp_path / f"t{next(_tables)}"
    _write(path, drawn, partitioned)
    table = DeltaTable(str(path))
    everything = pa.table(table.to_pyarrow_table())
    expr, prune = where
    expected = _rows(everything.filter(expr))
    assert _rows(pyarrow_dataset(table, prune).to_table(filter=expr)) == expected
    assert pyarrow_dataset(table, prune).count_rows(filter=expr) == sum(expected.values())


def test_a_column_another_writer_changed_prunes_nothing_and_is_compared_in_the_engines_type(tmp_path: Path) -> None:
    """``read_columns``: `at` written as text (another writer) is read as a time before the rows are
    picked; the terms on it leave the file predicate, those on other columns still prune; an OR whose
    branch was only on it prunes nothing."""
    from retry_engine.delta.tables import _without, read_columns

    text = pa.schema([("n", pa.int64()), ("g", pa.string()), ("at", pa.string())])
    rows = [(1, "a", DAYS[0].isoformat()), (2, "a", DAYS[2].isoformat()), (3, "b", DAYS[3].isoformat()),
            (4, "a", "not a time")]
    path = tmp_path / "t"
    write_deltalake(str(path), pa.Table.from_pylist([dict(zip(text.names, r, strict=True)) for r in rows], schema=text),
                    partition_by=["g"])
    after = pc.field("at") >= pa.scalar(DAYS[1], SCHEMA.field("at").type)
    read = read_columns(DeltaTable(str(path)), SCHEMA, ["n", "at"], files=[("g", "=", "a"), ("at", ">=", DAYS[1])],
                        rows=after)
    assert read.to_pylist() == [{"n": 2, "at": DAYS[2]}]  # file g=b pruned by the group, row 1 by its time
    assert _without([("g", "=", "a"), ("at", ">=", DAYS[1])], ["at"]) == [("g", "=", "a")]
    assert _without([[("at", ">=", DAYS[1])], [("n", "=", 1)]], ["at"]) is None
    assert _without([[("at", ">=", DAYS[1]), ("n", "=", 1)], [("g", "=", "b")]], ["at"]) == [[("n", "=", 1)], [("g", "=", "b")]]
