from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

# Two lanes when the suite runs under pytest-xdist (``make test``: ``-n 2 --dist loadgroup``).
# The tests that use this process's SparkSession share one worker (one JVM, as the machine has
# two cores and one local[2] session is what they are sized for); every other module (the
# Spark-free unit tests, and the integration tests that drive engines in processes of their own)
# is a group of its own that the other worker takes, so the two lanes overlap.
OWN_PROCESS_MODULES = frozenset({"test_engine_crash.py", "test_engine_stop.py", "test_cluster.py", "test_notebook.py"})
SPARK_LANE = "spark-session"


# tryfirst: xdist's own hook turns the marks into the scheduling groups, so ours must run before it.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path
        in_session = "integration" in path.parts and path.name not in OWN_PROCESS_MODULES
        item.add_marker(pytest.mark.xdist_group(SPARK_LANE if in_session else str(path.relative_to(config.rootpath))))


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
