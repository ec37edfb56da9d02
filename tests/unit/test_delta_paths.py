"""Data file paths from a Delta log never lead outside the table (#12 item 16).

A log is input like any other (SPEC, bad input): whoever can write a commit
JSON must not make the reader open another tenant's table or ``/etc``. Paths
are relative to the table root or, as Delta's shallow clones write them,
absolute URIs inside it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from retry_engine.delta._files import FileToRead, read_file
from retry_engine.delta._log import TableLocation, relative_data_path
from retry_engine.errors import DeltaSourceError

ROOT = "/lake/tenant_a/consume_results"


@pytest.mark.parametrize(
    ("log_path", "relative"),
    [
        ("part-0.parquet", "part-0.parquet"),
        ("day=2024-01-01/part-0.parquet", "day=2024-01-01/part-0.parquet"),
        ("a%20b/part%2D0.parquet", "a b/part-0.parquet"),
        # A value folder that merely contains dots stays inside.
        ("v=..x/part.parquet", "v=..x/part.parquet"),
        ("sub/../part.parquet", "part.parquet"),
        # Absolute URIs inside the root (shallow clones) are allowed.
        (f"file://{ROOT}/part-0.parquet", "part-0.parquet"),
        (f"file:{ROOT}/day=1/part-0.parquet", "day=1/part-0.parquet"),
        (f"file://localhost{ROOT}/part-0.parquet", "part-0.parquet"),
        (f"{ROOT}/part-0.parquet", "part-0.parquet"),
    ],
)
def test_paths_inside_the_table_resolve_relative_to_its_root(log_path: str, relative: str) -> None:
    assert relative_data_path(log_path, ROOT) == relative
    assert relative_data_path(log_path, f"file://{ROOT}") == relative


@pytest.mark.parametrize(
    "log_path",
    [
        "../tenant_b/part-0.parquet",
        "../consume_results_old/part-0.parquet",  # a sibling whose name starts like the root
        "..",
        ".",
        "",
        "day=1/../../tenant_b/part-0.parquet",
        "%2e%2e/tenant_b/part-0.parquet",
        "%2E%2E%2Ftenant_b%2Fpart-0.parquet",
        "/etc/passwd",
        "%2Fetc%2Fpasswd",
        "file:///etc/passwd",
        f"file://{ROOT}/../../tenant_b/part-0.parquet",
        f"file://{ROOT}_evil/part-0.parquet",
        f"file://otherhost{ROOT}/part-0.parquet",
        f"{ROOT}",
        "s3://bucket/lake/tenant_a/consume_results/part-0.parquet",
        "https://attacker.example/part-0.parquet",
        "part-0.parquet%00.txt",
    ],
)
def test_paths_leaving_the_table_are_refused_naming_path_and_table(log_path: str) -> None:
    with pytest.raises(DeltaSourceError, match="DELTA_PATH_OUTSIDE_TABLE") as caught:
        relative_data_path(log_path, ROOT)
    assert repr(log_path) in str(caught.value) and ROOT in str(caught.value)


@pytest.mark.parametrize(
    ("log_path", "ok"),
    [
        ("s3://bucket/tables/cr/part-0.parquet", True),
        ("s3://bucket/tables/cr/day%3D1/part-0.parquet", True),
        ("s3://bucket/tables/other/part-0.parquet", False),
        ("s3://bucket/tables/cr/../other/part-0.parquet", False),
        ("s3://other-bucket/tables/cr/part-0.parquet", False),
        ("gs://bucket/tables/cr/part-0.parquet", False),
        ("file:///tables/cr/part-0.parquet", False),
        ("/tables/cr/part-0.parquet", False),
        ("../other/part-0.parquet", False),
    ],
)
def test_object_store_tables_accept_only_uris_under_their_own_prefix(log_path: str, ok: bool) -> None:
    if ok:
        assert relative_data_path(log_path, "s3://bucket/tables/cr/").endswith("part-0.parquet")
    else:
        with pytest.raises(DeltaSourceError, match="DELTA_PATH_OUTSIDE_TABLE"):
            relative_data_path(log_path, "s3://bucket/tables/cr")


def test_read_file_refuses_a_path_outside_the_table_even_if_the_file_exists(tmp_path: Path) -> None:
    """An executor task never opens ``../other_tenant/...``, whoever built its partition (#12 item 16)."""
    table, other = tmp_path / "tenant_a", tmp_path / "tenant_b"
    write_deltalake(str(table), pa.table({"id": [1]}))
    write_deltalake(str(other), pa.table({"id": [666]}))
    secret = next(name for name in os.listdir(other) if name.endswith(".parquet"))
    fs, root = TableLocation(str(table)).filesystem()
    file = FileToRead(f"../tenant_b/{secret}", {}, 1, 0, False)
    with pytest.raises(DeltaSourceError, match="DELTA_PATH_OUTSIDE_TABLE.*tenant_b"):
        list(read_file(fs, root, file, pa.schema([pa.field("id", pa.int64())]), table_uri=str(table)))

