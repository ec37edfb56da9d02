"""The schedule stage's function without Spark: what it emits, keeps and when it asks to wake (R8, B1)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from retry_engine.config import parse_config
from retry_engine.core.packed import pack, unpack
from retry_engine.core.schedule import ScheduleStage
from tests.builders import T0, Result, work_rows

MINUTE_MS = 60_000


class HeldState:
    """Plays Spark's GroupState for one key: the value, the clock and the timeout asked for."""

    def __init__(self, now: dt.datetime) -> None:
        self.value: tuple[Any, ...] | None = None
        self.now_ms = int(now.timestamp() * 1000)
        self.timeout_ms: int | None = None

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[Any, ...]:
        assert self.value is not None
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def remove(self) -> None:
        self.value = None

    def getCurrentProcessingTimeMs(self) -> int:  # noqa: N802 (Spark's name)
        return self.now_ms

    def setTimeoutDuration(self, ms: int) -> None:  # noqa: N802 (Spark's name)
        self.timeout_ms = ms


def run(stage: ScheduleStage, key: tuple[str, int], inputs: list[pa.Table], state: HeldState) -> pd.DataFrame:
    """Packed in, as decide hands rows over; unpacked out."""
    frames = [pack(table).to_pandas() for table in inputs]
    out = [payload for frame in stage(key, iter(frames), state) for payload in frame["payload"]]
    return unpack(out).to_pandas(maps_as_pydicts="strict") if out else pd.DataFrame()


def test_r8_a_retry_due_in_an_hour_outlives_the_dedup_window_without_waking_every_batch() -> None:
    """R8, B1, #12 item 6: a pending retry keeps its msg id deduplicated past the dedup window,
    until it is released and for a window after; the key wakes only at the window's end and when due."""
    config = parse_config({"engine": {"message_delay_level": "1h"}})
    work = work_rows([Result.of("F").failed()], batch_ts=T0, config=config)
    (key,) = {(r, int(b)) for r, b in zip(work["route"].to_pylist(), work["bucket"].to_pylist(), strict=True)}
    stage = ScheduleStage(dedup_window_ms=10 * MINUTE_MS)
    state = HeldState(T0)
    first = run(stage, key, [work], state)
    assert list(first["outcome"]) == ["retry"] and state.exists
    assert state.timeout_ms == 10 * MINUTE_MS  # the dedup window ends before the retry is due

    # The window's timeout fires: nothing is due, so the next wake-up is the due time, not "now".
    state.now_ms += 11 * MINUTE_MS
    assert run(stage, key, [], state).empty
    assert state.timeout_ms == 49 * MINUTE_MS
    # The same consume result re-sent after the window but before the retry is released: its retry is
    # still pending, so it is a duplicate, not a second retry (#12 item 6; main scheduled it again).
    again = run(stage, key, [work], state)
    assert list(again["outcome"]) == ["duplicate"]
    assert state.timeout_ms == 49 * MINUTE_MS  # a duplicate opens no new window

    # Due: released once, never before.
    due_ms = int((T0 + dt.timedelta(hours=1)).timestamp() * 1000)
    state.now_ms = due_ms - 1
    assert run(stage, key, [], state).empty
    state.now_ms = due_ms + 1
    released = run(stage, key, [], state)
    assert list(released["kind"]) == ["delivery"] and list(released["output_msg_id"]) == list(first["output_msg_id"])
    # Released ids are remembered for a window after the release, then the key's state goes.
    assert state.timeout_ms == 10 * MINUTE_MS
    state.now_ms += 5 * MINUTE_MS
    assert list(run(stage, key, [work], state)["outcome"]) == ["duplicate"]
    state.now_ms = due_ms + 1 + 10 * MINUTE_MS
    assert run(stage, key, [], state).empty and not state.exists


def test_b1_a_repeated_consume_result_is_recorded_as_a_duplicate_and_schedules_nothing() -> None:
    config = parse_config({"engine": {"message_delay_level": "1h"}})
    failing = Result.of("F").failed()
    first = work_rows([failing], batch_ts=T0, config=config)
    # In one batch twice (a retried producer) and again in a later batch.
    twice = work_rows([failing.with_(result_id="again"), failing.with_(result_id="and again")], batch_ts=T0, config=config)
    (key,) = {(r, int(b)) for r, b in zip(first["route"].to_pylist(), first["bucket"].to_pylist(), strict=True)}
    stage = ScheduleStage(dedup_window_ms=10 * MINUTE_MS)
    state = HeldState(T0)
    out = run(stage, key, [first], state)
    assert list(out["outcome"]) == ["retry"]
    retry_id = out["output_msg_id"].iloc[0]
    state.now_ms += MINUTE_MS
    again = run(stage, key, [twice], state)
    assert list(again["outcome"]) == ["duplicate", "duplicate"]
    assert set(again["reason_code"]) == {"DUPLICATE"}
    assert again["reason"].iloc[0] == f"msg_id F of group G was already decided; its retry is {retry_id}"
    # Still one retry pending: released once when due.
    state.now_ms = int((T0 + dt.timedelta(hours=1)).timestamp() * 1000) + 1
    released = run(stage, key, [], state)
    assert list(released["kind"]) == ["delivery"] and list(released["output_msg_id"]) == [retry_id]


def test_b1_a_copy_of_a_failure_without_any_time_decided_buckets_later_is_a_duplicate() -> None:
    """B1: with no store, born or consumption time, decide once keyed the failure by its batch clock, so a
    copy decided a bucket later reached a key that knew nothing of the pending retry: a second retry
    (the engine's property test found it: 1 s buckets, the copy 0.98 s later)."""
    config = parse_config({"engine": {"message_delay_level": "2h", "state_bucket": "1s"}})
    undated = Result.of("U").failed(store_timestamp=None, born_timestamp=None, consumed_at=None)
    first = work_rows([undated], batch_ts=T0, config=config)
    later = work_rows([undated.with_(result_id="again")], batch_ts=T0 + dt.timedelta(hours=1), config=config)
    stage = ScheduleStage(dedup_window_ms=500)
    states: dict[tuple[str, int], HeldState] = {}
    outcomes = []
    for work, now in ((first, T0), (later, T0 + dt.timedelta(hours=1))):
        (key,) = {(r, int(b)) for r, b in zip(work["route"].to_pylist(), work["bucket"].to_pylist(), strict=True)}
        state = states.setdefault(key, HeldState(T0))
        state.now_ms = int(now.timestamp() * 1000)
        outcomes += list(run(stage, key, [work], state)["outcome"])
    # Still pending (due at T0 + 2h): the copy is a duplicate, whichever key its batch clock fell in.
    assert outcomes == ["retry", "duplicate"]
    assert len(states) == 1


def test_a_retrys_outcome_row_leaves_without_the_message_and_its_delivery_carries_it() -> None:
    """#14 part 5, R8/B1: the outcome rows of new retries and of duplicates go on with only the
    ledger's columns (the message waits in state and leaves with its delivery). Nothing written
    changes: the outcomes table's rows and the metrics' counts are those of the full rows. A dead
    letter keeps its message (the DLQ table needs it)."""
    from retry_engine.core.metrics import partial_counts
    from retry_engine.core.outputs import LEDGER_COLUMNS, route_to
    from retry_engine.schemas import OUTCOMES

    config = parse_config({"engine": {"message_delay_level": "1h"}, "groups": {"G": {"retry_max_times": 2}}})
    failing, exhausted = Result.of("F").failed(), Result.of("X").failed(reconsume_times=2)
    work = work_rows([failing, exhausted, failing.with_(result_id="again")], batch_ts=T0, config=config)
    stage = ScheduleStage(dedup_window_ms=10 * MINUTE_MS)
    states: dict[tuple[str, int], HeldState] = {}
    emitted = []
    for key in sorted({(r, int(b)) for r, b in zip(work["route"].to_pylist(), work["bucket"].to_pylist(), strict=True)}):
        mine = work.filter(pc.and_(pc.equal(work["route"], key[0]), pc.equal(work["bucket"], key[1])))
        states[key] = HeldState(T0)
        emitted.append(pa.Table.from_pandas(run(stage, key, [mine], states[key]), schema=work.schema))
    out = pa.concat_tables(emitted)
    by = {o: out.filter(pc.equal(out["outcome"], o)) for o in ("retry", "duplicate", "dead_letter")}
    assert {o: t.num_rows for o, t in by.items()} == {"retry": 1, "duplicate": 1, "dead_letter": 1}
    for outcome in ("retry", "duplicate"):
        (row,) = by[outcome].to_pylist()
        assert row["body"] is None and row["properties"] is None and row["attempts"] is None, outcome
        assert [c for c in out.schema.names if c not in LEDGER_COLUMNS and row[c] is not None] == [], outcome
    assert by["dead_letter"]["body"].to_pylist() == [b"body-X"]

    # What the stage emitted before: its input rows as they came (the repeat re-marked as a duplicate).
    before = pa.concat_tables([work.filter(pc.not_equal(work["result_id"], "again")), by["duplicate"]])

    def ledger(rows: pa.Table) -> list[dict[str, Any]]:
        return sorted(route_to(rows, OUTCOMES, 7).to_pylist(), key=lambda r: (r["result_id"], r["outcome"]))

    assert ledger(out) == ledger(before)
    assert partial_counts(out).sort_by("metric").equals(partial_counts(before).sort_by("metric"))

    # Due: the delivery carries the message in full.
    (key,) = {(r, int(b)) for r, b in zip(by["retry"]["route"].to_pylist(), by["retry"]["bucket"].to_pylist(), strict=True)}
    states[key].now_ms = int((T0 + dt.timedelta(hours=1)).timestamp() * 1000) + 1
    released = run(stage, key, [], states[key])
    assert list(released["kind"]) == ["delivery"] and list(released["body"]) == [b"body-F"]
    assert released["properties"].iloc[0] == {"color": "red"} and released["topic"].iloc[0] == "%RETRY%G"


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    seen=st.lists(st.sampled_from([f"m{i}" for i in range(12)]), unique=True),
    fresh=st.lists(st.one_of(st.none(), st.sampled_from([f"m{i}" for i in range(24)])), max_size=10),
    released=st.lists(st.one_of(st.none(), st.sampled_from([f"m{i}" for i in range(24)])), max_size=10),
)
def test_the_known_ids_grow_as_a_distinct_union_would_in_the_same_order(
    seen: list[str], fresh: list[str | None], released: list[str | None]
) -> None:
    """B1, #14 part 5: appending a batch's fresh ids (distinct, not yet known: what the stage takes
    as fresh) and the released ids a key lacks gives exactly ``_ids``' distinct union, order and all,
    so state values are byte for byte what they were; a lookup in ``_known`` (with repeats) answers
    as in the distinct set."""
    from retry_engine.core import schedule

    def ids_table(values: list[str | None]) -> pa.Table:
        return pa.table({"consumed_msg_id": pa.array(values, pa.string())})

    known = pa.array(seen, pa.string())
    first_fresh = [v for i, v in enumerate(fresh) if v not in seen and v not in fresh[:i]]  # as the stage filters
    assert schedule._with_new(known, ids_table(first_fresh)).equals(schedule._ids(known, ids_table(first_fresh)))
    assert schedule._with_released(known, ids_table(released)).equals(schedule._ids(known, ids_table(released)))
    probe = pa.array([*fresh, *released, "m99"], pa.string())
    pending = ids_table(released)
    assert pc.is_in(probe, value_set=schedule._known(known, pending)).equals(
        pc.is_in(probe, value_set=schedule._ids(known, pending))
    )


def _one_key(results: list[Result]) -> tuple[tuple[str, int], pa.Table]:
    config = parse_config({"engine": {"message_delay_level": "1h", "state_bucket": "1h"}})
    work = work_rows(results, batch_ts=T0, config=config)
    keys = {(r, int(b)) for r, b in zip(work["route"].to_pylist(), work["bucket"].to_pylist(), strict=True)}
    assert len(keys) == 1
    return keys.pop(), work


def _raw_payloads(stage: ScheduleStage, key: tuple[str, int], payloads: list[bytes], state: HeldState) -> list[pa.Table]:
    from retry_engine.delta._arrow_ipc import from_ipc

    frame = pd.DataFrame({"route": [key[0]] * len(payloads), "bucket": [key[1]] * len(payloads), "payload": payloads})
    return [from_ipc(p) for out in stage(key, iter([frame]), state) for p in out["payload"]]


def test_a_new_retrys_ledger_row_crosses_with_the_ledgers_columns_only() -> None:
    """#14 part 5: the outcome row of a new retry is sent on without the message and without the
    other columns' nulls; the writer's unpack gives them back (test_packed)."""
    from retry_engine.core.outputs import LEDGER_COLUMNS
    from retry_engine.core.packed import payload_chunks

    key, work = _one_key([Result.of(f"F{i}").failed() for i in range(3)])
    (out,) = _raw_payloads(ScheduleStage(dedup_window_ms=10 * MINUTE_MS), key, payload_chunks(work), HeldState(T0))
    assert out.num_rows == 3 and set(out.schema.names) <= LEDGER_COLUMNS
    assert "body" not in out.schema.names and "properties" not in out.schema.names


def test_rows_leave_in_source_order_whatever_order_their_payloads_arrive_in() -> None:
    """Replay: the stage's output order is a function of the rows, not of the shuffle's fetch order.
    Payloads of whole runs (as decide makes them) are put in order; interleaved ones are sorted."""
    from retry_engine.core.packed import payload_chunks

    key, work = _one_key([Result.of(f"F{i}").failed() for i in range(8)])
    want = work.column("consumed_msg_id").to_pylist()
    runs = [payload_chunks(work.slice(i, 2))[0] for i in range(0, 8, 2)]
    interleaved = [payload_chunks(work.take(pa.array(rows)))[0] for rows in ([1, 4, 6], [0, 3], [2, 5, 7])]
    for payloads in (runs[::-1], [runs[2], runs[0], runs[3], runs[1]], interleaved):
        out = _raw_payloads(ScheduleStage(dedup_window_ms=10 * MINUTE_MS), key, payloads, HeldState(T0))
        assert [i for t in out for i in t.column("consumed_msg_id").to_pylist()] == want
