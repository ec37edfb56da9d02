"""Stop requests by signal (#13 part 2), without Spark: real signals sent to this process."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from retry_engine.config import parse_config
from retry_engine.ops.cli import STOP_FINISH_BATCH_SECONDS, _running_line
from retry_engine.ops.stopping import (
    EXIT_STOPPED_BY_SIGINT,
    EXIT_STOPPED_BY_SIGTERM,
    StopSignals,
    exit_code,
    stop_session,
)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_only_sets_the_flag_and_wakes_the_waiter(signum: int) -> None:
    before = signal.getsignal(signum)
    with StopSignals() as signals:
        assert not signals.requested and not signals.wait(0.01)
        # Without the handler SIGINT raises KeyboardInterrupt here and SIGTERM ends pytest.
        threading.Timer(0.2, os.kill, (os.getpid(), signum)).start()
        assert signals.wait(30.0)
        assert signals.requested and signals.received == signum
    assert signal.getsignal(signum) is before


@pytest.mark.parametrize(("first", "second", "code"), [("SIGINT", "SIGINT", 130), ("SIGTERM", "SIGINT", 130), ("SIGINT", "SIGTERM", 143)])
def test_a_second_signal_ends_the_process_at_once(first: str, second: str, code: int) -> None:
    """(found by a review) A stop waits for the running batch's commits (minutes on a slow store), and a second
    Ctrl-C only logged "already stopping": no way out but SIGKILL. The second signal ends the process now, as a
    crash would (the next start replays the batch)."""
    import subprocess
    import sys

    child = (
        "import logging, os, signal, sys, time\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
        "from retry_engine.ops.stopping import StopSignals\n"
        "with StopSignals() as s:\n"
        f"    os.kill(os.getpid(), signal.{first}); assert s.wait(10)\n"
        f"    os.kill(os.getpid(), signal.{second}); time.sleep(30)\n"
        "sys.exit(5)\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == code and f"{second} received again: exiting now" in done.stderr


def test_exit_codes_say_which_signal_stopped_it() -> None:
    # 128 + SIGINT as shells report Ctrl-C; a SIGTERM stop is the normal end of a service.
    assert exit_code(signal.SIGINT) == EXIT_STOPPED_BY_SIGINT == 130
    assert exit_code(signal.SIGTERM) == EXIT_STOPPED_BY_SIGTERM == 0


def test_the_start_up_line_says_what_runs_where_and_how_to_watch_and_stop_it(
    tmp_path: Path,
) -> None:
    """#13 part 6: start-up ends with one line; the integration test checks it is the last one."""
    config = parse_config({"engine": {"lake": str(tmp_path / "lake")}})
    line = _running_line(config, "conf/x.toml", query_id="q-1")
    assert "\n" not in line and "query q-1" in line
    assert f"{tmp_path}/lake/consume_results" in line and f"under {tmp_path}/lake;" in line
    assert (
        "`retry-engine status --config conf/x.toml`" in line
        and "`retry-engine plots --config conf/x.toml --out DIR`" in line
    )
    assert f"Ctrl-C or `kill {os.getpid()}`" in line
    assert "--config" not in _running_line(config, None, query_id="q-1")


# -- run --once: a signal stops it cleanly too (#13 part 2) ---------------------------


class IdleQuery:
    """A StreamingQuery that runs until stopped, or reports its input processed at once (``done``)."""

    id = "q-once"
    runId = "run-once"  # noqa: N815 (Spark's name)
    isActive = True  # noqa: N815

    def __init__(self, *, done: bool) -> None:
        end = {"reservoirVersion": 1, "index": -1, "isStartingVersion": False}
        self.lastProgress = {"sources": [{"endOffset": end}]} if done else None  # noqa: N815

    def exception(self) -> None:
        return None


class Signalled(Exception):
    """Raised by this test's own SIGTERM handler: without the fix, what the signal would do to pytest."""


@pytest.fixture
def once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[Path, list[dict[str, Any]], list[object]]:
    """`run --once` over a fake engine: (config file, the engine.stop calls, quiet_stop_logs and drain_tasks calls)."""
    from retry_engine.core import engine
    from retry_engine.delta import session
    from retry_engine.ops import stopping

    stops: list[dict[str, Any]] = []
    quieted: list[object] = []
    monkeypatch.setattr(session, "build_session", lambda **_: "spark")
    monkeypatch.setattr(engine, "table_version", lambda path: 0)
    monkeypatch.setattr(stopping, "quiet_stop_logs", quieted.append)
    # After a requested stop the tasks of an abandoned batch are drained; here, recorded like the quieting.
    monkeypatch.setattr(stopping, "drain_tasks", lambda spark, **_: quieted.append(("drained", spark)))

    def stop(query: IdleQuery, **kwargs: Any) -> None:
        query.isActive = False
        stops.append(kwargs)

    monkeypatch.setattr(engine, "stop", stop)
    conf = tmp_path / "engine.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path / "lake"}"\n')
    return conf, stops, quieted


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_during_run_once_stops_the_query_from_the_main_thread(
    once: tuple[Path, list[dict[str, Any]], list[object]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    signum: int,
    code: int,
) -> None:
    """Without StopSignals a SIGTERM killed `run --once` with no terminated event and the lease held."""
    from retry_engine.core import engine
    from retry_engine.ops.cli import main

    conf, stops, quieted = once

    def start(*args: object, **kwargs: object) -> IdleQuery:
        # The signal arrives while the query starts, under the command's StopSignals (a timer fired before
        # the command had installed them when the main thread was slow, and hit the handler below).
        os.kill(os.getpid(), signum)
        return IdleQuery(done=False)

    monkeypatch.setattr(engine, "start", start)

    def signalled(signum: int, frame: object) -> None:
        raise Signalled(signal.Signals(signum).name)

    before = signal.signal(signum, signalled)
    try:
        assert main(["run", "--once", "--config", str(conf)]) == code
        assert signal.getsignal(signum) is signalled  # restored after the command
    finally:
        signal.signal(signum, before)
    out = capsys.readouterr().out.splitlines()
    name = signal.Signals(signum).name
    assert out == [f"retry-engine: stopped on {name}; tables under {conf.parent / 'lake'}"]
    assert stops == [{"finish_batch_s": STOP_FINISH_BATCH_SECONDS, "reason": "stopped"}]
    assert quieted == ["spark", ("drained", "spark")]


def test_run_once_that_processes_its_input_records_finished_and_prints_its_done_line(
    once: tuple[Path, list[dict[str, Any]], list[object]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from retry_engine.core import engine
    from retry_engine.ops.cli import main

    conf, stops, quieted = once
    monkeypatch.setattr(engine, "start", lambda *a, **k: IdleQuery(done=True))
    assert main(["run", "--once", "--config", str(conf)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"retry-engine: done: every consume result of the table decided; tables under {conf.parent / 'lake'} "
        "(`retry-engine status` for the backlog)"
    ]
    assert stops == [{"finish_batch_s": 0.0, "reason": "finished"}]
    # The stop interrupts the batch Spark planned next: its noise is silenced as on a signal (not drained).
    assert quieted == ["spark"]


class GoneSession:
    """A session whose JVM has died: every call into Spark raises, as py4j does then."""

    def __init__(self) -> None:
        self.stopped = False

    @property
    def sparkContext(self) -> Any:  # noqa: N802 (Spark's name)
        raise ConnectionRefusedError("py4j: the JVM is gone")

    def stop(self) -> None:
        self.stopped = True


class DeadSession(GoneSession):
    """Its stop raises too (the JVM was killed with the process group: systemd's KillMode=control-group)."""

    def stop(self) -> None:
        self.stopped = True
        raise ConnectionRefusedError("py4j: the JVM is gone")


@pytest.mark.parametrize("session", [GoneSession, DeadSession])
def test_stopping_a_session_whose_jvm_is_gone_still_stops_it_and_raises_nothing(session: type[GoneSession]) -> None:
    """The drain is best effort: in a `finally`, an error of its own would hide the one that ended the run (found
    by a review: spark.stop() raising turned a clean SIGTERM stop into exit 1 and a traceback)."""
    gone = session()
    assert stop_session(gone, drain_s=1.0) is False  # type: ignore[arg-type]
    assert gone.stopped


class FailedQuery(IdleQuery):
    """A query that died: its failure must show, so nothing is silenced before its stop."""

    def exception(self) -> RuntimeError:  # type: ignore[override]
        return RuntimeError("the batch failed")


def test_run_once_whose_query_failed_silences_nothing(
    once: tuple[Path, list[dict[str, Any]], list[object]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retry_engine.core import engine
    from retry_engine.ops.cli import main

    conf, stops, quieted = once
    monkeypatch.setattr(engine, "start", lambda *a, **k: FailedQuery(done=False))
    with pytest.raises(RuntimeError, match="the batch failed"):
        main(["run", "--once", "--config", str(conf)])
    assert stops == [{"finish_batch_s": 0.0, "reason": "stopped"}]
    assert quieted == []


def test_the_lines_name_a_lake_on_object_storage_by_its_uri() -> None:
    """A review (session 20): an S3 lake was named as a folder of the working directory
    (``tables under /tmp/p1/s3:/bucket-p1/lake``)."""
    from retry_engine.config import parse_config
    from retry_engine.ops.cli import _failed_line, _stopped_line

    config = parse_config({"engine": {"lake": "s3://bucket-p1/lake", "checkpoint": "/tmp/ck"},
                           "storage": {"aws_region": "eu-west-1"}})
    assert _stopped_line(signal.SIGTERM, config).endswith("; tables under s3://bucket-p1/lake")
    assert _failed_line("the engine stopped", "x", config).endswith("; tables under s3://bucket-p1/lake")
    local = parse_config({"engine": {"lake": "file:///srv/lake"}})
    assert _stopped_line(signal.SIGTERM, local).endswith("; tables under file:///srv/lake")
