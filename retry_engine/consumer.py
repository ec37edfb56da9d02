"""``retry_engine.consumer``: the public import path of :mod:`retry_engine.clients.consumer` (the same module object)."""

import sys as _sys

from retry_engine.clients import consumer as _module
from retry_engine.clients.consumer import *  # noqa: F403  (the names, for type checkers)

_sys.modules[__name__] = _module
