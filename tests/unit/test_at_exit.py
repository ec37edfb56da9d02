"""What a process left running is ended at its exit, within a bound (retry_engine.core.at_exit)."""

from __future__ import annotations

import threading
import time

import pytest

from retry_engine.core.at_exit import end_left


def test_each_item_is_ended_in_order_and_a_failing_one_does_not_stop_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    ended: list[str] = []

    def fail() -> None:
        ended.append("b")
        raise RuntimeError("storage gone")

    items = [("a", lambda: ended.append("a")), ("b", fail), ("c", lambda: ended.append("c"))]
    assert end_left("engine", lambda: items, timeout_s=30)
    assert ended == ["a", "b", "c"]
    assert "engine b: ending it at exit failed" in caplog.text and "storage gone" in caplog.text


def test_nothing_left_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from retry_engine.core import at_exit

    started: list[dict[str, object]] = []
    thread = threading.Thread

    def spy(*args: object, **kwargs: object) -> threading.Thread:
        started.append(kwargs)
        return thread(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(at_exit.threading, "Thread", spy)
    assert end_left("engine", list, timeout_s=0.01)
    assert started == []
    # The same spy sees the thread when there is something to end.
    assert end_left("engine", lambda: [("q", lambda: None)], timeout_s=30)
    assert [k.get("name") for k in started] == ["retry-engine-exit-engine"]


def test_an_end_that_hangs_is_left_after_the_bound_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """E.g. a lease release on object storage that no longer answers (delta-rs retries for 180 s)."""
    release = threading.Event()
    began = time.monotonic()
    try:
        assert not end_left("consumer", lambda: [("A@one", lambda: release.wait(60))], timeout_s=0.3)
        took = time.monotonic() - began
    finally:
        release.set()
    assert 0.3 <= took < 10
    assert "consumer: ending A@one at exit took longer than 0.3 s" in caplog.text


def test_a_forked_child_ends_nothing_of_its_parent() -> None:
    """The child inherits the parent's list; stopping those would stop the parent's engine."""
    import os

    from retry_engine.core.at_exit import end_left_in

    ended: list[str] = []
    items = [("q", lambda: ended.append("q"))]
    assert end_left_in(os.getpid() + 1, "engine", lambda: items)
    assert ended == []
    assert end_left_in(os.getpid(), "engine", lambda: items)
    assert ended == ["q"]
