"""``retry_engine.resolve``: the public import path of :mod:`retry_engine.ops.resolve` (the same module object)."""

import sys as _sys

from retry_engine.ops import resolve as _module
from retry_engine.ops.resolve import *  # noqa: F403  (the names, for type checkers)

_sys.modules[__name__] = _module
