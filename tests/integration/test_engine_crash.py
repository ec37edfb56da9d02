"""B1 across driver crashes: SIGKILL the engine mid-ladder, restart it, lose and duplicate nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.builders import Result
from tests.integration.test_engine import redeliver
from tests.lakehouse import FAST_LEVELS, Lake, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MAX_TIMES = 3
MESSAGES = 3
ACKS = 3
# Every failure of every attempt, plus the acknowledged ones.
EXPECTED_OUTCOMES = MESSAGES * (MAX_TIMES + 1) + ACKS


def _start(conf: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen(
        [sys.executable, str(REPO / "jobs" / "run_engine.py"), "--config", str(conf)],
        stdout=log.open("ab"), stderr=subprocess.STDOUT, env=env, cwd=REPO,
    )


def test_b1_sigkill_mid_ladder_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    lake = Lake.make(tmp_path / "lake", group_defaults={"retry_max_times": MAX_TIMES})
    conf = tmp_path / "engine.toml"
    conf.write_text(
        f'[engine]\nlake = "{tmp_path / "lake"}"\ntrigger_interval = "200ms"\nstate_bucket = "1s"\n'
        f'message_delay_level = "{FAST_LEVELS}"\n[group_defaults]\nretry_max_times = {MAX_TIMES}\n'
    )
    log = tmp_path / "engine.log"
    first = [Result.of(f"CRASH{i}").failed() for i in range(MESSAGES)]
    lake.write_results(first + [Result.of(f"OK{i}").ok() for i in range(ACKS)])
    handled: set[str] = set()
    kills = 0
    proc = _start(conf, log)
    deadline = time.monotonic() + 400
    try:
        while time.monotonic() < deadline:
            fresh = [r for r in lake.rows("retry") if r["msg_id"] not in handled]
            if fresh:
                handled.update(r["msg_id"] for r in fresh)
                lake.write_results([redeliver(r) for r in fresh])
            if len(lake.rows("dlq")) >= MESSAGES:
                break
            # Kill the driver after every second round of new retries, twice, mid-ladder.
            if kills < 2 and len(handled) >= (kills + 1) * MESSAGES:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                proc = _start(conf, log)
            time.sleep(0.3)
        # The batch that wrote the last dead letter may still be writing the ledger.
        wait_for(lambda: len(lake.rows("outcomes")) >= EXPECTED_OUTCOMES, timeout=60, what="the ledger")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert kills == 2, log.read_text()[-3000:]
    retries, dlq = lake.rows("retry"), lake.rows("dlq")
    assert len(dlq) == MESSAGES, log.read_text()[-3000:]
    # No duplicate and no gap: each message retried exactly at reconsume_times 1..MAX.
    assert Counter(r["msg_id"] for r in retries).most_common(1)[0][1] == 1
    per_origin = {o: sorted(r["reconsume_times"] for r in retries if r["origin_msg_id"] == o)
                  for o in (f"CRASH{i}" for i in range(MESSAGES))}
    assert all(times == list(range(1, MAX_TIMES + 1)) for times in per_origin.values()), per_origin
    assert sorted(d["origin_msg_id"] for d in dlq) == sorted(per_origin)
    assert all(r["delivered_at"] >= r["due_at"] for r in retries)  # R8: never early
    outcomes = lake.rows("outcomes")
    assert Counter(o["result_id"] for o in outcomes).most_common(1)[0][1] == 1
    assert len(outcomes) == EXPECTED_OUTCOMES
