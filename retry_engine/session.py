"""``retry_engine.session``: the public import path of :mod:`retry_engine.delta.session` (the same module object)."""

import sys as _sys

from retry_engine.delta import session as _module
from retry_engine.delta.session import *  # noqa: F403  (the names, for type checkers)

_sys.modules[__name__] = _module
