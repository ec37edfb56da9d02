"""Which lake a checkpoint runs: ``<checkpoint>/retry_engine_lake.json``.

A Spark checkpoint holds one lake's progress: the offsets of that lake's
consume_results, the retries pending in its schedule state, its resume point.
Two lakes configured with one ``engine.checkpoint`` (a config copied with only
the lake changed) would run one lake's progress on the other's tables: the
second engine starts from the first's offsets, so it skips or reads again its
own consume results, and releases the first lake's retries into its own retry
table; both running at once write one checkpoint from two processes, which
Spark does not guard against. The lease fences engines per lake, not per
checkpoint.

So the first start on a checkpoint records the lake it runs: the id of the
lake's ``_engine_state`` table (its Delta table id, which a copied or moved
lake keeps) and where the lake was (for messages). Every later start checks
it before it takes the lease or writes anything, and refuses another lake
with ``CHECKPOINT_OF_ANOTHER_LAKE``. A checkpoint of an earlier release (no
file) is recorded at its next start. A file that cannot be read is refused
(``CHECKPOINT_LAKE_FILE_INVALID``) rather than rewritten: it is what tells
the lakes apart.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import Final

import pyarrow.fs as pafs

from retry_engine.config import EngineConfig
from retry_engine.core.lease import state_path
from retry_engine.delta._checkpoint import checkpoint_filesystem
from retry_engine.delta.tables import open_table
from retry_engine.errors import LakeResumeError

log = logging.getLogger(__name__)

LAKE_FILE: Final = "retry_engine_lake.json"
_PART: Final = re.compile(re.escape(LAKE_FILE) + r"\.[0-9a-f]{32}\.tmp")
# How old a part must be to be a killed start's, not one being written.
PART_AGE_S: Final = 600
# A Delta table id is a UUID; anything much longer is not one.
_MAX_TEXT: Final = 4_096


@dataclass(frozen=True)
class CheckpointLake:
    """The lake a checkpoint runs: its ``_engine_state`` table id, and where it was when last started."""

    lake_id: str
    lake: str

    def to_json(self) -> str:
        return json.dumps({"lake_id": self.lake_id, "lake": self.lake}) + "\n"


def lake_id(lake: str) -> str | None:
    """The id of ``lake``'s ``_engine_state`` table; None before an engine first started on it."""
    table = open_table(state_path(lake))
    return None if table is None else str(table.metadata().id)


def read(checkpoint: str) -> CheckpointLake | None:
    """The lake ``checkpoint`` records, None when it records none (new, or of an earlier release)."""
    fs, root = checkpoint_filesystem(checkpoint)
    path = f"{root}/{LAKE_FILE}"
    try:
        with fs.open_input_stream(path) as stream:
            raw = stream.read(_MAX_TEXT + 1)
    except FileNotFoundError:
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        value = None
    if (
        len(raw) > _MAX_TEXT
        or not isinstance(value, dict)
        or not all(isinstance(value.get(k), str) and value[k] for k in ("lake_id", "lake"))
    ):
        raise LakeResumeError(
            f"{path} holds {raw[:200]!r}; expected {{\"lake_id\": \"<id of the lake's _engine_state table>\", "
            "\"lake\": \"<where the lake is>\"}. It says which lake this checkpoint runs: restore it from a "
            "backup of the checkpoint, or, if you are sure the checkpoint is this lake's, delete it (the next "
            "start records the lake again)",
            code="CHECKPOINT_LAKE_FILE_INVALID",
        )
    return CheckpointLake(value["lake_id"], value["lake"])


def check(config: EngineConfig) -> CheckpointLake | None:
    """What the checkpoint records, after checking that it is ``config``'s lake
    (:class:`~retry_engine.errors.LakeResumeError` ``CHECKPOINT_OF_ANOTHER_LAKE`` if not)."""
    checkpoint, lake = config.checkpoint_path, config.engine.lake
    recorded = read(checkpoint)
    if recorded is None:
        return None
    found = lake_id(lake)
    if found != recorded.lake_id:
        this = "has no engine state yet" if found is None else f"is lake {found}"
        raise LakeResumeError(
            f"the checkpoint {checkpoint} runs the lake at {recorded.lake} (lake {recorded.lake_id}), but this "
            f"engine's lake {lake} {this}: resuming it would read this lake's consume results from the other "
            "lake's offsets and release the other lake's retries here. Give each lake its own engine.checkpoint "
            "(a new checkpoint resumes after the lake's last batch)",
            code="CHECKPOINT_OF_ANOTHER_LAKE",
        )
    return recorded


def record(config: EngineConfig, recorded: CheckpointLake | None) -> None:
    """Record ``config``'s lake in its checkpoint unless ``recorded`` (from :func:`check`) says it already.

    Called once the lake's ``_engine_state`` table exists (under this lake's lease; an engine of another
    lake may be at the same step on the same new checkpoint). A new record is created only where there
    is none (an atomic link on a local disk; elsewhere a look first), then read back: of two lakes
    starting at once on one new checkpoint, the one whose record is there goes on and the other is
    refused (``CHECKPOINT_OF_ANOTHER_LAKE``). Written aside, then linked or renamed: a start killed
    mid-write leaves the file whole or absent."""
    lake = config.engine.lake
    found = lake_id(lake)
    if found is None or recorded == CheckpointLake(found, lake):
        return
    fs, root = checkpoint_filesystem(config.checkpoint_path)
    fs.create_dir(root, recursive=True)
    _remove_old_parts(fs, root)
    path = f"{root}/{LAKE_FILE}"
    partial = f"{path}.{uuid.uuid4().hex}.tmp"
    with fs.open_output_stream(partial) as stream:
        stream.write(CheckpointLake(found, lake).to_json().encode("utf-8"))
    if recorded is not None:  # this lake, moved: its new place replaces the old one
        _replace(fs, partial, path)
    elif not (isinstance(fs, pafs.LocalFileSystem) and _linked(partial, path)):
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            _replace(fs, partial, path)
        else:
            fs.delete_file(partial)
    if check(config) is None:  # raises if another lake's start recorded its own first
        raise LakeResumeError(f"{path} was not written", code="CHECKPOINT_LAKE_FILE_INVALID")
    log.info("checkpoint %s runs the lake %s (lake %s)", config.checkpoint_path, lake, found)


def _linked(partial: str, path: str) -> bool:
    """Link ``partial`` as ``path`` unless ``path`` exists (atomic), then drop ``partial``; False where
    the file system has no hard links (the caller looks first instead)."""
    try:
        os.link(partial, path)
    except FileExistsError:  # another start recorded a lake in between
        pass
    except OSError:  # no hard links here (some network or FUSE file systems)
        return False
    os.unlink(partial)
    return True


def _replace(fs: pafs.FileSystem, partial: str, path: str) -> None:
    try:
        fs.move(partial, path)
    except OSError:  # stores whose rename does not replace a file
        fs.delete_file(path)
        fs.move(partial, path)


def _remove_old_parts(fs: pafs.FileSystem, root: str) -> None:
    """Delete the parts a start killed between writing aside and renaming left, once they are older than
    any start in progress could be (another lake's engine may be writing its own right now)."""
    now = time.time()
    for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
        old = info.mtime is not None and now - info.mtime.timestamp() > PART_AGE_S
        if info.type == pafs.FileType.File and _PART.fullmatch(info.base_name) and old:
            fs.delete_file(info.path)


__all__ = ["LAKE_FILE", "CheckpointLake", "check", "lake_id", "read", "record"]
