"""Stopping Spark after a stop abandoned a micro-batch (CI: Ctrl-C inside the demo's first batch).

A ``foreachBatch`` function (the consumer's) runs its Spark jobs from the
Python side; ``query.stop()`` interrupts the stream thread and can return while
that job's tasks still run (seen: 2 tasks running after it returned, ending
1.2-4.6 s later). A ``spark.stop()`` right after it tore the block
manager and the result getter down under them, and Spark logged ERROR stacks
for a stop that went as asked ("Exception in statusUpdate", "Block
broadcast_N does not exist"). :func:`retry_engine.ops.stopping.stop_session`
(``run``, ``demo``; ``run --once`` drains after a signal) cancels and waits
for them first.

The test drives :func:`~retry_engine.ops.stopping.drain_tasks` on a job only its cancel ends
(whether ``query.stop()`` returns before a foreachBatch job's tasks end depends on timing);
test_stopping checks the commands call it. One process of its own: stopping Spark cannot share
the suite's session.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

# A job whose two Python tasks would run for two minutes, started from a thread as a foreachBatch
# function's job is (the Python side of the callback), still running when the process stops
# Spark. Cancelled Python tasks end once Spark kills their worker, spark.python.task.killTimeout
# (2 s) after the cancel. Whether query.stop() itself returns before such tasks end depends on
# timing (seen both ways), so the job here is one nothing else would stop.
SCRIPT = r"""
import json, sys, threading, time
from retry_engine.delta.session import build_session
from retry_engine.ops.stopping import drain_tasks, running_tasks

spark = build_session(app_name="stop-drain", log_level="WARN")

def slow(batches):
    import time
    for b in batches:
        time.sleep(120)
        yield b

def job():
    try:
        df = spark.range(2, numPartitions=2)
        df.mapInArrow(slow, df.schema).collect()
    except Exception:
        pass  # cancelled

threading.Thread(target=job, daemon=True).start()
deadline = time.monotonic() + 240
while running_tasks(spark) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
report = {"running_before": running_tasks(spark)}
began = time.monotonic()
report["drained"] = drain_tasks(spark)
report["drain_seconds"] = round(time.monotonic() - began, 2)
report["running_after_drain"] = running_tasks(spark)
spark.stop()
print("REPORT " + json.dumps(report), flush=True)
"""


def test_stopping_spark_waits_for_the_tasks_of_an_abandoned_batch() -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("REPORT ")]
    report = json.loads(line.removeprefix("REPORT "))
    assert report["running_before"] == 2, report
    # Spark is stopped only after the cancelled tasks ended (which takes a while: their workers are killed).
    assert report["drained"] is True and report["running_after_drain"] == 0, report
    assert [x for x in done.stderr.splitlines() if re.search(r" (ERROR|FATAL) ", x)] == []
