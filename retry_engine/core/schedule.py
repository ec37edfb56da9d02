"""The schedule stage (R8): holds retries until they are due, on Spark's clock.

This is RocketMQ's ``SCHEDULE_TOPIC_XXXX`` rebuilt as the state of an
``applyInPandasWithState`` operator. Calling Python once per message would
cap the engine at a few thousand messages a second, so state is keyed
coarsely: by (consumer group, store-time bucket of the consumed message).
Each key holds its pending retries as one Arrow IPC blob, and the msg ids it
has already decided, so a duplicated consume result (same group and msg id,
which always lands in the same key) is recognised and recorded as a
duplicate instead of producing a second retry (B1). A key remembers a msg id
for the dedup window after it was decided, for as long as its retry is
pending, and for the window after that retry's release. The key's
processing-time timeout is set to its earliest due time; a retry is released
in the first micro-batch whose timestamp is past its ``due_at``, never earlier.

The state value's layout is versioned (:mod:`retry_engine.core._schedule_state`);
a value that cannot be read is moved aside to the quarantine table (kind
``state_quarantine``, reason code ``STATE_UNREADABLE``, its bytes in ``raw``)
and the key starts afresh instead of failing the batch on every retry.

A key is a (group, bucket), first split into the checkpoint's fixed number of
base sub-keys by a hash of the msg id (:class:`StateKeySplit`, 1 for a new
checkpoint: no split, so normal loads pay nothing), then split further by
size: a key whose state value passes ``engine.state_key_max_bytes`` at the end
of a batch *seals* (publishes the msg ids it knows and takes no new ones) and
later new msg ids of its (group, bucket) go one level down, to one of two
keys chosen by more bits of the same hash. A duplicate still meets its
original's record, whatever split happened in between, and routing is the
same on replay: :mod:`retry_engine.core._state_splits` has the argument. So one
mass failure does not make one state value of gigabytes: a key grows past the
threshold by at most what one micro-batch brings it.

Rows with ``bucket == NO_STATE_BUCKET`` (acknowledged, dropped, quarantined)
pass through without touching state, still packed.

Replay: Spark re-runs a micro-batch from the state of the previous version
with the same batch timestamp, and this function is deterministic in its
input (rows are sorted by source position first), so a replay emits the same
rows; an unreadable state is moved aside again with the same bytes, and the
writers commit one batch's rows once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from pyspark.sql.streaming.state import GroupState

from retry_engine.config import DEFAULT_STATE_KEY_MAX_BYTES, DEFAULT_STATE_PARK_BYTES
from retry_engine.core._parked import Chunk, ParkedStore, due_ms
from retry_engine.core._placement import place, placing
from retry_engine.core._schedule_state import (
    STATE_SCHEMA,
    KeyState,
    decode,
    encode,
    parked_rows,
    quarantine_rows,
)
from retry_engine.core._state_splits import MAX_LEVEL, SealStore, current_batch_id, level_of, walk
from retry_engine.core.decide import DUPLICATE, KIND_DELIVERY, NO_STATE_BUCKET, RETRY
from retry_engine.core.names import is_whole
from retry_engine.core.outputs import LEDGER_COLUMNS
from retry_engine.core.packed import PACKED_ARROW_SCHEMA, as_work, payload_chunks
from retry_engine.delta._arrow_ipc import from_ipc
from retry_engine.delta._checkpoint import checkpoint_filesystem, shuffle_partitions_of
from retry_engine.delta._worker_heap import settle
from retry_engine.errors import StateSplitError, StateUnreadableError
from retry_engine.schemas import WORK

log = logging.getLogger(__name__)

# Base sub-keys per (group, bucket) when none is given (engine.state_subkeys): 1, no fixed split;
# size-bounded splits (sealing) bound a mass failure's values instead, at no cost to normal loads.
# A checkpoint keeps the count it started with (KEYS_FILE), so changing the setting never
# re-routes msg ids that are already in state.
STATE_SUBKEYS: Final = 1
# Joins a group and its sub-key in the state key's route; never in a valid group name (`%|a-zA-Z0-9_-`).
SUBKEY_SEPARATOR: Final = "#"
KEYS_FILE: Final = "retry_engine_state_keys.json"
_Rows = TypeVar("_Rows", pa.Table, pa.RecordBatch)

_US_PER_MS = 1_000


@dataclass(frozen=True)
class ScheduleStage:
    """The stateful function; ``dedup_window_ms`` is how long a key remembers a msg id after its
    decision (and after its retry's release; pending retries' ids are remembered until then).

    With ``parked``, a key whose inline pending retries pass ``park_bytes`` (Arrow
    bytes) at the end of a call parks them in a file (:mod:`retry_engine.core._parked`)
    and keeps only a reference in its state value.

    With ``seals``, a key whose encoded state passes ``max_key_bytes`` at the end of
    a call seals (:mod:`retry_engine.core._state_splits`): it publishes the msg ids it
    knows, named with the current micro-batch id (``batch_id``, or Spark's when
    None), and records that batch in its state. Replay: the same batch seals the
    same keys with the same ids; the published file of the first attempt is kept.

    Input and output are packed rows (:mod:`retry_engine.core.packed`): each carries
    WORK rows of this key as an Arrow IPC payload.
    """

    dedup_window_ms: int
    seals: SealStore | None = None
    # A key's state value (encoded pending + seen bytes) past which it seals.
    max_key_bytes: int = DEFAULT_STATE_KEY_MAX_BYTES
    batch_id: int | None = None
    parked: ParkedStore | None = None
    park_bytes: int = DEFAULT_STATE_PARK_BYTES

    def __call__(
        self, key: tuple[str, int], frames: Iterator[pd.DataFrame], state: GroupState
    ) -> Iterator[pd.DataFrame]:
        settle()
        route, bucket = key
        payloads = [payload for frame in frames for payload in frame["payload"]]
        if int(bucket) == NO_STATE_BUCKET:
            if payloads:
                yield _packed(key, payloads)
            return
        now_ms = state.getCurrentProcessingTimeMs()
        out: list[pa.Table] = []
        held = KeyState()
        parked: dict[str, pa.Table] = {}
        if state.exists:
            value = state.get
            try:
                held = decode(value, key)
                parked = self._read_parked(key, held, now_ms, bool(payloads))
            except StateUnreadableError as exc:
                # Crash-looping on one bad value would stop every key; keep its bytes, start afresh.
                log.error("group %s bucket %s: schedule state moved aside to quarantine: %s", route, bucket, exc)
                out.append(quarantine_rows(key, group_of(route), value, exc, now_ms))
                held, parked = KeyState(), {}
        pending, seen, expires_ms = held.pending, held.seen, held.expires_ms
        if payloads and held.sealed_batch is not None and self.seals is not None:
            self._check_seal(self.seals, key, held.sealed_batch)

        if payloads:
            new = _in_source_order(payloads)
            ids = new.column("consumed_msg_id")
            # A msg id whose retry is still pending is known whatever the window says (B1, #12 item 6):
            # inline ones through ``pending`` (state written before that rule, layout 1, may have
            # forgotten them from ``seen``), parked ones through ``seen`` while the window lasts and
            # through their files after it.
            unseen = self._forgotten_rows(key, held.chunks, parked)  # all read by _read_parked
            known = pc.is_in(ids, value_set=_known(seen, pending, *unseen)).to_numpy(zero_copy_only=False)
            repeated = pd.Index(ids.to_numpy(zero_copy_only=False)).duplicated() | known
            fresh = new
            if repeated.any():
                out.append(ledger_only(_as_duplicates(new.filter(pa.array(repeated)))))
                fresh = new.filter(pa.array(~repeated))
            if fresh.num_rows:
                seen = _with_new(seen, fresh)
                is_retry = pc.fill_null(pc.equal(fresh.column("outcome"), RETRY), False)
                # Filters copy every column: at 100% failures every row is fresh and a retry.
                scheduled = fresh if pc.all(is_retry).as_py() else fresh.filter(is_retry)
                if scheduled.num_rows:
                    pending = pa.concat_tables([pending, scheduled])
                # A retry's message waits in ``pending`` and leaves with its delivery; its outcome row
                # only goes to the ledger, so it goes on without the message's columns.
                if scheduled.num_rows == fresh.num_rows:
                    out.append(ledger_only(fresh))
                else:
                    out.append(fresh.filter(pc.invert(is_retry)))
                    if scheduled.num_rows:
                        out.append(ledger_only(scheduled))
                expires_ms = max(expires_ms, now_ms + self.dedup_window_ms)

        released: list[pa.Table] = []
        if pending.num_rows:
            is_due = due_ms(pending) <= now_ms
            if is_due.any():
                released.append(pending.filter(pa.array(is_due)))
                pending = pending.filter(pa.array(~is_due))
        chunks: list[Chunk] = []
        for chunk in held.chunks:
            if chunk.next_due_ms > now_ms:
                chunks.append(chunk)
                continue
            rows = parked[chunk.name].slice(chunk.released)
            rest_due = due_ms(rows)
            n = int(np.searchsorted(rest_due, now_ms, side="right"))  # sorted by due time: a prefix is due
            released.append(rows.slice(0, n))
            if n < len(rest_due):
                chunks.append(dataclasses.replace(chunk, released=chunk.released + n, next_due_ms=int(rest_due[n])))
            elif (batch := self._batch()) is not None and self.parked is not None:
                self.parked.done(chunk, batch)
        if released:
            gone = _once(pa.concat_tables(released), route, bucket)
            if gone.num_rows:
                out.append(_as_deliveries(gone, now_ms))
                # A released id stays known for a window after its release, like a fresh one.
                seen = _with_released(seen, gone)
                expires_ms = max(expires_ms, now_ms + self.dedup_window_ms)
                log.debug("group %s bucket %s: released %d retries", route, bucket, gone.num_rows)
        # A passed dedup window is no wake-up (it would fire the key on every micro-batch, shipping
        # its whole blob each time): its msg ids are forgotten, except those of retries still
        # pending, which stay known until released (inline ones through ``pending``, parked ones
        # through their files, both when the key is next read with input).
        if now_ms >= expires_ms:
            seen = _ids()
            chunks = [dataclasses.replace(c, ids_known=False) for c in chunks]
        if out:
            yield _packed(key, [payload for table in out for payload in payload_chunks(table)])

        if self.parked is not None and pending.num_rows and pending.nbytes > self.park_bytes:
            batch = self._batch()
            if batch is not None:
                chunks.append(self.parked.park(key, batch, pending))
                # Known while parked: layout 1 state may have forgotten an inline retry's id.
                seen = _with_released(seen, pending)
                pending = pending.slice(0, 0)
        wake_ms = [c.next_due_ms for c in chunks]
        if pending.num_rows:
            wake_ms.append(int(due_ms(pending).min()))
        if now_ms < expires_ms:
            wake_ms.append(expires_ms)
        if not wake_ms:
            state.remove()
            return
        next_ms = min(wake_ms)
        current = KeyState(pending, seen, expires_ms, held.sealed_batch, tuple(chunks))
        value = encode(current)
        if held.sealed_batch is None and self.seals is not None and len(value[0]) + len(value[1]) > self.max_key_bytes:
            try:
                forgotten = [*self._forgotten_rows(key, current.chunks, parked)]
            except StateUnreadableError as exc:
                # A parked file of the key is gone or damaged: not sealed now (the value stays whole,
                # a little past the limit). The key is quarantined when it next reads that file (rows
                # come in, or the file's rows fall due), as for any unreadable state, while every
                # other key goes on: raising here stopped the whole engine on every restart.
                log.warning("group %s bucket %s: not split: %s", route, bucket, exc)
            else:
                value = self._seal(self.seals, key, current, len(value[0]) + len(value[1]), forgotten) or value
        state.update(value)
        # Spark fires the timeout in the first batch whose timestamp is past now + duration.
        state.setTimeoutDuration(max(1, next_ms - now_ms))

    def _batch(self) -> int | None:
        return self.batch_id if self.batch_id is not None else current_batch_id()

    def _forgotten_rows(self, key: tuple[str, int], chunks: tuple[Chunk, ...], parked: dict[str, pa.Table]) -> Iterator[pa.Table]:
        """The unreleased rows of ``chunks`` whose ids ``seen`` lacks, read now if this call has not.

        Only a key that seals in a call without input (its released ids alone passed the
        threshold) reads here; a file that cannot be read then stops the batch.
        """
        for chunk in chunks:
            if chunk.ids_known:
                continue
            if chunk.name not in parked:
                parked[chunk.name] = self._load(key, chunk)
            yield parked[chunk.name].slice(chunk.released)

    def _load(self, key: tuple[str, int], chunk: Chunk) -> pa.Table:
        """``chunk``'s rows, checked against its reference and as pending retries sorted by due time."""
        if self.parked is None:
            raise StateUnreadableError(
                f"the state of key {key} references parked retries, but the stage has no parked store"
            )
        path = self.parked.path(chunk.name)
        rows = parked_rows(self.parked.read(chunk, key), path)
        # The reference's next due time is that of its first unreleased row (what park and every release
        # write): another (a damaged or edited state) would hold due rows back, or skip some.
        first = int(due_ms(rows.slice(chunk.released, 1))[0])
        if first != chunk.next_due_ms:
            raise StateUnreadableError(
                f"the parked retries file {path}: its reference's next due time {chunk.next_due_ms} is not that of "
                f"its row {chunk.released} ({first}), the first not yet released"
            )
        return rows

    def _read_parked(
        self, key: tuple[str, int], held: KeyState, now_ms: int, has_input: bool
    ) -> dict[str, pa.Table]:
        """The rows of ``held``'s parked files this call needs: those with rows due, and, when rows come
        in, those whose ids the key forgot with its dedup window (deduplication reads them)."""
        try:
            return {
                c.name: self._load(key, c)
                for c in held.chunks
                if c.next_due_ms <= now_ms or (has_input and not c.ids_known)
            }
        except StateUnreadableError as exc:
            folder = "" if self.parked is None else f" in {self.parked.path('')}"
            raise StateUnreadableError(
                f"{str(exc).removeprefix(f'[{exc.code}] ')}; the key's parked files stay{folder} (their names and "
                "how much of each was released are in the pending blob's metadata, retry_engine.parked)"
            ) from exc.__cause__

    def _seal(
        self, seals: SealStore, key: tuple[str, int], held: KeyState, size: int, forgotten: list[pa.Table]
    ) -> tuple[bytes, bytes, int] | None:
        """Publish ``held``'s msg ids as key ``key``'s seal; its state value sealed, or None at the deepest level."""
        route, bucket = key
        if level_of(route) >= MAX_LEVEL:
            log.warning(
                "group %s bucket %s: state value of %d bytes past engine.state_key_max_bytes = %d, but the key "
                "is at the deepest split level %d and keeps growing", route, bucket, size, self.max_key_bytes, MAX_LEVEL,
            )
            return None
        batch = self.batch_id if self.batch_id is not None else current_batch_id()
        if batch is None:
            raise StateSplitError(
                f"state key ({route!r}, {bucket}) must seal but the Spark task has no streaming.sql.batchId; the "
                "schedule stage runs only inside a streaming micro-batch",
                code="STATE_SPLIT_NO_BATCH_ID",
            )
        ids = _ids(held.seen, held.pending, *forgotten)  # and the parked ids ``seen`` lacks
        path = seals.publish(route, int(bucket), batch, ids.to_pylist())
        log.info(
            "group %s bucket %s: state value of %d bytes passed %d: sealed in batch %d, %d msg ids published to %s; "
            "new msg ids of its bucket go one level down", route, bucket, size, self.max_key_bytes, batch, len(ids), path,
        )
        return encode(dataclasses.replace(held, sealed_batch=batch))

    @staticmethod
    def _check_seal(seals: SealStore, key: tuple[str, int], batch: int) -> None:
        """A sealed key's published ids must still be there: without them decide routes its ids elsewhere."""
        route, bucket = key
        if not seals.exists(route, int(bucket), level_of(route), batch):
            raise StateSplitError(
                f"state key ({route!r}, {bucket}) sealed in batch {batch} but its published msg ids "
                f"{seals.seal_path(route, int(bucket), level_of(route), batch)} are gone; restore the file "
                "from a backup of the checkpoint (without it, re-sent consume results of its msg ids would be "
                "decided again)",
                code="STATE_SPLIT_FILE_MISSING",
            )


def _ids(seen: pa.Array | None = None, *tables: pa.Table) -> pa.Array:
    """The distinct msg ids of ``seen`` and of the ``consumed_msg_id`` column of ``tables``, as one array.

    In Arrow throughout: a key remembers up to its bucket's failures for the dedup
    window, and Python sets of them cost more than the rest of the stage at 100% failures.
    """
    parts = [] if seen is None else [seen]
    parts += [c for t in tables for c in t.column("consumed_msg_id").chunks]
    if not parts:
        return pa.array([], pa.string())
    return pc.unique(pc.drop_null(pa.chunked_array(parts, pa.string())))


def _known(seen: pa.Array, *pending: pa.Table) -> pa.ChunkedArray:
    """Every msg id a key knows, as one value set: ``seen`` and the pending retries' (with repeats;
    a lookup does not mind them, and a distinct copy of a big key's ids cost more than the lookup)."""
    ids = [c for rows in pending for c in pc.drop_null(rows.column("consumed_msg_id")).chunks]
    return pa.chunked_array([seen, *ids], pa.string())


def _with_new(seen: pa.Array, fresh: pa.Table) -> pa.Array:
    """``seen`` and the msg ids of ``fresh``: rows whose ids are distinct and not in ``seen`` (the
    stage took only those as fresh), so appending them is ``_ids(seen, fresh)``, same order, no
    hashing of what the key already knew (#14 part 5)."""
    return _appended(seen, _msg_ids(fresh))


def _with_released(seen: pa.Array, released: pa.Table) -> pa.Array:
    """``_ids(seen, released)``: ``seen`` and, after it, the released ids it does not hold (a key
    forgets its ids when its window passes, while their retries stay pending)."""
    ids = _msg_ids(released)
    return _appended(seen, pc.unique(ids.filter(pc.invert(pc.is_in(ids, value_set=seen)))))


def _msg_ids(rows: pa.Table) -> pa.Array:
    return pc.drop_null(rows.column("consumed_msg_id")).combine_chunks().cast(pa.string())


def _appended(seen: pa.Array, ids: pa.Array) -> pa.Array:
    return pa.concat_arrays([seen.cast(pa.string()), ids]) if len(ids) else seen


def group_of(route: str) -> str:
    """The consumer group of a state key's ``route`` (which may carry a sub-key)."""
    return route.split(SUBKEY_SEPARATOR, 1)[0]


@dataclass(frozen=True)
class StateKeySplit:
    """Gives each stateful row its state key's route: the checkpoint's base sub-key, then the size-bounded levels.

    Why: all pending retries of a key are one binary value in Spark's state, which Spark builds
    in JVM direct memory and Arrow caps at 2 GiB; a mass failure (millions of results with one
    store-time bucket and group) would build one such value (#12 item 17).

    Base split: ``subkeys`` sub-keys by a stable hash (CRC-32) of the consumed msg id, written
    into the WORK row's ``route`` as ``group#nn`` (1: the plain group, no split). Buckets before
    ``first_split_bucket`` keep the plain key: a checkpoint written by a release without sub-keys
    holds their state there (None: split every bucket). Levels: with ``seals``, a row whose key
    sealed in an earlier batch walks down to the key that holds or takes its msg id
    (:func:`retry_engine.core._state_splits.walk`), so a duplicate of msg id X always meets X's
    record (B1). Rows without state (``bucket == NO_STATE_BUCKET``: acknowledgements, most of
    the traffic) are left as they are, and a batch is not hashed at all while no key of its
    buckets has sealed.

    Replay: a pure function of the rows, the checkpoint's :data:`KEYS_FILE` and the seals of
    batches before ``batch_id``, so a replayed batch routes every row to the same key.
    """

    subkeys: int
    first_split_bucket: int | None = None
    seals: SealStore | None = field(default=None, compare=False)
    # The stateful stage's partition count the base keys are placed on (1: not placed), and the
    # first bucket placed (None: every bucket; earlier buckets keep the key an older release gave).
    partitions: int = 1
    first_placed_bucket: int | None = None
    # The width of the store-time buckets in the checkpoint's keys (engine.state_bucket when it was
    # created); None: not known (a split built without a checkpoint).
    bucket_ms: int | None = None

    def __call__(self, work: _Rows, *, batch_id: int | None = None) -> _Rows:
        if work.num_rows == 0:
            return work
        buckets = _flat(work.column("bucket"))
        stateful = pc.fill_null(pc.not_equal(buckets, NO_STATE_BUCKET), False)
        work = self._placed(self._base(work, buckets, stateful), buckets, stateful)
        if self.seals is None:
            return work
        sealed = self.seals.sealed_before(batch_id if batch_id is not None else _NO_BATCH)
        if not sealed:
            return work
        if batch_id is None:
            raise StateSplitError(
                f"{self.seals.checkpoint} has sealed state keys, so routing needs the micro-batch id, and the "
                "Spark task has no streaming.sql.batchId; decide runs only inside a streaming micro-batch",
                code="STATE_SPLIT_NO_BATCH_ID",
            )
        routes = _flat(work.column("route"))
        walked = walk(routes, buckets, _flat(work.column("consumed_msg_id")), stateful, sealed, self.seals)
        return work if walked is routes else _with_routes(work, walked)

    def _base(self, work: _Rows, buckets: pa.Array, stateful: pa.Array) -> _Rows:
        if self.subkeys <= 1:
            return work

        def split(rows: pa.Array, routes: pa.Array) -> pa.Array:
            # Only stateful rows (failures) are hashed; acknowledgements, most of the traffic, are not.
            ids = work.column("consumed_msg_id").take(rows).to_pylist()
            suffixes = pa.array(
                [f"{SUBKEY_SEPARATOR}{zlib.crc32((i or '').encode()) % self.subkeys:02d}" for i in ids], pa.string()
            )
            return pc.binary_join_element_wise(routes, suffixes, "")

        return _rerouted(work, _since(stateful, buckets, self.first_split_bucket), split)

    def _placed(self, work: _Rows, buckets: pa.Array, stateful: pa.Array) -> _Rows:
        """Stateful rows' base keys placed on the stateful stage's partitions (:mod:`retry_engine.core._placement`)."""
        if not placing(self.partitions):
            return work
        return _rerouted(
            work,
            _since(stateful, buckets, self.first_placed_bucket),
            lambda rows, routes: place(routes, buckets.take(rows), self.partitions),
        )


def _rerouted(work: _Rows, mask: pa.Array, new_routes: Callable[[pa.Array, pa.Array], pa.Array]) -> _Rows:
    """``work`` with the routes of the rows in ``mask`` replaced by ``new_routes(rows, their routes)``."""
    rows = pc.indices_nonzero(mask)
    if len(rows) == 0:
        return work
    routes = _flat(work.column("route"))
    return _with_routes(work, pc.replace_with_mask(routes, mask, new_routes(rows, routes.take(rows))))


def _since(stateful: pa.Array, buckets: pa.Array, first_bucket: int | None) -> pa.Array:
    """The stateful rows of buckets from ``first_bucket`` on (all of them for None)."""
    if first_bucket is None:
        return stateful
    return pc.and_(stateful, pc.fill_null(pc.greater_equal(buckets, first_bucket), False))


def _with_routes(work: _Rows, routes: pa.Array) -> _Rows:
    index = work.schema.get_field_index("route")
    return work.set_column(index, work.schema.field(index), routes)


# Lists every seal (used only to tell whether any exists when no batch id is known).
_NO_BATCH: Final = 2**63 - 1


def _flat(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def state_key_split(
    checkpoint: str, *, bucket_ms: int, now_ms: int, subkeys: int = STATE_SUBKEYS, partitions: int = 1
) -> StateKeySplit:
    """The state key rule of ``checkpoint``, recorded in its :data:`KEYS_FILE` on first use.

    The rule carries the checkpoint's seals (:class:`~retry_engine.core._state_splits.SealStore`),
    so keys that grow past ``engine.state_key_max_bytes`` split further whatever the base count.
    A new checkpoint (no ``offsets`` yet) splits every bucket into ``subkeys`` and places every
    base key on one of ``partitions`` (the session's ``spark.sql.shuffle.partitions``, which Spark
    records with the checkpoint; :mod:`retry_engine.core._placement`); a recorded count wins over
    ``subkeys`` (a different one is logged, never applied). An existing checkpoint, started by a
    release without sub-keys or without placement, takes them for buckets that start after
    ``now_ms`` only (and the partition count Spark recorded in its offsets): every message that
    release decided was stored before it stopped, so its duplicates keep meeting its record
    under the key it had.

    The bucket width (``engine.state_bucket``) is recorded too and kept: a msg id's key is its
    store time's bucket, so a duplicate decided after a change of width would miss its record and
    be retried a second time (B1). A keys file of a release that did not record it gains the
    configured width (the one that release most likely ran with).
    """
    fs, root = checkpoint_filesystem(checkpoint)
    path = f"{root}/{KEYS_FILE}"
    recorded = _read_keys(fs, path)
    if recorded is not None and ("partitions" in recorded or "bucket_ms" in recorded):
        # What a start recorded is checked before anything is added (a damaged file is left as it is).
        _check_keys(recorded, path, "partitions", "placed_since_ms", *(["bucket_ms"] if "bucket_ms" in recorded else []))
    if recorded is None or "partitions" not in recorded:
        started = bool(fs.get_file_info(pafs.FileSelector(f"{root}/offsets", allow_not_found=True)))
        since = now_ms if started else None
        recorded = {"subkeys": subkeys, "split_since_ms": since} if recorded is None else recorded
        recorded = {
            **recorded,
            "partitions": (shuffle_partitions_of(checkpoint) if started else None) or partitions,
            "placed_since_ms": since,
        }
    if "bucket_ms" not in recorded:  # a new file, or one of a release that did not record the width
        recorded = {**recorded, "bucket_ms": bucket_ms}
        fs.create_dir(root, recursive=True)
        # Written aside and renamed: a start killed mid-write must not leave a half file that
        # stops every later start.
        partial = f"{path}.{uuid.uuid4().hex}.tmp"
        with fs.open_output_stream(partial) as stream:
            stream.write((json.dumps(recorded) + "\n").encode("utf-8"))
        fs.move(partial, path)
        log.info("state keys of %s: %s", checkpoint, recorded)
    _check_keys(recorded, path, "partitions", "placed_since_ms", "bucket_ms")
    if recorded["subkeys"] != subkeys:
        log.warning(
            "state sub-keys: %s keeps the %d it was created with (engine.state_subkeys = %d applies to new "
            "checkpoints only: re-routing would separate msg ids in state from their duplicates)",
            checkpoint, recorded["subkeys"], subkeys,
        )
    width = recorded["bucket_ms"]
    if width != bucket_ms:
        log.warning(
            "state buckets: %s keeps the %d ms it was created with (engine.state_bucket = %d ms applies to new "
            "checkpoints only: other buckets would separate msg ids in state from their duplicates)",
            checkpoint, width, bucket_ms,
        )
    return StateKeySplit(
        subkeys=recorded["subkeys"],
        first_split_bucket=_first_bucket(recorded["split_since_ms"], width),
        seals=SealStore(checkpoint),
        partitions=recorded["partitions"],
        first_placed_bucket=_first_bucket(recorded["placed_since_ms"], width),
        bucket_ms=width,
    )


_KEYS_FILE_SHAPE: Final = (
    "{'subkeys': <int >= 1>, 'split_since_ms': <int or null>, 'partitions': <int >= 1>, "
    "'placed_since_ms': <int or null>, 'bucket_ms': <int >= 1>}"
)


def _read_keys(fs: pafs.FileSystem, path: str) -> dict[str, Any] | None:
    """The checkpoint's recorded rule, None when it has none; its first two entries checked (the
    placement's two and the bucket width may be missing: an earlier release wrote it)."""
    try:
        with fs.open_input_stream(path) as stream:
            recorded = json.loads(stream.read().decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad JSON, non-UTF-8 bytes, too deep nesting
        raise StateUnreadableError(
            f"{path} is not UTF-8 JSON text ({exc}); expected {_KEYS_FILE_SHAPE}. Restore it from a "
            "backup of the checkpoint (without it, msg ids already in state may no longer meet their "
            "duplicates)",
            code="STATE_KEYS_FILE_INVALID",
        ) from exc
    except FileNotFoundError:
        return None
    _check_keys(recorded, path)
    return cast(dict[str, Any], recorded)


def _check_keys(recorded: object, path: str, *placement: str) -> None:
    """A JSON object whose ``subkeys`` (and ``partitions`` when named) are ints >= 1 and whose
    ``*_since_ms`` are ints or null."""
    names = ("subkeys", "split_since_ms", *placement)
    if not isinstance(recorded, dict) or not all(n in recorded and _valid_key(n, recorded[n]) for n in names):
        raise StateUnreadableError(
            f"{path} holds {recorded!r}; expected {_KEYS_FILE_SHAPE}", code="STATE_KEYS_FILE_INVALID"
        )


def _valid_key(name: str, value: object) -> bool:
    integer = is_whole(value)
    return (value is None or integer) if name.endswith("_since_ms") else (integer and cast(int, value) >= 1)


def _first_bucket(since_ms: int | None, bucket_ms: int) -> int | None:
    """The first bucket that starts after ``since_ms`` (None: every bucket)."""
    return None if since_ms is None else since_ms // bucket_ms + 1


def _packed(key: tuple[str, int], payloads: list[bytes]) -> pd.DataFrame:
    """Packed rows of one key as pandas, holding the payload bytes as they are (Spark copies them into Arrow).

    Going through :func:`~retry_engine.core.packed.packed_batch` and ``to_pandas``
    copied every payload byte twice more (#14 part 5).
    """
    n = len(payloads)
    return pd.DataFrame(
        {"route": [key[0]] * n, "bucket": np.full(n, int(key[1]), dtype=np.int64), "payload": payloads},
        columns=PACKED_ARROW_SCHEMA.names,
    )


def _with(table: pa.Table, **columns: pa.Array | pa.ChunkedArray) -> pa.Table:
    for name, values in columns.items():
        table = table.set_column(table.schema.get_field_index(name), WORK.arrow_schema.field(name), values)
    return table


def ledger_only(rows: pa.Table) -> pa.Table:
    """``rows`` (outcome rows that go to the outcomes table only) with only the columns of
    :data:`~retry_engine.core.outputs.LEDGER_COLUMNS` (:func:`~retry_engine.core.packed.unpack`
    gives them back the others, null).

    At 100% failures every input row comes back out of this stage twice, as its
    outcome row and later as its delivery; only the delivery needs the message
    (body, properties, history). Sending the outcome row without it, and without
    the other columns' nulls, halves what crosses from this stage to the writer (#14 part 5).
    """
    return rows.select([name for name in rows.schema.names if name in LEDGER_COLUMNS])


def _once(released: pa.Table, route: str, bucket: int) -> pa.Table:
    """``released`` with each consumed delivery's retry once. Deduplication keeps ids unique as they come
    in, so a repeat comes only from a damaged or edited state (the same row twice in a blob, inline and
    parked): it would be delivered twice."""
    ids = pd.Index(released.column("consumed_msg_id").to_numpy(zero_copy_only=False))
    repeated = ids.duplicated()
    if not repeated.any():
        return released
    log.warning("group %s bucket %s: %d retries held twice in the state released once", route, bucket, int(repeated.sum()))
    return released.filter(pa.array(~repeated))


def _in_source_order(payloads: list[bytes]) -> pa.Table:
    """The WORK rows of ``payloads`` sorted by source position (replay: the same order every time).

    Each payload is in source order, and decide's payloads of one key hold disjoint
    runs of positions, so putting whole payloads in order of their first position
    usually orders every row; only when it does not are the rows sorted (a take of
    every column, which was a tenth of this stage at 100% failures).
    """
    tables = sorted((as_work(from_ipc(p)) for p in payloads), key=_first_position)
    rows = pa.concat_tables(tables) if tables else WORK.arrow_schema.empty_table()
    positions = _flat(rows.column("source_position"))
    if len(positions) > 1 and positions.null_count == 0:
        in_order = pc.all(
            pc.less_equal(positions.slice(0, len(positions) - 1), positions.slice(1))
        ).as_py()
        if in_order:
            return rows
    return rows.take(pc.sort_indices(positions))


def _first_position(rows: pa.Table) -> str:
    first = rows.column("source_position")[0].as_py() if rows.num_rows else None
    return first if first is not None else ""


def _as_duplicates(rows: pa.Table) -> pa.Table:
    """A repeated consume result: recorded in the ledger, produces nothing else."""
    reason = pc.binary_join_element_wise(
        "msg_id ", rows.column("consumed_msg_id"), " of group ", rows.column("consumer_group"),
        " was already decided; its ", rows.column("outcome"), " is ", rows.column("output_msg_id"), "",
        null_handling="replace", null_replacement="None",
    )
    n = rows.num_rows
    return _with(
        rows,
        reason_code=pa.repeat(pa.scalar("DUPLICATE", pa.string()), n),
        reason=reason,
        outcome=pa.repeat(pa.scalar(DUPLICATE, pa.string()), n),
    )


def _as_deliveries(rows: pa.Table, now_ms: int) -> pa.Table:
    """Retries leaving the schedule stage for %RETRY%G: stored (and delivered) now."""
    n = rows.num_rows
    now = pa.repeat(pa.scalar(now_ms * _US_PER_MS, pa.int64()), n).cast(WORK["delivered_at"].type)
    return _with(
        rows,
        kind=pa.repeat(pa.scalar(KIND_DELIVERY, pa.string()), n),
        delivered_at=now,
        store_timestamp=now.cast(WORK["store_timestamp"].type),
    )


__all__ = [
    "KEYS_FILE",
    "STATE_SCHEMA",
    "STATE_SUBKEYS",
    "SUBKEY_SEPARATOR",
    "ScheduleStage",
    "StateKeySplit",
    "group_of",
    "ledger_only",
    "state_key_split",
]
