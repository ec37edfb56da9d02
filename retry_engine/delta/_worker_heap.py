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
"""

from __future__ import annotations

import gc
import sys

# `python -m pyspark.daemon` forks the workers (the default); `python -m pyspark.worker`
# runs one directly (spark.python.use.daemon=false).
_WORKER_MAINS = frozenset({"pyspark.daemon", "pyspark.worker"})
_settled = False


def in_python_worker() -> bool:
    """Whether this process is a PySpark Python worker (its ``__main__`` is the daemon or worker module)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) in _WORKER_MAINS


def settle() -> None:
    """In a Python worker, once: collect, then freeze the heap (see the module docstring)."""
    global _settled
    if _settled:
        return
    _settled = True
    if in_python_worker():
        gc.collect()
        gc.freeze()
