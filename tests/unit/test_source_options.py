"""#12 item 9: Delta's streaming source options on consume_results, as ``deltars`` options and ``[source]`` keys.

Meanings are Delta's: ``startingVersion`` reads the changes of that commit and
later ones (``latest``: only commits after start), ``startingTimestamp`` the
changes of the first commit at or after that time (a time after the latest
commit is an error, a time before every commit starts at the earliest), the
two are exclusive; ``skipChangeCommits`` / ``ignoreDeletes`` skip commits that
remove data. No SparkSession here: the stream reader is driven directly, on
real Delta tables.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest
from deltalake import write_deltalake
from pyspark.sql.datasource import ReadAllAvailable

from retry_engine.config import load_config, parse_config
from retry_engine.delta import append_arrow, ensure_table
from retry_engine.delta.source import DeltaStreamReader, SourceOptions, row_schema
from retry_engine.errors import ConfigError, DeltaSourceError
from retry_engine.schemas import CONSUME_RESULTS
from tests.builders import Result, results_table

CONF = Path(__file__).parents[2] / "conf" / "retry-engine.toml"


# ------------------------------------------------------------------ [source] config keys


def test_source_section_defaults_and_the_shipped_config_read_the_latest_snapshot() -> None:
    assert parse_config({}).source.stream_options() == {}
    assert load_config(CONF, env={}).source.stream_options() == {}


@pytest.mark.parametrize(
    ("section", "options"),
    [
        ({"starting_version": 0}, {"startingVersion": "0"}),
        ({"starting_version": 42}, {"startingVersion": "42"}),
        ({"starting_version": "latest"}, {"startingVersion": "latest"}),
        ({"starting_timestamp": "2026-01-01"}, {"startingTimestamp": "2026-01-01"}),
        ({"starting_timestamp": "2026-01-01T10:00:00.5+02:00"}, {"startingTimestamp": "2026-01-01T10:00:00.5+02:00"}),
        (
            {"skip_change_commits": True, "ignore_deletes": True},
            {"skipChangeCommits": "true", "ignoreDeletes": "true"},
        ),
    ],
)
def test_source_keys_become_deltas_reader_options(section: dict[str, object], options: dict[str, str]) -> None:
    config = parse_config({"source": section})
    assert config.source.stream_options() == options
    # Every mapped option is one the deltars reader accepts.
    SourceOptions.parse({"path": "/t", **options})


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"starting_version": -1}, r"source\.starting_version.*greater than or equal to 0"),
        ({"starting_version": -(2**63)}, r"source\.starting_version"),
        ({"starting_version": 1.5}, r"source\.starting_version"),
        ({"starting_version": "7"}, r"source\.starting_version.*'latest'"),
        ({"starting_version": "earliest"}, r"source\.starting_version.*'latest'"),
        ({"starting_version": True}, r"source\.starting_version"),
        ({"starting_timestamp": "yesterday"}, r"starting_timestamp='yesterday' is not a date"),
        ({"starting_timestamp": "2026-02-30"}, r"starting_timestamp='2026-02-30' is not a date"),
        ({"starting_timestamp": ""}, r"starting_timestamp='' is not a date"),
        ({"starting_timestamp": "2026-01-01T00:00:00Z; DROP TABLE"}, r"is not a date"),
        ({"starting_timestamp": 1_700_000_000}, r"source\.starting_timestamp"),
        ({"starting_version": 3, "starting_timestamp": "2026-01-01"}, r"both set.*only one"),
        ({"starting_version": "latest", "starting_timestamp": "2026-01-01"}, r"both set"),
        ({"skip_change_commits": "yes"}, r"source\.skip_change_commits.*boolean"),
        ({"ignore_deletes": 1}, r"source\.ignore_deletes.*boolean"),
        ({"ignoreDeletes": True}, r"unknown key 'source\.ignoreDeletes'.*ignore_deletes, skip_change_commits"),
        ({"starting_offset": 1}, r"unknown key 'source\.starting_offset'.*starting_timestamp, starting_version"),
    ],
)
def test_hostile_source_keys_are_rejected_at_load_naming_the_key(section: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"source": section})


# ------------------------------------------------------------------ reader options


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingVersion": "-1"}, r"startingVersion='-1' must be a version number >= 0 or 'latest'"),
        ({"startingVersion": "1e3"}, r"startingVersion='1e3'"),
        ({"startingVersion": "\u00b2"}, r"startingVersion='\u00b2'"),  # str.isdigit() is true for it
        ({"startingTimestamp": "garbage"}, r"startingTimestamp='garbage' is not a date"),
        ({"startingTimestamp": "2026-01-01T24:00:00Z"}, r"is not a date"),
        ({"startingVersion": "0", "startingTimestamp": "2026-01-01"}, r"both set"),
        ({"startingVersion": "latest", "startingTimestamp": "2026-01-01"}, r"both set"),
        ({"skipChangeCommits": "1"}, r"skipChangeCommits='1' must be 'true' or 'false'"),
        ({"ignoreDeletes": "yes"}, r"ignoreDeletes='yes' must be 'true' or 'false'"),
        ({"pruneColumn": "consumed_at"}, r"pruneColumn='consumed_at' and pruneBefore='' go together"),
        ({"pruneBefore": "2026-01-01"}, r"pruneColumn='' and pruneBefore='2026-01-01' go together"),
        ({"pruneColumn": "at", "pruneBefore": "soon"}, r"pruneBefore='soon' is not a date"),
        ({"pruneColumn": "at", "pruneBefore": "1767225600000"}, r"pruneBefore='1767225600000' is not a date"),
        ({"pruneColumn": "at", "pruneBefore": "0001-01-01T00:00:00+14:00"}, r"pruneBefore=.* is out of range"),
        ({"pruneColumn": "at", "pruneBefore": "9999-12-31T23:59:59-14:00"}, r"pruneBefore=.* is out of range"),
        ({"partitionFilter": "consumer_group=G"}, r"partitionFilter='consumer_group=G' must be a JSON object"),
        ({"partitionFilter": '["G"]'}, r"partitionFilter=.* must be a JSON object"),
        ({"partitionFilter": "{}"}, r"partitionFilter='{}' must be a JSON object"),
        ({"partitionFilter": '{"g": "G"}'}, r"partitionFilter=.* must be a JSON object"),
        ({"partitionFilter": '{"g": [1]}'}, r"partitionFilter=.* must be a JSON object"),
        ({"partitionFilter": '{"g": [null]}'}, r"partitionFilter=.* must be a JSON object"),
        ({"partitionFilter": "[" * 100_000}, r"partitionFilter=.* must be a JSON object"),
    ],
)
def test_hostile_reader_options_fail_naming_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=rf"INVALID_OPTION.*{message}"):
        SourceOptions.parse({"path": "/t", **options})


def _table_with_commit_times(tmp_path: Path, seconds: list[int]) -> str:
    """A consume_results table whose commit ``v`` (one row, msg id ``V{v}``) happened at ``seconds[v]``.

    Without in-commit timestamps Delta's commit time is the commit file's
    modification time, so the test sets those.
    """
    path = str(tmp_path / "cr")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)  # version 0: no rows
    for version in range(1, len(seconds)):
        append_arrow(path, results_table([Result.of(f"V{version}")]))
    for version, second in enumerate(seconds):
        os.utime(Path(path) / "_delta_log" / f"{version:020d}.json", (second, second))
    return path


def _msg_ids(options: dict[str, str]) -> list[str]:
    reader = DeltaStreamReader(SourceOptions.parse(options), CONSUME_RESULTS.spark_schema)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    return [m for part in reader.partitions(start, end) for b in reader.read(part) for m in b.column("msg_id").to_pylist()]


@pytest.mark.parametrize(
    ("when", "ids"),
    [
        ("1970-01-01T00:16:40Z", ["V1", "V2", "V3"]),  # = commit 0's time (1000 s): at or after, inclusive
        ("1970-01-01", ["V1", "V2", "V3"]),  # before every commit: the earliest
        ("1970-01-01T00:33:20Z", ["V2", "V3"]),  # exactly commit 2 (2000 s)
        ("1970-01-01T00:33:20.001Z", ["V3"]),  # just after commit 2
        ("1970-01-01T01:33:20+01:00", ["V2", "V3"]),  # an offset: the same instant as 2000 s UTC
        ("1970-01-01T00:50:00Z", ["V3"]),  # exactly the latest commit
    ],
)
def test_starting_timestamp_reads_commits_at_or_after_it(tmp_path: Path, when: str, ids: list[str]) -> None:
    path = _table_with_commit_times(tmp_path, [1000, 1500, 2000, 3000])
    assert _msg_ids({"path": path, "startingTimestamp": when}) == ids


def test_starting_timestamp_after_the_latest_commit_fails_naming_the_commit_and_the_way_out(tmp_path: Path) -> None:
    path = _table_with_commit_times(tmp_path, [1000, 1500])
    with pytest.raises(DeltaSourceError, match=r"DELTA_TIMESTAMP_AFTER_LATEST_COMMIT.*startingTimestamp='2999-01-01'.*version 1.*'latest'"):
        _msg_ids({"path": path, "startingTimestamp": "2999-01-01"})


def test_starting_version_reads_that_commit_and_later_and_fails_past_the_end(tmp_path: Path) -> None:
    path = _table_with_commit_times(tmp_path, [1000, 1500, 2000])
    assert _msg_ids({"path": path, "startingVersion": "2"}) == ["V2"]
    assert _msg_ids({"path": path, "startingVersion": "0"}) == ["V1", "V2"]
    assert _msg_ids({"path": path, "startingVersion": "latest"}) == []
    assert _msg_ids({"path": path}) == ["V1", "V2"]  # the latest snapshot
    with pytest.raises(DeltaSourceError, match=r"DELTA_STARTING_VERSION_INVALID.*startingVersion=99999999999999999999"):
        _msg_ids({"path": path, "startingVersion": "99999999999999999999"})


def test_an_overwrite_fails_the_stream_naming_every_way_past_it(tmp_path: Path) -> None:
    """#12 item 9: the error names Delta's options, the engine's keys, and what each does."""
    path = _table_with_commit_times(tmp_path, [1000, 1500])  # versions 0, 1
    reader = DeltaStreamReader(SourceOptions.parse({"path": path, "startingVersion": "latest"}), CONSUME_RESULTS.spark_schema)
    start = reader.initialOffset()
    write_deltalake(path, results_table([Result.of("NEW")]), mode="overwrite")  # version 2: remove + add
    with pytest.raises(DeltaSourceError, match="DELTA_SOURCE_REMOVE_IN_COMMIT") as caught:
        reader.latestOffset(start, ReadAllAvailable())
    message = str(caught.value)
    for named in (
        "commit 2 ", "removes 1 data file(s) and adds 1", "overwrite",
        "skipChangeCommits=true", "[source] skip_change_commits = true", "skips every commit that removes data",
        "ignoreDeletes=true", "[source] ignore_deletes = true", "only delete whole files",
        "startingVersion=3", "[source] starting_version", "startingTimestamp", "[source] starting_timestamp",
    ):
        assert named in message, named
    skipping = DeltaStreamReader(
        SourceOptions.parse({"path": path, "startingVersion": "latest", "skipChangeCommits": "true"}),
        CONSUME_RESULTS.spark_schema,
    )
    assert skipping.latestOffset(start, ReadAllAvailable())["reservoirVersion"] == 3  # past the overwrite, no rows


# -- the lake's resume point against [source] starting options (B8, #12 items 8 and 9) --------


def test_a_new_checkpoint_resumes_at_the_lakes_version_and_keeps_the_other_source_keys() -> None:
    from retry_engine.core.engine import _source_options

    config = parse_config({"source": {"skip_change_commits": True}})
    assert _source_options(config, 7) == {"skipChangeCommits": "true", "startingVersion": "7"}
    assert _source_options(config, None) == {"skipChangeCommits": "true"}


@pytest.mark.parametrize(
    ("section", "setting"),
    [
        ({"starting_version": 11}, "starting_version = 11"),
        ({"starting_version": 0}, "starting_version = 0"),
        ({"starting_timestamp": "2026-01-01T00:00:00Z"}, "starting_timestamp = '2026-01-01T00:00:00Z'"),
    ],
)
def test_source_starts_that_would_decide_again_are_refused_beside_a_lake_record(
    section: dict[str, object], setting: str
) -> None:
    """B8: a [source] start before the lake's resume point would decide results twice: refused, naming both."""
    from retry_engine.core.engine import _source_options
    from retry_engine.errors import LakeResumeError

    config = parse_config({"source": section})
    with pytest.raises(LakeResumeError, match=rf"LAKE_RESUME_CONFLICT.*version 12.*\[source\] {setting}"):
        _source_options(config, 12)


@pytest.mark.parametrize("start", [12, 40, "latest"])
def test_a_deliberate_skip_ahead_of_the_lake_record_wins(start: object) -> None:
    """An operator skipping past lost data (e.g. a vacuumed file) starts where they said, not earlier."""
    from retry_engine.core.engine import _source_options

    config = parse_config({"source": {"starting_version": start, "ignore_deletes": True}})
    assert _source_options(config, 12) == {"startingVersion": str(start), "ignoreDeletes": "true"}


# ------------------------------------------------------------------ maxRowsPerTrigger


def _table_of_commits(tmp_path: Path, rows_per_commit: list[int]) -> str:
    """A consume_results table with one file per commit of the given row counts (msg ids ``C<commit>-<row>``)."""
    path = str(tmp_path / "cr")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)
    for commit, rows in enumerate(rows_per_commit):
        append_arrow(path, results_table([Result.of(f"C{commit}-{i}") for i in range(rows)]))
    return path


def _batches(path: str, options: dict[str, str]) -> list[int]:
    """Rows of each micro-batch a stream with ``options`` plans over the table, until caught up."""
    reader = DeltaStreamReader(SourceOptions.parse({"path": path, **options}), CONSUME_RESULTS.spark_schema)
    start, sizes = reader.initialOffset(), []
    limit = reader.getDefaultReadLimit()
    while (end := reader.latestOffset(start, limit)) != start:
        sizes.append(sum(b.num_rows for part in reader.partitions(start, end) for b in reader.read(part)))
        start = end
    return sizes


def test_max_rows_per_trigger_bounds_a_batch_by_the_files_row_counts(tmp_path: Path) -> None:
    """#12 item 17 / #15 item 5: what one micro-batch brings (to one state key, to a Python worker) is
    bounded by rows, as a catch-up after a mass failure needs; at least one file is always admitted,
    so a file larger than the limit is a batch of its own and nothing is ever stuck."""
    path = _table_of_commits(tmp_path, [300, 300, 300, 300, 1500, 100])
    assert _batches(path, {"maxRowsPerTrigger": "700"}) == [600, 600, 1500, 100]
    assert _batches(path, {"maxRowsPerTrigger": "600"}) == [600, 600, 1500, 100]
    assert _batches(path, {"maxRowsPerTrigger": "600", "maxFilesPerTrigger": "1"}) == [300, 300, 300, 300, 1500, 100]
    assert _batches(path, {}) == [2800]


def test_files_without_row_statistics_are_admitted_without_counting(tmp_path: Path) -> None:
    """Any writer's log: a missing or malformed ``numRecords`` counts no rows (the file is read, never skipped)."""
    from retry_engine.delta._log import _stats_records

    assert _stats_records('{"numRecords": 12, "minValues": {}}') == 12
    for hostile in (None, 7, "", "{", "[]", '{"numRecords": "12"}', '{"numRecords": -1}', '{"numRecords": true}',
                    '{"numRecords": 1.5}', '{"numRecords": null}', '"numRecords"'):
        assert _stats_records(hostile) is None, hostile


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "many", "1e6", " 5 x"])
def test_a_bad_max_rows_per_trigger_is_a_clear_error(value: str) -> None:
    with pytest.raises(ConfigError, match=r"maxRowsPerTrigger"):
        SourceOptions.parse({"path": "/t", "maxRowsPerTrigger": value})


def test_max_rows_per_trigger_unset_or_huge_admits_everything() -> None:
    assert SourceOptions.parse({"path": "/t", "maxRowsPerTrigger": ""}).max_rows_per_trigger is None
    huge = "99999999999999999999999"
    assert SourceOptions.parse({"path": "/t", "maxRowsPerTrigger": huge}).max_rows_per_trigger == int(huge)


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "1000", 2**31])
def test_engine_max_rows_per_trigger_is_validated(value: object) -> None:
    with pytest.raises(ConfigError, match=r"engine\.max_rows_per_trigger"):
        parse_config({"engine": {"max_rows_per_trigger": value}})
    assert parse_config({}).engine.max_rows_per_trigger == 250_000


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "64m", 2**63])
def test_engine_max_bytes_per_trigger_is_validated(value: object) -> None:
    with pytest.raises(ConfigError, match=r"engine\.max_bytes_per_trigger"):
        parse_config({"engine": {"max_bytes_per_trigger": value}})
    assert parse_config({}).engine.max_bytes_per_trigger == 64 * 2**20
    assert load_config(CONF, env={}).engine.max_bytes_per_trigger == 64 * 2**20


# ------------------------------------------------------------------ readPartitions


def _entries(sizes: list[int]) -> list[Any]:
    from retry_engine.delta._log import FileEntry

    return [FileEntry(path=f"f{i}.parquet", size=size, partition_values={}, version=i, index=0,
                      is_starting_version=False, is_last=True) for i, size in enumerate(sizes)]


def test_read_partitions_groups_a_batchs_files_by_size_each_read_in_stream_order() -> None:
    """#15 goal 1: one read task per file made a batch of four files two waves of Python tasks on two
    cores; with readPartitions they are packed into about one task per core, as Spark's file source does."""
    from retry_engine.delta.source import plan_partitions

    mib = 1 << 20
    entries = _entries([40 * mib, 10 * mib, 30 * mib, 5 * mib, 25 * mib, 0])
    tasks = plan_partitions(entries, "/t", 2)
    paths = [[f.path for f in t.files] for t in tasks]
    assert sorted(p for t in paths for p in t) == sorted(e.path for e in entries)  # each file once
    assert all(t == sorted(t, key=lambda p: int(p[1:-8])) for t in paths)  # stream order within a task
    loads = [sum(entries[int(p[1:-8])].size for p in t) for t in paths]
    assert max(loads) - min(loads) <= 10 * mib  # largest first to the lightest: 55 / 55 here
    assert plan_partitions(entries, "/t", 2)[0].files == tasks[0].files  # replay: the same plan
    assert [len(t.files) for t in plan_partitions(entries, "/t", None)] == [1] * 6  # unset: one per file
    assert [len(t.files) for t in plan_partitions(entries, "/t", 6)] == [1] * 6
    assert [len(t.files) for t in plan_partitions(entries[:2], "/t", 2**40)] == [1, 1]
    assert [len(t.files) for t in plan_partitions(entries, "/t", 1)] == [6]
    assert plan_partitions([], "/t", 2) == []


def test_read_partitions_keeps_empty_files_apart_by_their_open_cost() -> None:
    from retry_engine.delta.source import plan_partitions

    assert [len(t.files) for t in plan_partitions(_entries([0] * 6), "/t", 3)] == [2, 2, 2]


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two", "1e3", "\u00b2"])
def test_a_bad_read_partitions_is_a_clear_error(value: str) -> None:
    with pytest.raises(ConfigError, match=r"INVALID_OPTION.*readPartitions"):
        SourceOptions.parse({"path": "/t", "readPartitions": value})


def test_a_task_of_several_files_reads_them_all_in_stream_order(tmp_path: Path) -> None:
    path = _table_of_commits(tmp_path, [3, 2, 4])
    options = SourceOptions.parse({"path": path, "readPartitions": "1", "sourcePositionColumn": "_pos"})
    reader = DeltaStreamReader(options, row_schema(options))
    start = reader.initialOffset()
    (task,) = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    batches = list(reader.read(task))
    ids = [m for b in batches for m in b.column("msg_id").to_pylist()]
    assert ids == [f"C{c}-{i}" for c, n in enumerate([3, 2, 4]) for i in range(n)]
    positions = [p for b in batches for p in b.column("_pos").to_pylist()]
    assert positions == sorted(positions) and len(set(positions)) == 9


class _ConnectLike:
    """A session as Spark Connect's client has it: no SparkContext, a conf to ask."""

    def __init__(self, parallelism: str | None) -> None:
        self.conf = self
        self.parallelism = parallelism

    @property
    def sparkContext(self) -> Any:  # noqa: N802 (Spark's name)
        raise RuntimeError("[JVM_ATTRIBUTE_NOT_SUPPORTED] sparkContext is not supported in Spark Connect")

    def get(self, key: str, default: str | None = None) -> str | None:
        assert key == "spark.default.parallelism"
        return self.parallelism if self.parallelism is not None else default


@pytest.mark.parametrize(
    ("configured", "expected"),
    [("8", "8"), (" 3 ", "3"), (None, str(2**31 - 1)), ("0", str(2**31 - 1)), ("-2", str(2**31 - 1)),
     ("many", str(2**31 - 1)), ("", str(2**31 - 1)), ("\u00b2", str(2**31 - 1))],
)
def test_read_parallelism_without_a_spark_context(configured: str | None, expected: str) -> None:
    """A client session without a SparkContext: the configured parallelism, else one task per file."""
    from retry_engine.delta.session import read_parallelism

    assert read_parallelism(_ConnectLike(configured)) == expected  # type: ignore[arg-type]
    assert SourceOptions.parse({"path": "/t", "readPartitions": expected}).read_partitions == int(expected)


def test_prune_options_are_for_a_batch_read_and_a_stream_refuses_them() -> None:
    options = SourceOptions.parse({"path": "/t", "pruneColumn": "consumed_at", "pruneBefore": "2026-01-01T00:00:00Z"})
    assert options.prune is not None and options.prune.column == "consumed_at"
    # Widened down by the statistics' slack: a file whose maximum is truncated to the millisecond is kept.
    assert options.prune.before == dt.datetime(2025, 12, 31, 23, 59, 59, 999000, tzinfo=dt.UTC)
    with pytest.raises(ConfigError, match=r"INVALID_OPTION.*pruneColumn and pruneBefore are for a batch read"):
        DeltaStreamReader(options, CONSUME_RESULTS.spark_schema)


# -- addedAfterVersion: a catch-up that starts after a group's consumed offset (#14: reads flat with age) --


def _added_after(path: str, after: str, version: int | None = None) -> list[str]:
    from retry_engine.delta.source import DeltaBatchReader

    options = {"path": path, "addedAfterVersion": after}
    if version is not None:
        options["versionAsOf"] = str(version)
    reader = DeltaBatchReader(SourceOptions.parse(options), CONSUME_RESULTS.spark_schema)
    return sorted(m for part in reader.partitions() for b in reader.read(part) for m in b.column("msg_id").to_pylist())


def test_added_after_version_reads_the_rows_committed_since_and_what_a_compaction_rewrote_with_them(tmp_path: Path) -> None:
    """Of the snapshot, the files commits after the version added: every row committed since; a compaction's
    file holds rows committed before too (read again: a superset is safe, a row left out would be lost)."""
    from deltalake import DeltaTable

    path = _table_of_commits(tmp_path, [2, 2, 2])  # version 0: the table; 1-3: C0, C1, C2
    assert _added_after(path, "1") == ["C1-0", "C1-1", "C2-0", "C2-1"]
    assert _added_after(path, "2") == ["C2-0", "C2-1"]
    assert _added_after(path, "3") == [] and _added_after(path, "99") == []
    assert _added_after(path, "2", version=2) == []  # as of version 2: nothing after it
    assert len(_added_after(path, "0")) == 6
    DeltaTable(path).optimize.compact()  # version 4: one file of all six rows (dataChange false)
    append_arrow(path, results_table([Result.of("C4-0")]))  # version 5
    assert _added_after(path, "4") == ["C4-0"]
    everything = sorted([f"C{c}-{i}" for c in range(3) for i in range(2)] + ["C4-0"])
    assert _added_after(path, "3") == everything  # the rewrite holds C2's rows: the whole file is read
    assert _added_after(path, "2", version=3) == ["C2-0", "C2-1"]  # as of before the compaction


def test_added_after_a_commit_the_log_no_longer_holds_is_a_clear_error(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    path = _table_of_commits(tmp_path, [1, 1, 1])
    DeltaTable(path).create_checkpoint()
    for version in (0, 1, 2):
        (Path(path) / "_delta_log" / f"{version:020d}.json").unlink()
    assert _added_after(path, "2") == ["C2-0"]
    with pytest.raises(DeltaSourceError, match=r"DELTA_COMMIT_MISSING.*commit 2 .* is missing"):
        _added_after(path, "1")


@pytest.mark.parametrize("value", ["-1", "1.5", "one", "\u00b2", "1e3", " 0x1 "])
def test_a_bad_added_after_version_is_a_clear_error(value: str) -> None:
    with pytest.raises(ConfigError, match=rf"INVALID_OPTION.*addedAfterVersion={value.strip()!r} must be a version"):
        SourceOptions.parse({"path": "/t", "addedAfterVersion": value})


def test_added_after_version_is_for_a_batch_read() -> None:
    options = SourceOptions.parse({"path": "/t", "addedAfterVersion": "3"})
    assert options.added_after_version == 3
    with pytest.raises(ConfigError, match=r"INVALID_OPTION.*addedAfterVersion is for a batch read"):
        DeltaStreamReader(options, CONSUME_RESULTS.spark_schema)


def test_added_after_version_finds_files_under_partition_values_the_log_url_encodes(tmp_path: Path) -> None:
    """The log names ``consumer_group=a%20b%25c/...``; delta-rs's snapshot may name it decoded: both are one file."""
    import pyarrow as pa

    from retry_engine.delta.source import DeltaBatchReader
    from retry_engine.schemas import RETRY

    path = str(tmp_path / "retry")
    ensure_table(path, RETRY.arrow_schema, partition_by=RETRY.partition_by)

    def append(msg_id: str, group: str) -> None:
        row = {"msg_id": msg_id, "topic": f"%RETRY%{group}", "consumer_group": group, "queue_id": 0,
               "reconsume_times": 1, "origin_msg_id": "O", "retry_topic": "orders", "body": b"r",
               "store_timestamp": dt.datetime(2026, 11, 29, tzinfo=dt.UTC), "delivery_key": f"{msg_id}:1"}
        write_deltalake(path, pa.Table.from_pylist([row], schema=RETRY.arrow_schema), mode="append")

    append("R1", "a b%c")
    append("R2", "a b%c/é")
    append("R3", "plain")
    reader = DeltaBatchReader(SourceOptions.parse({"path": path, "addedAfterVersion": "1"}), RETRY.spark_schema)
    ids = sorted(m for part in reader.partitions() for b in reader.read(part) for m in b.column("msg_id").to_pylist())
    assert ids == ["R2", "R3"]
