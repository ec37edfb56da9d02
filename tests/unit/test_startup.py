"""The start-up line (#14 part 3, retry_engine.core.startup): where the time went before the first batch."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from retry_engine.core import startup as startup_module
from retry_engine.core.startup import LINE_PREFIX, Startup, process_age_s

_IMPORTED = time.monotonic()


def test_the_line_names_each_step_in_order_and_the_first_batch_by_spark_s_parts() -> None:
    began = Startup()
    with began.step("spark session"):
        time.sleep(0.12)
    with began.step("lease"):
        pass
    durations = {"latestOffset": 200, "getBatch": 50, "queryPlanning": 250, "addBatch": 4000,
                 "walCommit": 100, "commitOffsets": 150, "triggerExecution": 4800}
    line = began.first_batch(durations, 40_000)
    assert line is not None and line.startswith(LINE_PREFIX + "first batch committed ")
    body = line.split("after the process started: ", 1)[1]
    steps = re.findall(r"([a-z][a-z ]+?) (\d+\.\d) s", body)
    assert [name for name, _ in steps] == [
        "process and imports", "spark session", "lease", "first batch", "planning", "execution", "commit",
    ]
    seconds = dict(steps)
    assert 0.1 <= float(seconds["spark session"]) < 5
    assert (seconds["first batch"], seconds["planning"], seconds["execution"], seconds["commit"]) == (
        "4.8", "0.5", "4.0", "0.2")
    assert line.endswith("; 40,000 consume results)")
    total = float(re.search(r"committed (\d+\.\d) s", line).group(1))  # type: ignore[union-attr]
    assert total >= float(seconds["process and imports"]) + 0.05  # + the steps (each rounded)
    # Logged once: a later batch is not a first batch.
    assert began.first_batch(durations, 1) is None


def test_missing_spark_durations_count_as_zero_and_rows_may_be_unknown() -> None:
    line = Startup().first_batch({}, None)
    assert line is not None
    assert "first batch 0.0 s (planning 0.0 s, execution 0.0 s, commit 0.0 s)" in line


def test_process_age_is_this_process_s_and_unknown_without_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    age = process_age_s()
    # At least as old as this module's import; a process started now is young (not the machine's uptime).
    assert age is not None and age >= time.monotonic() - _IMPORTED
    child = subprocess.run(
        [sys.executable, "-c", "from retry_engine.core.startup import process_age_s; print(process_age_s())"],
        capture_output=True, text=True, check=True,
    )
    assert 0 <= float(child.stdout) < min(age, 30.0), (child.stdout, age)
    def no_proc(*args: object, **kwargs: object) -> object:
        raise OSError("no /proc here")
    monkeypatch.setattr("builtins.open", no_proc)
    assert process_age_s() is None
    began = startup_module.Startup()
    assert [name for name, _ in began.steps] == []
