"""``retry_engine.redrive``: the public import path of :mod:`retry_engine.ops.redrive` (the same module object)."""

import sys as _sys

from retry_engine.ops import redrive as _module
from retry_engine.ops.redrive import *  # noqa: F403  (the names, for type checkers)

_sys.modules[__name__] = _module
