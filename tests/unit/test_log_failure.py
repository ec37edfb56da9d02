"""storage.log_failure: what a later round retries is logged by kind (heartbeat, maintenance, sweeps).

The store failing is one warning line however often it fails (delta-rs's chain of causes on one
line, colours and arrows gone); anything else is an error with its traceback, a bug's stack kept.
"""

from __future__ import annotations

import logging

import pytest

from retry_engine.delta.storage import StorageError, log_failure

log = logging.getLogger("tests.log_failure")
CHAIN = "Generic S3 error: Error after 0 retries\n\x1b[31m  ↳ error sending request\n  ↳ Connection refused (os error 111)"


@pytest.mark.parametrize(
    ("exc", "shown"),
    [
        (OSError(CHAIN), "Generic S3 error: Error after 0 retries: error sending request: Connection refused (os error 111)"),
        (
            StorageError("cannot reach s3://b/x: refused", code="STORAGE_UNREACHABLE"),
            "[STORAGE_UNREACHABLE] cannot reach s3://b/x: refused",
        ),
        (FileNotFoundError(2, "No such file or directory"), "[Errno 2] No such file or directory"),
        (OSError(), "OSError"),
    ],
)
def test_the_store_failing_is_one_warning_line(exc: OSError, shown: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=log.name):
        log_failure(log, "lake x: heartbeat failed, the next one retries", exc)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert record.getMessage() == f"lake x: heartbeat failed, the next one retries: {shown}"


def test_anything_else_is_an_error_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    try:
        {}["missing"]
    except KeyError as exc:
        with caplog.at_level(logging.DEBUG, logger=log.name):
            log_failure(log, "in-engine maintenance failed", exc)
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and record.getMessage() == "in-engine maintenance failed"
    assert record.exc_info is not None and record.exc_info[0] is KeyError
