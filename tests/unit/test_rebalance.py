"""Queue allocation, heartbeats and per-batch assignments, without Spark (#12 item 19).

Expected allocations are worked out by hand from RocketMQ's
``AllocateMessageQueueAveragely``: with ``q`` queues and ``n`` sorted members,
``mod = q % n``; member ``i`` takes ``q // n + 1`` queues if ``i < mod``, else
``q // n`` (at least 1 while ``q <= n``); it starts at ``i * size`` if
``i < mod``, else ``i * size + mod``; a start past the end gives nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from retry_engine.clients.consumer import Consumer, spark_interval
from retry_engine.clients.rebalance import (
    Assignment,
    Membership,
    Window,
    allocate_averagely,
    plan_assignment,
    validate_member_id,
    window_bound,
)
from retry_engine.config import parse_config
from retry_engine.errors import SubscriptionError

T0 = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("queues", "members", "expected"),
    [
        # 8 queues, 3 members: mod 2 -> sizes 3, 3, 2; starts 0, 3, 2*2+2=6.
        (8, ["c0", "c1", "c2"], {"c0": [0, 1, 2], "c1": [3, 4, 5], "c2": [6, 7]}),
        # 10 queues, 4 members: mod 2 -> sizes 3, 3, 2, 2; starts 0, 3, 6, 8.
        (10, ["c0", "c1", "c2", "c3"], {"c0": [0, 1, 2], "c1": [3, 4, 5], "c2": [6, 7], "c3": [8, 9]}),
        # 4 queues, 2 members: mod 0 -> 2 each.
        (4, ["c0", "c1"], {"c0": [0, 1], "c1": [2, 3]}),
        # 2 queues, 3 members: q <= n -> size 1; c2 starts at 2 + 2 = 4, past the end: nothing.
        (2, ["c0", "c1", "c2"], {"c0": [0], "c1": [1], "c2": []}),
        # 1 queue (RocketMQ's default retryQueueNums), 2 members.
        (1, ["c0", "c1"], {"c0": [0], "c1": []}),
        # 5 queues, 5 members: one each.
        (5, ["c0", "c1", "c2", "c3", "c4"], {f"c{i}": [i] for i in range(5)}),
        # One member owns everything.
        (4, ["c0"], {"c0": [0, 1, 2, 3]}),
    ],
)
def test_average_allocation_matches_rocketmq(queues: int, members: list[str], expected: dict[str, list[int]]) -> None:
    """#12 item 19: the shares RocketMQ's AllocateMessageQueueAveragely gives, worked out by hand."""
    # Members arrive in any order (directory listing): the strategy sorts them.
    shuffled = list(reversed(members))
    assert {m: allocate_averagely(queues, shuffled, m) for m in members} == expected


def test_every_queue_goes_to_exactly_one_member() -> None:
    """#12 item 19: no queue twice, none left out, for every small case."""
    for queues in range(1, 13):
        for n in range(1, 9):
            members = [f"m{i}" for i in range(n)]
            shares = [allocate_averagely(queues, members, m) for m in members]
            flat = [q for share in shares for q in share]
            assert sorted(flat) == list(range(queues)), (queues, n)


def test_a_member_that_is_not_live_owns_nothing() -> None:
    assert allocate_averagely(4, ["a", "b"], "c") == []
    # Duplicated ids (two files naming one member) count once.
    assert allocate_averagely(4, ["a", "a", "b"], "a") == [0, 1]


@pytest.mark.parametrize("count", [0, -1, -(2**31), True, 2.0, "4", None])
def test_hostile_queue_counts_are_refused(count: object) -> None:
    with pytest.raises(SubscriptionError, match=r"\[INVALID_QUEUE_COUNT\] queue count"):
        allocate_averagely(count, ["a"], "a")  # type: ignore[arg-type]


def test_no_member_is_an_error() -> None:
    with pytest.raises(SubscriptionError, match=r"\[NO_LIVE_CONSUMER\]"):
        allocate_averagely(4, [], "a")


HOSTILE_IDS = ["", "a\n", "a\r\n", "\na", "a\x00", "a/b", "../a", "a\\b", "a b", "h\u00e9te", "\uff41", "x" * 256, None, 7]


@pytest.mark.parametrize("bad", HOSTILE_IDS)
def test_hostile_member_ids_are_refused(bad: object) -> None:
    with pytest.raises(SubscriptionError, match=r"\[INVALID_CONSUMER_ID\]"):
        validate_member_id(bad)


def test_ordinary_client_ids_pass() -> None:
    for ok in ("10.0.0.1@1234", "host-1.example.com@99@DEFAULT", "::1@7", "x" * 255):
        assert validate_member_id(ok) == ok


# -- heartbeats --------------------------------------------------------------------


def test_heartbeats_expire_and_a_graceful_close_leaves(tmp_path: Path) -> None:
    """#12 item 19: live = beat within the expiry (inclusive); leave() removes the instance at once."""
    a = Membership(str(tmp_path), "G", "A@1", expiry_seconds=30)
    b = Membership(str(tmp_path), "G", "B@1", expiry_seconds=30)
    other_group = Membership(str(tmp_path), "H", "C@1", expiry_seconds=30)
    a.beat(T0)
    b.beat(T0)
    other_group.beat(T0)
    assert a.live(T0 + dt.timedelta(seconds=30)) == ["A@1", "B@1"]
    assert a.live(T0 + dt.timedelta(seconds=31)) == ["A@1"]  # B expired; A counts itself
    b.beat(T0 + dt.timedelta(seconds=20))
    assert a.live(T0 + dt.timedelta(seconds=31)) == ["A@1", "B@1"]
    b.leave()
    assert a.live(T0) == ["A@1"]
    b.leave()  # twice is fine


def test_heartbeat_paths_never_contain_the_names(tmp_path: Path) -> None:
    """SPEC: a name never becomes a path; both folder and file are hashes."""
    m = Membership(str(tmp_path), "billing", "host@1@one")
    m.beat(T0)
    relative = str(m.file.relative_to(tmp_path))
    assert "billing" not in relative and "host" not in relative
    assert m.file.parent.parent == tmp_path / "_consumers"


def test_a_heartbeat_from_the_future_counts_and_bad_files_are_skipped(tmp_path: Path) -> None:
    a = Membership(str(tmp_path), "G", "A@1")
    Membership(str(tmp_path), "G", "B@1").beat(T0 + dt.timedelta(hours=1))
    folder = a.folder
    (folder / "garbage.json").write_text("{not json")
    (folder / "nozone.json").write_text(json.dumps({"group": "G", "member": "X@1", "heartbeat_at": "2026-11-23T12:00:00"}))
    (folder / "badid.json").write_text(json.dumps({"group": "G", "member": "X\n@1", "heartbeat_at": T0.isoformat()}))
    (folder / "wronggroup.json").write_text(json.dumps({"group": "H", "member": "Y@1", "heartbeat_at": T0.isoformat()}))
    (folder / "list.json").write_text("[1, 2]")
    (folder / "deep.json").write_text("[" * 100_000)  # deeper than the JSON parser recurses
    (folder / "notext.json").write_text(json.dumps({"group": "G", "member": "Z@1", "heartbeat_at": 5}))
    assert a.live(T0) == ["A@1", "B@1"]


def test_the_files_of_instances_dead_for_long_are_deleted_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#14 (months on a lake): an instance killed without leaving kept its heartbeat file for good, and
    every batch of every instance listed and read it (a GET each on S3), one more per crash. `live`
    deletes a heartbeat file a day (or 100 expiries) old, the one it read (a file whose name is not
    its member's too), unless it changed since (the instance came back); live, recent, unreadable and
    this instance's own files stay."""
    now = T0 + dt.timedelta(days=10)
    a = Membership(str(tmp_path), "G", "A@1", expiry_seconds=30)
    a.beat(now - dt.timedelta(days=3))  # its own, however old: it is running
    Membership(str(tmp_path), "G", "B@1").beat(now - dt.timedelta(days=2))
    Membership(str(tmp_path), "G", "C@1").beat(now - dt.timedelta(hours=23))
    Membership(str(tmp_path), "G", "D@1").beat(now)
    (a.folder / "renamed.json").write_text(
        json.dumps({"group": "G", "member": "D@1", "heartbeat_at": (now - dt.timedelta(days=5)).isoformat()}))
    (a.folder / "garbage.json").write_text("{not json")
    before = {p.name for p in a.folder.iterdir()}

    assert a.live(now) == ["A@1", "D@1"]
    gone = before - {p.name for p in a.folder.iterdir()}
    assert gone == {Membership(str(tmp_path), "G", "B@1").file.name, "renamed.json"}
    assert Membership(str(tmp_path), "G", "D@1").file.exists()  # the live D's own file
    assert {b.member for b in a.heartbeats()} == {"A@1", "C@1", "D@1"}
    # With an hour's expiry, the horizon is 100 hours: two days dead is kept.
    slow, dead = (Membership(str(tmp_path), "H", m, expiry_seconds=3600) for m in ("E@1", "F@1"))
    dead.beat(now - dt.timedelta(days=2))
    assert slow.live(now) == ["E@1"] and dead.file.exists()
    assert slow.live(now + dt.timedelta(hours=53)) == ["E@1"] and not dead.file.exists()

    # An instance that beats again between the read and the delete keeps its file.
    stale = Membership(str(tmp_path), "G", "G@1")
    stale.beat(now - dt.timedelta(days=2))
    monkeypatch.setattr(Membership, "_read", lambda self, path, sub="": "rewritten")
    assert a.live(now) == ["A@1", "D@1"] and stale.file.exists()


@pytest.mark.parametrize("expiry", [0, -1, float("inf"), float("nan"), True, "30"])
def test_hostile_expiry_is_refused(tmp_path: Path, expiry: object) -> None:
    with pytest.raises(SubscriptionError, match=r"\[INVALID_OPTION\] heartbeat expiry"):
        Membership(str(tmp_path), "G", "A@1", expiry_seconds=expiry)  # type: ignore[arg-type]


# -- per-batch assignments -------------------------------------------------------------


def test_a_new_checkpoint_opens_windows_on_every_owned_queue_and_catches_nothing_up() -> None:
    """#12 item 19: a joining instance reads from the start; rows the group consumed are skipped."""
    plan = plan_assignment(batch_id=0, members=["A@1", "B@1"], me="B@1", queue_counts={"orders": 4, "%RETRY%G": 1},
                           versions={"orders": 7, "%RETRY%G": 3}, previous=None)
    assert plan.owned == {"%RETRY%G": (), "orders": (2, 3)}
    assert plan.catch_up == {} and plan.catch_up_versions == {}
    assert plan.windows == (Window("orders", (2, 3), 7),)


def test_gained_queues_are_caught_up_and_windowed_and_kept_ones_are_not() -> None:
    """#12 item 19: when B leaves, A gains queues 2-3 of orders and queue 1 of %RETRY%G."""
    counts = {"orders": 4, "%RETRY%G": 2}
    before = plan_assignment(batch_id=4, members=["A@1", "B@1"], me="A@1", queue_counts=counts,
                             versions={"orders": 5, "%RETRY%G": 2}, previous=None)
    carried = [Window("orders", (0,), 3)]
    after = plan_assignment(batch_id=5, members=["A@1"], me="A@1", queue_counts=counts,
                            versions={"orders": 9, "%RETRY%G": 4}, previous=before, carried_windows=carried)
    assert after.owned == {"%RETRY%G": (0, 1), "orders": (0, 1, 2, 3)}
    assert after.catch_up == {"%RETRY%G": (1,), "orders": (2, 3)}
    assert after.catch_up_versions == {"%RETRY%G": 4, "orders": 9}
    assert after.windows == (Window("orders", (0,), 3), Window("%RETRY%G", (1,), 4), Window("orders", (2, 3), 9))
    assert Assignment.from_json(json.loads(json.dumps(after.to_json()))) == after  # the checkpoint record
    steady = plan_assignment(batch_id=6, members=["A@1"], me="A@1", queue_counts=counts,
                             versions={"orders": 10, "%RETRY%G": 4}, previous=after)
    assert steady.catch_up == {} and steady.windows == ()


def test_window_bound_orders_like_stream_positions() -> None:
    """Snapshot rows ('s...') are always inside; commit rows up to the version are inside."""
    bound = window_bound(7)
    assert f"s{99:020d}/000000/0000000001" < bound
    assert f"v{7:020d}/000003/0000000009" < bound
    assert not f"v{8:020d}/000000/0000000000" < bound


# -- the consumer's new options ----------------------------------------------------------


def consumer(tmp_path: Path, **options: object) -> Consumer:
    config = parse_config({"engine": {"lake": str(tmp_path)}})
    return Consumer(None, config, **{"group": "G", **options})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("option", "value", "match"),
    [
        ("consumer_id", "a\nb", r"\[INVALID_CONSUMER_ID\] consumer_id 'a\\nb'"),
        ("consumer_id", "../etc", r"\[INVALID_CONSUMER_ID\]"),
        ("consumer_id", "", r"\[INVALID_CONSUMER_ID\]"),
        ("instance_name", "one/two", r"\[INVALID_CONSUMER_ID\] instance_name"),
        ("instance_name", "one\r\n", r"\[INVALID_CONSUMER_ID\] instance_name"),
        ("consumer_id", "x" * 250, r"\[INVALID_CONSUMER_ID\] consumer_id@instance_name"),
        ("queue_nums", 0, r"\[INVALID_OPTION\] queue_nums 0 must be an int in 1..1024"),
        ("queue_nums", -4, r"\[INVALID_OPTION\] queue_nums -4"),
        ("queue_nums", 1025, r"\[INVALID_OPTION\] queue_nums 1025"),
        ("queue_nums", True, r"\[INVALID_OPTION\] queue_nums True"),
        ("heartbeat_interval_seconds", 0, r"\[INVALID_OPTION\] heartbeat_interval_seconds 0"),
        ("heartbeat_interval_seconds", float("nan"), r"\[INVALID_OPTION\] heartbeat_interval_seconds nan"),
        ("heartbeat_expiry_seconds", 5, r"\[INVALID_OPTION\] heartbeat_expiry_seconds 5 must be more than"),
        ("clock_skew_seconds", -1, r"\[INVALID_OPTION\] clock_skew_seconds -1 must be a number >= 0"),
        ("clock_skew_seconds", float("nan"), r"\[INVALID_OPTION\] clock_skew_seconds nan"),
        ("clock_skew_seconds", float("inf"), r"\[INVALID_OPTION\] clock_skew_seconds inf"),
        ("clock_skew_seconds", True, r"\[INVALID_OPTION\] clock_skew_seconds True"),
        ("clock_skew_seconds", "3600", r"\[INVALID_OPTION\] clock_skew_seconds '3600'"),
        ("trigger_interval", 5, r"\[INVALID_OPTION\] trigger_interval 5 must be a duration"),
        ("trigger_interval", " ", r"\[INVALID_OPTION\] trigger_interval ' ' must be a duration"),
    ],
)
def test_hostile_consumer_options_are_clear_errors(tmp_path: Path, option: str, value: object, match: str) -> None:
    with pytest.raises(SubscriptionError, match=match):
        consumer(tmp_path, **{option: value})


def test_a_trigger_interval_is_taken_as_the_engines_config_writes_it_or_as_spark_does() -> None:
    """``Consumer(trigger_interval="500ms")`` (the engine's own form) failed at start with Spark's
    INVALID_INTERVAL_FORMAT."""
    assert spark_interval("500ms") == "500 milliseconds" and spark_interval("2m") == "120000 milliseconds"
    assert spark_interval("1 second") == "1 second"


def test_a_clock_skew_of_zero_or_a_year_is_taken(tmp_path: Path) -> None:
    assert consumer(tmp_path, clock_skew_seconds=0).clock_skew_seconds == 0
    assert consumer(tmp_path, clock_skew_seconds=365 * 86400.0).clock_skew_seconds == 365 * 86400.0


def test_consumer_heartbeat_and_shutdown(tmp_path: Path) -> None:
    """#12 item 19: heartbeat() joins the group, shutdown() leaves it; BROADCASTING never joins."""
    a = consumer(tmp_path, consumer_id="A", instance_name="one")
    b = consumer(tmp_path, consumer_id="B", instance_name="two")
    a.heartbeat()
    b.heartbeat()
    assert a.membership.live() == ["A@one", "B@two"]
    b.shutdown()
    assert a.membership.live() == ["A@one"]
    assert not b.membership.file.exists()
    broadcast = consumer(tmp_path, consumer_id="Z", instance_name="z", message_model="BROADCASTING")
    broadcast.heartbeat()
    assert a.membership.live() == ["A@one"]


def test_queue_counts_come_from_the_subscription_and_the_group() -> None:
    config = parse_config({"groups": {"G": {"retry_queue_nums": 3}, "N": {"retry_queue_nums": 0}}})
    c = Consumer(None, config, group="G", queue_nums=8).subscribe("orders").subscribe("audit")  # type: ignore[arg-type]
    assert c.queue_counts() == {"orders": 8, "audit": 8, "%RETRY%G": 3}
    # A group that does not retry (R10) can still hold re-driven retry rows: one queue, not zero.
    n = Consumer(None, config, group="N").subscribe("orders")  # type: ignore[arg-type]
    assert n.queue_counts() == {"orders": 4, "%RETRY%N": 1}
    broadcast = Consumer(None, config, group="G", message_model="BROADCASTING").subscribe("orders")  # type: ignore[arg-type]
    assert broadcast.queue_counts() == {"orders": 4}


def test_a_recorded_assignment_is_replayed_only_if_it_fits(tmp_path: Path) -> None:
    """Replay consumes the recorded share; a record for other queues, or an unreadable one, is planned anew."""
    from retry_engine.clients.consumer import _RebalancedBatch

    counts = {"orders": 4, "%RETRY%G": 1}
    fn = _RebalancedBatch(
        spark=None, group="G", spec=None, writer=None, membership=None, queue_counts=counts,  # type: ignore[arg-type]
        sources={}, topic_filter=None, records=str(tmp_path / "rebalance"), results_path="",  # type: ignore[arg-type]
    )
    plan = plan_assignment(batch_id=3, members=["A@1", "B@1"], me="A@1", queue_counts=counts,
                           versions={"orders": 1, "%RETRY%G": 1}, previous=None)
    fn._save(plan)
    assert fn._load(3) == plan and fn._load(2) is None
    fn.queue_counts = {"orders": 4, "audit": 4, "%RETRY%G": 1}  # subscribed to one more topic since
    assert fn._load(3) is None
    fn.queue_counts = counts
    (tmp_path / "rebalance" / "3.json").write_text('{"batch_id": 3')
    assert fn._load(3) is None
    # Hostile records (a restored checkpoint): queues not among the topic's, counts that are no counts,
    # numbers past any integer, nesting deeper than the parser goes: planned anew, never replayed.
    good = plan.to_json()
    for bad in (
        {**good, "owned": {"orders": [-1]}}, {**good, "owned": {"orders": [4]}}, {**good, "owned": {"orders": [True]}},
        {**good, "catch_up": {"orders": [1.5]}}, {**good, "queue_counts": {"orders": 0, "%RETRY%G": 1}},
        {**good, "queue_counts": {"orders": "4", "%RETRY%G": 1}},
    ):
        (tmp_path / "rebalance" / "3.json").write_text(json.dumps(bad))
        assert fn._load(3) is None, bad
    for text in (
        json.dumps({**good, "batch_id": 10**400}), json.dumps({**good, "batch_id": 4}),
        json.dumps(good).replace('"batch_id": 3', '"batch_id": 1e400'), "[" * 100_000,
    ):
        (tmp_path / "rebalance" / "3.json").write_text(text)
        assert fn._load(3) is None, text[:80]
    # Old records are pruned as batches go on.
    for batch_id in range(4, 40):
        fn._save(replace(plan, batch_id=batch_id))
    kept = sorted(int(p.stem) for p in (tmp_path / "rebalance").glob("*.json"))
    assert kept[0] >= 39 - 20 and kept[-1] == 39


def test_a_restarted_instance_windows_every_owned_queue() -> None:
    """#12 item 19: while it was down another instance may have consumed its queues: skip what the group has."""
    counts = {"orders": 4}
    before = plan_assignment(batch_id=7, members=["A@1", "B@1"], me="A@1", queue_counts=counts,
                             versions={"orders": 2}, previous=None)
    again = plan_assignment(batch_id=8, members=["A@1"], me="A@1", queue_counts=counts, versions={"orders": 9},
                            previous=before, restarted=True)
    assert again.catch_up == {"orders": (2, 3)}
    assert again.windows == (Window("orders", (0, 1, 2, 3), 9),)


# -- when a stream that consumes from the latest rows started (its catch-ups start there) ---------------

NOW = dt.datetime(2026, 11, 29, 5, 0, tzinfo=dt.UTC)


def test_a_new_latest_checkpoint_records_its_start_and_keeps_it(tmp_path: Path) -> None:
    from retry_engine.clients.consumer import stream_start

    checkpoint = str(tmp_path / "ck")
    assert stream_start(checkpoint, "latest", NOW) == NOW
    later = NOW + dt.timedelta(days=3)
    assert stream_start(checkpoint, "latest", later) == NOW  # a restart keeps the first start
    assert stream_start(checkpoint, "earliest", later) == NOW  # the stream resumes where it was, whatever it says now
    assert json.loads((tmp_path / "ck" / "rebalance" / "start.json").read_text())["consume_from"] == "latest"


def test_a_stream_from_the_first_rows_or_an_earlier_releases_checkpoint_has_no_start(tmp_path: Path) -> None:
    from retry_engine.clients.consumer import stream_start

    assert stream_start(str(tmp_path / "new"), "earliest", NOW) is None
    assert not (tmp_path / "new" / "rebalance").exists()
    (tmp_path / "old" / "offsets").mkdir(parents=True)
    (tmp_path / "old" / "offsets" / "0").write_text("v1")
    assert stream_start(str(tmp_path / "old"), "latest", NOW) is None  # when it started is not known
    assert not (tmp_path / "old" / "rebalance").exists()


@pytest.mark.parametrize(
    "text",
    [
        "not json", "[]", "null", '{"consume_from": "latest"}', '{"consume_from": "latest", "started_at": "yesterday"}',
        '{"consume_from": "latest", "started_at": 5}', '{"consume_from": "latest", "started_at": "2026-11-29T05:00:00"}',
        '{"consume_from": "earliest", "started_at": "2026-11-29T05:00:00+00:00"}', "\udcff",
    ],
)
def test_a_damaged_start_record_is_read_as_none_never_fatal(tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture) -> None:
    """Bad input (a restored checkpoint): rows of a gained queue may then be delivered again, none is lost."""
    from retry_engine.clients.consumer import stream_start

    record = tmp_path / "rebalance" / "start.json"
    record.parent.mkdir()
    record.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert stream_start(str(tmp_path), "latest", NOW) is None
    if "earliest" not in text:
        assert "unreadable stream start record" in caplog.text


def test_a_file_uri_checkpoint_keeps_its_start_beside_sparks_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `file:` checkpoint (as Spark users write them): the record is in that folder, not in a
    folder named `file:` under the working directory, so a restart from elsewhere finds it."""
    from retry_engine.clients.consumer import stream_start

    monkeypatch.chdir(tmp_path)
    assert stream_start(f"file://{tmp_path}/ck", "latest", NOW) == NOW
    assert (tmp_path / "ck" / "rebalance" / "start.json").is_file() and not (tmp_path / "file:").exists()
    assert stream_start(str(tmp_path / "ck"), "latest", NOW + dt.timedelta(hours=1)) == NOW
    (tmp_path / "old" / "offsets").mkdir(parents=True)
    (tmp_path / "old" / "offsets" / "3").write_text("v1")
    assert stream_start(f"file:{tmp_path}/old", "latest", NOW) is None
    from retry_engine.clients.consumer import records_folder

    assert records_folder(f"file://{tmp_path}/ck") == f"{tmp_path}/ck/rebalance"  # the assignments too
    assert records_folder("relative/ck") == os.path.abspath("relative/ck/rebalance")
