"""``retry_engine.resend``: the public import path of :mod:`retry_engine.ops.resend` (the same module object)."""

import sys as _sys

from retry_engine.ops import resend as _module
from retry_engine.ops.resend import *  # noqa: F403  (the names, for type checkers)

_sys.modules[__name__] = _module
