"""Delta tables kept open between commits, so a writer does not read a table's log afresh every batch.

Why: opening a table reads its last checkpoint and every commit after it; on
object storage each is a request (RESULTS run Z: ~10 per open at a checkpoint
every 10 commits), and the engine's driver commits to the same tables every
micro-batch. :func:`open_latest` instead brings the handle the last commit left
(:func:`keep`) up to date with ``update_incremental``, which reads only the
commits made since (one listing; usually none but the writer's own).

Safety: a kept handle is used only while its table is still the one it was
opened on. Its version's commit file is read again and compared byte for byte
with what it held when the handle was kept: an operator who dropped and
re-created the table has another log, whatever its length, and a kept snapshot
would otherwise take the new table's later commits as its own and commit on
top of them. Anything else unexpected (that file gone, a read error, a handle
whose commit failed: never kept) opens the table afresh, as before. A kept
handle is owned by one caller at a time (taken out of the cache, put back by
:func:`keep`), so threads never share one. Only processes that keep handles
use them; nothing is shared between processes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from retry_engine.delta._log import TableLocation, commit_log_path, join_path
from retry_engine.delta.storage import causes, reaching, settle_reads_at_exit

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

# Tables kept per process (the engine commits to about ten).
MAX_KEPT: Final = 64
# False: every commit opens its table afresh (what bench/bench_s3.py compares against).
KEEP_OPEN = True


@dataclass
class Handle:
    """A table opened for a commit, with the bytes of its version's commit file when known."""

    location: TableLocation
    table: DeltaTable
    version: int
    commit: bytes | None = None
    # The file system the same-table check reads through, built once per handle: on object storage
    # building one is a new store client (~5 ms of CPU), and a kept handle is checked every commit.
    _files: tuple[pafs.FileSystem, str] | None = field(default=None, repr=False)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        if self._files is None:
            self._files = self.location.filesystem()
        return self._files


_lock = threading.Lock()
_kept: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], Handle] = OrderedDict()


# Environment variables object stores take their settings from when no option gives them.
_STORE_ENV_PREFIXES: Final = ("AWS_", "AZURE_", "GOOGLE_")


def _key(location: TableLocation) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A kept handle's store was built from its options and the environment's store settings: with
    other settings (another endpoint, other credentials) it is another store, so another key."""
    env = ((k, v) for k, v in os.environ.items() if k.startswith(_STORE_ENV_PREFIXES))
    return location.table_uri, tuple(sorted((location.storage_options or {}).items())) + tuple(sorted(env))


def _commit_bytes(handle: Handle, version: int) -> bytes:
    fs, root = handle.filesystem()
    with fs.open_input_stream(join_path(root, commit_log_path(version))) as stream:
        data: bytes = stream.read()
    return data


def _has_commit(handle: Handle, version: int) -> bool:
    import pyarrow.fs as pafs

    fs, root = handle.filesystem()
    return bool(fs.get_file_info(join_path(root, commit_log_path(version))).type != pafs.FileType.NotFound)


def open_latest(location: TableLocation) -> Handle:
    """The table at ``location`` at its latest version: the kept handle brought up to date when its
    table is still the same, else opened afresh. Raises what ``DeltaTable(...)`` raises (delta-rs's
    ``TableNotFoundError`` when there is no table), a storage failure as a ``StorageError``."""
    with _lock:
        kept = _kept.pop(_key(location), None)
    if kept is not None:
        try:
            same = kept.commit is not None and _commit_bytes(kept, kept.version) == kept.commit
            if same:
                # delta-rs finds later commits by listing the whole ``_delta_log`` on a local disk (a
                # month of commits at a 1 s trigger: seconds per call). Commits are numbered without a
                # gap, so when the next one is not there, there is none: one lookup instead.
                if _has_commit(kept, kept.version + 1):
                    kept.table.update_incremental()
                kept.commit = kept.commit if kept.table.version() == kept.version else None
                kept.version = kept.table.version()
                return kept
            log.warning(
                "%s: version %d's commit is not the one this process last saw (the table was replaced?); "
                "opening it afresh", location.uri, kept.version,
            )
        except Exception as exc:  # a cleaned log, storage: the fresh open below says what is wrong
            log.info(
                "%s: kept handle not usable (%s); opening the table afresh",
                location.uri, ": ".join(causes(str(exc))) or type(exc).__name__,
            )
    from deltalake import DeltaTable

    settle_reads_at_exit()
    with reaching(location.uri):
        table = DeltaTable(location.table_uri, storage_options=dict(location.storage_options or {}) or None)
    return Handle(location, table, table.version())


def open_or_create(location: TableLocation, create: Callable[[], DeltaTable]) -> Handle:
    """:func:`open_latest`, or the table ``create`` makes when there is none."""
    from deltalake.exceptions import TableNotFoundError

    try:
        return open_latest(location)
    except TableNotFoundError:
        created = create()
        return Handle(location, created, created.version())


def keep(handle: Handle) -> None:
    """Keep ``handle`` for the next :func:`open_latest` of its table (after a successful commit or
    read; never after a failed one). A handle whose commit file cannot be read is not kept."""
    if not KEEP_OPEN:
        return
    version = handle.table.version()
    commit = handle.commit if version == handle.version else None
    try:
        commit = commit if commit is not None else _commit_bytes(handle, version)
    except Exception as exc:
        log.info("%s: not keeping the table open (%s)", handle.location.uri, exc)
        return
    kept = Handle(handle.location, handle.table, version, commit, handle._files)
    with _lock:
        _kept[_key(handle.location)] = kept
        _kept.move_to_end(_key(handle.location))
        while len(_kept) > MAX_KEPT:
            _kept.popitem(last=False)


def forget(location: TableLocation | None = None) -> None:
    """Drop the kept handle of ``location`` (every kept handle for None)."""
    with _lock:
        if location is None:
            _kept.clear()
        else:
            _kept.pop(_key(location), None)


__all__ = ["KEEP_OPEN", "MAX_KEPT", "Handle", "forget", "keep", "open_latest", "open_or_create"]
