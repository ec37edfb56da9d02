"""A lake and checkpoint an older retry-engine left behind resume under this one (the upgrade; B1, R6-R9).

Each ``tests/fixtures/upgrade/lake-<commit>.tar.gz`` was written by that commit's own engine
(``make_old_lake.py`` beside it says how): consume results of two appends, decided by the old engine,
whose first retries it released and whose second retries (a minute away) were still waiting in its
checkpointed state when a Ctrl-C stopped it; dead letters, quarantined rows and successes. 47972cd
(2026-11-22: state without a layout version, keys without sub-keys; its stop crashed Python) and
9e547ad (2026-11-23) left a planned batch to replay; 6001736 (2026-11-26: sub-keys, parked state
layout) had committed every batch it planned, and its ``-parked`` lake ran with
``state_park_bytes = 0``, so what it left waiting is in parked files beside its state. A user who
upgrades runs the new release's `retry-engine run --once` from a scheduler on that lake, with and
then without new results. Nothing the old engine decided may be decided again, nothing it left
waiting may be lost, kept waiting or released twice, and new results go through as on a new lake.
"""

from __future__ import annotations

import datetime as dt
import json
import tarfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from retry_engine.core import checkpoint_lake
from retry_engine.ops import status
from retry_engine.ops.cli import EXIT_OK, main
from tests.builders import Result
from tests.lakehouse import Lake

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade"
# The old engine's levels (make_old_lake.LEVELS): a first retry after 120 ms, a second after a minute.
LEVELS = "100ms 110ms 120ms " + " ".join(["60s"] * 15)


def _new_results() -> list[Result]:
    out: list[Result] = []
    for i in range(10):
        out.append(Result.of(f"new-first-{i}", group="billing").failed())
        out.append(Result.of(f"new-ok-{i}", group="orders").ok())
    for i in range(2):
        out.append(Result.of(f"new-dead-{i}", group="orders").failed(reconsume_times=16))
        out.append(Result.of(f"new-bad-{i}", group="billing").failed(reconsume_times=-5))
    return out


@pytest.fixture(scope="module", params=sorted(p.name for p in FIXTURES.glob("lake-*.tar.gz")))
def upgraded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The old lake taken over by this release's `retry-engine run --once`, as a scheduler runs it:
    once with no new result, once after new results arrived, once more after their retries fell due."""
    work = tmp_path_factory.mktemp("upgrade")
    with tarfile.open(FIXTURES / request.param) as tar:
        tar.extractall(work, filter="data")
    lake = work / "lake"
    old = json.loads((lake / "written.json").read_text())
    conf = work / "engine.toml"
    conf.write_text(
        f'[engine]\nlake = "{lake}"\ntrigger_interval = "200ms"\nstate_bucket = "1s"\n'
        f'message_delay_level = "{LEVELS}"\n'
    )
    tables = ("outcomes", "retry", "dlq", "quarantine")
    old_lake = Lake.make(lake)
    rows = old_lake.rows
    before = {name: rows(name) for name in tables}
    codes = [main(["run", "--once", "--config", str(conf)])]
    first_run = {name: rows(name) for name in tables}
    new = _new_results()
    old_lake.write_results(new)
    codes.append(main(["run", "--once", "--config", str(conf)]))
    time.sleep(0.5)  # the new first retries (120 ms) are due
    codes.append(main(["run", "--once", "--config", str(conf)]))
    return {
        "fixture": request.param, "lake": lake, "conf": conf, "codes": codes,
        "old_ids": old["result_ids"], "new_ids": [r.values["result_id"] for r in new],
        "before": before, "first_run": first_run, "after": {name: rows(name) for name in tables},
    }


def test_the_old_engine_left_retries_waiting_in_its_state(upgraded: dict[str, Any]) -> None:
    """The fixture holds what the upgrade must carry: retries decided but not released (only in the
    old checkpoint's state), released ones, dead letters and quarantined rows."""
    before = upgraded["before"]
    released = {r["msg_id"] for r in before["retry"]}
    waiting = [r for r in before["outcomes"] if r["outcome"] == "retry" and r["output_msg_id"] not in released]
    assert len(waiting) == 24 and len(before["retry"]) == 24
    assert len(before["dlq"]) == 6 and len(before["quarantine"]) == 6


def test_the_first_run_after_the_upgrade_releases_what_fell_due_without_new_results(upgraded: dict[str, Any]) -> None:
    """R8 on the micro-batch clock: the old engine's waiting retries are due (a minute after it decided
    them); the first scheduled run releases them even though no consume result arrived. (Before: a
    checkpoint whose planned batches were all committed ran no batch at all without new input, and
    one whose last planned batch was replayed at its old time stopped after it; neither released.)"""
    before, first = upgraded["before"], upgraded["first_run"]
    assert upgraded["codes"][0] == EXIT_OK
    waiting = {r["output_msg_id"] for r in before["outcomes"] if r["outcome"] == "retry"} - {
        r["msg_id"] for r in before["retry"]
    }
    assert {r["msg_id"] for r in first["retry"]} - {r["msg_id"] for r in before["retry"]} == waiting
    assert len(first["outcomes"]) == len(before["outcomes"])


def test_the_old_checkpoint_records_its_lake_at_the_first_start(upgraded: dict[str, Any]) -> None:
    """B8: a checkpoint of a release that did not record its lake gains the record at its first start, so
    another lake given it is refused from then on (tests/unit/test_checkpoint_lake.py)."""
    lake = upgraded["lake"]
    recorded = checkpoint_lake.read(Lake.make(lake).config.checkpoint_path)
    assert recorded == checkpoint_lake.CheckpointLake(checkpoint_lake.lake_id(str(lake)) or "", str(lake))


def test_every_result_old_and_new_is_decided_exactly_once(upgraded: dict[str, Any]) -> None:
    assert upgraded["codes"] == [EXIT_OK] * 3
    decided = Counter(r["result_id"] for r in upgraded["after"]["outcomes"])
    assert set(decided) == set(upgraded["old_ids"]) | set(upgraded["new_ids"])
    assert [rid for rid, n in decided.items() if n != 1] == []
    old = {r["result_id"]: r for r in upgraded["before"]["outcomes"]}
    kept = {r["result_id"]: r for r in upgraded["after"]["outcomes"] if r["result_id"] in old}
    assert kept == old  # the old engine's decisions stand as they were


def test_what_the_old_engine_left_waiting_is_released_once_at_its_own_due_time(upgraded: dict[str, Any]) -> None:
    """R8: a retry is never delivered before its due time; B1: each retry row exactly once."""
    after = upgraded["after"]
    retries = {r["output_msg_id"]: r for r in after["outcomes"] if r["outcome"] == "retry"}
    released = Counter(r["msg_id"] for r in after["retry"])
    assert set(released) == set(retries) and max(released.values()) == 1
    for row in after["retry"]:
        decided = retries[row["msg_id"]]
        assert row["due_at"] == decided["due_at"] and row["delivered_at"] >= row["due_at"]
        assert row["delay_level"] == decided["delay_level"]
    old_rows = {r["msg_id"]: r for r in upgraded["before"]["retry"]}
    assert {r["msg_id"]: r for r in after["retry"] if r["msg_id"] in old_rows} == old_rows


def test_dead_letters_and_quarantine_keep_the_old_rows_and_add_the_new(upgraded: dict[str, Any]) -> None:
    """R6/R7: out of retries -> the DLQ; the bad-input rule: a bad row is quarantined with a reason."""
    before, after = upgraded["before"], upgraded["after"]
    dead = Counter(r["origin_msg_id"] or r["msg_id"] for r in after["dlq"])
    assert len(after["dlq"]) == len(before["dlq"]) + 2 and max(dead.values()) == 1
    assert {r["result_id"] for r in after["quarantine"]} == {r["result_id"] for r in before["quarantine"]} | {
        rid for rid in upgraded["new_ids"] if rid.startswith("R-new-bad-")
    }
    assert all(r["reason_code"] for r in after["quarantine"])


def test_status_and_the_dlq_console_read_the_upgraded_lake(
    upgraded: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    conf = str(upgraded["conf"])
    capsys.readouterr()
    assert main(["status", "--config", conf, "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert sum(shown["outcomes"].values()) == len(upgraded["after"]["outcomes"])
    assert shown["backlog"] == []
    # The old release's engine-state row had no totals: the first start counted them from the tables,
    # and each batch since added its own, so status takes its counts from the record (#14).
    config = Lake.make(upgraded["lake"]).config
    recorded = status._recorded_tables(config, dt.datetime.now(dt.UTC))
    assert recorded is not None
    assert (recorded.totals, 0) == status.lake_counts(config)
    assert recorded.totals.outcomes() == dict(Counter(r["outcome"] for r in upgraded["after"]["outcomes"]))
    assert main(["dlq", "list", "--config", conf, "--format", "json"]) == EXIT_OK
    listed = capsys.readouterr().out
    assert all(r["msg_id"] in listed for r in upgraded["after"]["dlq"])
