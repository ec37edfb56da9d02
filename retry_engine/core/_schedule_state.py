"""The schedule stage's state value: its versioned layout, and what happens to one that cannot be read.

Spark keeps one state row per key with the schema :data:`STATE_SCHEMA`
(``pending binary, seen binary, expires_ms long``). That schema is what Spark
checks against an existing checkpoint, so it never changes: the layout inside
the two blobs carries its own version instead, in the Arrow IPC schema
metadata (:data:`VERSION_KEY`).

Versions:

* 1 -- main up to 2026-11 (no version in the metadata): ``pending`` holds WORK
  rows, ``seen`` one ``msg_id`` column.
* 2 -- the same columns plus, in the metadata, the version and the row count
  (a blob cut short at a batch boundary still parses; the count catches it).
* 3 -- version 2 plus, in the ``seen`` blob's metadata, the batch id in which the
  key sealed (:data:`SEALED_KEY`, absent while it has not; see
  :mod:`retry_engine.core._state_splits`). Versions 1 and 2 read as not sealed.
* 4 -- version 3 plus, in the ``pending`` blob's metadata, references to parked
  pending retries (:data:`CHUNKS_KEY`, JSON; see :mod:`retry_engine.core._parked`).
  Written only by a key that has parked retries: a key without them is still
  written as version 3, byte for byte, so a release that reads up to 3 reads it.

A reader of version N reads every version up to N. WORK rows of an older
release are conformed to today's WORK schema by column name (a column the
old release lacked comes back null; one it had and we dropped is ignored), and
rejected if a column a retry cannot be written without is missing or null.

A value that cannot be read (corrupt or truncated IPC, wrong schema, nulls
where a retry needs a value, an unknown version) raises
:class:`~retry_engine.errors.StateUnreadableError`; the stage then moves it
aside with :func:`quarantine_rows` and starts the key afresh, so one bad value
never stops the stream and its bytes are kept in the quarantine table.
"""

from __future__ import annotations

import base64
import hashlib
import json
import numbers
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from retry_engine.core._parked import Chunk, chunks_from_json, chunks_to_json, due_ms
from retry_engine.core.decide import QUARANTINED
from retry_engine.core.decide import RETRY as RETRY_OUTCOME
from retry_engine.delta._arrow_ipc import from_ipc, to_ipc
from retry_engine.errors import StateUnreadableError, StateVersionError
from retry_engine.schemas import RETRY, WORK

STATE_SCHEMA: Final = "pending binary, seen binary, expires_ms long"
STATE_VERSION: Final = 4
# What a key without parked retries is written as (readable by releases before parking).
UNPARKED_VERSION: Final = 3
READABLE_VERSIONS: Final = (1, 2, 3, 4)
VERSION_KEY: Final = b"retry_engine.state_version"
ROWS_KEY: Final = b"retry_engine.state_rows"
SEALED_KEY: Final = b"retry_engine.sealed_batch"
CHUNKS_KEY: Final = b"retry_engine.parked"

# WORK rows of this kind carry a state value moved aside; they go to the quarantine table only
# (they are not consume results, so they have no outcome and are not counted as input).
KIND_STATE_QUARANTINE: Final = "state_quarantine"
STATE_UNREADABLE: Final = "STATE_UNREADABLE"
# Bytes of a moved-aside blob per quarantine row (base64 makes ~4/3 of that): well inside a payload.
QUARANTINE_PART_BYTES: Final = 512 * 1024

_SEEN_SCHEMA: Final = pa.schema([pa.field("msg_id", pa.string())])
# Without these a pending retry cannot be released (due_at, consumed_msg_id) or written to the
# retry table (its non-null columns), so a blob missing them is unreadable, not half-read.
_REQUIRED_PENDING: Final = tuple(
    dict.fromkeys(
        [
            "due_at",
            "outcome",
            "consumed_msg_id",
            "output_msg_id",
            *(f.name for f in RETRY.arrow_schema if not f.nullable),
        ]
    )
)


@dataclass
class KeyState:
    """One key's state: retries waiting for their due time, the msg ids it remembers, and until when.

    ``sealed_batch``: the micro-batch in which the key sealed (published its ids and
    stopped taking new ones), None while it has not. ``chunks``: its parked pending
    retries (:mod:`retry_engine.core._parked`); their msg ids are in ``seen`` while
    a chunk's ``ids_known`` holds (until the dedup window passes).
    """

    pending: pa.Table = field(default_factory=WORK.arrow_schema.empty_table)
    seen: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))
    """Distinct msg ids (an Arrow array: the stage tests and updates it in Arrow, never per id in Python)."""
    expires_ms: int = 0
    sealed_batch: int | None = None
    chunks: tuple[Chunk, ...] = ()


def encode(state: KeyState) -> tuple[bytes, bytes, int]:
    """``state`` as a :data:`STATE_SCHEMA` row, in layout :data:`STATE_VERSION`."""
    seen = pa.table({"msg_id": state.seen}, schema=_SEEN_SCHEMA)
    sealed = {} if state.sealed_batch is None else {SEALED_KEY: str(state.sealed_batch).encode()}
    version, parked = (STATE_VERSION, {CHUNKS_KEY: chunks_to_json(state.chunks)}) if state.chunks else (UNPARKED_VERSION, {})
    return _blob(state.pending, version, parked), _blob(seen, version, sealed), int(state.expires_ms)


def decode(value: tuple[Any, ...], key: tuple[str, int] | None = None) -> KeyState:
    """The :class:`KeyState` of a :data:`STATE_SCHEMA` row of any readable version (of ``key``: its
    parked files must be that key's).

    Raises :class:`StateUnreadableError` (or its :class:`StateVersionError`) when it cannot be read.
    """
    if len(value) != 3:
        raise StateUnreadableError(
            f"a state row has 3 fields (pending, seen, expires_ms), got {len(value)}"
        )
    pending_blob, seen_blob, expires_ms = value
    pending = _read(pending_blob, "pending")
    seen = _read(seen_blob, "seen")
    if "msg_id" not in seen.schema.names:
        raise StateUnreadableError(
            f"the seen blob has no msg_id column; its columns are {seen.schema.names}"
        )
    if isinstance(expires_ms, bool) or not isinstance(expires_ms, numbers.Integral):
        raise StateUnreadableError(f"expires_ms must be an integer, got {expires_ms!r}")
    ids = seen.column("msg_id")
    if not pa.types.is_string(ids.type) and not pa.types.is_large_string(ids.type):
        raise StateUnreadableError(f"the seen blob's msg_id column is {ids.type}, expected string")
    sealed = (seen.schema.metadata or {}).get(SEALED_KEY)
    if sealed is not None and not sealed.isdigit():
        raise StateUnreadableError(
            f"the seen blob's sealed batch is {sealed.decode(errors='replace')!r}, expected a batch id"
        )
    parked = (pending.schema.metadata or {}).get(CHUNKS_KEY)
    return KeyState(
        pending=_conform(pending),
        seen=pc.unique(pc.drop_null(ids.cast(pa.string()))),
        expires_ms=int(expires_ms),
        sealed_batch=None if sealed is None else int(sealed),
        chunks=() if parked is None else chunks_from_json(parked, key),
    )


def quarantine_rows(
    key: tuple[str, int], group: str, value: Any, error: BaseException, now_ms: int
) -> pa.Table:
    """WORK rows (kind :data:`KIND_STATE_QUARANTINE`) that keep an unreadable state ``value`` of ``key``.

    One quarantine row per :data:`QUARANTINE_PART_BYTES` of each blob (at least
    one per blob), reason code :data:`STATE_UNREADABLE`, the error's class and
    message in ``reason``; ``raw`` is JSON naming the key, the blob
    (``pending`` or ``seen``), the part, its bytes in base64 and the SHA-256 of
    the whole blob, so an operator can put the bytes back together:
    concatenate the decoded parts of one blob in part order.
    """
    fields = value if isinstance(value, tuple) and len(value) == 3 else (value, None, None)
    blobs = {"pending": fields[0], "seen": fields[1]}
    expires_ms = fields[2]
    cause = error.__cause__
    what = f"{type(error).__name__}: {error}" + (
        f" (caused by {type(cause).__name__}: {cause})" if cause else ""
    )
    quarantined_at = now_ms * 1000
    rows: list[dict[str, Any]] = []
    for name, blob in blobs.items():
        data = blob if isinstance(blob, bytes | bytearray | memoryview) else repr(blob).encode()
        data = bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        parts = [
            data[i : i + QUARANTINE_PART_BYTES] for i in range(0, len(data), QUARANTINE_PART_BYTES)
        ] or [b""]
        for n, part in enumerate(parts, start=1):
            raw = {
                "state_key": {"route": key[0], "bucket": int(key[1])},
                "blob": name,
                "encoding": "bytes"
                if isinstance(blob, bytes | bytearray | memoryview)
                else "python repr",
                "part": n,
                "parts": len(parts),
                "blob_bytes": len(data),
                "blob_sha256": digest,
                "expires_ms": int(expires_ms)
                if isinstance(expires_ms, numbers.Integral)
                else repr(expires_ms),
                "base64": base64.b64encode(part).decode("ascii"),
            }
            rows.append(
                {
                    "kind": KIND_STATE_QUARANTINE,
                    "route": key[0],
                    "bucket": int(key[1]),
                    "consumer_group": group,
                    "outcome": QUARANTINED,
                    "reason_code": STATE_UNREADABLE,
                    "reason": (
                        f"the schedule state of group {group!r} bucket {int(key[1])} could not be read ({what}); "
                        f"its retries and remembered msg ids were moved aside and the key started afresh. "
                        f"raw holds part {n} of {len(parts)} of its {name} blob ({len(data)} bytes, sha256 "
                        f"{digest}) in base64"
                    ),
                    "raw": json.dumps(raw, sort_keys=True),
                    "quarantined_at": quarantined_at,
                }
            )
    return pa.Table.from_pylist(rows, schema=WORK.arrow_schema)


def _blob(table: pa.Table, version: int, extra: dict[bytes, bytes] | None = None) -> bytes:
    metadata = {VERSION_KEY: str(version).encode(), ROWS_KEY: str(table.num_rows).encode(), **(extra or {})}
    return to_ipc(table.replace_schema_metadata(metadata))


def _read(blob: Any, name: str) -> pa.Table:
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise StateUnreadableError(f"the {name} blob is {type(blob).__name__}, expected bytes")
    try:
        table = from_ipc(bytes(blob))
        # Full validation checks offsets and UTF-8: a flipped byte must not reach compute kernels.
        table.validate(full=True)
    except Exception as exc:  # pyarrow raises several classes for bad bytes; all mean "unreadable"
        raise StateUnreadableError(
            f"the {name} blob ({len(blob)} bytes) is not a readable Arrow IPC stream"
        ) from exc
    metadata = table.schema.metadata or {}
    version = _version(metadata.get(VERSION_KEY), name)
    if version >= 2:
        expected = metadata.get(ROWS_KEY, b"")
        if not expected.isdigit() or int(expected) != table.num_rows:
            raise StateUnreadableError(
                f"the {name} blob holds {table.num_rows} rows, its metadata says {expected.decode(errors='replace')!r}: "
                "it was cut short"
            )
    return table


def _version(raw: bytes | None, name: str) -> int:
    if raw is None:
        return 1  # main before versioning wrote no metadata
    text = raw.decode(errors="replace")
    if not text.isdigit() or int(text) not in READABLE_VERSIONS:
        raise StateVersionError(
            f"the {name} blob has state layout version {text!r}; this release reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))} (a newer release wrote it?)"
        )
    return int(text)


def parked_rows(table: pa.Table, path: str) -> pa.Table:
    """The rows of a parked retries file (:mod:`retry_engine.core._parked`) with today's WORK schema;
    ``StateUnreadableError`` if they are not pending retries sorted by due time."""
    try:
        rows = _conform(table.replace_schema_metadata(None))
    except StateUnreadableError as exc:
        raise StateUnreadableError(f"the parked retries file {path}: {exc}") from exc
    due = due_ms(rows)  # what releases go by
    if len(due) > 1 and bool((due[1:] < due[:-1]).any()):
        raise StateUnreadableError(f"the parked retries file {path} is not sorted by due_at")
    return rows


def _conform(pending: pa.Table) -> pa.Table:
    """``pending`` with today's WORK schema: columns by name, missing optional ones null."""
    missing = [name for name in _REQUIRED_PENDING if name not in pending.schema.names]
    if missing:
        raise StateUnreadableError(
            f"the pending blob lacks the columns {missing}; its columns are {pending.schema.names}"
        )
    arrays = []
    for target in WORK.arrow_schema:
        if target.name not in pending.schema.names:
            arrays.append(pa.nulls(pending.num_rows, target.type))
            continue
        column = pending.column(target.name)
        try:
            arrays.append(column.cast(target.type, safe=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise StateUnreadableError(
                f"the pending blob's column {target.name} is {column.type}, which does not cast to {target.type}"
            ) from exc
    conformed = pa.Table.from_arrays(arrays, schema=WORK.arrow_schema)
    nulls = [name for name in _REQUIRED_PENDING if conformed.column(name).null_count]
    if nulls:
        raise StateUnreadableError(
            f"the pending blob has nulls in {nulls}, which every pending retry needs"
        )
    if (
        pending.num_rows
        and not pc.all(pc.equal(conformed.column("outcome"), RETRY_OUTCOME)).as_py()
    ):
        raise StateUnreadableError("the pending blob holds rows whose outcome is not retry")
    return conformed


__all__ = [
    "CHUNKS_KEY",
    "KIND_STATE_QUARANTINE",
    "QUARANTINE_PART_BYTES",
    "READABLE_VERSIONS",
    "SEALED_KEY",
    "STATE_SCHEMA",
    "STATE_UNREADABLE",
    "STATE_VERSION",
    "UNPARKED_VERSION",
    "KeyState",
    "decode",
    "encode",
    "parked_rows",
    "quarantine_rows",
]
