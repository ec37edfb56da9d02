"""DLQ selections, re-drive ids, the rate limiter and an empty lake, without Spark."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from retry_engine.clients import dlq
from retry_engine.clients.dlq import Selection
from retry_engine.config import parse_config
from retry_engine.errors import ConfigError, InvalidNameError, SelectionError
from retry_engine.ops.cli import EXIT_ERROR, EXIT_USAGE, main
from retry_engine.ops.redrive import RateLimiter, default_redrive_id, redrive, redriven_msg_id
from retry_engine.schemas import DLQ
from tests.dead_letters import dead_letter, dlq_lake

T0 = dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC)


def _dlq_rows() -> pa.Table:
    rows = [
        {"msg_id": "D1", "origin_msg_id": "O1", "consumer_group": "G", "retry_topic": "orders", "reason_code": "DLQ_REQUESTED",
         "error_class": "com.acme.Timeout", "error_message": "read timed out", "dead_lettered_at": T0},
        {"msg_id": "D2", "origin_msg_id": "O2", "consumer_group": "G", "retry_topic": "pay", "reason_code": "MAX_RECONSUME_TIMES",
         "error_class": None, "error_message": "bad json", "dead_lettered_at": T0 + dt.timedelta(hours=1)},
        {"msg_id": "D3", "origin_msg_id": "O3", "consumer_group": "H", "retry_topic": "orders", "reason_code": "NON_RETRYABLE",
         "error_class": None, "error_message": None, "dead_lettered_at": T0 + dt.timedelta(hours=2),
         "properties": [("REDRIVE_COUNT", "2")]},
    ]
    full = [{**{name: None for name in DLQ.names}, "topic": "%DLQ%G", "delivery_key": "k", **r} for r in rows]
    return pa.Table.from_pylist(full, schema=DLQ.arrow_schema)


def _picked(selection: Selection) -> list[str]:
    rows = _dlq_rows()
    return rows.filter(selection.mask(rows)).column("msg_id").to_pylist()


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (Selection(), ["D1", "D2", "D3"]),
        (Selection(group="G"), ["D1", "D2"]),
        (Selection(topic="orders"), ["D1", "D3"]),
        (Selection(error_pattern="(?i)timeout"), ["D1"]),
        (Selection(error_pattern="json"), ["D2"]),  # matches the message when the class is null
        (Selection(reason_code="NON_RETRYABLE"), ["D3"]),
        (Selection(since=T0 + dt.timedelta(minutes=30)), ["D2", "D3"]),
        (Selection(until=T0 + dt.timedelta(hours=1)), ["D1"]),  # until is exclusive
        (Selection(ids=("O3", "D1")), ["D1", "D3"]),  # dead letter ids or origin ids
        (Selection(group="G", topic="orders"), ["D1"]),
        (Selection(group="nobody"), []),
        (Selection(max_redrives=2), ["D1", "D2"]),  # D3 was re-driven twice already
        (Selection(max_redrives=3), ["D1", "D2", "D3"]),
    ],
)
def test_selection_mask(selection: Selection, expected: list[str]) -> None:
    assert _picked(selection) == expected


def test_naive_times_are_utc_and_describe_is_canonical() -> None:
    selection = Selection(topic="orders", since=dt.datetime(2026, 11, 22, 12), ids=["b", "a"])  # type: ignore[arg-type]
    assert selection.since == T0 and selection.ids == ("b", "a")
    assert json.loads(selection.describe()) == {"topic": "orders", "since": "2026-11-22T12:00:00+00:00", "ids": ["b", "a"]}
    assert Selection(group="G").describe() == '{"group": "G"}'


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"group": "a/b"}, InvalidNameError, r"INVALID_GROUP_NAME.*'a/b'.*%\|a-zA-Z0-9_-"),
        ({"topic": "x" * 200}, InvalidNameError, "INVALID_TOPIC_NAME.*200 characters; at most 127"),
        ({"error_pattern": "Time(out"}, SelectionError, r"INVALID_ERROR_PATTERN.*'Time\(out'"),
        ({"since": T0, "until": T0}, SelectionError, "INVALID_TIME_RANGE.*is not before"),
        ({"since": "yesterday"}, SelectionError, "INVALID_TIME_RANGE.*'yesterday'"),
        ({"ids": "D1"}, SelectionError, "INVALID_IDS.*not the string 'D1'"),
        ({"ids": ()}, SelectionError, "INVALID_IDS"),
        ({"ids": ("D1", "")}, SelectionError, "INVALID_IDS"),
        ({"max_redrives": 0}, SelectionError, "INVALID_MAX_REDRIVES.*got 0"),
    ],
)
def test_bad_selection_is_a_clear_error(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        Selection(**kwargs)  # type: ignore[arg-type]
    assert issubclass(error, ValueError)


def test_redrive_ids_are_deterministic() -> None:
    a = default_redrive_id(Selection(group="G"), target="topic", reset_reconsume_times=True)
    assert a == default_redrive_id(Selection(group="G"), target="topic", reset_reconsume_times=True)
    assert a != default_redrive_id(Selection(group="G"), target="retry", reset_reconsume_times=True)
    assert a != default_redrive_id(Selection(group="G"), target="topic", reset_reconsume_times=False)
    assert redriven_msg_id(a, "D1", 0) == redriven_msg_id(a, "D1", 0) != redriven_msg_id(a, "D1", 1)
    assert len(redriven_msg_id(a, "D1", 0)) == 32


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_rate_limiter_sleeps_to_keep_the_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(10, clock=clock, sleep=clock.sleep)
    assert limiter.after(5) == pytest.approx(0.5)  # 5 messages at 10/s take 0.5 s
    clock.now += 2.0  # a slow chunk: already behind, no sleep, but only 1 s of it is credited
    assert limiter.after(5) == 0.0
    assert limiter.after(30) == pytest.approx(2.5)  # 35 messages from t=1.5: at t=5.0
    assert clock.slept == [pytest.approx(0.5), pytest.approx(2.5)]
    unlimited = RateLimiter(None, clock=clock, sleep=clock.sleep)
    assert unlimited.after(1000) == 0.0
    with pytest.raises(ConfigError, match="INVALID_OPTION.*rate must be a positive.*got 0"):
        RateLimiter(0)


def test_rate_limiter_lets_no_burst_through_after_a_stall() -> None:
    """A 30 s stall (the store answered late): the chunks after it went out with no pause until 300
    messages had gone at once; now it credits at most a second."""
    clock = FakeClock()
    limiter = RateLimiter(10, clock=clock, sleep=clock.sleep)
    limiter.after(10)
    clock.now += 30.0
    start = clock.now
    waits = [limiter.after(10) for _ in range(10)]
    assert waits[0] == 0.0 and all(w == pytest.approx(1.0) for w in waits[1:])
    assert clock.now - start == pytest.approx(9.0)  # 100 messages after the stall: 10 s at 10/s, less 1 s credit


def test_an_empty_lake_reads_as_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before the engine dead-letters anything: empty frames, and nothing is created."""
    config = parse_config({"engine": {"lake": str(tmp_path)}})
    listing = dlq.dead_letters(config)
    assert isinstance(listing, pd.DataFrame) and listing.empty and list(listing.columns) == list(dlq.LISTING_COLUMNS)
    assert dlq.summary(config).empty  # type: ignore[union-attr]
    assert dlq.history(config, "M1").empty and dlq.versions(config).empty
    report = redrive(config, Selection(), target="retry")
    assert (report.matched, report.moved) == (0, 0)
    with pytest.raises(SelectionError, match="INVALID_VERSION.*no table"):
        dlq.dead_letters(config, version=0)
    assert list(tmp_path.iterdir()) == []
    # The command line, unlike the library, calls a folder without any engine table no lake
    # (#13 part 4: exit 2 saying where it looked, not an answer about an empty lake).
    conf = tmp_path.parent / "empty.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path}"\n')
    assert main(["dlq", "show", "--config", str(conf), "M1"]) == EXIT_USAGE
    assert f"[LAKE_NOT_FOUND] no lake at {tmp_path}: it holds no engine table" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["zoned", "text", "no zone"])
def test_the_console_reads_a_dlq_whose_time_another_writer_changed(tmp_path: Path, kind: str) -> None:
    """Bad input (a DLQ another writer rewrote with `dead_lettered_at` as text or without a zone): `dlq
    list` and a re-drive's plan failed with Arrow's or delta-rs's own error (a statistics bound of the
    other type, a comparison); the time is now read as consume results are (no zone: UTC) and the
    selection picks the same dead letters, bodies included, as on the engine's own DLQ."""
    rows = _dlq_rows()
    at = rows["dead_lettered_at"]
    if kind == "text":
        at = pa.array([t.isoformat() for t in at.to_pylist()], pa.string())
    elif kind == "no zone":
        at = at.cast(pa.timestamp("us"))
    rows = rows.set_column(rows.schema.get_field_index("dead_lettered_at"), "dead_lettered_at", at)
    rows = rows.set_column(rows.schema.get_field_index("body"), "body", pa.array([b"b1", b"b2", b"b3"], pa.binary()))
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "dlq"), rows, partition_by=["consumer_group"])
    config = parse_config({"engine": {"lake": str(tmp_path)}})
    selection = Selection(group="G", since=T0 + dt.timedelta(minutes=30))
    page, total = dlq.dead_letter_page(config, selection, limit=10, version=0)
    assert (page["msg_id"].tolist(), total) == (["D2"], 1)
    picked = dlq.read_dlq(config, Selection(since=T0 + dt.timedelta(minutes=30), until=T0 + dt.timedelta(hours=2)))
    assert picked["msg_id"].to_pylist() == ["D2"] and picked["dead_lettered_at"].type == DLQ["dead_lettered_at"].type
    named = dlq.dead_letters_named(config, picked.select(["msg_id", "consumer_group", "dead_lettered_at"]), version=0)
    assert named["body"].to_pylist() == [b"b2"]


def test_a_max_redrives_past_the_count_type_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input: `dlq list --max-redrives 99999999999999999999` ended in pyarrow's TypeError (no int64
    literal for it); a value past what the count is compared as (int) is now refused, naming it."""
    assert _picked(Selection(max_redrives=dlq.MAX_REDRIVES_LIMIT)) == ["D1", "D2", "D3"]
    with pytest.raises(SelectionError, match=rf"INVALID_MAX_REDRIVES.*1 to {dlq.MAX_REDRIVES_LIMIT}, got 2147483648"):
        Selection(max_redrives=2**31)
    dlq_lake(str(tmp_path / "lake"), [dead_letter(0)])
    conf = tmp_path / "c.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path / "lake"}"\n')
    assert main(["dlq", "list", "--max-redrives", "99999999999999999999", "--config", str(conf)]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err == (
        f"retry-engine: [INVALID_MAX_REDRIVES] max_redrives must be a whole number from 1 to {dlq.MAX_REDRIVES_LIMIT}, "
        "got 99999999999999999999\n"
    )


def test_a_summary_key_given_twice_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input: `dlq stats --by day,day` ended in pandas' "cannot insert day, already exists"; a repeated
    key is now refused, naming it."""
    config = dlq_lake(str(tmp_path / "lake"), [dead_letter(0)])
    with pytest.raises(SelectionError, match="INVALID_SUMMARY.*'group' twice"):
        dlq.summary(config, by=("group", "topic", "group"))
    conf = tmp_path / "c.toml"
    conf.write_text(f'[engine]\nlake = "{tmp_path / "lake"}"\n')
    assert main(["dlq", "stats", "--by", "day,day", "--config", str(conf)]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("retry-engine: [INVALID_SUMMARY] cannot summarise by 'day' twice;") and err.count("\n") == 1


def test_the_notebook_api_refuses_what_is_no_version_time_or_count_in_one_line(tmp_path: Path) -> None:
    """(found by a review) `version="0"`, 0.5 or True, `as_of` text before the table existed (the check ran for
    datetimes only: it read version 0), `limit=-1` (pandas' head(-1): all rows but the last), `chunk_size="5"` and
    `max_chunks=1.5` raised TypeError from deep inside, or answered wrongly. One coded error each."""
    config = dlq_lake(str(tmp_path / "lake"), [dead_letter(i) for i in range(3)])
    for version in ("0", 0.5, True):
        with pytest.raises(SelectionError, match=r"\[INVALID_VERSION\] version must be a whole number"):
            dlq.dead_letters(config, version=version)  # type: ignore[arg-type]
    with pytest.raises(SelectionError, match=r"\[INVALID_VERSION\] .*did not exist at 1999-01-01T00:00:00\+00:00"):
        dlq.summary(config, as_of="1999-01-01T00:00:00Z")
    with pytest.raises(SelectionError, match=r"\[INVALID_VERSION\] as_of must be a time"):
        dlq.dead_letters(config, as_of="yesterday")
    assert len(dlq.dead_letters(config, as_of=dt.datetime.now(dt.UTC).isoformat())) == 3
    with pytest.raises(SelectionError, match=r"\[INVALID_LIMIT\]"):
        dlq.dead_letter_page(config, limit=-1)
    for options in ({"chunk_size": "5"}, {"max_chunks": 1.5}, {"chunk_size": True}):
        with pytest.raises(ConfigError, match=r"\[INVALID_OPTION\] (chunk_size|max_chunks) must be a whole number"):
            redrive(config, Selection(group="billing"), target="retry", **options)  # type: ignore[arg-type]


def test_a_version_the_cleaned_log_no_longer_holds_is_named_as_such(tmp_path: Path) -> None:
    """(found by a review) Maintenance removes commits older than delta.logRetentionDuration: version 0 then raised
    delta-rs's TableNotFoundError ("No files in log segment"), and a time when the table existed was said to be
    before it existed. The versions still readable are named, and that the log before them was cleaned."""
    from deltalake import DeltaTable

    config = dlq_lake(str(tmp_path / "lake"), [dead_letter(0)])
    for i in range(1, 4):
        dlq_lake(str(tmp_path / "lake"), [dead_letter(i)])
    table = DeltaTable(config.table_path("dlq"))
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    DeltaTable(config.table_path("dlq")).create_checkpoint()
    DeltaTable(config.table_path("dlq")).cleanup_metadata()
    last = DeltaTable(config.table_path("dlq")).version()
    with pytest.raises(SelectionError, match=rf"version 0 of .* cannot be read; versions are {last}\.\.{last} \(the log before version {last}"):
        dlq.dead_letters(config, version=0)
    with pytest.raises(SelectionError, match=rf"cannot be read as of .*: the log before version {last} \(.*\) was cleaned"):
        dlq.dead_letters(config, as_of=dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert len(dlq.dead_letters(config, version=last)) == 4
    # (found by a review of the fix) A commit without commitInfo (another writer's) is not left out of the
    # versions: delta-rs's history() skips it, the log's listing does not.
    import json as _json

    bare = tmp_path / "bare"
    dlq_lake(str(bare), [dead_letter(0)])
    dlq_lake(str(bare), [dead_letter(1)])
    first = bare / "dlq" / "_delta_log" / ("0" * 20 + ".json")
    first.write_text("\n".join(line for line in first.read_text().splitlines() if "commitInfo" not in _json.loads(line)) + "\n")
    versions = [len(dlq.dead_letters(parse_config({"engine": {"lake": str(bare)}}), version=v)) for v in range(3)]
    assert versions == [0, 1, 2]  # version 0 (the table's creation, no commitInfo now) read, not refused


def test_a_resolution_without_a_time_is_listed(tmp_path: Path) -> None:
    """A resolve row another writer left without `redriven_at`: the listing raised TypeError formatting None."""
    from retry_engine.clients.dlq import _resolved

    audit = pa.table({"redrive_id": ["x"], "target": ["resolve"], "dlq_msg_id": ["a"], "operator": ["op"],
                      "redriven_at": pa.array([None], pa.timestamp("us", "UTC")), "note": ["n"]})
    assert _resolved(audit) == {"a": "resolved by op at -: n"}
