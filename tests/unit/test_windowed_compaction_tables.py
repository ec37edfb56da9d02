"""#14: compaction by windows of time on tables another writer made (hostile input, from a review).

The windowed rewrite reads data files as they are and commits removes by path: a table with deletion
vectors or column mapping, a log path in another encoding than delta-rs writes, INT96 times past 2262
would lose, duplicate or change rows. Each table here is made as Spark writes it (the log by hand,
real Parquet files), and the rows are read back through delta-rs (which applies deletion vectors).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import struct
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

from retry_engine.ops import maintenance
from retry_engine.ops.maintenance import TimeWindow, _compact_windowed

WINDOW = TimeWindow("ts", dt.timedelta(hours=1))
AT = dt.datetime.now(dt.UTC).replace(minute=5, second=0, microsecond=0) - dt.timedelta(hours=2)
STRING = {"type": "string", "nullable": True, "metadata": {}}
TIME = {"type": "timestamp", "nullable": True, "metadata": {}}


def rows(path: str) -> list[dict[str, Any]]:
    """What a Delta reader gets (delta-rs's SQL: deletion vectors applied)."""
    read = QueryBuilder().register("t", DeltaTable(path)).execute("select * from t").read_all()
    return sorted(pa.table(read).to_pylist(), key=lambda r: json.dumps(r, default=str, sort_keys=True))


def commit(path: str, version: int, actions: list[dict[str, Any]]) -> None:
    log = Path(path) / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def table(path: str, fields: dict[str, dict[str, Any]], *, protocol: dict[str, Any] | None = None,
          configuration: dict[str, str] | None = None, partition_by: tuple[str, ...] = ()) -> None:
    schema = {"type": "struct", "fields": [{"name": name, **field} for name, field in fields.items()]}
    commit(path, 0, [
        {"protocol": protocol or {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps(schema), "partitionColumns": list(partition_by),
                      "configuration": configuration or {}, "createdTime": 0}},
    ])


def add(path: str, version: int, log_path: str, data: pa.Table, at: dt.datetime, *, time_column: str = "ts",
        partition_values: dict[str, str] | None = None, **write: Any) -> dict[str, Any]:
    physical = Path(path) / unquote(log_path)
    physical.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, physical, **write)
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    stats = {"numRecords": data.num_rows, "minValues": {time_column: stamp}, "maxValues": {time_column: stamp},
             "nullCount": {time_column: 0}}
    action = {"path": log_path, "partitionValues": partition_values or {}, "size": physical.stat().st_size,
              "modificationTime": version, "dataChange": True, "stats": json.dumps(stats)}
    commit(path, version, [{"add": action}])
    return action


def _z85(data: bytes) -> str:
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
    out = ""
    for i in range(0, len(data), 4):
        n, chunk = int.from_bytes(data[i:i + 4], "big"), ""
        for _ in range(5):
            chunk, n = alphabet[n % 85] + chunk, n // 85
        out += chunk
    return out


def deletion_vector(deleted: list[int]) -> dict[str, Any]:
    """An inline deletion vector (a portable 64-bit roaring bitmap) of the ``deleted`` row indexes."""
    bitmap = (struct.pack("<II", 12346, 1) + struct.pack("<HH", 0, len(deleted) - 1) + struct.pack("<I", 16)
              + b"".join(struct.pack("<H", r) for r in deleted))
    data = struct.pack("<i", 1681511377) + struct.pack("<q", 1) + struct.pack("<I", 0) + bitmap
    size = len(data)
    return {"storageType": "i", "pathOrInlineDv": _z85(data + b"\0" * (-size % 4)), "sizeInBytes": size,
            "cardinality": len(deleted)}


def ids(t: pa.Table, at: dt.datetime, n: int) -> pa.Table:
    return pa.table({"id": [f"{t}{i}" for i in range(n)], "ts": pa.array([at] * n, pa.timestamp("us", "UTC"))})


def test_a_table_with_deletion_vectors_is_compacted_by_deltas_optimize_keeping_the_deletes(tmp_path: Path) -> None:
    """A row a DELETE marked in a deletion vector stayed deleted only for delta-rs's OPTIMIZE: the rewrite
    read the whole file (the deleted row came back) and its remove missed the add with the vector (a row
    twice)."""
    path = str(tmp_path / "dv")
    table(path, {"id": STRING, "ts": TIME}, configuration={"delta.enableDeletionVectors": "true"},
          protocol={"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                    "writerFeatures": ["deletionVectors"]})
    first = add(path, 1, "part-1.parquet", ids("a", AT, 2), AT)
    add(path, 2, "part-2.parquet", ids("b", AT, 2), AT)
    commit(path, 3, [{"remove": {"path": first["path"], "dataChange": True, "deletionTimestamp": 3, "size": first["size"],
                                 "partitionValues": {}}},
                     {"add": {**first, "deletionVector": deletion_vector([1])}}])
    before = rows(path)
    assert [r["id"] for r in before] == ["a0", "b0", "b1"]
    assert _compact_windowed(path, WINDOW) == (2, 1)  # by delta-rs, which applies the vector
    assert rows(path) == before


def test_a_column_mapped_table_is_left_to_deltas_optimize_which_refuses_it(tmp_path: Path) -> None:
    """Column mapping names a file's columns by physical names: the rewrite found none of the table's
    and wrote every value null."""
    path = str(tmp_path / "cm")
    mapped = {name: {**field, "metadata": {"delta.columnMapping.id": i, "delta.columnMapping.physicalName": f"col-{name}"}}
              for i, (name, field) in enumerate({"id": STRING, "ts": TIME}.items(), start=1)}
    table(path, mapped, protocol={"minReaderVersion": 2, "minWriterVersion": 5},
          configuration={"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "2"})
    for v in (1, 2):
        data = ids(f"m{v}", AT, 1).rename_columns(["col-id", "col-ts"])
        add(path, v, f"part-{v}.parquet", data, AT, time_column="col-ts")
    before = rows(path)
    assert [r["id"] for r in before] == ["m10", "m20"]
    with pytest.raises(Exception, match="(?i)column mapping"):
        _compact_windowed(path, WINDOW)
    assert rows(path) == before


@pytest.mark.parametrize(
    ("value", "folder", "compacted"),
    [
        ("ü", "topic=ü", False),  # Spark leaves letters as they are
        ("ü", "topic=%c3%bc", False),
        ("a b", "topic=a b", False),
        ("a+b", "topic=a%2Bb", False),
        ("a+b", "topic=a+b", True),  # what delta-rs writes
        ("%RETRY%G", "topic=%25RETRY%25G", True),
        ("a|b", "topic=a%7Cb", True),
    ],
)
def test_a_file_whose_log_path_delta_rs_would_write_otherwise_is_left_alone(
    tmp_path: Path, value: str, folder: str, compacted: bool
) -> None:
    """The rewrite's remove names a file as delta-rs encodes its path: another encoding in the log (another
    writer's) matched no add, and the file stayed beside its rewrite (every row twice)."""
    path = str(tmp_path / "enc")
    table(path, {"topic": STRING, "id": STRING, "ts": TIME}, partition_by=("topic",))
    for v in (1, 2):
        add(path, v, f"{folder}/part-{v}.parquet", ids(f"m{v}", AT, 1), AT, partition_values={"topic": value})
    before = rows(path)
    assert _compact_windowed(path, WINDOW) == ((2, 1) if compacted else (0, 0))
    assert rows(path) == before and {r["topic"] for r in before} == {value}


def test_int96_times_past_2262_keep_their_value(tmp_path: Path) -> None:
    """Spark's older writers store times as INT96: read as nanoseconds, a time in year 3000 wrapped to
    1830 (and that wrapped value became the new file's statistics)."""
    path = str(tmp_path / "int96")
    table(path, {"ts": TIME, "born": TIME})
    far = dt.datetime(3000, 1, 1, tzinfo=dt.UTC)
    for v in (1, 2):
        data = pa.table({"ts": pa.array([AT], pa.timestamp("us", "UTC")), "born": pa.array([far], pa.timestamp("us", "UTC"))})
        add(path, v, f"part-{v}.parquet", data, AT, use_deprecated_int96_timestamps=True)
    assert _compact_windowed(path, WINDOW) == (2, 1)
    assert [r["born"] for r in rows(path)] == [far, far]


def test_a_table_that_gains_deletion_vectors_while_rewritten_is_not_committed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit between the plan and the commit that turns deletion vectors on and deletes a row (the file
    re-added under its path, with a vector): the rewrite holds the row, so it must not commit after it."""
    path = str(tmp_path / "late-dv")
    table(path, {"id": STRING, "ts": TIME})
    first = add(path, 1, "part-1.parquet", ids("a", AT, 2), AT)
    add(path, 2, "part-2.parquet", ids("b", AT, 2), AT)
    real = maintenance.read_file
    calls: list[int] = []

    def delete_meanwhile(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            commit(path, 3, [
                {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                              "writerFeatures": ["deletionVectors"]}},
                {"remove": {"path": first["path"], "dataChange": True, "deletionTimestamp": 3, "size": first["size"],
                            "partitionValues": {}}},
                {"add": {**first, "deletionVector": deletion_vector([1])}},
            ])
        return real(*args, **kwargs)

    monkeypatch.setattr(maintenance, "read_file", delete_meanwhile)
    _compact_windowed(path, WINDOW)
    assert calls  # the rewrite ran, and the delete landed inside it
    assert [r["id"] for r in rows(path)] == ["a0", "b0", "b1"]
    # Its rewrite was not committed (the files of the table are the delete's and delta-rs's OPTIMIZE's).
    live = {Path(unquote(p)).name for p in DeltaTable(path).get_add_actions(flatten=True).column("path").to_pylist()}
    assert live <= {p.name for p in Path(path).glob("*.parquet")}
    assert not any(re.fullmatch(r"part-[0-9a-f-]{36}\.zstd\.parquet", name) for name in live), live
