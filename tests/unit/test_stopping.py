"""Stop requests by signal (#13 part 2), without Spark: real signals sent to this process."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from retry_engine.config import parse_config
from retry_engine.ops.cli import _running_line
from retry_engine.ops.stopping import (
    EXIT_STOPPED_BY_SIGINT,
    EXIT_STOPPED_BY_SIGTERM,
    StopSignals,
    exit_code,
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
