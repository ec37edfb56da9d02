"""``retry-engine demo`` on a temp folder: its tables really hold retries and dead letters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from retry_engine.ops.demo import DEMO_GROUP, DEMO_MAX_RECONSUME_TIMES, kind_of, run_demo

pytestmark = pytest.mark.slow


def test_demo_produces_retries_and_dead_letters(spark: Any, tmp_path: Path) -> None:
    lines: list[str] = []
    report = run_demo(
        tmp_path / "demo", spark=spark, messages=10, timeout_seconds=300, echo=lines.append
    )
    assert report.settled, "\n".join(lines)
    retries = DeltaTable(report.paths["retry"]).to_pyarrow_table().to_pylist()
    dead = DeltaTable(report.paths["dlq"]).to_pyarrow_table().to_pylist()
    poison = sum(kind_of(i) == "poison" for i in range(10))
    flaky = sum(kind_of(i) == "flaky" for i in range(10))
    assert len(dead) == poison == 2
    assert {(d["consumer_group"], d["reason_code"], d["reconsume_times"]) for d in dead} == {
        (DEMO_GROUP, "MAX_RECONSUME_TIMES", DEMO_MAX_RECONSUME_TIMES + 1)
    }
    # Flaky messages are retried twice, poison ones DEMO_MAX_RECONSUME_TIMES times.
    assert len(retries) == 2 * flaky + DEMO_MAX_RECONSUME_TIMES * poison
    assert report.counts["retry"] == len(retries) and report.counts["dlq"] == len(dead)
    assert any("dead letters" in line for line in lines)
    assert any("MAX_RECONSUME_TIMES" in line for line in lines)  # the example rows are shown
