"""Size-bounded splits of the schedule stage's state keys: sealed keys, their published msg ids, the routing walk.

A state key is (route, bucket). Its *level* is 0 for the key the checkpoint's
base split gives (``group`` or ``group#nn``, see
:class:`~retry_engine.core.schedule.StateKeySplit`) and L > 0 for the key
``<base route>#L<L>.<j>``: the ``j``-th of the 2^L keys of level L under that
base key, ``j`` being the top L bits of the msg id's CRC-32 (the base split
uses the CRC modulo its count, the low bits, so the two are independent for a
power-of-two count). The keys under one base key form a binary tree: the
children of ``(L, j)`` are ``(L+1, 2j)`` and ``(L+1, 2j+1)``.

Sealing. The schedule stage measures a key's encoded state value at the end
of every call; once it passes ``engine.state_key_max_bytes`` (and the key is
not at :data:`MAX_LEVEL`), the key *seals* in batch ``s``: it writes the msg ids
it knows (remembered ids and those of pending retries), sorted, to an
immutable Arrow IPC file :func:`seal_path` under ``<checkpoint>/`` :data:`SPLITS_DIR`,
then records ``s`` in its own state. It keeps its pending retries (released as
usual) and its remembered ids.

Routing (in decide, before the shuffle). In batch ``b``, a stateful row of msg
id X starts at its base key and walks down: at key K, if K has a seal written
by a batch before ``b`` and X is among its published ids, X goes to K; if K has
such a seal and X is not in it, X goes on to K's child on X's path; otherwise
X goes to K. When a key has several seals, the one of the earliest batch
counts (a later one can only be written after the key's state expired and
was created again by re-sent ids of that first seal, so it adds nothing).

Why a duplicate always meets its original (B1). Say X was decided fresh at key
K in batch ``a``: every ancestor A of K had a (earliest) seal from before ``a``
without X, and K had none from before ``a``. In a later batch ``b`` those
ancestors' earliest seals are the same files, so X walks the same path to K.
If K has meanwhile sealed in batch ``s`` (``a <= s < b``), X was in K's state
at the end of ``s`` (decided in ``a`` and still remembered or pending, or
forgotten, which an unsplit key does too after the dedup window), so its
published ids contain X and X stops at K, which answers DUPLICATE. A key
therefore receives, once sealed, only msg ids it published: its state stops
growing with new ids, and new ids go one level down. The walk only reads
seals of batches before ``b``, all of which Spark committed before running
``b``.

Replay. A batch ``b`` that wrote seals and did not commit is re-run by Spark
on the same input from the state of ``b - 1``: its routing ignores seals of
batch ``b`` (not before ``b``), so rows route as in the first attempt; the stage
decides the same way and seals the same keys with the same ids, finding the
files already there (an existing seal file is kept, not rewritten). Should a
replay not seal a key that the first attempt sealed (its
``state_key_max_bytes`` was raised in between), the left-over file still holds
exactly the ids the key knew at the end of ``b``, so later routing is as if the
key had sealed: only its ids go to it, which it still answers.

Seal files are immutable, so each Python worker caches their ids by path.
A seal file that is missing, unreadable or inconsistent with its name stops
the batch with :class:`~retry_engine.errors.StateSplitError` (codes
``STATE_SPLIT_FILE_INVALID`` / ``STATE_SPLIT_FILE_MISSING``): routing without it
would silently decide duplicates again.
"""

from __future__ import annotations

import logging
import re
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from retry_engine.delta._checkpoint import checkpoint_folder, write_arrow_file
from retry_engine.errors import StateSplitError

log = logging.getLogger(__name__)

SPLITS_DIR: Final = "retry_engine_splits"
# Deepest level: 2^16 keys under one base key. A key at this level never seals (a value
# would need 2^16 times the threshold in one bucket to get there).
MAX_LEVEL: Final = 16
# ``<base route>#L<level>.<index>``; the separator is never in a valid group name.
_LEVEL_ROUTE = re.compile(r"(?P<base>.*)#L(?P<level>\d+)\.(?P<index>\d+)\Z", re.DOTALL)
_SEAL_NAME = re.compile(
    r"bucket_(?P<bucket>-?\d+)\.level_(?P<level>\d+)\.batch_(?P<batch>\d+)\.route_(?P<route>(?:[0-9a-f]{2})+)\.arrow\Z"
)
_IDS_SCHEMA: Final = pa.schema([pa.field("msg_id", pa.string(), nullable=False)])
_META_ROUTE: Final = b"retry_engine.route"
_META_BUCKET: Final = b"retry_engine.bucket"
_META_LEVEL: Final = b"retry_engine.level"
_META_BATCH: Final = b"retry_engine.batch"
_META_ROWS: Final = b"retry_engine.rows"
# Published id sets kept per Python worker (immutable files, so never stale).
_CACHED_SEALS: Final = 64
_ids_cache: OrderedDict[str, pa.Array] = OrderedDict()
# Listings per (checkpoint, batch id), so decide lists the folder once per batch, not per Arrow batch.
# Never stale: the seals of batches before b were all written before Spark started batch b.
_CACHED_LISTINGS: Final = 8
_listing_cache: OrderedDict[tuple[str, int], dict[tuple[str, int], Seal]] = OrderedDict()


@dataclass(frozen=True)
class Seal:
    """One published seal: the key (``route``, ``bucket``) sealed in batch ``batch``, its ids at ``path``."""

    route: str
    bucket: int
    level: int
    batch: int
    path: str


def level_of(route: str) -> int:
    """The level of a state key's route: 0 for a base key, L for ``<base>#L<L>.<j>``."""
    match = _LEVEL_ROUTE.match(route)
    return 0 if match is None else int(match["level"])


def base_of(route: str) -> str:
    """The base key's route of ``route`` (itself for a base key)."""
    match = _LEVEL_ROUTE.match(route)
    return route if match is None else match["base"]


def level_route(base: str, level: int, index: int) -> str:
    """The route of the ``index``-th key of ``level`` under the base key ``base`` (``base`` at level 0)."""
    return base if level == 0 else f"{base}#L{level}.{index}"


def msg_crcs(ids: Iterable[str | None]) -> np.ndarray:
    """CRC-32 of each msg id (null as empty), the hash both the base split and the levels use."""
    return np.fromiter((zlib.crc32((i or "").encode()) for i in ids), dtype=np.uint32)


def path_index(crcs: np.ndarray, level: int) -> np.ndarray:
    """The index at ``level`` of each CRC's path: its top ``level`` bits."""
    if level == 0:
        return np.zeros(len(crcs), dtype=np.uint32)
    return crcs >> np.uint32(32 - level)


def current_batch_id() -> int | None:
    """The micro-batch id of the running Spark task (``streaming.sql.batchId``), None outside a streaming batch.

    Spark sets this local property on the jobs of a micro-batch; it reaches the
    Python workers of ``mapInArrow`` and ``applyInPandasWithState`` (checked on pyspark 4.3).
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    value = None if context is None else context.getLocalProperty("streaming.sql.batchId")
    return None if value is None else int(value)


def seal_name(route: str, bucket: int, level: int, batch: int) -> str:
    # The route goes in as hex: group names may hold % and |, sub-keys # (not path-safe everywhere).
    return f"bucket_{bucket}.level_{level}.batch_{batch}.route_{route.encode().hex()}.arrow"


@dataclass(frozen=True)
class SealStore:
    """The seals of one checkpoint (``<checkpoint>/retry_engine_splits``). Picklable: only the path."""

    checkpoint: str

    def _dir(self) -> tuple[pafs.FileSystem, str]:
        return checkpoint_folder(self.checkpoint, SPLITS_DIR)

    def seal_path(self, route: str, bucket: int, level: int, batch: int) -> str:
        return f"{self._dir()[1]}/{seal_name(route, bucket, level, batch)}"

    def sealed_before(self, batch: int) -> dict[tuple[str, int], Seal]:
        """Every key with a seal written by a batch before ``batch``: its earliest seal, by (route, bucket).

        A name that is not a seal's (other than a ``.tmp`` left by a killed write)
        raises ``STATE_SPLIT_FILE_INVALID``: a renamed seal would silently stop
        deduplicating its ids. Cached per worker by (checkpoint, ``batch``).
        """
        cached = _listing_cache.get((self.checkpoint, batch))
        if cached is not None:
            return cached
        sealed = self._list(batch)
        _listing_cache[(self.checkpoint, batch)] = sealed
        while len(_listing_cache) > _CACHED_LISTINGS:
            _listing_cache.popitem(last=False)
        return sealed

    def _list(self, batch: int) -> dict[tuple[str, int], Seal]:
        fs, directory = self._dir()
        sealed: dict[tuple[str, int], Seal] = {}
        for info in fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
            if info.base_name.endswith(".tmp"):
                continue
            match = _SEAL_NAME.match(info.base_name)
            if match is None or info.type != pafs.FileType.File:
                raise StateSplitError(
                    f"{info.path} is not a state key's seal (expected bucket_<n>.level_<n>.batch_<n>.route_<hex>.arrow); "
                    f"restore {directory} from a backup of the checkpoint and keep other files out of it",
                    code="STATE_SPLIT_FILE_INVALID",
                )
            seal = Seal(
                route=bytes.fromhex(match["route"]).decode("utf-8", errors="replace"),
                bucket=int(match["bucket"]),
                level=int(match["level"]),
                batch=int(match["batch"]),
                path=info.path,
            )
            if seal.batch >= batch:
                continue  # written by this batch's earlier attempt or later: not part of this batch's routing
            key = (seal.route, seal.bucket)
            if key not in sealed or seal.batch < sealed[key].batch:
                sealed[key] = seal
        return sealed

    def exists(self, route: str, bucket: int, level: int, batch: int) -> bool:
        fs, _ = self._dir()
        info = fs.get_file_info(self.seal_path(route, bucket, level, batch))
        return bool(info.type == pafs.FileType.File)

    def publish(self, route: str, bucket: int, batch: int, ids: Iterable[str]) -> str:
        """Write the seal of key (``route``, ``bucket``) by batch ``batch``: ``ids``, sorted and unique.

        Written aside and renamed, so a reader sees the whole file or none; an
        existing file (this batch's earlier attempt, same content) is kept.
        Returns its path.
        """
        level = level_of(route)
        fs, directory = self._dir()
        path = f"{directory}/{seal_name(route, bucket, level, batch)}"
        if fs.get_file_info(path).type == pafs.FileType.File:
            return path
        table = pa.table({"msg_id": pa.array(sorted(set(ids)), pa.string())}, schema=_IDS_SCHEMA)
        table = table.replace_schema_metadata(
            {
                _META_ROUTE: route.encode(),
                _META_BUCKET: str(bucket).encode(),
                _META_LEVEL: str(level).encode(),
                _META_BATCH: str(batch).encode(),
                _META_ROWS: str(table.num_rows).encode(),
            }
        )
        write_arrow_file(fs, path, table)
        return path

    def published_ids(self, seal: Seal) -> pa.Array:
        """The msg ids of ``seal`` (cached per worker); ``STATE_SPLIT_FILE_INVALID`` if the file is damaged."""
        cached = _ids_cache.get(seal.path)
        if cached is not None:
            _ids_cache.move_to_end(seal.path)
            return cached
        ids = self._read(seal)
        _ids_cache[seal.path] = ids
        while len(_ids_cache) > _CACHED_SEALS:
            _ids_cache.popitem(last=False)
        return ids

    def _read(self, seal: Seal) -> pa.Array:
        fs, _ = self._dir()
        fix = (
            "restore it from a backup of the checkpoint (without it, re-sent consume results of the msg ids "
            "that key decided would be decided again)"
        )
        try:
            with fs.open_input_file(seal.path) as source:
                table = pa.ipc.open_file(source).read_all()
            table.validate(full=True)
        except FileNotFoundError as exc:
            raise StateSplitError(f"the seal {seal.path} disappeared; {fix}", code="STATE_SPLIT_FILE_MISSING") from exc
        except Exception as exc:  # pyarrow raises several classes for bad bytes; all mean "damaged"
            raise StateSplitError(
                f"the seal {seal.path} is not a readable Arrow IPC file ({type(exc).__name__}: {exc}); {fix}",
                code="STATE_SPLIT_FILE_INVALID",
            ) from exc
        metadata = table.schema.metadata or {}
        expected = {
            _META_ROUTE: seal.route.encode(),
            _META_BUCKET: str(seal.bucket).encode(),
            _META_LEVEL: str(seal.level).encode(),
            _META_BATCH: str(seal.batch).encode(),
            _META_ROWS: str(table.num_rows).encode(),
        }
        found = {k: metadata.get(k) for k in expected}
        if table.schema.names != ["msg_id"] or not pa.types.is_string(table.schema.field(0).type) or found != expected:
            raise StateSplitError(
                f"the seal {seal.path} holds columns {table.schema.names} with metadata {found!r}; expected one "
                f"msg_id string column and {expected!r} (its name, and its row count); {fix}",
                code="STATE_SPLIT_FILE_INVALID",
            )
        column = table.column("msg_id")
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def walk(
    routes: pa.Array,
    buckets: pa.Array,
    ids: pa.Array,
    stateful: pa.Array,
    sealed: Mapping[tuple[str, int], Seal],
    published: SealStore,
) -> pa.Array:
    """``routes`` with each stateful row moved to the key its msg id walks to through ``sealed`` (see module doc).

    ``routes`` are base routes; rows whose base key has no seal keep them, and
    only rows under a sealed base key are hashed.
    """
    roots = {key for key, seal in sealed.items() if seal.level == 0}
    if not roots:
        return routes
    present = set(pc.unique(buckets.filter(stateful)).to_pylist())
    roots = {(route, bucket) for route, bucket in roots if bucket in present}
    if not roots:
        return routes
    placed_rows: list[np.ndarray] = []
    placed_routes: list[str] = []
    placed_counts: list[int] = []

    def place(at_rows: np.ndarray, route: str) -> None:
        placed_rows.append(at_rows)
        placed_routes.append(route)
        placed_counts.append(len(at_rows))

    for base, bucket in sorted(roots):
        mask = pc.and_(stateful, pc.and_(pc.equal(routes, base), pc.equal(buckets, bucket)))
        rows = pc.indices_nonzero(pc.fill_null(mask, False)).to_numpy()
        row_ids = ids.take(pa.array(rows))
        crcs = msg_crcs(row_ids.to_pylist())
        # (level, index, positions into ``rows``) of the rows still walking
        todo = [(0, 0, np.arange(len(rows)))]
        while todo:
            level, index, at = todo.pop()
            route = level_route(base, level, index)
            seal = sealed.get((route, bucket))
            if seal is None or level >= MAX_LEVEL:
                place(rows[at], route)
                continue
            member = pc.is_in(row_ids.take(pa.array(at)), value_set=published.published_ids(seal)).to_numpy(
                zero_copy_only=False
            )
            place(rows[at[member]], route)
            rest = at[~member]
            if len(rest) == 0:
                continue
            children = path_index(crcs[rest], level + 1)
            for child in np.unique(children):
                todo.append((level + 1, int(child), rest[children == child]))
    if not placed_rows:
        return routes
    where = np.concatenate(placed_rows)
    values = np.repeat(np.array(placed_routes, dtype=object), placed_counts)
    order = np.argsort(where, kind="stable")
    chosen = np.zeros(len(routes), dtype=bool)
    chosen[where] = True
    return pc.replace_with_mask(routes, pa.array(chosen), pa.array(values[order], pa.string()))


__all__ = [
    "MAX_LEVEL",
    "SPLITS_DIR",
    "Seal",
    "SealStore",
    "base_of",
    "current_batch_id",
    "level_of",
    "level_route",
    "msg_crcs",
    "path_index",
    "seal_name",
    "walk",
]
