"""The --py-files zip that spark-submit ships to executors."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from retry_engine.ops.cli import EXIT_OK, main
from retry_engine.ops.cluster import build_py_files


def test_py_files_zip_has_the_installed_layout(tmp_path: Path) -> None:
    zipped = build_py_files(tmp_path / "dist" / "retry_engine.zip")
    names = zipfile.ZipFile(zipped).namelist()
    assert "retry_engine/__init__.py" in names and "retry_engine/delta/source.py" in names
    assert "retry_engine/schemas/__init__.py" in names and "retry_engine/schemas/tables.py" in names
    assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]
    # Same sources, same bytes: a rebuild does not look like a change.
    assert build_py_files(tmp_path / "again.zip").read_bytes() == zipped.read_bytes()


def test_cli_zip_writes_the_zip_where_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out" / "engine.zip"
    assert main(["zip", "--output", str(target)]) == EXIT_OK
    assert capsys.readouterr().out.strip() == str(target)
    assert "retry_engine/ops/cli.py" in zipfile.ZipFile(target).namelist()
