"""`retry-engine run` restarts a failed query (B1, #14 part 4): the settings and the one line it prints.

The restarts themselves run against a real store in tests/integration/test_storage_outage.py.
"""

from __future__ import annotations

import pytest

from retry_engine.config import parse_config
from retry_engine.errors import ConfigError
from retry_engine.ops.cli import failure_reason

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
        ({"restart_delay": "soon"}, "bad delay token"),
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
