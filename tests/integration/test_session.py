"""The engine's Spark session on the embedded default (#14 part 3: start-up)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from retry_engine.delta import session as session_module
from retry_engine.delta import storage
from retry_engine.delta.session import forget_gone_worker_home, worker_spark_home


def _worker_imports(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import os
    import sys

    import pyspark

    for _ in batches:
        zips = [p for p in sys.path if p.endswith("pyspark.zip") and os.path.exists(p)]
        yield pa.RecordBatch.from_pydict({"pyspark": [pyspark.__file__], "zips": pa.array([len(zips)], pa.int32())})


def test_python_workers_import_the_installed_pyspark_not_its_zip(spark: SparkSession) -> None:
    """Each Python process Spark starts would otherwise compile pyspark's sources from
    python/lib/pyspark.zip again (Python caches no bytecode for a zip)."""
    rows = spark.range(2, numPartitions=2).mapInArrow(_worker_imports, "pyspark string, zips int").collect()
    assert rows and all(r.zips == 0 for r in rows), rows
    import pyspark

    assert {r.pyspark for r in rows} == {pyspark.__file__}


def test_the_worker_spark_home_links_everything_but_the_zip(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark

    real = Path(pyspark.__file__).parent
    monkeypatch.delenv("SPARK_HOME", raising=False)
    home = worker_spark_home()
    assert home is not None
    home_path = Path(home)
    assert (home_path / "jars").resolve() == (real / "jars").resolve()
    assert (home_path / "bin" / "spark-submit").exists()
    libs = sorted(p.name for p in (home_path / "python" / "lib").iterdir())
    assert libs == sorted(p.name for p in (real / "python" / "lib").iterdir() if p.name != "pyspark.zip")
    assert worker_spark_home() == home  # one folder per process


def test_a_set_spark_home_or_a_failing_link_keeps_spark_s_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert worker_spark_home() is None
    monkeypatch.delenv("SPARK_HOME")
    monkeypatch.setattr(session_module, "_WORKER_HOMES", {})
    monkeypatch.setattr(session_module.tempfile, "tempdir", str(tmp_path))

    def refuse(self: Path, target: object) -> None:
        raise OSError("links not supported here")

    monkeypatch.setattr(Path, "symlink_to", refuse)
    assert worker_spark_home() is None
    assert os.listdir(tmp_path) == []  # the half-made folder is gone


def test_an_inherited_worker_home_whose_process_exited_is_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A child of an engine process inherits its SPARK_HOME; once that process exits, its folder is
    gone, and a session started then would find no spark-submit there."""
    monkeypatch.setattr(session_module, "_WORKER_HOMES", {})
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "retry-engine-spark-home-gone"))
    forget_gone_worker_home()
    assert "SPARK_HOME" not in os.environ
    home = worker_spark_home()
    assert home is not None and Path(home, "bin", "spark-submit").exists()
    # A live one (the parent still runs), or any other SPARK_HOME, is kept as it is.
    for kept in (home, str(tmp_path / "spark-3.5.1-bin-hadoop3")):
        monkeypatch.setenv("SPARK_HOME", kept)
        forget_gone_worker_home()
        assert os.environ["SPARK_HOME"] == kept
        assert worker_spark_home() is None


def test_a_local_checkpoint_is_written_through_the_filesystem_manager(spark: SparkSession, tmp_path: Path) -> None:
    """#15: Spark's default (FileContext) manager starts readlink/chmod processes for every checkpoint file on
    a pip-installed Hadoop; a checkpoint on local disk gets the FileSystem-based one, anything else keeps Spark's."""
    key, wanted = storage.CHECKPOINT_FILE_MANAGER, storage.FILESYSTEM_CHECKPOINT_MANAGER
    spark.conf.unset(key)
    try:
        # A file system this Spark cannot resolve (no hadoop-aws jars here) keeps the default.
        assert not storage.use_filesystem_checkpoints_on_local_disk(spark, "s3a://bucket/checkpoint")
        assert spark.conf.get(key, None) is None
        for local in (str(tmp_path / "a"), f"file://{tmp_path}/b"):
            spark.conf.unset(key)
            assert storage.use_filesystem_checkpoints_on_local_disk(spark, local), local
            assert spark.conf.get(key) == wanted
        # A manager set on the session (the user's) is kept.
        spark.conf.set(key, "org.example.TheirManager")
        assert not storage.use_filesystem_checkpoints_on_local_disk(spark, str(tmp_path / "c"))
        assert spark.conf.get(key) == "org.example.TheirManager"
    finally:
        spark.conf.set(key, wanted)
