from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

# The slowest test files (CI's --durations, 2026-11-29), slowest first: `make test` runs files on two
# xdist workers, and a worker that starts the crash test last runs alone for two minutes while the
# other idles. Taken first, the long files spread over both workers and the short ones fill the end.
# A stale list costs only balance, never a test. (xdist would otherwise order files by how many tests
# they hold, putting the one-test crash test last: the Makefile passes --no-loadscope-reorder.)
SLOWEST_FIRST = (
    "integration/test_engine_crash.py",
    "integration/test_cluster.py",
    "integration/test_api_exit.py",
    "integration/test_property_engine.py",
    "integration/test_clients.py",
    "integration/test_demo.py",
    "integration/test_consumer_rebalance.py",
    "integration/test_schedule_state.py",
    "integration/test_storage_outage.py",
    "integration/test_standby.py",
    "integration/test_engine.py",
    "integration/test_upgrade.py",
    "integration/test_lake_guarantees.py",
    "integration/test_lake_on_s3.py",
    "integration/test_engine_stop.py",
    "integration/test_notebook.py",
    "integration/test_failure_needs_operator.py",
    "integration/test_engine_maintenance.py",
    "integration/test_stop_drain.py",
    "integration/test_restart_machine.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run :data:`SLOWEST_FIRST`'s files first, in its order; every other test keeps its place after them
    (a stable sort: the order is the same on every xdist worker, as xdist requires)."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    here = Path(__file__).parent

    def key(item: pytest.Item) -> int:
        try:
            name = item.path.relative_to(here).as_posix()
        except ValueError:
            return len(rank)
        return rank.get(name, len(rank))

    items.sort(key=key)


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
