"""Tables kept open between commits (retry_engine.delta._handles; #14 part 4: requests per batch on S3).

A writer's next commit reuses the handle its last one left, brought up to date
with the commits made since, but only while the table is the same table: a
table dropped and re-created (with fewer or more versions), a commit file
rewritten or cleaned away all make the writer open it afresh, so a commit never
lands on a snapshot of another table. Real delta-rs tables, locally and on moto's
S3 server.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from retry_engine.config import parse_config
from retry_engine.delta import _handles, storage
from retry_engine.delta._handles import keep, open_latest
from retry_engine.delta._log import commit_log_path
from retry_engine.delta.sink import FilesWritten, commit_files
from retry_engine.delta.tables import append_arrow, read_table
from tests.s3 import S3Server


@pytest.fixture(autouse=True)
def _nothing_kept() -> None:
    _handles.forget()


def _rows(path: str) -> list[str]:
    return sorted(read_table(path).column("w").to_pylist())


def _versions(path: Path) -> list[int]:
    return sorted(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json"))


def test_the_next_commit_reuses_the_handle_and_sees_other_writers(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    append_arrow(path, pa.table({"w": ["a"]}), app_id="engine", txn_version=0)
    kept = open_latest(storage.location(path))
    keep(kept)
    write_deltalake(path, pa.table({"w": ["other"]}), mode="append")  # another writer, between two batches
    assert append_arrow(path, pa.table({"w": ["b"]}), app_id="engine", txn_version=1)
    again = open_latest(storage.location(path))
    # Versions: 0 the table's creation, 1 "a", 2 the other writer, 3 "b".
    assert again.table is kept.table and again.version == DeltaTable(path).version() == 3
    keep(again)
    # The kept snapshot knows the transaction: a replay is skipped, nothing is written twice.
    assert not append_arrow(path, pa.table({"w": ["b"]}), app_id="engine", txn_version=1)
    assert _rows(path) == ["a", "b", "other"]
    assert _versions(tmp_path / "t") == [0, 1, 2, 3]


@pytest.mark.parametrize("later_versions", [0, 3])
def test_a_table_replaced_under_a_kept_handle_is_opened_afresh(
    tmp_path: Path, later_versions: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Dropped and re-created with fewer versions than the kept one (its commit would leave a gap) or more
    (the kept snapshot would take the new table's commits as its own): the append goes to the new table
    as its next version, next to its own rows only."""
    root = tmp_path / "t"
    path = str(root)
    for i in range(3):
        append_arrow(path, pa.table({"w": [f"old-{i}"]}))
    shutil.rmtree(root)
    write_deltalake(path, pa.table({"w": ["new-0"]}))
    for i in range(later_versions):
        write_deltalake(path, pa.table({"w": [f"new-{i + 1}"]}), mode="append")
    new_id = DeltaTable(path).metadata().id
    with caplog.at_level("INFO", logger=_handles.__name__):
        append_arrow(path, pa.table({"w": ["appended"]}))
    # The kept handle is at version 3 (creation and three appends): the new table has another
    # version 3 (replaced?) or none (its commit file cannot be read).
    assert ("not the one this process last saw" if later_versions == 3 else "kept handle not usable") in caplog.text
    assert _versions(root) == list(range(later_versions + 2))
    assert _rows(path) == sorted(["appended", *(f"new-{i}" for i in range(later_versions + 1))])
    assert DeltaTable(path).metadata().id == new_id


def test_a_kept_version_rewritten_or_cleaned_away_opens_the_table_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "t"
    path = str(root)
    append_arrow(path, pa.table({"w": ["a"]}))
    append_arrow(path, pa.table({"w": ["b"]}))  # version 2, where the kept handle is
    commit = root / commit_log_path(2)
    lines = commit.read_bytes().splitlines()
    assert len(lines) > 1
    commit.write_bytes(b"\n".join(reversed(lines)) + b"\n")  # the same actions, other bytes
    with caplog.at_level("INFO", logger=_handles.__name__):
        append_arrow(path, pa.table({"w": ["c"]}))
    assert "version 2's commit is not the one this process last saw" in caplog.text
    caplog.clear()
    # Another writer commits version 4 and checkpoints it; a log cleanup then deletes the commits
    # before that checkpoint, the kept handle's version 3 among them.
    write_deltalake(path, pa.table({"w": ["other"]}), mode="append")
    DeltaTable(path).create_checkpoint()
    for version in range(4):
        (root / commit_log_path(version)).unlink()
    with caplog.at_level("INFO", logger=_handles.__name__):
        append_arrow(path, pa.table({"w": ["d"]}))
    assert "kept handle not usable" in caplog.text
    assert _rows(path) == ["a", "b", "c", "d", "other"]
    assert DeltaTable(path).version() == 5


def test_a_handle_kept_under_other_store_settings_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept handle's object store was built from the environment's settings then (an endpoint,
    credentials): once they change, the table is opened with the new ones instead (a handle bound to
    an old endpoint would retry a dead one for minutes)."""
    path = str(tmp_path / "t")
    append_arrow(path, pa.table({"w": ["a"]}))
    first = open_latest(storage.location(path))
    keep(first)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    other = open_latest(storage.location(path))
    assert other.table is not first.table
    keep(other)
    assert open_latest(storage.location(path)).table is other.table


def test_a_kept_handle_builds_its_file_system_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same-table check reads a commit file every commit; on object storage a file system is a new store
    client (~5 ms of CPU each), so a kept handle builds one and reuses it for every later check."""
    from retry_engine.delta._log import TableLocation

    path = str(tmp_path / "t")
    append_arrow(path, pa.table({"w": ["a"]}))
    built: list[str] = []
    real = TableLocation.filesystem

    def counted(self: TableLocation) -> tuple[object, str]:
        built.append(self.uri)
        return real(self)

    monkeypatch.setattr(TableLocation, "filesystem", counted)
    _handles.forget()  # the next append opens the table afresh and keeps that handle
    for i in range(5):
        assert append_arrow(path, pa.table({"w": [f"b{i}"]}), app_id="engine", txn_version=i)
    assert len(built) == 1
    assert len(_rows(path)) == 6


def test_a_handle_is_never_shared_between_threads(tmp_path: Path) -> None:
    """A kept handle is taken out of the cache while one caller uses it: a second caller meanwhile gets a table
    of its own, and the handle is there again only once given back. Writers on several threads then append
    through the cache at once: every row lands once."""
    path = str(tmp_path / "t")
    append_arrow(path, pa.table({"w": ["setup"]}))
    first = open_latest(storage.location(path))  # the handle the append kept
    second = open_latest(storage.location(path))
    assert second.table is not first.table
    keep(first)
    assert open_latest(storage.location(path)).table is first.table
    keep(first)
    errors: list[BaseException] = []

    def write(t: int) -> None:
        try:
            for i in range(5):
                append_arrow(path, pa.table({"w": [f"{t}-{i}"]}))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert _rows(path) == sorted(["setup", *(f"{t}-{i}" for t in range(3) for i in range(5))])


def test_on_object_storage_a_replaced_table_gets_the_replayed_transaction(
    s3_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The same on moto's S3 server (the commit file read through delta-rs's object store): the old
    table recorded the engine's transaction 5, the re-created one has as many versions and no such
    transaction, so batch 5's append must land in it, not be skipped as already committed (which a
    kept snapshot of the old table would say)."""
    bucket = s3_server.new_bucket()
    lake = f"s3://{bucket}/lake"
    parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    path = f"{lake}/retry"
    append_arrow(path, pa.table({"w": ["old"]}))
    assert append_arrow(path, pa.table({"w": ["old-5"]}), app_id="engine", txn_version=5)  # kept at version 2
    client = s3_server.client()
    for key in [k for k in s3_server.objects(bucket) if k.startswith("lake/retry/")]:
        client.delete_object(Bucket=bucket, Key=key)
    options = storage.options_for(path)
    for i in range(3):
        write_deltalake(path, pa.table({"w": [f"new-{i}"]}), mode="append", storage_options=options)
    with caplog.at_level("INFO", logger=_handles.__name__):
        assert append_arrow(path, pa.table({"w": ["batch-5"]}), app_id="engine", txn_version=5)
    assert "version 2's commit is not the one this process last saw" in caplog.text
    assert _rows(path) == ["batch-5", "new-0", "new-1", "new-2"]
    log = sorted(k for k in s3_server.objects(bucket) if k.startswith("lake/retry/_delta_log/") and k.endswith(".json"))
    assert log == [f"lake/retry/_delta_log/{v:020d}.json" for v in range(4)]
    # The sink's commit path takes the same kept handle: batch 5 is now recorded, so it skips it.
    assert not commit_files(
        storage.location(path), [FilesWritten(())], mode="append", partition_by=(), app_id="engine", txn_version=5
    )


def test_a_kept_handle_lists_the_log_only_when_another_commit_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review (session 20) measured each lease write at 0.2 s with 10,000 log entries and 4 s with
    300,000: delta-rs's update lists the whole ``_delta_log`` on a local disk, and the engine's tables keep
    30 days of commits (one a batch). A kept handle now looks for the next commit file first and lists
    the log only when it is there; what it then reads is unchanged (the other writer's commit is seen)."""
    path = str(tmp_path / "t")
    append_arrow(path, pa.table({"w": ["a"]}))
    kept = open_latest(storage.location(path))
    listed: list[int] = []
    real = type(kept.table).update_incremental

    def counting(table: DeltaTable) -> None:
        listed.append(table.version())
        real(table)

    monkeypatch.setattr(type(kept.table), "update_incremental", counting)
    keep(kept)
    for _ in range(3):
        again = open_latest(storage.location(path))
        assert again.table is kept.table and again.version == 1
        keep(again)
    assert listed == []
    write_deltalake(path, pa.table({"w": ["other"]}), mode="append")
    again = open_latest(storage.location(path))
    assert listed == [1] and again.version == 2 and again.table.version() == 2
    keep(again)
    assert append_arrow(path, pa.table({"w": ["b"]}))
    assert _rows(path) == ["a", "b", "other"] and _versions(tmp_path / "t") == [0, 1, 2, 3]


def test_on_object_storage_the_next_commit_lookup_keeps_the_handle(
    s3_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    """The lookup of the next commit file goes through delta-rs's object store: a missing file is "none
    there" (the handle is kept and not updated), another writer's commit is seen, as on a local disk."""
    bucket = s3_server.new_bucket()
    lake = f"s3://{bucket}/lake"
    parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    path = f"{lake}/outcomes"
    append_arrow(path, pa.table({"w": ["a"]}))
    kept = open_latest(storage.location(path))
    keep(kept)
    with caplog.at_level("INFO", logger=_handles.__name__):
        again = open_latest(storage.location(path))
        assert again.table is kept.table and again.version == 1
        keep(again)
        write_deltalake(path, pa.table({"w": ["other"]}), mode="append", storage_options=storage.options_for(path))
        later = open_latest(storage.location(path))
        assert later.table is kept.table and later.version == 2
    assert "not usable" not in caplog.text and "afresh" not in caplog.text
