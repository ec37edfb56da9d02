"""`retry-engine run --once` that processes its input ends quietly (#13 part 2, B1).

The engine plans its micro-batches back to back, so the stop after the input is processed always
interrupts a planned batch (replayed at the next start), and Spark logged that interruption: a WARN
"Failed to cancel job group" in every run measured and an ERROR "Store broadcast ... fail" in most,
in the log of a command that succeeded (a scheduler's log alarm on "ERROR"). The signal path already
silenced these loggers; the finished path now does too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.builders import Result
from tests.lakehouse import STOP_NOISE, Lake

REPO = Path(__file__).resolve().parents[2]


def test_run_once_decides_its_input_once_and_prints_no_stop_noise(tmp_path: Path) -> None:
    lake = Lake.make(tmp_path / "lake")
    conf = lake.engine_toml(tmp_path / "engine.toml")
    rows = [Result.of(f"ok-{i}").ok() for i in range(3)] + [Result.of(f"fail-{i}").failed() for i in range(2)]
    lake.write_results(rows)
    done = subprocess.run(
        [sys.executable, "-m", "retry_engine.ops.cli", "run", "--once", "--config", str(conf)],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    context = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-6000:]}"
    assert done.returncode == 0, context
    outcomes = Counter((o["result_id"], o["outcome"]) for o in lake.rows("outcomes"))
    assert outcomes == Counter({(r.values["result_id"], "acknowledged" if r.values["msg_id"].startswith("ok-")
                                 else "retry"): 1 for r in rows}), context
    for noise in (*STOP_NOISE, "Failed to cancel job group", "WARN DAGScheduler"):
        assert noise not in done.stdout + done.stderr, f"{noise!r} in the output\n{context}"
    # One line says it is done (a newcomer's walk through the README found stdout empty).
    assert done.stdout.splitlines()[-1].startswith("retry-engine: done: every consume result of the table decided"), context
