"""The engine's Spark session on the embedded default (#14 part 3: start-up)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from retry_engine.delta import _class_archive as class_archive
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


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A cache folder of this test's own, and no worker home made earlier in this process."""
    monkeypatch.setenv(class_archive.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setattr(session_module, "_WORKER_HOMES", {})
    return tmp_path / "cache"


def _real_pyspark() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def test_the_worker_spark_home_links_everything_but_the_zip(cache: Path) -> None:
    real = _real_pyspark()
    home = worker_spark_home()
    assert home is not None
    home_path = Path(home)
    assert home_path.parent == cache  # shared by every process, so the JVM's class path stays the same
    assert (home_path / "jars").resolve() == (real / "jars").resolve()
    assert (home_path / "bin" / "spark-submit").exists()
    libs = sorted(p.name for p in (home_path / "python" / "lib").iterdir())
    assert libs == sorted(p.name for p in (real / "python" / "lib").iterdir() if p.name != "pyspark.zip")
    assert worker_spark_home() == home  # one folder per process
    session_module._WORKER_HOMES.clear()
    assert worker_spark_home() == home  # and the same folder for the next process
    assert [p.name for p in cache.iterdir()] == [home_path.name]  # nothing staged is left behind


def test_a_cache_that_holds_something_else_or_cannot_be_written_gets_a_temporary_home(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Hostile caches: a file where the cache folder goes, a file or a broken folder under the home's name."""
    monkeypatch.setattr(session_module.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cache.parent.mkdir(exist_ok=True)
    cache.write_text("not a folder")
    first = worker_spark_home()
    assert first is not None and Path(first).parent == tmp_path / "tmp"
    assert Path(first, "bin", "spark-submit").exists()
    cache.unlink()
    made = Path(session_module._shared_home(_real_pyspark()) or "")
    assert made.parent == cache
    shutil.rmtree(made)
    made.write_text("a file under the home's name")
    session_module._WORKER_HOMES.clear()
    assert Path(worker_spark_home() or "").parent == tmp_path / "tmp"
    made.unlink()
    made.mkdir()
    (made / "jars").symlink_to(tmp_path)  # a folder that is not (or no longer) a whole home
    session_module._WORKER_HOMES.clear()
    assert Path(worker_spark_home() or "").parent == tmp_path / "tmp"
    assert sorted(p.name for p in cache.iterdir()) == [made.name]


def test_a_set_spark_home_or_a_failing_link_keeps_spark_s_own(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert worker_spark_home() is None
    monkeypatch.delenv("SPARK_HOME")
    monkeypatch.setattr(session_module.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()

    def refuse(self: Path, target: object) -> None:
        raise OSError("links not supported here")

    monkeypatch.setattr(Path, "symlink_to", refuse)
    assert worker_spark_home() is None
    assert os.listdir(tmp_path / "tmp") == []  # the half-made folders are gone
    assert os.listdir(cache) == []


def test_an_inherited_worker_home_whose_process_exited_is_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A child of an engine process inherits its SPARK_HOME; once that process exits, its folder is
    gone, and a session started then would find no spark-submit there."""
    monkeypatch.setattr(session_module, "_WORKER_HOMES", {})
    monkeypatch.setenv(class_archive.CACHE_ENV, str(tmp_path / "cache"))
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


_MAPPED = """
import sys
from retry_engine.delta.session import build_session
log = sys.argv[1]
# As `retry-engine run` launches its JVM: quick_jit.
spark = build_session(log_level="ERROR", extra_conf={"spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={log}"},
                      quick_jit=True)
spark.range(3).count()
jvm = spark.sparkContext._jvm
bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
    jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
print("ThreadStackSize", bean.getVMOption("ThreadStackSize").getValue())
print("TieredStopAtLevel", bean.getVMOption("TieredStopAtLevel").getValue())
"""


def test_a_prepared_class_archive_is_mapped_by_the_next_local_session(tmp_path: Path) -> None:
    """#14 part 3: `retry-engine prepare` (make venv runs it) writes the archive; a session launched after
    maps Spark's classes from it instead of loading them from the jars. The engine's commands launch it
    compiling with C1 only (quick_jit), the user's own JVM options kept, and the archive still maps; the
    user's options keep the engine's -Xss32m too (they replaced it before)."""
    home = os.environ.get("SPARK_HOME") or worker_spark_home()
    java = session_module.java_version_text()
    assert home is not None and java is not None
    if class_archive.verified_archive(home, java) is None:  # not prepared (pytest run without make)
        class_archive.write_archive()
    kept = subprocess.run([sys.executable, "-m", "retry_engine.ops.cli", "prepare", "--if-missing"],
                          env={**os.environ, "SPARK_HOME": home}, check=True, timeout=120, capture_output=True, text=True)
    assert kept.stdout.startswith(f"class archive: {class_archive.archive_path(home, java)} ("), kept.stdout
    assert kept.stdout.rstrip().endswith(" MB, kept)"), kept.stdout
    log = tmp_path / "class-load.log"
    env = {k: v for k, v in os.environ.items() if k != session_module.QUICK_JIT_ENV}
    mapped = subprocess.run([sys.executable, "-c", _MAPPED, str(log)], env={**env, "SPARK_HOME": home},
                            check=True, timeout=300, capture_output=True, text=True)
    assert mapped.stdout.splitlines()[-1] == "TieredStopAtLevel 1", mapped.stdout
    # The user's options (a class-load log) did not replace the stream thread's large stack (32m, in KiB).
    assert mapped.stdout.splitlines()[-2] == "ThreadStackSize 32768", mapped.stdout
    sources = Counter(line.rsplit(" source: ", 1)[-1] for line in log.read_text().splitlines() if " source: " in line)
    shared = sources["shared objects file (top)"]
    assert shared > 5_000 and shared > 10 * sum(n for s, n in sources.items() if s.startswith(("jar:", "file:"))), sources


_SMALL_STACK = """
from retry_engine.delta.session import build_session, driver_stack_kib
spark = build_session(log_level="ERROR", extra_conf={"spark.driver.extraJavaOptions": "-Xss1m"})
print("ThreadStackSize", driver_stack_kib(spark))
"""


def test_a_driver_jvm_with_a_small_stack_is_named_at_start(spark: SparkSession, caplog: pytest.LogCaptureFixture) -> None:
    """A driver JVM whose thread stack is too small for a stop during a batch (spark-submit without
    --driver-java-options -Xss32m, or a user's own -Xss1m) gets a warning that says what to do; the
    engine's own session (the tests') has 32m and gets none."""
    assert session_module.driver_stack_kib(spark) == 32 * 1024
    with caplog.at_level(logging.WARNING, logger=session_module.__name__):
        session_module.warn_on_small_stack(spark)
    assert not caplog.records
    small = subprocess.run([sys.executable, "-c", _SMALL_STACK], check=True, timeout=300, capture_output=True, text=True)
    assert small.stdout.splitlines()[-1] == "ThreadStackSize 1024", small.stdout
    assert "the driver JVM's thread stack is 1024 KiB: stopping the engine during a batch" in small.stderr, small.stderr
    assert "--driver-java-options -Xss32m" in small.stderr


def _worker_origin(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import gc
    import os
    import sys

    from retry_engine.delta._worker_heap import in_python_worker

    frozen = gc.get_freeze_count()
    parent = os.getppid()
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        daemon_argv = f.read().decode().split("\0")
    for _ in batches:
        yield pa.RecordBatch.from_pydict({
            "main": [sys.modules["__main__"].__spec__.name],
            "daemon": [" ".join(daemon_argv)],
            "daemon_threads": pa.array([len(os.listdir(f"/proc/{parent}/task"))], pa.int32()),
            "frozen": pa.array([frozen], pa.int64()),
            "settles": [in_python_worker()],
            "jars": [[p for p in [*sys.path, *sys.path_importer_cache] if ".jar" in p]],
        })


def test_python_workers_are_forked_by_the_preloading_daemon_which_has_one_thread(spark: SparkSession) -> None:
    """#14 part 3: the engine's session runs retry_engine.delta._daemon, which imported the
    workers' modules and forks them single-threaded (THREAD_FREE_ENV reached it), its heap frozen."""
    rows = spark.range(2, numPartitions=2).mapInArrow(
        _worker_origin, "main string, daemon string, daemon_threads int, frozen long, settles boolean, jars array<string>"
    ).collect()
    assert len(rows) == 2
    for row in rows:
        assert row.main == session_module.DAEMON_MODULE, row
        assert "-m retry_engine.delta._daemon" in row.daemon, row
        assert row.daemon_threads == 1, row
        # Forked with the daemon's imported heap frozen, and known as a worker, so settle() freezes
        # what tasks import later (without it every task's gc.collect walks the whole heap).
        assert row.frozen > 10_000 and row.settles, row
        # Spark's spark-core jar (no Python in it) is off the path and the importer cache: no task
        # re-reads its directory.
        assert row.jars == [], row
    assert spark.conf.get("spark.executorEnv.OPENBLAS_NUM_THREADS") == "1"



def test_warming_starts_a_worker_that_serves_the_next_python_task(
    spark: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    """#14 part 3: the warm-up job's (daemon-forked) worker stays idle for the query's tasks."""
    with caplog.at_level(logging.DEBUG, logger=session_module.__name__):
        session_module.warm_python_workers(spark).join(timeout=120)
    started = [r.args[0] for r in caplog.records if "started before the first batch" in r.getMessage()]
    assert len(started) == 1, caplog.text
    # Spark returns a worker to the idle pool as its task completes, which may be just after the
    # job's result reached the driver: tries a moment apart, for up to 60 s on a busy machine.
    later: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        later += [r.pid for r in spark.range(2, numPartitions=2).mapInArrow(session_module._worker_pid, "pid long").collect()]
        if started[0] in later:
            break
        time.sleep(0.5)
    assert started[0] in later, (started, later)

