"""Where each consume result goes: RocketMQ's send-back rules, vectorised.

``decide`` turns one Arrow batch of consume results (as read, possibly with
loose types) into rows of the internal ``WORK`` schema: one *outcome* row per
input row, carrying for failures the retry or dead-letter message built by
RocketMQ's copy rules. It is a pure function of its input and the config, so
a replayed micro-batch decides exactly the same way (B1). No Spark here.

Any value a column can hold gets an outcome (SPEC, bad input): int32 edges,
times outside Python's years 1-9999 and invalid UTF-8 are quarantined with a
reason code, and :func:`decide_or_quarantine` (what :class:`Decider` calls)
quarantines, with its exception, any row whose decision still raises.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import logging
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from retry_engine.config import EngineConfig, GroupConfig, error_class_name
from retry_engine.core.delays import BackoffPolicy, next_level, schedule_queue_id
from retry_engine.core.names import (
    DLQ_GROUP_TOPIC_PREFIX,
    FIRST_MS,
    GROUP_MAX_LENGTH,
    LAST_MS,
    PROP_REDRIVE_COUNT,
    RETRY_GROUP_TOPIC_PREFIX,
    TOPIC_MAX_LENGTH,
    VALID_CHARACTERS,
    delivery_key,
    dlq_topic,
    parse_redrive_count,
    retry_topic,
)
from retry_engine.errors import SchemaMismatchError
from retry_engine.schemas import CONSUME_RESULTS, WORK

log = logging.getLogger(__name__)

Status = Literal["CONSUME_SUCCESS", "RECONSUME_LATER", "EXCEPTION"]
SUCCESS = "CONSUME_SUCCESS"
FAILURE_STATUSES = ("RECONSUME_LATER", "EXCEPTION")
CLUSTERING = "CLUSTERING"
BROADCASTING = "BROADCASTING"
MESSAGE_MODELS = (CLUSTERING, BROADCASTING)
# A consumer sends -1 to mean "use the group's retryMaxTimes" (R6).
MAX_RECONSUME_TIMES_DEFAULT = -1
ERROR_MESSAGE_LIMIT = 2000

# Input columns a consume-result table must have; the others may be absent (read as null).
REQUIRED_COLUMNS = ("consumer_group", "msg_id", "topic", "status")
POSITION = "_source_position"
BATCH_TS = "_batch_ts"

# Outcome and reason codes (stable; tests and dashboards match on them).
ACKNOWLEDGED = "acknowledged"
RETRY = "retry"
DEAD_LETTER = "dead_letter"
DROPPED = "dropped"
DUPLICATE = "duplicate"
QUARANTINED = "quarantined"
OUTCOMES = (ACKNOWLEDGED, RETRY, DEAD_LETTER, DROPPED, DUPLICATE, QUARANTINED)

KIND_OUTCOME = "outcome"
KIND_DELIVERY = "delivery"
# The bucket of rows that never touch the schedule stage's state (acknowledged, dropped,
# quarantined; a dead letter keeps its store-time bucket, where a duplicate meets it, B1). A real bucket is floor(store time in us / bucket in us) with a
# bucket of at least 1 ms, so it is above int64's minimum whatever the store time: before
# 1970 buckets are negative, and -1 is a real one (1969-12-31T23:59:59Z with 1 s buckets).
NO_STATE_BUCKET = -(2**63)
# The bucket of a failure with no time at all (no store, born or consumption time): one key
# per group, so every copy of it meets the first one's state (B1). The batch clock, its
# bucket before, put a copy decided in a later bucket's time in another key, which knew
# nothing of the first: a second retry (the engine's property test found it). Never a real
# bucket (see NO_STATE_BUCKET), and below every key the schedule stage splits by sub-key.
UNDATED_BUCKET = NO_STATE_BUCKET + 1

INT32_MAX = 2**31 - 1
# Python's datetime holds years 1 to 9999; Arrow's timestamp[us] holds about +-292,000 years.
# A time outside Python's range cannot be a real clock reading, and deciding it would raise.
_PY_MIN_US = FIRST_MS * 1000
_PY_MAX_US = (LAST_MS + 1) * 1000 - 1
# A quarantined row keeps this much of a body over engine.max_body_bytes in ``raw``, plus its size.
RAW_BODY_PREFIX_BYTES = 1024

# Java's Character.isWhitespace, which RocketMQ's UtilAll.isBlank applies to every char:
# Unicode space, line and paragraph separators except the no-break spaces (U+00A0, U+2007,
# U+202F), and the controls \t \n \v \f \r and U+001C-U+001F. Valid in re and in RE2.
JAVA_WHITESPACE = "\t\n\x0b\x0c\r\x1c-\x1f \u1680\u2000-\u2006\u2008-\u200a\u2028\u2029\u205f\u3000"
_BLANK = re.compile(f"[{JAVA_WHITESPACE}]*")
_BLANK_PATTERN = f"^[{JAVA_WHITESPACE}]*$"

_VALID_NAME_PATTERN = f"^[{VALID_CHARACTERS}]+\\z"  # RE2: \z = end of text, never before a newline


@dataclass(frozen=True)
class Decider:
    """The decision step, bound to one configuration."""

    config: EngineConfig
    _policies: dict[str, BackoffPolicy] = field(default_factory=dict, compare=False, repr=False)
    # The state keys' bucket width, when the checkpoint's differs from engine.state_bucket.
    state_bucket_ms: int | None = None

    @property
    def bucket_ms(self) -> int:
        return self.state_bucket_ms or self.config.state_bucket_ms

    def policy(self, group_name: str, group: GroupConfig) -> BackoffPolicy:
        if group_name not in self._policies:
            self._policies[group_name] = self.config.policy(group)
        return self._policies[group_name]

    def __call__(self, batch: pa.RecordBatch, *, in_order: bool = True) -> pa.RecordBatch:
        return decide_or_quarantine(batch, self, in_order=in_order)


def check_input_schema(schema: pa.Schema) -> None:
    """Fail at startup when the consume-result table lacks a required column."""
    missing = [name for name in REQUIRED_COLUMNS if name not in schema.names]
    if missing:
        raise SchemaMismatchError(
            f"consume-result table has no column {missing[0]!r} (required: {', '.join(REQUIRED_COLUMNS)}; "
            f"found: {', '.join(schema.names)})",
            code="CONSUME_RESULTS_COLUMN_MISSING",
        )


# -- step 1: types ------------------------------------------------------------


Problems = dict[int, list[tuple[str, str]]]


def _normalise(batch: pa.RecordBatch) -> tuple[dict[str, pa.Array], Problems]:
    """Cast every known column to its table type; collect per-row type problems."""
    n = batch.num_rows
    problems: Problems = defaultdict(list)
    out: dict[str, pa.Array] = {}
    for col in CONSUME_RESULTS.columns:
        if col.name not in batch.schema.names:
            out[col.name] = pa.nulls(n, col.type)
            continue
        array = batch.column(col.name)
        out[col.name], wrong = cast_column(array, col.type)
        for i in wrong:
            problems[i].append(
                ("WRONG_TYPE", f"column {col.name}: {_short(array[i].as_py())!r} is not a valid {col.type}")
            )
    for col in CONSUME_RESULTS.columns:
        out[col.name] = _valid_utf8(col.name, out[col.name], problems)
        out[col.name] = _python_times(col.name, out[col.name], problems)
    return out, problems


def cast_column(array: pa.Array, to: pa.DataType) -> tuple[pa.Array, list[int]]:
    """``array`` as type ``to``, as the engine reads a consume_results column: cast whole, else value by
    value. A value with no such form becomes null; returns the cast array and those values' rows. Text
    read as a time: without a zone it is UTC, and a time outside years 1-9999 is no time (Python, pandas
    and the readers' output cannot hold it)."""
    if array.type == to:
        return array, []
    casts = [to]
    zoneless = _zoneless(to)
    text_times = zoneless != to and _has_strings(array.type)
    if text_times:
        # Text without a zone is UTC (as a zoneless time column is): Arrow parses zoned text only into a
        # zoned time and zoneless text only into a zoneless one, whose values are UTC's. Also inside a
        # list of structs (an attempt's consumed_at).
        casts.append(zoneless)
    cast: pa.Array | None = None
    wrong: list[int] = []
    for kind in casts:
        try:
            cast = array.cast(kind, safe=True).cast(to)
            break
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            pass
    if cast is None:
        pieces: list[pa.Array] = []
        for i in range(len(array)):
            # A copy of the one value: a slice of a list keeps every row's child values, which a cast reads.
            one = pa.concat_arrays([array.slice(i, 1)])
            if one.null_count:  # null fits every type, even one Arrow has no cast to
                pieces.append(pa.nulls(1, to))
                continue
            for kind in casts:
                try:
                    pieces.append(one.cast(kind, safe=True).cast(to))
                    break
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                    pass
            else:
                pieces.append(pa.nulls(1, to))
                wrong.append(i)
        cast = pa.concat_arrays(pieces) if pieces else pa.array([], to)
    if text_times:
        # Text that reads as a time outside years 1-9999 (at any depth) is no time: Arrow holds it, Python
        # and the readers' output cannot (the check every consume result gets, _python_times).
        outside: Problems = defaultdict(list)
        cast = _python_times("", cast, outside)
        wrong = sorted({*wrong, *outside})
    return cast, wrong


def _zoneless(kind: pa.DataType) -> pa.DataType:
    """``kind`` with every time with a zone (at any depth of lists and structs) made zoneless."""
    if pa.types.is_timestamp(kind) and kind.tz is not None:
        return pa.timestamp(kind.unit)
    if pa.types.is_list(kind):
        return pa.list_(kind.value_field.with_type(_zoneless(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_zoneless(f.type)) for f in kind])
    return kind


def drifted_columns(found: pa.Schema, expected: pa.Schema, columns: Sequence[str]) -> list[str]:
    """Those of ``columns`` that a table's schema ``found`` holds with another type than ``expected``
    (a table another writer changed): they cannot prune by their statistics nor be compared as they
    are, only read and cast (:func:`cast_columns`)."""
    return [c for c in columns if c in found.names and c in expected.names and found.field(c).type != expected.field(c).type]


def cast_columns(rows: pa.Table, expected: pa.Schema, columns: Sequence[str]) -> pa.Table:
    """``rows`` with each of ``columns`` read as :func:`cast_column` reads it into ``expected``'s type."""
    for name in columns:
        if name in rows.schema.names:
            cast = cast_column(rows[name].combine_chunks(), expected.field(name).type)[0]
            rows = rows.set_column(rows.schema.get_field_index(name), expected.field(name), cast)
    return rows


def _valid_utf8(name: str, array: pa.Array, problems: Problems) -> pa.Array:
    """``array`` with every value that is not valid UTF-8 replaced, and its row flagged INVALID_UTF8.

    Parquet does not validate strings, and Python cannot decode such a value.
    A plain string keeps its text with the bad bytes escaped (``\\xff``), so
    the quarantine row's columns stay readable; a nested value becomes null.
    The row's ``raw`` keeps the exact bytes (:func:`_raw_json`).
    """
    if not _has_strings(array.type):
        return array
    try:
        array.validate(full=True)
        return array
    except pa.ArrowInvalid:
        pass
    plain = pa.types.is_string(array.type)
    raw = array.cast(pa.binary()) if plain else None
    values: list[Any] = []
    for i in range(len(array)):
        try:
            values.append(array.slice(i, 1).to_pylist()[0])
        except UnicodeDecodeError as exc:
            shown = raw[i].as_py() if raw is not None else exc.object
            values.append(shown.decode("utf-8", "backslashreplace") if plain else None)
            problems[i].append(("INVALID_UTF8", f"column {name}: {_short(shown)!r} is not valid UTF-8"))
    return pa.array(values, type=array.type)


def _has_strings(t: pa.DataType) -> bool:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return True
    if pa.types.is_map(t):
        return _has_strings(t.key_type) or _has_strings(t.item_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_strings(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_strings(f.type) for f in t)
    return False


def _python_times(name: str, array: pa.Array, problems: Problems) -> pa.Array:
    """``array`` with timestamps outside years 1-9999 nulled and their rows flagged TIMESTAMP_OUT_OF_RANGE.

    Covers top-level timestamp columns and the attempts' ``consumed_at``.
    """
    if pa.types.is_timestamp(array.type):
        micros = array.cast(pa.int64())
        rows = pa.array(np.arange(len(array), dtype=np.int64))
    elif pa.types.is_list(array.type) and pa.types.is_struct(array.type.value_type):
        struct = array.type.value_type
        fields = [f.name for f in struct if pa.types.is_timestamp(f.type)]
        if not fields or len(array) == 0:
            return array
        flat = pc.list_flatten(array)
        micros = pa.concat_arrays([pc.struct_field(flat, f).cast(pa.int64()) for f in fields])
        rows = pa.concat_arrays([pc.list_parent_indices(array)] * len(fields))
    else:
        return array
    outside = pc.fill_null(pc.or_(pc.less(micros, _PY_MIN_US), pc.greater(micros, _PY_MAX_US)), False)
    if not pc.any(outside).as_py():
        return array
    bad_values = micros.filter(outside).to_pylist()
    bad_rows = rows.filter(outside).to_pylist()
    flagged: set[int] = set()
    for row, value in zip(bad_rows, bad_values, strict=True):
        if row not in flagged:
            flagged.add(row)
            problems[row].append(
                (
                    "TIMESTAMP_OUT_OF_RANGE",
                    f"column {name}: {value} us since 1970 is outside years 1-9999 (no clock reads that)",
                )
            )
    mask = np.zeros(len(array), dtype=bool)
    mask[sorted(flagged)] = True
    return pc.if_else(pa.array(mask), pa.nulls(len(array), array.type), array)


# -- step 2: validation (vectorised) -----------------------------------------------


def _flag(problems: Problems, mask: pa.Array, code: str, reason: Any) -> None:
    for i in pc.indices_nonzero(pc.fill_null(mask, False)).to_pylist():
        problems[i].append((code, reason(i) if callable(reason) else reason))


def _validate(cols: dict[str, pa.Array], problems: Problems, config: EngineConfig) -> None:
    msg_id, group, topic = cols["msg_id"], cols["consumer_group"], cols["topic"]
    status, model = cols["status"], cols["message_model"]

    # Blank is RocketMQ's UtilAll.isBlank (blank_mask).
    _flag(problems, blank_mask(msg_id), "MISSING_MSG_ID", "msg_id is missing (null, empty or whitespace)")
    _flag(problems, blank_mask(group), "MISSING_GROUP", "consumer_group is missing (null, empty or whitespace)")
    _flag(problems, blank_mask(topic), "MISSING_TOPIC", "topic is missing (null, empty or whitespace)")

    def bad_name(a: pa.Array, max_length: int | pa.Array, present: pa.Array | None = None) -> pa.Array:
        """Names of ``a`` that are present (default: not blank) and break the rule."""
        present = pc.invert(blank_mask(a)) if present is None else present
        invalid = pc.or_kleene(
            pc.invert(pc.match_substring_regex(a, _VALID_NAME_PATTERN)),
            pc.greater(pc.utf8_length(a), max_length),
        )
        return pc.and_kleene(present, invalid)

    _flag(
        problems,
        bad_name(group, GROUP_MAX_LENGTH),
        "INVALID_GROUP_NAME",
        lambda i: f"consumer_group {_short(group[i].as_py())!r} must match [{VALID_CHARACTERS}]{{1,{GROUP_MAX_LENGTH}}}",
    )
    # A group named like a retry or dead-letter topic: its retries would go to %RETRY%%RETRY%x, which no
    # consumer of this package can subscribe (Consumer refuses such a group), so they were delivered to nobody.
    _flag(
        problems,
        pc.or_kleene(pc.starts_with(group, RETRY_GROUP_TOPIC_PREFIX), pc.starts_with(group, DLQ_GROUP_TOPIC_PREFIX)),
        "INVALID_GROUP_NAME",
        lambda i: f"consumer_group {_short(group[i].as_py())!r} may not start with {RETRY_GROUP_TOPIC_PREFIX} or "
        f"{DLQ_GROUP_TOPIC_PREFIX}: it names a group's retry or dead-letter topic",
    )
    # A delivery of %RETRY%G (R3) is as long as its group allows: a group of 200 characters had one retry,
    # and the failure of that retry was quarantined (its topic over a topic's limit).
    retried = pc.fill_null(pc.starts_with(topic, RETRY_GROUP_TOPIC_PREFIX), False)
    retry_limit = len(RETRY_GROUP_TOPIC_PREFIX) + GROUP_MAX_LENGTH
    _flag(
        problems,
        bad_name(topic, pc.if_else(retried, retry_limit, TOPIC_MAX_LENGTH + len("%RETRY%"))),
        "INVALID_TOPIC_NAME",
        lambda i: f"topic {_short(topic[i].as_py())!r} must match [{VALID_CHARACTERS}]"
        f"{{1,{retry_limit if retried[i].as_py() else TOPIC_MAX_LENGTH}}}",
    )
    # The original topic (R3) is a topic name too: the retry and the dead letter carry it, a re-drive
    # writes to it. Checked like topic, null or empty excepted (they mean topic: _or); only spaces are
    # no name (they would be carried on, as RocketMQ reads the property as it is).
    original = cols["retry_topic"]
    given = pc.invert(pc.or_kleene(pc.is_null(original), pc.equal(original, "")))
    # A consumer that left it empty on a delivery of %RETRY%G had that topic carried as the original one.
    original_retried = pc.fill_null(pc.starts_with(original, RETRY_GROUP_TOPIC_PREFIX), False)
    _flag(
        problems,
        bad_name(original, pc.if_else(original_retried, retry_limit, TOPIC_MAX_LENGTH + len("%RETRY%")), given),
        "INVALID_TOPIC_NAME",
        lambda i: f"retry_topic {_short(original[i].as_py())!r} must match [{VALID_CHARACTERS}]"
        f"{{1,{retry_limit if original_retried[i].as_py() else TOPIC_MAX_LENGTH}}}",
    )
    _flag(
        problems,
        pc.invert(pc.or_kleene(pc.is_null(status), pc.is_in(status, pa.array([SUCCESS, *FAILURE_STATUSES])))),
        "UNKNOWN_STATUS",
        lambda i: f"status {_short(status[i].as_py())!r} is not one of {SUCCESS}, {', '.join(FAILURE_STATUSES)} or null",
    )
    _flag(
        problems,
        pc.invert(pc.or_kleene(pc.is_null(model), pc.is_in(model, pa.array(MESSAGE_MODELS)))),
        "UNKNOWN_MESSAGE_MODEL",
        lambda i: f"message_model {_short(model[i].as_py())!r} is not one of {', '.join(MESSAGE_MODELS)} or null",
    )
    limit = config.engine.max_body_bytes
    sizes = pc.binary_length(cols["body"])
    _flag(
        problems,
        pc.greater(sizes, limit),
        "BODY_TOO_LARGE",
        lambda i: f"body is {sizes[i].as_py()} bytes; the limit (engine.max_body_bytes) is {limit}",
    )
    reconsume = cols["reconsume_times"]
    _flag(
        problems,
        pc.less(reconsume, 0),
        "INVALID_RECONSUME_TIMES",
        lambda i: f"reconsume_times {reconsume[i].as_py()} is negative",
    )
    # The retry or dead letter carries reconsume_times + 1 (R7); at the int32 maximum that
    # value does not exist. No real consumer gets there (the DLQ takes it at 16 by default).
    _flag(
        problems,
        pc.equal(reconsume, INT32_MAX),
        "RECONSUME_TIMES_OVERFLOW",
        lambda i: f"reconsume_times {INT32_MAX} is the int32 maximum: the next message would need "
        f"reconsume_times {INT32_MAX + 1} (R7), which the column cannot hold",
    )
    max_times = cols["max_reconsume_times"]
    _flag(
        problems,
        pc.less(max_times, MAX_RECONSUME_TIMES_DEFAULT),
        "INVALID_MAX_RECONSUME_TIMES",
        lambda i: f"max_reconsume_times {max_times[i].as_py()} is below -1 (-1 or null = group default)",
    )


def is_blank(value: str | None) -> bool:
    """RocketMQ's ``UtilAll.isBlank``: null, empty, or only Java whitespace."""
    return value is None or _BLANK.fullmatch(value) is not None


def blank_mask(values: pa.Array) -> pa.Array:
    """:func:`is_blank` of every value of a string array (never null)."""
    return pc.or_kleene(pc.is_null(values), pc.match_substring_regex(values, _BLANK_PATTERN))


# -- step 3: decisions ---------------------------------------------------------------


def new_msg_id(group: str, consumed_msg_id: str, target: str) -> str:
    """Deterministic id of the retry or dead letter a failure produces.

    RocketMQ mints a fresh id; ours is derived from (group, consumed id, target)
    so a replayed batch or a duplicated result yields the same id (B1).
    """
    digest = hashlib.sha1(f"{group}\0{consumed_msg_id}\0{target}".encode()).hexdigest()
    return digest[:32].upper()


# Hex digit -> its value, by ASCII code (lowercase, as hexdigest writes them).
_HEX_VALUES: Final = np.zeros(256, dtype=np.int64)
_HEX_VALUES[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16)
_SHA1_HEX: Final = 40


def new_msg_ids(groups: pa.Array, consumed: pa.Array, targets: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """:func:`new_msg_id` of each row (none null), and the int of each id's first 8 hex digits.

    Per row only the SHA-1 itself runs in Python: the input text is joined, and the
    digests cut, upper-cased and read, column-wise (half the loop's time at 100% failures).
    """
    if len(consumed) == 0:
        return pa.array([], pa.string()), np.zeros(0, dtype=np.int64)
    inputs = pc.binary_join_element_wise(groups, consumed, targets, "\0").cast(pa.binary())
    sha1 = hashlib.sha1
    digests = pa.array([sha1(value).hexdigest() for value in inputs.to_pylist()], pa.string())
    chars = np.frombuffer(digests.buffers()[2], dtype=np.uint8, count=_SHA1_HEX * len(digests))
    heads = (_HEX_VALUES[chars.reshape(-1, _SHA1_HEX)[:, :8]] << np.arange(28, -1, -4)).sum(axis=1)
    return pc.utf8_upper(pc.utf8_slice_codeunits(digests, 0, 32)), heads


def _matches_non_retryable(group: GroupConfig, error_class: str | None, error_message: str | None) -> str | None:
    rules = group.non_retryable
    if error_class and error_class_name(error_class) in rules.error_classes:
        return f"error class {error_class!r} is listed as non-retryable"
    for pattern in rules.error_patterns:
        for text in (error_class, error_message):
            if text and re.search(pattern, text):
                return f"error {_short(text)!r} matches non-retryable pattern {pattern!r}"
    return None


def decide(
    batch: pa.RecordBatch, decider: Decider, *, columnwise: bool = True, in_order: bool = True
) -> pa.RecordBatch:
    """Decide every row of ``batch``; see the module docstring.

    ``batch`` must carry ``_source_position`` (string) and ``_batch_ts``
    (timestamp) besides the consume-result columns. Acknowledgements and plain
    failures are decided column-wise; everything else (and, with
    ``columnwise=False``, every failure) row by row in :func:`_decide_valid`,
    the reference the column-wise path is tested against.

    ``in_order=False`` leaves the rows grouped by how they were decided
    (acknowledgements, then column-wise failures, then the rest; each group in
    input order), for a caller that splits them anyway: putting them back in
    input order was a take of every column, and the engine's decide task
    undid it at once, separating rows without state (#15 goal 2).
    """
    config = decider.config
    n = batch.num_rows
    cols, problems = _normalise(batch)
    _validate(cols, problems, config)
    batch_ts: dt.datetime = batch.column(BATCH_TS)[0].as_py() if n else _EPOCH
    if batch_ts is not None and batch_ts.tzinfo is None:
        batch_ts = batch_ts.replace(tzinfo=dt.UTC)

    # Acknowledgements are most of the traffic: build their rows column-wise.
    valid_mask = np.ones(n, dtype=bool)
    valid_mask[list(problems)] = False
    valid = pa.array(valid_mask)
    is_ack = pc.and_kleene(valid, pc.fill_null(pc.equal(cols["status"], SUCCESS), False))
    pieces = [(pc.indices_nonzero(is_ack), _ack_rows(cols, batch.column(POSITION), is_ack, batch_ts))]
    rest = pc.invert(is_ack)
    if columnwise and batch_ts is not None:
        # A failure storm is when the engine must keep up (#14 part 5): plain failures column-wise too.
        candidates = pc.and_(
            pc.and_(rest, valid),
            pc.and_(pc.is_valid(batch.column(POSITION)), pc.invert(pc.fill_null(pc.equal(cols["message_model"], BROADCASTING), False))),
        )
        plan = _plan_failures(cols, candidates, batch_ts, decider)
        if plan is not None:
            pieces.append((plan.rows, _failure_rows(cols, batch.column(POSITION), plan, batch_ts, decider)))
            taken = np.zeros(n, dtype=bool)
            taken[plan.rows.to_numpy()] = True
            rest = pc.and_(rest, pa.array(~taken))
    slow = pc.indices_nonzero(rest)
    if len(slow):
        pieces.append((slow, _row_by_row(batch, cols, problems, slow, batch_ts, decider)))
    pieces = [(order, rows) for order, rows in pieces if len(order)]
    if not in_order and len(pieces) > 1:
        return pa.concat_batches([rows for _, rows in pieces])
    return _in_input_order(pieces, n)


def _in_input_order(pieces: list[tuple[pa.Array, pa.RecordBatch]], n: int) -> pa.RecordBatch:
    """The rows of ``pieces`` (each: the input rows it decided, and their outcomes) in input order."""
    if not pieces:
        return pa.RecordBatch.from_pylist([], schema=WORK.arrow_schema)
    if len(pieces) == 1:
        return pieces[0][1]
    # Back to input order, so the output reads like the input.
    order = pa.concat_arrays([indices for indices, _ in pieces])
    merged = pa.Table.from_batches([rows for _, rows in pieces]).combine_chunks()
    return merged.take(pc.sort_indices(order)).to_batches()[0]


def _row_by_row(
    batch: pa.RecordBatch, cols: dict[str, pa.Array], problems: Problems, slow: pa.Array, batch_ts: dt.datetime,
    decider: Decider,
) -> pa.RecordBatch:
    """Outcome rows of the input rows ``slow``, decided one by one; the message columns are then taken column-wise."""
    config = decider.config
    slow_rows = slow.to_pylist()
    py = {name: cols[name].take(slow).to_pylist() for name in _DECISION_INPUTS}
    attempts = cols["attempts"].take(slow).to_pylist()
    py["redrive_count"] = _redrive_counts(cols["properties"].take(slow)).tolist()
    buckets = _buckets(cols, slow, decider).tolist()
    positions = batch.column(POSITION).take(slow).to_pylist()
    rows: list[dict[str, Any]] = []
    for j, i in enumerate(slow_rows):
        base = {
            "kind": KIND_OUTCOME,
            "result_id": py["result_id"][j] or f"pos:{positions[j]}",
            "source_position": positions[j],
            "decided_at": batch_ts,
            "consumer_group": py["consumer_group"][j],
            "retry_topic": py["retry_topic"][j] or py["topic"][j],
            "consumed_msg_id": py["msg_id"][j],
            "consumed_origin_msg_id": py["origin_msg_id"][j],
            "consumed_reconsume_times": py["reconsume_times"][j],
            "route": py["consumer_group"][j] or "",
            "bucket": NO_STATE_BUCKET,
        }
        if i in problems:
            row = _quarantine(base, problems[i])
        else:
            row = _decide_valid(base, py, j, attempts[j], buckets[j], batch_ts, decider)
        if row["outcome"] == QUARANTINED:
            row["raw"] = _raw_json(batch, i, body_limit=config.engine.max_body_bytes)
        rows.append(row)
    decided = pa.RecordBatch.from_pylist(rows, schema=_COMPUTED_SCHEMA)
    return _with_copied(decided, cols, slow)


def _with_copied(computed: pa.RecordBatch, cols: dict[str, pa.Array], rows: pa.Array) -> pa.RecordBatch:
    """``computed`` (in ``_COMPUTED_SCHEMA``) plus the columns copied unchanged from input ``rows`` (R7): a WORK batch."""
    copied = {name: cols[name].take(rows) for name in _COPIED}
    return pa.RecordBatch.from_arrays(
        [computed.column(f.name) if f.name in _COMPUTED_SCHEMA.names else copied[f.name] for f in WORK.arrow_schema],
        schema=WORK.arrow_schema,
    )


def _buckets(cols: dict[str, pa.Array], rows: pa.Array, decider: Decider) -> np.ndarray:
    """The state key's bucket of each of ``rows``: when the consumed message was stored (R8 keys by store time).

    Without a store time, its born or consumption time (the same in every copy of
    a row); without any, :data:`UNDATED_BUCKET`.
    """
    store_us = pc.coalesce(
        cols["store_timestamp"].take(rows),
        cols["born_timestamp"].take(rows),
        cols["consumed_at"].take(rows),
    ).cast(pa.int64())
    # Floor, not Arrow's truncating divide: a store time before 1970 belongs to the bucket
    # that starts before it, like any other (NO_STATE_BUCKET is below every real bucket).
    timed = pc.fill_null(store_us, 0).to_numpy()
    buckets: np.ndarray = np.floor_divide(timed, decider.bucket_ms * 1000)
    if store_us.null_count:
        buckets[pc.is_null(store_us).to_numpy(zero_copy_only=False)] = UNDATED_BUCKET
    return buckets


@dataclass(frozen=True)
class _FailurePlan:
    """The decisions of plain failures, column-wise: one entry per row in every array (see :func:`_plan_failures`)."""

    rows: pa.Array  # their indices in the input
    names: list[str]  # the distinct groups, which ``codes`` index
    queue_nums: np.ndarray  # each group's retry_queue_nums (1 for a group the plan has no rows of)
    codes: np.ndarray
    reconsume: np.ndarray  # null read as 0
    requested: np.ndarray  # delay_level_when_next_consume, null read as 0
    max_times: np.ndarray  # -1 and null read as the group's retry_max_times
    dead: np.ndarray
    level: np.ndarray  # of a retry (0 for a dead letter)
    due_us: np.ndarray  # of a retry, microseconds since 1970
    non_retryable: dict[int, str]  # row -> the B3 rule it matched

    def only(self, keep: np.ndarray) -> _FailurePlan:
        renumbered = np.cumsum(keep) - 1
        return _FailurePlan(
            self.rows.filter(pa.array(keep)), self.names, self.queue_nums, self.codes[keep], self.reconsume[keep],
            self.requested[keep], self.max_times[keep], self.dead[keep], self.level[keep], self.due_us[keep],
            {int(renumbered[j]): reason for j, reason in self.non_retryable.items() if keep[j]},
        )


def _plan_failures(
    cols: dict[str, pa.Array], candidates: pa.Array, batch_ts: dt.datetime, decider: Decider
) -> _FailurePlan | None:
    """The plain failures among ``candidates`` and their decisions, column-wise; None when there are none.

    The same decisions as :func:`_decide_valid` (a property test holds the two
    to each other), for the failures that need nothing unusual: valid, not
    BROADCASTING, of a group that exists and retries, with a level and due
    time that fit their columns. The rest stay with the row path. Per-row
    Python is left only where the work is per row anyway: a group's
    non-retryable rules here, the SHA-1 of the new id and the reasons of dead
    letters in :func:`_failure_rows`.
    """
    rows = pc.indices_nonzero(candidates)
    if len(rows) == 0:
        return None
    encoded = pc.dictionary_encode(cols["consumer_group"].take(rows))
    names: list[str] = encoded.dictionary.to_pylist()
    codes = encoded.indices.to_numpy().astype(np.int64)
    # Per distinct group: its config and policy, or None when its rows stay with the row path.
    plain = [_plain_group(name, decider) for name in names]
    keep = np.array([p is not None for p in plain])[codes]
    if not keep.any():
        return None

    def ints(name: str, null: int) -> np.ndarray:
        values: np.ndarray = pc.fill_null(cols[name].take(rows), null).to_numpy().astype(np.int64)
        return values

    reconsume, requested = ints("reconsume_times", 0), ints("delay_level_when_next_consume", 0)
    given_max = ints("max_reconsume_times", MAX_RECONSUME_TIMES_DEFAULT)
    group_max = np.array([p[0].retry_max_times if p else 0 for p in plain])
    max_times = np.where(given_max == MAX_RECONSUME_TIMES_DEFAULT, group_max[codes], given_max)
    # B3: a group's non-retryable rules are Python regexes; only its own rows pay for them.
    non_retryable: dict[int, str] = {}
    ruled = np.array([bool(p and (p[0].non_retryable.error_classes or p[0].non_retryable.error_patterns)) for p in plain])
    if ruled.any():
        classes, messages = cols["error_class"].take(rows).to_pylist(), cols["error_message"].take(rows).to_pylist()
        for j in np.flatnonzero(ruled[codes]).tolist():
            group = plain[codes[j]]
            assert group is not None
            matched = _matches_non_retryable(group[0], classes[j], messages[j])
            if matched is not None:
                non_retryable[j] = matched
    dead = (requested < 0) | (reconsume >= max_times)
    dead[list(non_retryable)] = True
    first_level = np.array([p[1].first_level if p else 0 for p in plain])
    wanted = np.where(requested > 0, requested, first_level[codes] + reconsume)

    # Level, delay and due time per distinct (group, wanted level): the policies stay Python.
    retry = keep & ~dead
    level = np.zeros(len(codes), dtype=np.int64)
    due_us = np.zeros(len(codes), dtype=np.int64)
    if retry.any():
        at = np.flatnonzero(retry)
        # One int64 per pair: a code is below 2^31 and a wanted level below 2^32 (both terms are int32).
        pairs, inverse = np.unique((codes[at] << 32) | wanted[at], return_inverse=True)
        pair_level, pair_due, pair_fits = [], [], []
        for pair in pairs.tolist():
            code, want = pair >> 32, pair & 0xFFFFFFFF
            group = plain[code]
            assert group is not None
            policy = group[1]
            lvl = policy.clamp(want)
            try:
                due_us_of_pair = (batch_ts + dt.timedelta(milliseconds=policy.delay_ms(lvl)) - _EPOCH) // _MICROSECOND
            except OverflowError:  # the row path quarantines it (DUE_AT_OUT_OF_RANGE)
                lvl, due_us_of_pair = 0, 0
            pair_level.append(lvl)
            pair_due.append(due_us_of_pair)
            pair_fits.append(1 <= lvl <= INT32_MAX)
        inverse = inverse.reshape(-1)
        level[at] = np.array(pair_level, dtype=np.int64)[inverse]
        due_us[at] = np.array(pair_due, dtype=np.int64)[inverse]
        keep[at] &= np.array(pair_fits)[inverse]
    if not keep.any():
        return None
    queue_nums = np.array([p[0].retry_queue_nums if p else 1 for p in plain])
    plan = _FailurePlan(
        rows, names, queue_nums, codes, reconsume, requested, max_times, dead, level, due_us, non_retryable
    )
    return plan if keep.all() else plan.only(keep)


def _plain_group(name: str, decider: Decider) -> tuple[GroupConfig, BackoffPolicy] | None:
    """Group ``name``'s config and policy when its failures can be decided column-wise, else None.

    That needs a group that exists and retries (R10); a config past the column
    types (only possible unvalidated) stays with the row path too.
    """
    group = decider.config.group(name)
    if group is None or not 0 < group.retry_queue_nums <= INT32_MAX:
        return None
    policy = decider.policy(name, group)
    return (group, policy) if policy.first_level <= INT32_MAX else None


def _failure_rows(
    cols: dict[str, pa.Array], positions: pa.Array, plan: _FailurePlan, batch_ts: dt.datetime, decider: Decider
) -> pa.RecordBatch:
    """The outcome rows (retries and dead letters) of ``plan``'s failures, in its order."""
    rows, names, codes, dead, level = plan.rows, plan.names, plan.codes, plan.dead, plan.level
    reconsume, requested, max_times, non_retryable = plan.reconsume, plan.requested, plan.max_times, plan.non_retryable
    m = len(rows)

    def col(name: str) -> pa.Array:
        return cols[name].take(rows)

    group_col, msg_id = col("consumer_group"), col("msg_id")
    pos = positions.take(rows).cast(pa.string())
    result_id = _result_ids(col("result_id"), pos)
    origin_in = col("origin_msg_id")
    origin = pc.if_else(blank_mask(origin_in), msg_id, origin_in)
    next_times = reconsume + 1
    redrive = _redrive_counts(col("properties"))
    key = pc.binary_join_element_wise(origin, pa.array(next_times).cast(pa.string()), ":")
    if (redrive > 0).any():
        key = pc.if_else(pa.array(redrive > 0), pc.binary_join_element_wise(key, pa.array(redrive).cast(pa.string()), ":r"), key)

    # The new message's id (new_msg_id) and, for a retry, its queue: int(id[:8], 16) % retry_queue_nums.
    targets = pc.if_else(pa.array(dead), pa.scalar("dlq"), pa.scalar("retry"))
    out_id, heads = new_msg_ids(pa.array(names, pa.string()).take(pa.array(codes)), msg_id, targets)
    queue_id = np.where(dead, 0, heads % plan.queue_nums[codes])

    error_message = _truncated(col("error_message"))
    level_arr = pa.array(level, pa.int32(), mask=dead)
    ts_type = WORK["decided_at"].type
    at_batch = pa.array(np.full(m, (batch_ts - _EPOCH) // _MICROSECOND, dtype=np.int64)).cast(ts_type)
    nulls_ts = pa.nulls(m, ts_type)
    dead_pa, retry_pa = pa.array(dead), pa.array(~dead)
    attempt_type = WORK["attempts"].type
    attempt = pa.StructArray.from_arrays(
        [
            pa.array(reconsume, pa.int32()), group_col, col("consumer_id"), col("status"), col("error_class"),
            error_message, col("consumed_at"), level_arr,
        ],
        fields=list(attempt_type.value_type),
    )
    codes_pa = pa.array(codes)
    reason_code: list[str | None] = [None] * m
    reason: list[str | None] = [None] * m
    for j in np.flatnonzero(dead).tolist():
        if j in non_retryable:
            reason_code[j], reason[j] = "NON_RETRYABLE", non_retryable[j]
        elif requested[j] < 0:
            reason_code[j], reason[j] = "DLQ_REQUESTED", f"consumer asked for delay level {requested[j]} (< 0 = DLQ, R5)"
        else:
            reason_code[j] = "MAX_RECONSUME_TIMES"
            reason[j] = f"reconsume_times {reconsume[j]} reached max_reconsume_times {max_times[j]} (R6)"
    values: dict[str, pa.Array] = {
        "kind": pa.repeat(pa.scalar(KIND_OUTCOME, pa.string()), m),
        "route": group_col,
        "bucket": pa.array(_buckets(cols, rows, decider), pa.int64()),
        "msg_id": out_id,
        "topic": pc.if_else(
            dead_pa,
            pa.array([dlq_topic(name) for name in names], pa.string()).take(codes_pa),
            pa.array([retry_topic(name) for name in names], pa.string()).take(codes_pa),
        ),
        "store_timestamp": pc.if_else(dead_pa, at_batch, nulls_ts),
        "queue_id": pa.array(queue_id, pa.int32()),
        "reconsume_times": pa.array(next_times, pa.int32()),
        "origin_msg_id": origin,
        "retry_topic": _or(col("retry_topic"), col("topic")),
        "attempts": _appended(col("attempts"), attempt),
        "consumer_group": group_col,
        "delay_level": level_arr,
        "schedule_queue_id": pa.array(level - 1, pa.int32(), mask=dead),
        "scheduled_at": pc.if_else(retry_pa, at_batch, nulls_ts),
        "due_at": pa.array(plan.due_us, pa.int64(), mask=dead).cast(ts_type),
        "error_class": col("error_class"),
        "error_message": error_message,
        "delivery_key": key,
        "source_result_id": result_id,
        "dead_lettered_at": pc.if_else(dead_pa, at_batch, nulls_ts),
        "reason_code": pa.array(reason_code, pa.string()),
        "reason": pa.array(reason, pa.string()),
        "result_id": result_id,
        "source_position": pos,
        "outcome": pc.if_else(dead_pa, DEAD_LETTER, RETRY),
        "output_msg_id": out_id,
        "decided_at": at_batch,
        "consumed_msg_id": msg_id,
        "consumed_origin_msg_id": origin_in,
        "consumed_reconsume_times": col("reconsume_times"),
    }
    computed = pa.RecordBatch.from_arrays(
        [values[f.name] if f.name in values else pa.nulls(m, f.type) for f in _COMPUTED_SCHEMA],
        schema=_COMPUTED_SCHEMA,
    )
    return _with_copied(computed, cols, rows)


_MICROSECOND = dt.timedelta(microseconds=1)


def _or(values: pa.Array, fallback: pa.Array) -> pa.Array:
    """``values`` with every null or ``""`` replaced by ``fallback``'s: the row path's ``value or fallback``."""
    return pc.if_else(pc.or_kleene(pc.is_null(values), pc.equal(values, "")), fallback, values)


def _result_ids(result_id: pa.Array, positions: pa.Array) -> pa.Array:
    """A row's ``result_id``, or ``pos:<source position>`` where it has none (the row path's fallback)."""
    return _or(result_id, pc.binary_join_element_wise("pos:", positions, ""))


def _truncated(messages: pa.Array) -> pa.Array:
    """:func:`truncate_error` of every value, column-wise."""
    long = pc.fill_null(pc.greater(pc.utf8_length(messages), ERROR_MESSAGE_LIMIT), False)
    if not pc.any(long).as_py():
        return messages
    cut = pc.binary_join_element_wise(pc.utf8_slice_codeunits(messages, 0, ERROR_MESSAGE_LIMIT - 3), "...", "")
    return pc.if_else(long, cut, messages)


def _appended(lists: pa.Array, items: pa.Array) -> pa.Array:
    """Each list of ``lists`` (a null one read as empty) with the same row of ``items`` appended."""
    m = len(lists)
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy().astype(np.int64)
    offsets = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(lengths + 1, out=offsets[1:])
    old = pc.list_flatten(lists)
    # Old item k of row p moves up by p (one new item per earlier row); row i's new item ends its list.
    take = np.empty(offsets[-1], dtype=np.int64)
    take[np.arange(len(old)) + np.repeat(np.arange(m), lengths)] = np.arange(len(old))
    take[offsets[1:] - 1] = len(old) + np.arange(m)
    flat = pa.concat_arrays([old, items]).take(pa.array(take))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat, type=lists.type)


def _redrive_counts(properties: pa.Array) -> np.ndarray:
    """The ``REDRIVE_COUNT`` property of each message (:func:`~retry_engine.core.names.parse_redrive_count`);
    only messages that have one are parsed (re-driven ones: few)."""
    values = pc.map_lookup(properties, PROP_REDRIVE_COUNT, "first")
    counts = np.zeros(len(values), dtype=np.int64)
    present = np.flatnonzero(values.is_valid().to_numpy(zero_copy_only=False))
    for i, value in zip(present.tolist(), values.take(pa.array(present)).to_pylist(), strict=True):
        counts[i] = parse_redrive_count(value)
    return counts


def _ack_rows(
    cols: dict[str, pa.Array], positions: pa.Array, mask: pa.Array, batch_ts: dt.datetime
) -> pa.RecordBatch:
    """Outcome rows for successfully consumed messages (R1), built without a Python loop.

    A null or empty ``result_id``/``retry_topic`` falls back as on the failure paths.
    """
    n = pc.sum(mask).as_py() or 0
    group = cols["consumer_group"].filter(mask)
    pos = positions.filter(mask).cast(pa.string())
    values: dict[str, pa.Array] = {
        "kind": pa.repeat(pa.scalar(KIND_OUTCOME, pa.string()), n),
        "route": group,
        "bucket": pa.repeat(pa.scalar(NO_STATE_BUCKET, pa.int64()), n),
        "result_id": _result_ids(cols["result_id"].filter(mask), pos),
        "source_position": pos,
        # Constant columns by pa.repeat: a list of n datetimes cost ~30 ms per 125k rows.
        "decided_at": pa.repeat(pa.scalar(batch_ts, WORK["decided_at"].type), n),
        "consumer_group": group,
        "retry_topic": _or(cols["retry_topic"].filter(mask), cols["topic"].filter(mask)),
        "consumed_msg_id": cols["msg_id"].filter(mask),
        "consumed_origin_msg_id": cols["origin_msg_id"].filter(mask),
        "consumed_reconsume_times": cols["reconsume_times"].filter(mask),
        "outcome": pa.repeat(pa.scalar(ACKNOWLEDGED, pa.string()), n),
    }
    arrays = [values[f.name] if f.name in values else pa.nulls(n, f.type) for f in WORK.arrow_schema]
    return pa.RecordBatch.from_arrays(arrays, schema=WORK.arrow_schema)


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_DECISION_INPUTS = (
    "result_id",
    "consumer_group",
    "consumer_id",
    "message_model",
    "status",
    "delay_level_when_next_consume",
    "max_reconsume_times",
    "error_class",
    "error_message",
    "consumed_at",
    "msg_id",
    "topic",
    "reconsume_times",
    "origin_msg_id",
    "retry_topic",
)
# Copied unchanged from the consumed message to its retry or dead letter (R7).
_COPIED = ("tags", "keys", "body", "flag", "properties", "born_timestamp", "born_host")
_COMPUTED_SCHEMA = pa.schema([f for f in WORK.arrow_schema if f.name not in _COPIED])


def _quarantine(base: dict[str, Any], problems: list[tuple[str, str]]) -> dict[str, Any]:
    """A quarantine outcome for the first problem's code, with every problem's reason (``raw`` is added by the caller)."""
    code = problems[0][0]
    return {
        **base,
        "outcome": QUARANTINED,
        "reason_code": code,
        "reason": "; ".join(reason for _, reason in problems),
        "quarantined_at": base["decided_at"],
        "msg_id": base["consumed_msg_id"],
    }


def _decide_valid(
    base: dict[str, Any],
    py: dict[str, list[Any]],
    j: int,
    attempts: list[dict[str, Any]] | None,
    bucket: int,
    batch_ts: dt.datetime,
    decider: Decider,
) -> dict[str, Any]:
    config = decider.config
    status = py["status"][j]
    group_name: str = py["consumer_group"][j]
    if status == SUCCESS:
        return {**base, "outcome": ACKNOWLEDGED}
    # R2: only CLUSTERING is retried; a BROADCASTING failure is dropped, but recorded.
    if py["message_model"][j] == BROADCASTING:
        return {
            **base,
            "outcome": DROPPED,
            "reason_code": "BROADCASTING_NOT_RETRIED",
            "reason": "broadcasting consumption is not retried (R2)",
        }
    group = config.group(group_name)
    if group is None:
        return _quarantine(
            base,
            [
                (
                    "SUBSCRIPTION_GROUP_NOT_EXIST",
                    f"subscription group {group_name!r} does not exist and engine.auto_create_groups is off",
                )
            ],
        )
    if group.retry_queue_nums <= 0:
        return {
            **base,
            "outcome": DROPPED,
            "reason_code": "RETRY_DISABLED",
            "reason": f"group {group_name!r} has retry_queue_nums={group.retry_queue_nums} (R10)",
        }

    reconsume = py["reconsume_times"][j] or 0
    requested = py["delay_level_when_next_consume"][j] or 0
    max_times = py["max_reconsume_times"][j]
    if max_times is None or max_times == MAX_RECONSUME_TIMES_DEFAULT:
        max_times = group.retry_max_times
    dead_reason = _matches_non_retryable(group, py["error_class"][j], py["error_message"][j])
    if dead_reason is not None:
        dead_code = "NON_RETRYABLE"
    elif requested < 0:
        dead_code, dead_reason = "DLQ_REQUESTED", f"consumer asked for delay level {requested} (< 0 = DLQ, R5)"
    elif reconsume >= max_times:
        dead_code = "MAX_RECONSUME_TIMES"
        dead_reason = f"reconsume_times {reconsume} reached max_reconsume_times {max_times} (R6)"
    else:
        dead_code = None

    consumed_msg_id: str = py["msg_id"][j]
    # UtilAll.isBlank: a whitespace-only origin id is no id; the consumed message is the first delivery.
    origin = consumed_msg_id if is_blank(py["origin_msg_id"][j]) else py["origin_msg_id"][j]
    level = None if dead_code else next_level(decider.policy(group_name, group), requested=requested, reconsume_times=reconsume)
    attempt = {
        "reconsume_times": reconsume,
        "consumer_group": group_name,
        "consumer_id": py["consumer_id"][j],
        "status": status,
        "error_class": py["error_class"][j],
        "error_message": truncate_error(py["error_message"][j]),
        "consumed_at": py["consumed_at"][j],
        "delay_level": level,
    }
    message = {"attempts": [*(attempts or []), attempt]}
    common = {
        **base,
        **message,
        "origin_msg_id": origin,
        "reconsume_times": reconsume + 1,
        "delivery_key": delivery_key(origin, reconsume + 1, py["redrive_count"][j]),
        "source_result_id": base["result_id"],
        "error_class": py["error_class"][j],
        "error_message": truncate_error(py["error_message"][j]),
        "bucket": bucket,
    }
    if dead_code is not None:
        out_id = new_msg_id(group_name, consumed_msg_id, "dlq")
        return {
            **common,
            "outcome": DEAD_LETTER,
            "reason_code": dead_code,
            "reason": dead_reason,
            "msg_id": out_id,
            "output_msg_id": out_id,
            "topic": dlq_topic(group_name),
            "queue_id": 0,
            "store_timestamp": batch_ts,
            "dead_lettered_at": batch_ts,
        }
    assert level is not None
    delay = decider.policy(group_name, group).delay_ms(level)
    try:
        due_at = batch_ts + dt.timedelta(milliseconds=delay)
    except OverflowError:
        # Only a configured delay of thousands of years gets here; such a retry could never be delivered.
        return _quarantine(
            base,
            [
                (
                    "DUE_AT_OUT_OF_RANGE",
                    f"delay level {level} of group {group_name!r} waits {delay} ms: due after year 9999; "
                    "fix the group's backoff",
                )
            ],
        )
    out_id = new_msg_id(group_name, consumed_msg_id, "retry")
    return {
        **common,
        "outcome": RETRY,
        "msg_id": out_id,
        "output_msg_id": out_id,
        "topic": retry_topic(group_name),
        "queue_id": int(out_id[:8], 16) % group.retry_queue_nums,
        "delay_level": level,
        "schedule_queue_id": schedule_queue_id(level),
        "scheduled_at": batch_ts,
        "due_at": due_at,
    }


def truncate_error(text: str | None) -> str | None:
    """An error message cut to ``ERROR_MESSAGE_LIMIT`` characters (consumers and the engine agree)."""
    if text is None or len(text) <= ERROR_MESSAGE_LIMIT:
        return text
    return text[: ERROR_MESSAGE_LIMIT - 3] + "..."


def _short(value: Any, limit: int = 80) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "..."
    return value


def _raw_json(batch: pa.RecordBatch, i: int, *, body_limit: int) -> str:
    """Row ``i`` of ``batch`` as JSON, exactly as read, for the quarantine table.

    Binary values are base64 (``{"base64": ...}``); one over ``body_limit`` bytes
    keeps only its first :data:`RAW_BODY_PREFIX_BYTES` and its size, so a huge
    body is not copied into the quarantine. Values Python cannot represent keep
    their exact content: invalid UTF-8 as ``{"invalid_utf8_base64": ...}``, a
    time outside years 1-9999 as ``{"unrepresentable": <int>, "type": ...}``.
    """
    row = {
        name: _raw_value(column[i], body_limit)
        for name, column in zip(batch.schema.names, batch.columns, strict=True)
        if name != BATCH_TS
    }
    return json.dumps(row, default=_json_default, sort_keys=True)


def _raw_value(scalar: pa.Scalar, body_limit: int) -> Any:
    if not scalar.is_valid:
        return None
    t = scalar.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        data = scalar.as_buffer()
        if data.size > body_limit:
            prefix = data[:RAW_BODY_PREFIX_BYTES].to_pybytes()
            return {"base64": base64.b64encode(prefix).decode(), "size": data.size, "truncated": True}
        return {"base64": base64.b64encode(data.to_pybytes()).decode()}
    try:
        return scalar.as_py()
    except Exception as exc:  # raw is the record of a bad row: it must hold whatever the row holds
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return {"invalid_utf8_base64": base64.b64encode(scalar.as_buffer().to_pybytes()).decode()}
        if pa.types.is_struct(t):
            return {f.name: _raw_value(scalar[f.name], body_limit) for f in t}
        if pa.types.is_map(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            return [_raw_value(v, body_limit) for v in scalar.values]
        if pa.types.is_temporal(t):
            micros = pa.array([scalar]).view(_int_view(t)).cast(pa.int64())[0].as_py()
            return {"unrepresentable": micros, "type": str(t)}
        return {"unreadable": f"{type(exc).__name__}: {_printable(str(exc))}", "type": str(t)}


def _int_view(t: pa.DataType) -> pa.DataType:
    """The integer type with ``t``'s storage (temporal types are 32 or 64-bit integers)."""
    return pa.int32() if t.bit_width == 32 else pa.int64()


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return str(value)


# -- the general rule: no row stops the stream ----------------------------------------


def decide_or_quarantine(
    batch: pa.RecordBatch, decider: Decider, *, columnwise: bool = True, in_order: bool = True
) -> pa.RecordBatch:
    """:func:`decide`, except that rows whose decision raises are quarantined (DECIDE_FAILED).

    When deciding ``batch`` raises anything, its halves are decided apart, down
    to single rows; a row that still raises on its own gets a quarantine outcome
    naming the exception's class and message, and every other row its normal
    decision, in input order. A row is never lost and never stops the stream.

    Replay: :func:`decide` is deterministic, so a replayed batch splits the
    same way and quarantines the same rows. ``columnwise``, ``in_order``: see
    :func:`decide` (a batch decided apart is in input order either way).
    """
    try:
        return decide(batch, decider, columnwise=columnwise, in_order=in_order)
    except Exception as exc:  # the bad-input rule: whatever it is, find the rows that raise
        log.warning(
            "deciding %d rows raised %s: %s; deciding them apart to quarantine the rows that raise",
            batch.num_rows, type(exc).__name__, exc,
        )
        return pa.concat_batches(_decide_apart(batch, decider, exc, columnwise))


def _decide_apart(batch: pa.RecordBatch, decider: Decider, exc: Exception, columnwise: bool) -> list[pa.RecordBatch]:
    """The decisions of ``batch``, whose deciding raised ``exc``, bisected down to the rows that raise."""
    if batch.num_rows == 1:
        return [_failed_row(batch, exc, decider.config)]
    half = batch.num_rows // 2
    out: list[pa.RecordBatch] = []
    for part in (batch.slice(0, half), batch.slice(half)):
        try:
            out.append(decide(part, decider, columnwise=columnwise))
        except Exception as part_exc:  # narrowed down further, then quarantined
            out.extend(_decide_apart(part, decider, part_exc, columnwise))
    return out


def _failed_row(batch: pa.RecordBatch, exc: Exception, config: EngineConfig) -> pa.RecordBatch:
    """The DECIDE_FAILED quarantine outcome of the one row of ``batch``, from what can be read of it."""

    def value(name: str, kind: type) -> Any:
        if name not in batch.schema.names:
            return None
        try:
            v = batch.column(name)[0].as_py()
        except (UnicodeDecodeError, OverflowError, ValueError):
            return None
        return v if isinstance(v, kind) else None

    def text(name: str) -> str | None:
        v: str | None = value(name, str)
        return None if v is None else _printable(v)

    decided_at = value(BATCH_TS, dt.datetime) or _EPOCH
    if decided_at.tzinfo is None:
        decided_at = decided_at.replace(tzinfo=dt.UTC)
    group, msg_id, position = text("consumer_group"), text("msg_id"), text(POSITION)
    reconsume = value("reconsume_times", int)
    reason = truncate_error(_printable(f"deciding this row raised {type(exc).__name__}: {exc}"))
    log.warning(
        "group %s msg_id %s (source position %s) quarantined: DECIDE_FAILED: %s", group, msg_id, position, reason
    )
    row = {
        "kind": KIND_OUTCOME,
        "route": group or "",
        "bucket": NO_STATE_BUCKET,
        "result_id": text("result_id") or f"pos:{position}",
        "source_position": position,
        "decided_at": decided_at,
        "consumer_group": group,
        "retry_topic": text("retry_topic") or text("topic"),
        "consumed_msg_id": msg_id,
        "consumed_origin_msg_id": text("origin_msg_id"),
        "consumed_reconsume_times": reconsume if reconsume is not None and -(2**31) <= reconsume <= INT32_MAX else None,
        "outcome": QUARANTINED,
        "reason_code": "DECIDE_FAILED",
        "reason": reason,
        "raw": _raw_json(batch, 0, body_limit=config.engine.max_body_bytes),
        "quarantined_at": decided_at,
        "msg_id": msg_id,
    }
    return pa.RecordBatch.from_pylist([row], schema=WORK.arrow_schema)


def _printable(text: str) -> str:
    """``text`` as valid UTF-8 (lone surrogates escaped), so Arrow can store it."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


__all__: Sequence[str] = (
    "Decider",
    "blank_mask",
    "check_input_schema",
    "decide",
    "decide_or_quarantine",
    "is_blank",
    "new_msg_id",
    "new_msg_ids",
)
