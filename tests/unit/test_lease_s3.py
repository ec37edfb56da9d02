"""The lake lease on object storage (SPEC B8, #12 item 8): a real S3 API (moto's server), delta-rs conditional commits."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator

import pytest

from retry_engine.core.lease import BatchRecord, LakeLease, Owner, read_state
from retry_engine.errors import LakeOwnedError, LeaseLostError
from tests.s3 import REGION, S3Server

pytest.importorskip("moto.server")


@pytest.fixture
def s3_lake(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``s3://<bucket>/engine`` on the run's S3 server (its own process); delta-rs finds it through
    the AWS_* environment, as an engine configured by its environment does."""
    bucket = s3_server.new_bucket()
    options = s3_server.storage_options()
    for key in ("aws_endpoint_url", "aws_allow_http", "aws_access_key_id", "aws_secret_access_key"):
        monkeypatch.setenv(key.upper(), options[key])
    monkeypatch.setenv("AWS_REGION", REGION)
    yield f"s3://{bucket}/engine"


def test_lease_refuses_takes_over_and_fences_on_s3(s3_lake: str) -> None:
    """A second engine refuses; a take-over bumps the epoch; the old owner's record is refused, also mid-commit."""
    # Owners on other hosts: only expiry or a take-over frees the lake.
    first = LakeLease(s3_lake, Owner("host-a", 1, "query-A", "/a", dt.datetime.now(dt.UTC)))
    first.acquire()
    first.record_batch(BatchRecord("query-A", 0, None, {}, 0))
    with pytest.raises(LakeOwnedError, match="LAKE_OWNED.*query id query-A"):
        LakeLease(s3_lake, Owner("other-host", 1, "query-B", "/b", first.owner.since)).acquire()
    second = LakeLease(s3_lake, Owner("other-host", 1, "query-B", "/b", first.owner.since))
    second.acquire(take_over=True)
    with pytest.raises(LeaseLostError, match="LEASE_LOST.*query id query-B"):
        first.record_batch(BatchRecord("query-A", 1, None, {}, 0))
    state = read_state(s3_lake)
    assert state is not None and state.epoch == 2 and state.last_batch == BatchRecord("query-A", 0, None, {}, 0)

    # The race on S3: a third engine takes over after the second read the row, before its commit lands.
    third = LakeLease(s3_lake, Owner("third-host", 2, "query-C", "/c", first.owner.since))
    real_clock = second.clock
    taken = []

    def clock_with_take_over():  # type: ignore[no-untyped-def]
        if not taken:
            taken.append(third.acquire(take_over=True))
        return real_clock()

    second.clock = clock_with_take_over
    with pytest.raises(LeaseLostError, match="LEASE_LOST.*query id query-C"):
        second.record_batch(BatchRecord("query-B", 0, None, {}, 0))
    state = read_state(s3_lake)
    assert state is not None and state.epoch == 3 and state.owner is not None and state.owner.query_id == "query-C"
    assert state.last_batch == BatchRecord("query-A", 0, None, {}, 0)


def test_a_release_the_store_refuses_is_left_as_a_crash_would_leave_it(
    s3_lake: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An engine whose query failed on a storage outage stops without raising from the release (B8): the lease
    stays held, a warning says who takes it back when, and this host's next start takes it back."""
    from tests.s3 import free_port

    owner = Owner("host-a", 1, "query-A", "/a", dt.datetime.now(dt.UTC))
    lease = LakeLease(s3_lake, owner)
    lease.acquire()
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there

    with caplog.at_level("WARNING", logger="retry_engine.core.lease"):
        lease.release()

    assert "could not release the lease ([STORAGE_UNREACHABLE] cannot reach" in caplog.text
    assert "one on another host after 60 s" in caplog.text
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    state = read_state(s3_lake)
    assert state is not None and not state.released and state.owner == owner


def test_heartbeats_the_store_refuses_are_one_line_warnings_and_the_lease_survives(
    s3_lake: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """During an outage each missed beat logs one line (it logged a traceback every beat); the next beat
    after the store is back renews the lease, which nothing else took meanwhile."""
    import time

    from retry_engine.core.lease import Heartbeat
    from tests.lakehouse import wait_for
    from tests.s3 import free_port

    lease = LakeLease(s3_lake, Owner("host-a", 1, "query-A", "/a", dt.datetime.now(dt.UTC)))
    lease.acquire()
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    beat = Heartbeat(lease, interval_s=0.2, alive=lambda: True, on_lost=lambda exc: None)
    with caplog.at_level("WARNING", logger="retry_engine.core.lease"):
        beat.start()
        deadline = time.monotonic() + 30
        while "heartbeat failed" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.1)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        before = read_state(s3_lake)
        assert before is not None and before.heartbeat is not None
        # Until a beat lands (a fixed wait was too short for a beat still failing plus a commit under load).
        wait_for(lambda: (now := read_state(s3_lake)) is not None and now.heartbeat is not None
                 and now.heartbeat > before.heartbeat, timeout=120, what="a heartbeat after the store is back")
        beat.stop()

    failed = [r for r in caplog.records if "heartbeat failed" in r.getMessage()]
    assert failed and all(r.exc_info is None for r in failed), caplog.text
    assert "the next one retries: [STORAGE_UNREACHABLE] cannot reach" in failed[0].getMessage()
    after = read_state(s3_lake)
    assert before is not None and after is not None and after.epoch == before.epoch == lease.epoch
    assert after.heartbeat is not None and before.heartbeat is not None and after.heartbeat > before.heartbeat
    assert beat.lost is None
