"""A restart with no new consume result still releases the retries that fell due while it was stopped (R8).

Found by resuming an older release's lake: Spark runs a micro-batch without new input (the schedule
stage's processing-time timeouts, which release due retries) only after a batch ran in the same
query execution. An engine stopped between batches (every planned batch committed, the usual case at
a 1 s trigger) and started again ran no batch at all until a consume result arrived: on a quiet
topic its retries waited for hours. The source now plans one batch at the first trigger
(``wakeOnStart``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from retry_engine.core import engine, resume
from tests.builders import Result
from tests.lakehouse import Lake, wait_for

# The first retry (level 3) is due 3 s after the decision.
LEVELS = "100ms 110ms 3s " + " ".join(["1h"] * 15)


def _committed(checkpoint: Path) -> int | None:
    ids = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    return max(ids, default=None)


def test_a_restart_without_new_results_releases_what_fell_due_while_stopped(spark: Any, tmp_path: Path) -> None:
    # A long trigger: after the batch with input the query waits 60 s before planning another, so the
    # stop below finds every planned batch committed.
    stopped_between = Lake.make(tmp_path / "lake", engine={"trigger_interval": "60s", "message_delay_level": LEVELS})
    stopped_between.write_results([Result.of(f"f-{i}").failed() for i in range(4)])
    query = engine.start(spark, stopped_between.config)
    try:
        wait_for(lambda: len(stopped_between.rows("outcomes")) == 4, what="the decisions")
    finally:
        engine.stop(query)
    checkpoint = Path(stopped_between.config.checkpoint_path)
    assert resume.last_planned(str(checkpoint)) == _committed(checkpoint)  # nothing left to replay
    decided = max(r["decided_at"] for r in stopped_between.rows("outcomes"))
    assert stopped_between.rows("retry") == []

    time.sleep(3.2)  # due now; no consume result arrives
    restarted = Lake.make(tmp_path / "lake", engine={"trigger_interval": "200ms", "message_delay_level": LEVELS})
    query = engine.start(spark, restarted.config)
    try:
        wait_for(lambda: len(restarted.rows("retry")) == 4, timeout=60, what="the due retries after the restart")
    finally:
        engine.stop(query)
    retries = restarted.rows("retry")
    assert len({r["msg_id"] for r in retries}) == 4 and len(restarted.rows("outcomes")) == 4
    assert all(r["delivered_at"] >= r["due_at"] > decided for r in retries)
