"""Where the schedule stage's state keys run: each key placed on a partition of the stateful stage.

Why: Spark runs a stateful operator's keys on ``spark.sql.shuffle.partitions``
partitions chosen by a hash of the key, and one partition is one task. A
micro-batch's failures fall into few keys (consumer groups x a few store-time
buckets), so hashing alone can put most of them on one partition while another
core idles: at 100% failures on two cores, the two tasks of the stage took
741 / 2,538 ms in one batch (RESULTS run Y).

How: the stateful operator's partition of a key is Spark's
``pmod(murmur3_hash(route, bucket), partitions)`` (``HashPartitioning`` of the
grouping columns, seed 42), which this module computes as Spark does
(:func:`spark_partition`). A key's *target* partition is
``(crc32(group) + sub-key + bucket) mod partitions``: consecutive buckets of a
group, and the sub-keys of one bucket, take consecutive partitions. The key's
route gets the suffix ``#~<n>`` with the smallest ``n`` whose hash lands on the
target (:func:`placed_route`; about ``partitions`` tries, cached per worker).

Replay and restarts: the route is a pure function of (route, bucket) and the
partition count recorded in the checkpoint's keys file (Spark keeps a
checkpoint's partition count whatever the session's setting says), so a
duplicate of a msg id always meets the key its original went to (B1). A count
of the recorded value but a different real one only unbalances, never
re-routes. Counts above :data:`MAX_PLACED_PARTITIONS` are not placed (the
search would cost more than a key's first call).
"""

from __future__ import annotations

import functools
import zlib
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Spark's HashPartitioning seed (Murmur3Hash's default).
SPARK_HASH_SEED: Final = 42
# Above this many partitions keys are left to Spark's hashing.
MAX_PLACED_PARTITIONS: Final = 4096
# A placed route's suffix: after the group's "#", so `group_of` still reads the group; then
# SUFFIX_DIGITS hex digits, a fixed width so that every candidate hashes the same bytes but the
# last few, which numpy tries side by side.
PLACEMENT_SEPARATOR: Final = "#~"
SUFFIX_DIGITS: Final = 4
_SUFFIXES: Final = 16**SUFFIX_DIGITS
# Candidates hashed at a time, per partition (a fair draw hits a target with 1 / partitions).
_TRIES_PER_PARTITION: Final = 8
# Splits a (route, bucket) pair's text; never in a bucket's decimal digits.
_PAIR: Final = "\x1f"


# Spark's Murmur3_x86_32 on uint32 arrays (numpy wraps their products and shifts at 32 bits).
def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * np.uint32(0xCC9E2D51), 15) * np.uint32(0x1B873593)


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h1: np.ndarray, length: int) -> np.ndarray:
    h1 = h1 ^ np.uint32(length & 0xFFFFFFFF)
    h1 = (h1 ^ (h1 >> np.uint32(16))) * np.uint32(0x85EBCA6B)
    h1 = (h1 ^ (h1 >> np.uint32(13))) * np.uint32(0xC2B2AE35)
    mixed: np.ndarray = h1 ^ (h1 >> np.uint32(16))
    return mixed


def _mix_bytes(h1: np.ndarray, data: np.ndarray) -> np.ndarray:
    """Row ``i`` of ``data`` (uint8) into ``h1[i]`` as Spark's ``hashUnsafeBytes`` does before its
    final mix: little-endian words, then each trailing byte as a sign-extended word of its own
    (Spark's, not the reference Murmur3 tail)."""
    aligned = data.shape[1] - data.shape[1] % 4
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(np.ascontiguousarray(data[:, i : i + 4]).view("<u4")[:, 0]))
    for i in range(aligned, data.shape[1]):
        h1 = _mix_h1(h1, _mix_k1(data[:, i].view(np.int8).astype(np.int32).view(np.uint32)))
    return h1


def _hash_long(value: int, h1: np.ndarray) -> np.ndarray:
    """Spark's ``hashLong`` of ``value`` seeded with each of ``h1``: the low word, then the high word."""
    value &= 0xFFFFFFFFFFFFFFFF
    # Arrays, not numpy scalars: a scalar product warns when it wraps.
    low, high = _mix_k1(np.array([value & 0xFFFFFFFF, value >> 32], dtype=np.uint32))
    return _fmix(_mix_h1(_mix_h1(h1, low), high), 8)


def _pmod(h1: np.ndarray, partitions: int) -> np.ndarray:
    return h1.view(np.int32).astype(np.int64) % partitions


def spark_hash(route: str, bucket: int) -> int:
    """Spark's ``hash(route, bucket)`` for a string and a bigint column (a signed 32-bit int)."""
    data = np.frombuffer(route.encode("utf-8"), dtype=np.uint8).reshape(1, -1)
    h1 = _mix_bytes(np.array([SPARK_HASH_SEED], dtype=np.uint32), data)
    return int(_hash_long(bucket, _fmix(h1, data.shape[1])).view(np.int32)[0])


def spark_partition(route: str, bucket: int, partitions: int) -> int:
    """The partition Spark's stateful operator (and any ``HashPartitioning`` on the two) gives the key."""
    return spark_hash(route, bucket) % partitions


def target_partition(route: str, bucket: int, partitions: int) -> int:
    """The partition a key should run on: consecutive buckets of a group, and the sub-keys of one
    bucket (``group#nn``), on consecutive partitions."""
    group, _, sub = route.partition("#")
    index = int(sub) if sub.isdigit() else 0
    return (zlib.crc32(group.encode("utf-8")) + index + bucket) % partitions


def placing(partitions: int) -> bool:
    """Whether keys are placed on ``partitions`` partitions (not on one, nor on very many)."""
    return 1 < partitions <= MAX_PLACED_PARTITIONS


@functools.lru_cache(maxsize=4096)
def placed_route(route: str, bucket: int, partitions: int) -> str:
    """``route`` with the suffix that puts (route, bucket) on its target partition: the first of the
    fixed-width suffixes that does (``route`` itself when not :func:`placing`, or when none does)."""
    if not placing(partitions):
        return route
    target = target_partition(route, bucket, partitions)
    prefix = np.frombuffer(f"{route}{PLACEMENT_SEPARATOR}".encode(), dtype=np.uint8)
    # The prefix's whole words hash the same for every candidate: once.
    aligned = len(prefix) - len(prefix) % 4
    start = _mix_bytes(np.array([SPARK_HASH_SEED], dtype=np.uint32), prefix[:aligned].reshape(1, -1))
    chunk = min(_SUFFIXES, _TRIES_PER_PARTITION * partitions)
    for first in range(0, _SUFFIXES, chunk):
        suffixes = _suffix_bytes()[first : first + chunk]
        rest = np.hstack([np.broadcast_to(prefix[aligned:], (len(suffixes), len(prefix) - aligned)), suffixes])
        h1 = _fmix(_mix_bytes(np.repeat(start, len(suffixes)), rest), len(prefix) + SUFFIX_DIGITS)
        hits = np.flatnonzero(_pmod(_hash_long(bucket, h1), partitions) == target)
        if len(hits):
            return f"{route}{PLACEMENT_SEPARATOR}{first + int(hits[0]):0{SUFFIX_DIGITS}x}"
    return route


@functools.cache
def _suffix_bytes() -> np.ndarray:
    """Every suffix's hex digits as ASCII bytes, one row each, in order (0000, 0001, ...)."""
    shifts = np.arange(SUFFIX_DIGITS - 1, -1, -1, dtype=np.uint32) * np.uint32(4)
    digits = (np.arange(_SUFFIXES, dtype=np.uint32)[:, None] >> shifts) & np.uint32(15)
    hex_digits: np.ndarray = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)[digits]
    return hex_digits


def place(routes: pa.Array, buckets: pa.Array, partitions: int) -> pa.Array:
    """Each (route, bucket) pair's placed route, computed once per distinct pair (a batch has few);
    a null route or bucket stays null."""
    if len(routes) == 0 or not placing(partitions):
        return routes
    pairs = pc.binary_join_element_wise(routes, pc.cast(buckets, pa.string()), _PAIR).dictionary_encode()
    placed = []
    for pair in pairs.dictionary.to_pylist():
        route, _, bucket = pair.rpartition(_PAIR)
        placed.append(placed_route(route, int(bucket), partitions))
    return pa.array(placed, pa.string()).take(pairs.indices)


__all__ = [
    "MAX_PLACED_PARTITIONS",
    "PLACEMENT_SEPARATOR",
    "place",
    "placed_route",
    "placing",
    "spark_hash",
    "spark_partition",
    "target_partition",
]
