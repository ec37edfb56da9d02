"""Spark's Python worker daemon, with the workers' imports done once, before it forks.

``spark.python.daemon.module`` (set by :func:`retry_engine.delta.session.spark_conf`).
PySpark's daemon (``pyspark.daemon``) forks a worker per concurrent Python task
and each worker then imports pyspark's worker, pandas, pyarrow, deltalake and
this package: ~0.45 s per worker on a hot cache, paid by the first batch of
every start (two workers on ``local[2]``, and again whenever a worker is
replaced). This daemon imports them once and forks workers that already have
them (bench/RESULTS.md, run T: with the warm-up job of
:func:`retry_engine.delta.session.warm_python_workers`, the first batch after a
restart 2.4 -> 1.3 s).

Why PySpark does not: it imports the worker module after the fork because
pandas and pyarrow "start some threads when they are imported", and forking a
process that has other threads can hand the child a lock that no thread will
ever release. Measured on pyarrow 22 / numpy 2: those threads are numpy's
OpenBLAS pool and the jemalloc background threads of pyarrow and of
deltalake's Rust allocator, and the session turns each off for the Python
workers through ``spark.executorEnv`` (:data:`THREAD_FREE_ENV`; pyarrow's
memory pool here is mimalloc, and jemalloc without a background thread purges
on its allocation paths instead). After importing, the daemon counts its own
threads; unless it is alone (or where it cannot count them: no
``/proc/self/task``), it replaces itself with PySpark's daemon (``exec``: same
process, same pipes, before it has told Spark its port), so it never forks
with a second thread, whatever a future release of a library starts.

Before forking it collects and freezes its heap (``gc.freeze``, CPython's
advice for a forking server): the children share those pages and their
per-task collection does not walk the imported modules
(:mod:`retry_engine.delta._worker_heap`). numpy's global random state is
reseeded in each child, as a fresh import would have seeded it. The jars
without Python that Spark puts on the path leave it first
(:func:`without_pythonless_jars`).
"""

from __future__ import annotations

import gc
import os
import sys

# Environment for the Python workers that keeps the imports below from starting threads.
THREAD_FREE_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
    "_RJEM_MALLOC_CONF": "background_thread:false",
}
# What a worker imports to run the engine's tasks (the Delta source and sink, the stages).
PRELOAD = (
    "pandas",
    "pyarrow",
    "pyspark.worker",
    "pyspark.sql.pandas.serializers",
    "retry_engine.delta",
    "retry_engine.core.engine",
    "retry_engine.core.outputs",
    "retry_engine.core.schedule",
)
PYSPARK_DAEMON = "pyspark.daemon"


def thread_count() -> int | None:
    """The threads of this process (None where ``/proc`` cannot tell)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def preload(modules: tuple[str, ...] = PRELOAD) -> bool:
    """Import ``modules``; whether they all imported and this process is still its only thread.

    Where the threads cannot be counted nothing is imported (False).
    """
    import importlib

    if thread_count() is None:
        return False
    try:
        for name in modules:
            importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any failure: PySpark's daemon, whose workers report it
        print(f"retry_engine.delta._daemon: importing {name} failed ({exc!r}); using {PYSPARK_DAEMON}",
              file=sys.stderr)
        return False
    return thread_count() == 1


def without_pythonless_jars(path: list[str]) -> list[str]:
    """``path`` without the ``.jar`` files that hold no Python module.

    Spark puts its own ``spark-core`` jar on the workers' path (5,973 entries,
    no Python in it), and a worker's first task calls ``importlib.invalidate_caches()``
    (when it puts the task's files folder on the path), which makes Python's zip
    importer re-read the directory of each zip it has an importer for: 36-40 ms
    per new worker, measured, for that jar alone. Nothing can be
    imported from a zip without ``.py`` or ``.pyc`` entries, so dropping it changes
    no import. A jar that cannot be read is kept (the import system decides).
    """
    import zipfile

    def pythonless(entry: str) -> bool:
        if not entry.endswith(".jar"):
            return False
        try:
            with zipfile.ZipFile(entry) as jar:
                return not any(name.endswith((".py", ".pyc")) for name in jar.namelist())
        except (OSError, zipfile.BadZipFile):
            return False

    return [entry for entry in path if not pythonless(entry)]


def _drop_pythonless_jars() -> None:
    """Take those jars off ``sys.path`` and out of the importers Python cached for them.

    The cache also holds importers for folders inside a jar (``<jar>/org``: the
    standard library's ``from org.python.core import ...``, for Jython, found the
    jar's ``org`` folder while the jar was on the path), and ``invalidate_caches``
    walks the cache, not the path.
    """
    kept = without_pythonless_jars(sys.path)
    for jar in set(sys.path) - set(kept):
        for key in [k for k in sys.path_importer_cache if k == jar or k.startswith(jar + os.sep)]:
            del sys.path_importer_cache[key]
    sys.path[:] = kept


def _reseed_numpy() -> None:
    import numpy as np

    np.random.seed()


def main() -> None:
    if not preload():
        os.execv(sys.executable, [sys.executable, "-m", PYSPARK_DAEMON, *sys.argv[1:]])
    _drop_pythonless_jars()
    gc.collect()
    gc.freeze()
    os.register_at_fork(after_in_child=_reseed_numpy)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()

