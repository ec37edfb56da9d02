"""The streaming query id kept in ``<checkpointLocation>/metadata``.

Spark writes ``{"id": "<uuid>"}`` there when a query first starts and keeps
it across restarts; a new checkpoint gets a new id. That makes it the right
idempotency key for a sink: batch ids restart at 0 with a new checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from retry_engine.errors import DeltaSinkError

METADATA_FILE = "metadata"


def checkpoint_filesystem(checkpoint: str) -> tuple[pafs.FileSystem, str]:
    """The file system and root path of a checkpoint location (local path, ``file:`` or a URI)."""
    scheme = urlparse(checkpoint).scheme
    if scheme in ("", "file"):
        path = checkpoint
        if path.startswith("file://"):
            path = path[len("file://") :]
        elif path.startswith("file:"):
            path = path[len("file:") :]
        return pafs.LocalFileSystem(), os.path.abspath(path)
    fs, path = pafs.FileSystem.from_uri(checkpoint)
    return fs, path


def checkpoint_folder(checkpoint: str, name: str) -> tuple[pafs.FileSystem, str]:
    """The file system and path of the engine's folder ``name`` inside ``checkpoint``."""
    fs, root = checkpoint_filesystem(checkpoint)
    return fs, f"{root}/{name}"


def write_arrow_file(
    fs: pafs.FileSystem, path: str, table: pa.Table, *, options: pa.ipc.IpcWriteOptions | None = None
) -> None:
    """``table`` as an Arrow IPC file at ``path``, written aside and renamed over it: a reader sees
    the whole file or what was there before, never a part (a killed write leaves a ``.tmp``)."""

    def write(stream: pa.NativeFile) -> None:
        with pa.ipc.new_file(stream, table.schema, options=options) as writer:
            writer.write_table(table)

    _write_aside(fs, path, write)


def write_bytes_atomically(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """``data`` as the file at ``path``, written aside and renamed over it (as :func:`write_arrow_file`)."""
    _write_aside(fs, path, lambda stream: stream.write(data))


def _write_aside(fs: pafs.FileSystem, path: str, write: Callable[[pa.NativeFile], object]) -> None:
    """``write`` a ``.tmp`` beside ``path`` and rename it over ``path``; a write that fails deletes its part."""
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    partial = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        with fs.open_output_stream(partial) as stream:
            write(stream)
        _move_over(fs, partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.delete_file(partial)
        raise


def _move_over(fs: pafs.FileSystem, partial: str, path: str) -> None:
    try:
        fs.move(partial, path)
    except OSError:
        # Stores whose rename does not replace an existing file.
        fs.delete_file(path)
        fs.move(partial, path)


def read_query_id(checkpoint: str) -> str | None:
    """The query id recorded in ``checkpoint``, or None if Spark has not written one yet."""
    fs, root = checkpoint_filesystem(checkpoint)
    try:
        with fs.open_input_stream(f"{root}/{METADATA_FILE}") as stream:
            raw = stream.read(_MAX_METADATA)
    except FileNotFoundError:
        return None
    try:
        # UnicodeDecodeError and JSONDecodeError are ValueErrors; deeply nested arrays, RecursionError.
        query_id = json.loads(raw.decode("utf-8").split("\n")[0])["id"]
        if not isinstance(query_id, str) or not query_id.strip():
            raise TypeError(f"id {query_id!r} is no query id")
        return query_id
    except (ValueError, RecursionError, KeyError, TypeError) as exc:
        raise DeltaSinkError(
            f"{checkpoint}/{METADATA_FILE} is not a Spark streaming metadata file: {raw[:200]!r}",
            code="CHECKPOINT_METADATA_INVALID",
        ) from exc


# Spark's metadata file is one short JSON line; more is no metadata file.
_MAX_METADATA = 65_536


def remove_orphan_log_temps(checkpoint: str) -> list[str]:
    """Delete the temp files a killed write left in the checkpoint's ``offsets`` and ``commits`` logs
    and its state store.

    Spark writes ``offsets/<n>`` as ``.<n>.<uuid>.tmp`` (plus ``.crc``) and renames it. A
    process killed between the two leaves the temp file, and Spark 4 then refuses to run
    batch 0 on every restart (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``: offsets must
    be empty), a crash loop found by the SIGKILL test. Only the lake's lease holder calls
    this, before its query starts, so no other writer's temp file is in flight. Returns
    the removed paths.
    """
    fs, root = checkpoint_filesystem(checkpoint)
    removed = []
    # The state store writes its files the same way (``state/<op>/<partition>/.<v>.changelog.<uuid>.TIDn.tmp``):
    # a stop inside a batch (every `run --once` that stops with a batch planned) left them, a few per run
    # for good (Spark's own clean-up deletes only versions' files).
    for log_dir, recursive in (("offsets", False), ("commits", False), ("state", True)):
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/{log_dir}", allow_not_found=True, recursive=recursive))
        for info in infos:
            if info.type == pafs.FileType.File and info.base_name.startswith(".") and ".tmp" in info.base_name:
                fs.delete_file(info.path)
                removed.append(info.path)
    return removed


def ensure_query_id(checkpoint: str) -> str:
    """The query id of ``checkpoint``, writing a new one first if it has none.

    Spark keeps an existing metadata file, so writing it before the query
    starts lets callers (e.g. a ``foreachBatch`` writer) know the id up front.
    """
    fs, root = checkpoint_filesystem(checkpoint)
    try:
        existing = read_query_id(checkpoint)
    except DeltaSinkError:
        # An empty file in a checkpoint that has planned nothing: what an earlier release's start,
        # killed while writing it in place, left. Nothing has the id yet: a new one is written.
        if not _empty_and_unplanned(fs, root):
            raise
        existing = None
    if existing is not None:
        return existing
    query_id = str(uuid.uuid4())
    # Written aside and renamed: a start killed mid-write leaves no part that stops every later start.
    write_bytes_atomically(fs, f"{root}/{METADATA_FILE}", (json.dumps({"id": query_id}) + "\n").encode("utf-8"))
    return query_id


def _empty_and_unplanned(fs: pafs.FileSystem, root: str) -> bool:
    """Whether the checkpoint's metadata file is empty and its offset log holds no batch."""
    if fs.get_file_info(f"{root}/{METADATA_FILE}").size != 0:
        return False
    planned = fs.get_file_info(pafs.FileSelector(f"{root}/offsets", allow_not_found=True))
    return not any(info.type == pafs.FileType.File and info.base_name.isdigit() for info in planned)


# Spark's setting that fixes a stateful operator's partition count when its checkpoint starts.
SHUFFLE_PARTITIONS_CONF = "spark.sql.shuffle.partitions"


def shuffle_partitions_of(checkpoint: str) -> int | None:
    """The partition count a started checkpoint's stateful operators run with, None when no readable
    ``offsets`` file says.

    Spark writes its ``spark.sql.shuffle.partitions`` into every ``offsets/<n>`` (the metadata line
    after ``v1``) and restores it on restart, whatever the session's setting is now.
    """
    fs, root = checkpoint_filesystem(checkpoint)
    infos = fs.get_file_info(pafs.FileSelector(f"{root}/offsets", allow_not_found=True))
    batches = [int(info.base_name) for info in infos if info.base_name.isdigit()]
    if not batches:
        return None
    try:
        with fs.open_input_stream(f"{root}/offsets/{max(batches)}") as stream:
            metadata = json.loads(stream.read().decode("utf-8").splitlines()[1])
        value = int(metadata["conf"][SHUFFLE_PARTITIONS_CONF])
    except (OSError, UnicodeDecodeError, IndexError, json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return value if value >= 1 else None
