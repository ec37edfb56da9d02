"""Table maintenance on real Delta tables, without Spark (#14 part 1).

Compaction must change no data (Delta OPTIMIZE: ``dataChange=false``, so the
deltars stream skips it), lose no concurrent append, and vacuum must never
delete a file a live snapshot references. Log cleanup must leave a new
stream able to start (from the log checkpoint) and give a lagging stream a
clear error naming the option that skips ahead.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import CommitProperties, Transaction

from retry_engine.config import (
    minimum_retention_hours,
    parse_config,
    parse_retention_hours,
)
from retry_engine.core.lease import STATE_DIR, BatchRecord, LakeLease, Owner, read_state
from retry_engine.core.metrics import DELIVERED, EXPIRED
from retry_engine.core.totals import Totals
from retry_engine.delta._files import FileToRead, read_file
from retry_engine.delta._log import EXPIRED_BEFORE_APP, DeltaLog, TableLocation, expired_before
from retry_engine.delta._offsets import ChangeRules, Offset, files_after
from retry_engine.delta.tables import append_arrow, ensure_table
from retry_engine.errors import ConfigError, DeltaSourceError
from retry_engine.ops import maintenance, status
from retry_engine.ops.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, main
from retry_engine.ops.maintenance import (
    EXPIRED_LOG_CLEANUP,
    MAINTAINED_TABLES,
    RECORD_TABLE,
    EngineMaintenance,
    TimeWindow,
    _Due,
    compaction_window,
    expire_rows,
    maintain_table,
    maintenance_path,
    retention_hours,
    run_maintenance,
    select_tables,
)
from retry_engine.ops.monitor import ensure_progress_table
from retry_engine.ops.plots import read_plot_data
from retry_engine.ops.status import lake_counts
from retry_engine.schemas import CONSUME_RESULTS, MESSAGES, METRICS, OUTCOMES, PROGRESS, RETRY
from tests.builders import Result, message_rows, outcome_rows, results_table, retry_rows
from tests.lakehouse import wait_for

WEEK = 168


def append(path: Path, start: int, n: int = 1) -> None:
    write_deltalake(
        str(path), pa.table({"id": pa.array(range(start, start + n), pa.int64())}), mode="append"
    )


def ids(path: Path | str, version: int | None = None) -> list[int]:
    return sorted(
        DeltaTable(str(path), version=version).to_pyarrow_table().column("id").to_pylist()
    )


def small_files_table(path: Path, commits: int = 5) -> list[int]:
    for i in range(commits):
        append(path, 10 * i, 2)
    return ids(path)


def log_actions(path: Path, version: int) -> list[dict[str, Any]]:
    text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def data_files(path: Path) -> set[str]:
    return {name for name in os.listdir(path) if name.endswith(".parquet")}


# --------------------------------------------------------------------------- compaction


def test_compaction_changes_no_data_and_a_stream_past_it_reads_nothing_twice(
    tmp_path: Path,
) -> None:
    """#14 part 1: compaction is one commit whose adds and removes all say dataChange=false, so the
    deltars source (which emits only data-changing adds) skips it; delta-rs, pandas and Polars read
    the same rows before and after; the next append is the only thing the stream reads next."""
    table = tmp_path / "t"
    before = small_files_table(table)
    pandas_before = sorted(DeltaTable(str(table)).to_pandas()["id"].tolist())
    stream_at = Offset.after_version(DeltaTable(str(table)).version(), None)

    report = maintain_table("t", str(table), retention_hours=WEEK)

    assert (
        report.files_before,
        report.files_after,
        report.files_compacted,
        report.files_written,
    ) == (5, 1, 5, 1)
    assert report.version_before == 4 and report.version_after == 5 and report.error is None
    actions = log_actions(table, 5)
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert len(changes) == 6 and all(change["dataChange"] is False for change in changes)
    assert ids(table) == before
    assert sorted(DeltaTable(str(table)).to_pandas()["id"].tolist()) == pandas_before == before
    try:
        import polars as pl
    except ImportError:
        pass  # Polars comes with another change; the lead checks this line once it is there
    else:
        assert sorted(pl.read_delta(str(table))["id"].to_list()) == before

    delta_log = DeltaLog(TableLocation(str(table)))
    assert list(files_after(delta_log, stream_at, through_version=5, rules=ChangeRules())) == []
    append(table, 1000)
    new = list(files_after(delta_log, stream_at, through_version=6, rules=ChangeRules()))
    assert [(f.version, f.index) for f in new] == [(6, 0)]


def test_a_compacted_file_keeps_row_groups_a_time_bounded_read_can_skip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#14: compaction writes row groups of COMPACTED_ROW_GROUP_ROWS (the engine's own size; delta-rs's
    default is a million rows), so `status`'s window over the due times of a compacted month of
    outcomes still skips most of it by the row groups' statistics."""
    monkeypatch.setattr(maintenance, "COMPACTED_ROW_GROUP_ROWS", 1_000)
    table = tmp_path / "t"
    for start in range(0, 5_000, 1_000):
        append(table, start, 1_000)
    maintain_table("t", str(table), retention_hours=WEEK)
    (compacted,) = DeltaTable(str(table)).file_uris()
    meta = pq.ParquetFile(compacted).metadata
    assert meta.num_rows == 5_000 and [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [1_000] * 5
    # Compressed as delta-rs compacts by default (passing row groups alone made the files uncompressed).
    assert {meta.row_group(g).column(0).compression for g in range(meta.num_row_groups)} == {"ZSTD"}
    assert ids(table) == list(range(5_000))


def test_a_dry_run_counts_small_files_a_compaction_would_rewrite_per_partition(tmp_path: Path) -> None:
    """#14 part 1: `maintain --dry-run` reports the files of partitions holding two or more small files;
    a partition's lone small file (here "b") is left as it is, and a null partition value is a
    partition of its own."""
    table = str(tmp_path / "t")
    for group in ["a", "a", "a", "b", None, None]:
        write_deltalake(table, pa.table({"g": pa.array([group], pa.string()), "x": [1]}),
                        mode="append", partition_by=["g"])
    report = maintain_table("t", table, retention_hours=WEEK, dry_run=True)
    assert (report.files_before, report.files_compacted) == (6, 5)
    assert DeltaTable(table).version() == 5  # nothing committed


def test_a_concurrent_append_during_compaction_is_not_lost(tmp_path: Path) -> None:
    """#14 part 1: a writer appending while maintenance compacts the same table loses no row and
    duplicates none (appends never conflict with a dataChange=false rewrite; other conflicts retry)."""
    table = tmp_path / "t"
    small_files_table(table, commits=10)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(200, 240):
                append(table, i)
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    reports = []
    try:
        while thread.is_alive():
            reports.append(maintain_table("t", str(table), retention_hours=WEEK))
    finally:
        thread.join()
    reports.append(maintain_table("t", str(table), retention_hours=WEEK))
    assert errors == []
    assert [r.error for r in reports] == [None] * len(reports)
    assert sum(r.files_compacted for r in reports) >= 10
    assert ids(table) == sorted(
        [*(x for i in range(10) for x in (10 * i, 10 * i + 1)), *range(200, 240)]
    )


def test_a_compaction_that_conflicts_with_a_delete_is_redone_never_failing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """#14 part 1: a writer that removes files compaction read (a DLQ purge, say) makes delta-rs refuse
    the compaction's commit; maintenance logs it, compacts again on the new version and reports no
    error, and the table holds exactly what the other writer left."""
    table = tmp_path / "t"
    for i in range(10):
        append(table, i)
    stop = threading.Event()
    deleted: list[int] = []
    added: list[int] = []

    def other_writer() -> None:
        k = 0
        while not stop.is_set():
            k += 1
            try:
                DeltaTable(str(table)).delete(f"id = {k % 10}")
                deleted.append(k % 10)
            except CommitFailedError:  # it lost to the compaction: its own business to retry
                pass
            append(table, 1000 + k)
            added.append(1000 + k)

    thread = threading.Thread(target=other_writer)
    thread.start()
    reports = []
    try:
        for _ in range(300):  # until a conflict happened (a few runs, usually)
            reports.append(maintain_table("t", str(table), retention_hours=WEEK))
            if "compaction conflicted" in caplog.text:
                break
    finally:
        stop.set()
        thread.join()
    assert "compaction conflicted" in caplog.text
    assert [r.error for r in reports] == [None] * len(reports)
    assert ids(table) == sorted([i for i in range(10) if i not in deleted] + added)


# --------------------------------------------------------------------------- vacuum


def test_vacuum_never_deletes_a_file_a_live_snapshot_or_a_running_batch_needs(
    tmp_path: Path,
) -> None:
    """#14 part 1: with the default retention (7 days) a reader holding the pre-compaction snapshot
    still reads every row; files no commit references (a running batch's files, not committed yet)
    survive even a forced zero retention, which does delete the compacted-away files."""
    table = tmp_path / "t"
    before = small_files_table(table)
    old = DeltaTable(str(table))
    old_version = old.version()
    in_flight = table / "part-in-flight.parquet"
    pq.write_table(pa.table({"id": pa.array([7], pa.int64())}), in_flight)
    os.utime(in_flight, (1, 1))  # as old as it gets: age alone never makes it vacuumable

    report = maintain_table("t", str(table), retention_hours=WEEK)
    assert report.files_vacuumed == 0
    assert sorted(old.to_pyarrow_table().column("id").to_pylist()) == before
    assert ids(table, version=old_version) == before

    forced = maintain_table("t", str(table), retention_hours=0)
    assert forced.files_vacuumed == 5
    assert in_flight.exists()
    assert ids(table) == before
    assert len(data_files(table)) == 2  # the compacted file and the in-flight one


def test_a_stream_behind_a_forced_vacuum_is_told_compaction_removed_its_files(
    tmp_path: Path,
) -> None:
    """#14 part 1: a stream that had not read commits 2-4 when maintenance compacted them and a forced
    zero retention vacuumed the originals fails with DELTA_FILE_MISSING naming compaction and the
    option to start past them, not blaming a DELETE that never happened."""
    table = tmp_path / "t"
    small_files_table(table)
    behind = Offset.after_version(1, None)
    maintain_table("t", str(table), retention_hours=0)
    delta_log = DeltaLog(TableLocation(str(table)))
    unread = list(
        files_after(
            delta_log, behind, through_version=delta_log.latest_version(), rules=ChangeRules()
        )
    )
    assert [f.version for f in unread] == [2, 3, 4]
    fs, root = TableLocation(str(table)).filesystem()
    entry = unread[0]
    file = FileToRead(entry.path, dict(entry.partition_values), entry.version, entry.index, False)
    with pytest.raises(
        DeltaSourceError,
        match=r"DELTA_FILE_MISSING.*compaction.*retry-engine maintain.*starting_version",
    ):
        list(
            read_file(fs, root, file, pa.schema([pa.field("id", pa.int64())]), table_uri=str(table))
        )


# --------------------------------------------------------------------------- log cleanup and the source


TRIALS, COMMITS = 3, 150


def test_two_cleaners_at_once_both_succeed_and_leave_no_expired_commit(tmp_path: Path) -> None:
    """The engine's tables are cleaned by maintenance only, so a `maintain` next to the engine's own cleans
    with it: delta-rs fails whichever deletes second (measured: 7 failures in 5 races of two; with one
    attempt this test fails); each one starts again on what is left."""
    from retry_engine.ops.maintenance import clean_log

    failures = []
    for trial in range(TRIALS):
        path = str(tmp_path / f"t{trial}")
        row = pa.table({"a": [1]})
        DeltaTable.create(
            path,
            row.schema,
            configuration={
                "delta.logRetentionDuration": "interval 0 seconds",
                EXPIRED_LOG_CLEANUP: "false",
                "delta.checkpointInterval": "1000",
            },
        )
        handle = DeltaTable(path)
        for _ in range(COMMITS):
            write_deltalake(handle, row, mode="append")
        handle.create_checkpoint()
        errors: list[BaseException] = []

        def clean(where: str = path, into: list[BaseException] = errors) -> None:
            try:
                clean_log(where)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                into.append(exc)

        threads = [threading.Thread(target=clean) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failures += errors
        commits = [n for n in os.listdir(Path(path) / "_delta_log") if n.endswith(".json")]
        assert min(commits) == f"{COMMITS:020d}.json" and DeltaTable(path).to_pyarrow_table().num_rows == COMMITS
    assert failures == []


def test_log_cleanup_a_new_stream_starts_from_the_checkpoint_and_a_lagging_one_is_told_how_to_skip(
    tmp_path: Path,
) -> None:
    """#14 part 1: after maintenance removed old log files, a new stream (snapshot of the latest
    version) loads from the log checkpoint; a stream still at an old commit, or inside an old
    snapshot, fails with DELTA_COMMIT_MISSING naming the first commit kept and startingVersion."""
    table = tmp_path / "t"
    before = small_files_table(table)
    DeltaTable(str(table)).alter.set_table_properties(
        # Writers told not to clean the log: maintenance does (see the tests after this one).
        {"delta.logRetentionDuration": "interval 0 seconds", EXPIRED_LOG_CLEANUP: "false"}
    )
    lagging = Offset.after_version(1, None)
    inside_old_snapshot = Offset(1, 0, True, None)

    report = maintain_table("t", str(table), retention_hours=WEEK)
    assert report.error is None and report.checkpoint_version is not None
    checkpoint = report.checkpoint_version
    assert not (table / "_delta_log" / f"{0:020d}.json").exists()

    delta_log = DeltaLog(TableLocation(str(table)))
    assert delta_log.earliest_commit() == checkpoint
    latest = delta_log.latest_version()
    fresh = list(
        files_after(
            delta_log, Offset(latest, -1, True, None), through_version=latest, rules=ChangeRules()
        )
    )
    assert sum(pq.read_metadata(table / f.path).num_rows for f in fresh) == len(before)
    for stuck in (lagging, inside_old_snapshot):
        with pytest.raises(
            DeltaSourceError,
            match=rf"DELTA_COMMIT_MISSING.*log now starts at commit {checkpoint}.*logRetentionDuration"
            rf".*startingVersion={checkpoint}.*starting_version = {checkpoint}",
        ):
            list(
                files_after(
                    DeltaLog(TableLocation(str(table))),
                    stuck,
                    through_version=latest,
                    rules=ChangeRules(),
                )
            )


@pytest.mark.parametrize(
    ("setting", "maintenance_cleans"),
    [(None, False), ("true", False), ("FALSE ", True), ("false", True), ("", False), ("no", False)],
)
def test_log_cleanup_is_left_to_the_writers_unless_the_table_tells_them_not_to(
    tmp_path: Path, setting: str | None, maintenance_cleans: bool
) -> None:
    """Delta's default: writers clean the log at their checkpoints; a second cleaner races them."""
    table = tmp_path / "t"
    small_files_table(table)
    settings = {"delta.logRetentionDuration": "interval 0 seconds"}
    if setting is not None:
        settings[EXPIRED_LOG_CLEANUP] = setting
    DeltaTable(str(table)).alter.set_table_properties(settings)
    report = maintain_table("t", str(table), retention_hours=WEEK)
    assert report.error is None and report.checkpoint_version is not None
    assert (table / "_delta_log" / f"{0:020d}.json").exists() is not maintenance_cleans


def test_maintenance_runs_no_log_cleanup_beside_a_writer_that_cleans_its_own_log(tmp_path: Path) -> None:
    """Soak S4: a producer's append raised FileNotFoundError after its commit landed (delta-rs's
    post-commit log cleanup racing the engine's maintenance of consume_results); a producer that
    retries it appends its rows twice. Writers here clean at every 2nd commit, keeping 3 s of log."""
    table = tmp_path / "t"
    write_deltalake(
        str(table),
        pa.table({"id": pa.array([0], pa.int64())}),
        configuration={"delta.logRetentionDuration": "interval 3 seconds", "delta.checkpointInterval": "2"},
    )
    stop = threading.Event()
    appended: list[int] = []
    failed: list[tuple[int, str]] = []

    def produce() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                append(table, i)
                appended.append(i)
            except Exception as exc:
                failed.append((i, f"{type(exc).__name__}: {exc}"))

    producer = threading.Thread(target=produce)
    producer.start()
    reports = []
    try:
        # 40 runs beside more than 50 appends (a count of runs alone depends on the two threads' speeds).
        deadline = time.monotonic() + 300
        while (len(reports) < 40 or len(appended) <= 50) and time.monotonic() < deadline:
            reports.append(maintain_table("t", str(table), retention_hours=WEEK))
    finally:
        stop.set()
        producer.join()
    # Maintenance ran no log cleanup to race the producer's (without the fix: 2 of 3 runs failed
    # here or on a producer's append). At a 3 s retention a snapshot older than that can still miss
    # a file, for the producer as for a compaction: reported, never a lost or doubled row.
    assert [r.error for r in reports if r.error and "log cleanup" in r.error] == []
    rows = ids(table)
    assert len(rows) == len(set(rows)) and set(appended) <= set(rows) and len(appended) > 50
    assert set(rows) - {0, *appended} <= {i for i, _ in failed}


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("text", "hours"), [("0", 0), ("0h", 0), ("1h", 1), ("7d", 168), ("168h", 168)]
)
def test_retention_is_whole_hours_or_days(text: str, hours: int) -> None:
    assert parse_retention_hours(text) == hours


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " ",
        "-1d",
        "-0",
        "1.5h",
        "90m",
        "3600s",
        "7 days",
        "d",
        "abc",
        "1e3h",
        "99999999999d",
        7,
        None,
        True,
    ],
)
def test_a_retention_that_is_not_whole_hours_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"INVALID_RETENTION.*retention"):
        parse_retention_hours(bad)


def test_the_retention_floor_is_the_longest_trigger_plus_the_maintenance_interval() -> None:
    """#14 part 1: refuse less than the longest trigger + maintenance interval, unless forced."""
    default = parse_config({})
    assert (
        minimum_retention_hours(default.engine, default.maintenance) == 2
    )  # 1s trigger + 1h, rounded up
    by_batches = parse_config(
        {
            "engine": {"trigger_interval": "1m"},
            "maintenance": {"interval": "off", "every_batches": 90},
        }
    )
    assert (
        minimum_retention_hours(by_batches.engine, by_batches.maintenance) == 2
    )  # 1m + 90 x 1m = 91m
    off = parse_config(
        {"engine": {"trigger_interval": "2h"}, "maintenance": {"engine_tables": False}}
    )
    assert minimum_retention_hours(off.engine, off.maintenance) == 2
    assert retention_hours(default, "2h") == 2
    with pytest.raises(ConfigError, match=r"RETENTION_TOO_SHORT.*'1h'.*2h.*--force"):
        retention_hours(default, "1h")
    assert retention_hours(default, "0", force=True) == 0
    with pytest.raises(ConfigError, match="INVALID_RETENTION"):
        retention_hours(default, "-1h", force=True)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"every_batches": -1}, "every_batches"),
        ({"every_batches": "5"}, "every_batches"),
        ({"every_batches": 2.5}, "every_batches"),
        ({"interval": "0s"}, "interval"),
        ({"interval": "soon"}, "interval"),
        ({"interval": "off"}, "never trigger"),
        ({"engine_tables": "yes"}, "engine_tables"),
        ({"messages": "yes"}, "messages"),
        ({"messages": 1}, "messages"),
        ({"engine_tables": False, "messages": True, "interval": "off"}, "never trigger"),
        ({"retention": "1h"}, "shorter than the 2h"),
        ({"retention": "-7d"}, "INVALID_RETENTION"),
        ({"tables": ["retry"]}, "unknown key 'maintenance.tables'"),
    ],
)
def test_hostile_maintenance_settings_are_refused_on_load(
    section: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"maintenance": section})


def test_maintenance_is_on_for_the_engine_tables_and_off_for_consume_results_by_default() -> None:
    section = parse_config({}).maintenance
    assert (
        section.engine_tables,
        section.consume_results,
        section.interval,
        section.every_batches,
    ) == (True, False, "1h", 0)
    assert section.retention == "7d"


@pytest.mark.parametrize("engine_tables, consume_results, warned", [(True, False, False), (False, True, True), (False, False, True)])
def test_the_engine_warns_when_nothing_maintains_its_tables(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, engine_tables: bool, consume_results: bool, warned: bool
) -> None:
    """The engine's writers leave expired log files to maintenance (storage.TABLE_PROPERTIES): without it, say so."""
    from retry_engine.ops import maintenance

    config = parse_config(
        {"engine": {"lake": str(tmp_path)}, "maintenance": {"engine_tables": engine_tables, "consume_results": consume_results}}
    )

    def writer(batch: object, batch_id: int) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="retry_engine.ops.maintenance"):
        wrapped = maintenance.attach(config, "q-warn", writer)
    try:
        assert ("run `retry-engine maintain` regularly" in caplog.text) is warned
        assert (wrapped is writer) is (not engine_tables and not consume_results)
    finally:
        maintenance.detach("q-warn")


def test_due_every_n_batches_or_after_the_interval_whichever_first() -> None:
    due = _Due(every_batches=3, interval_ms=60_000, since_ms=0)
    due.batches = 2
    assert not due.due(59_999)
    due.batches = 3
    assert due.due(10)
    due.reset(100)
    assert not due.due(100) and due.due(60_100)
    assert not _Due(every_batches=0, interval_ms=None).due(10**12)


def test_the_engine_tables_consume_results_and_messages_are_maintained(tmp_path: Path) -> None:
    config = parse_config({"engine": {"lake": str(tmp_path)}})
    assert [n for n, _ in select_tables(config)] == list(MAINTAINED_TABLES)
    assert {"consume_results", "messages", "retry", "dlq"} <= set(MAINTAINED_TABLES)
    assert select_tables(config, ["dlq", "dlq"]) == [("dlq", str(tmp_path / "dlq"))]
    with pytest.raises(ConfigError, match=r"UNKNOWN_TABLE.*'nope'"):
        select_tables(config, ["nope"])


def test_the_producers_messages_table_is_compacted_and_a_consumers_stream_sees_each_row_once(tmp_path: Path) -> None:
    """#14 (months on a lake): a producer commits once a send, and nothing compacted or checkpointed the
    messages table, so every consumer batch opened a table of ever more files. `maintain` covers it now
    (in the engine with `[maintenance] messages = true`): a stream that read part of it before the
    compaction reads the rest after it, each message once."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

    from retry_engine.clients.producer import Message, Producer
    from retry_engine.delta.source import DeltaStreamReader, SourceOptions
    from retry_engine.schemas import MESSAGES

    config = parse_config({"engine": {"lake": str(tmp_path)}})
    path = config.table_path("messages")
    producer = Producer(path)
    sent = [producer.send_batch([Message("orders", f"m{i}".encode())]).msg_ids[0] for i in range(12)]
    reader = DeltaStreamReader(SourceOptions.parse({"path": path}), MESSAGES.spark_schema)

    def read(start: Any, end: Any) -> list[str]:
        return [m for part in reader.partitions(start, end) for b in reader.read(part) for m in b.column("msg_id").to_pylist()]

    start = reader.initialOffset()
    middle = reader.latestOffset(start, ReadMaxFiles(5))
    before = read(start, middle)
    (report,) = run_maintenance(config, tables=["messages"])
    assert report.files_before == 12 and report.files_after == 1 and report.files_compacted == 12
    sent += [producer.send_batch([Message("orders", f"n{i}".encode())]).msg_ids[0] for i in range(3)]
    after = read(middle, reader.latestOffset(middle, ReadAllAvailable()))
    assert len(before) == 5 and sorted(before + after) == sorted(sent)
    on = parse_config({"engine": {"lake": str(tmp_path)}, "maintenance": {"messages": True, "engine_tables": False}})
    assert maintenance.engine_tables_to_maintain(on) == ["messages"]
    assert "messages" not in maintenance.engine_tables_to_maintain(parse_config({}))
    with pytest.raises(ConfigError, match=r"UNKNOWN_TABLE.*'../etc'.*consume_results"):
        select_tables(config, ["../etc"])


def test_in_engine_maintenance_never_commits_inside_a_batch(tmp_path: Path) -> None:
    """#14 part 1: the engine's writer runs each batch under the maintenance lock, so a maintenance
    run that starts while a batch is committing lands wholly before or after the batch's commits;
    batches are counted towards every_batches and the run is recorded as trigger 'engine'."""
    config = parse_config({"engine": {"lake": str(tmp_path)}, "maintenance": {"every_batches": 2}})
    outcomes = tmp_path / "outcomes"
    small_files_table(outcomes)
    maintenance = EngineMaintenance(config)
    runner = threading.Thread(target=maintenance.run_now)
    batch_versions: list[int] = []

    def batch(frame: list[int], batch_id: int) -> None:
        if batch_id == 0:
            since = maintenance._due.since_ms
            runner.start()
            # The run has counted its start (it then waits for this batch): batch 0 counts towards the next.
            wait_for(lambda: maintenance._due.since_ms != since, what="the run to start")
        for value in frame:
            append(outcomes, value)
            batch_versions.append(DeltaTable(str(outcomes)).version())

    write = maintenance.wrap(batch)
    try:
        write(list(range(500, 520)), 0)
    finally:
        runner.join()
    write([600], 1)
    assert batch_versions[:20] == list(range(batch_versions[0], batch_versions[0] + 20))
    history = {h["version"]: h["operation"] for h in DeltaTable(str(outcomes)).history()}
    optimize = [v for v, op in history.items() if op == "OPTIMIZE"]
    assert len(optimize) == 1 and not batch_versions[0] <= optimize[0] <= batch_versions[19]
    assert maintenance._due.batches == 2 and maintenance._due.due(0)
    rows = DeltaTable(maintenance_path(str(tmp_path))).to_pyarrow_table().to_pylist()
    assert [(r["table_name"], r["trigger"], r["error"]) for r in rows] == [
        ("outcomes", "engine", None)
    ]


# --------------------------------------------------------------------------- the command


def small_lake(root: Path) -> None:
    for name in ("outcomes", "consume_results"):
        small_files_table(root / name, commits=4)


def test_maintain_prints_and_records_what_it_did_per_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#14 part 1: per table files before/after, bytes, versions; one _maintenance row per table."""
    lake = tmp_path / "lake"
    small_lake(lake)
    assert main(["maintain", "--lake", str(lake), "--dry-run"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "dry run" in out and "outcomes" in out and "would compact 4 small files" in out
    assert (
        DeltaTable(str(lake / "outcomes")).version() == 3 and not (lake / "_maintenance").exists()
    )

    assert main(["maintain", "--lake", str(lake)]) == EXIT_OK
    out = capsys.readouterr().out
    for name in ("outcomes", "consume_results"):
        assert f"{name}" in out
    assert out.count("files 4 -> 1") == 2 and "version 3 -> 4" in out
    assert "retry" in out and "no table at" in out
    # The record this first run creates is not reported as a table it skipped.
    assert RECORD_TABLE not in out
    rows = DeltaTable(maintenance_path(str(lake))).to_pyarrow_table().to_pylist()
    assert sorted(r["table_name"] for r in rows) == ["consume_results", "outcomes"]
    assert {
        (r["files_before"], r["files_after"], r["trigger"], r["retention_hours"]) for r in rows
    } == {(4, 1, "command", 168)}
    assert len({r["run_id"] for r in rows}) == 1

    assert main(["maintain", "--lake", str(lake), "--table", "outcomes"]) == EXIT_OK
    assert "consume_results" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--table", "unknown"], EXIT_USAGE, "invalid choice: 'unknown'"),
        (["--table", "progres"], EXIT_USAGE, "invalid choice: 'progres'"),
        (["--table", "_engine_state"], EXIT_USAGE, "invalid choice: '_engine_state'"),
        (["--retention", "0"], EXIT_ERROR, "RETENTION_TOO_SHORT"),
        (["--retention", "1h"], EXIT_ERROR, "RETENTION_TOO_SHORT"),
        (["--retention=-1d"], EXIT_ERROR, "INVALID_RETENTION"),
        (["--retention=-1d", "--force"], EXIT_ERROR, "INVALID_RETENTION"),
        (["--retention", "garbage"], EXIT_ERROR, "INVALID_RETENTION"),
        (["--retention", ""], EXIT_ERROR, "INVALID_RETENTION"),
    ],
)
def test_maintain_refuses_hostile_arguments_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    lake = tmp_path / "lake"
    small_lake(lake)
    try:
        got = main(["maintain", "--lake", str(lake), *args])
    except SystemExit as exc:  # argparse's own usage errors
        got = int(exc.code or 0)
    assert got == code
    assert message in capsys.readouterr().err
    assert DeltaTable(str(lake / "outcomes")).version() == 3


def test_maintain_on_a_lake_with_no_tables_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["maintain", "--lake", str(tmp_path / "empty")]) == EXIT_USAGE
    assert "no lake at" in capsys.readouterr().err
    assert main(["maintain", "--lake", str(tmp_path / "missing")]) == EXIT_USAGE
    assert not (tmp_path / "missing").exists()


def test_the_maintenance_record_is_maintained_too_so_months_of_runs_stay_bounded(
    tmp_path: Path,
) -> None:
    """#14 part 1: every run appends to ``_maintenance``; a run that maintains an engine table also
    compacts, checkpoints and cleans that record, and records doing so. A run over consume_results
    only leaves it alone."""
    small_lake(tmp_path)
    config = parse_config({"engine": {"lake": str(tmp_path)}})
    record = maintenance_path(str(tmp_path))
    for run in range(6):
        reports = run_maintenance(config, tables=["outcomes"])
        assert [r.table_name for r in reports] == ["outcomes", RECORD_TABLE]
        assert reports[1].missing == (run == 0) and reports[1].error is None
    table = DeltaTable(record)
    assert table.version() > 6  # six appends plus the maintenance commits
    # Compacted at each run: the files appended since the last run, at most, beside one big file.
    assert len(table.file_uris()) <= 2
    assert (Path(record) / "_delta_log" / "_last_checkpoint").exists()
    rows = table.to_pyarrow_table().to_pylist()
    assert sorted(r["table_name"] for r in rows) == [RECORD_TABLE] * 5 + ["outcomes"] * 6
    assert all(r["error"] is None for r in rows)

    before = DeltaTable(record).version()
    run_maintenance(config, tables=["consume_results"])
    assert DeltaTable(record).version() == before + 1  # only the run's own row


def test_an_engine_that_stops_does_not_wait_for_the_remaining_tables(tmp_path: Path) -> None:
    """#14 part 1: in-engine maintenance asks before each table whether the engine is stopping; the
    tables it did not reach are left as they were, for the next run."""
    small_lake(tmp_path)
    config = parse_config({"engine": {"lake": str(tmp_path)}})
    asked: list[int] = []

    def stopping() -> bool:
        asked.append(1)
        return len(asked) > 1

    reports = run_maintenance(config, tables=["consume_results", "outcomes"], stopping=stopping)
    assert [r.table_name for r in reports] == ["consume_results"]
    assert DeltaTable(str(tmp_path / "consume_results")).version() == 4
    assert DeltaTable(str(tmp_path / "outcomes")).version() == 3


# --------------------------------------------------------------------------- progress retention

DAY = dt.timedelta(days=1)


def progress_rows(run: str, times: list[dt.datetime], first_batch: int = 0) -> pa.Table:
    rows = [
        {**dict.fromkeys(PROGRESS.names), "query_id": "q", "run_id": run, "event": "progress",
         "batch_id": first_batch + i, "event_time": t, "recorded_at": t, "batch_duration_ms": 100}
        for i, t in enumerate(times)
    ]
    return pa.Table.from_pylist(rows, schema=PROGRESS.arrow_schema)


def progress_lake(root: Path, now: dt.datetime) -> dict[str, list[int]]:
    """A progress table of five appends: two 40 and 35 days old, one file straddling 31 days and an hour,
    one 40 days old without statistics, and the last hour's. The batch ids of each."""
    path = str(root / "progress")
    ensure_progress_table(path)
    files = {
        "old": [now - 40 * DAY, now - 40 * DAY + dt.timedelta(seconds=1)],
        "older": [now - 35 * DAY],
        "straddling": [now - 31 * DAY, now - dt.timedelta(hours=1)],
        "no statistics": [now - 40 * DAY],
        "recent": [now - dt.timedelta(seconds=s) for s in (3, 2, 1)],
    }
    batches, first = {}, 0
    for name, times in files.items():
        if name == "no statistics":
            DeltaTable(path).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": "0"})
        append_arrow(path, progress_rows("run-1", times, first))
        if name == "no statistics":
            DeltaTable(path).alter.set_table_properties({"delta.dataSkippingNumIndexedCols": "32"})
        batches[name] = list(range(first, first + len(times)))
        first += len(times)
    return batches


def batch_ids(path: str) -> list[int]:
    return sorted(DeltaTable(path).to_pyarrow_table().column("batch_id").to_pylist())


def test_progress_rows_past_the_retention_go_in_whole_files_and_status_judges_the_run_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """#14 (months on a lake): the progress table gets a row a micro-batch (2.6 million a month at a 1 s
    trigger). `maintain` removes the files whose rows are all older than `progress_retention` (30 days by
    default), by their statistics; a file with a newer row, or without statistics, stays. The dry run
    says so and changes nothing; `status` judges the run as before; a second run removes nothing."""
    now = dt.datetime.now(dt.UTC)
    batches = progress_lake(tmp_path, now)
    path = str(tmp_path / "progress")
    config = parse_config({"engine": {"lake": str(tmp_path), "trigger_interval": "1s"}})
    judged = status.status(config, now=now)
    version = DeltaTable(path).version()

    assert main(["maintain", "--lake", str(tmp_path), "--table", "progress", "--dry-run"]) == EXIT_OK
    assert "would expire 2 files (3 rows)" in capsys.readouterr().out
    assert DeltaTable(path).version() == version

    [report, _] = run_maintenance(config, tables=["progress"])
    assert (report.files_expired, report.rows_expired, report.error) == (2, 3, None)
    kept = sorted(batches["straddling"] + batches["no statistics"] + batches["recent"])
    assert batch_ids(path) == kept
    after = status.status(config, now=now)
    assert (after.state, after.last_batch, after.last_event_at) == (judged.state, judged.last_batch, judged.last_event_at)
    assert after.state == "running" and after.last_batch is not None and after.last_batch.batch_id == kept[-1]
    recorded = DeltaTable(maintenance_path(str(tmp_path))).to_pyarrow_table().to_pylist()
    assert [(r["table_name"], r["files_expired"], r["rows_expired"]) for r in recorded] == [("progress", 2, 3)]
    commits = [a for a in log_actions(tmp_path / "progress", version + 1) if "remove" in a]
    assert len(commits) == 2 and all(a["remove"]["dataChange"] for a in commits)

    [again, _] = run_maintenance(config, tables=["progress"])
    assert (again.files_expired, again.rows_expired) == (0, 0) and batch_ids(path) == kept
    # A longer retention, or "off", keeps what is left; the straddling file goes once its last row is old.
    off = parse_config({"engine": {"lake": str(tmp_path)}, "maintenance": {"progress_retention": "off"}})
    assert run_maintenance(off, tables=["progress"])[0].files_expired == 0
    later = run_maintenance(config, tables=["progress"])  # within the hour: the straddling file stays
    assert later[0].files_expired == 0 and batch_ids(path) == kept


@pytest.mark.parametrize("race", ["append", "compaction"])
def test_rows_expire_beside_a_concurrent_append_and_after_a_conflicting_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, race: str
) -> None:
    """#14 part 1 (a conflict is retried, never fatal): a commit that lands between the expiry's plan and
    its commit makes it plan again. A writer's append is kept; after a compaction that removed the
    planned files first, the compacted file (rows as old) goes instead, and the count is its rows, once."""
    now = dt.datetime.now(dt.UTC)
    path = str(tmp_path / "progress")
    ensure_progress_table(path)
    for i in range(3):
        append_arrow(path, progress_rows("run-1", [now - (40 - i) * DAY], first_batch=i))
    planned = maintenance.expiring_files
    calls: list[int] = []

    def racing(table: DeltaTable, column: str, before: dt.datetime, **kw: Any) -> tuple[list[Any], int]:
        plan = planned(table, column, before, **kw)
        calls.append(len(plan[0]))
        if len(calls) == 1 and race == "append":
            append_arrow(path, progress_rows("run-2", [now], first_batch=10))
        elif len(calls) == 1:
            DeltaTable(path).optimize.compact()
        return plan

    monkeypatch.setattr(maintenance, "expiring_files", racing)
    files, rows = maintenance.expire_rows(path, "recorded_at", now - 30 * DAY)
    if race == "append":
        assert calls == [3, 3] and (files, rows) == (3, 3) and batch_ids(path) == [10]
    else:
        assert calls == [3, 1] and (files, rows) == (1, 3) and batch_ids(path) == []


@pytest.mark.parametrize(
    "value, message",
    [("23h", "shorter than a day"), ("0", "not a duration"), ("-30d", "not a duration"), ("1.5d", "not a duration"),
     ("soon", "not a duration"), (30, "valid string"), (True, "valid string"), ("36501d", "more than 100 years"),
     ("9" * 30 + "d", "more than 100 years")],
)
@pytest.mark.parametrize(
    "name, default",
    [("progress_retention", "30d"), ("metrics_retention", "30d"), ("outcomes_retention", "off"),
     ("retry_retention", "off"), ("messages_retention", "off")],
)
def test_a_hostile_row_retention_is_refused_on_load(name: str, default: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"maintenance": {name: value}})
    assert getattr(parse_config({}).maintenance, name) == default


def test_metrics_rows_expire_after_a_marker_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    """#14: the METRICS table's rows past `metrics_retention` go like the progress table's, after a row
    `expired_before` at the cut (the plots' running sums must know, see test_monitoring); a dry run
    counts them and writes nothing; "off" keeps them."""
    now = dt.datetime.now(dt.UTC)
    path = str(tmp_path / "metrics")
    ensure_table(path, METRICS.arrow_schema)
    for i, age in enumerate((40 * DAY, 35 * DAY, dt.timedelta(hours=1))):
        rows = [{**dict.fromkeys(METRICS.names), "batch_id": i, "batch_time": now - age, "consumer_group": "G",
                 "delay_level": 3, "metric": m, "value": 1.0} for m in ("retry", "delivered")]
        append_arrow(path, pa.Table.from_pylist(rows, schema=METRICS.arrow_schema))
    config = parse_config({"engine": {"lake": str(tmp_path)}})
    off = parse_config({"engine": {"lake": str(tmp_path)}, "maintenance": {"metrics_retention": "off"}})
    [dry, _] = run_maintenance(config, tables=["metrics"], dry_run=True)
    assert (dry.files_expired, dry.rows_expired) == (2, 4) and DeltaTable(path).version() == 3
    assert run_maintenance(off, tables=["metrics"], dry_run=True)[0].files_expired == 0
    [report, _] = run_maintenance(config, tables=["metrics"])
    assert (report.files_expired, report.rows_expired, report.error) == (2, 4, None)
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    assert sorted((r["batch_id"], r["metric"]) for r in rows) == [(-1, EXPIRED), (2, "delivered"), (2, "retry")]
    [mark] = [r for r in rows if r["metric"] == EXPIRED]
    assert mark["value"] == 4.0 and now - 31 * DAY < mark["batch_time"] < now - 29 * DAY
    # A later run whose cut is past the marker alone (a file of its own, compacted by windows) leaves it:
    # it goes with the next rows that go, not replaced by a new marker every run.
    version = DeltaTable(path).version()
    later = expire_rows(path, "batch_time", now - 2 * DAY, marked=True)
    assert later == (0, 0) and DeltaTable(path).version() == version
    append_arrow(path, pa.Table.from_pylist([{**rows[0], "batch_id": 7, "metric": "retry", "batch_time": now - 40 * DAY}],
                                            schema=METRICS.arrow_schema))
    assert expire_rows(path, "batch_time", now - 29 * DAY, marked=True) == (2, 2)
    assert [(r["metric"], r["value"]) for r in DeltaTable(path).to_pyarrow_table().to_pylist() if r["metric"] == EXPIRED] == [
        (EXPIRED, 2.0)]


@pytest.mark.parametrize("kind", ["text", "no zone", "null times"])
def test_a_progress_table_another_writer_changed_loses_no_row_it_cannot_date(tmp_path: Path, kind: str) -> None:
    """Bad input (a table written by others): a progress table whose `recorded_at` another writer made
    text or zoneless, or holds nulls, has no file whose statistics say all its rows are old: nothing is
    removed and the run reports no error (compaction still runs)."""
    old = dt.datetime.now(dt.UTC) - 40 * DAY
    times: pa.Array
    if kind == "text":
        times = pa.array([old.isoformat()] * 2)
    elif kind == "no zone":
        times = pa.array([old.replace(tzinfo=None)] * 2, pa.timestamp("us"))
    else:
        times = pa.array([old, None], pa.timestamp("us", tz="UTC"))
    for _ in range(2):
        write_deltalake(str(tmp_path / "progress"), pa.table({"run_id": ["r", "r"], "recorded_at": times}), mode="append")
    config = parse_config({"engine": {"lake": str(tmp_path)}})
    [report, _] = run_maintenance(config, tables=["progress"])
    assert (report.files_expired, report.rows_expired, report.error) == (0, 0, None)
    assert DeltaTable(str(tmp_path / "progress")).to_pyarrow_table().num_rows == 4


def test_two_expiries_at_once_remove_each_file_once_and_both_end_cleanly(tmp_path: Path) -> None:
    """#14 part 1 (a concurrent operator: `maintain` beside the engine's own maintenance, an append
    beside both): two expiries of the same metrics table racing each other and a writer's appends both
    end without error, together remove each old file once (their counts add up to the old rows), and
    every new row stays."""
    now = dt.datetime.now(dt.UTC)
    path = str(tmp_path / "metrics")
    ensure_table(path, METRICS.arrow_schema)

    def rows(first: int, n: int, at: dt.datetime) -> pa.Table:
        return pa.Table.from_pylist(
            [{**dict.fromkeys(METRICS.names), "batch_id": first + i, "batch_time": at, "metric": "retry", "value": 1.0}
             for i in range(n)], schema=METRICS.arrow_schema)

    for i in range(12):
        append_arrow(path, rows(i * 10, 10, now - (40 - i) * DAY))
    barrier = threading.Barrier(3)
    results: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def expire() -> None:
        barrier.wait()
        try:
            results.append(maintenance.expire_rows(path, "batch_time", now - 30 * DAY, marked=True))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def write() -> None:
        barrier.wait()
        for i in range(5):
            append_arrow(path, rows(1000 + i, 1, now))

    threads = [threading.Thread(target=f) for f in (expire, expire, write)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Ten files 40 to 31 days old go; the ones 30 (at the cut) and 29 days old stay.
    assert sum(r for _, r in results) == 100 and sum(f for f, _ in results) >= 1
    kept = DeltaTable(path).to_pyarrow_table()
    assert sorted(b for b in kept["batch_id"].to_pylist() if b >= 0) == [*range(100, 120), *range(1000, 1005)]
    assert set(kept["metric"].to_pylist()) == {"retry", EXPIRED}


# --------------------------------------------------------------------------- the ledger's retention


def test_the_ledger_loses_old_rows_in_whole_files_and_the_lake_still_counts_what_is_pending(tmp_path: Path) -> None:
    """#14 (months on a lake): `[maintenance] outcomes_retention` / `retry_retention` remove the outcome
    files decided (and due) and the retry files delivered before the cut, counted from the lake's last
    recorded batch. The lake's pending count (a new checkpoint's refusal, `status`'s backlog, the plots'
    ledger line) stays the retries still waiting: released retries whose rows went (a retry table kept
    shorter) count as released by the retry table's recorded cut; a retry of a stopped engine, overdue
    for days, still waits, whatever a new engine's heartbeat says; a retry decided long ago with a long
    delay (a config since changed) keeps its outcome row."""
    now = dt.datetime.now(dt.UTC)
    lake = str(tmp_path)
    outcomes, retry = str(tmp_path / "outcomes"), str(tmp_path / "retry")
    for table, schema, parts in ((outcomes, OUTCOMES, ()), (retry, RETRY, RETRY.partition_by)):
        ensure_table(table, schema.arrow_schema, partition_by=parts)
    minute, hour = dt.timedelta(minutes=1), dt.timedelta(hours=1)
    append_arrow(outcomes, outcome_rows(now - 40 * DAY, {"r1": minute, "r2": minute}, acks=2))
    append_arrow(retry, retry_rows(now - 40 * DAY + minute, ["r1", "r2"]))
    append_arrow(outcomes, outcome_rows(now - 40 * DAY, {"r8": 42 * DAY}))  # waits until 2 days from now
    append_arrow(outcomes, outcome_rows(now - 5 * DAY, {"r3": hour, "r4": hour}))
    append_arrow(retry, retry_rows(now - 5 * DAY + hour, ["r3", "r4"]))
    append_arrow(outcomes, outcome_rows(now - 3 * DAY - hour, {"r5": 10 * minute, "r7": DAY / 2}))
    append_arrow(retry, retry_rows(now - 3 * DAY - 50 * minute, ["r5"]))
    clock = {"now": now - 3 * DAY}
    lease = LakeLease(lake, Owner("h", 1, "q", "/ckpt", now - 3 * DAY), timeout_ms=30_000, clock=lambda: clock["now"])
    lease.acquire()
    config = parse_config(
        {"engine": {"lake": lake}, "maintenance": {"outcomes_retention": "30d", "retry_retention": "1d"}}
    )

    def expired(*, dry_run: bool = False, tables: tuple[str, ...] = ("outcomes", "retry")) -> dict[str, int]:
        return {r.table_name: r.files_expired for r in run_maintenance(config, tables=list(tables), dry_run=dry_run)
                if r.table_name in tables}

    # No batch recorded yet: nothing goes.
    assert expired(dry_run=True) == {"outcomes": 0, "retry": 0}
    # The engine stopped 3 days ago after a batch (r7, due since 2.5 days, still in its checkpoint).
    assert lease.record_batch(BatchRecord("q", 7, None, {}, 2))
    reports = {r.table_name: r for r in run_maintenance(config, tables=["outcomes", "retry"])}
    assert (reports["outcomes"].files_expired, reports["outcomes"].rows_expired) == (1, 4)
    assert (reports["retry"].files_expired, reports["retry"].rows_expired) == (2, 4)
    left = DeltaTable(outcomes).to_pyarrow_table()
    assert sorted(filter(None, left["output_msg_id"].to_pylist())) == ["r3", "r4", "r5", "r7", "r8"]
    assert DeltaTable(retry).to_pyarrow_table()["msg_id"].to_pylist() == ["r5"]
    horizon = expired_before(DeltaTable(retry))
    assert horizon is not None and abs(horizon - (now - 4 * DAY)) < minute

    def pending() -> tuple[int | None, list[tuple[str, int]], list[tuple[str, int]]]:
        seen = status.status(config, now=now)
        data = read_plot_data(config, since=None, now=now)
        return (lake_counts(config)[1], [(e.consumer_group, e.pending) for e in seen.backlog],
                [(s.consumer_group, s.pending[-1]) for s in data.backlog])

    # r3 and r4 were released (their rows went); r7 and r8 wait. A new engine taking over (a fresh
    # heartbeat, nothing released yet) changes nothing.
    assert pending() == (2, [("G", 2)], [("G", 2)])
    assert lake_counts(config)[0].of_metric(DELIVERED) == {"G": 3}
    taker = LakeLease(lake, Owner("h2", 2, "q2", "/ckpt2", now), timeout_ms=30_000)
    taker.acquire(take_over=True)
    assert pending() == (2, [("G", 2)], [("G", 2)])
    assert expired(dry_run=True) == {"outcomes": 0, "retry": 0}

    # Its first batch, 10 minutes ago, released r7: r5's row goes a day later, r8 still waits.
    append_arrow(retry, retry_rows(now - 10 * minute, ["r7"]))
    assert taker.record_batch(BatchRecord("q2", 0, None, {}, 1))
    assert expired(dry_run=True) == {"outcomes": 0, "retry": 1}
    assert expired(tables=("retry",)) == {"retry": 1}
    assert DeltaTable(retry).to_pyarrow_table()["msg_id"].to_pylist() == ["r7"]
    assert pending() == (1, [("G", 1)], [("G", 1)])

    # An engine state table another writer damaged (hostile input): no ledger row goes this run, and
    # `status` still answers (it reads the retry table's cut, not the state).
    for data in (tmp_path / STATE_DIR).glob("*.parquet"):
        data.write_bytes(b"not parquet")
    with pytest.raises(Exception, match="(?i)parquet"):
        read_state(lake)
    append_arrow(retry, retry_rows(now - 3 * DAY, ["r9"]))
    assert expired() == {"outcomes": 0, "retry": 0}
    assert pending()[0] == 1
    # A cut never goes back (a retention made longer since): r9 and r10 go (the windowed compaction kept r9's
    # file apart from r7's), the recorded cut stays.
    cut = expired_before(DeltaTable(retry))
    append_arrow(retry, retry_rows(now - 3 * DAY, ["r10"]))
    assert maintenance.expire_rows(retry, "delivered_at", now - 2 * DAY, stamped=True) == (2, 2)
    assert expired_before(DeltaTable(retry)) == cut


def test_status_keeps_the_records_counts_when_the_ledger_lost_rows_the_record_still_counts_waiting(
    tmp_path: Path,
) -> None:
    """#14: a retry given up by `run --discard-pending` stays pending in the lake's batch record for good;
    once its outcome file went to `outcomes_retention`, no window holds the recorded count. `status` then
    reads the backlog whole but keeps the record's counts since the first batch: recounting the
    truncated ledger would show 2 outcomes and a lag of 4 results behind."""
    now = dt.datetime.now(dt.UTC)
    config = parse_config({"engine": {"lake": str(tmp_path)}, "maintenance": {"outcomes_retention": "2d"}})
    for name, schema in (("outcomes", OUTCOMES), ("retry", RETRY), ("consume_results", CONSUME_RESULTS)):
        ensure_table(config.table_path(name), schema.arrow_schema, partition_by=schema.partition_by)
    append_arrow(config.table_path("outcomes"), outcome_rows(now - 10 * DAY, {"d1": dt.timedelta(minutes=1)}, acks=3))
    append_arrow(config.table_path("outcomes"), outcome_rows(now - dt.timedelta(hours=1), {"p1": 2 * DAY}, acks=1))
    append_arrow(config.table_path("consume_results"), results_table([Result.of() for _ in range(6)]))
    lease = LakeLease(str(tmp_path), Owner("h", 1, "q", "/ckpt", now), timeout_ms=30_000)
    lease.acquire()
    totals = Totals.of([("G", "acknowledged", 4), ("G", "retry", 2)])
    assert lease.record_batch(BatchRecord("q", 5, None, {}, 2, totals))  # d1 given up, still counted

    def shown() -> tuple[dict[str, int], list[tuple[str, int]], list[tuple[str | None, int, int, int]]]:
        seen = status.status(config, now=now)
        return (seen.outcomes, [(e.consumer_group, e.pending) for e in seen.backlog],
                [(e.consumer_group, e.results_written, e.results_decided, e.results_behind) for e in seen.lag])

    before = shown()
    assert before[0] == {"acknowledged": 4, "retry": 2} and before[2] == [("G", 6, 6, 0)]
    assert {r.table_name: r.files_expired for r in run_maintenance(config, tables=["outcomes"])}["outcomes"] == 1
    assert shown() == (before[0], [("G", 1)], before[2])


@pytest.mark.parametrize("version", [2**62, -(2**62)])
def test_a_retry_table_cut_another_writer_set_to_no_time_is_no_cut(tmp_path: Path, version: int) -> None:
    """Hostile input (a table written by others): a transaction of the retention's app id whose version
    is no time reads as no cut (retries without their row then count as waiting), never an error."""
    path = str(tmp_path / "retry")
    ensure_table(path, RETRY.arrow_schema, partition_by=RETRY.partition_by)
    write_deltalake(path, retry_rows(dt.datetime.now(dt.UTC), ["r1"]), mode="append",
                    commit_properties=CommitProperties(app_transactions=[Transaction(EXPIRED_BEFORE_APP, version)]))
    assert expired_before(DeltaTable(path)) is None
    config = parse_config({"engine": {"lake": str(tmp_path)}})
    assert status.released_horizon(config) is None


def test_the_producers_messages_past_their_retention_go_and_the_rest_stay(tmp_path: Path) -> None:
    """#14 (`[maintenance] messages_retention`, RocketMQ's commit log kept 72 h): `maintain` removes the
    messages table's files stored before the cut (by `store_timestamp`), in one commit of removes; off
    by default; a file with a newer message stays."""
    now = dt.datetime.now(dt.UTC)
    path = str(tmp_path / "messages")
    ensure_table(path, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)

    append_arrow(path, message_rows(["a", "b"], [now - 5 * DAY, now - 4 * DAY]))
    append_arrow(path, message_rows(["c", "d"], [now - 5 * DAY, now - dt.timedelta(hours=1)]))
    append_arrow(path, message_rows(["e"], [now]))
    off = parse_config({"engine": {"lake": str(tmp_path)}})
    assert run_maintenance(off, tables=["messages"], dry_run=True)[0].files_expired == 0
    kept = parse_config({"engine": {"lake": str(tmp_path)}, "maintenance": {"messages_retention": "3d"}})
    [report] = run_maintenance(kept, tables=["messages"])
    assert (report.files_expired, report.rows_expired, report.error) == (1, 2, None)
    assert sorted(DeltaTable(path).to_pyarrow_table()["msg_id"].to_pylist()) == ["c", "d", "e"]
    # The cut is recorded with the removes: a consumer's stream behind it skips the files gone past it.
    cut = expired_before(DeltaTable(path))
    assert cut is not None and now - 3 * DAY - dt.timedelta(minutes=5) < cut <= dt.datetime.now(dt.UTC) - 3 * DAY


# --------------------------------------------------------------------------- compaction by windows of time


THREE_DAYS = compaction_window(3 * DAY, "store_timestamp")


def messages_over_days(path: str, start: dt.datetime, days: int, *, window: TimeWindow | None) -> list[str]:
    """Four sends a day (hours 0-3) for ``days`` days from ``start``, `maintain` once a day with a 3-day
    retention (compacting by ``window``, or as Delta's OPTIMIZE without one); the ids sent."""
    ensure_table(path, MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
    sent = []
    for day in range(days):
        at = start + day * DAY
        for hour in range(4):
            append_arrow(path, message_rows([f"d{day}h{hour}"], [at + dt.timedelta(hours=hour)]))
            sent.append(f"d{day}h{hour}")
        report = maintain_table("messages", path, retention_hours=WEEK, expire_before=at - 3 * DAY, window=window)
        assert report.error is None
    return sent


def test_a_table_with_a_row_retention_is_compacted_by_windows_so_its_old_rows_still_go(tmp_path: Path) -> None:
    """#14 (review of the row retentions): Delta's OPTIMIZE merges every file under the target size, the
    one it wrote last run too, so a quiet topic became one file holding its first message and its
    newest, which the retention never removes whole: after 12 days of 3-day retention every message
    was still there. Compacted by windows of a 24th of the retention, a file spans at most a window,
    and the rows go within a window of their time."""
    start = dt.datetime.now(dt.UTC) - 12 * DAY
    merged, windowed = str(tmp_path / "merged"), str(tmp_path / "windowed")
    sent = messages_over_days(merged, start, 12, window=None)
    assert sorted(DeltaTable(merged).to_pyarrow_table()["msg_id"].to_pylist()) == sorted(sent)  # nothing expired
    assert messages_over_days(windowed, start, 12, window=THREE_DAYS) == sent
    kept = DeltaTable(windowed).to_pyarrow_table()
    cut = start + 11 * DAY - 3 * DAY
    newer = [m for m in sent if int(m[1:m.index("h")]) >= 8]
    assert set(newer) <= set(kept["msg_id"].to_pylist())  # every row after the last cut stays
    assert min(kept["store_timestamp"].to_pylist()) >= cut - THREE_DAYS.width
    assert len(DeltaTable(windowed).file_uris()) <= 2 * 5  # 3 hours a window: two files a day kept
    assert expired_before(DeltaTable(windowed)) is not None


def test_a_windowed_compaction_changes_no_data_and_a_stream_past_it_reads_nothing_twice(tmp_path: Path) -> None:
    """#14 part 1 for the windowed compaction: one commit of dataChange=false adds and removes, the same
    rows for delta-rs, pandas and Polars, files grouped by window and partition, and a dry run that
    counts what it rewrites."""
    path = tmp_path / "messages"
    ensure_table(str(path), MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
    at = dt.datetime.now(dt.UTC) - DAY
    for topic in ("a", "b"):
        for minutes in (0, 10, 20, 200):  # 200 minutes later: the next 3-hour window, alone
            append_arrow(str(path), message_rows([f"{topic}{minutes}"], [at.replace(hour=0, minute=0) + dt.timedelta(minutes=minutes)], topic=topic))
    before = sorted(DeltaTable(str(path)).to_pandas()["msg_id"].tolist())
    stream_at = Offset.after_version(DeltaTable(str(path)).version(), None)
    assert maintain_table("messages", str(path), retention_hours=WEEK, dry_run=True, window=THREE_DAYS).files_compacted == 6
    report = maintain_table("messages", str(path), retention_hours=WEEK, window=THREE_DAYS)
    assert (report.files_before, report.files_after, report.files_compacted, report.files_written) == (8, 4, 6, 2)
    version = DeltaTable(str(path)).version()
    changes = [a.get("add") or a.get("remove") for a in log_actions(path, version) if "add" in a or "remove" in a]
    assert len(changes) == 8 and all(change["dataChange"] is False for change in changes)
    assert sorted(DeltaTable(str(path)).to_pandas()["msg_id"].tolist()) == before
    import polars as pl

    assert sorted(pl.read_delta(str(path))["msg_id"].to_list()) == before
    delta_log = DeltaLog(TableLocation(str(path)))
    assert list(files_after(delta_log, stream_at, through_version=version, rules=ChangeRules())) == []
    # The compacted files carry the statistics the expiry judges by.
    newest = add_actions_of(str(path), "max.store_timestamp")
    assert all(value is not None for value in newest)


def add_actions_of(path: str, column: str) -> list[Any]:
    return pa.RecordBatchReader.from_stream(DeltaTable(path).get_add_actions(flatten=True)).read_all()[column].to_pylist()


@pytest.mark.parametrize("meanwhile", ["append", "expire"])
def test_a_windowed_compaction_beside_another_writer_loses_and_repeats_no_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, meanwhile: str
) -> None:
    """A commit lands while the compaction rewrites: an append (a producer) leaves every file it
    rewrote in the table, so it commits after it without rewriting again; an expiry removed one, so it
    is redone on the new snapshot, and the first attempt's files are deleted."""
    path = tmp_path / "messages"
    ensure_table(str(path), MESSAGES.arrow_schema, partition_by=MESSAGES.partition_by)
    old = dt.datetime.now(dt.UTC).replace(minute=0) - 10 * DAY
    for i in range(3):
        append_arrow(str(path), message_rows([f"old{i}"], [old + dt.timedelta(minutes=i)]))
    now = dt.datetime.now(dt.UTC)
    for i in range(3):
        append_arrow(str(path), message_rows([f"new{i}"], [now]))
    reads = []
    real_read = maintenance.read_file

    def read_then_commit(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        if len(reads) == 1:
            if meanwhile == "append":
                append_arrow(str(path), message_rows(["during"], [now]))
            else:
                assert expire_rows(str(path), "store_timestamp", now - DAY, stamped=True) == (3, 3)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(maintenance, "read_file", read_then_commit)
    with caplog.at_level(logging.INFO, logger="retry_engine.ops.maintenance"):
        report = maintain_table("messages", str(path), retention_hours=WEEK, window=THREE_DAYS)
    assert report.error is None
    left = sorted(DeltaTable(str(path)).to_pyarrow_table()["msg_id"].to_pylist())
    if meanwhile == "append":
        assert left == ["during", "new0", "new1", "new2", "old0", "old1", "old2"]
        assert len(reads) == 6 and "commits after it" in caplog.text  # rewritten once
    else:
        assert left == ["new0", "new1", "new2"]
        assert len(reads) == 6 + 3 and "lost a file it rewrote" in caplog.text
    referenced = {
        unquote(a["add"]["path"]).rsplit("/", 1)[-1]
        for v in range(DeltaTable(str(path)).version() + 1)
        for a in log_actions(path, v) if "add" in a
    }
    on_disk = {name for _, _, names in os.walk(path) for name in names if name.startswith("part-")}
    assert on_disk == referenced  # no file of the lost attempt left behind


@pytest.mark.parametrize(("retention", "hours"), [(DAY, 1), (3 * DAY, 3), (30 * DAY, 30), (dt.timedelta(hours=12), 1)])
def test_the_compaction_window_is_a_24th_of_the_retention_and_at_least_an_hour(retention: dt.timedelta, hours: int) -> None:
    assert compaction_window(retention, "at") == TimeWindow("at", dt.timedelta(hours=hours))


@pytest.mark.parametrize("recorded", [dt.datetime(1, 1, 1, tzinfo=dt.UTC), dt.datetime(9999, 12, 31, tzinfo=dt.UTC)])
def test_a_batch_recorded_at_a_time_past_the_calendar_cuts_no_ledger_row(tmp_path: Path, recorded: dt.datetime) -> None:
    """Hostile input (the engine state, a time another writer set): the ledger's cut counts back from the
    last recorded batch; from year 1 there is no time to count back to (an OverflowError stopped `maintain`),
    from year 9999 none of the time since: no ledger row goes, and the run ends without an error."""
    from retry_engine.core.lease import EngineState

    now = dt.datetime.now(dt.UTC)
    outcomes = str(tmp_path / "outcomes")
    ensure_table(outcomes, OUTCOMES.arrow_schema)
    append_arrow(outcomes, outcome_rows(now - 40 * DAY, {}, acks=2))
    state = EngineState(1, Owner("h", 1, "q", "/ck", now), now, False,
                        BatchRecord("q", 3, None, {}, 0, recorded_at=recorded))
    write_deltalake(str(tmp_path / STATE_DIR), state.to_arrow())
    config = parse_config({"engine": {"lake": str(tmp_path)}, "maintenance": {"outcomes_retention": "30d"}})
    [report] = [r for r in run_maintenance(config, tables=["outcomes"]) if r.table_name == "outcomes"]
    assert report.error is None
    expected = 0 if recorded.year == 1 else 1  # year 9999: no time since, the cut is 30 days before now
    assert report.files_expired == expected


def test_lateness_of_times_at_the_ends_of_the_calendar_is_a_number() -> None:
    """Hostile input (a retry row another writer timed in year 1 or 9999): `status` and `plots` read its
    lateness (an ArrowInvalid from the duration arithmetic before)."""
    times = pa.timestamp("us", "UTC")
    retry = pa.table({
        "delivered_at": pa.array([dt.datetime(9999, 12, 31, tzinfo=dt.UTC), dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=dt.UTC)], times),
        "due_at": pa.array([dt.datetime(1, 1, 1, tzinfo=dt.UTC), dt.datetime(2026, 1, 1, tzinfo=dt.UTC)], times),
    })
    span = (dt.datetime(9999, 12, 31, tzinfo=dt.UTC) - dt.datetime(1, 1, 1, tzinfo=dt.UTC)) / dt.timedelta(milliseconds=1)
    assert status.lateness_ms(retry).to_pylist() == [span, 1000.0]
