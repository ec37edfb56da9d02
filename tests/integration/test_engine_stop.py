"""A clean stop of `retry-engine run` on SIGINT and SIGTERM (#13 part 2), on a real engine process.

One shared scenario, two starts on one temp lake:

1. start, wait until a first input is committed, append more input, and send
   SIGINT to the engine's whole process group, as Ctrl-C in a terminal does
   (driver and JVM receive it; Spark's Python workers have process groups of their own);
2. restart, wait until more input is committed, and send SIGTERM to the
   driver only, as `kill PID` or a service manager does.

Each stop must exit 130 (SIGINT) or 0 (SIGTERM) with one line saying it
stopped and where the tables are, print no Python traceback and no py4j or
Java stack, record the `terminated` event without an exception (so `status`
says `stopped` and exits 0) and release the lake's lease (B8). Every input
row appended right before the SIGINT is decided exactly once after the restart (B1).
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

from retry_engine.core.lease import read_state
from retry_engine.ops.cli import main
from tests.builders import Result
from tests.lakehouse import FAST_LEVELS, STOP_NOISE, Lake, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT = 300.0
STOP_TIMEOUT = 120.0
RUNNING_MARK = "retry-engine: running (query "


@dataclass
class Stopped:
    """What one engine process left behind."""

    signal_name: str
    returncode: int
    stdout: str
    stderr: str
    status_exit: int
    status_out: str
    lease_released: bool


@dataclass
class Scenario:
    lake: Lake
    conf: Path
    sigint: Stopped
    sigterm: Stopped
    written: dict[str, str]  # result_id -> the outcome its row must get


def _spawn(conf: Path, logs: Path, name: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "retry_engine.ops.cli", "run", "--config", str(conf)],
            stdout=stdout,
            stderr=stderr,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
    return proc, out, err


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _outcomes(lake: Lake) -> Counter[str]:
    return Counter(o["result_id"] for o in lake.rows("outcomes"))


def _status(conf: Path) -> tuple[int, str]:
    """`retry-engine status` (no Spark: it reads the tables with delta-rs)."""
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["status", "--config", str(conf)])
    return code, out.getvalue()


def _run_and_stop(
    lake: Lake,
    conf: Path,
    logs: Path,
    *,
    name: str,
    signum: int,
    write: list[Result],
    decided: list[Result],
    after: list[Result],
) -> Stopped:
    """Start the engine, append ``write``, wait for ``decided`` to be decided, append ``after``, send ``signum``."""
    proc, out, err = _spawn(conf, logs, name)
    try:
        wait_for(
            lambda: proc.poll() is not None or RUNNING_MARK in out.read_text(errors="replace"),
            timeout=STARTUP_TIMEOUT,
            what=f"{name}: the engine's running line",
        )
        assert proc.poll() is None, err.read_text(errors="replace")[-3000:]
        lake.write_results(write)
        wait_for(
            lambda: {r.values["result_id"] for r in decided} <= set(_outcomes(lake)),
            timeout=STARTUP_TIMEOUT,
            what=f"{name}: a committed batch with the first input",
        )
        if after:
            lake.write_results(after)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)  # the session started for it: driver and JVM
        else:
            os.kill(proc.pid, signum)
        proc.wait(timeout=STOP_TIMEOUT)
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    code, status_out = _status(conf)
    state = read_state(str(lake.root))
    return Stopped(
        signal.Signals(signum).name,
        proc.returncode,
        out.read_text(errors="replace"),
        err.read_text(errors="replace"),
        code,
        status_out,
        state is not None and state.released,
    )


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    root = tmp_path_factory.mktemp("stop")
    lake = Lake.make(root / "lake")
    conf = root / "engine.toml"
    conf.write_text(
        f'[engine]\nlake = "{root / "lake"}"\ntrigger_interval = "200ms"\nstate_bucket = "1s"\n'
        f'message_delay_level = "{FAST_LEVELS}"\nprogress_flush_interval = "500ms"\n'
    )
    # Acknowledged rows and first failures: each gets exactly one outcome, whenever it is read.
    rows = {
        name: [Result.of(f"{name}-ok-{i}").ok() for i in range(3)]
        + [Result.of(f"{name}-fail-{i}").failed() for i in range(2)]
        for name in ("A", "B", "C")
    }
    written = {
        r.values["result_id"]: ("acknowledged" if "-ok-" in r.values["msg_id"] else "retry")
        for batch in rows.values()
        for r in batch
    }
    sigint = _run_and_stop(
        lake,
        conf,
        root,
        name="sigint",
        signum=signal.SIGINT,
        write=rows["A"],
        decided=rows["A"],
        after=rows["B"],
    )
    # B, appended right before the SIGINT, must be decided by the restart: wait for it with C.
    sigterm = _run_and_stop(
        lake,
        conf,
        root,
        name="sigterm",
        signum=signal.SIGTERM,
        write=rows["C"],
        decided=rows["B"] + rows["C"],
        after=[],
    )
    return Scenario(lake, conf, sigint, sigterm, written)


@pytest.mark.parametrize("which, code", [("sigint", 130), ("sigterm", 0)])
def test_a_signal_stops_the_engine_cleanly(scenario: Scenario, which: str, code: int) -> None:
    stopped: Stopped = getattr(scenario, which)
    context = f"stdout:\n{stopped.stdout[-3000:]}\nstderr:\n{stopped.stderr[-6000:]}"
    assert stopped.returncode == code, context
    lines = stopped.stdout.splitlines()
    lake = scenario.lake.root
    assert lines[-1] == f"retry-engine: stopped on {stopped.signal_name}; tables under {lake}", (
        context
    )
    assert (
        sum("stopped on" in line for line in (stopped.stdout + stopped.stderr).splitlines()) == 1
    ), context
    # Start-up ends with one line: what runs, where, how to watch it and how to stop it (#13 part 6).
    running = [line for line in lines if line.startswith(RUNNING_MARK)]
    assert len(running) == 1, context
    assert (
        str(lake) in running[0]
        and "retry-engine status --config" in running[0]
        and "Ctrl-C" in running[0]
    )
    for noise in STOP_NOISE:
        assert noise not in stopped.stdout + stopped.stderr, f"{noise!r} in the output\n{context}"
    # #14 part 3: once, after the first committed batch, where start-up time went, step by step.
    startup = [line for line in stopped.stderr.splitlines() if "start-up: first batch committed" in line]
    assert len(startup) == 1, context
    body = startup[0].split("after the process started: ", 1)[1]
    assert re.findall(r"([a-z][a-z ]+?) \d+\.\d s", body) == [
        "process and imports", "spark session", "lease", "table layout", "resume point",
        "query start", "first batch", "planning", "execution", "commit",
    ], startup[0]


@pytest.mark.parametrize("which", ["sigint", "sigterm"])
def test_status_reports_stopped_and_exits_0(scenario: Scenario, which: str) -> None:
    stopped: Stopped = getattr(scenario, which)
    assert stopped.status_exit == 0, stopped.status_out
    first = stopped.status_out.splitlines()[0]
    assert first.startswith("query       stopped: stopped at "), stopped.status_out
    assert first.endswith(" (reason: stopped, on request)"), stopped.status_out


def test_each_run_ends_with_a_terminated_event_with_reason_stopped(scenario: Scenario) -> None:
    """The SIGINT run, then the SIGTERM run: each ends with one terminated event, stopped on request."""
    progress = scenario.lake.rows("progress")
    runs: dict[str, list[dict[str, object]]] = {}
    for row in sorted(progress, key=lambda r: r["recorded_at"]):
        runs.setdefault(str(row["run_id"]), []).append(row)
    assert len(runs) == 2
    for which, rows in zip(("sigint", "sigterm"), runs.values(), strict=True):
        terminated = [r for r in rows if r["event"] == "terminated"]
        assert len(terminated) == 1 and terminated[0] is rows[-1], (
            which,
            [r["event"] for r in rows],
        )
        assert (terminated[0]["exception"], terminated[0]["reason"]) == (None, "stopped"), which
        assert {r["reason"] for r in rows[:-1]} == {None}, (
            which
        )  # started, progress and idle have none


@pytest.mark.parametrize("which", ["sigint", "sigterm"])
def test_the_lease_is_released_so_a_restart_needs_no_take_over(
    scenario: Scenario, which: str
) -> None:
    """B8: a stopped engine gives the lake up at once, not after the lease timeout."""
    assert getattr(scenario, which).lease_released


def test_input_appended_before_each_stop_is_decided_exactly_once(scenario: Scenario) -> None:
    """B1 across the stop: the rows appended right before the SIGINT (B) included."""
    outcomes = scenario.lake.rows("outcomes")
    per_result = Counter(o["result_id"] for o in outcomes)
    assert {r: n for r, n in per_result.items() if n != 1} == {}
    assert {o["result_id"]: o["outcome"] for o in outcomes} == scenario.written
    retries = scenario.lake.rows("retry")
    assert len({r["msg_id"] for r in retries}) == len(retries)
