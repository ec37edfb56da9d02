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


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:  # type: ignore[name-defined]  # noqa: F821
    """moto's S3 API server on 127.0.0.1 for the whole run (started on first use, stopped at teardown)."""
    from tests.s3 import moto_server

    with moto_server() as server:
        yield server
