"""``retry_engine.redrive_tasks``: the public import path of :mod:`retry_engine.ops.redrive_tasks` (the same module object)."""

import sys as _sys

from retry_engine.ops import redrive_tasks as _module
from retry_engine.ops.redrive_tasks import *  # noqa: F403  (the names, for type checkers)

_sys.modules[__name__] = _module
