"""``dlq resend`` without Spark (#13 part 5): which instance, what is written, audited, at most once.

That only the named instance delivers the row is tested on real Spark in
tests/integration/test_resend.py.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from retry_engine.clients import dlq
from retry_engine.clients.rebalance import Heartbeat, Membership
from retry_engine.core.names import PROP_REDRIVE_COUNT, PROP_RESEND_MSG_ID, PROP_RESEND_TO
from retry_engine.errors import SelectionError, SubscriptionError
from retry_engine.ops.audit import read_audit
from retry_engine.ops.cli import EXIT_ERROR, EXIT_OK, main
from retry_engine.ops.resend import resend, resolve_instance
from retry_engine.schemas import DLQ, RETRY
from tests.lakehouse import Lake

NOW = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


def beat(member: str, seconds_ago: float) -> Heartbeat:
    return Heartbeat(member, NOW - dt.timedelta(seconds=seconds_ago))


BEATS = [beat("host@1@DEFAULT", 5), beat("host@2@DEFAULT", 5), beat("host@2@other", 5), beat("gone@9@DEFAULT", 60)]


def test_an_instance_is_named_in_full_or_by_a_consumer_id_that_names_one_live_instance() -> None:
    """#13 part 5: consumer ids as the consume results and ``dlq show`` print them (``host@pid``)."""
    resolve = lambda cid: resolve_instance(BEATS, cid, group="billing", now=NOW, expiry_seconds=30)  # noqa: E731
    assert resolve("host@1@DEFAULT") == "host@1@DEFAULT"
    assert resolve("host@1") == "host@1@DEFAULT"
    assert resolve("host@2@other") == "host@2@other"
    with pytest.raises(SubscriptionError, match=r"RESEND_CONSUMER_AMBIGUOUS.*'host@2' names 2 live .*host@2@DEFAULT, host@2@other"):
        resolve("host@2")
    # Expired (60 s > 30 s), a prefix that is not a whole consumer id, unknown: not live.
    for gone in ("gone@9", "gone@9@DEFAULT", "host@", "host@12", "nobody"):
        with pytest.raises(SubscriptionError, match=r"RESEND_CONSUMER_NOT_LIVE.*live: host@1@DEFAULT, host@2@DEFAULT, host@2@other"):
            resolve(gone)
    with pytest.raises(SubscriptionError, match="RESEND_CONSUMER_NOT_LIVE.*live: none"):
        resolve_instance([], "host@1", group="billing", now=NOW, expiry_seconds=30)


@pytest.mark.parametrize("bad", ["", "a b", "../x", "é", "x\n", "a/b", "x" * 256])
def test_hostile_consumer_ids_are_refused(bad: str) -> None:
    with pytest.raises(SubscriptionError, match="INVALID_CONSUMER_ID"):
        resolve_instance(BEATS, bad, group="billing", now=NOW, expiry_seconds=30)


def dead_letter(msg_id: str, origin: str, **values: Any) -> dict[str, Any]:
    return {
        "msg_id": msg_id, "topic": "%DLQ%billing", "consumer_group": "billing", "origin_msg_id": origin,
        "retry_topic": "orders", "reconsume_times": 17, "delivery_key": f"{origin}:17", "body": b"payload",
        "properties": [("color", "red")], "reason_code": "MAX_RECONSUME_TIMES", "dead_lettered_at": NOW,
        "error_class": "com.acme.Timeout", "error_message": "read timed out", **values,
    }


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    """Two dead letters of billing (D1 of origin O1; D2 and D3 both of origin O2) and two live instances."""
    lake = Lake.make(tmp_path / "lake")
    rows = [dead_letter("D1", "O1"), dead_letter("D2", "O2"), dead_letter("D3", "O2")]
    write_deltalake(lake.path("dlq"), pa.Table.from_pylist(rows, schema=DLQ.arrow_schema), partition_by=["consumer_group"])
    for member in ("host@1@DEFAULT", "host@2@DEFAULT"):
        Membership(str(lake.root), "billing", member).beat()
    return lake


def test_resend_writes_one_pinned_retry_row_audited_and_moves_it_at_most_once(lake: Lake) -> None:
    """#13 part 5, B5, R9: a %RETRY%G row pinned to the instance; an audit row; the DLQ unchanged."""
    report = resend(lake.config, "O1", consumer_id="host@2", operator="alice", note="check the fix")
    assert (report.dlq_msg_id, report.consumer_group, report.instance) == ("D1", "billing", "host@2@DEFAULT")
    assert report.redrive.moved == 1
    (row,) = lake.rows("retry")
    props = dict(row["properties"])
    assert row["msg_id"] == report.resent_msg_id != "D1"
    assert row["topic"] == "%RETRY%billing" and row["consumer_group"] == "billing" and row["retry_topic"] == "orders"
    assert props[PROP_RESEND_TO] == "host@2@DEFAULT" and props[PROP_RESEND_MSG_ID] == row["msg_id"]
    assert props["color"] == "red" and props[PROP_REDRIVE_COUNT] == "1"  # R7: user properties kept
    assert row["reconsume_times"] == 0 and row["body"] == b"payload" and row["origin_msg_id"] == "O1"
    (audit,) = read_audit(lake.config).to_pylist()
    assert audit["target"] == "consumer" and audit["target_table"] == "retry" and audit["moved"]
    assert (audit["operator"], audit["note"], audit["dlq_msg_id"]) == ("alice", "check the fix", "D1")
    assert json.loads(audit["selection"])["consumer_id"] == "host@2@DEFAULT"
    assert len(lake.rows("dlq")) == 3  # R9: the DLQ is never changed

    again = resend(lake.config, "D1", consumer_id="host@2@DEFAULT")
    assert (again.redrive.moved, again.redrive.skipped, again.resent_msg_id) == (0, 1, None)
    elsewhere = resend(lake.config, "D1", consumer_id="host@1")  # another instance: moved already, skipped
    assert (elsewhere.redrive.moved, elsewhere.redrive.skipped) == (0, 1)
    assert len(lake.rows("retry")) == 1 and read_audit(lake.config).num_rows == 1

    forced = resend(lake.config, "D1", consumer_id="host@1", force=True)
    assert forced.redrive.moved == 1 and forced.resent_msg_id not in (None, row["msg_id"])
    assert {dict(r["properties"])[PROP_RESEND_TO] for r in lake.rows("retry")} == {"host@1@DEFAULT", "host@2@DEFAULT"}


def test_a_dead_letter_is_named_by_any_id_dlq_show_takes(lake: Lake) -> None:
    """``dlq show`` takes a retry's id (the id a consumer logged); so does ``dlq resend``: it names the
    dead letter of that retry's origin (it said MESSAGE_NOT_FOUND)."""
    retry = {**dict.fromkeys(RETRY.names), "msg_id": "R1-retry", "topic": "%RETRY%billing", "consumer_group": "billing",
             "origin_msg_id": "O1", "retry_topic": "orders", "reconsume_times": 3, "delay_level": 6,
             "delivery_key": "O1:3", "due_at": NOW, "delivered_at": NOW}
    write_deltalake(lake.path("retry"), pa.Table.from_pylist([retry], schema=RETRY.arrow_schema), partition_by=["consumer_group"])
    report = resend(lake.config, "R1-retry", consumer_id="host@1", dry_run=True)
    assert report.dlq_msg_id == "D1" and report.redrive.dry_run
    with pytest.raises(SelectionError, match="MESSAGE_NOT_FOUND.*'R9'"):
        resend(lake.config, "R9", consumer_id="host@1")
    # A retry of another group's delivery of the same origin leads to no dead letter of billing's (the
    # first version resent billing's D1 for it; the review of this fix).
    other = {**retry, "msg_id": "S1-retry", "consumer_group": "shipping", "topic": "%RETRY%shipping"}
    write_deltalake(lake.path("retry"), pa.Table.from_pylist([other], schema=RETRY.arrow_schema), mode="append")
    with pytest.raises(SelectionError, match="MESSAGE_NOT_FOUND.*'S1-retry'"):
        resend(lake.config, "S1-retry", consumer_id="host@1")


def test_dry_run_changes_nothing(lake: Lake) -> None:
    report = resend(lake.config, "D1", consumer_id="host@1", dry_run=True)
    assert report.redrive.dry_run and report.resent_msg_id is not None
    assert lake.rows("retry") == [] and lake.rows("redrive_audit") == []
    assert resend(lake.config, "D1", consumer_id="host@1").resent_msg_id == report.resent_msg_id


def test_unknown_ambiguous_or_not_live_targets_are_refused_before_anything_is_written(lake: Lake) -> None:
    with pytest.raises(SelectionError, match="MESSAGE_NOT_FOUND.*'nope'"):
        resend(lake.config, "nope", consumer_id="host@1")
    with pytest.raises(SelectionError, match=r"AMBIGUOUS_DEAD_LETTER.*'O2' names 2 dead letters \(D2, D3\)"):
        resend(lake.config, "O2", consumer_id="host@1")
    with pytest.raises(SubscriptionError, match="RESEND_CONSUMER_NOT_LIVE.*group 'billing'"):
        resend(lake.config, "D2", consumer_id="host@7")
    with pytest.raises(SelectionError, match="INVALID_IDS"):
        resend(lake.config, "", consumer_id="host@1")
    assert lake.rows("retry") == [] and lake.rows("redrive_audit") == []


def test_cli_resend_then_show(lake: Lake, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """#13 part 5: ``dlq resend MSG_ID --consumer-id ID``; ``dlq show`` names the instance."""
    config = tmp_path / "retry-engine.toml"
    config.write_text(f'[engine]\nlake = "{lake.root}"\n')
    base = ["dlq", "resend", "D1", "--config", str(config), "--consumer-id", "host@1"]
    assert main(base) == EXIT_OK
    out = capsys.readouterr().out
    assert "resent dead letter D1 to instance host@1@DEFAULT of group billing as message " in out
    assert main(base) == EXIT_OK
    assert "was already moved" in capsys.readouterr().out
    assert main(["dlq", "resend", "D2", "--config", str(config), "--consumer-id", "ghost"]) == EXIT_ERROR
    assert "RESEND_CONSUMER_NOT_LIVE" in capsys.readouterr().err
    history = dlq.history(lake.config, "D1")
    resent = history[history["event"] == "resend moved to one consumer"]
    assert resent["consumer_id"].tolist() == ["host@1@DEFAULT"]


def test_a_redrive_after_a_resend_skips_the_resent_dead_letter(lake: Lake) -> None:
    """#13 part 5, B5: a resend is a move; a later re-drive of the whole DLQ does not move it a second time."""
    from retry_engine.clients.dlq import Selection
    from retry_engine.ops.redrive import redrive

    resend(lake.config, "D1", consumer_id="host@1")
    report = redrive(lake.config, Selection(group="billing"), target="retry")
    assert (report.moved, report.skipped) == (2, 1)
    moved = [dict(r["properties"]).get(PROP_RESEND_TO) for r in lake.rows("retry")]
    assert sorted(moved, key=str) == sorted([None, None, "host@1@DEFAULT"], key=str)


def test_cli_resend_prints_a_dead_letters_id_escaped(lake: Lake, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Text from the DLQ reaches the operator's terminal escaped (found by a review: dlq list, show and status
    escaped theirs, resend printed the dead letter's id raw)."""
    write_deltalake(lake.path("dlq"), pa.Table.from_pylist([dead_letter("D\x1b[2J9", "O9")], schema=DLQ.arrow_schema),
                    mode="append", partition_by=["consumer_group"])
    config = tmp_path / "retry-engine.toml"
    config.write_text(f'[engine]\nlake = "{lake.root}"\n')
    assert main(["dlq", "resend", "O9", "--config", str(config), "--consumer-id", "host@1"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "\x1b" not in out and "resent dead letter D\\x1b[2J9 to instance host@1@DEFAULT" in out
