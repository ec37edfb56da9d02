"""Pending retries parked outside Spark's state: immutable Arrow IPC files in the checkpoint.

Why: ``applyInPandasWithState`` keeps one value per key, and every batch that
touches a key rewrites that value whole: PySpark pickles it, the JVM unpickles
it, RocksDB stores it, and the timeout scan of every micro-batch reads every
key's value. A key's pending retries carry their messages (bodies, properties,
history), so in a failure storm each batch re-encoded and re-stored megabytes
per key, and an idle batch read all pending messages (#14 part 5, #15 goals 2, 4).

So once a key's pending retries (its *inline* rows) pass
``engine.state_park_bytes`` at the end of a call, the stage writes them, sorted
by due time, to one file ``<checkpoint>/retry_engine_pending/<name>`` and keeps
only a reference in the state value (:class:`Chunk`: the file's name, its row
count, how many rows of it were released, the next due time). The rows never
change; a release takes the next due rows of the file and moves ``released``
on. Deduplication (B1): a parked retry's msg id is in the key's remembered ids
while the key's dedup window lasts (it was decided fresh in it); when the window
passes the key forgets them all and marks its files ``ids_known = False``, so
a later call with input reads those files' unreleased ids instead. A backlog
of retries due in hours then costs its keys a few bytes of state each, not
every pending msg id (#15 goal 4: Spark's timeout scan reads every state value
every micro-batch).

Names: ``route_<hex>.bucket_<n>.batch_<b>.arrow``, one file per key per
micro-batch at most (a key is called once per batch).

Replay: batch ``b`` re-run from the state of ``b - 1`` decides the same rows
and writes the same file again (written aside and renamed over the first
attempt's; only the uncommitted attempt referenced it).

Clean-up: when a file's last row is released in batch ``r``, the stage writes
an empty marker ``<name>.done_<r>``. :meth:`ParkedStore.sweep` deletes a file
and its marker once batch ``r`` is older than the state versions Spark keeps
(``spark.sql.streaming.minBatchesToRetain``): no state Spark can restore refers
to it then. A file without a marker is never deleted: a key moved aside to the
quarantine table leaves its parked rows in place for the operator.

A reference that cannot be resolved (the file gone, damaged, or not the rows
the reference promises) raises :class:`~retry_engine.errors.StateUnreadableError`
with the path, so the stage moves the key's state value aside to the quarantine
table like any unreadable value, and the stream goes on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from retry_engine.core.names import FIRST_MS, LAST_MS, is_whole
from retry_engine.delta._checkpoint import checkpoint_folder, write_arrow_file
from retry_engine.errors import StateUnreadableError

PARKED_DIR: Final = "retry_engine_pending"
_NAME = re.compile(r"route_(?P<route>(?:[0-9a-f]{2})+)\.bucket_(?P<bucket>-?\d+)\.batch_(?P<batch>\d+)\.arrow\Z")
_DONE = re.compile(r"(?P<name>.+\.arrow)\.done_(?P<batch>\d+)\Z")
_TMP = re.compile(r"(?P<name>.+\.arrow)\.[0-9a-f]{32}\.tmp\Z")
_META_ROUTE: Final = b"retry_engine.route"
_META_BUCKET: Final = b"retry_engine.bucket"
_META_ROWS: Final = b"retry_engine.rows"
_US_PER_MS: Final = 1_000
# LZ4: the bench's retry rows (64-byte bodies) came out 3.4x smaller than uncompressed, and the
# engine at 100% failures as fast as without (bench run Q); ZSTD was 6x smaller but ~9% slower there.
# RocksDB compressed pending retries (LZ4) before they were parked; the files do too.
_WRITE_OPTIONS: Final = pa.ipc.IpcWriteOptions(compression="lz4")


@dataclass(frozen=True)
class Chunk:
    """A reference to one parked file: ``rows`` retries sorted by due time, the first ``released`` gone.

    ``next_due_ms``: the due time of row ``released`` (the key's wake-up for this file).
    ``ids_known``: its unreleased msg ids are in the key's remembered ids (until the
    key's dedup window passes); otherwise deduplication reads them from the file.
    """

    name: str
    rows: int
    released: int
    next_due_ms: int
    ids_known: bool = True

    def as_json(self) -> list[Any]:
        return [self.name, self.rows, self.released, self.next_due_ms, self.ids_known]


def parked_name(route: str, bucket: int, batch: int) -> str:
    # The route goes in as hex, like a seal's: group names may hold % and |, sub-keys #.
    return f"route_{route.encode().hex()}.bucket_{bucket}.batch_{batch}.arrow"


def chunks_to_json(chunks: tuple[Chunk, ...]) -> bytes:
    return json.dumps([c.as_json() for c in chunks], separators=(",", ":")).encode()


def chunks_from_json(raw: bytes, key: tuple[str, int] | None = None) -> tuple[Chunk, ...]:
    """The references a state value's metadata holds; ``StateUnreadableError`` unless each is well formed
    (and, given ``key``, names a file of that key)."""
    try:
        entries = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateUnreadableError(f"the parked retries' references are not JSON: {raw[:200]!r}") from exc
    if not isinstance(entries, list):
        raise StateUnreadableError(f"the parked retries' references are {type(entries).__name__}, expected a list")
    chunks: list[Chunk] = []
    for entry in entries:
        if (
            not isinstance(entry, list)
            or len(entry) != 5
            or not isinstance(entry[0], str)
            or not all(is_whole(v) for v in entry[1:4])
            or not isinstance(entry[4], bool)
        ):
            raise StateUnreadableError(
                f"a parked retries' reference is {entry!r}; expected [name, rows, released, next_due_ms, ids_known]"
            )
        name, rows, released, next_due_ms, ids_known = entry
        match = _NAME.match(name)
        if match is None or not 0 <= released < rows or not FIRST_MS <= next_due_ms <= LAST_MS:
            raise StateUnreadableError(
                f"a parked retries' reference is {entry!r}: expected a file name "
                "route_<hex>.bucket_<n>.batch_<n>.arrow, 0 <= released < rows and a next due time in years 1-9999"
            )
        if any(c.name == name for c in chunks):
            # Its rows would be released twice.
            raise StateUnreadableError(f"the parked file {name} is referenced twice")
        owner = (bytes.fromhex(match["route"]).decode("utf-8", errors="replace"), int(match["bucket"]))
        if key is not None and owner != (key[0], int(key[1])):
            raise StateUnreadableError(f"the parked file {name} belongs to another state key than {key}")
        chunks.append(Chunk(name, rows, released, next_due_ms, ids_known))
    return tuple(chunks)


def _ascending(values: np.ndarray) -> bool:
    return len(values) < 2 or not bool((values[1:] < values[:-1]).any())


def due_ms(rows: pa.Table) -> np.ndarray:
    """The ``due_at`` of each row in epoch milliseconds."""
    return np.asarray(rows.column("due_at").cast(pa.int64()).to_numpy()) // _US_PER_MS


@dataclass(frozen=True)
class ParkedStore:
    """The parked retries of one checkpoint (``<checkpoint>/retry_engine_pending``). Picklable: only the path."""

    checkpoint: str

    def _dir(self) -> tuple[pafs.FileSystem, str]:
        return checkpoint_folder(self.checkpoint, PARKED_DIR)

    def path(self, name: str) -> str:
        return f"{self._dir()[1]}/{name}"

    def park(self, key: tuple[str, int], batch: int, rows: pa.Table) -> Chunk:
        """Write ``rows`` (pending retries of ``key``) sorted by due time as the key's file of ``batch``."""
        due = rows.column("due_at")
        if due.null_count or not _ascending(np.asarray(due.cast(pa.int64()).to_numpy())):
            rows = rows.take(pc.sort_indices(due))  # stable: equal due times keep their order
        # else already in order (a key's retries of one level share their due time): no copy
        route, bucket = key
        name = parked_name(route, int(bucket), batch)
        table = rows.replace_schema_metadata(
            {
                _META_ROUTE: route.encode(),
                _META_BUCKET: str(int(bucket)).encode(),
                _META_ROWS: str(rows.num_rows).encode(),
            }
        )
        fs, directory = self._dir()
        # A replay writes over the first attempt's file, which only that uncommitted attempt referenced.
        write_arrow_file(fs, f"{directory}/{name}", table, options=_WRITE_OPTIONS)
        return Chunk(name, rows.num_rows, 0, int(due_ms(rows.slice(0, 1))[0]))

    def read(self, chunk: Chunk, key: tuple[str, int]) -> pa.Table:
        """The rows of ``chunk`` (all of them, released ones first); ``StateUnreadableError`` if the file
        is gone, damaged, or not the rows the reference promises."""
        path = self.path(chunk.name)
        fs, _ = self._dir()
        try:
            with fs.open_input_file(path) as source:
                table = pa.ipc.open_file(source).read_all()
            table.validate(full=True)
        except FileNotFoundError as exc:
            raise StateUnreadableError(f"the parked retries file {path} is gone") from exc
        except Exception as exc:  # pyarrow raises several classes for bad bytes; all mean "damaged"
            raise StateUnreadableError(
                f"the parked retries file {path} is not a readable Arrow IPC file ({type(exc).__name__}: {exc})"
            ) from exc
        metadata = table.schema.metadata or {}
        expected = {
            _META_ROUTE: key[0].encode(),
            _META_BUCKET: str(int(key[1])).encode(),
            _META_ROWS: str(chunk.rows).encode(),
        }
        found = {k: metadata.get(k) for k in expected}
        if found != expected or table.num_rows != chunk.rows:
            raise StateUnreadableError(
                f"the parked retries file {path} holds {table.num_rows} rows with metadata {found!r}; its "
                f"reference expects {chunk.rows} rows of {expected!r}"
            )
        return table

    def done(self, chunk: Chunk, batch: int) -> None:
        """Mark ``chunk``'s file as fully released in ``batch`` (:meth:`sweep` deletes it later)."""
        fs, _ = self._dir()
        marker = f"{self.path(chunk.name)}.done_{batch}"
        if fs.get_file_info(marker).type != pafs.FileType.File:
            with fs.open_output_stream(marker):
                pass

    def sweep(self, before_batch: int) -> list[str]:
        """Delete files fully released in a batch before ``before_batch``, their markers, and temp files of
        batches before it (a killed write). Returns the deleted paths."""
        fs, directory = self._dir()
        deleted = []
        for info in fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
            done = _DONE.match(info.base_name)
            if done is not None and int(done["batch"]) < before_batch:
                for path in (f"{directory}/{done['name']}", info.path):
                    try:
                        fs.delete_file(path)
                        deleted.append(path)
                    except FileNotFoundError:
                        pass
                continue
            tmp = _TMP.match(info.base_name)
            name = None if tmp is None else _NAME.match(tmp["name"])
            if name is not None and int(name["batch"]) < before_batch:
                fs.delete_file(info.path)
                deleted.append(info.path)
        return deleted


__all__ = [
    "PARKED_DIR",
    "Chunk",
    "ParkedStore",
    "chunks_from_json",
    "chunks_to_json",
    "due_ms",
    "parked_name",
]
