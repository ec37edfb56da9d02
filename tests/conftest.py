from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:  # type: ignore[name-defined]  # noqa: F821
    """One local[2] session for the whole run; created lazily, stopped at teardown."""
    from retry_engine.delta.session import build_session

    session = build_session(app_name="retry-engine-tests", log_level="ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """A fresh folder for tables and checkpoints of one test."""
    root = tmp_path / "lake"
    root.mkdir()
    return root
