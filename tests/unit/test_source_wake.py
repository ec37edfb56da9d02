"""``wakeOnStart``: a restarted stateful query runs a batch at its first trigger without new files (R8).

Spark plans a batch without new input only after a batch ran in the same query execution, so the
engine restarted on a checkpoint whose planned batches were all committed ran nothing (and released
no due retry) until a consume result arrived. The source's first ``latestOffset`` now moves the
offset by a ``wake`` count that reads as the same position; the integration tests
(test_restart_machine, test_upgrade) show the engine releasing retries with it. Also here: what a
restarted reader does with a checkpoint's offsets that name another table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import ReadAllAvailable

from retry_engine.delta import append_arrow, ensure_table
from retry_engine.delta._offsets import Offset
from retry_engine.delta.source import DeltaStreamReader, SourceOptions
from retry_engine.errors import ConfigError
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import Result, results_table


def _reader(path: str, **options: str) -> DeltaStreamReader:
    return DeltaStreamReader(SourceOptions.parse({"path": path, **options}), CONSUME_RESULTS.spark_schema)


def _rows(reader: DeltaStreamReader, start: dict[str, Any], end: dict[str, Any]) -> int:
    return sum(b.num_rows for part in reader.partitions(start, end) for b in reader.read(part))


def _first_batch_end(path: str) -> dict[str, Any]:
    """The end of a query's first batch, as the checkpoint holds it (with where that batch started)."""
    first = _reader(path)
    end = first.latestOffset(first.initialOffset(), ReadAllAvailable())
    assert "batchStart" in end
    return end


@pytest.fixture
def table(tmp_path: Path) -> str:
    path = str(tmp_path / "in")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)
    append_arrow(path, results_table([Result.of(), Result.of()]))
    return path


def test_a_restarted_reader_moves_the_offset_once_with_nothing_new(table: str) -> None:
    committed = _first_batch_end(table)
    restarted = _reader(table, wakeOnStart="true")

    woken = restarted.latestOffset(committed, ReadAllAvailable())
    again = restarted.latestOffset(woken, ReadAllAvailable())

    assert woken != committed and woken["wake"] == 1
    assert Offset.from_json(woken).key == Offset.from_json(committed).key  # the same position
    assert _rows(restarted, committed, woken) == 0  # the batch it plans reads nothing (not the first again)
    assert "batchStart" not in woken
    assert Offset.from_json(again).key == Offset.from_json(woken).key and "wake" not in again
    append_arrow(table, results_table([Result.of()]))
    assert _rows(restarted, again, restarted.latestOffset(again, ReadAllAvailable())) == 1


def test_without_the_option_a_reader_with_nothing_new_keeps_the_offset(table: str) -> None:
    committed = _first_batch_end(table)
    assert _reader(table).latestOffset(committed, ReadAllAvailable()) == committed


def test_new_files_are_read_as_they_are_and_no_wake_is_added(table: str) -> None:
    committed = _first_batch_end(table)
    append_arrow(table, results_table([Result.of()]))
    restarted = _reader(table, wakeOnStart="true")
    end = restarted.latestOffset(committed, ReadAllAvailable())
    assert "wake" not in end and _rows(restarted, committed, end) == 1


def test_a_new_query_is_not_woken(tmp_path: Path) -> None:
    """A new checkpoint has no state to wake: its reader starts at initialOffset and plans as without
    the option (no empty first batch recorded in the lake as ending inside a snapshot)."""
    path = str(tmp_path / "in")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)
    woken, plain = _reader(path, wakeOnStart="true"), _reader(path)
    start = woken.initialOffset()
    assert start == plain.initialOffset()
    end = woken.latestOffset(start, ReadAllAvailable())
    assert end == plain.latestOffset(plain.initialOffset(), ReadAllAvailable()) and "wake" not in end
    assert woken.latestOffset(end, ReadAllAvailable()) == end  # its one wake-up is spent


@pytest.mark.parametrize("hostile", ["2", -3, True, 1.0, 1.5, None, [1], {"n": 1}, 2**70])
def test_a_wake_count_from_a_checkpoint_is_never_trusted_and_the_offset_always_moves(table: str, hostile: Any) -> None:
    """A checkpoint's offset is outside input: its ``wake`` may be anything; the next one differs."""
    committed = {**_first_batch_end(table), "wake": hostile}
    woken = _reader(table, wakeOnStart="true").latestOffset(committed, ReadAllAvailable())
    assert woken != committed and isinstance(woken["wake"], int)
    assert Offset.from_json(woken).key == Offset.from_json(committed).key


@pytest.mark.parametrize("value", ["yes", "1", "on"])
def test_the_option_takes_true_or_false_only(table: str, value: str) -> None:
    with pytest.raises(ConfigError, match="wakeOnStart"):
        _reader(table, wakeOnStart=value)


def test_a_checkpoint_of_another_table_is_refused_naming_both_tables(table: str, tmp_path: Path) -> None:
    """A restored checkpoint is outside input: one whose offsets name another table (a re-created
    table, or a checkpoint two engines share) stops the stream instead of reading the wrong files."""
    from retry_engine.errors import DeltaSourceError

    other = str(tmp_path / "other")
    ensure_table(other, CONSUME_RESULTS.arrow_schema)
    append_arrow(other, results_table([Result.of()]))
    foreign = _first_batch_end(other)
    with pytest.raises(DeltaSourceError, match="DELTA_TABLE_ID_CHANGED") as caught:
        _reader(table, wakeOnStart="true").latestOffset(foreign, ReadAllAvailable())
    message = str(caught.value)
    assert foreign["reservoirId"] in message and "two engines or lakes given one engine.checkpoint" in message
