"""Ending, at interpreter exit, what a process started and did not end itself: within a bound.

A script or notebook that ends without :func:`retry_engine.core.engine.stop`
(or a consumer's ``shutdown``) would leave its engine query's end unrecorded,
its lease held and its consumers in their groups. :func:`at_exit` registers a
function that lists what is left; at exit each item is ended on a daemon
thread, and the exit waits for them at most :data:`EXIT_SECONDS` in all: an
end that needs storage that no longer answers (delta-rs retries a request for
up to 180 s) leaves the item as a crash would, with a warning, instead of
holding the process.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

# How long a process's exit waits for the items of one at_exit registration, in all.
EXIT_SECONDS = 30.0

Ending = tuple[str, Callable[[], object]]


def at_exit(what: str, left: Callable[[], Sequence[Ending]]) -> None:
    """At interpreter exit, call each ``(name, end)`` that ``left()`` returns then, in order.

    Only in this process: a child forked from it that exits through the interpreter (not
    ``os._exit``, as multiprocessing's children do) inherits the list but must never stop
    or release what the parent runs.
    """
    atexit.register(end_left_in, os.getpid(), what, left)


def end_left_in(pid: int, what: str, left: Callable[[], Sequence[Ending]]) -> bool:
    """:func:`end_left` in the process ``pid``; in any other (a forked child) nothing."""
    return os.getpid() != pid or end_left(what, left)


def end_left(what: str, left: Callable[[], Sequence[Ending]], *, timeout_s: float | None = None) -> bool:
    """End what ``left()`` lists, on a daemon thread; False when that took longer than the bound."""
    items = list(left())
    if not items:
        return True
    done = threading.Event()

    def run() -> None:
        for name, end in items:
            try:
                end()
            except Exception:  # noqa: BLE001 - the process is ending: say what was not done, end the rest
                log.exception("%s %s: ending it at exit failed", what, name)
        done.set()

    threading.Thread(target=run, name=f"retry-engine-exit-{what}", daemon=True).start()
    bound = EXIT_SECONDS if timeout_s is None else timeout_s
    if done.wait(bound):
        return True
    log.warning(
        "%s: ending %s at exit took longer than %g s; the process ends without waiting (as after a crash: "
        "a lease then expires, a consumer's heartbeat too)",
        what, ", ".join(name for name, _ in items), bound,
    )
    return False
