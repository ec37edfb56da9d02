"""A script that starts the engine through the API and ends without `engine.stop` ends it cleanly (B8).

Before, a script (or a notebook's kernel) that ended right after the API's own ``query.stop()``, or
with its query still running, left the engine's end unrecorded: Spark delivers the terminated event
to the progress recorder asynchronously and it came after the Python side had gone (an ERROR trace
from Spark's listener bus), so ``retry-engine status`` said ``running`` until stale and the lease
stayed held. The engine now stops such queries at exit (:mod:`retry_engine.core.at_exit`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from retry_engine.core.lease import read_state
from retry_engine.ops.terms import TERMINATED
from tests.lakehouse import Lake

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """
import sys, time
from pathlib import Path
from retry_engine.core import engine
from retry_engine.delta.session import build_session
from tests.builders import Result
from tests.lakehouse import Lake

root, how = Path(sys.argv[1]), sys.argv[2]
lake = Lake.make(root)
lake.write_results([Result.of().ok().with_(result_id=f"{root.name}-ok"), Result.of().failed().with_(result_id=f"{root.name}-fail")])
query = engine.start(build_session(log_level="WARN"), lake.config)
deadline = time.monotonic() + 240
while query.lastProgress is None or query.lastProgress["batchId"] < 1:
    assert time.monotonic() < deadline, "no second batch"
    time.sleep(0.05)
if how == "query.stop":
    query.stop()  # the API's own stop, then the script ends
print("ending", flush=True)
"""


def _script(script: str, root: Path, how: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run ``script`` in a Python process of its own on the lake ``root``; (its result, its output for messages)."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(root), how],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)},
    )
    return done, f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-6000:]}"


@pytest.mark.parametrize("how", ["query.stop", "not stopped"])
def test_a_script_that_ends_without_engine_stop_records_the_end_and_frees_the_lake(tmp_path: Path, how: str) -> None:
    root = tmp_path / "lake"
    done, context = _script(_SCRIPT, root, how)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "ending", context
    lake = Lake.make(root)
    events = sorted(lake.rows("progress"), key=lambda r: r["recorded_at"])
    assert events and events[-1]["event"] == TERMINATED, ([e["event"] for e in events], context)
    assert (events[-1]["reason"], events[-1]["exception"]) == ("stopped", None), context
    state = read_state(str(root))
    assert state is not None and state.released, (state, context)
    # Both results decided once, before the end (B1).
    outcomes = sorted((o["result_id"], o["outcome"]) for o in lake.rows("outcomes"))
    assert outcomes == [("lake-fail", "retry"), ("lake-ok", "acknowledged")], outcomes
    # The listener's terminated callback reached a live Python side. (Spark's own stop noise, e.g. an
    # ERROR "Store broadcast ... fail" when query.stop() interrupts a batch, is the user's stop's.)
    for noise in ("StreamingQueryListenerBus", "Traceback", "py4j", "Exception in thread", "terminate called"):
        assert noise not in done.stdout + done.stderr, f"{noise!r} in the output\n{context}"


_CONSUMER = """
import sys, time
from pathlib import Path
from retry_engine.clients.consumer import CONSUME_SUCCESS, Consumer
from retry_engine.clients.producer import Message, Producer
from retry_engine.delta.session import build_session
from tests.lakehouse import Lake

root, how = Path(sys.argv[1]), sys.argv[2]
lake = Lake.make(root)
Producer(lake.path("messages")).send_batch([Message("orders", f"m-{i}") for i in range(4)])
consumer = Consumer(build_session(log_level="WARN"), lake.config, group="G", consumer_id="A", instance_name="one",
                    trigger_interval="300 milliseconds", heartbeat_interval_seconds=10, heartbeat_expiry_seconds=6000)
consumer.subscribe("orders").register_message_listener(lambda message, context: CONSUME_SUCCESS)
query = consumer.start()
deadline = time.monotonic() + 240
while len(lake.rows("consume_results")) < 4:
    assert query.exception() is None and time.monotonic() < deadline, query.exception()
    time.sleep(0.1)
if how == "query.stop":
    query.stop()
print("members", len([p for p in (root / "_consumers").rglob("*.json") if p.parent.name != "offsets"]), flush=True)
"""


def test_a_script_whose_consumer_was_not_shut_down_leaves_its_group_at_exit(tmp_path: Path) -> None:
    """A clean process end is a consumer's graceful close: its queues move at the others' next batch,
    not after the heartbeat expiry (RocketMQ's broker rebalances when a client's connection closes).
    The script ends with its consumer running (after ``query.stop()`` the hook does the same)."""
    root = tmp_path / "lake"
    done, context = _script(_CONSUMER, root, "not stopped")
    # A member while the script ran; none once it had ended.
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "members 1", context
    # Its heartbeat is gone; its consumer offsets stay, for the instance that gains its queues.
    left = list((root / "_consumers").rglob("*.json"))
    assert left and all(p.parent.name == "offsets" for p in left), context
    for noise in ("Traceback", "py4j", "Exception in thread", "terminate called"):
        assert noise not in done.stdout + done.stderr, f"{noise!r} in the output\n{context}"
