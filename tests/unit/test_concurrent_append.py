"""Concurrent writers of one Delta table through ``append_arrow`` (#12 item 10, SPEC B1/B8).

Real Delta tables in a temp folder, real OS processes racing each other
(``multiprocessing``, spawn), no Spark.
"""

from __future__ import annotations

import multiprocessing as mp
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from retry_engine.delta import append_arrow, read_table, table_version
from retry_engine.errors import ConcurrentWriteError, ConfigError
from tests.builders import append_at_once

ROUNDS = 40
SCHEMA = pa.schema([("txn", pa.int64()), ("writer", pa.string())])


def _rows(txn: int, writer: str) -> pa.Table:
    return pa.table({"txn": [txn], "writer": [writer]}, schema=SCHEMA)


def _race_same_transactions(path: str, writer: str, barrier: mp.synchronize.Barrier, out: mp.Queue[object]) -> None:
    """Append (app "job", version v) for every v, meeting the other process at the barrier before each one."""
    written = []
    try:
        for version in range(1, ROUNDS + 1):
            barrier.wait(timeout=120)
            if append_arrow(path, _rows(version, writer), app_id="job", txn_version=version):
                written.append(version)
        out.put((writer, written))
    except BaseException as exc:  # reported to the parent, which fails the test with it
        out.put((writer, repr(exc)))
        barrier.abort()


def test_two_processes_appending_the_same_transactions_leave_one_copy(tmp_path: Path) -> None:
    """#12 item 10 / B1: two processes append the same (app_id, version) pairs at the same moment, 40 times.

    Each pair must be in the table exactly once, and each process's return
    value must say truthfully whether it was the one that wrote it.
    """
    path = str(tmp_path / "metrics")
    append_arrow(path, _rows(0, "setup"))
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    out: mp.Queue[object] = ctx.Queue()
    procs = [ctx.Process(target=_race_same_transactions, args=(path, w, barrier, out)) for w in ("a", "b")]
    for p in procs:
        p.start()
    try:
        results: dict[str, object] = dict(out.get(timeout=600) for _ in procs)  # type: ignore[misc]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    for writer, written in results.items():
        assert isinstance(written, list), f"writer {writer} failed: {written}"
    data = read_table(path)
    copies = Counter(data.column("txn").to_pylist())
    assert {v: n for v, n in copies.items() if n != 1} == {}
    assert sorted(copies) == list(range(ROUNDS + 1))
    writers = dict(zip(data.column("txn").to_pylist(), data.column("writer").to_pylist(), strict=True))
    for writer, written in results.items():
        assert sorted(v for v, w in writers.items() if w == writer) == written
    assert DeltaTable(path).transaction_version("job") == ROUNDS


def test_expect_version_commits_only_on_the_checked_version(tmp_path: Path) -> None:
    """#12 items 10/11: a claim made from version v commits only if nobody committed after v.

    Appends never conflict with appends in Delta, so this is the check a
    read-decide-claim cycle (the re-drive audit) needs.
    """
    path = str(tmp_path / "claims")
    append_arrow(path, _rows(0, "setup"))
    seen = table_version(path)
    assert seen is not None
    append_arrow(path, _rows(1, "other"))  # another writer, after we read
    with pytest.raises(ConcurrentWriteError, match=rf"\[TABLE_MOVED\].*moved from version {seen} to {seen + 1}"):
        append_arrow(path, _rows(2, "late"), expect_version=seen)
    assert sorted(read_table(path).column("txn").to_pylist()) == [0, 1]
    assert table_version(path) == seen + 1
    assert append_arrow(path, _rows(2, "fresh"), expect_version=seen + 1, app_id="claim", txn_version=7)
    assert table_version(path) == seen + 2
    # The same claim again from the version that holds it: already there, nothing written.
    assert not append_arrow(path, _rows(2, "fresh"), expect_version=seen + 2, app_id="claim", txn_version=7)
    assert table_version(path) == seen + 2
    assert sorted(read_table(path).column("txn").to_pylist()) == [0, 1, 2]


@pytest.mark.parametrize("bad", [-1, True, 99, "1", 1.0])
def test_expect_version_rejects_what_is_not_a_version_of_the_table(tmp_path: Path, bad: object) -> None:
    """#12 item 10, hostile input: negative, bool, future, str and float versions are refused; nothing is written."""
    path = str(tmp_path / "claims")
    append_arrow(path, _rows(0, "setup"))
    with pytest.raises(ConfigError, match=r"\[INVALID_OPTION\].*expect_version"):
        append_arrow(path, _rows(1, "x"), expect_version=bad)  # type: ignore[arg-type]
    assert read_table(path).num_rows == 1


def test_expect_version_on_a_missing_table_is_refused(tmp_path: Path) -> None:
    """#12 item 10: a claim against a table that is not there cannot name a version of it."""
    with pytest.raises(ConfigError, match=r"\[INVALID_OPTION\].*table is at None"):
        append_arrow(str(tmp_path / "none"), _rows(1, "x"), expect_version=0)


def test_delta_rs_fails_a_commit_whose_app_id_another_writer_committed_since_its_snapshot(tmp_path: Path) -> None:
    """#12 item 10: the delta-rs rule append_arrow relies on (measured on deltalake 1.6.6), pinned here
    so an upgrade that drops it fails this test rather than silently duplicating rows.

    A handle read at version v commits (app "job", 1) after another writer
    committed (app "job", 1) at v+1: CommitFailedError. An unrelated append in
    between (no app transaction) does not make it fail.
    """
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, Transaction

    path = str(tmp_path / "t")
    append_arrow(path, _rows(0, "setup"))
    token = CommitProperties(app_transactions=[Transaction("job", 1)])
    checked = DeltaTable(path)
    write_deltalake(path, _rows(1, "other"), mode="append", commit_properties=token)
    with pytest.raises(CommitFailedError, match="Concurrent transaction"):
        write_deltalake(checked, _rows(1, "stale"), mode="append", commit_properties=token)
    checked = DeltaTable(path)
    write_deltalake(path, _rows(2, "unrelated"), mode="append")
    write_deltalake(checked, _rows(3, "fresh"), mode="append", commit_properties=CommitProperties(app_transactions=[Transaction("job", 2)]))
    assert sorted(read_table(path).column("txn").to_pylist()) == [0, 1, 2, 3]


CREATE_ROUNDS = 12


def _metadata_commits(path: str) -> list[str]:
    log = Path(path) / "_delta_log"
    return sorted(f.name for f in log.glob("*.json") if '"metaData"' in f.read_text())


def test_writers_creating_one_table_at_once_leave_one_create_and_all_their_rows(tmp_path: Path) -> None:
    """B8: two writers append to a table that does not exist yet, at the same moment, 12 times.

    Each creates it first (``ensure_table``, ``mode="ignore"``). delta-rs
    alone commits the losing create again as version 1 (a second metadata
    commit), which failed the winner's append with "Metadata changed since
    last commit" (the re-drive crash of the fresh-clone CI run). Now: one
    create commit, no error, both rows.
    """
    for i in range(CREATE_ROUNDS):
        path = str(tmp_path / f"t{i}")
        errors = append_at_once(path, [_rows(0, w) for w in ("a", "b")])
        assert errors == [], f"round {i}"
        assert _metadata_commits(path) == ["00000000000000000000.json"], f"round {i}"
        assert sorted(read_table(path).column("writer").to_pylist()) == ["a", "b"]


def test_an_append_that_meets_an_operators_table_property_change_checks_again_and_lands_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B8: an operator sets a table property (log retention, from a notebook) between our snapshot
    and our commit: a metadata change, which delta-rs does not rebase an append over. The append,
    plain or with an app id, reads the table again and commits once; before, it raised
    CommitFailedError ("Metadata changed since last commit")."""
    from retry_engine.delta import tables
    from retry_engine.delta._handles import Handle

    checked_handle = tables._checked_handle
    for n, (app_id, txn) in enumerate([(None, None), ("job", 1)]):
        path = str(tmp_path / f"t{n}")
        append_arrow(path, _rows(0, "setup"))
        raced: list[int] = []

        def stale_handle(path: str, schema: pa.Schema, partition_by: object, raced: list[int] = raced) -> Handle:
            handle = checked_handle(path, schema, partition_by)  # type: ignore[arg-type]
            if not raced:  # the operator commits right after we read
                raced.append(handle.table.version())
                DeltaTable(path).alter.set_table_properties({"delta.logRetentionDuration": "interval 7 days"})
            return handle

        monkeypatch.setattr(tables, "_checked_handle", stale_handle)
        assert append_arrow(path, _rows(1, "late"), app_id=app_id, txn_version=txn)
        monkeypatch.setattr(tables, "_checked_handle", checked_handle)
        assert sorted(read_table(path).column("txn").to_pylist()) == [0, 1]
        table = DeltaTable(path)
        assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 7 days"
        assert table.version() == raced[0] + 2  # the operator's commit, then ours: nothing twice
