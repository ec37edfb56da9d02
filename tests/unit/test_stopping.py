"""Stop requests by signal (#13 part 2), without Spark: real signals sent to this process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from retry_engine.cli import _running_line
from retry_engine.config import parse_config
from retry_engine.stopping import (
    EXIT_STOPPED_BY_SIGINT,
    EXIT_STOPPED_BY_SIGTERM,
    SIGINT_IGNORING_DAEMON,
    StopSignals,
    exit_code,
    local_worker_conf,
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
        os.kill(os.getpid(), signal.SIGINT if signum == signal.SIGTERM else signal.SIGTERM)
        assert signals.received == signum  # a second signal does not change what stopped it
    assert signal.getsignal(signum) is before


def test_exit_codes_say_which_signal_stopped_it() -> None:
    # 128 + SIGINT as shells report Ctrl-C; a SIGTERM stop is the normal end of a service.
    assert exit_code(signal.SIGINT) == EXIT_STOPPED_BY_SIGINT == 130
    assert exit_code(signal.SIGTERM) == EXIT_STOPPED_BY_SIGTERM == 0


def test_only_local_sessions_get_the_sigint_ignoring_worker_daemon() -> None:
    assert local_worker_conf("local[2]") == {"spark.python.daemon.module": SIGINT_IGNORING_DAEMON}
    assert local_worker_conf("spark://host:7077") == {} and local_worker_conf(None) == {}


def test_the_worker_daemon_keeps_sigint_ignored_in_workers() -> None:
    """What PySpark's daemon does in each forked worker, run through the module Spark is given."""
    script = (
        f"import signal, {SIGINT_IGNORING_DAEMON} as ours\n"
        "from pyspark import daemon\n"
        "daemon.signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "daemon.signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, signal.getsignal(signal.SIGHUP) is signal.SIG_IGN,"
        " daemon.signal.SIGTERM == signal.SIGTERM)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "True", "True"], out.stderr


def test_the_start_up_line_says_what_runs_where_and_how_to_watch_and_stop_it(tmp_path: Path) -> None:
    """#13 part 6: start-up ends with one line; the integration test checks it is the last one."""
    config = parse_config({"engine": {"lake": str(tmp_path / "lake")}})
    line = _running_line(config, "conf/x.toml", query_id="q-1")
    assert "\n" not in line and "query q-1" in line
    assert f"{tmp_path}/lake/consume_results" in line and f"under {tmp_path}/lake;" in line
    assert "`retry-engine status --config conf/x.toml`" in line and "`retry-engine plots --config conf/x.toml --out DIR`" in line
    assert f"Ctrl-C or `kill {os.getpid()}`" in line
    assert "--config" not in _running_line(config, None, query_id="q-1")
