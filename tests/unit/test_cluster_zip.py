"""The --py-files zip that spark-submit ships to executors."""

from __future__ import annotations

import zipfile
from pathlib import Path

from retry_engine.cluster import build_py_files


def test_py_files_zip_has_the_installed_layout(tmp_path: Path) -> None:
    zipped = build_py_files(tmp_path / "dist" / "retry_engine.zip")
    names = zipfile.ZipFile(zipped).namelist()
    assert "retry_engine/__init__.py" in names and "retry_engine/delta/source.py" in names
    assert "retry_engine/schemas/__init__.py" in names and "retry_engine/schemas/tables.py" in names
    assert not [n for n in names if "__pycache__" in n or not n.endswith(".py")]
    # Same sources, same bytes: a rebuild does not look like a change.
    assert build_py_files(tmp_path / "again.zip").read_bytes() == zipped.read_bytes()
