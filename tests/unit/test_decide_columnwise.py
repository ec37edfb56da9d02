"""The column-wise failure path decides exactly as the row-by-row reference (#14 part 5).

``decide`` builds plain failures' retries and dead letters column-wise; the
row path (:func:`~retry_engine.core.decide._decide_valid`, what
``columnwise=False`` uses for every failure) is the reference, the rules of
R2-R7, R10, R14 and B3 as first written. Hypothesis draws batches over the
full value range of every column (tests/strategies.py), groups that take
every branch (non-retryable rules, retry disabled, unknown with
auto-creation off, exponential backoff, a delay past year 9999, a huge
first level) and batch times near the end of Python's calendar, and the two
paths must agree on every column of every row, in order.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import retry_engine.core.decide as decide_module
from retry_engine.config import parse_config
from retry_engine.core.decide import BATCH_TS, POSITION, Decider, decide, decide_or_quarantine
from retry_engine.schemas import WORK
from tests import strategies
from tests.strategies import US_PER_S, Ident

GROUPS: dict[str, Any] = {
    "G": {},
    "G2": {"retry_max_times": 2, "retry_queue_nums": 3},
    "GN": {
        "non_retryable": {
            "error_classes": [strategies.NON_RETRYABLE_CLASS],
            "error_patterns": [strategies.NON_RETRYABLE_PATTERN],
        }
    },
    "GD": {"retry_queue_nums": 0},
    "GQ": {"retry_queue_nums": 7},
    "GE": {"backoff": {"policy": "exponential", "initial": "1s", "multiplier": 2.0, "max": "1h"}},
    # Its one level waits longer than any calendar: the row path quarantines it (DUE_AT_OUT_OF_RANGE).
    "GH": {"backoff": {"levels": "1s 99999999999d"}},
    "GF": {"backoff": {"first_level": 10**12}},
}
EXTRA_GROUPS = ["GQ", "GE", "GH", "GF", "ghost"]
# Years 9999 and 2026: near the end, a 30 s delay is past datetime's range.
LATE = dt.datetime(9999, 12, 31, 23, 59, 50, tzinfo=dt.UTC)
BATCH_TIMES = [dt.datetime(2026, 11, 22, 12, 0, 2, tzinfo=dt.UTC), LATE]

long_text = st.integers(1_990, 2_010).flatmap(
    lambda n: st.sampled_from(["é", "ab", "💥", "x"]).map(lambda c: (c * n).encode())
)


@st.composite
def failure_row(draw: st.DrawFn, pool: dict[str, list[bytes]]) -> dict[str, Any]:
    """A row of tests/strategies.py, often moved to this test's groups and given history, properties, long errors."""
    values: dict[str, Any] = draw(strategies.row(pool))
    if draw(st.booleans()):
        values["consumer_group"] = draw(st.sampled_from([*GROUPS, *EXTRA_GROUPS])).encode()
    if draw(st.booleans()):
        values["status"] = draw(strategies.sampled_bytes("RECONSUME_LATER", "EXCEPTION", None))
    if draw(st.booleans()):
        values["attempts"] = draw(strategies.attempts())
    if draw(st.booleans()):
        values["properties"] = draw(strategies.properties())
    if draw(st.booleans()):
        values["error_message"] = draw(st.one_of(long_text, strategies.sampled_bytes("poison", "ok", "")))
    if draw(st.booleans()):
        values["delay_level_when_next_consume"] = draw(st.integers(-3, 40))
    if draw(st.booleans()):
        values["reconsume_times"] = draw(st.sampled_from([0, 1, 2, 15, 16, 17, 2**31 - 2]))
    if draw(st.booleans()):
        values["result_id"] = Ident(draw(st.sampled_from([None, b""])))
    return values


@st.composite
def batches(draw: st.DrawFn) -> tuple[pa.RecordBatch, bool]:
    pool = {column: draw(st.lists(strategies.id_tokens(), min_size=1, max_size=3, unique=True))
            for column in strategies.ID_COLUMNS}
    rows = draw(st.lists(failure_row(pool), min_size=1, max_size=12))
    table = strategies.arrow_table(rows, b"ns-")
    n = table.num_rows
    batch_ts = draw(st.sampled_from(BATCH_TIMES))
    table = table.append_column(POSITION, pa.array([f"0:{i}" for i in range(n)])).append_column(
        BATCH_TS, pa.array([batch_ts] * n, pa.timestamp("us", tz="UTC"))
    )
    return table.combine_chunks().to_batches()[0], draw(st.booleans())


def deciders() -> dict[bool, Decider]:
    engine = {"message_delay_level": "1s 5s 10s 30s", "max_body_bytes": strategies.MAX_BODY_BYTES}
    return {
        auto: Decider(parse_config({"engine": {**engine, "auto_create_groups": auto}, "groups": GROUPS}))
        for auto in (True, False)
    }


DECIDERS = deciders()


def assert_same(batch: pa.RecordBatch, decider: Decider) -> pa.RecordBatch:
    """The column-wise and the row-by-row decisions of ``batch``, column by column and row by row."""
    fast = decide_or_quarantine(batch, decider)
    reference = decide_or_quarantine(batch, decider, columnwise=False)
    assert fast.schema == reference.schema == WORK.arrow_schema
    for name in WORK.names:
        got, want = fast.column(name).to_pylist(), reference.column(name).to_pylist()
        if got != want:
            bad = next(i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w)
            pytest.fail(f"column {name}, row {bad}: column-wise {got[bad]!r}, row by row {want[bad]!r}")
    assert fast.equals(reference)
    return fast


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(drawn=batches())
def test_columnwise_failures_decide_exactly_as_the_row_path(drawn: tuple[pa.RecordBatch, bool]) -> None:
    """R2-R7, R10, R14, B3 and the bad-input rule: every drawn batch gets the same outcome rows both ways."""
    batch, auto_create = drawn
    assert_same(batch, DECIDERS[auto_create])


def plain_failures(n: int, **overrides: Any) -> pa.RecordBatch:
    rows = [
        strategies.plain_row(f"r{i}".encode(), f"m{i}".encode(), **{
            "consumer_group": [b"G", b"G2", b"GN", b"GE"][i % 4],
            "reconsume_times": i % 20,
            "attempts": [] if i % 3 else None,
            "properties": [(b"REDRIVE_COUNT", b"2")] if i % 5 == 0 else None,
            "error_message": b"poison" if i % 7 == 0 else b"boom",
            **overrides,
        })
        for i in range(n)
    ]
    table = strategies.arrow_table(rows, b"")
    return table.append_column(POSITION, pa.array([f"0:{i}" for i in range(n)])).append_column(
        BATCH_TS, pa.array([BATCH_TIMES[0]] * n, pa.timestamp("us", tz="UTC"))
    ).combine_chunks().to_batches()[0]


def test_a_storm_of_plain_failures_never_takes_the_row_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """#14 part 5: retries and dead letters of existing groups are built without deciding a row on its own."""
    batch = plain_failures(400)
    reference = decide(batch, DECIDERS[True], columnwise=False)

    def row_path(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a plain failure was decided row by row")

    monkeypatch.setattr(decide_module, "_decide_valid", row_path)
    fast = decide(batch, DECIDERS[True])
    assert fast.equals(reference)
    outcomes = set(fast.column("outcome").to_pylist())
    reasons = set(fast.column("reason_code").to_pylist())
    assert outcomes == {"retry", "dead_letter"}, outcomes
    assert {"NON_RETRYABLE", "MAX_RECONSUME_TIMES"} <= reasons, reasons


def test_what_the_columns_cannot_hold_still_takes_the_row_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A due time past year 9999 and a first level past int32 are left to the row path (the column-wise
    builder is switched off here, so the rows can only be decided there), which decides them as before."""
    late = plain_failures(6, consumer_group=b"GH", delay_level_when_next_consume=2)
    huge_first = plain_failures(6, consumer_group=b"GF", reconsume_times=3)
    expected = {id(late): decide(late, DECIDERS[True]), id(huge_first): decide(huge_first, DECIDERS[True])}

    def columnwise(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("decided column-wise")

    monkeypatch.setattr(decide_module, "_failure_rows", columnwise)
    for batch in (late, huge_first):
        assert decide(batch, DECIDERS[True]).equals(expected[id(batch)])
    assert {r["reason_code"] for r in expected[id(late)].to_pylist()} == {"DUE_AT_OUT_OF_RANGE"}
    # first_level 10^12 + 3 is clamped to the top level (R5): a plain retry after all.
    retried = expected[id(huge_first)].to_pylist()
    assert {r["outcome"] for r in retried} == {"retry"} and {r["delay_level"] for r in retried} == {4}


def test_long_histories_keep_every_attempt_in_order() -> None:
    """R7: the new attempt is appended after the consumed message's own, whatever their number (0 to 4 here)."""
    def earlier(k: int) -> dict[str, Any]:
        return {"reconsume_times": 100 + k, "consumer_group": b"G", "consumer_id": b"c", "status": b"EXCEPTION",
                "error_class": None, "error_message": b"e", "consumed_at": k * US_PER_S, "delay_level": k}

    histories = [[earlier(k) for k in range(n)] or None for n in range(5)]
    batch = plain_failures(5)
    batch = batch.set_column(
        batch.schema.get_field_index("attempts"), "attempts",
        strategies.arrow_table([{**strategies.plain_row(b"r", b"m"), "attempts": h} for h in histories], b"")
        .column("attempts").combine_chunks(),
    )
    rows = assert_same(batch, DECIDERS[True]).to_pylist()
    assert [len(r["attempts"]) for r in rows] == [1, 2, 3, 4, 5]
    for i, row in enumerate(rows):
        # The history as it was, then this failure (its reconsume_times is i, plain_failures' i % 20).
        assert [a["reconsume_times"] for a in row["attempts"]] == [*range(100, 100 + i), i]
