"""`retry-engine run` restarts a failed query (B1, #14 part 4): the settings and the one line it prints.

The restarts themselves run against a real store in tests/integration/test_storage_outage.py.
"""

from __future__ import annotations

import os

import pytest

from retry_engine.config import parse_config
from retry_engine.errors import ConfigError
from retry_engine.ops.status import failure_reason

# What Spark said of a query whose source could not list consume_results's log (delta-rs's OSError
# inside the Python data source's traceback, Spark's stack after it), recorded from a run.
_SOURCE_FAILED = (
    "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source perform latestOffset: "
    "Traceback (most recent call last):\n"
    '  File "/x/pyspark/sql/streaming/python_streaming_source_runner.py", line 192, in latest_offset\n'
    "    offset = reader.latestOffset(start_offset_dict, limit_obj)\n"
    '  File "/x/retry_engine/delta/_log.py", line 461, in table\n'
    "    self._table.update_incremental()\n"
    "OSError: Kernel error -> Generic S3 error\n"
    "          \x1b[31m↳\x1b[0m Error performing list request\n"
    "           \x1b[31m↳\x1b[0m 10, retry_timeout\n"
    "                \x1b[31m↳\x1b[0m Connection reset by peer (os error 104)\n"
    "\n"
    " SQLSTATE: 38000\n"
    "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.pythonStreamingDataSourceRuntimeError(x.scala:1890)\n"
)


def test_defaults_ride_out_about_25_minutes_of_failing_storage() -> None:
    config = parse_config({})
    assert config.engine.restart_attempts == 10
    delays = [config.restart_delay_s(n) for n in range(1, 11)]
    assert delays == [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]
    assert 1500 <= sum(delays) <= 1520


def test_a_delay_longer_than_the_cap_is_kept_and_huge_attempts_do_not_overflow() -> None:
    config = parse_config({"engine": {"restart_delay": "10m", "restart_attempts": 1_000_000}})
    assert config.restart_delay_s(1) == config.restart_delay_s(10**6) == 600
    assert parse_config({"engine": {"restart_delay": "1ms"}}).restart_delay_s(10**6) == 300


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"restart_attempts": -1}, "greater than or equal to 0"),
        ({"restart_attempts": 1.5}, "valid integer"),
        ({"restart_attempts": True}, "valid integer"),
        ({"restart_attempts": "3"}, "valid integer"),
        ({"restart_attempts": 10**7}, "less than or equal to 1000000"),
        ({"restart_delay": "0s"}, "positive integer"),
        ({"restart_delay": "-5s"}, "positive integer"),
        ({"restart_delay": "soon"}, "bad duration"),
        ({"restart_delay": 5}, "restart_delay"),
        ({"restart_delay": "2d"}, "longer than a day"),
    ],
)
def test_hostile_restart_settings_are_refused(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"engine": settings})


def test_zero_attempts_means_no_restart() -> None:
    assert parse_config({"engine": {"restart_attempts": 0}}).engine.restart_attempts == 0


def test_the_failure_line_is_the_python_error_with_its_causes() -> None:
    assert failure_reason(_SOURCE_FAILED) == (
        "OSError: Kernel error -> Generic S3 error: Error performing list request: 10, retry_timeout: "
        "Connection reset by peer (os error 104)"
    )


def test_the_failure_line_names_the_last_python_error_and_falls_back_to_sparks_first_line() -> None:
    nested = (
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function.\n"
        "Traceback (most recent call last):\n"
        "ValueError: first\n"
        "During handling of the above exception, another exception occurred:\n"
        "retry_engine.errors.LeaseLostError: [LEASE_LOST] batch 7 refused: taken over\n"
        "\tat org.apache.spark.Something(x.scala:1)\n"
    )
    assert failure_reason(nested) == "retry_engine.errors.LeaseLostError: [LEASE_LOST] batch 7 refused: taken over"
    assert failure_reason("org.apache.spark.SparkException: Job aborted\n\tat x") == (
        "org.apache.spark.SparkException: Job aborted"
    )
    assert failure_reason("Executor lost\nmore") == "Executor lost"
    assert failure_reason("") == ""


# --------------------------------------------------------------------------- the loop's decisions
# The loop with the engine's start and stop standing in (a real outage, restart and give-up run in
# tests/integration/test_storage_outage.py): what it counts, when it gives up, a stop request.


class _Query:
    def __init__(self, *, progressed: bool, failure: str | None = "OSError: store gone") -> None:
        self.id = "q"
        self.isActive = False
        self.recentProgress = [{"batchId": 0}] if progressed else []
        self._failure = failure

    def exception(self) -> Exception | None:
        return Exception(self._failure) if self._failure else None


class _Signals:
    """StopSignals as the loop sees it: ``stop_on_wait`` turns the n-th wait into a SIGTERM."""

    def __init__(self, stop_on_wait: int | None = None) -> None:
        self.received: int | None = None
        self.waits: list[float] = []
        self._stop_on = stop_on_wait

    @property
    def requested(self) -> bool:
        return self.received is not None

    def wait(self, timeout: float) -> bool:
        if timeout == 0:  # the poll while a query runs (RUN_POLL_SECONDS, 0 here)
            return self.received is not None
        self.waits.append(timeout)
        if self._stop_on is not None and len(self.waits) >= self._stop_on:
            import signal

            self.received = signal.SIGTERM
        return self.received is not None


def _loop(  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch, starts: list[object], signals: _Signals, attempts: int = 3, standby: bool = False
):
    import argparse

    from retry_engine.core import engine
    from retry_engine.ops import cli

    config = parse_config({"engine": {"restart_attempts": attempts, "restart_delay": "1s"}})
    calls: list[dict[str, object]] = []

    def start(spark: object, config: object, **kwargs: object) -> object:
        calls.append(kwargs)
        outcome = starts.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(engine, "start", start)
    monkeypatch.setattr(engine, "stop", lambda query, **kwargs: None)
    monkeypatch.setattr(cli, "RUN_POLL_SECONDS", 0.0)
    args = argparse.Namespace(take_over=not standby, discard_pending=True, config=None, standby=standby)
    code, last = cli._run_restarting(None, config, args, None, signals)  # type: ignore[arg-type]
    return code, [line for line, _ in last], calls, signals.waits


def test_restarts_in_a_row_double_the_wait_and_run_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from retry_engine.errors import StorageError

    gone = StorageError("cannot reach s3://b/lake/_engine_state: refused", code="STORAGE_UNREACHABLE")
    code, last, calls, waits = _loop(monkeypatch, [_Query(progressed=True), gone, _Query(progressed=False), gone], _Signals())

    assert code == 1 and waits == [1.0, 2.0, 4.0]
    assert last == [
        "retry-engine: the engine stopped: [STORAGE_UNREACHABLE] cannot reach s3://b/lake/_engine_state: refused; "
        f"tables under {os.path.abspath('./data/lake')}",
        "retry-engine: gave up after 3 restarts in a row without a completed micro-batch (engine.restart_attempts)",
    ]
    # --take-over and --discard-pending are the operator's answer for the first start only.
    assert calls[0]["take_over"] is True and all(c["take_over"] is False for c in calls[1:])
    assert calls[0]["discard_pending"] is True and all(c["discard_pending"] is False for c in calls[1:])


def test_a_restart_that_completes_a_batch_ends_the_row(monkeypatch: pytest.MonkeyPatch) -> None:
    queries = [_Query(progressed=False), _Query(progressed=True), _Query(progressed=False), _Query(progressed=False)]
    code, _, calls, waits = _loop(monkeypatch, queries, _Signals(), attempts=2)

    assert code == 1 and len(calls) == 4 and waits == [1.0, 1.0, 2.0]


def test_a_stop_during_the_wait_ends_at_once_with_the_signals_code(monkeypatch: pytest.MonkeyPatch) -> None:
    code, last, calls, waits = _loop(monkeypatch, [_Query(progressed=True)], _Signals(stop_on_wait=1))

    assert code == 0 and len(calls) == 1 and waits == [1.0]
    assert last[0].startswith("retry-engine: stopped on SIGTERM")


def test_no_restarts_and_a_first_start_on_a_store_that_fails_end_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from retry_engine.errors import StorageError

    code, last, calls, waits = _loop(monkeypatch, [_Query(progressed=True)], _Signals(), attempts=0)
    assert code == 1 and len(calls) == 1 and waits == [] and len(last) == 1
    assert last[0].startswith("retry-engine: the engine stopped: OSError: store gone;")

    with pytest.raises(StorageError):
        _loop(monkeypatch, [StorageError("no bucket", code="NO_SUCH_BUCKET")], _Signals())


def _owned() -> Exception:
    from retry_engine.errors import LakeOwnedError

    return LakeOwnedError("the lake /l is owned by another engine (host h, pid 1)", code="LAKE_OWNED")


def test_a_standby_waits_while_the_lake_is_owned_then_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, calls, waits = _loop(
        monkeypatch, [_owned(), _owned(), _Query(progressed=True)], _Signals(), attempts=0, standby=True
    )

    assert code == 1 and len(calls) == 3 and waits == [5.0, 5.0]  # a tenth of the 60 s lease, at most 5 s
    err = capsys.readouterr()
    assert err.err.count("retry-engine: standing by: [LAKE_OWNED] the lake /l is owned") == 1
    assert "retry-engine: running (query q)" in err.out


def test_a_standby_stops_on_a_signal_and_an_owned_lake_without_standby_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retry_engine.errors import LakeOwnedError

    code, last, calls, _ = _loop(monkeypatch, [_owned()], _Signals(stop_on_wait=1), standby=True)
    assert code == 0 and len(calls) == 1 and last[0].startswith("retry-engine: stopped on SIGTERM")

    with pytest.raises(LakeOwnedError):
        _loop(monkeypatch, [_owned()], _Signals())


def test_standby_polls_a_tenth_of_the_lease_within_1_to_5_seconds() -> None:
    from retry_engine.ops.cli import standby_poll_s

    assert [standby_poll_s(parse_config({"engine": {"lease_timeout": t}})) for t in ("5s", "20s", "60s", "1h")] == [
        1.0, 2.0, 5.0, 5.0,
    ]


def test_standby_with_once_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from retry_engine.ops.cli import EXIT_USAGE, main

    assert main(["run", "--once", "--standby"]) == EXIT_USAGE
    assert "--standby" in capsys.readouterr().err


def test_a_standby_rides_out_an_outage_of_the_store_it_already_reached(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from retry_engine.errors import StorageError

    gone = StorageError("cannot reach s3://b/lake/_engine_state", code="STORAGE_UNREACHABLE")
    starts = [_owned(), gone, gone, _owned(), gone, gone, _Query(progressed=True), gone, gone]
    code, _, calls, waits = _loop(monkeypatch, starts, _Signals(), attempts=2, standby=True)

    # Two failed starts in a row at most (the lease answered between them), then the engine ran,
    # failed, and its restarts ran out.
    assert code == 1 and len(calls) == 9 and waits == [5.0, 1.0, 2.0, 5.0, 1.0, 2.0, 1.0, 2.0]
    err = capsys.readouterr().err
    assert "retry-engine: the standby could not reach the lake: [STORAGE_UNREACHABLE]" in err
    assert "; trying again in 1 s (restart 1 of 2 in a row" in err
    assert "retry-engine: the engine stopped: OSError: store gone; restarting in 1 s" in err


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        ("retry_engine.errors.DeltaSourceError: [DELTA_FILE_MISSING] data file x is gone", "DELTA_FILE_MISSING"),
        ("retry_engine.errors.StateUnreadableError: [STATE_UNREADABLE] state value of key k", "STATE_UNREADABLE"),
        ("retry_engine.errors.StorageError: [STORAGE_UNREACHABLE] cannot reach s3://b/t: refused", None),
        ("retry_engine.errors.DeltaSourceError: [DELTA_TABLE_UNREADABLE] cannot load Delta table", None),
        ("OSError: Kernel error -> Generic S3 error: Connection reset by peer", None),
        ("org.apache.spark.SparkException: Job aborted due to stage failure: executor lost", None),
        ("ValueError: [NOT_OURS] a user's error with a bracket", None),
        ("", None),
    ],
)
def test_only_the_packages_own_errors_outside_the_restartable_codes_need_an_operator(
    reason: str, code: str | None
) -> None:
    from retry_engine.ops.cli import needs_operator

    assert needs_operator(reason) == code


def test_a_failure_that_needs_an_operator_is_not_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = _Query(progressed=True, failure="retry_engine.errors.DeltaSourceError: [DELTA_FILE_MISSING] file f gone")
    code, last, calls, waits = _loop(monkeypatch, [failed], _Signals())

    assert code == 1 and len(calls) == 1 and waits == []
    assert last[1] == "retry-engine: not restarted: [DELTA_FILE_MISSING] needs an operator (see above)"


def test_every_storage_error_code_is_restartable() -> None:
    """A store that fails is what restarts are for: no code a StorageError can carry (a new diagnosis
    included) may end `run` as needing an operator."""
    from retry_engine.delta.storage import STORAGE_CODES
    from retry_engine.ops.cli import needs_operator

    assert {"STORAGE_UNAVAILABLE", "STORAGE_UNREACHABLE", "NO_SUCH_BUCKET", "NO_CREDENTIALS", "ACCESS_DENIED"} <= STORAGE_CODES
    assert [c for c in STORAGE_CODES if needs_operator(f"retry_engine.errors.StorageError: [{c}] x")] == []
