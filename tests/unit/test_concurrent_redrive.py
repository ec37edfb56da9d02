"""Re-drives running at the same time (#12 item 11, SPEC B5 and B8).

Each re-drive runs in its own OS process (``multiprocessing``, spawn) over real
Delta tables in a temp folder; the dead letters are written with delta-rs
(re-drive needs no Spark). What must hold whatever runs concurrently: each dead
letter is moved at most once, and the audit table says exactly what moved.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing as mp
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from retry_engine.clients import dlq
from retry_engine.clients.dlq import PROP_REDRIVE_FROM, PROP_REDRIVE_ID, Selection, read_dlq
from retry_engine.config import EngineConfig, parse_config
from retry_engine.delta import append_arrow
from retry_engine.errors import RedriveError
from retry_engine.ops import redrive, resolve
from retry_engine.ops.audit import read_audit
from retry_engine.schemas import DLQ

DEAD = 24
T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def _config(root: str) -> EngineConfig:
    return parse_config({"engine": {"lake": root}})


def _dead_letter(i: int) -> dict[str, Any]:
    error = "com.acme.Timeout" if i % 2 == 0 else "com.acme.BadJson"
    return {
        "msg_id": f"DLQ-{i:03d}",
        "topic": "%DLQ%billing",
        "body": f"order-{i}".encode(),
        "properties": [("a", "b")],
        "born_timestamp": T0,
        "store_timestamp": T0,
        "reconsume_times": 16,
        "origin_msg_id": f"ORIGIN-{i:03d}",
        "retry_topic": "orders",
        "consumer_group": "billing",
        "dead_lettered_at": T0 + dt.timedelta(seconds=i),
        "reason_code": "MAX_RECONSUME_TIMES",
        "error_class": error,
        "error_message": f"{error} on order {i}",
        "delivery_key": f"ORIGIN-{i:03d}:16",
    }


def _lake(tmp_path: Path) -> str:
    root = str(tmp_path / "lake")
    config = _config(root)
    rows = pa.Table.from_pylist([_dead_letter(i) for i in range(DEAD)], schema=DLQ.arrow_schema)
    append_arrow(config.table_path("dlq"), rows, partition_by=DLQ.partition_by)
    return root


def _run_redrive(root: str, options: dict[str, Any], barrier: mp.synchronize.Barrier, out: mp.Queue[object]) -> None:
    """One operator: wait for the other, then re-drive; report ("ok", id, moved) or ("error", code, message)."""
    try:
        config = _config(root)
        selection = Selection(**options.pop("selection"))
        barrier.wait(timeout=120)
        report = redrive.redrive(config, selection, target="topic", chunk_size=1, **options)
        out.put(("ok", report.redrive_id, report.moved))
    except RedriveError as exc:
        out.put(("error", exc.code, str(exc)))
    except BaseException as exc:  # anything else fails the test, in the parent
        out.put(("crash", type(exc).__name__, traceback.format_exc()))
        barrier.abort()


def _race(root: str, *runs: dict[str, Any]) -> list[tuple[str, str, object]]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(runs))
    out: mp.Queue[object] = ctx.Queue()
    procs = [ctx.Process(target=_run_redrive, args=(root, dict(r), barrier, out)) for r in runs]
    for p in procs:
        p.start()
    try:
        results: list[tuple[str, str, object]] = [out.get(timeout=600) for _ in procs]  # type: ignore[misc]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert not [r for r in results if r[0] == "crash"], results
    return results


def _moved_messages(root: str) -> list[dict[str, Any]]:
    path = _config(root).table_path("messages")
    try:
        rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    except Exception:  # noqa: BLE001 - no table: nothing moved
        return []
    return [{**r, "props": dict(r["properties"])} for r in rows]


def _assert_at_most_once_and_audited(root: str) -> list[dict[str, Any]]:
    """Each dead letter at most once in the target; moved audit rows == the messages, row for row."""
    messages = _moved_messages(root)
    copies = Counter(m["props"][PROP_REDRIVE_FROM] for m in messages)
    assert {k: n for k, n in copies.items() if n > 1} == {}, "dead letters moved more than once"
    audit = read_audit(_config(root)).to_pylist()
    moved = {(a["redrive_id"], a["dlq_msg_id"], a["redriven_msg_id"], a["topic"]) for a in audit if a["moved"]}
    landed = {(m["props"][PROP_REDRIVE_ID], m["props"][PROP_REDRIVE_FROM], m["msg_id"], m["topic"]) for m in messages}
    assert moved == landed
    assert len(audit) == len({(a["redrive_id"], a["dlq_msg_id"]) for a in audit}), "a dead letter audited twice"
    return messages


def test_overlapping_redrives_at_once_move_each_dead_letter_at_most_once(tmp_path: Path) -> None:
    """#12 item 11 / B5, B8: "all of billing" and "billing's timeouts" (half of it) start at the same moment.

    Each dead letter moves at most once and the audit matches what moved. A
    re-drive that meets the other's claims stops with REDRIVE_UNFINISHED (it
    names the other); run again afterwards, it moves what is left, so in the
    end every dead letter has moved exactly once.
    """
    root = _lake(tmp_path)
    everything: dict[str, Any] = {"selection": {"group": "billing"}}
    timeouts: dict[str, Any] = {"selection": {"group": "billing", "error_pattern": "Timeout"}}
    results = _race(root, everything, timeouts)
    for status, code, _ in results:
        assert status == "ok" or code == "REDRIVE_UNFINISHED", results
    _assert_at_most_once_and_audited(root)
    # Afterwards, one by one: both complete, and nothing moves twice.
    config = _config(root)
    for options in (timeouts, everything):
        report = redrive.redrive(config, Selection(**options["selection"]), target="topic", chunk_size=1)
        assert report.complete
    messages = _assert_at_most_once_and_audited(root)
    assert sorted(m["props"][PROP_REDRIVE_FROM] for m in messages) == [f"DLQ-{i:03d}" for i in range(DEAD)]


@pytest.mark.parametrize(
    "selections",
    [
        pytest.param(({"group": "billing"}, {"group": "billing"}), id="same-selection"),
        pytest.param(
            ({"group": "billing", "error_pattern": "Timeout"}, {"group": "billing", "error_pattern": "BadJson"}),
            id="different-selections",
        ),
    ],
)
def test_one_redrive_id_started_twice_at_once_audits_exactly_what_moved(
    tmp_path: Path, selections: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """#12 item 11 / B5: the same ``--redrive-id`` run twice at the same moment (an operator's double
    start; or two selections under one id): both runs finish, every audit row's message is in the
    target exactly once, and no message is in the target that the audit does not show."""
    root = _lake(tmp_path)
    results = _race(root, *({"selection": s, "redrive_id": "fix-42"} for s in selections))
    assert [r[0] for r in results] == ["ok", "ok"], results
    messages = _assert_at_most_once_and_audited(root)
    audit = read_audit(_config(root))
    assert set(audit.column("redrive_id").to_pylist()) == {"fix-42"} and all(audit.column("moved").to_pylist())
    # Together the runs moved the union of their selections (here: all of billing), each dead
    # letter once, and each message was written by exactly one of them.
    assert sorted(m["props"][PROP_REDRIVE_FROM] for m in messages) == [f"DLQ-{i:03d}" for i in range(DEAD)]
    assert sum(int(r[2]) for r in results) == len(messages)  # type: ignore[call-overload]


def _files_of_dead_letters(root: str) -> EngineConfig:
    """13 dead letters in four files: seconds apart with microseconds, a day on 1 us apart, one without a
    time, and another group's."""
    config = _config(root)
    day = dt.timedelta(days=1)
    files = [
        [_dead_letter(i) | {"dead_lettered_at": T0 + dt.timedelta(seconds=i, microseconds=999)} for i in range(5)],
        [_dead_letter(i) | {"dead_lettered_at": T0 + day + dt.timedelta(microseconds=i)} for i in range(5, 9)],
        [_dead_letter(9) | {"dead_lettered_at": None}],
        [_dead_letter(i) | {"consumer_group": "search", "topic": "%DLQ%search"} for i in range(10, 13)],
    ]
    for rows in files:
        append_arrow(config.table_path("dlq"), pa.Table.from_pylist(rows, schema=DLQ.arrow_schema), partition_by=DLQ.partition_by)
    return config


def test_dlq_list_reads_bodies_only_for_its_page_and_lists_what_every_row_lists(tmp_path: Path) -> None:
    """``dlq list`` (a page of ``--limit``, oldest first, and the count) decides on the light columns and
    reads bodies only for the page: the same rows, in the same order, with the same bodies and the same
    count as every dead letter read whole, with and without the resolved ones, at an older version."""
    config = _files_of_dead_letters(str(tmp_path / "lake"))
    resolve.resolve(config, Selection(ids=("DLQ-001", "DLQ-006")), reason="by hand", operator="t")
    for selection in (None, Selection(group="billing"), Selection(since=T0 + dt.timedelta(seconds=2)), Selection(ids=("DLQ-011",))):
        for include_resolved in (False, True):
            every = dlq.dead_letters(config, selection, include_resolved=include_resolved)
            assert isinstance(every, pd.DataFrame)
            for limit in (1, 100):
                page, total = dlq.dead_letter_page(config, selection, limit=limit, include_resolved=include_resolved)
                assert total == len(every), (selection, include_resolved)
                pd.testing.assert_frame_equal(page, every.head(limit).reset_index(drop=True))
    # A msg_id dead-lettered again later (a re-driven one that failed again): its second row is
    # listed in its place, not beside the first on a page that ends before it.
    again = _dead_letter(2) | {"dead_lettered_at": T0 + dt.timedelta(days=3), "body": b"order-2 again"}
    append_arrow(config.table_path("dlq"), pa.Table.from_pylist([again], schema=DLQ.arrow_schema), partition_by=DLQ.partition_by)
    every = dlq.dead_letters(config)
    assert isinstance(every, pd.DataFrame) and list(every["msg_id"]).count("DLQ-002") == 2
    for limit in (2, 3, 100):
        page, total = dlq.dead_letter_page(config, limit=limit)
        assert total == len(every)
        pd.testing.assert_frame_equal(page, every.head(limit).reset_index(drop=True))
    # The DLQ's first file (version 1), less DLQ-001 (resolved: the audit is read as it is now).
    page, total = dlq.dead_letter_page(config, limit=2, version=1)
    assert (total, list(page["msg_id"]), list(page["body_text"])) == (4, ["DLQ-000", "DLQ-002"], ["order-0", "order-2"])
    old = dlq.dead_letters(config, version=1)
    assert isinstance(old, pd.DataFrame)
    pd.testing.assert_frame_equal(page, old.head(2).reset_index(drop=True))


def test_a_redrive_reading_bodies_by_file_moves_each_dead_letter_with_its_own(tmp_path: Path) -> None:
    """A re-drive plans without bodies and reads the bodies of what it moves from the files their group
    and times may be in (how much less it reads is measured, bench RESULTS run AN). What this holds:
    every dead letter still moves with its own body, for chunks that span files, times with
    microseconds at a file's edge, a dead letter without a time (no file is skipped for it) and
    another group's files; a bound pruned wrongly fails it (DEAD_LETTER_MISSING)."""
    root = str(tmp_path / "lake")
    config = _files_of_dead_letters(root)
    day = dt.timedelta(days=1)
    report = redrive.redrive(config, Selection(group="billing"), target="topic", chunk_size=3, operator="t")
    assert report.moved == 10 and report.remaining == 0
    moved = {m["props"][PROP_REDRIVE_FROM]: m["body"] for m in _moved_messages(root)}
    assert moved == {f"DLQ-{i:03d}": f"order-{i}".encode() for i in range(10)}
    # One dead letter from the middle of a file.
    report = redrive.redrive(config, Selection(ids=("DLQ-011",)), target="topic", operator="t")
    assert report.moved == 1
    assert {m["props"][PROP_REDRIVE_FROM]: m["body"] for m in _moved_messages(root)}["DLQ-011"] == b"order-11"
    # A re-drive plans on what its selection's group and time bounds may match (file and row-group
    # statistics), not the whole DLQ's light columns: the same dead letters as the mask over every row,
    # at microsecond edges (since inclusive, until exclusive) within one file and across files.
    everything = read_dlq(config)
    edge = T0 + day
    for selection in (
        Selection(group="billing", since=edge + dt.timedelta(microseconds=6), until=edge + dt.timedelta(microseconds=8)),
        Selection(since=T0 + dt.timedelta(seconds=2, microseconds=999)),
        Selection(until=T0 + dt.timedelta(seconds=1, microseconds=999)),
        Selection(until=T0 + dt.timedelta(seconds=1, microseconds=1_000)),
        Selection(group="search", since=T0),
        Selection(since=edge + dt.timedelta(microseconds=8), until=edge + dt.timedelta(microseconds=9)),
        Selection(since=edge + dt.timedelta(days=1)),
        # Bounds at the ends of what a datetime holds (from the command line): no overflow, no file lost.
        Selection(since=dt.datetime(1, 1, 1, tzinfo=dt.UTC)),
        Selection(until=dt.datetime.max.replace(tzinfo=dt.UTC)),
    ):
        pruned = read_dlq(config, selection).column("msg_id").to_pylist()
        assert sorted(pruned) == sorted(everything.filter(selection.mask(everything)).column("msg_id").to_pylist()), selection
    between = Selection(group="billing", since=edge + dt.timedelta(microseconds=6), until=edge + dt.timedelta(microseconds=8))
    assert sorted(read_dlq(config, between).column("msg_id").to_pylist()) == ["DLQ-006", "DLQ-007"]
    report = redrive.redrive(config, between, target="topic", operator="t", force=True)
    assert (report.matched, report.moved) == (2, 2)
    bodies = [m for m in _moved_messages(root) if m["props"].get(PROP_REDRIVE_ID) == report.redrive_id]
    assert sorted(m["body"] for m in bodies) == [b"order-6", b"order-7"]
