"""Hostile assignment records (``<checkpoint>/rebalance/<batch>.json``), without Spark.

A record whose catch-up versions or windows are not what this release writes (damaged, hand-edited,
another build's) must be refused by ``Assignment.from_json``, so that ``_load`` plans the batch anew with
a warning naming the file: replayed as it is, it fails the batch on every replay (a bare KeyError, or
Spark's INVALID_OPTION for a version no table has) and the stream never gets past it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from retry_engine.clients.consumer import _RebalancedBatch
from retry_engine.clients.rebalance import Assignment, Window

COUNTS = {"orders": 4, "%RETRY%G": 1}
GOOD = Assignment(
    batch_id=7,
    members=("A@1", "B@1"),
    queue_counts=dict(sorted(COUNTS.items())),
    owned={"%RETRY%G": (0,), "orders": (0, 1)},
    catch_up={"orders": (1,)},
    catch_up_versions={"orders": 3},
    windows=(Window("orders", (1,), 3), Window("%RETRY%G", (0,), 0)),
)


def window(queues: list[Any], through_version: Any = 3, topic: str = "orders") -> dict[str, Any]:
    return {"topic": topic, "queues": queues, "through_version": through_version}


HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("catch_up_versions missing a caught-up topic", {"catch_up_versions": {}}),
    (
        "catch_up_versions of a topic not caught up",
        {"catch_up_versions": {"orders": 3, "%RETRY%G": 0}},
    ),
    ("catch_up_versions negative", {"catch_up_versions": {"orders": -7}}),
    ("catch_up_versions -1", {"catch_up_versions": {"orders": -1}}),
    ("catch_up_versions a bool", {"catch_up_versions": {"orders": True}}),
    ("catch_up_versions past any version", {"catch_up_versions": {"orders": 10**30}}),
    ("catch_up_versions 2**63", {"catch_up_versions": {"orders": 2**63}}),
    ("catch_up_versions a float", {"catch_up_versions": {"orders": 3.0}}),
    ("window queue past any queue", {"windows": [window([10**30], 10**30)]}),
    ("window queue not among the topic's", {"windows": [window([4])]}),
    ("window queue negative", {"windows": [window([-1])]}),
    ("window queue a bool", {"windows": [window([True])]}),
    ("window queue a string", {"windows": [window(["1"])]}),
    ("window of a topic without a queue count", {"windows": [window([], topic="audit")]}),
    ("window through_version past any version", {"windows": [window([1], 10**30)]}),
    ("window through_version a bool", {"windows": [window([1], True)]}),
    ("window through_version below -1", {"windows": [window([1], -2)]}),
    ("window through_version a string", {"windows": [window([1], "3")]}),
]


def hostile(edit: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps({**GOOD.to_json(), **edit}))


def batch_function(tmp_path: Path) -> _RebalancedBatch:
    """The consumer's batch function without Spark: ``_load`` needs none."""
    return _RebalancedBatch(
        spark=None,
        group="G",
        spec=None,
        writer=None,
        membership=None,
        queue_counts=COUNTS,  # type: ignore[arg-type]
        sources={"orders": "/nonexistent/messages", "%RETRY%G": "/nonexistent/retry"},
        topic_filter=None,
        records=str(tmp_path / "rebalance"),
        results_path="",  # type: ignore[arg-type]
    )


def test_a_well_formed_record_round_trips(tmp_path: Path) -> None:
    assert Assignment.from_json(json.loads(json.dumps(GOOD.to_json()))) == GOOD
    fn = batch_function(tmp_path)
    fn._save(GOOD)
    assert fn._load(7) == GOOD
    # A window read with its record's queue counts, or on its own (any queue id a topic may have).
    for w in GOOD.windows:
        assert Window.from_json(json.loads(json.dumps(w.to_json())), GOOD.queue_counts) == w
    assert Window.from_json(
        {"topic": "orders", "queues": [0, 2**31 - 1], "through_version": -1}
    ) == Window("orders", (0, 2**31 - 1), -1)


@pytest.mark.parametrize(("label", "edit"), HOSTILE, ids=[label for label, _ in HOSTILE])
def test_from_json_refuses_a_hostile_record(label: str, edit: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Assignment.from_json(hostile(edit))


@pytest.mark.parametrize(("label", "edit"), HOSTILE, ids=[label for label, _ in HOSTILE])
def test_load_plans_a_hostile_record_anew_naming_its_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, label: str, edit: dict[str, Any]
) -> None:
    fn = batch_function(tmp_path)
    fn._save(GOOD)
    path = tmp_path / "rebalance" / "7.json"
    path.write_text(json.dumps(hostile(edit)))
    with caplog.at_level(logging.WARNING, logger="retry_engine.clients.consumer"):
        assert fn._load(7) is None, label
    assert any(
        str(path) in r.getMessage() and "planning batch 7 anew" in r.getMessage()
        for r in caplog.records
    )


WINDOWS_ALONE: list[tuple[str, dict[str, Any]]] = [
    ("queue past any queue", {"topic": "orders", "queues": [10**30], "through_version": 3}),
    ("queue 2**31", {"topic": "orders", "queues": [2**31], "through_version": 3}),
    ("queue negative", {"topic": "orders", "queues": [-1], "through_version": 3}),
    ("queue a bool", {"topic": "orders", "queues": [False], "through_version": 3}),
    (
        "through_version past any version",
        {"topic": "orders", "queues": [1], "through_version": 10**30},
    ),
    ("through_version 2**63", {"topic": "orders", "queues": [1], "through_version": 2**63}),
    ("through_version a bool", {"topic": "orders", "queues": [1], "through_version": False}),
]


@pytest.mark.parametrize(
    ("label", "data"), WINDOWS_ALONE, ids=[label for label, _ in WINDOWS_ALONE]
)
def test_a_window_alone_refuses_what_no_queue_or_version_is(
    label: str, data: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):
        Window.from_json(data)
