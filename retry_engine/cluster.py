"""``retry_engine.cluster``: the public import path of :mod:`retry_engine.ops.cluster` (the same module object)."""

import sys as _sys

from retry_engine.ops import cluster as _module
from retry_engine.ops.cluster import *  # noqa: F403  (the names, for type checkers)

_sys.modules[__name__] = _module
