"""The JVM class archive is offered only when whole (retry_engine.delta._class_archive, #14 part 3).

A JVM given a truncated archive dies at start, so every file and record in
the cache folder is treated as hostile: only an archive whose size and SHA-256
match its record becomes a JVM option.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from retry_engine.delta import _class_archive as class_archive
from retry_engine.errors import EnvironmentProblem

JAVA = "/usr/lib/jvm/java-17/bin/java\nopenjdk version \"17.0.15\""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(class_archive.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(class_archive.SWITCH_ENV, raising=False)
    monkeypatch.delenv("RETRY_ENGINE_CLASS_ARCHIVE_DUMP", raising=False)
    spark_home = tmp_path / "spark-home"
    (spark_home / "jars").mkdir(parents=True)
    (spark_home / "jars" / "spark-core.jar").write_bytes(b"jar")
    return str(spark_home)


def _archive(home: str, content: bytes = b"CDS" * 1000, **record: object) -> Path:
    path = class_archive.archive_path(home, JAVA)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    written = {"format": 1, "size": len(content), "sha256": hashlib.sha256(content).hexdigest(), **record}
    path.with_suffix(".json").write_text(json.dumps(written))
    return path


def test_a_whole_archive_is_mapped_with_the_jvm_s_own_messages_off(home: str) -> None:
    path = _archive(home)
    options = class_archive.jvm_options(home, JAVA)
    assert options.split() == [f"-XX:SharedArchiveFile={path}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]


def test_nothing_changes_without_an_archive_a_home_or_a_java(home: str) -> None:
    assert class_archive.jvm_options(home, JAVA) == ""
    _archive(home)
    assert class_archive.jvm_options(None, JAVA) == ""
    assert class_archive.jvm_options(home, None) == ""
    assert class_archive.jvm_options(home, JAVA + " (another build)") == ""  # another Java: another file


@pytest.mark.parametrize("switch", ["off", "OFF", "0", "false", " no "])
def test_the_switch_turns_it_off(home: str, monkeypatch: pytest.MonkeyPatch, switch: str) -> None:
    _archive(home)
    monkeypatch.setenv(class_archive.SWITCH_ENV, switch)
    assert class_archive.jvm_options(home, JAVA) == ""


def test_another_set_of_jars_is_another_archive(home: str) -> None:
    _archive(home)
    Path(home, "jars", "spark-core.jar").write_bytes(b"an upgraded jar")
    assert class_archive.jvm_options(home, JAVA) == ""


def test_a_truncated_or_altered_archive_is_never_offered(home: str, caplog: pytest.LogCaptureFixture) -> None:
    content = bytes(range(256)) * 400
    path = _archive(home, content)
    path.write_bytes(content[: len(content) // 2])  # what a JVM killed while dumping, or a full disk, leaves
    assert class_archive.jvm_options(home, JAVA) == ""
    assert "does not match its record" in caplog.text
    altered = bytearray(content)
    altered[5000] ^= 0xFF
    path.write_bytes(bytes(altered))  # same size, one byte changed
    os.utime(path, ns=(1, 1))  # not the same file as any verified before, even on a coarse clock
    assert class_archive.jvm_options(home, JAVA) == ""


@pytest.mark.parametrize("record", [
    "", "not json", "[1, 2]", "null", '{"format": 1}', '{"format": 2, "size": 3000, "sha256": "x"}',
    '{"format": 1, "size": "3000", "sha256": "x"}', '{"format": 1, "size": 3000, "sha256": 7}',
    '{"format": 1, "size": 3000, "sha256": "00"}', "\xff not UTF-8",
])
def test_a_hostile_record_is_not_believed(home: str, record: str) -> None:
    path = _archive(home)
    path.with_suffix(".json").write_text(record, encoding="latin-1")
    assert class_archive.jvm_options(home, JAVA) == ""


def test_a_missing_record_or_an_unreadable_archive_is_not_believed(home: str) -> None:
    path = _archive(home)
    path.with_suffix(".json").unlink()
    assert class_archive.jvm_options(home, JAVA) == ""
    _archive(home)
    path.unlink()
    path.mkdir()  # a folder under the archive's name
    assert class_archive.jvm_options(home, JAVA) == ""


def test_the_cache_folder_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(class_archive.CACHE_ENV, "relative/cache")
    assert class_archive.cache_dir() == Path.cwd() / "relative" / "cache"
    monkeypatch.setenv(class_archive.CACHE_ENV, "  ")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert class_archive.cache_dir() == tmp_path / "retry-engine"
    monkeypatch.setenv("XDG_CACHE_HOME", "not/absolute")  # the XDG spec says to ignore it
    assert class_archive.cache_dir() == Path.home() / ".cache" / "retry-engine"


def test_an_unwritable_cache_is_a_clear_error(home: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(class_archive.CACHE_ENV, str(blocked / "cache"))
    monkeypatch.setenv("SPARK_HOME", home)
    with pytest.raises(EnvironmentProblem, match=f"CLASS_ARCHIVE_UNWRITABLE.*{class_archive.CACHE_ENV}"):
        class_archive.write_archive()


def test_a_spark_home_inherited_from_an_exited_engine_is_not_the_archives_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`prepare` started by an engine's child after the engine exited: its temporary home is gone."""
    from retry_engine.delta import session

    gone = tmp_path / f"{session.WORKER_HOME_PREFIX}abc123"
    monkeypatch.setenv("SPARK_HOME", str(gone))
    monkeypatch.setattr(session, "worker_spark_home", lambda: str(tmp_path / "live-home"))
    home, _java = class_archive._installation()
    assert home == str(tmp_path / "live-home") and "SPARK_HOME" not in os.environ
    # A real Spark installation named by SPARK_HOME is kept, even where it is missing (Spark says so).
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark-4"))
    assert class_archive._installation()[0] == str(tmp_path / "spark-4")


def test_a_new_archive_replaces_the_older_ones_of_its_home_and_of_homes_that_are_gone(
    home: str, tmp_path: Path
) -> None:
    """Each pyspark reinstall gets a new archive (170 MB): the older ones of that home must not pile up."""
    keep = _archive(home, spark_home=home)
    cache = keep.parent

    def other(name: str, record: str | None) -> Path:
        path = cache / f"spark-classes-{name}.jsa"
        path.write_bytes(b"old")
        if record is not None:
            path.with_suffix(".json").write_text(record)
        return path

    same_home = other("0000000000000001", json.dumps({"spark_home": home}))
    gone_home = other("0000000000000002", json.dumps({"spark_home": str(tmp_path / "removed-venv")}))
    other("0000000000000003", json.dumps({"spark_home": str(tmp_path)}))  # another live home: kept
    other("0000000000000004", None)  # no record: not ours to judge
    other("0000000000000005", '{"spark_home": 7}')
    assert class_archive.prune_archives(keep=keep) == [same_home, gone_home]
    assert sorted(p.name for p in cache.iterdir()) == sorted([
        keep.name, keep.with_suffix(".json").name, "spark-classes-0000000000000003.jsa",
        "spark-classes-0000000000000003.json", "spark-classes-0000000000000004.jsa",
        "spark-classes-0000000000000005.jsa", "spark-classes-0000000000000005.json",
    ])
    assert class_archive.jvm_options(home, JAVA).startswith(f"-XX:SharedArchiveFile={keep} ")
