"""PySpark's Python worker daemon, with workers that leave Ctrl-C to the driver.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group: the
driver, the JVM and the Python workers. PySpark starts the JVM ignoring
SIGINT (the driver handles it), and the daemon the JVM starts inherits that,
but PySpark's daemon turns SIGINT back on in every worker it forks ("useful
for debugging"), so a worker busy with a task raises KeyboardInterrupt, the
task fails, and the batch the driver is finishing fails with it. Here the
workers keep SIGINT ignored; everything else is PySpark's own daemon.

Used through ``spark.python.daemon.module`` by the local sessions of
``retry-engine run`` and ``demo`` only (:func:`retry_engine.stopping.local_worker_conf`):
the workers must be able to import this package, which is certain only on
the driver's machine with the driver's interpreter.
"""

from __future__ import annotations

import signal
import types
from collections.abc import Callable
from typing import Any

from pyspark import daemon

_set_handler = signal.signal


def _keep_sigint_ignored(signum: int, handler: Callable[[int, Any], Any] | int | None) -> Any:
    if signum == signal.SIGINT:
        return _set_handler(signum, signal.SIG_IGN)
    return _set_handler(signum, handler)


# pyspark.daemon calls the signal module through its module global `signal`: give it one
# whose signal() keeps SIGINT ignored and passes every other call through.
_signals = types.ModuleType("signal")
_signals.__dict__.update({name: getattr(signal, name) for name in dir(signal) if not name.startswith("__")})
_signals.signal = _keep_sigint_ignored  # type: ignore[attr-defined]
daemon.signal = _signals  # type: ignore[attr-defined]

if __name__ == "__main__":
    daemon.manager()
