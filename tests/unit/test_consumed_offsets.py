"""Consumed offsets (RocketMQ's offset store) of a CLUSTERING group, without Spark (#14: reads flat with age).

Each instance vouches, per owned queue, for the table version through which
every row of the queue has a result of the group; a gainer of the queue
catches up only what was committed after the furthest such version. These
tests pin the rules that make a vouched-for version true (worked out by hand
in each docstring) and that a hostile offsets file is skipped, never trusted.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from retry_engine.clients.consumer import _RebalancedBatch
from retry_engine.clients.rebalance import (
    Assignment,
    Membership,
    TopicOffsets,
    best_offsets,
    plan_assignment,
)
from retry_engine.delta import append_arrow, ensure_table, storage
from retry_engine.delta._log import DeltaLog
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import Result, results_table

COUNTS = {"orders": 4, "%RETRY%G": 2}
NOW = dt.datetime(2026, 11, 29, 10, 0, tzinfo=dt.UTC)


def batch_function(tmp_path: Path, **fields: Any) -> _RebalancedBatch:
    """The consumer's batch function without Spark: what these tests call of it needs none."""
    base: dict[str, Any] = dict(spark=None, group="G", spec=None, writer=None, membership=None, queue_counts=COUNTS,
                                sources={}, topic_filter=None, records=str(tmp_path / "rebalance"), results_path="")
    return _RebalancedBatch(**{**base, **fields})


def table_of_commits(path: str, commits: int) -> str:
    """A consume_results-shaped table at ``path``: version 0 empty, then ``commits`` one-row commits."""
    ensure_table(path, CONSUME_RESULTS.arrow_schema)
    for i in range(commits):
        append_arrow(path, results_table([Result.of(f"m{i}")]))
    return path


def plan(batch_id: int, members: list[str], previous: Assignment | None, **kw: object) -> Assignment:
    return plan_assignment(batch_id=batch_id, members=members, me="A@1", queue_counts=COUNTS,
                           versions=kw.pop("versions", {"orders": 20, "%RETRY%G": 9}),  # type: ignore[arg-type]
                           previous=previous, **kw)  # type: ignore[arg-type]


def test_a_new_checkpoint_from_the_first_row_vouches_for_what_its_stream_delivered() -> None:
    """Batch 0 of a stream from the first row: A (of A, B) owns orders 0-1 and retry 0; the stream is through
    orders version 12; the retry table is still in its first snapshot (-1: nothing whole yet)."""
    first = plan(0, ["A@1", "B@1"], None, stream_through={"orders": 12, "%RETRY%G": -1})
    assert first.consumed_through == {"orders": {0: 12, 1: 12}, "%RETRY%G": {0: -1}}
    # The next batch goes on from there: the furthest of the last and the stream's.
    second = plan(1, ["A@1", "B@1"], first, stream_through={"orders": 15, "%RETRY%G": 4})
    assert second.consumed_through == {"orders": {0: 15, 1: 15}, "%RETRY%G": {0: 4}}
    # A stream offset unknown (an unreadable offsets file) never takes a vouched version back.
    third = plan(2, ["A@1", "B@1"], second, stream_through={})
    assert third.consumed_through == second.consumed_through


def test_what_an_instance_cannot_know_it_does_not_vouch_for() -> None:
    """A stream from the latest rows (stream_through None) never delivered what came before it; a later
    batch without its previous record (lost) cannot tell what happened between; a queue whose last
    record vouched for nothing stays so until it is gained again."""
    assert plan(0, ["A@1"], None, stream_through=None).consumed_through == {}
    assert plan(7, ["A@1"], None, stream_through={"orders": 12}).consumed_through == {}
    unknown = plan(8, ["A@1"], plan(7, ["A@1"], None, stream_through={"orders": 12}), stream_through={"orders": 14})
    assert unknown.consumed_through == {}


def test_a_gained_queue_is_vouched_for_through_what_its_catch_up_read() -> None:
    """B leaves: A gains orders 2-3 and retry 1. B published orders 2 -> 11, orders 3 -> 14, retry 1 -> 5.
    The catch-up of orders starts after 11 (the lower of 2 and 3) and reads the table as of version 20:
    afterwards every row of 2-3 through 20 is consumed. Retry 1: after 5, as of 9."""
    before = plan(3, ["A@1", "B@1"], None, stream_through={"orders": 8, "%RETRY%G": 2})
    assert before.consumed_through == {}  # batch 3 without a record: nothing known of the kept queues either
    start = plan(0, ["A@1", "B@1"], None, stream_through={"orders": 8, "%RETRY%G": 2})
    published = {"orders": {2: 11, 3: 14}, "%RETRY%G": {1: 5}}
    gained = plan(1, ["A@1"], start, stream_through={"orders": 16, "%RETRY%G": 3}, published=published)
    assert gained.catch_up == {"orders": (2, 3), "%RETRY%G": (1,)}
    assert gained.catch_up_after == {"orders": 11, "%RETRY%G": 5}
    assert gained.consumed_through == {"orders": {0: 16, 1: 16, 2: 20, 3: 20}, "%RETRY%G": {0: 3, 1: 9}}
    # A published offset past the version the plan read (published after it) is still true: the furthest.
    ahead = plan(1, ["A@1"], start, stream_through={"orders": 16, "%RETRY%G": 3},
                 published={"orders": {2: 11, 3: 25}, "%RETRY%G": {1: 5}})
    assert ahead.consumed_through["orders"] == {0: 16, 1: 16, 2: 20, 3: 25}
    assert Assignment.from_json(json.loads(json.dumps(gained.to_json()))) == gained  # the checkpoint record


def test_a_topic_with_a_gained_queue_nobody_published_is_caught_up_whole() -> None:
    """orders 3 has no published offset: the catch-up of orders reads the whole table (no catch_up_after)."""
    start = plan(0, ["A@1", "B@1"], None, stream_through={"orders": 8, "%RETRY%G": 2})
    gained = plan(1, ["A@1"], start, stream_through={"orders": 8, "%RETRY%G": 2},
                  published={"orders": {2: 11}, "%RETRY%G": {1: 5}})
    assert gained.catch_up_after == {"%RETRY%G": 5}
    assert gained.consumed_through["orders"] == {0: 8, 1: 8, 2: 20, 3: 20}
    # A stream from the latest rows uses what others published, and vouches for nothing itself.
    latest = plan(1, ["A@1"], start, stream_through=None, published={"orders": {2: 11, 3: 4}})
    assert latest.catch_up_after == {"orders": 4} and latest.consumed_through == {}


def test_a_record_of_an_earlier_release_loads_without_offsets() -> None:
    record = plan(0, ["A@1"], None).to_json()
    del record["catch_up_after"], record["consumed_through"]
    loaded = Assignment.from_json(json.loads(json.dumps(record)))
    assert loaded.catch_up_after == {} and loaded.consumed_through == {}


# -- the published files ------------------------------------------------------------------------------


def offsets(through: dict[int, int], table: str = "t-1", queues: int = 4, tags: tuple[str, ...] | None = None) -> TopicOffsets:
    return TopicOffsets(table, queues, tags, through)


def test_published_offsets_round_trip_and_the_furthest_that_fits_wins(tmp_path: Path) -> None:
    a = Membership(str(tmp_path), "G", "A@1")
    b = Membership(str(tmp_path), "G", "B@1")
    a.publish({"orders": offsets({0: 7, 1: 9}), "%RETRY%G": offsets({0: 3}, table="t-2", queues=2)}, NOW)
    b.publish({"orders": offsets({1: 12, 2: 5})}, NOW)
    # Another table at the path (re-created), another queue count or other tags: not this instance's rows.
    Membership(str(tmp_path), "G", "C@1").publish({"orders": offsets({0: 99}, table="t-0")}, NOW)
    Membership(str(tmp_path), "G", "D@1").publish({"orders": offsets({0: 98}, queues=8)}, NOW)
    Membership(str(tmp_path), "G", "E@1").publish({"orders": offsets({0: 97}, tags=("red",))}, NOW)
    Membership(str(tmp_path), "H", "F@1").publish({"orders": offsets({0: 96})}, NOW)  # another group's folder
    published = a.published(NOW)
    assert len(published) == 5
    wanted = {"orders": offsets({}), "%RETRY%G": offsets({}, table="t-2", queues=2)}
    assert best_offsets(published, wanted) == {"orders": {0: 7, 1: 12, 2: 5}, "%RETRY%G": {0: 3}}
    # The heartbeat registry does not see the offsets folder.
    assert a.heartbeats() == []


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        "[" * 100_000,  # deeper than the JSON parser recurses
        '{"group": "G", "member": "B@1", "published_at": ' + "[" * 100_000 + "}",
        '{"group": "H", "member": "B@1", "published_at": "2026-11-29T10:00:00+00:00", "topics": {}}',
        '{"group": "G", "member": "B 1", "published_at": "2026-11-29T10:00:00+00:00", "topics": {}}',
        '{"group": "G", "member": "B@1", "published_at": "2026-11-29T10:00:00", "topics": {}}',
        '{"group": "G", "member": "B@1", "published_at": "soon", "topics": {}}',
        '{"group": "G", "member": "B@1", "published_at": "2026-11-29T10:00:00+00:00", "topics": []}',
    ]
    + [
        '{"group": "G", "member": "B@1", "published_at": "2026-11-29T10:00:00+00:00", "topics": {"orders": ' + o + "}}"
        for o in [
            '{"table": "t-1", "queues": 4, "tags": null, "through": {"0": true}}',
            '{"table": "t-1", "queues": 4, "tags": null, "through": {"0": -2}}',
            '{"table": "t-1", "queues": 4, "tags": null, "through": {"0": 9223372036854775808}}',
            '{"table": "t-1", "queues": 4, "tags": null, "through": {"0": 1.5}}',
            '{"table": "t-1", "queues": 4, "tags": null, "through": {"0": "7"}}',
            '{"table": "t-1", "queues": 4, "tags": null, "through": {"4": 7}}',
            '{"table": "t-1", "queues": 4, "tags": null, "through": {"-1": 7}}',
            '{"table": "t-1", "queues": 4, "tags": null, "through": {"\u00b2": 7}}',
            '{"table": "t-1", "queues": 4, "tags": null, "through": [7]}',
            '{"table": "t-1", "queues": 0, "tags": null, "through": {}}',
            '{"table": "t-1", "queues": true, "tags": null, "through": {}}',
            '{"table": "", "queues": 4, "tags": null, "through": {"0": 7}}',
            '{"table": 1, "queues": 4, "tags": null, "through": {"0": 7}}',
            '{"table": "t-1", "queues": 4, "tags": "red", "through": {"0": 7}}',
            '{"table": "t-1", "queues": 4, "tags": [1], "through": {"0": 7}}',
            '{"table": "t-1", "queues": 4, "through": {"0": 7}}',
        ]
    ],
)
def test_a_hostile_offsets_file_is_skipped_with_a_warning_never_trusted(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Anything an instance of this release never writes: the file counts for nothing (its queues are caught up
    from further back), the good file beside it still counts."""
    a = Membership(str(tmp_path), "G", "A@1")
    a.publish({"orders": offsets({0: 3})}, NOW)
    (a.folder / "offsets" / "0123456789abcdef.json").write_text(text)
    with caplog.at_level(logging.WARNING):
        published = a.published(NOW)
    assert best_offsets(published, {"orders": offsets({})}) == {"orders": {0: 3}}
    assert "skipping unreadable offsets file" in caplog.text


def test_offsets_not_published_for_a_day_are_forgotten_and_nothing_else(tmp_path: Path) -> None:
    a = Membership(str(tmp_path), "G", "A@1")
    Membership(str(tmp_path), "G", "B@1").publish({"orders": offsets({0: 3})}, NOW - dt.timedelta(days=2))
    Membership(str(tmp_path), "G", "C@1").publish({"orders": offsets({0: 4})}, NOW - dt.timedelta(hours=20))
    a.publish({"orders": offsets({1: 5})}, NOW)
    (a.folder / "offsets" / "junk.json").write_text("junk")
    assert best_offsets(a.published(NOW), {"orders": offsets({})}) == {"orders": {0: 4, 1: 5}}
    names = sorted(p.name for p in (a.folder / "offsets").iterdir())
    assert len(names) == 3 and "junk.json" in names  # B's file is gone; C's, A's own and the junk stay


def test_an_instance_publishes_what_changed_the_same_hourly_and_never_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch function publishes the last committed batch's offsets when they changed, the same offsets
    again after an hour even without a batch since (the group forgets a file a day old), nothing when
    it vouches for nothing (a file published before stays)."""

    from retry_engine.clients import consumer as consumer_module
    from retry_engine.schemas import MESSAGES

    messages = str(tmp_path / "messages")
    ensure_table(messages, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
    member = Membership(str(tmp_path), "G", "A@1")
    fn = batch_function(
        tmp_path,
        membership=member,
        queue_counts={"orders": 4},
        sources={"orders": messages},
        tags={"orders": ("a", "b")},
        publish_interval_seconds=10,
    )
    clock = [1000.0]
    monkeypatch.setattr(consumer_module.time, "monotonic", lambda: clock[0])
    file = member.folder / "offsets" / member.file.name
    writes: list[dict[str, object]] = []
    publish = Membership.publish
    monkeypatch.setattr(Membership, "publish", lambda self, offsets, now=None: (writes.append(offsets), publish(self, offsets, now)))

    def committed(through: dict[int, int]) -> None:
        fn._unpublished = replace(plan(0, ["A@1"], None), consumed_through={"orders": through} if through else {})
        fn.publish()

    def on_file() -> dict[str, object]:
        return json.loads(file.read_text())["topics"]["orders"]  # type: ignore[no-any-return]

    committed({0: 3})
    table = str(DeltaTable(messages).metadata().id)
    assert on_file() == {"table": table, "queues": 4, "tags": ["a", "b"], "through": {"0": 3}}
    clock[0] += 1
    committed({0: 3})  # unchanged: not written again
    committed({})  # nothing vouched for: the file stays
    assert on_file()["through"] == {"0": 3} and len(writes) == 1
    clock[0] += 3600
    fn.publish()  # an hour on, no batch since (an idle instance; the heartbeat thread calls it): written again
    assert len(writes) == 2
    fn.publish()
    assert len(writes) == 2
    committed({0: 5})
    assert on_file()["through"] == {"0": 5} and len(writes) == 3


def test_a_new_checkpoint_starts_after_the_lowest_offset_of_every_queue_or_at_the_first_row(tmp_path: Path) -> None:
    """``group_starts``: a table whose every queue (of every topic read from it) has a published offset is
    started after the lowest; never past the latest version; not when one queue has none or one past
    the latest version, when the log no longer holds that commit, or when the offsets are another table's."""


    table = table_of_commits(str(tmp_path / "t"), 6)  # versions 1-6
    member = Membership(str(tmp_path), "G", "A@1")
    fn = batch_function(
        tmp_path,
        membership=member,
        queue_counts={"orders": 2, "audit": 1},
        sources={"orders": table, "audit": table},
    )
    table_id = str(DeltaTable(table).metadata().id)
    other = Membership(str(tmp_path), "G", "B@1")

    def published(orders: dict[int, int], audit: dict[int, int], table_id: str = table_id) -> dict[str, int]:
        other.publish({"orders": TopicOffsets(table_id, 2, None, orders), "audit": TopicOffsets(table_id, 1, None, audit)})
        return fn.group_starts()

    assert published({0: 4, 1: 3}, {0: 5}) == {table: 4}
    assert published({0: 4}, {0: 5}) == {}  # orders 1: nobody vouches for it
    assert published({0: 4, 1: 3}, {}) == {}
    assert published({0: 6, 1: 6}, {0: 6}) == {table: 6}  # through the latest: from it, read again
    assert published({0: 40, 1: 30}, {0: 50}) == {}  # past the latest: commits nobody made, a forged file
    assert published({0: -1, 1: 3}, {0: 5}) == {}  # from version 0: the first row anyway
    assert published({0: 4, 1: 3}, {0: 5}, table_id="another") == {}
    DeltaTable(table).create_checkpoint()
    for version in range(5):
        (Path(table) / "_delta_log" / f"{version:020d}.json").unlink()
    assert published({0: 4, 1: 3}, {0: 5}) == {}  # starts at commit 4, gone from the log
    assert published({0: 4, 1: 5}, {0: 5}) == {table: 5}


def test_offsets_past_what_the_table_holds_are_not_credible_and_the_others_hold_through_the_plans_version() -> None:
    """``credible``: the plan read version 20; the offsets were read after, when the table was at 22. An
    offset of 25 vouches for commits nobody made (dropped: that queue is caught up whole); 21 was
    possible (a commit since): it holds through 20; a topic the plan does not read is left out."""
    from retry_engine.clients.rebalance import credible

    published = {"orders": {0: 25, 1: 21, 2: 7}, "audit": {0: 3}}
    assert credible(published, {"orders": 20}, {"orders": 22}) == {"orders": {1: 20, 2: 7}}
    # A stream offset past the table's version (a damaged offsets log) is held to the version.
    first = plan(0, ["A@1"], None, stream_through={"orders": 10**12, "%RETRY%G": 2})
    assert first.consumed_through["orders"] == {0: 20, 1: 20, 2: 20, 3: 20}


@pytest.mark.parametrize(
    ("key", "value"),
    [("catch_up_after", {"orders": True}), ("catch_up_after", {"orders": -2}), ("catch_up_after", {"orders": "7"}),
     ("consumed_through", {"orders": {"9": 3}}), ("consumed_through", {"orders": {"x": 3}}),
     ("consumed_through", {"orders": {"0": 2**63}}), ("consumed_through", {"orders": {"0": 1.5}}),
     ("consumed_through", {"orders": [3]}), ("consumed_through", {"nope": {"0": 3}}),
     ("streamed", {"orders": True}), ("streamed", [3]), ("tags", {"orders": "A"})],
)
def test_a_damaged_record_is_planned_anew_never_vouched_for(tmp_path: Path, key: str, value: object) -> None:
    """A recorded assignment whose offsets are no versions of its queues is no record: its batch is planned
    anew (and the next one, without it, vouches for nothing it cannot know)."""

    fn = batch_function(tmp_path)
    record = plan(0, ["A@1"], None, stream_through={"orders": 3}).to_json()
    fn._save(Assignment.from_json(record))
    assert fn._load(0) is not None
    (tmp_path / "rebalance" / "0.json").write_text(json.dumps({**record, key: value}))
    assert fn._load(0) is None


def test_a_queue_goes_on_from_its_record_only_under_the_same_tags() -> None:
    """A restart with tags A || B on a checkpoint that consumed tag A: the tag-B rows before were never
    delivered, so the kept queues vouch for nothing (a record of an earlier release has no tags: same)."""
    first = plan(0, ["A@1"], None, stream_through={"orders": 12}, tags={"orders": ("A",)})
    assert first.consumed_through["orders"] == {0: 12, 1: 12, 2: 12, 3: 12}
    same = plan(1, ["A@1"], first, stream_through={"orders": 14}, tags={"orders": ("A",)})
    assert same.consumed_through["orders"] == {0: 14, 1: 14, 2: 14, 3: 14}
    for other in (("A", "B"), None):
        assert "orders" not in plan(1, ["A@1"], first, stream_through={"orders": 14}, tags={"orders": other}).consumed_through
    older = Assignment.from_json({k: v for k, v in first.to_json().items() if k != "tags"})
    assert "orders" not in plan(1, ["A@1"], older, stream_through={"orders": 14}, tags={"orders": ("A",)}).consumed_through


def test_a_stream_from_the_latest_rows_vouches_for_nothing_even_without_its_start_record(tmp_path: Path) -> None:
    """A new ``consume_from="latest"`` checkpoint whose start record could not be written (stream_start
    None) still never delivered the rows before it: no stream offset, so nothing vouched for."""

    fn = batch_function(tmp_path, vouches=False)
    assert fn._stream_through(0) is None
    assert replace(fn, vouches=True)._stream_through(0) == {}


def test_a_new_checkpoint_never_starts_where_a_stream_could_not_go_nor_the_retry_table_without_an_audit_to_ask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``group_starts``: not after a compaction whose removed files a stream from there would read (vacuum
    may have deleted them), not over a commit that removes data, not further back than it checks; and
    not %RETRY%G's table when it has no re-drive audit to ask whether a row was resent to this instance
    (such a row is in no offset; with the audit: the test of a resend that named it)."""

    from retry_engine.clients import consumer as consumer_module

    tables = {name: table_of_commits(str(tmp_path / name), 4) for name in ("messages", "retry")}  # versions 1-4
    member = Membership(str(tmp_path), "G", "A@1")
    fn = batch_function(
        tmp_path,
        membership=member,
        queue_counts={"orders": 1, "%RETRY%G": 1},
        sources={"orders": tables["messages"], "%RETRY%G": tables["retry"]},
    )
    ids = {name: str(DeltaTable(path).metadata().id) for name, path in tables.items()}
    Membership(str(tmp_path), "G", "B@1").publish({
        "orders": TopicOffsets(ids["messages"], 1, None, {0: 2}), "%RETRY%G": TopicOffsets(ids["retry"], 1, None, {0: 2}),
    })
    assert fn.group_starts() == {tables["messages"]: 3}  # the retry table: from its first row
    monkeypatch.setattr(consumer_module, "MAX_CATCH_UP_COMMITS", 0)
    assert fn.group_starts() == {}  # commits 3-4 are more than it checks
    monkeypatch.undo()
    DeltaTable(tables["messages"]).optimize.compact()  # version 5: commit 3's and 4's files are removed
    assert fn.group_starts() == {}
    append_arrow(tables["retry"], results_table([Result.of("r")]))
    DeltaTable(tables["retry"]).delete("msg_id = 'r'")
    retry_log = DeltaLog(storage.location(tables["retry"]))
    assert fn._streamable(retry_log, 3, 4)
    assert not fn._streamable(retry_log, 3, DeltaTable(tables["retry"]).version())
    # %RETRY%G's stream ignores deletes: it can start over a commit that only removes (a row retention's),
    # not over one that also adds (a delete that rewrote a file: the stream cannot follow it).
    DeltaTable(tables["retry"]).delete("msg_id = 'm0'")  # commit 1's file
    removed = DeltaTable(tables["retry"]).version()
    assert fn._streamable(retry_log, removed, removed, ignore_deletes=True)
    assert not fn._streamable(retry_log, removed, removed)
    append_arrow(tables["retry"], results_table([Result.of("s"), Result.of("t")]))
    DeltaTable(tables["retry"]).delete("msg_id = 's'")
    rewritten = DeltaTable(tables["retry"]).version()
    assert not fn._streamable(retry_log, rewritten, rewritten, ignore_deletes=True)


def test_the_streams_offsets_are_read_from_sparks_log_and_hostile_lines_vouch_for_nothing(tmp_path: Path) -> None:
    """``_stream_through`` reads ``offsets/<batch>`` of the consumer's checkpoint: each source's end offset,
    matched to a topic's table by its reservoir id; a line that is no offset, another table's offset, a
    missing file or one inside the first snapshot vouch for nothing (never an error)."""

    from retry_engine.core.resume import planned_ends
    from retry_engine.schemas import MESSAGES, RETRY

    messages, retry = str(tmp_path / "messages"), str(tmp_path / "retry")
    ensure_table(messages, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
    ensure_table(retry, RETRY.arrow_schema, partition_by=RETRY.partition_by)
    ids = {p: str(DeltaTable(p).metadata().id) for p in (messages, retry)}
    checkpoint = tmp_path / "ck"
    (checkpoint / "offsets").mkdir(parents=True)
    fn = batch_function(
        tmp_path,
        sources={"orders": messages, "audit": messages, "%RETRY%G": retry},
        checkpoint=str(checkpoint),
    )

    def offset(table: str, version: int, starting: bool = False) -> str:
        return json.dumps({"sourceVersion": 1, "reservoirId": table, "reservoirVersion": version, "index": -1,
                           "isStartingVersion": starting})

    def through(*lines: str) -> dict[str, int] | None:
        (checkpoint / "offsets" / "5").write_text("\n".join(["v1", '{"batchWatermarkMs":0}', *lines]))
        return fn._stream_through(5)

    assert through(offset(ids[messages], 12), offset(ids[retry], 4)) == {"orders": 11, "audit": 11, "%RETRY%G": 3}
    assert through(offset(ids[retry], 4), offset(ids[messages], 12)) == {"orders": 11, "audit": 11, "%RETRY%G": 3}
    assert through(offset(ids[messages], 7, starting=True), "-") == {"orders": -1, "audit": -1}
    hostile = ["not json", "[1, 2]", "{}", '{"reservoirVersion": "x"}', offset("another table", 9),
               json.dumps({"sourceVersion": 99, "reservoirId": ids[messages], "reservoirVersion": 3, "index": -1,
                           "isStartingVersion": False}), ""]
    assert through(*hostile) == {}
    assert through(offset(ids[messages], 12), *hostile) == {"orders": 11, "audit": 11}
    assert fn._stream_through(6) == {}  # no offsets file for that batch
    assert planned_ends(str(checkpoint), 5)[0] == {"sourceVersion": 1, "reservoirId": ids[messages], "reservoirVersion": 12,
                                                   "index": -1, "isStartingVersion": False}


def test_a_new_checkpoint_starts_the_retry_table_after_offsets_unless_a_resend_named_it(tmp_path: Path) -> None:
    """%RETRY%G's table starts after the group's offsets too, unless the re-drive audit holds a `dlq resend`
    of this group to this instance (its row is in no offset: only this instance's stream delivers it),
    or one whose selection cannot be read; a resend to another instance or of another group does not count."""
    import pyarrow as pa

    from retry_engine.schemas import REDRIVE_AUDIT

    retry, audit = table_of_commits(str(tmp_path / "retry"), 4), str(tmp_path / "audit")
    member = Membership(str(tmp_path), "G", "A@1")
    fn = batch_function(
        tmp_path,
        membership=member,
        queue_counts={"%RETRY%G": 1},
        sources={"%RETRY%G": retry},
        audit_path=audit,
    )
    Membership(str(tmp_path), "G", "B@1").publish({"%RETRY%G": TopicOffsets(str(DeltaTable(retry).metadata().id), 1, None, {0: 2})})
    assert fn.group_starts() == {retry: 3}  # no audit table: nothing was ever resent

    def audited(target: str, group: str, selection: str | None) -> dict[str, int]:
        row = {**dict.fromkeys(REDRIVE_AUDIT.names), "redrive_id": "x", "chunk": 0, "target": target,
               "reset_reconsume_times": False, "consumer_group": group, "dlq_msg_id": "d", "redriven_msg_id": "n",
               "topic": "%RETRY%G", "target_table": "retry", "redriven_at": NOW, "selection": selection}
        ensure_table(audit, REDRIVE_AUDIT.arrow_schema)
        append_arrow(audit, pa.Table.from_pylist([row], schema=REDRIVE_AUDIT.arrow_schema))
        return fn.group_starts()

    assert audited("retry", "G", '{"consumer_id": "A@1"}') == {retry: 3}  # a re-drive, not a resend
    assert audited("consumer", "G", '{"consumer_id": "B@1"}') == {retry: 3}
    assert audited("consumer", "H", '{"consumer_id": "A@1"}') == {retry: 3}
    assert audited("consumer", "G", '{"consumer_id": "A@1"}') == {}
    for hostile in ("not json", None, '{"consumer_id": 7}', "[]"):  # a selection it cannot read as another's
        shutil.rmtree(audit)
        assert audited("consumer", "G", hostile) == {}, hostile


def test_a_replay_whose_stream_offsets_changed_since_its_plan_vouches_for_nothing(tmp_path: Path) -> None:
    """A replayed batch reuses its recorded assignment; if Spark's offsets of the batch are no longer those
    it was planned on (an operator edited the checkpoint), what it vouches for may not be what the replay
    reads: it vouches for nothing (the review's fifth finding)."""

    from retry_engine.schemas import MESSAGES

    messages = str(tmp_path / "messages")
    ensure_table(messages, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
    table = str(DeltaTable(messages).metadata().id)
    checkpoint = tmp_path / "ck"
    (checkpoint / "offsets").mkdir(parents=True)
    fn = batch_function(
        tmp_path,
        membership=Membership(str(tmp_path), "G", "A@1"),
        queue_counts={"orders": 4},
        sources={"orders": messages},
        checkpoint=str(checkpoint),
    )

    def offsets(version: int) -> None:
        end = {"sourceVersion": 1, "reservoirId": table, "reservoirVersion": version, "index": -1, "isStartingVersion": False}
        (checkpoint / "offsets" / "0").write_text("\n".join(["v1", "{}", json.dumps(end)]))

    offsets(9)
    planned = plan_assignment(batch_id=0, members=["A@1"], me="A@1", queue_counts={"orders": 4}, versions={"orders": 9},
                              previous=None, stream_through=fn._stream_through(0))
    assert planned.consumed_through == {"orders": {0: 8, 1: 8, 2: 8, 3: 8}} and planned.streamed == {"orders": 8}
    fn._save(planned)
    assert fn._assignment(None, 0) == planned  # type: ignore[arg-type]  # a replay on the same offsets
    offsets(5)
    replayed = fn._assignment(None, 0)  # type: ignore[arg-type]
    assert replayed.consumed_through == {} and replayed.owned == planned.owned


def test_a_restart_with_another_subscription_still_catches_up_the_queues_it_gains(tmp_path: Path) -> None:
    """R9/B2 (found by a review): instance A restarted on its checkpoint with one more topic while B had left. The
    record of its last batch was for other queue counts, so it was dropped whole: A gained orders 2-3 with no
    catch-up, and the rows its stream had passed while B owned them were consumed by nobody. The topics whose
    queue count is unchanged go on from the record; the new topic is planned as for a new checkpoint."""
    before = plan(4, ["A@1", "B@1"], None, stream_through={"orders": 12, "%RETRY%G": 3})
    assert before.owned == {"orders": (0, 1), "%RETRY%G": (0,)}
    batch = batch_function(tmp_path, queue_counts={**COUNTS, "payments": 4})
    batch._save(before)
    previous = batch._previous(4)
    assert previous is not None and set(previous.queue_counts) == set(COUNTS) == set(previous.owned)
    assert batch._load(4) is None  # a replay of batch 4 itself is still planned anew
    after = plan_assignment(batch_id=5, members=["A@1"], me="A@1", queue_counts={**COUNTS, "payments": 4},
                            versions={"orders": 20, "%RETRY%G": 9, "payments": 7}, previous=previous,
                            restarted=True, stream_through={"orders": 20, "%RETRY%G": 9, "payments": 7})
    assert after.catch_up == {"orders": (2, 3), "%RETRY%G": (1,)}
    assert {(w.topic, w.queues) for w in after.windows} >= {("payments", (0, 1, 2, 3)), ("orders", (0, 1, 2, 3))}
    # Not restarted either: the new topic's queues get windows, not a catch-up.
    again = plan_assignment(batch_id=5, members=["A@1"], me="A@1", queue_counts={**COUNTS, "payments": 4},
                            versions={"orders": 20, "%RETRY%G": 9, "payments": 7}, previous=previous)
    assert "payments" not in again.catch_up and ("payments", (0, 1, 2, 3)) in {(w.topic, w.queues) for w in again.windows}
