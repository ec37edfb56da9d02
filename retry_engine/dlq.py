"""``retry_engine.dlq``: the public import path of :mod:`retry_engine.clients.dlq` (the same module object)."""

import sys as _sys

from retry_engine.clients import dlq as _module
from retry_engine.clients.dlq import *  # noqa: F403  (the names, for type checkers)

_sys.modules[__name__] = _module
