"""Re-drive tasks (#13 part 5, item 1; SPEC B5, B8): list, status and cancel re-drives, confirm large ones.

Real Delta tables in temp folders, written with delta-rs (re-drive needs no
Spark); the cancel test runs the re-drive in another OS process, as an
operator's second terminal would.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from retry_engine.clients.dlq import PROP_REDRIVE_FROM, PROP_REDRIVE_ID, Selection
from retry_engine.config import EngineConfig, load_config
from retry_engine.delta import table_version
from retry_engine.errors import RedriveError
from retry_engine.ops import redrive, redrive_tasks
from retry_engine.ops.audit import read_audit
from retry_engine.ops.cli import EXIT_ERROR, EXIT_OK, _parser, main
from retry_engine.ops.dlq_commands import run as run_dlq
from tests.dead_letters import dead_letter, dlq_lake
from tests.lakehouse import wait_for

REPO = Path(__file__).resolve().parents[2]
DEAD = 24


@pytest.fixture
def config(tmp_path: Path) -> EngineConfig:
    return dlq_lake(str(tmp_path / "lake"), [dead_letter(i) for i in range(DEAD)])


@pytest.fixture
def config_file(config: EngineConfig, tmp_path: Path) -> str:
    path = tmp_path / "retry-engine.toml"
    path.write_text(f'[engine]\nlake = "{config.engine.lake}"\n')
    return str(path)


def _messages(config: EngineConfig) -> list[dict[str, Any]]:
    if table_version(config.table_path("messages")) is None:
        return []
    rows = DeltaTable(config.table_path("messages")).to_pyarrow_table().to_pylist()
    return [{**r, "props": dict(r["properties"])} for r in rows]


def _versions(config: EngineConfig) -> dict[str, int | None]:
    return {
        t: table_version(config.table_path(t))
        for t in ("dlq", "messages", "retry", "redrive_audit", "redrive_tasks")
    }


def test_list_and_status_of_finished_and_interrupted_redrives(
    config: EngineConfig, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """#13 part 5 item 1: every re-drive is listed with id, selection, target, state, moved/total, operator, times."""

    class Crash(Exception):
        pass

    def crash_after_two_chunks(p: redrive.ChunkProgress) -> None:
        if p.phase == "moved" and p.chunk == 1:
            raise Crash("disk full")

    done = redrive.redrive(
        config,
        Selection(group="billing", error_pattern="Timeout"),
        target="topic",
        operator="alice",
    )
    with pytest.raises(Crash):
        redrive.redrive(
            config,
            Selection(group="billing"),
            target="retry",
            chunk_size=3,
            operator="bob",
            redrive_id="fix-7",
            on_progress=crash_after_two_chunks,
        )
    frame = redrive_tasks.tasks(config)
    rows = {r["redrive_id"]: r for r in frame.to_dict("records")}
    assert set(rows) == {done.redrive_id, "fix-7"}
    finished, broken = rows[done.redrive_id], rows["fix-7"]
    # 12 timeouts (even ids) all moved; "fix-7" planned the 12 bad-JSON ones left, moved 2 chunks of 3.
    assert (
        finished["state"],
        finished["target"],
        finished["moved"],
        finished["total"],
        finished["operator"],
    ) == ("finished", "topic", 12, 12, "alice")
    assert json.loads(finished["selection"]) == {"group": "billing", "error_pattern": "Timeout"}
    assert finished["started_at"] <= finished["ended_at"]
    assert (
        broken["state"],
        broken["target"],
        broken["moved"],
        broken["total"],
        broken["operator"],
    ) == ("interrupted", "retry", 6, 12, "bob")
    assert "Crash: disk full" in broken["detail"]
    assert list(frame["redrive_id"]) == ["fix-7", done.redrive_id]  # newest first

    assert main(["redrive", "list", "--config", config_file]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["redrive_id", "state", "target", "moved", "operator"]
    assert lines[1].split()[:5] == ["fix-7", "interrupted", "retry", "6/12", "bob"]
    assert lines[2].split()[:5] == [done.redrive_id, "finished", "topic", "12/12", "alice"]
    assert main(["redrive", "list", "--config", config_file, "--state", "running"]) == EXIT_OK
    assert capsys.readouterr().err.strip() == "no re-drives running"
    assert main(["redrive", "status", "--config", config_file, "fix-7"]) == EXIT_OK
    out = capsys.readouterr().out
    assert (
        "state       interrupted" in out and "moved       6/12" in out and "operator    bob" in out
    )
    assert (
        main(["redrive", "status", "--config", config_file, "fix-7", "--format", "json"]) == EXIT_OK
    )
    assert json.loads(capsys.readouterr().out)["moved"] == 6

    # Run again to the end, the same re-drive reads finished.
    redrive.redrive(
        config, Selection(group="billing"), target="retry", chunk_size=3, redrive_id="fix-7"
    )
    assert redrive_tasks.task(config, "fix-7")["state"] == "finished"


def test_a_run_that_goes_silent_reads_interrupted(config: EngineConfig) -> None:
    """#13 part 5 item 1: a run killed without an end event is running until silent for STALE_AFTER_S."""
    tracker = redrive_tasks.RunTracker(
        config, "killed-1", operator="carol", selection=None, target="topic"
    )
    tracker.start(moved=0, total=5)
    started = redrive_tasks.read_events(config, "killed-1").column("at")[0].as_py()
    soon = started + dt.timedelta(seconds=redrive_tasks.STALE_AFTER_S - 1)
    late = started + dt.timedelta(seconds=redrive_tasks.STALE_AFTER_S + 1)
    assert redrive_tasks.task(config, "killed-1", now=soon)["state"] == "running"
    gone = redrive_tasks.task(config, "killed-1", now=late)
    assert gone["state"] == "interrupted" and "no sign of life" in str(gone["detail"])
    # Cancelling it then marks it cancelled at once (no run is left to stop).
    result = redrive_tasks.cancel(config, "killed-1", operator="dave", reason="obsolete", now=late)
    assert (result.state, result.runs) == ("cancelled", 0)
    assert redrive_tasks.task(config, "killed-1", now=late)["state"] == "cancelled"


def test_a_sign_of_life_dated_far_ahead_keeps_no_killed_run_running(config: EngineConfig) -> None:
    """Hostile input (the task table: a clock ahead, or another writer): a run killed after an event dated
    in year 9999 read "running" until then, and a cancel reported it sent to a run that never reads it.
    Events more than an hour ahead are no sign of life; a few minutes ahead still are."""
    tracker = redrive_tasks.RunTracker(config, "ahead-1", operator="carol", selection=None, target="topic")
    tracker.start(moved=0, total=5)
    now = redrive_tasks.read_events(config, "ahead-1").column("at")[0].as_py() + dt.timedelta(seconds=1)
    redrive_tasks._append(config, redrive_id="ahead-1", event="alive", run_id=tracker.run_id, operator="x",
                          at=dt.datetime(9999, 12, 31, tzinfo=dt.UTC), moved=1, total=5, target="topic",
                          host="h")
    later = now + dt.timedelta(seconds=redrive_tasks.STALE_AFTER_S + 5)
    gone = redrive_tasks.task(config, "ahead-1", now=later)
    assert gone["state"] == "interrupted" and "no sign of life" in str(gone["detail"])
    result = redrive_tasks.cancel(config, "ahead-1", operator="dave", reason="obsolete", now=later)
    assert (result.state, result.runs) == ("cancelled", 0)
    tracker2 = redrive_tasks.RunTracker(config, "ahead-2", operator="carol", selection=None, target="topic")
    tracker2.start(moved=0, total=5)
    early = redrive_tasks.read_events(config, "ahead-2").column("at")[0].as_py() - dt.timedelta(minutes=5)
    assert redrive_tasks.task(config, "ahead-2", now=early)["state"] == "running"


def test_audit_only_redrives_are_listed(config: EngineConfig) -> None:
    """#13 part 5 item 1: re-drives from before the tasks table (audit rows only) still show up."""
    report = redrive.redrive(config, Selection(group="billing"), target="topic", chunk_size=5)
    DeltaTable(
        config.table_path("redrive_tasks")
    ).delete()  # as a lake from an older release: no events
    row = redrive_tasks.task(config, report.redrive_id)
    assert (row["state"], row["moved"], row["total"], row["target"]) == (
        "finished",
        DEAD,
        DEAD,
        "topic",
    )


@pytest.mark.parametrize(
    "bad", ["nope", "", "../../etc", "a b", "x'; DROP TABLE dlq; --", "ünïcode", "a" * 65, "rd\n1"]
)
def test_status_and_cancel_of_unknown_or_odd_ids(
    config: EngineConfig, config_file: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """#13 part 5 item 1, hostile values: an unknown id or one with odd characters is a clear error, nothing written."""
    redrive.redrive(config, Selection(group="billing"), target="topic", redrive_id="known-1")
    before = _versions(config)
    with pytest.raises(RedriveError, match="REDRIVE_NOT_FOUND"):
        redrive_tasks.task(config, bad)
    with pytest.raises(RedriveError, match="REDRIVE_NOT_FOUND"):
        redrive_tasks.cancel(config, bad, operator="eve")
    assert main(["redrive", "cancel", "--config", config_file, bad, "--reason", "x"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "REDRIVE_NOT_FOUND" in err and (
        "known (newest first): known-1" in err or "is not a re-drive id" in err
    )
    assert _versions(config) == before


def test_cancel_of_a_finished_redrive_is_refused(config: EngineConfig) -> None:
    """#13 part 5 item 1: there is nothing to cancel once a re-drive finished."""
    redrive.redrive(config, Selection(group="billing"), target="topic", redrive_id="done-1")
    with pytest.raises(RedriveError, match="REDRIVE_NOT_RUNNING.*done-1 is finished"):
        redrive_tasks.cancel(config, "done-1", operator="eve")


def test_cancel_from_another_process_stops_at_the_next_chunk(
    config: EngineConfig, config_file: str
) -> None:
    """#13 part 5 item 1 (B5, B8): ``redrive cancel`` here stops a re-drive running in another process.

    It stops between chunks: every chunk it claimed moved (no audit row left
    unmoved), nothing moved twice, the rest stays in the DLQ, and the cancel
    is recorded with who and why.
    """
    args = [
        "dlq",
        "redrive",
        "--config",
        config_file,
        "--all",
        "--to",
        "topic",
        "--chunk-size",
        "1",
        "--rate",
        "2",
        "--redrive-id",
        "slow-1",
        "--yes",
        "--operator",
        "frank",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "retry_engine.ops.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: redrive_tasks.tasks(config).query("moved >= 2").shape[0],
            timeout=120,
            what="two messages moved",
        )
        running = redrive_tasks.task(config, "slow-1")
        assert (running["state"], running["total"], running["operator"]) == (
            "running",
            DEAD,
            "frank",
        )
        assert (
            main(
                [
                    "redrive",
                    "cancel",
                    "--config",
                    config_file,
                    "slow-1",
                    "--reason",
                    "wrong target",
                    "--operator",
                    "ops-lead",
                ]
            )
            == EXIT_OK
        )
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == EXIT_OK, err
    assert "stopped early: cancelled by ops-lead" in out and "wrong target" in out
    state = redrive_tasks.task(config, "slow-1")
    assert (
        state["state"] == "cancelled"
        and 2 <= int(state["moved"]) < DEAD
        and "wrong target" in str(state["detail"])
    )
    # What moved stays moved, once, and matches the audit row for row; nothing is left half-claimed.
    audit = read_audit(config).to_pylist()
    assert all(a["moved"] for a in audit) and len(audit) == state["moved"]
    messages = _messages(config)
    assert Counter(m["props"][PROP_REDRIVE_FROM] for m in messages) == Counter(
        {a["dlq_msg_id"]: 1 for a in audit}
    )
    assert {m["props"][PROP_REDRIVE_ID] for m in messages} == {"slow-1"}
    events = redrive_tasks.read_events(config, "slow-1").to_pylist()
    asked = [e for e in events if e["event"] == "cancel"]
    assert [(e["operator"], e["detail"]) for e in asked] == [("ops-lead", "wrong target")]
    # The rest is still there to re-drive: running the same re-drive again moves exactly what is left.
    rest = redrive.redrive(config, Selection(), target="topic", redrive_id="slow-1")
    assert rest.moved == DEAD - len(audit) and len(_messages(config)) == DEAD


class _Terminal(io.StringIO):
    """Typed answers on a terminal (the prompt only asks when stdin is one)."""

    def isatty(self) -> bool:
        return True


def _dlq(argv: list[str], config_file: str, inp: io.StringIO) -> tuple[int, str, str]:
    args = _parser().parse_args(argv)
    out, err = io.StringIO(), io.StringIO()
    code = run_dlq(args, load_config(config_file), out=out, err=err, inp=inp)
    return code, out.getvalue(), err.getvalue()


def test_a_large_redrive_asks_first(config: EngineConfig, config_file: str) -> None:
    """#13 part 5 item 1: more than N messages asks for confirmation showing the count, unless --yes."""
    argv = [
        "dlq",
        "redrive",
        "--config",
        config_file,
        "--all",
        "--to",
        "retry",
        "--confirm-above",
        "10",
    ]
    before = _versions(config)
    code, _, err = _dlq(argv, config_file, io.StringIO(""))  # not a terminal (a script, a pipe)
    assert code == 2 and f"would move {DEAD} messages (more than 10)" in err and "--yes" in err
    code, _, err = _dlq(argv, config_file, _Terminal("n\n"))
    assert (
        code == 1
        and f"move {DEAD} messages to retry? [y/N]" in err
        and "not confirmed: nothing moved" in err
    )
    assert _versions(config) == before
    code, out, _ = _dlq(argv, config_file, _Terminal("y\n"))
    assert code == EXIT_OK and f"moved {DEAD}" in out


def test_yes_and_the_configured_threshold(config: EngineConfig, tmp_path: Path) -> None:
    """#13 part 5 item 1: dlq.redrive_confirm_above in the config sets N; --yes skips the question."""
    path = tmp_path / "small.toml"
    path.write_text(f'[engine]\nlake = "{config.engine.lake}"\n[dlq]\nredrive_confirm_above = 5\n')
    code, _, err = _dlq(
        [
            "dlq",
            "redrive",
            "--config",
            str(path),
            "--group",
            "billing",
            "--to",
            "topic",
            "--error",
            "Timeout",
        ],
        str(path),
        io.StringIO(""),
    )
    assert code == 2 and "would move 12 messages (more than 5)" in err
    code, out, _ = _dlq(
        [
            "dlq",
            "redrive",
            "--config",
            str(path),
            "--group",
            "billing",
            "--to",
            "topic",
            "--error",
            "Timeout",
            "--yes",
        ],
        str(path),
        io.StringIO(""),
    )
    assert code == EXIT_OK and "moved 12" in out
    # Below the threshold nothing is asked.
    code, out, _ = _dlq(
        ["dlq", "redrive", "--config", str(path), "--id", "DLQ-001", "--to", "topic"],
        str(path),
        io.StringIO(""),
    )
    assert code == EXIT_OK and "moved 1" in out


def test_dry_run_lists_the_first_rows_and_the_count(config: EngineConfig, config_file: str) -> None:
    """#13 part 5 item 1: the dry-run report lists the selected dead letters, bounded, oldest first."""
    code, out, _ = _dlq(
        ["dlq", "redrive", "--config", config_file, "--all", "--to", "topic", "--dry-run"],
        config_file,
        io.StringIO(""),
    )
    assert code == EXIT_OK
    listed = [
        line.split()[1]
        for line in out.splitlines()
        if line.split()[1:2] and line.split()[1].startswith("DLQ-")
    ]
    assert listed == [f"DLQ-{i:03d}" for i in range(20)]
    assert f"... and {DEAD - 20} more ({DEAD} in all" in out and "reason_code" in out


def _interrupt_after_first_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (a KeyboardInterrupt in the main thread) right after a re-drive's first chunk is committed."""
    real = redrive.redrive

    def interrupted(*args: Any, on_progress: Any = None, **kwargs: Any) -> Any:
        def progress(p: redrive.ChunkProgress) -> None:
            if on_progress is not None:
                on_progress(p)
            if p.phase == "moved" and not kwargs.get("dry_run"):
                raise KeyboardInterrupt

        return real(*args, on_progress=progress, **kwargs)

    monkeypatch.setattr(redrive, "redrive", interrupted)


def test_an_interrupted_redrive_exits_130_and_the_same_command_finishes_it(
    config: EngineConfig, config_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README (exit codes): 130 interrupted, re-run to finish; B5/B8: the re-run moves the rest, nothing twice.

    Ctrl-C is a KeyboardInterrupt in the main thread; here it arrives after the first chunk's commit.
    """
    argv = ["dlq", "redrive", "--config", config_file, "--all", "--to", "topic", "--yes", "--chunk-size", "5",
            "--redrive-id", "ctrl-c"]
    _interrupt_after_first_chunk(monkeypatch)
    code, out, err = _dlq(argv, config_file, io.StringIO())
    assert code == 130
    assert err.splitlines()[-1] == "interrupted re-drive ctrl-c: run the same command again to finish it (nothing will move twice)"
    assert len(_messages(config)) == 5
    monkeypatch.undo()
    code, out, err = _dlq(argv, config_file, io.StringIO())
    assert code == EXIT_OK
    moved = Counter(m["props"][PROP_REDRIVE_FROM] for m in _messages(config))
    assert len(moved) == DEAD and set(moved.values()) == {1}


def test_an_interrupted_forced_redrive_names_its_id_and_how_to_finish_it(
    config: EngineConfig, config_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B5/B8: a forced re-drive without --redrive-id gets a fresh id per run, so "run the same command again"
    (what Ctrl-C printed) started another re-drive that moved the first chunk's dead letters twice. The
    message names the run's id and the command that finishes that re-drive; that command moves the rest once."""
    argv = ["dlq", "redrive", "--config", config_file, "--all", "--to", "topic", "--yes", "--chunk-size", "5", "--force"]
    _interrupt_after_first_chunk(monkeypatch)
    code, _, err = _dlq(argv, config_file, io.StringIO())
    assert code == 130 and len(_messages(config)) == 5
    (redrive_id,) = set(read_audit(config).column("redrive_id").to_pylist())
    assert err.splitlines()[-1] == (
        f"interrupted re-drive {redrive_id}: finish it with the same command plus --redrive-id {redrive_id} "
        "(without it, --force starts a new re-drive that moves again what this one moved)"
    )
    monkeypatch.undo()
    code, out, _ = _dlq([*argv, "--redrive-id", redrive_id], config_file, io.StringIO())
    assert code == EXIT_OK and f"re-drive {redrive_id} to topic" in out
    moved = Counter(m["props"][PROP_REDRIVE_FROM] for m in _messages(config))
    assert len(moved) == DEAD and set(moved.values()) == {1}


def test_a_redrive_interrupted_before_it_moves_says_nothing_moved(
    config: EngineConfig, config_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during a dry run (or the one that counts for the confirmation) names no re-drive to finish."""

    def stopped(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(redrive, "redrive", stopped)
    code, _, err = _dlq(["dlq", "redrive", "--config", config_file, "--all", "--to", "topic", "--force"],
                        config_file, io.StringIO())
    assert (code, err.splitlines()[-1]) == (130, "interrupted: nothing moved")
    assert _messages(config) == []


def test_a_target_table_with_a_column_its_writers_added_takes_the_redrive(config: EngineConfig) -> None:
    """R13/B5 (found by a review): a producer added a nullable column to `messages` (a trace id). The re-drive
    claimed its chunk, then failed the append (COLUMN_MISSING_IN_DATA), at every resume: the dead letters were
    claimed for good (resolve, purge and a re-drive to retry: REDRIVE_UNFINISHED). The column is null in the
    moved messages, as Delta's append leaves a column the data lacks."""
    from deltalake import write_deltalake

    from retry_engine.schemas import MESSAGES

    schema = MESSAGES.arrow_schema.append(pa.field("trace_id", pa.string()))
    write_deltalake(config.table_path("messages"), schema.empty_table(), partition_by=list(MESSAGES.partition_by))
    report = redrive.redrive(config, Selection(group="billing"), target="topic")
    moved = _messages(config)
    assert report.moved == DEAD == len(moved) and {m["trace_id"] for m in moved} == {None}
    assert read_audit(config).num_rows == DEAD


@pytest.mark.parametrize("other", ["not_null_column", "another_type", "other_partitions"])
def test_a_chunk_the_target_cannot_take_is_never_claimed(config: EngineConfig, other: str) -> None:
    """The target's own error, before any claim: the dead letters stay free for another command."""
    from deltalake import write_deltalake

    from retry_engine.schemas import MESSAGES

    schema, partitions = MESSAGES.arrow_schema, list(MESSAGES.partition_by)
    if other == "not_null_column":
        schema = schema.append(pa.field("tenant", pa.string(), nullable=False))
    elif other == "another_type":
        schema = schema.set(schema.get_field_index("body"), pa.field("body", pa.string()))
    else:
        partitions = []
    write_deltalake(config.table_path("messages"), schema.empty_table(), partition_by=partitions or None)
    with pytest.raises(Exception, match="COLUMN_MISSING_IN_DATA|COLUMN_TYPE_MISMATCH|PARTITION"):
        redrive.redrive(config, Selection(group="billing"), target="topic")
    assert table_version(config.table_path("redrive_audit")) is None or read_audit(config).num_rows == 0
    assert redrive.redrive(config, Selection(group="billing"), target="retry").moved == DEAD


def test_a_run_a_canceller_took_for_stopped_stops_at_its_next_check(config: EngineConfig) -> None:
    """#13 part 5 item 1 (found by a review): a run silent for STALE_AFTER_S (a long read of the dead letters'
    bodies, a commit slower than that on object storage) reads interrupted, so `redrive cancel` marked it
    cancelled itself and said so (runs=0), but the run looked only for a `cancel` event and moved everything.
    It now stops at its next check, as for a cancel it was sent."""
    tracker = redrive_tasks.RunTracker(config, "silent-1", operator="carol", selection=None, target="topic")
    tracker.start(moved=0, total=5)
    tracker.check_cancel()  # nothing asked yet
    started = redrive_tasks.read_events(config, "silent-1").column("at")[0].as_py()
    late = started + dt.timedelta(seconds=redrive_tasks.STALE_AFTER_S + 1)
    result = redrive_tasks.cancel(config, "silent-1", operator="dave", reason="obsolete", now=late)
    assert (result.state, result.runs) == ("cancelled", 0)
    with pytest.raises(redrive_tasks.Cancelled, match="cancelled by dave.*obsolete"):
        tracker.check_cancel()
    # Another run of the same re-drive (a resume after the cancel) is not stopped by the earlier run's mark.
    again = redrive_tasks.RunTracker(config, "silent-1", operator="carol", selection=None, target="topic")
    again.start(moved=0, total=5)
    again.check_cancel()


def test_a_redrive_pinned_to_its_dry_runs_dlq_version_moves_what_was_confirmed(config: EngineConfig) -> None:
    """(found by a review) The CLI confirmed "move 24 messages?", and the run planned again on the latest DLQ:
    dead letters the engine wrote while the operator read the prompt were moved unseen. Pinned to the version
    the dry run read, the run moves what was shown; the later ones stay for the next re-drive."""
    from tests.dead_letters import dead_letter as letter

    dry = redrive.redrive(config, Selection(group="billing"), target="retry", dry_run=True)
    assert dry.dlq_version is not None and len(dry.plan) == DEAD
    append_dead = [letter(i) for i in range(DEAD, DEAD + 6)]
    from retry_engine.delta import append_arrow
    from retry_engine.schemas import DLQ

    append_arrow(config.table_path("dlq"), pa.Table.from_pylist(append_dead, schema=DLQ.arrow_schema),
                 partition_by=DLQ.partition_by)
    report = redrive.redrive(
        config, Selection(group="billing"), target="retry", redrive_id=dry.redrive_id, dlq_version=dry.dlq_version
    )
    assert report.moved == DEAD and report.dlq_version == dry.dlq_version
    later = redrive.redrive(config, Selection(group="billing"), target="retry", redrive_id="rd-later")
    assert later.moved == 6
    for hostile in (-1, dry.dlq_version + 5, True, "1", 2**70):
        with pytest.raises(Exception, match="INVALID_OPTION"):
            redrive.redrive(config, Selection(group="billing"), target="retry", dry_run=True, dlq_version=hostile)


def test_the_cli_moves_the_count_the_operator_confirmed(config: EngineConfig, config_file: str) -> None:
    """The prompt said "move 24 messages?"; the engine wrote 6 more dead letters of the group while it waited.
    Before, the answer moved 30."""
    from retry_engine.delta import append_arrow
    from retry_engine.schemas import DLQ

    class Meanwhile(_Terminal):
        def readline(self, size: int | None = -1) -> str:
            later = [dead_letter(i) for i in range(DEAD, DEAD + 6)]
            append_arrow(config.table_path("dlq"), pa.Table.from_pylist(later, schema=DLQ.arrow_schema),
                         partition_by=DLQ.partition_by)
            return "y\n"

    argv = ["dlq", "redrive", "--config", config_file, "--group", "billing", "--to", "retry", "--confirm-above", "10"]
    code, out, err = _dlq(argv, config_file, Meanwhile(""))
    assert code == EXIT_OK and f"move {DEAD} messages to retry? [y/N]" in err and f"moved {DEAD}" in out
    assert len(read_audit(config)) == DEAD


@pytest.mark.parametrize("original", ["../../x", "a/b\x1b[2J", None, "x" * 300])
def test_a_dead_letter_whose_original_topic_is_no_topic_name_is_not_redriven_to_it(
    tmp_path: Path, original: str | None
) -> None:
    """(found by a review) A dead letter an earlier release (or another writer) stored with a retry_topic that is
    no topic name was re-driven to a topic of that name (or, null, failed with DELTA_TABLE_UNREADABLE naming no
    dead letter). A one-line error naming it, before any claim; --to retry still takes it."""
    letters = [dead_letter(0), {**dead_letter(1), "retry_topic": original}]
    config = dlq_lake(str(tmp_path / "lake"), letters)
    with pytest.raises(RedriveError, match=r"INVALID_TOPIC_NAME.*dead letter DLQ-001 cannot go back.*--to retry"):
        redrive.redrive(config, Selection(group="billing"), target="topic")
    assert table_version(config.table_path("redrive_audit")) is None or read_audit(config).num_rows == 0
    assert redrive.redrive(config, Selection(group="billing"), target="retry").moved == 2


@pytest.mark.parametrize("group", ["%RETRY%pay", "%DLQ%pay"])
def test_a_dead_letter_of_a_group_named_like_a_retry_topic_goes_back_only_to_its_topic(tmp_path: Path, group: str) -> None:
    """(found by the upgrade review) The README tells an operator to re-drive such a group's dead letters before
    upgrading; --to retry moved them to %RETRY%%RETRY%pay, which no Consumer reads (and marked them re-driven).
    A one-line error before any claim; --to topic takes them."""
    config = dlq_lake(str(tmp_path / "lake"), [dead_letter(0, group=group), dead_letter(1, group=group)])
    with pytest.raises(RedriveError, match=r"INVALID_GROUP_NAME.*named like a retry or dead-letter topic.*--to topic"):
        redrive.redrive(config, Selection(group=group), target="retry")
    assert table_version(config.table_path("redrive_audit")) is None or read_audit(config).num_rows == 0
    assert redrive.redrive(config, Selection(group=group), target="topic").moved == 2
