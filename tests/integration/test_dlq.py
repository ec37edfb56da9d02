"""Dead letters in notebooks, re-drive (B5) and ``retry-engine dlq`` on real Spark and Delta.

One engine run (module fixture) makes the dead letters; every test works on its
own copy of that lake, so re-drives do not leak between tests.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from deltalake import DeltaTable

from retry_engine.clients import dlq
from retry_engine.clients.dlq import Selection
from retry_engine.core import engine
from retry_engine.core.names import PROP_REDRIVE_COUNT
from retry_engine.delta import table_version
from retry_engine.errors import InvalidNameError, RedriveError, SelectionError
from retry_engine.ops import redrive
from retry_engine.ops.audit import read_audit
from retry_engine.ops.cli import EXIT_ERROR, EXIT_OK, main
from retry_engine.schemas import MESSAGES, REDRIVE_AUDIT, RETRY
from tests.builders import Result
from tests.lakehouse import Lake, wait_for
from tests.streaming import running

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

# What the engine is fed: (msg_id, group, topic, error_class, how it dies)
DLQ_REQUESTED = [
    ("B-T1", "billing", "orders", "com.acme.Timeout"),
    ("B-T2", "billing", "orders", "com.acme.Timeout"),
    ("B-J1", "billing", "orders", "com.acme.BadJson"),
    ("B-J2", "billing", "orders", "com.acme.BadJson"),
    ("S-1", "shipping", "orders", "java.lang.IllegalStateException"),
    ("S-2", "shipping", "orders", "java.lang.IllegalStateException"),
]
# Retries of these fail for the 17th time (reconsume_times 16 >= max 16).
EXHAUSTED = [("P-1", "billing", "payments"), ("P-2", "billing", "payments")]
LADDER = "H-1"  # fails once normally, then its retry asks for the DLQ: a short history (B6)
TOTAL = len(DLQ_REQUESTED) + len(EXHAUSTED) + 1


def _first_batch() -> list[Result]:
    batch = [
        Result.of(m, group=g, topic=t).failed(delay_level_when_next_consume=-1, error_class=e, error_message=f"{e} on {m}")
        for m, g, t, e in DLQ_REQUESTED
    ]
    batch += [
        Result.of(f"R16-{origin}", group=g, topic=f"%RETRY%{g}").failed(
            origin_msg_id=origin,
            retry_topic=t,
            reconsume_times=16,
            error_class="com.acme.Timeout",
            error_message="read timed out",
        )
        for origin, g, t in EXHAUSTED
    ]
    batch.append(Result.of(LADDER, group="billing", topic="orders").failed(error_class="com.acme.Flaky"))
    return batch


@pytest.fixture(scope="module")
def engine_lake(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake the engine filled with TOTAL dead letters, in two DLQ commits.

    Timeouts are generous: on a shared 2-core machine the first micro-batch alone took 53 s.
    """
    lake = Lake.make(tmp_path_factory.mktemp("dlq") / "lake")
    with running(engine.start(spark, lake.config)):
        lake.write_results(_first_batch())
        wait_for(lambda: len(lake.rows("dlq")) == TOTAL - 1, timeout=300, what="the first dead letters")
        (retry,) = wait_for(lambda: lake.rows("retry"), timeout=300, what=f"the retry of {LADDER}")
        fields = ("msg_id", "topic", "tags", "keys", "body", "flag", "properties", "born_timestamp", "born_host",
                  "store_timestamp", "queue_id", "reconsume_times", "origin_msg_id", "retry_topic", "attempts")
        again = Result.of(retry["msg_id"], group="billing").with_(
            **{k: retry[k] for k in fields},
            delay_level_when_next_consume=-1,
            error_class="com.acme.Flaky",
            error_message="still flaky",
            consumed_at=dt.datetime.now(dt.UTC),
        )
        lake.write_results([again])
        wait_for(lambda: len(lake.rows("dlq")) == TOTAL, timeout=300, what=f"the dead letter of {LADDER}")
        # The outcomes commit follows the DLQ's in the same micro-batch.
        wait_for(lambda: len(lake.rows("outcomes")) == TOTAL + 1, timeout=300, what="every outcome")
    return lake.root


@pytest.fixture
def lake(engine_lake: Path, tmp_path: Path) -> Lake:
    """This test's own copy of the engine's lake."""
    root = tmp_path / "lake"
    shutil.copytree(engine_lake, root, ignore=shutil.ignore_patterns("_checkpoints"))
    return Lake.make(root)


@pytest.fixture
def config_file(lake: Lake, tmp_path: Path) -> str:
    path = tmp_path / "retry-engine.toml"
    path.write_text(f'[engine]\nlake = "{lake.root}"\n')
    return str(path)


def _versions(lake: Lake) -> dict[str, int | None]:
    return {t: table_version(lake.path(t)) for t in ("dlq", "messages", "retry", "redrive_audit", "outcomes")}


def _dead_ids(lake: Lake, **selection: Any) -> list[str]:
    frame = dlq.dead_letters(lake.config, Selection(**selection) if selection else None)
    assert isinstance(frame, pd.DataFrame)
    return list(frame["msg_id"])


# -- notebook API --------------------------------------------------------------------


def test_dead_letters_have_decoded_bodies_and_error_context(lake: Lake) -> None:
    frame = dlq.dead_letters(lake.config)
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == list(dlq.LISTING_COLUMNS)
    assert len(frame) == TOTAL
    by_origin = frame.set_index("origin_msg_id")
    assert by_origin.loc["B-T1", "body_text"] == "body-B-T1"
    assert by_origin.loc["B-T1", "error_message"] == "com.acme.Timeout on B-T1"
    assert by_origin.loc["B-T1", "reason_code"] == "DLQ_REQUESTED"
    assert by_origin.loc["P-1", "reason_code"] == "MAX_RECONSUME_TIMES"
    assert by_origin.loc["P-1", "retry_topic"] == "payments"
    assert by_origin.loc["P-1", "reconsume_times"] == 17
    assert by_origin.loc[LADDER, "attempt_count"] == 2  # B4: both failures travel with it
    assert by_origin.loc[LADDER, "last_consumer_id"] == "c1@host"
    assert frame["redriven_by"].isna().all()
    assert list(frame["dead_lettered_at"]) == sorted(frame["dead_lettered_at"])


def test_selection_filters_by_group_topic_error_reason_time_and_ids(lake: Lake) -> None:
    frame = dlq.dead_letters(lake.config)
    assert isinstance(frame, pd.DataFrame)
    assert len(_dead_ids(lake, group="shipping")) == 2
    assert len(_dead_ids(lake, topic="payments")) == 2
    assert len(_dead_ids(lake, group="billing", error_pattern=r"Timeout|timed out")) == 4
    assert len(_dead_ids(lake, reason_code="MAX_RECONSUME_TIMES")) == 2
    last = frame["dead_lettered_at"].max().to_pydatetime()
    assert _dead_ids(lake, since=last) == list(frame[frame["dead_lettered_at"] == last]["msg_id"])
    assert len(_dead_ids(lake, until=last)) == (frame["dead_lettered_at"] < last).sum()
    dead_s1 = frame[frame["origin_msg_id"] == "S-1"]["msg_id"].item()
    assert _dead_ids(lake, ids=("S-1",)) == [dead_s1]  # by origin id
    assert _dead_ids(lake, ids=(dead_s1, "P-2")) == list(frame[frame["origin_msg_id"].isin(["S-1", "P-2"])]["msg_id"])


def test_filters_that_select_nothing(lake: Lake, config_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = _versions(lake)
    assert _dead_ids(lake, group="nobody") == []
    assert _dead_ids(lake, group="billing", error_pattern="no such error") == []
    assert dlq.summary(lake.config, Selection(topic="nothing")).empty  # type: ignore[union-attr]
    report = redrive.redrive(lake.config, Selection(group="nobody"), target="topic")
    assert (report.matched, report.moved, report.remaining) == (0, 0, 0)
    assert _versions(lake) == before  # not even an empty commit or a new table
    assert main(["dlq", "list", "--config", config_file, "--group", "nobody"]) == EXIT_OK
    assert "no dead letters match" in capsys.readouterr().err
    assert main(["dlq", "redrive", "--config", config_file, "--group", "nobody", "--to", "retry"]) == EXIT_OK
    assert "nothing to re-drive" in capsys.readouterr().out


def test_spark_dead_letters_and_summary_match_pandas(spark: Any, lake: Lake) -> None:
    selection = Selection(group="billing", error_pattern="Timeout")
    local = dlq.dead_letters(lake.config, selection)
    distributed = dlq.dead_letters(lake.config, selection, spark=spark)
    assert isinstance(local, pd.DataFrame) and not isinstance(distributed, pd.DataFrame)
    assert distributed.columns == list(dlq.LISTING_COLUMNS)
    rows = distributed.collect()
    assert [r["msg_id"] for r in rows] == list(local["msg_id"])
    assert [r["body_text"] for r in rows] == list(local["body_text"])
    assert [r["attempt_count"] for r in rows] == list(local["attempt_count"])
    by = ("group", "topic", "reason_code")
    local_summary = dlq.summary(lake.config, by=by)
    spark_summary = dlq.summary(lake.config, by=by, spark=spark)
    assert isinstance(local_summary, pd.DataFrame)
    got = {(r["consumer_group"], r["retry_topic"], r["reason_code"]): r["dead_letters"] for r in spark_summary.collect()}
    want = {(g, t, c): n for g, t, c, n in local_summary[["consumer_group", "retry_topic", "reason_code", "dead_letters"]].itertuples(index=False)}
    assert got == want == {
        ("billing", "orders", "DLQ_REQUESTED"): 5,
        ("billing", "payments", "MAX_RECONSUME_TIMES"): 2,
        ("shipping", "orders", "DLQ_REQUESTED"): 2,
    }
    # The day is the UTC date in a session of any time zone (it was the session's: a notebook at +14
    # or -12 counted every dead letter of the day's one side on the next or the last day).
    local_days = dlq.summary(lake.config, by=("day",))
    assert isinstance(local_days, pd.DataFrame)
    want_days = dict(zip(local_days["day"], local_days["dead_letters"], strict=True))
    zone = spark.conf.get("spark.sql.session.timeZone")
    try:
        for far in ("Pacific/Kiritimati", "Etc/GMT+12"):
            spark.conf.set("spark.sql.session.timeZone", far)
            assert {r["day"]: r["dead_letters"] for r in dlq.summary(lake.config, by=("day",), spark=spark).collect()} == want_days
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def test_summary_by_error_class_and_day(lake: Lake) -> None:
    frame = dlq.summary(lake.config, by=("error_class", "day"))
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == ["error_class", "day", "dead_letters", "redriven", "first_at", "last_at"]
    counts = dict(zip(frame["error_class"], frame["dead_letters"], strict=True))
    assert counts == {"com.acme.Timeout": 4, "com.acme.BadJson": 2, "java.lang.IllegalStateException": 2, "com.acme.Flaky": 1}
    assert list(frame["dead_letters"]) == sorted(frame["dead_letters"], reverse=True)
    listing = dlq.dead_letters(lake.config)
    assert isinstance(listing, pd.DataFrame)
    assert set(frame["day"]) == set(listing["dead_lettered_at"].dt.date)
    with pytest.raises(SelectionError, match=r"INVALID_SUMMARY.*'colour'.*group, topic"):
        dlq.summary(lake.config, by=("colour",))  # type: ignore[arg-type]


def test_history_of_one_message_b6(lake: Lake) -> None:
    """B6, #13 part 6: the consumer's results are in the history, each with its own error."""
    frame = dlq.history(lake.config, LADDER)
    assert list(frame.columns) == list(dlq.HISTORY_COLUMNS)
    assert list(frame["event"]) == [
        "consumed: RECONSUME_LATER",
        "decided: retry",
        "retry delivered",
        "consumed: RECONSUME_LATER",
        "decided: dead_letter",
        "dead-lettered",
    ]
    assert list(frame["reconsume_times"]) == [0, 0, 1, 1, 1, 2]
    # The two failures' errors as the consumer reported them (see _first_batch and engine_lake), on their own rows.
    errors = [(e, m) if isinstance(e, str) else None for e, m in zip(frame["error_class"], frame["error_message"], strict=True)]
    assert errors == [("com.acme.Flaky", "boom"), None, None, ("com.acme.Flaky", "still flaky"), None, None]
    assert [c if isinstance(c, str) else None for c in frame["consumer_id"]] == ["c1@host", None, None, "c1@host", None, None]
    assert list(frame["at"]) == sorted(frame["at"])
    # Any id of the message finds the same history.
    dead_id = frame["msg_id"].iloc[-1]
    assert dlq.history(lake.config, dead_id)["event"].tolist() == frame["event"].tolist()
    with pytest.raises(SelectionError, match="INVALID_IDS"):
        dlq.history(lake.config, "")


def test_time_travel_to_an_earlier_dlq_version(lake: Lake) -> None:
    history = dlq.versions(lake.config)
    latest = int(history["version"].max())
    assert latest >= 1
    older = dlq.dead_letters(lake.config, version=latest - 1)
    assert isinstance(older, pd.DataFrame)
    assert len(older) == TOTAL - 1 and LADDER not in set(older["origin_msg_id"])
    # Between the two commits: delta-rs dates a version by its log file, a little after commitInfo's time.
    stamps = history.set_index("version")["timestamp"]
    when = (stamps[latest - 1] + (stamps[latest] - stamps[latest - 1]) / 2).to_pydatetime()
    as_of = dlq.dead_letters(lake.config, as_of=when)
    assert isinstance(as_of, pd.DataFrame)
    assert list(as_of["msg_id"]) == list(older["msg_id"])
    with pytest.raises(SelectionError, match=rf"INVALID_VERSION.*version {latest + 5} .* versions are 0\.\.{latest}"):
        dlq.dead_letters(lake.config, version=latest + 5)
    with pytest.raises(SelectionError, match="INVALID_VERSION.*did not exist at 2000-01-01"):
        dlq.dead_letters(lake.config, as_of=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))


# -- re-drive --------------------------------------------------------------------------


def test_dry_run_changes_nothing(lake: Lake) -> None:
    before = _versions(lake)
    report = redrive.redrive(lake.config, Selection(group="billing"), target="topic", dry_run=True, chunk_size=3)
    assert _versions(lake) == before
    assert report.dry_run and report.moved == 0 and report.matched == 7
    assert sorted(report.plan["dlq_msg_id"]) == sorted(_dead_ids(lake, group="billing"))
    assert list(report.plan["chunk"]) == [0, 0, 0, 1, 1, 1, 2]
    # The dry run names the same messages a real run then moves.
    real = redrive.redrive(lake.config, Selection(group="billing"), target="topic", chunk_size=3)
    assert list(real.plan["redriven_msg_id"]) == list(report.plan["redriven_msg_id"])


def test_redrive_to_original_topic_marks_and_audits(lake: Lake) -> None:
    selection = Selection(group="billing", error_pattern="Timeout")
    report = redrive.redrive(lake.config, selection, target="topic", operator="alice", note="timeouts fixed", chunk_size=2)
    assert (report.matched, report.moved, report.skipped, report.remaining) == (4, 4, 0, 0)
    dead = {r["msg_id"]: r for r in lake.rows("dlq")}
    messages = lake.rows("messages")
    assert len(messages) == 4 and len({m["msg_id"] for m in messages}) == 4
    for m in messages:
        props = dict(m["properties"])
        source = dead[props[dlq.PROP_REDRIVE_FROM]]
        assert props[dlq.PROP_REDRIVE_ID] == report.redrive_id and props[PROP_REDRIVE_COUNT] == "1"
        assert props["color"] == "red"  # user properties kept
        assert m["topic"] == source["retry_topic"] and m["origin_msg_id"] == source["origin_msg_id"]
        assert (m["body"], m["born_timestamp"], m["attempts"]) == (source["body"], source["born_timestamp"], source["attempts"])
        assert m["reconsume_times"] == 0
    assert DeltaTable(lake.path("messages")).metadata().partition_columns == ["topic"]
    assert DeltaTable(lake.path("messages")).schema().to_arrow().names == MESSAGES.names
    audit = read_audit(lake.config).to_pylist()
    assert {(a["operator"], a["note"], a["target"], a["moved"]) for a in audit} == {("alice", "timeouts fixed", "topic", True)}
    assert sorted(a["redriven_msg_id"] for a in audit) == sorted(m["msg_id"] for m in messages)
    assert json.loads(audit[0]["selection"]) == {"group": "billing", "error_pattern": "Timeout"}
    listing = dlq.dead_letters(lake.config)
    assert isinstance(listing, pd.DataFrame)
    assert Counter(listing["redriven_by"].fillna("-")) == {report.redrive_id: 4, "-": TOTAL - 4}
    # The same command again moves nothing: they are marked as re-driven.
    again = redrive.redrive(lake.config, selection, target="topic")
    assert (again.moved, again.skipped) == (0, 4)
    other = redrive.redrive(lake.config, Selection(group="billing"), target="topic")
    assert (other.matched, other.skipped, other.moved) == (7, 4, 3)
    assert len(lake.rows("messages")) == 7


def test_redrive_to_retry_path_keeps_or_resets_count(lake: Lake) -> None:
    kept = redrive.redrive(lake.config, Selection(group="shipping"), target="retry", reset_reconsume_times=False)
    reset = redrive.redrive(lake.config, Selection(topic="payments"), target="retry")
    assert (kept.moved, reset.moved) == (2, 2)
    new = {r["msg_id"]: r for r in lake.rows("retry")}
    dead = {r["msg_id"]: r for r in lake.rows("dlq")}
    for plan, count in ((kept.plan, None), (reset.plan, 0)):
        for p in plan.itertuples():
            row, source = new[p.redriven_msg_id], dead[p.dlq_msg_id]
            assert row["topic"] == f"%RETRY%{source['consumer_group']}" and row["consumer_group"] == source["consumer_group"]
            assert row["retry_topic"] == source["retry_topic"] and row["origin_msg_id"] == source["origin_msg_id"]
            want = source["reconsume_times"] if count is None else count
            assert row["reconsume_times"] == want and row["delivery_key"] == f"{source['origin_msg_id']}:{want}:r1"  # R14: not a key seen before
            assert row["error_class"] == source["error_class"]
            assert row["delivered_at"] >= source["dead_lettered_at"]
    assert DeltaTable(lake.path("retry")).schema().to_arrow().names == RETRY.names
    with pytest.raises(RedriveError, match="REDRIVE_CONFLICT.*target=retry"):
        redrive.redrive(lake.config, Selection(group="shipping"), target="topic", redrive_id=kept.redrive_id)


def test_redrive_interrupted_between_audit_and_move_then_rerun(lake: Lake) -> None:
    """Stop after chunk 1's audit commit, before its move; the re-run moves nothing twice."""

    class Crash(Exception):
        pass

    def crash_at_chunk_1(p: redrive.ChunkProgress) -> None:
        if p.chunk == 1 and p.phase == "planned":
            raise Crash

    selection = Selection(group="billing")
    with pytest.raises(Crash):
        redrive.redrive(lake.config, selection, target="topic", chunk_size=2, on_progress=crash_at_chunk_1)
    assert len(lake.rows("messages")) == 2
    audit = read_audit(lake.config)
    assert sorted(zip(audit.column("chunk").to_pylist(), audit.column("moved").to_pylist(), strict=True)) == [
        (0, True), (0, True), (1, False), (1, False)]
    planned_1 = sorted(a["redriven_msg_id"] for a in audit.to_pylist() if a["chunk"] == 1)

    # Another re-drive cannot take the half-moved dead letters.
    with pytest.raises(RedriveError, match=r"REDRIVE_UNFINISHED.*--resume rd-"):
        redrive.redrive(lake.config, selection, target="retry")

    report = redrive.redrive(lake.config, selection, target="topic", chunk_size=2)
    assert (report.resumed, report.moved, report.skipped) == (2, 7 - 2, 2)
    messages = lake.rows("messages")
    sources = Counter(dict(m["properties"])[dlq.PROP_REDRIVE_FROM] for m in messages)
    assert sorted(sources) == sorted(_dead_ids(lake, group="billing")) and set(sources.values()) == {1}
    assert planned_1 == sorted(m["msg_id"] for m in messages if dict(m["properties"])[dlq.PROP_REDRIVE_FROM]
                               in {a["dlq_msg_id"] for a in audit.to_pylist() if a["chunk"] == 1})
    assert read_audit(lake.config).column("moved").to_pylist() == [True] * 7


def test_max_chunks_stops_and_rerun_continues(lake: Lake) -> None:
    first = redrive.redrive(lake.config, Selection(group="billing"), target="retry", chunk_size=2, max_chunks=2)
    assert (first.moved, first.remaining, first.complete) == (4, 3, False)
    rest = redrive.redrive(lake.config, Selection(group="billing"), target="retry", chunk_size=2)
    assert (rest.moved, rest.skipped, rest.complete) == (3, 4, True)
    assert Counter(dict(r["properties"])[dlq.PROP_REDRIVE_FROM] for r in lake.rows("retry") if r["properties"]
                   and dlq.PROP_REDRIVE_FROM in dict(r["properties"])).most_common(1)[0][1] == 1


def test_force_redrives_again_with_new_ids(lake: Lake) -> None:
    first = redrive.redrive(lake.config, Selection(group="shipping"), target="topic")
    forced = redrive.redrive(lake.config, Selection(group="shipping"), target="topic", force=True)
    assert forced.redrive_id != first.redrive_id and (forced.moved, forced.skipped) == (2, 0)
    assert not set(forced.plan["redriven_msg_id"]) & set(first.plan["redriven_msg_id"])
    assert len(lake.rows("messages")) == 4


def test_resume_by_id_and_unknown_id(lake: Lake, config_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    class Stop(Exception):
        pass

    def stop(p: redrive.ChunkProgress) -> None:
        if p.phase == "planned" and p.chunk == 0:
            raise Stop

    with pytest.raises(Stop):
        redrive.redrive(lake.config, Selection(group="shipping"), target="retry", redrive_id="fix-42", on_progress=stop)
    assert table_version(lake.path("retry")) is not None and not any(
        dict(r["properties"] or []).get(dlq.PROP_REDRIVE_ID) == "fix-42" for r in lake.rows("retry"))
    dry = redrive.resume(lake.config, "fix-42", dry_run=True)
    assert (dry.resumed, dry.moved, dry.matched, list(dry.plan["chunk"])) == (2, 0, 0, [0, 0])
    assert main(["dlq", "redrive", "--config", config_file, "--resume", "fix-42", "--to", "topic"]) == 2
    assert "--resume takes no filters" in capsys.readouterr().err
    assert main(["dlq", "redrive", "--config", config_file, "--resume", "fix-42"]) == EXIT_OK
    assert "moved 2 (2 from an interrupted run)" in capsys.readouterr().out
    assert sum(dict(r["properties"] or []).get(dlq.PROP_REDRIVE_ID) == "fix-42" for r in lake.rows("retry")) == 2
    done = redrive.resume(lake.config, "fix-42")
    assert (done.resumed, done.moved) == (0, 0)
    with pytest.raises(RedriveError, match=r"REDRIVE_NOT_FOUND.*'nope'.*known: fix-42"):
        redrive.resume(lake.config, "nope")


# -- CLI ---------------------------------------------------------------------------------


def test_cli_list_show_stats(config_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "list", "--config", config_file, "--group", "billing", "--format", "json"]) == EXIT_OK
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert len(rows) == 7 and {r["consumer_group"] for r in rows} == {"billing"}
    assert {r["body_text"] for r in rows} >= {"body-B-T1", "body-B-J1"}

    assert main(["dlq", "list", "--config", config_file, "--limit", "2"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()) == 3 and f"2 of {TOTAL} dead letters shown" in err

    assert main(["dlq", "show", "--config", config_file, LADDER]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"history of origin message {LADDER} (6 rows)" in out and "dead-lettered" in out

    assert main(["dlq", "stats", "--config", config_file, "--by", "group,reason_code", "--format", "csv"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "consumer_group,reason_code,dead_letters,redriven,first_at,last_at"
    assert lines[1].startswith("billing,DLQ_REQUESTED,5,0,")


def test_cli_errors_and_exit_codes(config_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "list", "--config", config_file, "--error", "Time(out"]) == EXIT_ERROR
    assert "INVALID_ERROR_PATTERN" in capsys.readouterr().err
    assert main(["dlq", "list", "--config", config_file, "--group", "a/b"]) == EXIT_ERROR
    assert "INVALID_GROUP_NAME" in capsys.readouterr().err
    assert main(["dlq", "show", "--config", config_file, "no-such-id"]) == EXIT_ERROR
    assert "MESSAGE_NOT_FOUND" in capsys.readouterr().err
    assert main(["dlq", "redrive", "--config", config_file, "--group", "billing"]) == 2
    assert "--to topic" in capsys.readouterr().err
    assert main(["dlq", "redrive", "--config", config_file, "--to", "topic"]) == 2
    assert "or --all" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["dlq", "list", "--config", config_file, "--since", "yesterday"])
    assert usage.value.code == 2
    assert "not an ISO 8601 time" in capsys.readouterr().err
    with pytest.raises(InvalidNameError, match="INVALID_TOPIC_NAME"):
        Selection(topic="bad topic")


def test_cli_redrive_dry_run_then_run_with_progress(lake: Lake, config_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = _versions(lake)
    assert main(["dlq", "redrive", "--config", config_file, "--all", "--to", "retry", "--dry-run"]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"{TOTAL} matched" in out and f"would move {TOTAL}" in out and "nothing changed" in out
    assert _versions(lake) == before
    args = ["dlq", "redrive", "--config", config_file, "--all", "--to", "retry", "--chunk-size", "4", "--operator", "bob"]
    assert main(args) == EXIT_OK
    out, err = capsys.readouterr()
    assert f"moved {TOTAL}" in out
    assert [line.split(": ", 1)[1] for line in err.splitlines() if line.startswith("re-drive ")] == [
        "chunk 0 moved 4 (4/9, 44%)", "chunk 1 moved 4 (8/9, 88%)", "chunk 2 moved 1 (9/9, 100%)"]
    assert main(args) == EXIT_OK
    assert f"{TOTAL} already re-driven (skipped), moved 0" in capsys.readouterr().out


def test_cli_redrive_killed_midway_then_rerun(lake: Lake, config_file: str) -> None:
    """A real interruption: SIGKILL the CLI mid-re-drive, run it again, nothing moves twice.

    (Ctrl-C, exit 130 and the re-run hint: tests/unit/test_redrive_tasks.py.) At one message a second
    the kill after three chunks lands about six seconds before the end, not two as at three a second,
    which a loaded machine's polling could miss (#16 item 3)."""
    args = ["dlq", "redrive", "--config", config_file, "--all", "--to", "topic", "--chunk-size", "1", "--rate", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "retry_engine.ops.cli", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len(lake.rows("redrive_audit")) >= 3, timeout=120, what="three chunks audited")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    moved_before = len(lake.rows("messages"))
    assert 0 < moved_before < TOTAL
    assert main(args[:-2]) == EXIT_OK  # again, without the rate limit
    messages = lake.rows("messages")
    sources = Counter(dict(m["properties"])[dlq.PROP_REDRIVE_FROM] for m in messages)
    assert len(messages) == TOTAL and set(sources.values()) == {1}
    audit = read_audit(lake.config)
    assert audit.num_rows == TOTAL and all(audit.column("moved").to_pylist())
    assert audit.schema.remove(audit.schema.get_field_index("moved")).names == REDRIVE_AUDIT.names



def test_resolve_and_expire_on_the_engines_dlq_with_spark_listing(spark: Any, lake: Lake) -> None:
    """#13 part 5 item 2 (R9, B5): on a DLQ the engine wrote, resolved dead letters leave the Spark and
    pandas listings (unless asked for) and re-drives; purged ones leave the DLQ table at expire, and
    the table still reads the same through delta-rs, pyarrow datasets and Spark."""
    from retry_engine.ops import resolve

    timeouts = Selection(group="billing", error_pattern="Timeout")  # B-T1, B-T2 and the two exhausted payments
    resolved = resolve.resolve(lake.config, timeouts, reason="re-entered by hand", operator="alice")
    purged = resolve.resolve(lake.config, Selection(group="shipping"), reason="test orders", action="purge")
    assert (resolved.resolved, purged.resolved) == (4, 2)
    gone = set(resolved.rows["msg_id"]) | set(purged.rows["msg_id"])
    listing = dlq.dead_letters(lake.config, include_resolved=True)
    assert isinstance(listing, pd.DataFrame)
    left = [i for i in listing["msg_id"] if i not in gone]
    assert _dead_ids(lake) == left and len(left) == TOTAL - 6
    distributed = dlq.dead_letters(lake.config, spark=spark)
    assert [r["msg_id"] for r in distributed.collect()] == left  # type: ignore[union-attr]
    every = dlq.dead_letters(lake.config, spark=spark, include_resolved=True).collect()  # type: ignore[union-attr]
    marks = {r["msg_id"]: r["resolution"] for r in every}
    assert len(every) == TOTAL and {m for m, r in marks.items() if r} == gone
    assert all(marks[m].startswith("resolved by alice") for m in resolved.rows["msg_id"])
    assert redrive.redrive(lake.config, Selection(), target="retry", force=True).resolved == 6

    report = resolve.expire(lake.config)
    assert (report.removed, report.purged) == (2, 2)
    remaining = {r["msg_id"] for r in lake.rows("dlq")}
    assert len(remaining) == TOTAL - 2 and not remaining & set(purged.rows["msg_id"])
    after = dlq.dead_letters(lake.config, spark=spark, include_resolved=True).collect()  # type: ignore[union-attr]
    assert sorted(r["msg_id"] for r in after) == sorted(remaining)
    history = dlq.history(lake.config, "S-1")  # reads the rewritten partition through a pyarrow dataset filter
    assert "purged" in list(history["event"]) and "dead-lettered" not in list(history["event"])
