"""The schedule stage's state value: versions it reads, and what it does with one it cannot read (#12 items 3, 13).

Spark-free: the stage function is driven with :class:`HeldState`, a plain
container for one key's state value and clock (not a model of Spark's
behaviour); the real engine run is in tests/integration/test_schedule_state.py.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from retry_engine.config import parse_config
from retry_engine.core._schedule_state import (
    QUARANTINE_PART_BYTES,
    STATE_SCHEMA,
    KeyState,
    decode,
    encode,
)
from retry_engine.core.outputs import route
from retry_engine.core.packed import pack, unpack
from retry_engine.core.schedule import ScheduleStage
from retry_engine.delta._arrow_ipc import from_ipc, to_ipc
from retry_engine.errors import StateUnreadableError, StateVersionError
from tests.builders import T0, Result, work_rows
from tests.unit.test_schedule import MINUTE_MS, HeldState, run

GOLDEN = json.loads((Path(__file__).parent / "golden" / "schedule_state_v1.json").read_text())
CONFIG = parse_config({"engine": {"message_delay_level": "1h"}})
WINDOW_MS = 10 * MINUTE_MS


def _golden_value() -> tuple[bytes, bytes, int]:
    return (
        base64.b64decode(GOLDEN["pending_b64"]),
        base64.b64decode(GOLDEN["seen_b64"]),
        GOLDEN["expires_ms"],
    )


def _key() -> tuple[str, int]:
    route_, bucket = GOLDEN["key"]
    return str(route_), int(bucket)


def _ms(t: dt.datetime) -> int:
    return int(t.timestamp() * 1000)


def _failure_of_golden_key(msg_id: str) -> pa.Table:
    """A failure decided at T0 that lands in the golden key (same group, same store time as its rows)."""
    work = work_rows([Result.of(msg_id).failed()], batch_ts=T0, config=CONFIG)
    assert {
        (r, int(b))
        for r, b in zip(work["route"].to_pylist(), work["bucket"].to_pylist(), strict=True)
    } == {_key()}
    return work


def _reassembled(quarantined: pa.Table, blob: str) -> bytes:
    """The bytes of one moved-aside blob, put back together from the quarantine rows as an operator would."""
    parts = [json.loads(r) for r in quarantined.column("raw").to_pylist()]
    parts = sorted((p for p in parts if p["blob"] == blob), key=lambda p: p["part"])
    assert [p["part"] for p in parts] == list(range(1, parts[0]["parts"] + 1))
    data = b"".join(base64.b64decode(p["base64"]) for p in parts)
    assert (
        hashlib.sha256(data).hexdigest() == parts[0]["blob_sha256"]
        and len(data) == parts[0]["blob_bytes"]
    )
    return data


# -- item 13: versions ---------------------------------------------------------------------


def test_the_spark_state_schema_is_the_one_existing_checkpoints_hold() -> None:
    """#12 item 13: Spark checks a checkpoint's state schema; the version lives inside the blobs, so the
    schema main wrote (see the golden file) must not change."""
    assert STATE_SCHEMA == "pending binary, seen binary, expires_ms long"
    assert "STATE_SCHEMA 'pending binary, seen binary, expires_ms long'" in GOLDEN["about"]


def test_a_state_written_by_the_previous_layout_is_read_and_releases_its_retries_when_due() -> None:
    """R8, B1, #12 item 13: the golden state (main a97474f, unversioned) holds two 1h retries decided
    at T0; today's stage releases exactly those, at T0 + 1h and not before, and keeps deduplicating
    their msg ids meanwhile (#12 item 6)."""
    stage = ScheduleStage(dedup_window_ms=WINDOW_MS)
    state = HeldState(T0)
    state.value = _golden_value()
    due_ms = _ms(T0 + dt.timedelta(hours=1))
    assert GOLDEN["retry_due_at"] == ["2026-11-22 13:00:00+00:00"] * 2

    # Past the window written in the blob, before due: a re-sent GOLD-1 is still a duplicate.
    state.now_ms = GOLDEN["expires_ms"] + MINUTE_MS
    again = run(stage, _key(), [_failure_of_golden_key("GOLD-1")], state)
    assert list(again["outcome"]) == ["duplicate"]
    assert list(again["reason_code"]) == ["DUPLICATE"]

    state.now_ms = due_ms - 1
    assert run(stage, _key(), [], state).empty
    state.now_ms = due_ms + 1
    released = run(stage, _key(), [], state)
    assert sorted(released["output_msg_id"]) == GOLDEN["retry_output_msg_ids"]
    assert (
        sorted(released["consumed_msg_id"])
        == GOLDEN["retry_consumed_msg_ids"]
        == ["GOLD-1", "GOLD-2"]
    )
    assert set(released["kind"]) == {"delivery"}
    # What it wrote back is today's layout, and it reads again.
    assert from_ipc(state.get[0]).schema.metadata[b"retry_engine.state_version"] == b"3"
    assert decode(state.get).pending.num_rows == 0


def test_an_unknown_future_version_is_quarantined_with_a_reason_naming_it() -> None:
    """#12 items 3 and 13: a blob of layout version 99 is not guessed at: it is moved aside with the
    version in the reason, and the key starts afresh."""
    table = from_ipc(_golden_value()[0]).replace_schema_metadata(
        {b"retry_engine.state_version": b"99"}
    )
    value = (to_ipc(table), _golden_value()[1], GOLDEN["expires_ms"])
    with pytest.raises(
        StateVersionError, match=r"\[STATE_VERSION_UNKNOWN\].*'99'.*reads versions 1, 2"
    ):
        decode(value)
    stage = ScheduleStage(dedup_window_ms=WINDOW_MS)
    state = HeldState(T0)
    state.value = value
    out = run(stage, _key(), [_failure_of_golden_key("NEW-1")], state)
    moved = out[out["kind"] == "state_quarantine"]
    assert set(moved["reason_code"]) == {"STATE_UNREADABLE"}
    assert (
        moved["reason"]
        .str.contains("StateVersionError: [STATE_VERSION_UNKNOWN]", regex=False)
        .all()
    )
    assert moved["reason"].str.contains("'99'", regex=False).all()
    assert list(out[out["kind"] == "outcome"]["outcome"]) == ["retry"]
    assert decode(state.get).pending.column("consumed_msg_id").to_pylist() == ["NEW-1"]


def test_a_cut_short_blob_of_the_current_layout_is_caught_by_its_row_count() -> None:
    """#12 items 3 and 13: an IPC stream cut at a record-batch boundary still parses (it just ends);
    the row count in the layout-2 metadata catches it instead of silently losing retries."""
    pending = pa.concat_tables([_failure_of_golden_key("A"), _failure_of_golden_key("B")])
    assert pending.column("kind").num_chunks == 2
    blob = encode(KeyState(pending, pa.array(["A", "B"]), 0))[0]
    reader = pa.ipc.open_stream(blob)
    first = reader.read_next_batch()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, reader.schema) as writer:
        writer.write_batch(first)
    # Drop the end-of-stream marker too: a write that stopped between batches.
    cut = sink.getvalue().to_pybytes()[:-8]
    assert from_ipc(cut).num_rows == 1
    with pytest.raises(StateUnreadableError, match="holds 1 rows, its metadata says '2'"):
        decode((cut, encode(KeyState())[1], 0))


# -- item 3: unreadable state never stops the key ------------------------------------------


def _hostile_values() -> dict[str, tuple[Any, ...]]:
    pending, seen, expires = _golden_value()
    flipped = bytearray(pending)
    # Inside the body (past the schema message): a string offset or UTF-8 byte, detected by full validation.
    flipped[len(flipped) // 2 :: 97] = b"\xff" * len(flipped[len(flipped) // 2 :: 97])
    null_ids = from_ipc(pending)
    null_ids = null_ids.set_column(
        null_ids.schema.get_field_index("msg_id"),
        "msg_id",
        pa.nulls(null_ids.num_rows, pa.string()),
    )
    return {
        "truncated": (pending[: len(pending) // 2], seen, expires),
        "random bytes": (hashlib.sha256(b"x").digest() * 40, seen, expires),
        "empty": (b"", seen, expires),
        "bytes flipped": (bytes(flipped), seen, expires),
        "wrong schema": (seen, seen, expires),
        "null where a retry needs a value": (to_ipc(null_ids), seen, expires),
        "seen not a blob": (pending, None, expires),
        "expires not a number": (pending, seen, None),
    }


@pytest.mark.parametrize("case", list(_hostile_values()))
def test_an_unreadable_state_is_moved_aside_whole_and_the_key_goes_on(case: str) -> None:
    """Bad-input rule, #12 item 3: whatever is wrong with a key's state value, the stage does not raise.
    It emits STATE_UNREADABLE quarantine rows holding every byte of the value (reassembled here and
    compared with what was stored), the exception class and message, then decides the batch's rows
    on a fresh state. The rows go to the quarantine table only: they are no consume result's outcome."""
    value = _hostile_values()[case]
    stage = ScheduleStage(dedup_window_ms=WINDOW_MS)
    state = HeldState(T0)
    state.value = value
    out = unpack(
        [
            p
            for frame in stage(
                _key(), iter([pack(_failure_of_golden_key("NEW-1")).to_pandas()]), state
            )
            for p in frame["payload"]
        ]
    )
    kinds = out.column("kind").to_pylist()
    moved = out.filter(pa.array([k == "state_quarantine" for k in kinds]))
    assert moved.num_rows >= 2
    assert set(moved.column("reason_code").to_pylist()) == {"STATE_UNREADABLE"}
    assert set(moved.column("consumer_group").to_pylist()) == {"G"}
    assert all(
        r.startswith("the schedule state of group 'G'") and "StateUnreadableError" in r
        for r in moved.column("reason").to_pylist()
    )
    for blob, original in (("pending", value[0]), ("seen", value[1])):
        expected = original if isinstance(original, bytes) else repr(original).encode()
        assert _reassembled(moved, blob) == expected
    assert {json.loads(r)["state_key"]["bucket"] for r in moved.column("raw").to_pylist()} == {
        _key()[1]
    }

    # The batch's own row is decided on a fresh state and scheduled.
    outcomes = out.filter(pa.array([k == "outcome" for k in kinds]))
    assert outcomes.column("outcome").to_pylist() == ["retry"]
    assert decode(state.get).pending.column("consumed_msg_id").to_pylist() == ["NEW-1"]

    tables = route(out, batch_id=7)
    assert tables["quarantine"].num_rows == moved.num_rows
    assert tables["quarantine"].column("result_id").null_count == moved.num_rows
    assert tables["outcomes"].num_rows == 1  # one input row, one outcome


def test_a_large_unreadable_blob_is_kept_in_bounded_parts() -> None:
    """#12 item 3: a blob bigger than one quarantine row's share is split into parts of at most
    QUARANTINE_PART_BYTES that put back together to the exact bytes."""
    big = bytes(range(256)) * (3 * QUARANTINE_PART_BYTES // 256 + 7)
    stage = ScheduleStage(dedup_window_ms=WINDOW_MS)
    state = HeldState(T0)
    state.value = (big, b"", 0)
    out = run(stage, _key(), [], state)
    moved = pa.Table.from_pandas(out[out["kind"] == "state_quarantine"], preserve_index=False)
    pending_parts = [
        json.loads(r) for r in moved.column("raw").to_pylist() if json.loads(r)["blob"] == "pending"
    ]
    assert len(pending_parts) == 4
    assert all(len(base64.b64decode(p["base64"])) <= QUARANTINE_PART_BYTES for p in pending_parts)
    assert _reassembled(moved, "pending") == big
    # Nothing to wait for after a fresh start without input: the key's state goes.
    assert not state.exists
