"""Hive-standard partition folders and the move of older tables into them (#13 part 3).

No Spark: tables are real Delta tables in temp folders, written by the
engine's own file writer (the one the ``deltars`` sink runs on executors) and
read back by delta-rs, pandas, Polars and pyarrow datasets. The expected
folder names follow Hive's escaping as Spark writes it on POSIX
(``ExternalCatalogUtils.escapePathName``: control characters and
``"#%'*/:=?\\{[]^`` and DEL as ``%XX``, everything else as it is, null and
the empty string as ``__HIVE_DEFAULT_PARTITION__``), not this package's code.

``tests/fixtures/main_layout`` holds retry and dlq tables written by the
engine of main before this change (commit 9777f4f, folders such as
``consumer_5Fgroup=order_5Fgroup``), for groups ``order_group`` and
``%RETRY%pay|eu``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable, write_deltalake

from retry_engine.delta import layout
from retry_engine.delta._files import (
    MAX_FOLDER_NAME_BYTES,
    hive_escape,
    partition_folder,
    partition_folder_name,
)
from retry_engine.delta._log import commit_entries, data_file_path, parse_commit
from retry_engine.delta.layout import folder_matches, migrate_partition_folders, misplaced_files
from retry_engine.errors import ConcurrentWriteError
from tests.engine_files import append_like_engine

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "main_layout"

# Values a partition column may hold: RocketMQ names (%, |) and the hostile rest.
HOSTILE = [
    "order_group",
    "%RETRY%pay|eu",
    "%DLQ%",
    "a=b",
    "with space",
    "ünïcode-名前",
    "x:y?z#w",
    "../..",
    "a/b",
    "quote'\"*\\",
    "br{a}[c]^",
    "tab\tnewline\n",
    "%25",
]


@pytest.mark.parametrize(
    ("value", "folder"),
    [
        ("order_group", "consumer_group=order_group"),
        ("%RETRY%order_group", "consumer_group=%25RETRY%25order_group"),
        ("pay|eu-1", "consumer_group=pay|eu-1"),
        ("a=b", "consumer_group=a%3Db"),
        ("with space", "consumer_group=with space"),
        ("ünï", "consumer_group=ünï"),
        ("x:y?z#w", "consumer_group=x%3Ay%3Fz%23w"),
        ("../..", "consumer_group=..%2F.."),
        ("quote'\"*\\", "consumer_group=quote%27%22%2A%5C"),
        ("br{a}[c]^", "consumer_group=br%7Ba}%5Bc%5D%5E"),
        ("tab\t\x7f", "consumer_group=tab%09%7F"),
        ("%25", "consumer_group=%2525"),
        ("", "consumer_group=__HIVE_DEFAULT_PARTITION__"),
        (None, "consumer_group=__HIVE_DEFAULT_PARTITION__"),
    ],
)
def test_folder_names_escape_what_hive_escapes_and_nothing_else(value: str | None, folder: str) -> None:
    """#13 part 3: ``consumer_group=order_group``, as Spark and Hive name the folder."""
    assert partition_folder_name("consumer_group", value) == folder


def test_a_path_has_one_folder_per_column_and_no_value_adds_a_level() -> None:
    """#13 part 3 / SPEC bad input: ``/`` and ``..`` in a value never make another folder level."""
    assert partition_folder({"a": "x/y", "b": None}, ["a", "b"]) == "a=x%2Fy/b=__HIVE_DEFAULT_PARTITION__"
    for value in HOSTILE:
        name = partition_folder_name("c", value)
        assert "/" not in name and name.startswith("c=") and name not in ("..", ".")
    assert len({partition_folder_name("c", v) for v in HOSTILE}) == len(HOSTILE)


def test_a_name_too_long_for_a_folder_is_cut_with_a_hash_and_never_inside_an_escape() -> None:
    """#13 part 3: a 255-character group of % signs (valid in RocketMQ) still gets a folder."""
    names = [partition_folder_name("consumer_group", v) for v in ("%" * 255, "%" * 254 + "a", "é" * 200, "x" * 300)]
    assert all(len(n.encode()) <= MAX_FOLDER_NAME_BYTES for n in names)
    assert len(set(names)) == len(names)
    head = names[0].rsplit("-h", 1)[0]
    assert head.startswith("consumer_group=%25") and head.endswith("%25")
    assert hive_escape("%" * 3) == "%25%25%25"


def _write_with_engine_writer(path: str, groups: list[str | None]) -> pa.Table:
    """Rows for ``groups`` written by the sink's file writer and committed like the sink does."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("consumer_group", pa.string())])
    data = pa.table({"id": pa.array(range(len(groups)), pa.int64()), "consumer_group": groups}, schema=schema)
    append_like_engine(path, data, partition_by=["consumer_group"])
    return data


def _pairs(rows: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    return sorted((int(r["id"]), r["consumer_group"]) for r in rows)


def test_every_hive_reader_reads_the_values_back_from_the_folders(tmp_path: Path) -> None:
    """#13 part 3: delta-rs, pandas, Polars (read_delta, scan_delta) and pyarrow hive datasets agree.

    pyarrow reads the folder itself (not the log), so the values come from
    the folder names alone; every data file is where the log says it is.
    """
    path = str(tmp_path / "t")
    groups: list[str | None] = [*HOSTILE, None]
    expected = _pairs(_write_with_engine_writer(path, groups).to_pylist())
    table = DeltaTable(path)
    assert _pairs(table.to_pyarrow_table().to_pylist()) == expected
    assert _pairs(table.to_pandas().replace({float("nan"): None}).to_dict("records")) == expected
    assert _pairs(pl.read_delta(path).to_dicts()) == expected
    assert _pairs(pl.scan_delta(path).collect().to_dicts()) == expected
    for uri in table.file_uris():
        assert Path(uri).is_file()
    hive = ds.dataset(path, format="parquet", partitioning="hive", ignore_prefixes=["_delta_log", "."])
    assert _pairs(hive.to_table().to_pylist()) == expected
    # delta-rs writes the log path URL-encoded once: reading it decodes to the folder on disk.
    logged = {data_file_path(p) for p in pa.table(table.get_add_actions(flatten=False)).column("path").to_pylist()}
    on_disk = {str(f.relative_to(path)) for f in Path(path).rglob("*.parquet")}
    assert logged == on_disk


def _old_lake(tmp_path: Path) -> Path:
    root = tmp_path / "lake"
    shutil.copytree(FIXTURE, root)
    return root


def _rows(path: str, version: int | None = None) -> list[dict[str, Any]]:
    return sorted(DeltaTable(path, version=version).to_pyarrow_table().to_pylist(), key=lambda r: r["msg_id"])


@pytest.mark.parametrize("name", ["retry", "dlq"])
def test_a_table_written_by_main_moves_into_hive_folders_without_a_data_change(tmp_path: Path, name: str) -> None:
    """#13 part 3: migration of main's layout; SPEC B1/B6: no row lost, duplicated or re-streamed.

    The move is one commit of removes and adds with ``dataChange`` false, so
    the engine's stream reader (Delta's rule) takes nothing from it; the old
    version still time-travels; running it again changes nothing.
    """
    path = str(_old_lake(tmp_path) / name)
    before_version = DeltaTable(path).version()
    before = _rows(path)
    assert {f.name for f in Path(path).iterdir()} == {
        "_delta_log", "consumer_5Fgroup=order_5Fgroup", "consumer_5Fgroup=_25RETRY_25pay_7Ceu"
    }
    assert len(misplaced_files(DeltaTable(path))) == 2

    done = migrate_partition_folders(path)

    assert (done.files_moved, done.rows_moved, done.version) == (2, len(before), before_version + 1)
    assert _rows(path) == before
    assert _rows(path, before_version) == before
    live = pa.table(DeltaTable(path).get_add_actions(flatten=False)).column("path").to_pylist()
    assert sorted(data_file_path(p).split("/")[0] for p in live) == [
        "consumer_group=%25RETRY%25pay|eu", "consumer_group=order_group"
    ]
    lines = (Path(path) / "_delta_log" / f"{done.version:020d}.json").read_text().splitlines()
    commit = parse_commit(done.version, lines)
    actions = [json.loads(line) for line in lines]
    moves = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert len(moves) == 4 and all(m["dataChange"] is False for m in moves)
    assert commit_entries(commit, uri=path, ignore_deletes=False, skip_change_commits=False) == []
    assert sorted(pl.read_delta(path)["consumer_group"].to_list()) == sorted(r["consumer_group"] for r in before)
    hive = ds.dataset(DeltaTable(path).file_uris(), format="parquet", partitioning="hive", partition_base_dir=path)
    assert sorted(hive.to_table().column("consumer_group").to_pylist()) == sorted(r["consumer_group"] for r in before)

    again = migrate_partition_folders(path)
    assert (again.files_moved, again.version) == (0, None)
    assert DeltaTable(path).version() == done.version


def test_files_other_writers_put_in_readable_folders_stay_where_they_are(tmp_path: Path) -> None:
    """#13 part 3: delta-rs escapes more (``|`` as ``%7C``); a Hive reader decodes it, so it is not moved."""
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"g": ["pay|eu", "%R%", None], "v": [1, 2, 3]}), partition_by=["g"])
    table = DeltaTable(path)
    assert misplaced_files(table) == []
    assert migrate_partition_folders(path).version is None
    assert folder_matches("g=pay%257Ceu/part-0.parquet", {"g": "pay|eu"}, ["g"])
    assert not folder_matches("g=pay_7Ceu/part-0.parquet", {"g": "pay|eu"}, ["g"])
    assert not folder_matches("part-0.parquet", {"g": "x"}, ["g"])
    assert migrate_partition_folders(str(tmp_path / "missing")).version is None


def test_a_writer_committing_during_the_move_makes_it_start_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#13 part 3 / SPEC B8: tools writing at the same time: each row once, the conflicting attempt's files gone.

    Another writer appends one dead letter while the first attempt rewrites
    (injected by wrapping the real rewrite); the commit built on the old
    version fails instead of being rebased, the attempt's files are deleted,
    and the second attempt moves the files of the new version.
    """
    path = str(_old_lake(tmp_path) / "dlq")
    before = _rows(path)
    real_rewrite = layout._rewrite
    attempts: list[int] = []
    late = pa.Table.from_pylist([{**before[0], "msg_id": "late-1"}], schema=pa.schema(DeltaTable(path).schema().to_arrow()))

    def rewrite_while_another_writer_appends(*args: Any) -> Any:
        written = real_rewrite(*args)
        attempts.append(len(written))
        if len(attempts) == 1:
            write_deltalake(path, pa.table(late), mode="append", partition_by=["consumer_group"])
        return written

    monkeypatch.setattr(layout, "_rewrite", rewrite_while_another_writer_appends)
    done = migrate_partition_folders(path)
    assert len(attempts) == 2 and done.files_moved == 2
    assert [r["msg_id"] for r in _rows(path)] == sorted([r["msg_id"] for r in before] + ["late-1"])
    live = {data_file_path(p) for p in pa.table(DeltaTable(path).get_add_actions(flatten=False)).column("path").to_pylist()}
    hive_files = {str(f.relative_to(path)) for f in Path(path).glob("consumer_group=*/*.parquet")}
    assert hive_files == {p for p in live if p.startswith("consumer_group=")}, "files of the failed attempt are left behind"

    other = str(_old_lake(tmp_path / "b") / "retry")
    template = _rows(other)[0]
    schema = pa.schema(DeltaTable(other).schema().to_arrow())
    appended = iter(range(100))

    def always_conflicting(*args: Any) -> Any:
        written = real_rewrite(*args)
        row = {**template, "msg_id": f"late-{next(appended)}"}
        write_deltalake(other, pa.table(pa.Table.from_pylist([row], schema=schema)), mode="append", partition_by=["consumer_group"])
        return written

    monkeypatch.setattr(layout, "_rewrite", always_conflicting)
    with pytest.raises(ConcurrentWriteError, match=r"TABLE_MOVED.*5 times in a row.*unchanged"):
        migrate_partition_folders(other)
    assert len(misplaced_files(DeltaTable(other))) == 2


def test_an_engine_start_that_cannot_move_the_files_starts_anyway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """#13 part 3: a re-drive writing all the time does not keep the engine from starting.

    The tables stay readable by Delta readers in the old layout; the warning
    says the next start moves them.
    """
    from retry_engine.config import parse_config
    from retry_engine.core import engine

    root = _old_lake(tmp_path)
    config = parse_config({"engine": {"lake": str(root)}})
    real_rewrite = layout._rewrite
    appended = iter(range(100))

    def always_conflicting(location: Any, table: DeltaTable, files: Any) -> Any:
        written = real_rewrite(location, table, files)
        row = {**_rows(location.uri)[0], "msg_id": f"late-{next(appended)}"}
        schema = pa.schema(table.schema().to_arrow())
        write_deltalake(location.uri, pa.Table.from_pylist([row], schema=schema), mode="append", partition_by=["consumer_group"])
        return written

    monkeypatch.setattr(layout, "_rewrite", always_conflicting)
    engine._migrate_partition_layout(config)
    assert "moves the files at its next start" in caplog.text
    for name in ("retry", "dlq"):
        assert len(misplaced_files(DeltaTable(str(root / name)))) == 2
    monkeypatch.setattr(layout, "_rewrite", real_rewrite)
    engine._migrate_partition_layout(config)
    for name in ("retry", "dlq"):
        assert misplaced_files(DeltaTable(str(root / name))) == []
