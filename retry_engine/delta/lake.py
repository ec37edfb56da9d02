"""Where the lake is, and whether there is one: the check the operator commands run first.

A command that reads a lake (``status``, ``plots``, ``dlq ...``) pointed at a
folder holding no engine table would otherwise answer as if the lake were
empty ("no dead letters"); :func:`require_lake` makes it a clear error instead,
naming where it looked and where that place came from. No Spark here.
"""

from __future__ import annotations

import os
import re

from retry_engine.config import EngineConfig
from retry_engine.core.names import TABLE_NAMES
from retry_engine.delta.storage import is_delta_table
from retry_engine.errors import LakeNotFoundError

# file:///x is a local folder; s3://, abfss://, gs://... are not checked as folders.
_REMOTE = re.compile(r"^(?!file://)[A-Za-z][A-Za-z0-9+.-]*://")


def is_local(path: str) -> bool:
    """Whether ``path`` is a local file-system path (a plain path or a ``file://`` URI)."""
    return _REMOTE.match(path) is None


def _local_form(path: str) -> str:
    return os.path.abspath(path.removeprefix("file://"))


def lake_tables(config: EngineConfig) -> dict[str, str]:
    """Every table the config names, by table name, with its location."""
    return {name: config.table_path(name) for name in TABLE_NAMES}


def require_lake(config: EngineConfig, *, origin: str) -> None:
    """Raise :class:`~retry_engine.errors.LakeNotFoundError` unless one of the config's tables exists.

    ``origin`` says where the lake setting came from (``--lake``, an
    environment variable, a config file), for the message.
    """
    tables = lake_tables(config)
    if any(is_delta_table(path) for path in tables.values()):
        return
    lake = config.engine.lake
    where = _local_form(lake) if is_local(lake) else lake
    if is_local(lake) and os.path.isfile(where):
        why = "is a file, not a folder"
    elif is_local(lake) and not os.path.exists(where):
        why = "does not exist"
    else:
        why = "holds no engine table"
    elsewhere = sorted(name for name, path in tables.items() if path != os.path.join(lake, name))
    also = f", and {', '.join(tables[n] for n in elsewhere)} ([tables])" if elsewhere else ""
    raise LakeNotFoundError(
        f"no lake at {where}: it {why} (looked for the tables {', '.join(TABLE_NAMES)} there{also}); "
        f"the lake comes from {origin}. Pass --lake PATH, or fix engine.lake, or run the engine first"
    )


def require_lake_folder(config: EngineConfig, *, origin: str, read_before: str | None = None) -> None:
    """Raise :class:`~retry_engine.errors.LakeNotFoundError` when the lake is a file (the engine creates a missing one).

    ``read_before``: where releases before 2026-11-23 read the config file's relative ``engine.lake``
    (from the working directory; since then from the file's folder). When no lake is at the config's
    place but one is there, the engine would start a new, empty lake beside the one it ran on
    (``LAKE_PATH_MOVED``).
    """
    lake = config.engine.lake
    if not is_local(lake):
        return
    if os.path.isfile(_local_form(lake)):
        raise LakeNotFoundError(
            f"the lake {_local_form(lake)} is a file, not a folder; the lake comes from {origin}. "
            "Pass --lake with a folder (it is created if missing), or fix engine.lake",
            code="LAKE_NOT_A_FOLDER",
        )
    moved = _lake_read_before(config, read_before)
    if moved is not None:
        raise LakeNotFoundError(
            f"no lake at {_local_form(lake)} (from {origin}), but {moved} holds one: the same path from the "
            "working directory, where releases before 2026-11-23 read it (a path in a config file is now "
            f"relative to the file's folder). Set engine.lake to {moved!r}, or pass --lake {moved} to run on "
            f"it; pass --lake {_local_form(lake)} to start a new lake there instead",
            code="LAKE_PATH_MOVED",
        )


def _lake_read_before(config: EngineConfig, read_before: str | None) -> str | None:
    """``read_before`` made absolute if it holds engine tables and the config's lake holds none."""
    if read_before is None:
        return None
    before, now = os.path.abspath(read_before), _local_form(config.engine.lake)
    if before == now or any(is_delta_table(os.path.join(now, name)) for name in TABLE_NAMES):
        return None
    return before if any(is_delta_table(os.path.join(before, name)) for name in TABLE_NAMES) else None


def engine_tables(config: EngineConfig) -> list[tuple[str, str, str]]:
    """What a running engine reads and writes: ``(role, name, location)``, inputs first.

    ``role`` is ``reads``, ``writes`` or ``keeps`` (its own state: the lake
    record and lease, and the Spark checkpoint).
    """
    from retry_engine.core.lease import state_path
    from retry_engine.core.outputs import ROUTED_TABLES

    # The native writer records no metrics (see README, native Delta mode).
    metrics = () if config.engine.table_format == "delta" else ("metrics",)
    written = [*(t.name for t in ROUTED_TABLES), *metrics, "progress"]
    return [
        ("reads", "consume_results", config.table_path("consume_results")),
        *(("writes", name, config.table_path(name)) for name in written),
        ("keeps", "lake record and lease", state_path(config.engine.lake)),
        ("keeps", "checkpoint", config.checkpoint_path),
    ]


def describe_engine_tables(config: EngineConfig) -> str:
    """:func:`engine_tables` as one log block: one line per table, location aligned."""
    rows = engine_tables(config)
    width = max(len(name) for _, name, _ in rows)
    return "\n".join(f"  {role:6} {name:{width}}  {location}" for role, name, location in rows)
