"""Size-bounded splits of the schedule stage's state keys, without Spark (#12 item 17).

The stage function is driven with :class:`HeldState` (a plain container for one
key's value and clock) and the routing with explicit micro-batch ids, as Spark
would hand them; expected keys are computed here from the rule (CRC-32 of the
msg id, top bits per level), not by the code under test.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
import zlib
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pytest

from retry_engine.config import parse_config
from retry_engine.core import _state_splits
from retry_engine.core._schedule_state import SEALED_KEY, KeyState, decode, encode
from retry_engine.core._state_splits import SPLITS_DIR, Seal, SealStore, level_of, seal_name
from retry_engine.core.packed import pack, unpack
from retry_engine.core.schedule import ScheduleStage, StateKeySplit
from retry_engine.errors import ConfigError, StateSplitError, StateUnreadableError
from tests.builders import T0, Result, work_rows
from tests.unit.test_schedule import MINUTE_MS, HeldState, run

CONFIG = parse_config({"engine": {"message_delay_level": "1h"}})
WINDOW_MS = 10 * MINUTE_MS
# A test-sized threshold: a key of this test's rows passes it with ~60 pending retries (~540 bytes each).
MAX_BYTES = 32 * 1024
PER_BATCH = 200


def _crc(msg_id: str) -> int:
    return zlib.crc32(msg_id.encode())


def _expected_key(msg_id: str, level: int) -> str:
    """The route of msg id's key at ``level`` under base key G: the CRC's top ``level`` bits pick it."""
    return "G" if level == 0 else f"G#L{level}.{_crc(msg_id) >> (32 - level)}"


class Engine:
    """Decide's routing and the schedule stage over a dict of per-key states, one micro-batch per call."""

    def __init__(self, checkpoint: Path) -> None:
        self.seals = SealStore(str(checkpoint))
        self.split = StateKeySplit(subkeys=1, seals=self.seals)
        self.states: dict[tuple[str, int], HeldState] = {}

    def batch(self, batch_id: int, results: list[Result], now: dt.datetime) -> pa.Table:
        work = self.split(work_rows(results, batch_ts=T0, config=CONFIG), batch_id=batch_id)
        stage = ScheduleStage(WINDOW_MS, seals=self.seals, max_key_bytes=MAX_BYTES, batch_id=batch_id)
        frames: dict[tuple[str, int], list[bytes]] = defaultdict(list)
        packed = pack(work)
        for route, bucket, payload in zip(*(packed.column(i).to_pylist() for i in range(3)), strict=True):
            frames[(route, bucket)].append(payload)
        out: list[bytes] = []
        for key, payloads in frames.items():
            state = self.states.setdefault(key, HeldState(now))
            state.now_ms = int(now.timestamp() * 1000)
            batch = pa.RecordBatch.from_arrays(
                [pa.array([key[0]] * len(payloads)), pa.array([key[1]] * len(payloads), pa.int64()),
                 pa.array(payloads, pa.binary())],
                names=["route", "bucket", "payload"],
            )
            out += [p for f in stage(key, iter([batch.to_pandas()]), state) for p in f["payload"]]
        return unpack(out)

    def fire_all(self, now: dt.datetime) -> pa.Table:
        """Every key's timeout, as Spark calls a key with no rows."""
        stage = ScheduleStage(WINDOW_MS, seals=self.seals, max_key_bytes=MAX_BYTES, batch_id=999)
        out: list[bytes] = []
        for key, state in self.states.items():
            if state.exists:
                state.now_ms = int(now.timestamp() * 1000)
                out += [p for f in stage(key, iter([]), state) for p in f["payload"]]
        return unpack(out)


def _outcomes(out: pa.Table) -> dict[str, str]:
    return dict(zip(out.column("result_id").to_pylist(), out.column("outcome").to_pylist(), strict=True))


def test_a_growing_key_seals_and_splits_while_every_duplicate_meets_its_original(tmp_path: Path) -> None:
    """#12 item 17 part routing/sealing, B1, R8: one (group, bucket) gets 200 new failures per batch.
    Batch 1 fills key G past the threshold: it seals, publishing exactly its 200 ids. Batch 2's new ids go
    to G#L1.<top bit of CRC-32>, which seal in turn; batch 3's new ids go to level 2. Results re-sent after
    any split (ids decided in batches 1 and 2) are DUPLICATE, never a second retry; acknowledgements keep
    their key; each retry is released exactly once, at its due time."""
    engine = Engine(tmp_path / "ck")
    batches = [[Result.of(f"B{b}-{i:04d}").failed() for i in range(PER_BATCH)] for b in range(3)]
    ids = [[r.values["msg_id"] for r in rs] for rs in batches]

    first = engine.batch(1, batches[0], T0)
    assert set(first.column("outcome").to_pylist()) == {"retry"}
    (g,) = engine.states
    assert g[0] == "G"
    assert decode(engine.states[g].get).sealed_batch == 1
    (only,) = (tmp_path / "ck" / SPLITS_DIR).iterdir()
    assert only.name == seal_name("G", g[1], 0, 1)
    assert pa.ipc.open_file(only).read_all().column("msg_id").to_pylist() == sorted(ids[0])

    # Batch 2: new ids plus every 4th of batch 1 re-sent (and one acknowledgement).
    resent1 = [r.with_(result_id=f"again1-{i}") for i, r in enumerate(batches[0][::4])]
    ack = Result.of("ACK-1").ok()
    second = engine.batch(2, batches[1] + resent1 + [ack], T0 + dt.timedelta(minutes=1))
    outcomes = _outcomes(second)
    assert {outcomes[r.values["result_id"]] for r in resent1} == {"duplicate"}
    assert {outcomes[r.values["result_id"]] for r in batches[1]} == {"retry"}
    assert outcomes[ack.values["result_id"]] == "acknowledged"
    routes = dict(zip(second.column("result_id").to_pylist(), second.column("route").to_pylist(), strict=True))
    assert {routes[r.values["result_id"]] for r in resent1} == {"G"}
    assert all(routes[r.values["result_id"]] == _expected_key(r.values["msg_id"], 1) for r in batches[1])
    assert {k[0] for k in engine.states} == {"G", "G#L1.0", "G#L1.1"}
    assert all(decode(engine.states[(f"G#L1.{j}", g[1])].get).sealed_batch == 2 for j in (0, 1))

    # Batch 3: new ids go to level 2; re-sent ids of batches 1 and 2 meet their records at levels 0 and 1.
    resent2 = [r.with_(result_id=f"again2-{i}") for i, r in enumerate(batches[1][::3])]
    resent1b = [r.with_(result_id=f"again1b-{i}") for i, r in enumerate(batches[0][1::5])]
    third = engine.batch(3, batches[2] + resent2 + resent1b, T0 + dt.timedelta(minutes=2))
    outcomes = _outcomes(third)
    routes = dict(zip(third.column("result_id").to_pylist(), third.column("route").to_pylist(), strict=True))
    assert {outcomes[r.values["result_id"]] for r in resent2 + resent1b} == {"duplicate"}
    assert {outcomes[r.values["result_id"]] for r in batches[2]} == {"retry"}
    assert all(routes[r.values["result_id"]] == _expected_key(r.values["msg_id"], 1) for r in resent2)
    assert all(routes[r.values["result_id"]] == _expected_key(r.values["msg_id"], 2) for r in batches[2])
    assert {k[0] for k in engine.states} == {"G", "G#L1.0", "G#L1.1"} | {
        _expected_key(i, 2) for i in ids[2]
    }

    # Due (1h): each of the 600 retries is released once, from whichever key holds it.
    assert engine.fire_all(T0 + dt.timedelta(minutes=59)).num_rows == 0
    released = engine.fire_all(T0 + dt.timedelta(hours=1, minutes=1))
    assert sorted(released.column("consumed_msg_id").to_pylist()) == sorted(sum(ids, []))
    assert set(released.column("kind").to_pylist()) == {"delivery"}


def test_a_replayed_batch_routes_as_its_first_attempt_and_reseals_identically(tmp_path: Path) -> None:
    """#12 item 17 replay, B1: batch 1 seals G and is not committed. Its replay (batch id 1 again, state
    of batch 0) must not see its own seal: the same rows route to G again, decide the same, and the seal
    is written with the same bytes (another checkpoint running the same batch writes an identical file);
    the file of the first attempt is kept. Only batch 2 routes through the seal."""
    results = [Result.of(f"R-{i:04d}").failed() for i in range(PER_BATCH)]
    first = Engine(tmp_path / "a")
    out1 = first.batch(1, results, T0)
    (seal,) = (tmp_path / "a" / SPLITS_DIR).iterdir()
    written = seal.read_bytes()
    mtime = seal.stat().st_mtime_ns

    # The replay: same checkpoint (seal on disk), state as before batch 1 (empty).
    replay = Engine(tmp_path / "a")
    out2 = replay.batch(1, results, T0)
    assert out2.column("route").to_pylist() == out1.column("route").to_pylist() == ["G"] * PER_BATCH
    assert out2.column("output_msg_id").to_pylist() == out1.column("output_msg_id").to_pylist()
    assert seal.stat().st_mtime_ns == mtime and seal.read_bytes() == written
    other = Engine(tmp_path / "b")
    other.batch(1, results, T0)
    assert (tmp_path / "b" / SPLITS_DIR / seal.name).read_bytes() == written

    new = Result.of("AFTER-1").failed()
    assert replay.split(work_rows([new], batch_ts=T0, config=CONFIG), batch_id=2).column("route").to_pylist() == [
        _expected_key("AFTER-1", 1)
    ]
    assert replay.split(work_rows([new], batch_ts=T0, config=CONFIG), batch_id=1).column("route").to_pylist() == [
        "G"
    ]


def test_a_leftover_seal_of_an_attempt_that_did_not_seal_on_replay_still_routes_correctly(tmp_path: Path) -> None:
    """#12 item 17 replay, B1: the first attempt of batch 1 sealed G; before its replay the threshold was
    raised, so the replay does not seal. The left-over file holds what G knew at the end of batch 1, so
    batch 2 sends re-sent ids to G (duplicates) and new ids one level down (retries), never a second retry."""
    results = [Result.of(f"L-{i:04d}").failed() for i in range(PER_BATCH)]
    Engine(tmp_path / "ck").batch(1, results, T0)
    engine = Engine(tmp_path / "ck")
    work = engine.split(work_rows(results, batch_ts=T0, config=CONFIG), batch_id=1)
    key = ("G", int(work.column("bucket")[0].as_py()))
    state = engine.states.setdefault(key, HeldState(T0))
    big = dataclasses.replace(ScheduleStage(WINDOW_MS), seals=engine.seals, max_key_bytes=2**30, batch_id=1)
    list(big(key, iter([pack(work).to_pandas()]), state))
    assert decode(state.get).sealed_batch is None
    resent = [r.with_(result_id=f"again-{i}") for i, r in enumerate(results[::10])]
    fresh = [Result.of(f"N-{i:03d}").failed() for i in range(20)]
    out = engine.batch(2, resent + fresh, T0 + dt.timedelta(minutes=1))
    outcomes = _outcomes(out)
    assert {outcomes[r.values["result_id"]] for r in resent} == {"duplicate"}
    assert {outcomes[r.values["result_id"]] for r in fresh} == {"retry"}


def test_normal_loads_are_not_hashed_and_acknowledgements_keep_their_key(tmp_path: Path) -> None:
    """#12 item 17: with no seal in the checkpoint the split is the identity for a base count of 1, and a
    seal of one bucket moves no row of another bucket nor any acknowledgement."""
    store = SealStore(str(tmp_path / "ck"))
    split = StateKeySplit(subkeys=1, seals=store)
    work = work_rows([Result.of("F-1").failed(), Result.of("OK-1").ok()], batch_ts=T0, config=CONFIG)
    assert split(work, batch_id=5) is work
    bucket = int(work.column("bucket")[0].as_py())
    store.publish("G", bucket + 1, 5, ["F-1"])  # another bucket
    assert split(work, batch_id=6).column("route").to_pylist() == work.column("route").to_pylist()
    store.publish("G", bucket, 6, ["X"])
    routed = dict(zip(work.column("consumed_msg_id").to_pylist(), split(work, batch_id=7).column("route").to_pylist(),
                      strict=True))
    assert routed == {"F-1": _expected_key("F-1", 1), "OK-1": "G"}


def test_levels_are_computed_from_the_route() -> None:
    assert level_of("G") == level_of("G#03") == 0
    assert level_of("G#L3.5") == level_of("G#03#L3.5") == 3
    assert level_of("%RETRY%|x#L16.65535") == 16


def _sealed_checkpoint(tmp_path: Path) -> tuple[Engine, Path, list[Result]]:
    results = [Result.of(f"H-{i:04d}").failed() for i in range(PER_BATCH)]
    engine = Engine(tmp_path / "ck")
    engine.batch(1, results, T0)
    (seal,) = (tmp_path / "ck" / SPLITS_DIR).iterdir()
    _state_splits._ids_cache.clear()  # a worker that never read it
    _state_splits._listing_cache.clear()
    return engine, seal, results


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "other_key", "not_arrow"])
def test_a_damaged_seal_stops_the_batch_with_a_clear_error_not_a_silent_dedup_loss(
    tmp_path: Path, damage: str
) -> None:
    """#12 item 17 hostile, B1: a seal file cut short, with a flipped byte, emptied, copied from another key
    or replaced by other bytes raises STATE_SPLIT_FILE_INVALID naming the file, instead of routing re-sent
    ids to a new key where they would be retried again."""
    engine, seal, results = _sealed_checkpoint(tmp_path)
    data = seal.read_bytes()
    if damage == "truncated":
        seal.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":
        # Inside the ids' bytes: the file still opens, full validation or the row count catches it.
        at = data.index(b"H-0100")
        seal.write_bytes(data[:at] + b"\xff" + data[at + 1 :])
    elif damage == "empty":
        seal.write_bytes(b"")
    elif damage == "other_key":
        other = SealStore(str(tmp_path / "other"))
        path = other.publish("G#L1.0", 7, 1, ["H-0001"])
        seal.write_bytes(Path(path).read_bytes())
    else:
        seal.write_bytes(b"PAR1" * 64)
    resent = [results[0].with_(result_id="again")]
    with pytest.raises(StateSplitError, match=rf"\[STATE_SPLIT_FILE_INVALID\].*{seal.name}.*backup"):
        engine.batch(2, resent, T0 + dt.timedelta(minutes=1))


def test_a_stray_file_or_a_missing_seal_is_refused(tmp_path: Path) -> None:
    """#12 item 17 hostile: a file in the seals folder that is not a seal (a renamed seal, say) is refused;
    a key whose state says it sealed but whose seal is gone refuses its rows (STATE_SPLIT_FILE_MISSING)
    instead of taking ids that other keys hold."""
    engine, seal, results = _sealed_checkpoint(tmp_path)
    stray = seal.with_name("renamed.arrow")
    seal.rename(stray)
    resent = [results[0].with_(result_id="again")]
    with pytest.raises(StateSplitError, match=r"\[STATE_SPLIT_FILE_INVALID\].*renamed.arrow"):
        engine.batch(2, resent, T0 + dt.timedelta(minutes=1))
    stray.unlink()
    with pytest.raises(StateSplitError, match=r"\[STATE_SPLIT_FILE_MISSING\].*restore"):
        engine.batch(2, resent, T0 + dt.timedelta(minutes=1))
    # A killed write's leftover is not a seal and is ignored.
    (seal.parent / f"{seal.name}.abc.tmp").write_bytes(b"half")
    assert engine.seals.sealed_before(10) == {}


def test_sealing_needs_the_micro_batch_id(tmp_path: Path) -> None:
    """#12 item 17: outside a streaming micro-batch (no batch id) a key cannot seal, and routing through
    existing seals is refused rather than guessed."""
    results = [Result.of(f"Z-{i:04d}").failed() for i in range(PER_BATCH)]
    work = work_rows(results, batch_ts=T0, config=CONFIG)
    store = SealStore(str(tmp_path / "ck"))
    stage = ScheduleStage(WINDOW_MS, seals=store, max_key_bytes=MAX_BYTES)
    key = ("G", int(work.column("bucket")[0].as_py()))
    with pytest.raises(StateSplitError, match=r"\[STATE_SPLIT_NO_BATCH_ID\]"):
        list(stage(key, iter([pack(work).to_pandas()]), HeldState(T0)))
    store.publish("G", key[1], 0, ["x"])
    with pytest.raises(StateSplitError, match=r"\[STATE_SPLIT_NO_BATCH_ID\]"):
        StateKeySplit(subkeys=1, seals=store)(work)


# -- state layout 3 --------------------------------------------------------------------------


GOLDEN_V2 = json.loads((Path(__file__).parent / "golden" / "schedule_state_v2.json").read_text())


def test_a_v2_state_reads_as_not_sealed_and_may_seal_when_it_grows(tmp_path: Path) -> None:
    """#12 items 13 and 17: a state written by layout 2 (main 9777f4f, golden file) reads as not sealed,
    keeps deduplicating and releasing its retries, and is written back as layout 3, which records the
    sealing batch."""
    value = (
        base64.b64decode(GOLDEN_V2["pending_b64"]),
        base64.b64decode(GOLDEN_V2["seen_b64"]),
        GOLDEN_V2["expires_ms"],
    )
    held = decode(value)
    assert held.sealed_batch is None
    assert sorted(held.pending.column("consumed_msg_id").to_pylist()) == GOLDEN_V2["retry_consumed_msg_ids"]
    key = (str(GOLDEN_V2["key"][0]), int(GOLDEN_V2["key"][1]))
    state = HeldState(T0)
    state.value = value
    stage = ScheduleStage(WINDOW_MS, seals=SealStore(str(tmp_path / "ck")), max_key_bytes=MAX_BYTES, batch_id=4)
    again = run(stage, key, [work_rows([Result.of("V2-1").failed()], batch_ts=T0, config=CONFIG)], state)
    assert list(again["outcome"]) == ["duplicate"]
    assert decode(state.get).sealed_batch is None  # far below the threshold
    more = work_rows([Result.of(f"V3-{i:03d}").failed() for i in range(100)], batch_ts=T0, config=CONFIG)
    run(stage, key, [more], state)
    assert decode(state.get).sealed_batch == 4
    assert pa.ipc.open_stream(state.get[1]).schema.metadata[SEALED_KEY] == b"4"
    published = SealStore(str(tmp_path / "ck")).published_ids(Seal("G", key[1], 0, 4, str(
        tmp_path / "ck" / SPLITS_DIR / seal_name("G", key[1], 0, 4))))
    assert set(published.to_pylist()) == {"V2-1", "V2-2"} | {f"V3-{i:03d}" for i in range(100)}
    state.now_ms = int((T0 + dt.timedelta(hours=1, seconds=1)).timestamp() * 1000)
    released = run(stage, key, [], state)
    assert sorted(released["consumed_msg_id"]) == ["V2-1", "V2-2"] + [f"V3-{i:03d}" for i in range(100)]
    assert set(GOLDEN_V2["retry_output_msg_ids"]) <= set(released["output_msg_id"])


@pytest.mark.parametrize("bad", [b"x", b"-1", b"", b"1.5"])
def test_a_bad_sealed_mark_makes_the_state_unreadable(bad: bytes) -> None:
    pending, seen, expires = encode(KeyState(sealed_batch=3))
    table = pa.ipc.open_stream(seen).read_all()
    metadata = {**(table.schema.metadata or {}), SEALED_KEY: bad}
    from retry_engine.delta._arrow_ipc import to_ipc

    with pytest.raises(StateUnreadableError, match="sealed batch"):
        decode((pending, to_ipc(table.replace_schema_metadata(metadata)), expires))


@pytest.mark.parametrize("value", [0, -1, 16 * 1024 - 1, 2**30 + 1, 2**63, "64MiB", 1.5e6, True, None])
def test_state_key_max_bytes_refuses_hostile_values(value: object) -> None:
    """#12 item 17: the threshold is an integer number of bytes between 16 KiB and 1 GiB."""
    with pytest.raises(ConfigError, match="state_key_max_bytes"):
        parse_config({"engine": {"state_key_max_bytes": value}})


def test_state_key_max_bytes_defaults_to_64_mib() -> None:
    assert parse_config({}).engine.state_key_max_bytes == 64 * 1024 * 1024
    assert parse_config({"engine": {"state_key_max_bytes": 16 * 1024}}).engine.state_key_max_bytes == 16 * 1024
