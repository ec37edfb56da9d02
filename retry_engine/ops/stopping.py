"""Stopping long-running commands cleanly on Ctrl-C (SIGINT) and SIGTERM.

A signal handler only records the signal (:class:`StopSignals`); the main
thread notices it between short waits and stops the streaming queries
itself. PySpark's own SIGINT handler instead cancels every Spark job and
raises ``KeyboardInterrupt`` inside whatever py4j call the main thread is
blocked in, which leaves the py4j connection half-read ("reentrant call"),
prints py4j and Java stack traces, and kills the query before its terminated
event or lease release can be written.

Nothing here runs inside a micro-batch.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Exit codes after a requested stop. SIGTERM is how service managers (systemd,
# Kubernetes, docker stop) ask for a stop, so a clean stop on it is success;
# Ctrl-C exits 128 + SIGINT like shells report an interrupted command.
EXIT_STOPPED_BY_SIGTERM = 0
EXIT_STOPPED_BY_SIGINT = 128 + signal.SIGINT

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# JVM loggers that report the interruption of a stopping query as an error or
# print its stack (see quiet_stop_logs): the stop is requested, so these are noise.
STOP_NOISE_LOGGERS = (
    # query.stop() interrupts the stream thread; an interrupt landing while the
    # batch's broadcast is stored makes TorrentBroadcast log "Store broadcast ... fail".
    "org.apache.spark.broadcast.TorrentBroadcast",
    # ... or while Hadoop's local file system forks `readlink` for a checkpoint rename
    # (WARN with the InterruptedException's stack).
    "org.apache.hadoop.util.Shell",
    # Cancelling the stopped batch's job group finds no job when the batch was between jobs.
    "org.apache.spark.scheduler.DAGScheduler",
    # One WARN per task of the cancelled job: "Lost task ... TaskKilled (... SPARK_JOB_CANCELLED ...)".
    "org.apache.spark.scheduler.TaskSetManager",
    # A batch abandoned while it writes through a Python data source (the consumer's results, after
    # the wait for its batch ran out): ERROR "Data source write support ... is aborting" and "failed
    # to abort". Nothing was committed; the batch is replayed at the next start.
    "org.apache.spark.sql.execution.datasources.v2.AppendDataExec",
    # Stopping the SparkContext interrupts its cleaner thread while it removes an unreferenced
    # broadcast: ERROR "Error cleaning broadcast N" with the InterruptedException's stack (seen
    # once in CI's SIGTERM test, 2026-11-29). Only cleanup of what the process is about to drop.
    "org.apache.spark.ContextCleaner",
)
# Python loggers that do the same on the driver: py4j logs, with the whole Java stack, the
# SPARK_JOB_CANCELLED error that the stop makes a running foreachBatch call raise
# ("There was an exception while executing the Python Proxy on the Python Side").
STOP_NOISE_PYTHON_LOGGERS = ("py4j.clientserver", "py4j.java_gateway")


def exit_code(signum: int) -> int:
    """The command's exit code after a clean stop requested by ``signum``."""
    return EXIT_STOPPED_BY_SIGINT if signum == signal.SIGINT else EXIT_STOPPED_BY_SIGTERM


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignals:
    """While entered, SIGINT and SIGTERM only set :attr:`received`; the previous handlers come back on exit.

    Enter it after the SparkSession exists: creating a SparkContext installs
    PySpark's own SIGINT handler, which this one replaces. Must be entered in
    the main thread (Python delivers signals there only).
    """

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        self._signals = signals
        self._previous: dict[int, Any] = {}
        self._event = threading.Event()
        self.received: int | None = None

    def __enter__(self) -> StopSignals:
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between bytecodes: no I/O but one log line, no Spark calls.
        if self.received is None:
            self.received = signum
            log.info("%s received: stopping after the current batch (again to exit at once)", signal_name(signum))
        else:
            # The stop waits for the running batch's commits, minutes on a slow store: a second signal
            # ends the process now, as a crash would (safe: the next start replays the batch, and the
            # lease is free once this process is gone, at once for a start on this host).
            log.warning("%s received again: exiting now, without waiting for the running batch", signal_name(signum))
            for handler in logging.getLogger().handlers:
                handler.flush()
            os._exit(128 + signum)
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True as soon as a stop was requested (wakes on the signal)."""
        return self._event.wait(timeout)


def quiet_stop_logs(spark: SparkSession) -> None:
    """Silence the loggers in :data:`STOP_NOISE_LOGGERS` and :data:`STOP_NOISE_PYTHON_LOGGERS` from now on.

    Call right before stopping queries on purpose, in a process that ends
    after the stop: these loggers then only report the stop's own
    interruption. Errors of every other logger still show.
    """
    for name in STOP_NOISE_PYTHON_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    from retry_engine.delta.session import set_jvm_log_level

    for name in STOP_NOISE_LOGGERS:
        set_jvm_log_level(spark, name, "OFF")


# How long drain_tasks waits for the tasks of abandoned batches to end. Cancelled Python
# tasks end within spark.python.task.killTimeout (2 s) once their worker is killed.
DRAIN_TASKS_SECONDS = 15.0
DRAIN_POLL_SECONDS = 0.05


def running_tasks(spark: SparkSession) -> int:
    """Tasks running on the session's executors, as Spark's status tracker counts them."""
    infos = spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos()
    return sum(int(info.numRunningTasks()) for info in infos)


def drain_tasks(spark: SparkSession, *, drain_s: float = DRAIN_TASKS_SECONDS) -> bool:
    """Cancel every job still running and wait (up to ``drain_s``) until no task runs.

    For a process that ends after stopping its queries: a stop abandons a
    micro-batch that does not finish in time, and ``query.stop()`` returns
    before that batch's tasks have ended. Stopping Spark (``spark.stop()`` or
    the JVM's shutdown hook) with a task still running shuts the block manager
    and the result getter down under it, and Spark logs ERROR stacks
    ("Exception in statusUpdate", "Block broadcast_N does not exist",
    "Exception in task") for a stop that went as asked. Returns False when
    tasks still ran at ``drain_s``, or when Spark could not be asked (its JVM
    is gone: nothing is left to drain, and the error that ended it is the one
    to report, not this).
    """
    try:
        spark.sparkContext.cancelAllJobs()
        deadline = time.monotonic() + drain_s
        while running_tasks(spark):
            if time.monotonic() >= deadline:
                log.warning("tasks still running %.0f s after cancelling them; stopping Spark anyway", drain_s)
                return False
            time.sleep(DRAIN_POLL_SECONDS)
    except Exception as exc:  # py4j errors, a stopped SparkContext
        log.debug("could not drain Spark's tasks: %s", exc)
        return False
    return True


def stop_session(spark: SparkSession, *, drain_s: float = DRAIN_TASKS_SECONDS) -> bool:
    """:func:`drain_tasks`, then stop the session (also when draining failed). Returns what draining did."""
    try:
        return drain_tasks(spark, drain_s=drain_s)
    finally:
        try:
            spark.stop()
        except Exception as exc:  # the JVM is gone (killed with the process group): nothing left to stop
            log.debug("could not stop the Spark session: %s", exc)
