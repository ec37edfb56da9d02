"""`retry-engine run --standby`: a second engine waits for the lake and takes over when the first dies (B8, B1).

Two engine processes on one lake and one checkpoint (as two hosts would share it on HDFS): A runs,
B stands by (it says so once and keeps Spark idle). A is killed with SIGKILL, its whole process
group, possibly inside a batch; B takes the lake over without an operator (A's process is gone, so
its lease is abandoned), resumes from the checkpoint, and decides what came before and after the
kill exactly once. B then stops cleanly on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from retry_engine.ops.status import status
from tests.builders import Result
from tests.lakehouse import Lake, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RUNNING = "retry-engine: running (query "


def _start(conf: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "retry_engine.ops.cli", "run", "--config", str(conf), *extra],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)


def test_a_standby_engine_takes_over_when_the_running_one_dies(tmp_path: Path) -> None:
    lake = Lake.make(tmp_path / "lake")
    conf = lake.engine_toml(tmp_path / "engine.toml", lease_timeout='"20s"')
    first = [Result.of(f"x-{i}").ok() for i in range(4)] + [Result.of(f"y-{i}").failed() for i in range(4)]
    lake.write_results(first)
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = _start(conf, log_a)
    b: subprocess.Popen[bytes] | None = None
    context = lambda: f"A:\n{log_a.read_text()[-3000:]}\nB:\n{log_b.read_text()[-5000:] if b else ''}"  # noqa: E731
    try:
        wait_for(lambda: len(lake.rows("outcomes")) == 8, timeout=180, what=f"A decides the first results\n{context()}")
        b = _start(conf, log_b, "--standby")
        wait_for(lambda: "standing by: [LAKE_OWNED]" in log_b.read_text(), timeout=120, what=f"B stands by\n{context()}")
        time.sleep(1)
        assert b.poll() is None and RUNNING not in log_b.read_text(), context()
        # `status` shows the standby (its note on the lake) while it polls.
        (waiting,) = status(lake.config).standbys
        assert waiting.live and waiting.note is not None and waiting.note.pid == b.pid, waiting

        second = [Result.of(f"z-{i}").failed() for i in range(6)]
        lake.write_results(second)
        time.sleep(0.3)
        _kill_group(a)  # A dies, maybe inside the batch deciding `second`

        wait_for(lambda: RUNNING in log_b.read_text(), timeout=60, what=f"B takes over\n{context()}")
        assert status(lake.config).standbys == []  # it deleted its note when it took the lake over
        wait_for(lambda: len(lake.rows("outcomes")) >= 14, timeout=120, what=f"B decides the rest\n{context()}")
        time.sleep(1)  # a replay that wrongly decided something twice would show now
        decided = Counter(o["result_id"] for o in lake.rows("outcomes"))
        assert decided == Counter({r.values["result_id"]: 1 for r in first + second}), context()
        assert log_b.read_text().count("standing by:") == 1, context()

        os.kill(b.pid, signal.SIGTERM)  # the engine's own process, as the README says
        assert b.wait(timeout=90) == 0, context()
        assert "retry-engine: stopped on SIGTERM" in log_b.read_text(), context()
    finally:
        _kill_group(a)
        if b is not None:
            _kill_group(b)
