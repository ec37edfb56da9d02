"""Hypothesis strategies: consume-result batches over the full value range of every column.

An *example* is a list of rows for one append to consume_results, plus
"late" copies appended by a second commit after the first one was decided.
Rows are plain Python values in their storage form, so that anything the
column types can hold is expressible:

* string columns hold ``bytes`` (or None): invalid UTF-8 is written as is,
  through an unchecked binary -> string cast (:func:`unchecked_strings`);
* timestamp columns hold int64 microseconds since the epoch (or None): the
  whole int64 range, far outside what ``datetime`` can represent;
* int32 columns hold anything from -2**31 to 2**31-1 (or None).

Ids (``result_id``, ``msg_id``, ``origin_msg_id``) are drawn from a small
pool per example, so duplicates within an example are common, and are
prefixed with a namespace when the example is written (:func:`arrow_table`),
so examples sharing one engine never see each other's ids. Null and empty
ids stay as they are: they name nothing, so they cannot collide.

Each row starts sane (a consume result RocketMQ could send) and a few of its
columns are replaced by hostile values; shrinking therefore moves towards
rows with one hostile column, which is what a counterexample should show.

The profiles: ``ci`` (the default: twelve examples from a fixed seed, no
shrinking), ``debug`` (the same examples, shrunk to a minimal failing one) and
``soak`` (hundreds, random seed, printed on failure; ``make soak-property``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from retry_engine.schemas import CONSUME_RESULTS

# -- profiles ---------------------------------------------------------------------

_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
# CI: a fixed seed and no shrinking, so a failing run ends in minutes (each shrink step of
# a stopped stream restarts the engine); "debug" replays the same examples and shrinks.
settings.register_profile(
    "ci",
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=_SLOW_IS_FINE,
)
settings.register_profile("debug", settings.get_profile("ci"), phases=list(Phase))
settings.register_profile(
    "soak",
    max_examples=300,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)

# -- column values --------------------------------------------------------------

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
US_PER_S = 1_000_000
# The anchor of sane timestamps: fixed, so examples replay exactly.
T0_US = int(dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC).timestamp()) * US_PER_S

# The engine config the property test runs with (see test_property_engine.py).
MAX_BODY_BYTES = 1024
GROUPS = ("G", "G2", "GN", "GD")
NON_RETRYABLE_CLASS = "java.lang.IllegalArgumentException"
NON_RETRYABLE_PATTERN = "(?i)poison"

INT32_COLUMNS = tuple(c.name for c in CONSUME_RESULTS.columns if c.type == pa.int32())
TS_COLUMNS = tuple(c.name for c in CONSUME_RESULTS.columns if pa.types.is_timestamp(c.type))
ID_COLUMNS = ("result_id", "msg_id", "origin_msg_id")

int32_edges = st.sampled_from([INT32_MIN, INT32_MIN + 1, -2, -1, 0, 1, 2, 3, 16, 17, 18, 19, INT32_MAX - 1, INT32_MAX])
hostile_int32 = st.one_of(st.none(), int32_edges, st.integers(INT32_MIN, INT32_MAX))

# Instants that sit on the edges: int64's, datetime's (years 1 and 9999), the epoch
# and the second before it (1969-12-31T23:59:58Z is #12 item 5's example).
ts_edges = st.sampled_from(
    [
        INT64_MIN, INT64_MIN + 1, INT64_MAX, INT64_MAX - 1,
        -62_135_596_800 * US_PER_S,  # 0001-01-01
        -62_135_596_800 * US_PER_S - 1,  # before datetime.min
        253_402_300_799 * US_PER_S + 999_999,  # 9999-12-31T23:59:59.999999
        253_402_300_800 * US_PER_S,  # 10000-01-01
        -2 * US_PER_S, -US_PER_S, -US_PER_S + 1, -1, 0, 1,
    ]
)
hostile_ts = st.one_of(st.none(), ts_edges, st.integers(INT64_MIN, INT64_MAX))
sane_ts = st.integers(-3600 * US_PER_S, 3600 * US_PER_S).map(lambda d: T0_US + d)

INVALID_UTF8 = [b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ok\xfe", b"\xc0\xaf"]
HOSTILE_NAMES = [
    "G\n", "G\r\n", " G", "G ", "../G", "a/../../b", "/abs", "%RETRY%G", "%DLQ%G", "G|x", "%", "|",
    "G\x00", "组", "G" * 256, "G" * 255, "consumer_group=x", "G%2F", "C:\\x", ".", "..",
]
# Text that is valid UTF-8 but far from what a form would send.
odd_text = st.text(
    st.characters(codec="utf-8", exclude_categories=()), max_size=40
).map(lambda s: s.encode("utf-8", "surrogatepass"))
hostile_bytes = st.one_of(
    st.none(),
    st.just(b""),
    st.sampled_from([b" ", b"\t\n ", b"\x00"]),
    st.sampled_from(INVALID_UTF8),
    st.binary(max_size=24),
    odd_text,
    st.sampled_from(HOSTILE_NAMES).map(str.encode),
    st.integers(1_000, 20_000).map(lambda n: b"x" * n),
)


def sampled_bytes(*values: str | None) -> st.SearchStrategy[bytes | None]:
    return st.sampled_from([v.encode() if v is not None else None for v in values])


# -- rows -------------------------------------------------------------------------


@dataclass(frozen=True)
class Ident:
    """An id value before namespacing: ``token`` from the example's pool, or a literal null / ''."""

    token: bytes | None

    def value(self, namespace: bytes) -> bytes | None:
        if not self.token:
            return self.token
        return namespace + self.token


def ident(pool: list[bytes]) -> st.SearchStrategy[Ident]:
    return st.one_of(st.sampled_from(pool).map(Ident), st.sampled_from([None, b""]).map(Ident))


def id_tokens() -> st.SearchStrategy[bytes]:
    """Id tokens, valid UTF-8 or not (namespacing keeps invalid ones invalid)."""
    return st.one_of(
        st.text("abcXYZ019-_", min_size=1, max_size=8).map(str.encode),
        st.sampled_from(INVALID_UTF8),
        st.binary(min_size=1, max_size=8),
        odd_text.filter(bool),
        st.just(b"\n"),
    )


def bodies() -> st.SearchStrategy[bytes | None]:
    limit = MAX_BODY_BYTES
    sizes = st.one_of(
        st.sampled_from([0, limit - 1, limit, limit + 1, 2 * limit, 1024 * 1024 + 1]),
        st.integers(0, 4 * limit),
    )
    # Content is a pattern, not drawn byte by byte: large draws would make Hypothesis slow.
    return st.one_of(st.none(), sizes.map(lambda n: bytes(i % 251 for i in range(n))))


def properties() -> st.SearchStrategy[list[tuple[bytes, bytes | None]] | None]:
    odd_keys = st.one_of(
        sampled_bytes("", " ", "REDRIVE_COUNT", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "color", "k" * 300),
        st.sampled_from(INVALID_UTF8),
        odd_text,
    )
    odd_values = st.one_of(
        st.none(),
        sampled_bytes("", "1", "-1", "0", "99999999999", "abc", "１", "1 ", "+1"),
        st.sampled_from(INVALID_UTF8),
        odd_text,
    )
    pairs = st.lists(st.tuples(odd_keys, odd_values), max_size=5)
    # Arrow maps allow repeated keys; a Java map would keep one of them.
    repeated = st.tuples(odd_keys, odd_values, odd_values).map(lambda t: [(t[0], t[1]), (t[0], t[2])])
    return st.one_of(st.none(), st.just([]), pairs, repeated)


def attempt() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "reconsume_times": hostile_int32,
            "consumer_group": st.one_of(sampled_bytes(*GROUPS), hostile_bytes),
            "consumer_id": hostile_bytes,
            "status": st.one_of(sampled_bytes("RECONSUME_LATER", "EXCEPTION"), hostile_bytes),
            "error_class": hostile_bytes,
            "error_message": hostile_bytes,
            "consumed_at": hostile_ts,
            "delay_level": hostile_int32,
        }
    )


def attempts() -> st.SearchStrategy[list[dict[str, Any] | None] | None]:
    return st.one_of(
        st.none(),
        st.just([]),
        st.lists(st.one_of(st.none(), attempt()), max_size=3),
        attempt().map(lambda a: [a] * 60),
    )


def hostile(column: str, pool: dict[str, list[bytes]]) -> st.SearchStrategy[Any]:
    """Values of ``column`` that its type can hold but a well-behaved consumer would not send."""
    if column in ID_COLUMNS:
        return st.one_of(ident(pool[column]), id_tokens().map(Ident), st.sampled_from([b" ", b"\n"]).map(Ident))
    if column == "body":
        return bodies()
    if column == "properties":
        return properties()
    if column == "attempts":
        return attempts()
    if column in INT32_COLUMNS:
        return hostile_int32
    if column in TS_COLUMNS:
        return hostile_ts
    extra = {
        "status": sampled_bytes("consume_success", "SUCCESS", "RECONSUME_LATER ", "UNKNOWN"),
        "message_model": sampled_bytes("clustering", "BROADCAST", "CLUSTERING\n"),
        "error_class": sampled_bytes(NON_RETRYABLE_CLASS),
        "error_message": st.integers(2_000, 6_000).map(lambda n: b"poison" * (n // 6)),
    }
    return st.one_of(hostile_bytes, extra[column]) if column in extra else hostile_bytes


@dataclass(frozen=True)
class Example:
    """One example: ``rows`` (appended in one commit), then ``late`` (a second commit).

    ``copy_of[i]`` is the index (into ``rows``) of the row that row i copies
    (itself when it is an original); late rows are all copies. A copy is the
    same consume result sent again: identical but for ``result_id``, which
    may be new.
    """

    rows: list[dict[str, Any]]
    copy_of: list[int]
    late: list[dict[str, Any]] = field(default_factory=list)
    late_copy_of: list[int] = field(default_factory=list)


def plain_row(result_id: bytes, msg_id: bytes, **values: Any) -> dict[str, Any]:
    """A first delivery of ``msg_id`` to group G that failed (RECONSUME_LATER), with ``values`` over it."""
    return {
        "result_id": Ident(result_id),
        "consumer_group": b"G",
        "consumer_id": b"c1@host",
        "message_model": b"CLUSTERING",
        "status": b"RECONSUME_LATER",
        "delay_level_when_next_consume": 0,
        "max_reconsume_times": -1,
        "error_class": b"java.lang.RuntimeException",
        "error_message": b"boom",
        "consumed_at": T0_US,
        "msg_id": Ident(msg_id),
        "topic": b"orders",
        "tags": b"TagA",
        "keys": b"k1 k2",
        "body": b"body",
        "flag": 7,
        "properties": [(b"color", b"red")],
        "born_timestamp": T0_US - 5 * US_PER_S,
        "born_host": b"10.0.0.1:5000",
        "store_timestamp": T0_US - 4 * US_PER_S,
        "queue_id": 1,
        "reconsume_times": 0,
        "origin_msg_id": Ident(None),
        "retry_topic": None,
        "attempts": None,
        **values,
    }


# A group whose only level is 15 s (configured by the property test).
SLOW_GROUP = "GL"
# Every path once, whatever the generator draws: a retry (its copy in the same commit and a
# late one, while it is pending), a dead letter (R5: level < 0), a quarantine (unknown
# status), an acknowledgement.
_FAILED = plain_row(b"r1", b"m1", consumer_group=SLOW_GROUP.encode())
EVERY_PATH = Example(
    rows=[
        _FAILED,
        plain_row(b"r2", b"m2", delay_level_when_next_consume=-1),
        plain_row(b"r3", b"m3", status=b"WHATEVER"),
        plain_row(b"r4", b"m4", status=b"CONSUME_SUCCESS", error_class=None, error_message=None),
        {**_FAILED, "result_id": Ident(b"r5")},
    ],
    copy_of=[0, 1, 2, 3, 0],
    late=[{**_FAILED, "result_id": Ident(b"r6")}],
    late_copy_of=[0],
)


# The counterexamples #12 names, pinned so every run tries them: a dead letter whose
# reconsume_times + 1 overflows int32 (item 1), and a retry of a message stored in the
# second before 1970, whose state bucket (floor of store time / 1 s) is -1 (item 5).
INT32_EDGE = Example(rows=[plain_row(b"r1", b"m1", reconsume_times=INT32_MAX)], copy_of=[0])
BEFORE_1970 = Example(rows=[plain_row(b"r1", b"m1", store_timestamp=-US_PER_S)], copy_of=[0])
# Found by this test (no #12 item): U+2028 in any string column ends up raw in delta-rs's
# commit stats (min/max), which the deltars source split as a line break.
LINE_SEPARATOR = Example(rows=[plain_row(b"r1", b"m1", error_message="a\u2028b".encode())], copy_of=[0])
PINNED = {
    "every_path": EVERY_PATH,
    "int32_edge": INT32_EDGE,
    "before_1970": BEFORE_1970,
    "line_separator": LINE_SEPARATOR,
}


@st.composite
def sane_row(draw: st.DrawFn, pool: dict[str, list[bytes]]) -> dict[str, Any]:
    """A consume result a RocketMQ consumer could send (failures, successes, ladders, DLQ requests)."""
    return {
        "result_id": Ident(draw(st.sampled_from(pool["result_id"]))),
        # Weighted towards retries: they are what the schedule stage and the copy rule act on.
        "consumer_group": draw(sampled_bytes("G", "G", "G", *GROUPS)),
        "consumer_id": b"c1@host",
        "message_model": draw(sampled_bytes("CLUSTERING", None, "CLUSTERING", None, "BROADCASTING")),
        "status": draw(sampled_bytes("RECONSUME_LATER", "EXCEPTION", None, "CONSUME_SUCCESS")),
        "delay_level_when_next_consume": draw(st.sampled_from([0, None, 1, 2, 3, -1])),
        "max_reconsume_times": draw(st.sampled_from([-1, None, -1, None, 0, 1, 3, 16])),
        "error_class": draw(sampled_bytes("java.lang.RuntimeException", None, NON_RETRYABLE_CLASS)),
        "error_message": draw(sampled_bytes("boom", None, "poison pill")),
        "consumed_at": draw(sane_ts),
        "msg_id": Ident(draw(st.sampled_from(pool["msg_id"]))),
        "topic": draw(sampled_bytes("orders", "t-1")),
        "tags": draw(sampled_bytes("TagA", None)),
        "keys": draw(sampled_bytes("k1 k2", None)),
        "body": draw(st.binary(max_size=16)),
        "flag": draw(st.integers(-2, 8)),
        "properties": draw(st.sampled_from([None, [(b"color", b"red")], [(b"REDRIVE_COUNT", b"1")]])),
        "born_timestamp": draw(st.one_of(st.none(), sane_ts)),
        "born_host": b"10.0.0.1:5000",
        "store_timestamp": draw(st.one_of(st.none(), sane_ts)),
        "queue_id": draw(st.integers(0, 7)),
        "reconsume_times": draw(st.one_of(st.sampled_from([None, 0, 1]), st.integers(0, 20))),
        "origin_msg_id": Ident(draw(st.one_of(st.none(), st.sampled_from(pool["origin_msg_id"])))),
        "retry_topic": draw(sampled_bytes(None, "orders")),
        "attempts": draw(st.sampled_from([None, []])),
    }


@st.composite
def row(draw: st.DrawFn, pool: dict[str, list[bytes]]) -> dict[str, Any]:
    """A sane row with up to three columns replaced by hostile values."""
    values = draw(sane_row(pool))
    for column in draw(st.sets(st.sampled_from(CONSUME_RESULTS.names), max_size=3)):
        values[column] = draw(hostile(column, pool))
    return values


@st.composite
def examples(draw: st.DrawFn, *, max_rows: int = 8) -> Example:
    pool = {
        column: draw(st.lists(id_tokens(), min_size=1, max_size=3, unique=True)) for column in ID_COLUMNS
    }
    originals = draw(st.lists(row(pool), min_size=1, max_size=max_rows))

    def copies(max_size: int) -> list[tuple[int, dict[str, Any]]]:
        picked = draw(st.lists(st.integers(0, len(originals) - 1), max_size=max_size))
        out = []
        for i in picked:
            fresh = draw(st.one_of(st.just(originals[i]["result_id"]), st.sampled_from(pool["result_id"]).map(Ident)))
            out.append((i, {**originals[i], "result_id": fresh}))
        return out

    now = copies(3)
    rows = [*originals, *(r for _, r in now)]
    copy_of = [*range(len(originals)), *(i for i, _ in now)]
    order = draw(st.permutations(range(len(rows))))
    late = copies(2)
    return Example(
        rows=[rows[k] for k in order],
        copy_of=[order.index(copy_of[k]) for k in order],
        late=[r for _, r in late],
        late_copy_of=[order.index(i) for i, _ in late],
    )


# -- to Arrow ---------------------------------------------------------------------


def unchecked_strings(values: list[bytes | None]) -> pa.Array:
    """A string array holding ``values`` byte for byte: no UTF-8 check (Parquet does none either)."""
    binary = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(binary), binary.buffers(), null_count=binary.null_count)


def _offsets(lists: list[list[Any] | None]) -> tuple[pa.Array, pa.Array]:
    offsets, total = [0], 0
    for items in lists:
        total += len(items or [])
        offsets.append(total)
    return pa.array(offsets, pa.int32()), pa.array([items is None for items in lists])


def _map_array(values: list[list[tuple[bytes, bytes | None]] | None], type_: pa.DataType) -> pa.Array:
    offsets, mask = _offsets(values)
    pairs = [pair for items in values for pair in items or []]
    keys = unchecked_strings([k for k, _ in pairs])
    items = unchecked_strings([v for _, v in pairs])
    return pa.MapArray.from_arrays(offsets, keys, items, type=type_, mask=mask)


def _list_of_attempts(values: list[list[dict[str, Any] | None] | None], type_: pa.ListType) -> pa.Array:
    offsets, mask = _offsets(values)
    flat = [a for items in values for a in items or []]
    struct_type = type_.value_type
    children = [
        _column([None if a is None else a[f.name] for a in flat], f.type) for f in struct_type
    ]
    structs = pa.StructArray.from_arrays(
        children, fields=list(struct_type), mask=pa.array([a is None for a in flat], pa.bool_())
    )
    return pa.ListArray.from_arrays(offsets, structs, type=type_, mask=mask)


def _column(values: list[Any], type_: pa.DataType) -> pa.Array:
    if type_ == pa.string():
        return unchecked_strings(values)
    if pa.types.is_timestamp(type_):
        return pa.array(values, pa.int64()).view(type_)
    if pa.types.is_map(type_):
        return _map_array(values, type_)
    if pa.types.is_list(type_):
        return _list_of_attempts(values, type_)
    return pa.array(values, type_)


def storage_rows(rows: list[dict[str, Any]], namespace: bytes) -> list[dict[str, Any]]:
    """``rows`` with their ids namespaced: what is written, column by column."""
    return [
        {name: (v.value(namespace) if isinstance(v, Ident) else v) for name, v in r.items()} for r in rows
    ]


def arrow_table(rows: list[dict[str, Any]], namespace: bytes) -> pa.Table:
    """``rows`` as a consume_results table, ids prefixed with ``namespace``."""
    stored = storage_rows(rows, namespace)
    schema = CONSUME_RESULTS.arrow_schema
    arrays = [_column([r[f.name] for r in stored], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def describe(values: dict[str, Any]) -> dict[str, Any]:
    """A row for a failure message: long values cut, so a 1 MiB body does not flood the log."""

    def short(v: Any) -> Any:
        if isinstance(v, bytes | str) and len(v) > 60:
            unit = "bytes" if isinstance(v, bytes) else "chars"
            return f"{v[:40]!r}...<{len(v)} {unit}>"
        if isinstance(v, list) and len(v) > 3:
            return [*map(short, v[:3]), f"...<{len(v)} items>"]
        if isinstance(v, list | tuple):
            return type(v)(map(short, v))
        if isinstance(v, dict):
            return {k: short(x) for k, x in v.items()}
        return v

    return {k: short(v) for k, v in values.items()}
