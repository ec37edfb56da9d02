"""``dlq.history`` on hand-written tables (B4, B6; #13 part 6): each row carries its own error,
and the consumer's own results are part of the history. No Spark: the tables are written with
delta-rs, as a consumer and the engine would have written them, following the seeds' rules.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from retry_engine.clients import dlq
from retry_engine.config import load_config
from retry_engine.ops.cli import EXIT_OK, main
from retry_engine.schemas import CONSUME_RESULTS, DLQ, MESSAGES, OUTCOMES, RETRY, Table
from tests.lakehouse import Lake

T0 = dt.datetime(2026, 11, 22, 12, 0, 0, tzinfo=dt.UTC)
ORIGIN = "H-1"
RETRY_ID = "H-1-retry-1"
DEAD_ID = "H-1-dead"


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def write(lake: Lake, table: Table, rows: list[dict[str, Any]]) -> None:
    write_deltalake(
        lake.path(table.name),
        pa.Table.from_pylist(rows, schema=table.arrow_schema),
        mode="append",
        partition_by=list(table.partition_by) or None,
    )


def result(msg_id: str, *, consumer: str | None, status: str | None, at_s: float | None, **values: Any) -> dict[str, Any]:
    return {
        "result_id": f"res-{msg_id}-{consumer}",
        "consumer_group": "billing",
        "consumer_id": consumer,
        "message_model": "CLUSTERING",
        "status": status,
        "delay_level_when_next_consume": 0,
        "max_reconsume_times": -1,
        "consumed_at": None if at_s is None else at(at_s),
        "msg_id": msg_id,
        "topic": "orders",
        "reconsume_times": 0,
        **values,
    }


@pytest.fixture
def lake(tmp_path: Path) -> Lake:
    """One message's life, as R1, R5, R6 and R7 make it.

    H-1 is delivered to c1, which fails it (RECONSUME_LATER, error Flaky "first").
    The engine decides a retry at level 3 (R5: 3 + reconsume_times 0), writes
    retry H-1-retry-1 (reconsume_times 1, R7) carrying that error as context
    (B4), releases it at its due time. c2 gets the retry and asks for the DLQ
    (delay level -1, R5) with error Flaky "second": dead letter H-1-dead
    (reconsume_times 2), decided and dead-lettered in the same micro-batch.
    A result of another message, and a hostile result of H-1 without status,
    consumer or time (a failure, R1), are in the consume results too.
    """
    lake = Lake.make(tmp_path / "lake")
    write(lake, CONSUME_RESULTS, [
        result(ORIGIN, consumer="c1@host", status="RECONSUME_LATER", at_s=0,
               error_class="com.acme.Flaky", error_message="first"),
        result(RETRY_ID, consumer="c2@host", status="RECONSUME_LATER", at_s=10, topic="%RETRY%billing",
               reconsume_times=1, origin_msg_id=ORIGIN, retry_topic="orders", delay_level_when_next_consume=-1,
               error_class="com.acme.Flaky", error_message="second"),
        result("OTHER", consumer="c1@host", status="RECONSUME_LATER", at_s=0, error_class="x.Other", error_message="not H-1"),
        result(ORIGIN, consumer=None, status=None, at_s=None, error_class=None, error_message=None),
    ])
    decided = {"consumer_group": "billing", "retry_topic": "orders", "origin_msg_id": ORIGIN, "batch_id": 0}
    write(lake, OUTCOMES, [
        {**decided, "result_id": f"res-{ORIGIN}-c1@host", "msg_id": ORIGIN, "reconsume_times": 0, "outcome": "retry",
         "output_msg_id": RETRY_ID, "delay_level": 3, "due_at": at(3), "decided_at": at(1)},
        {**decided, "result_id": f"res-{RETRY_ID}-c2@host", "msg_id": RETRY_ID, "reconsume_times": 1,
         "outcome": "dead_letter", "reason_code": "DLQ_REQUESTED", "reason": "consumer asked for delay level -1",
         "output_msg_id": DEAD_ID, "decided_at": at(11), "batch_id": 5},
    ])
    copied = {"origin_msg_id": ORIGIN, "retry_topic": "orders", "consumer_group": "billing"}
    write(lake, RETRY, [
        {**copied, "msg_id": RETRY_ID, "topic": "%RETRY%billing", "reconsume_times": 1, "delivery_key": f"{ORIGIN}:1",
         "delay_level": 3, "due_at": at(3), "delivered_at": at(3.5),
         "error_class": "com.acme.Flaky", "error_message": "first"},
    ])
    write(lake, DLQ, [
        {**copied, "msg_id": DEAD_ID, "topic": "%DLQ%billing", "reconsume_times": 2, "delivery_key": f"{ORIGIN}:2",
         "dead_lettered_at": at(11), "reason_code": "DLQ_REQUESTED", "reason": "consumer asked for delay level -1",
         "error_class": "com.acme.Flaky", "error_message": "second",
         # B4: the attempts travel with the message.
         "attempts": [
             {"reconsume_times": 0, "consumer_group": "billing", "consumer_id": "c1@host", "status": "RECONSUME_LATER",
              "error_class": "com.acme.Flaky", "error_message": "first", "consumed_at": at(0), "delay_level": 3},
             {"reconsume_times": 1, "consumer_group": "billing", "consumer_id": "c2@host", "status": "RECONSUME_LATER",
              "error_class": "com.acme.Flaky", "error_message": "second", "consumed_at": at(10), "delay_level": None},
         ]},
    ])
    return lake


def test_each_row_carries_its_own_error_and_the_consumers_results_are_in_it(lake: Lake) -> None:
    """#13 part 6: the error of a failed consumption is on that consumption's row (B4),
    and the consumer's results (consume_results) are part of the history (B6)."""
    frame = dlq.history(lake.config, ORIGIN)
    assert list(frame.columns) == list(dlq.HISTORY_COLUMNS)
    got = [
        (r["table"], r["event"], r["msg_id"], r["consumer_id"], r["reconsume_times"], r["error_class"], r["error_message"])
        for r in frame.to_dict("records")
    ]
    assert [tuple(None if pd_na(v) else v for v in row) for row in got] == [
        # No consumed_at: sorts first (the time is unknown, not "now").
        ("consume_results", "consumed: no status (a failure)", ORIGIN, None, 0, None, None),
        ("consume_results", "consumed: RECONSUME_LATER", ORIGIN, "c1@host", 0, "com.acme.Flaky", "first"),
        ("outcomes", "decided: retry", ORIGIN, None, 0, None, None),
        ("retry", "retry delivered", RETRY_ID, None, 1, None, None),
        ("consume_results", "consumed: RECONSUME_LATER", RETRY_ID, "c2@host", 1, "com.acme.Flaky", "second"),
        ("outcomes", "decided: dead_letter", RETRY_ID, None, 1, None, None),
        ("dlq", "dead-lettered", DEAD_ID, None, 2, None, None),
    ]
    rows = frame.to_dict("records")
    assert rows[4]["detail"] == "asked for delay level -1"
    assert rows[5]["reason_code"] == rows[6]["reason_code"] == "DLQ_REQUESTED"
    # The same history from the id of the retry, of the dead letter, or of a consumption only.
    for any_id in (RETRY_ID, DEAD_ID):
        assert dlq.history(lake.config, any_id)["event"].tolist() == frame["event"].tolist()


def test_a_message_known_only_from_a_consume_result_has_a_history(lake: Lake) -> None:
    """#13 part 6: a result the engine has not decided yet is already in the history (B6)."""
    frame = dlq.history(lake.config, "OTHER")
    assert frame[["event", "consumer_id", "error_class"]].values.tolist() == [
        ["consumed: RECONSUME_LATER", "c1@host", "x.Other"]
    ]


def test_dlq_show_prints_consumer_and_error_columns(lake: Lake, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """#13 part 5: ``dlq show`` shows who consumed each delivery and the attempt history."""
    config = tmp_path / "retry-engine.toml"
    config.write_text(f'[engine]\nlake = "{lake.root}"\n')
    assert main(["dlq", "show", DEAD_ID, "--config", str(config), "--format", "csv"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split(",") == list(dlq.HISTORY_COLUMNS)
    assert sum("c2@host" in line and "second" in line for line in lines) == 1
    assert len(lines) == 1 + 7

    assert main(["dlq", "show", ORIGIN, "--config", str(config)]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith(f"history of origin message {ORIGIN} (7 rows)\n")
    attempts = out.split(f"attempts carried by dead letter {DEAD_ID} (2)\n", 1)[1].splitlines()
    assert attempts[0].split() == ["reconsume_times", "consumer_id", "status", "error_class", "error_message", "consumed_at", "delay_level"]
    assert attempts[1].split()[:5] == ["0", "c1@host", "RECONSUME_LATER", "com.acme.Flaky", "first"]
    assert attempts[2].split()[:5] == ["1", "c2@host", "RECONSUME_LATER", "com.acme.Flaky", "second"]
    # (found by a newcomer's walk through the README) counts as whole numbers, though some rows have none.
    frame = dlq.history(load_config(config), ORIGIN)
    assert str(frame["reconsume_times"].dtype) == "Int64" and ".0 " not in out.split("attempts carried")[0]


def pd_na(value: Any) -> bool:
    import pandas as pd

    return value is None or (not isinstance(value, str) and bool(pd.isna(value)))


def test_a_consume_results_table_without_id_columns_does_not_hide_the_rest(tmp_path: Path) -> None:
    """Hostile input: a producer wrote consume_results with a drifted schema (no msg_id);
    the history still shows what the engine's own tables hold (B6)."""
    lake = Lake.make(tmp_path / "lake")
    drifted = pa.table({"result_id": ["r1"], "origin_msg_id": [ORIGIN], "status": ["RECONSUME_LATER"]})
    write_deltalake(lake.path("consume_results"), drifted)
    write(lake, DLQ, [{"msg_id": DEAD_ID, "topic": "%DLQ%billing", "consumer_group": "billing", "origin_msg_id": ORIGIN,
                       "reconsume_times": 2, "delivery_key": f"{ORIGIN}:2", "dead_lettered_at": at(11)}])
    assert dlq.history(lake.config, DEAD_ID)["event"].tolist() == ["dead-lettered"]


def test_a_consume_result_in_a_file_without_statistics_is_in_the_history(lake: Lake) -> None:
    """Another writer's consume results without column statistics: delta-rs's filter on msg_id skipped
    the whole file, and the consumption was missing from `dlq show` (pyarrow_dataset)."""
    from deltalake import DeltaTable

    path = lake.path(CONSUME_RESULTS.name)
    DeltaTable(path).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": "0"})
    write(lake, CONSUME_RESULTS, [result("BARE", consumer="c9@host", status="CONSUME_SUCCESS", at_s=50)])
    DeltaTable(path).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": "32"})
    frame = dlq.history(lake.config, "BARE")
    assert frame[["event", "consumer_id"]].values.tolist() == [["consumed: CONSUME_SUCCESS", "c9@host"]]


def test_times_outside_pandas_nanoseconds_are_shown_to_the_microsecond(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input (SPEC: timestamps before 1970 or far in the future): a consumer's clock at year 1 and a
    producer's at year 9999 made `dlq show` end in pandas' OutOfBoundsDatetime (nanoseconds end in
    2262); the history shows them as the tables hold them, in time order."""
    lake = Lake.make(tmp_path / "lake")
    first = dt.datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC)
    last = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
    write(lake, CONSUME_RESULTS, [result(ORIGIN, consumer="c1@host", status="RECONSUME_LATER", at_s=None, consumed_at=first)])
    write(lake, MESSAGES, [{"msg_id": ORIGIN, "topic": "orders", "store_timestamp": last, "born_timestamp": first}])
    write(lake, DLQ, [{"msg_id": DEAD_ID, "topic": "%DLQ%billing", "consumer_group": "billing", "origin_msg_id": ORIGIN,
                       "reconsume_times": 2, "delivery_key": f"{ORIGIN}:2", "dead_lettered_at": at(11)}])
    frame = dlq.history(lake.config, ORIGIN)
    assert frame["at"].tolist() == [first, at(11), last]
    assert frame["event"].tolist() == ["consumed: RECONSUME_LATER", "dead-lettered", "published"]
    config = tmp_path / "retry-engine.toml"
    config.write_text(f'[engine]\nlake = "{lake.root}"\n')
    assert main(["dlq", "show", ORIGIN, "--config", str(config)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "0001-01-01 00:00:00.000001+00:00" in out and "9999-12-31 23:59:59.999999+00:00" in out
    assert main(["dlq", "show", ORIGIN, "--config", str(config), "--format", "json"]) == EXIT_OK
    assert '"at":"0001-01-01T00:00:00.000Z"' in capsys.readouterr().out


def test_ids_another_writer_stored_as_numbers_are_read_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input (SPEC: wrong types): consume_results rewritten with msg_id and origin_msg_id as int64 made
    `dlq show` end in Arrow's "no kernel matching input types (int64, string)"; the ids are read as the
    engine reads consume results (cast value by value), so the consumptions are found by their id as text."""
    lake = Lake.make(tmp_path / "lake")
    drifted = pa.table({
        "msg_id": pa.array([42, 7, 8], pa.int64()),
        "origin_msg_id": pa.array([None, 42, 9], pa.int64()),
        "consumer_group": ["billing"] * 3,
        "status": ["RECONSUME_LATER"] * 3,
        "consumed_at": pa.array([at(0), at(10), at(20)], pa.timestamp("us", tz="UTC")),
    })
    write_deltalake(lake.path("consume_results"), drifted)
    write(lake, DLQ, [{"msg_id": DEAD_ID, "topic": "%DLQ%billing", "consumer_group": "billing", "origin_msg_id": "42",
                       "reconsume_times": 2, "delivery_key": "42:2", "dead_lettered_at": at(11)}])
    frame = dlq.history(lake.config, DEAD_ID)
    assert frame[["table", "msg_id", "at"]].values.tolist() == [
        ["consume_results", "42", at(0)],
        ["consume_results", "7", at(10)],
        ["dlq", DEAD_ID, at(11)],
    ]
    config = tmp_path / "retry-engine.toml"
    config.write_text(f'[engine]\nlake = "{lake.root}"\n')
    assert main(["dlq", "show", "7", "--config", str(config)]) == EXIT_OK
    assert capsys.readouterr().out.startswith("history of origin message 42 (3 rows)\n")


def test_a_column_of_another_type_beside_text_ids_still_picks_by_the_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(found by a review of the fix above) Any column of another type (a producer's flag as int64) made a history
    lookup read the whole table, bodies and all, and pick after (198 MiB for 100,000 messages): with the ids as
    text the lookup is pushed down to the files their statistics allow; only the other column is cast."""
    lake = Lake.make(tmp_path / "lake")
    schema = MESSAGES.arrow_schema.set(MESSAGES.arrow_schema.get_field_index("flag"), pa.field("flag", pa.int64()))
    rows = [{"msg_id": f"M{i}", "topic": "orders", "body": b"x" * 100, "flag": i, "queue_id": 0, "reconsume_times": 0,
             "born_timestamp": at(i), "store_timestamp": at(i)} for i in range(3)]
    write_deltalake(lake.path("messages"), pa.Table.from_pylist(rows, schema=schema), partition_by=["topic"])
    whole: list[str] = []
    real = dlq.read_columns
    monkeypatch.setattr(dlq, "read_columns", lambda table, *a, **k: whole.append("read whole") or real(table, *a, **k))
    frame = dlq.history(lake.config, "M1")
    assert frame[["table", "msg_id"]].values.tolist() == [["messages", "M1"]] and whole == []


def test_dlq_list_and_show_escape_table_text_and_keep_json_and_csv_as_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input: a consumer's error message (copied into the DLQ, B4) can hold terminal escapes and a line
    break that forges a row; `dlq list` and `dlq show` printed them raw. The table format shows every
    text cell escaped (``printable``, the one `status` uses); JSON and CSV, for programs, keep the value."""
    hostile = "boom\x1b[2J\x1b]0;pwned\x07\r\nFAKE-ROW DLQ-999"
    origin = "H-1\x1b[31m"
    lake = Lake.make(tmp_path / "lake")
    attempt = {"reconsume_times": 0, "consumer_group": "billing", "consumer_id": "c1\x1b[8m", "status": "RECONSUME_LATER",
               "error_class": "E\x00X", "error_message": hostile, "consumed_at": at(0), "delay_level": 3}
    write(lake, DLQ, [{"msg_id": DEAD_ID, "topic": "%DLQ%billing", "consumer_group": "billing", "origin_msg_id": origin,
                       "retry_topic": "orders", "reconsume_times": 2, "delivery_key": f"{ORIGIN}:2",
                       "dead_lettered_at": at(11), "error_class": "E\x00X", "error_message": hostile,
                       "attempts": [attempt]}])
    write(lake, CONSUME_RESULTS, [result(DEAD_ID, consumer="c1\x1b[8m", status="RECONSUME_LATER", at_s=10,
                                         origin_msg_id=origin, error_class="E\x00X", error_message=hostile)])
    config = tmp_path / "retry-engine.toml"
    config.write_text(f'[engine]\nlake = "{lake.root}"\n')
    for command in (["dlq", "list"], ["dlq", "show", DEAD_ID]):
        assert main([*command, "--config", str(config)]) == EXIT_OK
        out = capsys.readouterr().out
        assert not any(c in out for c in "\x1b\x07\x00\r"), command
        assert "E\\x00X" in out and "boom\\x1b[2J\\x1b]0;pwned\\x07\\r\\nFAKE-ROW" in out, command
        assert not any(line.startswith("FAKE-ROW") for line in out.splitlines()), command
    assert "history of origin message H-1\\x1b[31m (2 rows)" in out and "c1\\x1b[8m" in out
    assert main(["dlq", "list", "--config", str(config), "--format", "json"]) == EXIT_OK
    listed = json.loads(capsys.readouterr().out)
    assert (listed["error_message"], listed["error_class"], listed["origin_msg_id"]) == (hostile, "E\x00X", origin)
    assert main(["dlq", "show", DEAD_ID, "--config", str(config), "--format", "csv"]) == EXIT_OK
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out, newline="")))
    assert [r["error_message"] for r in rows if r["error_message"]] == [hostile]
