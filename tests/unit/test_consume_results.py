"""#13 part 1: the input contract of consume_results, and the helper that checks it before writing.

Expected values come from SPEC (R1: a null status is a failure; the bad-input
rule: names of ``%|a-zA-Z0-9_-``, blank ids) and the table definition in
``schemas/``; the tables are real Delta tables read back with delta-rs.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from retry_engine import append_consume_results
from retry_engine.config import parse_config
from retry_engine.errors import (
    ConsumeResultTypeError,
    InvalidConsumeResultError,
    RetryEngineError,
    SchemaMismatchError,
)
from retry_engine.ops.cli import EXIT_OK, EXIT_USAGE, main
from retry_engine.schemas import ALL_TABLES, CONSUME_RESULTS, DLQ

REPO = Path(__file__).resolve().parents[2]
# SPEC R1 + bad-input rule: the engine stops without these columns (decide's check_input_schema).
REQUIRED = {"consumer_group", "msg_id", "topic", "status"}
GOOD = {"consumer_group": "billing", "msg_id": "M-1", "topic": "orders", "status": "RECONSUME_LATER"}


def _rows(lake: Path) -> list[dict[str, Any]]:
    return DeltaTable(str(lake / "consume_results")).to_pyarrow_table().to_pylist()


def _refused(lake: Path, rows: Any, error: type[RetryEngineError], match: str) -> None:
    """``rows`` raise ``error`` matching ``match`` and nothing is written (no table, or no new version)."""
    path = lake / "consume_results"
    before = DeltaTable(str(path)).version() if (path / "_delta_log").exists() else None
    with pytest.raises(error, match=match):
        append_consume_results(lake, rows)
    after = DeltaTable(str(path)).version() if (path / "_delta_log").exists() else None
    assert after == before


# -- well-formed rows, every accepted shape ------------------------------------------------------


def test_list_of_dicts_pandas_and_arrow_all_land_with_the_engines_schema(tmp_path: Path) -> None:
    """#13 part 1: optional columns are null; the table is created with the engine's schema, unpartitioned."""
    lake = tmp_path / "lake"
    born = dt.datetime(2026, 11, 22, 12, 0)  # naive: taken as UTC
    first = [{**GOOD, "msg_id": "A", "body": b"x", "reconsume_times": 2, "born_timestamp": born,
              "properties": {"k": "v"}, "attempts": [{"reconsume_times": 0, "status": "EXCEPTION"}]}]
    assert append_consume_results(lake, first) == 1
    frame = pd.DataFrame({"consumer_group": ["billing"] * 2, "msg_id": ["B", "C"], "topic": ["orders"] * 2,
                          "status": ["CONSUME_SUCCESS", None], "reconsume_times": [1.0, float("nan")],
                          "body": ["text body", None]})
    assert append_consume_results(lake, frame) == 2
    arrow = pa.table({"consumer_group": ["billing"], "msg_id": pa.array(["D"], pa.large_string()),
                      "topic": ["orders"], "status": ["EXCEPTION"], "reconsume_times": pa.array([3], pa.int64())})
    assert append_consume_results(str(lake), arrow.to_batches()[0]) == 1

    table = DeltaTable(str(lake / "consume_results"))
    assert pa.schema(table.schema().to_arrow()) == CONSUME_RESULTS.arrow_schema
    assert table.metadata().partition_columns == []
    rows = {r["msg_id"]: r for r in _rows(lake)}
    assert sorted(rows) == ["A", "B", "C", "D"]
    assert rows["A"]["born_timestamp"] == born.replace(tzinfo=dt.UTC)
    assert rows["A"]["properties"] == [("k", "v")] and rows["A"]["attempts"][0]["status"] == "EXCEPTION"
    assert (rows["A"]["reconsume_times"], rows["B"]["reconsume_times"], rows["C"]["reconsume_times"]) == (2, 1, None)
    assert rows["B"]["body"] == b"text body"  # text is stored as its UTF-8 bytes
    assert rows["C"]["status"] is None  # R1: a null status is a failure, written as null
    assert rows["D"]["reconsume_times"] == 3
    untouched = set(CONSUME_RESULTS.names) - {"consumer_group", "msg_id", "topic", "status", "reconsume_times", "body"}
    assert all(rows["D"][name] is None for name in untouched)


def test_tilde_lake_and_empty_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert append_consume_results("~/lake", []) == 0
    assert not (tmp_path / "lake").exists()  # nothing to write: no table either
    assert append_consume_results("~/lake", [GOOD]) == 1
    assert [r["msg_id"] for r in _rows(tmp_path / "lake")] == ["M-1"]


def test_a_config_gives_the_table_path_and_the_limits(tmp_path: Path) -> None:
    """A config's [tables] path is used, and its engine.max_body_bytes (BODY_TOO_LARGE, SPEC bad input)."""
    config = parse_config({"engine": {"lake": str(tmp_path / "lake"), "max_body_bytes": 4},
                           "tables": {"consume_results": str(tmp_path / "input")}})
    assert append_consume_results(config, [{**GOOD, "body": b"1234"}]) == 1
    assert DeltaTable(str(tmp_path / "input")).version() == 1
    with pytest.raises(InvalidConsumeResultError, match=r"\[BODY_TOO_LARGE\] row 0: body is 5 bytes.*limit.* is 4"):
        append_consume_results(config, [{**GOOD, "body": b"12345"}])


# -- hostile input ------------------------------------------------------------------------------


def test_a_typo_column_is_refused_naming_the_closest_column(tmp_path: Path) -> None:
    """#13 part 1: a typo is never silently dropped (the engine would ignore it)."""
    _refused(tmp_path, [{**GOOD, "consumer_grup": "x"}], InvalidConsumeResultError,
             r"\[UNKNOWN_COLUMN\] column 'consumer_grup' is not a consume_results column; did you mean 'consumer_group'\?")
    _refused(tmp_path, pd.DataFrame([{**GOOD, "reconsumeTimes": 1}]), InvalidConsumeResultError,
             r"'reconsumeTimes'.*did you mean 'reconsume_times'")
    _refused(tmp_path, pa.table({**{k: [v] for k, v in GOOD.items()}, "zzz": [1]}), InvalidConsumeResultError,
             r"column 'zzz' is not a consume_results column; the engine would ignore it.*Columns: result_id,")
    # The table did not exist and still does not.
    assert not (tmp_path / "consume_results").exists()


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_every_required_column_must_be_given(tmp_path: Path, missing: str) -> None:
    """The engine stops on a table without these; status too, although its value may be null (R1)."""
    rows = [{k: v for k, v in GOOD.items() if k != missing}]
    _refused(tmp_path, rows, InvalidConsumeResultError, rf"\[REQUIRED_COLUMN_MISSING\] the rows have no column '{missing}'")


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        ({"consumer_group": None}, "MISSING_GROUP", "consumer_group is missing"),
        ({"consumer_group": " \t"}, "MISSING_GROUP", "consumer_group is missing"),
        ({"msg_id": ""}, "MISSING_MSG_ID", "msg_id is missing"),
        ({"topic": "\u3000"}, "MISSING_TOPIC", "topic is missing"),  # Java whitespace (RocketMQ isBlank)
        ({"consumer_group": "bill ing"}, "INVALID_GROUP_NAME", "consumer_group 'bill ing' must match"),
        ({"consumer_group": "../etc"}, "INVALID_GROUP_NAME", "'../etc'"),
        ({"consumer_group": "g" * 256}, "INVALID_GROUP_NAME", "must match"),
        ({"topic": "orders\n"}, "INVALID_TOPIC_NAME", "topic 'orders\\\\n' must match"),
        ({"status": "OK"}, "UNKNOWN_STATUS", "status 'OK' is not one of"),
        ({"message_model": "FANOUT"}, "UNKNOWN_MESSAGE_MODEL", "message_model 'FANOUT'"),
        ({"reconsume_times": -1}, "INVALID_RECONSUME_TIMES", "reconsume_times -1 is negative"),
        ({"reconsume_times": 2**31 - 1}, "RECONSUME_TIMES_OVERFLOW", "int32 maximum"),
        ({"max_reconsume_times": -2}, "INVALID_MAX_RECONSUME_TIMES", "below -1"),
        ({"consumed_at": dt.datetime(1, 1, 1, tzinfo=dt.UTC)}, None, None),  # year 1 is a time the engine decides
    ],
)
def test_rows_the_engine_would_quarantine_are_refused_with_its_reason_code(
    tmp_path: Path, change: dict[str, Any], code: str | None, words: str | None
) -> None:
    """SPEC bad-input rule: the helper refuses exactly what the engine quarantines, with the same code."""
    rows = [GOOD, {**GOOD, "msg_id": "M-2", **change}]
    if code is None:
        assert append_consume_results(tmp_path, rows) == 2
        return
    assert words is not None
    _refused(tmp_path, rows, InvalidConsumeResultError, rf"\[{code}\] row 1: .*{words}.*Nothing was written")


def test_arrow_values_python_cannot_hold_are_refused_with_the_engines_code(tmp_path: Path) -> None:
    """SPEC bad input: invalid UTF-8 and a time outside years 1-9999 (Arrow holds both; the engine quarantines them)."""
    base = {k: pa.array([v, v]) for k, v in GOOD.items()}
    bad_utf8 = pa.array([b"M-1", b"\xff\xfe"], pa.binary()).view(pa.string())
    _refused(tmp_path, pa.table({**base, "msg_id": bad_utf8}), InvalidConsumeResultError,
             r"\[INVALID_UTF8\] row 1: column msg_id: .*is not valid UTF-8")
    far = pa.array([0, -(2**62)], pa.timestamp("us", tz="UTC"))
    _refused(tmp_path, pa.table({**base, "consumed_at": far}), InvalidConsumeResultError,
             r"\[TIMESTAMP_OUT_OF_RANGE\] row 1: column consumed_at: .*outside years 1-9999")


def test_values_that_do_not_fit_without_loss_are_refused(tmp_path: Path) -> None:
    cases: list[tuple[Any, str]] = [
        ([{**GOOD, "reconsume_times": 2.5}], r"column 'reconsume_times', row 0: 2.5 \(float\) does not fit int32 without loss"),
        ([{**GOOD, "reconsume_times": 2**31}], r"column 'reconsume_times', row 0: 2147483648 .*whole numbers from -2147483648 to 2147483647"),
        ([{**GOOD, "reconsume_times": -(2**63)}], r"column 'reconsume_times'"),
        ([{**GOOD, "reconsume_times": "3"}], r"column 'reconsume_times', row 0: '3' \(str\)"),
        ([{**GOOD, "reconsume_times": True}], r"column 'reconsume_times', row 0: True \(bool\)"),
        ([GOOD, {**GOOD, "consumed_at": 1_700_000_000}], r"column 'consumed_at', row 1: 1700000000 \(int\).*datetimes"),
        ([{**GOOD, "consumed_at": "2026-11-22"}], r"column 'consumed_at', row 0: '2026-11-22' \(str\)"),
        ([{**GOOD, "msg_id": b"\xff\xfe"}], r"column 'msg_id', row 0: b'\\xff\\xfe'"),
        ([{**GOOD, "properties": ["not", "a", "map"]}], r"column 'properties', row 0"),
        (pa.table({**{k: [v] for k, v in GOOD.items()}, "reconsume_times": ["1"]}), r"column 'reconsume_times' is string in the rows but int32"),
        (pa.table({**{k: [v] for k, v in GOOD.items()}, "reconsume_times": pa.array([2**40])}), r"column 'reconsume_times', row 0: 1099511627776 \(int64\) does not fit int32 without loss"),
        (pa.table({**{k: [v] for k, v in GOOD.items()}, "consumed_at": pa.array([1], pa.timestamp("ns"))}), r"column 'consumed_at', row 0.*would lose data"),
        (pd.DataFrame({**{k: [v] for k, v in GOOD.items()}, "flag": [True]}), r"column 'flag' is bool in the rows but int32"),
    ]
    for rows, match in cases:
        _refused(tmp_path, rows, ConsumeResultTypeError, r"\[COLUMN_TYPE_MISMATCH\] " + match)
    assert issubclass(ConsumeResultTypeError, TypeError) and issubclass(InvalidConsumeResultError, ValueError)


def test_what_is_not_rows_is_refused(tmp_path: Path) -> None:
    for rows, match in [
        ("consumer_group,msg_id", r"\[UNSUPPORTED_ROWS\] rows must be a pandas DataFrame, a pyarrow Table"),
        (b"bytes", r"\[UNSUPPORTED_ROWS\]"),
        ({"consumer_group": "g"}, r"\[UNSUPPORTED_ROWS\].*got dict"),
        ([GOOD, "row two"], r"\[UNSUPPORTED_ROWS\] row 1 is a str, not a dict"),
        ([{**GOOD, 7: "x"}], r"\[UNKNOWN_COLUMN\] column name 7 is a int"),
        (pd.DataFrame([[1, 2]], columns=["msg_id", "msg_id"]), r"\[DUPLICATE_COLUMN\] column 'msg_id' appears more than once"),
    ]:
        with pytest.raises(RetryEngineError, match=match):
            append_consume_results(tmp_path, rows)
    with pytest.raises(ConsumeResultTypeError, match=r"\[INVALID_LAKE\] lake must be a folder path or an EngineConfig"):
        append_consume_results(42, [GOOD])  # type: ignore[arg-type]
    with pytest.raises(RetryEngineError, match=r"lake is empty"):
        append_consume_results("", [GOOD])


def test_a_drifted_table_is_refused_naming_the_differences(tmp_path: Path) -> None:
    """A table another writer widened (schema_mode="merge") is left alone, with the drift named."""
    path = tmp_path / "consume_results"
    write_deltalake(str(path), pa.table({**{k: [v] for k, v in GOOD.items()}, "consumer_grup": ["x"]}))
    with pytest.raises(SchemaMismatchError, match=r"\[CONSUME_RESULTS_DRIFTED\].*column 'consumer_grup'.*ignored"):
        append_consume_results(tmp_path, [GOOD])
    assert DeltaTable(str(path)).version() == 0


# -- the README and `retry-engine schema` ---------------------------------------------------------


def _readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """#13 part 1: the README's "Writing consume results" example, run in an empty folder."""
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", _readme_section("Writing consume results"), flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "README.md", "exec"), {})
    rows = {r["msg_id"]: r for r in _rows(tmp_path / "data" / "lake")}
    assert {m: r["status"] for m, r in rows.items()} == {
        "7F00000100002A": "CONSUME_SUCCESS", "7F00000100002B": "RECONSUME_LATER", "7F00000100002C": None,
    }
    assert rows["7F00000100002B"]["error_class"] == "TimeoutError" and rows["7F00000100002A"]["error_class"] is None


def test_readme_column_table_lists_every_column_once_and_the_required_ones() -> None:
    section = _readme_section("Writing consume results")
    listed: list[str] = []
    required: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            names = re.findall(r"`([a-z_]+)`", cells[0])
            listed += names
            if cells[2].startswith("yes"):
                required.update(names)
    assert sorted(listed) == sorted(CONSUME_RESULTS.names)
    assert required == REQUIRED


def test_schema_command_prints_every_table_and_one_in_each_format(capsys: pytest.CaptureFixture[str]) -> None:
    """#13 part 1: `retry-engine schema [TABLE] [--format arrow|spark-ddl|json]`."""
    assert main(["schema"]) == EXIT_OK
    out = capsys.readouterr().out
    for table in ALL_TABLES:
        assert f"-- {table.name}: " in out
    assert "-- required columns: consumer_group, msg_id, topic, status" in out

    assert main(["schema", "dlq", "--format", "json"]) == EXIT_OK
    (dlq,) = json.loads(capsys.readouterr().out)["tables"]
    assert [c["name"] for c in dlq["columns"]] == DLQ.names and dlq["partition_by"] == ["consumer_group"]
    assert [c["arrow_type"] for c in dlq["columns"]] == [str(f.type) for f in DLQ.arrow_schema]

    assert main(["schema", "consume_results", "--format", "json"]) == EXIT_OK
    (results,) = json.loads(capsys.readouterr().out)["tables"]
    assert {c["name"] for c in results["columns"] if c["required"]} == REQUIRED

    assert main(["schema", "consume_results"]) == EXIT_OK
    arrow = capsys.readouterr().out
    assert "reconsume_times: int32\n" in arrow and "consumed_at: timestamp[us, tz=UTC]\n" in arrow

    assert main(["schema", "retry", "--format", "spark-ddl"]) == EXIT_OK
    ddl = capsys.readouterr().out
    assert "`msg_id` STRING NOT NULL" in ddl and "`properties` MAP<STRING, STRING>" in ddl
    assert "`attempts` ARRAY<STRUCT<`reconsume_times`: INT," in ddl


@pytest.mark.parametrize("bad", ["dlqq", "", "DLQ", "../dlq"])
def test_schema_of_an_unknown_table_exits_2_naming_the_tables(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["schema", bad])
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"invalid choice: '{bad}'" in err and all(f"'{t.name}'" in err for t in ALL_TABLES)
