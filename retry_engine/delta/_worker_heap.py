"""A Python worker's start-up heap, frozen once so PySpark's per-task ``gc.collect()`` skips it.

A reused PySpark worker runs a full ``gc.collect()`` after every task
(``pyspark/daemon.py``, the loop that serves tasks). Once it has imported
pyspark, pandas, pyarrow, deltalake and this package it holds about 90,000
tracked objects (modules, classes, functions, caches), so that collection costs
30-80 ms a task on this machine, and a micro-batch runs several Python tasks.
In the soak benchmark's small batches it was most of the workers' CPU (py-spy
and ``/proc`` sampling, bench/RESULTS.md).

:func:`settle` collects once and then ``gc.freeze()``-s what is alive: the
permanent generation is never walked again, so later collections only see what
tasks allocate. Objects frozen stay collectable by reference counting; only a
reference cycle among them would outlive its use, and the collection just
before the freeze leaves none behind. Called first thing by every function this
package runs in a worker (the Delta source's ``read``, the sink's ``write``, the
decide, schedule and write stages). In any other process (the driver, a test,
a notebook) it does nothing: freezing there would keep a long-lived process's
cycles forever.

A worker is reused for whatever task comes next, so its heap keeps growing
after the first freeze: a worker whose first task was the source's ``read``
(pyarrow, deltalake) imports pandas and pyspark's pandas serializers only when
it later runs the schedule stage. Those ~30,000 objects were never frozen, and
the per-task collection walking them took 14-130 ms again (measured at 100%
failures: ``gc.collect`` was 20-27% of three of four workers' py-spy samples).
So :func:`settle` freezes again whenever modules were imported since the last
freeze (``len(sys.modules)`` changed): a handful of times per worker (at most
:data:`MAX_SETTLES`), each at the start of a call, before the task allocates
its rows.
"""

from __future__ import annotations

import gc
import sys

# `python -m retry_engine.delta._daemon` forks the workers (the engine's session), or
# `python -m pyspark.daemon` (Spark's default); `python -m pyspark.worker` runs one directly
# (spark.python.use.daemon=false).
_WORKER_MAINS = frozenset({"retry_engine.delta._daemon", "pyspark.daemon", "pyspark.worker"})
# len(sys.modules) when this process last settled (-1: never), and how often it did.
_settled_at = -1
_settles = 0
# A bound on re-freezing: each freeze keeps whatever cycles are alive at that moment, so a process
# whose module count never stops changing must not freeze at every call.
MAX_SETTLES = 16


def in_python_worker() -> bool:
    """Whether this process is a PySpark Python worker (its ``__main__`` is the daemon or worker module)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) in _WORKER_MAINS


def settle() -> None:
    """In a Python worker, when modules were imported since it last did: collect, then freeze the heap.

    See the module docstring; the check costs one ``len`` when nothing was imported.
    """
    global _settled_at, _settles
    modules = len(sys.modules)
    if modules == _settled_at or _settles >= MAX_SETTLES:
        return
    _settled_at = modules
    _settles += 1
    if in_python_worker():
        gc.collect()
        gc.freeze()
