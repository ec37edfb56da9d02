"""Stopping Spark after a stop abandoned a micro-batch (CI: Ctrl-C inside the demo's first batch).

A ``foreachBatch`` function (the consumer's) runs its Spark jobs from the
Python side; ``query.stop()`` interrupts the stream thread and returns while
that job's tasks still run. A ``spark.stop()`` right after it tore the block
manager and the result getter down under them, and Spark logged ERROR stacks
for a stop that went as asked ("Exception in statusUpdate", "Block
broadcast_N does not exist"). :func:`retry_engine.ops.stopping.stop_session`
(``run``, ``demo``; ``run --once`` drains after a signal) cancels and waits
for them first.

One process of its own: stopping Spark cannot share the suite's session.
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

# Killed Python tasks end once Spark kills their worker, spark.python.task.killTimeout after the
# cancel; 5 s (2 s by default) keeps them running well past query.stop() on a loaded machine too.
SCRIPT = r"""
import json, sys, time
from retry_engine.delta.session import build_session
from retry_engine.ops.stopping import drain_tasks, running_tasks

spark = build_session(app_name="stop-drain", log_level="WARN", extra_conf={"spark.python.task.killTimeout": "5s"})

def slow(batches):
    import time
    for b in batches:
        time.sleep(120)
        yield b

def each(df, batch_id):
    df.repartition(2).mapInPandas(slow, df.schema).collect()

source = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
query = source.writeStream.foreachBatch(each).option("checkpointLocation", sys.argv[1]).start()
deadline = time.monotonic() + 240
while running_tasks(spark) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
report = {"running_at_stop": running_tasks(spark)}
query.stop()
report["running_after_query_stop"] = running_tasks(spark)
began = time.monotonic()
report["drained"] = drain_tasks(spark)
report["drain_seconds"] = round(time.monotonic() - began, 2)
report["running_after_drain"] = running_tasks(spark)
spark.stop()
print("REPORT " + json.dumps(report), flush=True)
"""


def test_stopping_spark_waits_for_the_tasks_of_an_abandoned_batch(tmp_path: Path) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "checkpoint")],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("REPORT ")]
    report = json.loads(line.removeprefix("REPORT "))
    # The race is there: query.stop() returned while the batch's two tasks still ran ...
    assert report["running_at_stop"] == 2 and report["running_after_query_stop"] > 0, report
    # ... and Spark is stopped only after they ended.
    assert report["drained"] is True and report["running_after_drain"] == 0, report
    assert [x for x in done.stderr.splitlines() if re.search(r" (ERROR|FATAL) ", x)] == []
