"""Building the SparkSession the engine runs in.

The embedded default is ``local[2]`` with the RocksDB state store and
changelog checkpointing: the machine this targets has two cores, and the
schedule stage keeps its pending messages in state.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path

import pyarrow as pa
from pyspark import SparkContext
from pyspark.sql import SparkSession

from retry_engine.delta import _class_archive as class_archive
from retry_engine.delta._checkpoint import SHUFFLE_PARTITIONS_CONF
from retry_engine.delta._daemon import THREAD_FREE_ENV
from retry_engine.delta.storage import SPARK_REDACTED_OPTIONS
from retry_engine.errors import EnvironmentProblem

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[2]"
DEFAULT_SHUFFLE_PARTITIONS = 2
MIN_JAVA_MAJOR = 17
PYTHON_EXEC_KEYS = ("spark.pyspark.python", "spark.pyspark.driver.python")
ROCKSDB_PROVIDER = (
    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
)


def _java() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    return java if java and os.path.exists(java) else None


@functools.lru_cache(maxsize=4)
def _version_output(java: str) -> str:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    return (out.stderr + out.stdout).strip()


def java_version_text() -> str | None:
    """What ``java -version`` prints for the ``java`` on PATH (or JAVA_HOME), with its path; None without one."""
    java = _java()
    return None if java is None else f"{os.path.realpath(java)}\n{_version_output(java)}"


def java_major_version() -> int | None:
    """Return the major version of the ``java`` on PATH (or JAVA_HOME), or None."""
    java = _java()
    if java is None:
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', _version_output(java))
    if match is None:
        return None
    major = int(match.group(1))
    # Java 8 and older report "1.8".
    return int(match.group(2) or 0) if major == 1 else major


def require_java() -> None:
    """Raise :class:`EnvironmentProblem` unless Java 17 or newer is available."""
    major = java_major_version()
    if major is None:
        raise EnvironmentProblem(
            "no Java runtime found: Spark needs Java 17 or newer on PATH or in JAVA_HOME "
            "(Debian: apt-get install openjdk-17-jre-headless)",
            code="JAVA_MISSING",
        )
    if major < MIN_JAVA_MAJOR:
        raise EnvironmentProblem(
            f"Java {major} found; Spark 4 needs Java {MIN_JAVA_MAJOR} or newer",
            code="JAVA_TOO_OLD",
        )


# The zip of pyspark's Python sources that Spark puts first on every Python worker's path.
PYSPARK_ZIP = ("python", "lib", "pyspark.zip")
_WORKER_HOMES: dict[str, str] = {}
WORKER_HOME_PREFIX = "retry-engine-spark-home-"


def forget_gone_worker_home() -> None:
    """Unset a SPARK_HOME inherited from an engine process that has exited since (its folder is removed).

    spark-submit would not be found there; without it pyspark finds its own.
    """
    path = os.environ.get("SPARK_HOME", "")
    name = os.path.basename(os.path.normpath(path)) if path else ""
    if name.startswith(WORKER_HOME_PREFIX) and not os.path.isdir(path):
        del os.environ["SPARK_HOME"]


def worker_spark_home() -> str | None:
    """A SPARK_HOME for the pip-installed PySpark whose Python workers import pyspark compiled, not from its zip.

    Spark starts every Python process it needs (the worker daemons, the Python
    data source's planner and streaming runner: about ten in an engine's first
    minute, more when a worker is replaced) with
    ``$SPARK_HOME/python/lib/pyspark.zip`` first on ``PYTHONPATH``. Python never
    caches bytecode for a zip, so each of them compiles pyspark's sources
    again: measured here, 1.45 s of CPU to import what a worker needs from the
    zip against 0.52 s from the installed package. This returns a folder of
    symbolic links to the installed pyspark's folders, with ``python/lib``
    lacking only that zip, so the workers import the very same pyspark
    installation from site-packages, whose bytecode pip compiled at install.

    The folder is made once in the cache folder (``spark-home-<hash of the
    pyspark path>``, see :func:`retry_engine.delta._class_archive.cache_dir`)
    and shared by every process, so the JVM's class path is the same from run
    to run, which its class archive requires. Where the cache folder cannot be
    written, or holds something else under that name, a temporary folder per
    process (removed at exit) does the same.

    None (keep Spark's own) when ``SPARK_HOME`` is set (a real Spark
    distribution, or such a folder inherited from a parent engine process:
    see :func:`forget_gone_worker_home`), when pyspark is not a pip
    installation with its jars, or when links cannot be made.
    """
    if "SPARK_HOME" in os.environ:
        return None
    import pyspark

    real = Path(pyspark.__file__).parent
    if not (real / "jars").is_dir() or not real.joinpath(*PYSPARK_ZIP).is_file():
        return None
    made = _WORKER_HOMES.get(str(real))
    if made is not None and os.path.isdir(made):  # checked whole when this process took it
        return made
    home = _shared_home(real) or _temporary_home(real)
    if home is not None:
        _WORKER_HOMES[str(real)] = str(home)
    return None if home is None else str(home)


def _link_home(home: Path, real: Path) -> None:
    for entry in real.iterdir():
        if entry.name != "python":
            (home / entry.name).symlink_to(entry)
    lib = home / "python" / "lib"
    lib.mkdir(parents=True)
    for entry in real.joinpath("python").iterdir():
        if entry.name != "lib":
            (home / "python" / entry.name).symlink_to(entry)
    for entry in real.joinpath("python", "lib").iterdir():
        if entry.name != PYSPARK_ZIP[-1]:
            (lib / entry.name).symlink_to(entry)


def _links_to(home: Path, real: Path) -> bool:
    """Whether ``home`` is a whole worker home for ``real`` (as :func:`_link_home` makes it)."""
    try:
        if not home.is_dir() or home.joinpath(*PYSPARK_ZIP).exists():
            return False
        wanted = [(home / e.name, e) for e in real.iterdir() if e.name != "python"]
        wanted += [(home / "python" / e.name, e) for e in real.joinpath("python").iterdir() if e.name != "lib"]
        wanted += [(home / "python" / "lib" / e.name, e) for e in real.joinpath("python", "lib").iterdir()
                   if e.name != PYSPARK_ZIP[-1]]
        return all(link.is_symlink() and link.resolve() == entry.resolve() for link, entry in wanted)
    except OSError:
        return False


def _shared_home(real: Path) -> Path | None:
    cache = class_archive.cache_dir()
    home = cache / f"spark-home-{hashlib.sha256(str(real).encode()).hexdigest()[:12]}"
    if _links_to(home, real):
        return home
    staged: Path | None = None
    try:
        cache.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=".spark-home-", dir=cache))
        _link_home(staged, real)
        try:
            os.rename(staged, home)  # atomic; refused when another process made it first
        except OSError:
            pass
    except OSError as exc:
        log.info("no shared Spark home under %s (%s): a temporary one for this process", cache, exc)
        return None
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
    if _links_to(home, real):
        return home
    log.info("%s is not a Spark home this package made: a temporary one for this process", home)
    return None


def _temporary_home(real: Path) -> Path | None:
    home = Path(tempfile.mkdtemp(prefix=WORKER_HOME_PREFIX))
    try:
        _link_home(home, real)
    except OSError as exc:
        log.info("Spark's Python workers import pyspark from its zip (no links under %s: %s)", home, exc)
        shutil.rmtree(home, ignore_errors=True)
        return None
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


DRIVER_JAVA_OPTIONS_KEY = "spark.driver.extraJavaOptions"
DAEMON_MODULE_KEY = "spark.python.daemon.module"
DAEMON_MODULE = "retry_engine.delta._daemon"
DAEMON_ENV_CONF = {f"spark.executorEnv.{name}": value for name, value in THREAD_FREE_ENV.items()}
DAEMON_KEYS = (DAEMON_MODULE_KEY, *DAEMON_ENV_CONF)
DRIVER_JAVA_OPTIONS = "-Xss32m"
# Options by which a user's spark.driver.extraJavaOptions already set the threads' stack size
# (not -XX:CompilerThreadStackSize or -XX:VMThreadStackSize: other threads').
_STACK_SIZE_CHOICES = ("-Xss", "-XX:ThreadStackSize=")
# The smallest driver thread stack (KiB) a stop during a batch was measured to need (16m; see with_stack_size).
MIN_STACK_KIB = 16 * 1024
# The engine's own local JVM compiles with C1 only (HotSpot's client compiler, no C2):
# see quick_jit_options.
QUICK_JIT_OPTION = "-XX:TieredStopAtLevel=1"
QUICK_JIT_ENV = "RETRY_ENGINE_QUICK_JIT"
# Options by which a user's spark.driver.extraJavaOptions already chooses how the JVM compiles.
_JIT_CHOICES = ("TieredStopAtLevel", "TieredCompilation", "-Xint", "-Xcomp")
ARROW_MAX_BYTES_PER_BATCH = 8 * 1024 * 1024
ARROW_MAX_BYTES_KEY = "spark.sql.execution.arrow.maxBytesPerBatch"
# No byte cap, so no per-row size check (Spark 4.3's own default is a 64 MiB cap, checked per row).
ARROW_MAX_BYTES_NONE = str(2**31 - 1)


def spark_conf(
    *,
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The Spark settings the engine relies on, as a plain dict (also used by spark-submit)."""
    conf = {
        SHUFFLE_PARTITIONS_CONF: str(shuffle_partitions),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Arrow batches to Python bounded by rows only (10,000), not bytes: see capped_arrow_batches.
        ARROW_MAX_BYTES_KEY: ARROW_MAX_BYTES_NONE,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Plans show data source options: the deltars source's and sink's storage options are redacted by
        # the engine's own rule, not only Spark's secret/token/password ones.
        "spark.sql.redaction.options.regex": SPARK_REDACTED_OPTIONS,
        # The Python workers must run the interpreter that has pyarrow and deltalake.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        # Python workers forked with their imports done (retry_engine.delta._daemon), from a
        # daemon that these variables keep single-threaded.
        DAEMON_MODULE_KEY: DAEMON_MODULE,
        **DAEMON_ENV_CONF,
    }
    conf.update(extra or {})
    # The user's own driver JVM options keep the stream thread's stack (with_stack_size).
    conf[DRIVER_JAVA_OPTIONS_KEY] = with_stack_size(conf.get(DRIVER_JAVA_OPTIONS_KEY, ""))
    return conf


def with_stack_size(options: str) -> str:
    """The driver JVM's ``options`` with :data:`DRIVER_JAVA_OPTIONS` first, unless they set a stack size.

    Stopping a query while its Python foreachBatch runs makes Spark match the
    long Py4J error text against a backtracking regex
    (``StreamExecution.isInterruptionException``) on the stream thread; with the
    default stack that overflows: a StackOverflowError on the stream thread
    instead of a clean stop, and (4 of 6 stops measured, with a user's
    ``spark.driver.extraJavaOptions`` that only named a log4j file) the Python
    process died with a segmentation fault at exit; 0 of 6 with this stack.
    16m sufficed in a measured stop; 32m leaves room. A user's own options
    (``engine.spark_conf``) used to replace it.
    """
    if any(option.startswith(_STACK_SIZE_CHOICES) for option in options.split()):
        return options
    return f"{DRIVER_JAVA_OPTIONS} {options}".strip()


def driver_stack_kib(spark: SparkSession) -> int | None:
    """The driver JVM's thread stack size in KiB (HotSpot's ``ThreadStackSize``; 0: the platform's
    default), or None where the JVM does not say (not HotSpot, or no JVM)."""
    try:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
            jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
        return int(bean.getVMOption("ThreadStackSize").getValue())
    except Exception as exc:  # noqa: BLE001 - only a check; any JVM still runs the engine
        log.debug("the driver JVM's thread stack size is not known: %s", exc)
        return None


def small_stack_warning(kib: int | None) -> str | None:
    """What to tell a user whose driver JVM has a thread stack below :data:`MIN_STACK_KIB`; None if it is large
    enough or not known."""
    if kib is None or kib >= MIN_STACK_KIB:
        return None
    size = "the platform's default" if kib <= 0 else f"{kib} KiB"
    return (
        f"the driver JVM's thread stack is {size}: stopping the engine during a batch can overflow it in "
        "Spark's stop check (a StackOverflowError on the stream thread instead of a clean stop; the Python "
        f"process may then crash at exit); start the driver with {DRIVER_JAVA_OPTIONS} "
        f"(spark-submit --driver-java-options {DRIVER_JAVA_OPTIONS})"
    )


def warn_on_small_stack(spark: SparkSession) -> None:
    """Log :func:`small_stack_warning` for the session's driver JVM: under spark-submit, or a session that
    existed before, the JVM's options are not the engine's to set (:func:`with_stack_size`)."""
    warning = small_stack_warning(driver_stack_kib(spark))
    if warning is not None:
        log.warning(warning)


def quick_jit_options(options: str) -> str:
    """``options`` (the driver JVM's) with :data:`QUICK_JIT_OPTION` added, unless they choose a JIT mode
    themselves or ``RETRY_ENGINE_QUICK_JIT`` is off.

    For the JVMs ``retry-engine run`` and ``demo`` launch on a local master. The
    engine's rows cross the JVM packed (a few binary values per micro-batch), so
    the JVM's peak code speed does not bound it, while C2, the optimizing
    compiler, took a large share of the two cores while the engine started.
    Measured here (bench/RESULTS.md, run X): start to first commit 8.2 -> 6.0 s,
    the first batch 2.6 -> 1.9 s, steady engine throughput unchanged at 10% and
    100% failures, the JVM's CPU per idle micro-batch 275 -> 170 ms. JVM-bound
    Spark work (a native Parquet copy) runs ~40% slower with C1 only, which is
    why sessions for other work (notebooks, the tests, the benchmarks) keep the
    JVM's default.
    """
    if not class_archive.switched_on(QUICK_JIT_ENV) or any(choice in options for choice in _JIT_CHOICES):
        return options
    return f"{options} {QUICK_JIT_OPTION}".strip()


def build_session(
    *,
    master: str | None = DEFAULT_MASTER,
    app_name: str = "retry-engine",
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    extra_conf: Mapping[str, str] | None = None,
    log_level: str = "WARN",
    quick_jit: bool = False,
) -> SparkSession:
    """Create (or return the active) SparkSession with the engine's settings.

    ``master=None`` keeps whatever master the launcher chose (spark-submit).
    ``quick_jit``: a local JVM this call launches compiles with C1 only
    (:func:`quick_jit_options`); the engine's own commands ask for it.

    The delta-rs data source (format ``deltars``) is registered on the session.
    """
    from retry_engine.delta import register

    if master is not None and master.startswith("local"):
        require_java()
    if master is not None:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is not None and SparkSession.getActiveSession() is None:
        # Read when the JVM is launched (by this getOrCreate, or a later session's).
        forget_gone_worker_home()
        home = worker_spark_home() if master.startswith("local") else None
        if home is not None:
            os.environ["SPARK_HOME"] = home
    # A JVM this call launches (a local master, no JVM yet) maps the class archive if there is one.
    launching = master is not None and master.startswith("local") and SparkContext._gateway is None
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    conf = spark_conf(shuffle_partitions=shuffle_partitions, extra=extra_conf)
    if master is None:
        # Under spark-submit the executors' interpreter is the launcher's choice
        # (PYSPARK_PYTHON, --conf spark.pyspark.python): on a cluster the driver's
        # own path may not exist on the workers, and this package may reach them only
        # with a task (--py-files), too late for the daemon that forks the workers.
        for key in (*PYTHON_EXEC_KEYS, *DAEMON_KEYS):
            if extra_conf is None or key not in extra_conf:
                conf.pop(key, None)
    if launching:
        if quick_jit:
            conf[DRIVER_JAVA_OPTIONS_KEY] = quick_jit_options(conf.get(DRIVER_JAVA_OPTIONS_KEY, ""))
        archive = class_archive.jvm_options(os.environ.get("SPARK_HOME"), java_version_text())
        if archive:
            conf[DRIVER_JAVA_OPTIONS_KEY] = f"{conf.get(DRIVER_JAVA_OPTIONS_KEY, '')} {archive}".strip()
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    warn_on_small_stack(spark)
    register(spark)
    log.info("spark session ready: master=%s app=%s", master, app_name)
    return spark


def read_parallelism(spark: SparkSession) -> str:
    """``readPartitions`` for a ``format("deltars")`` read on ``spark``: its default parallelism
    (the cores of its executors), so a batch's files become about one read task per core, as
    Spark's own file source packs them. A session without a SparkContext (Spark Connect) gets
    ``spark.default.parallelism`` if it is set, else one task per file as without the option."""
    try:
        return str(max(1, int(spark.sparkContext.defaultParallelism)))
    except Exception:  # Spark Connect: no SparkContext on the client
        configured = (spark.conf.get("spark.default.parallelism", None) or "").strip()
        if configured.isascii() and configured.isdigit() and int(configured) >= 1:
            return configured
        return str(2**31 - 1)


def set_jvm_log_level(spark: SparkSession, logger: str, level: str) -> None:
    """Set one JVM (log4j 2) logger's level, e.g. to silence a warning the engine reports itself.

    ``level`` is a log4j level name (``OFF``, ``ERROR``, ``WARN``...). No-op on a stopped session.
    """
    jvm = spark.sparkContext._jvm
    if jvm is not None:
        log4j = jvm.org.apache.logging.log4j
        log4j.core.config.Configurator.setLevel(logger, log4j.Level.getLevel(level))


def _worker_pid(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        yield pa.RecordBatch.from_pydict({"pid": pa.array([os.getpid()], pa.int64())})


WARM_WORKERS_ENV = "RETRY_ENGINE_WARM_WORKERS"


def warming_workers() -> bool:
    """Whether ``retry-engine run`` warms the Python workers (``RETRY_ENGINE_WARM_WORKERS=off`` turns it off)."""
    return class_archive.switched_on(WARM_WORKERS_ENV)


def warm_python_workers(spark: SparkSession) -> threading.Thread:
    """Start the Python worker daemon now, on a thread, rather than in the first micro-batch.

    A one-row ``mapInArrow`` job: Spark starts the worker daemon for it
    (:mod:`retry_engine.delta._daemon`, ~0.5 s of imports on one core) and keeps
    its worker for the next Python task, while the query is being started
    (JVM and data-source planning). ``retry-engine run`` calls it on a local
    master unless :func:`warming_workers` says no (bench/RESULTS.md, run T). A
    failure (the session stopped under it) is logged, never raised.
    """

    def job() -> None:
        try:
            rows = spark.range(1, numPartitions=1).mapInArrow(_worker_pid, "pid long").collect()
            log.debug("Python worker %s started before the first batch", rows[0].pid)
        except Exception as exc:  # noqa: BLE001 - only a head start; the query starts its own workers
            log.debug("warming the Python workers failed: %s", exc)

    thread = threading.Thread(target=job, name="retry-engine-warm-workers", daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def capped_arrow_batches(spark: SparkSession) -> Generator[None, None, None]:
    """Start a streaming query (or run a batch action) inside this to give it a byte cap on the
    Arrow batches Spark sends to Python.

    The engine's rows cross to Python packed (:mod:`retry_engine.core.packed`):
    a few rows of up to 4 MB each, so the row count per Arrow batch (10,000)
    bounds nothing, and Spark builds each batch in JVM direct memory; the
    consumer's and the producer's messages carry bodies of up to
    ``max_body_bytes`` each, so they take the cap too. With
    ``spark.sql.execution.arrow.maxBytesPerBatch`` set, Spark measures the batch
    after every row, which costs little on the packed rows' three flat columns
    but was most of the JVM's time on wide rows with nested columns (the
    deltars sink's own writes: 2.7 s -> 1.1 s a 200,000-row batch without it,
    bench/RESULTS.md run U). So the session has no cap (:func:`spark_conf`; Spark's
    own default is a 64 MiB one); a query started here gets one (a streaming query
    keeps a copy of its session's SQL settings from its start) and the session
    gets back what it had. A cap the session has (``engine.spark_conf``, or a
    session not built here that keeps Spark's default) is kept as it is.
    """
    before = spark.conf.get(ARROW_MAX_BYTES_KEY)
    if before != ARROW_MAX_BYTES_NONE:
        yield
        return
    spark.conf.set(ARROW_MAX_BYTES_KEY, str(ARROW_MAX_BYTES_PER_BATCH))
    try:
        yield
    finally:
        spark.conf.set(ARROW_MAX_BYTES_KEY, before)
