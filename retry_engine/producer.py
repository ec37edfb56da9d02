"""``retry_engine.producer``: the public import path of :mod:`retry_engine.clients.producer` (the same module object)."""

import sys as _sys

from retry_engine.clients import producer as _module
from retry_engine.clients.producer import *  # noqa: F403  (the names, for type checkers)

_sys.modules[__name__] = _module
