"""Resolve and purge dead letters (#13 part 5, item 2; SPEC R9, B5, B8): marked with a reason, audited,
left out of listings and re-drives, removed after a retention; a resolve racing a re-drive.

Real Delta tables in temp folders, written with delta-rs (no Spark needed);
the race runs in two OS processes.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from retry_engine.clients import dlq
from retry_engine.clients.dlq import Selection
from retry_engine.config import EngineConfig, parse_config
from retry_engine.delta import table_version
from retry_engine.errors import ConfigError, RedriveError
from retry_engine.ops import redrive, resolve
from retry_engine.ops.audit import read_audit
from retry_engine.ops.cli import EXIT_OK, main
from retry_engine.schemas import DLQ
from tests.dead_letters import T0, dead_letter, dlq_lake

DEAD = 12
# Ids a hostile producer could mint: quotes, SQL, escapes, control characters, non-ASCII.
ODD_IDS = ["a'b", "x') OR (1=1", "c\\d", "line\nbreak", "ünï😀", "'';--", 'q"q', "nul\x00"]


@pytest.fixture
def config(tmp_path: Path) -> EngineConfig:
    return dlq_lake(str(tmp_path / "lake"), [dead_letter(i) for i in range(DEAD)])


@pytest.fixture
def config_file(config: EngineConfig, tmp_path: Path) -> str:
    path = tmp_path / "retry-engine.toml"
    path.write_text(f'[engine]\nlake = "{config.engine.lake}"\n')
    return str(path)


def _listed(config: EngineConfig, **kwargs: Any) -> list[str]:
    frame = dlq.dead_letters(config, **kwargs)
    assert isinstance(frame, pd.DataFrame)
    return list(frame["msg_id"])


def _dlq_ids(config: EngineConfig) -> list[str]:
    return sorted(
        DeltaTable(config.table_path("dlq")).to_pyarrow_table().column("msg_id").to_pylist()
    )


def test_resolve_marks_audits_and_hides_without_deleting(config: EngineConfig) -> None:
    """#13 part 5 item 2 (R9): resolved dead letters stay in the DLQ table, are audited (who, when, why) and
    are left out of dlq list (unless asked) and of every later re-drive, forced too."""
    dlq_version = table_version(config.table_path("dlq"))
    timeouts = Selection(group="billing", error_pattern="Timeout")  # the even ids: 6 of 12
    report = resolve.resolve(
        config, timeouts, reason="  orders cancelled upstream ", operator="alice"
    )
    assert (report.matched, report.resolved, report.already_resolved, report.redriven) == (
        6,
        6,
        0,
        0,
    )
    assert (
        table_version(config.table_path("dlq")) == dlq_version and len(_dlq_ids(config)) == DEAD
    )  # nothing deleted
    audit = [a for a in read_audit(config).to_pylist() if a["redrive_id"] == report.resolution_id]
    assert sorted(a["dlq_msg_id"] for a in audit) == [f"DLQ-{i:03d}" for i in range(0, DEAD, 2)]
    assert {(a["target"], a["operator"], a["note"], a["moved"]) for a in audit} == {
        ("resolve", "alice", "orders cancelled upstream", True)
    }
    assert all(a["redriven_at"] <= dt.datetime.now(dt.UTC) for a in audit)
    assert json.loads(audit[0]["selection"]) == {"group": "billing", "error_pattern": "Timeout"}

    assert _listed(config) == [f"DLQ-{i:03d}" for i in range(1, DEAD, 2)]
    everything = dlq.dead_letters(config, include_resolved=True)
    assert isinstance(everything, pd.DataFrame) and len(everything) == DEAD
    marks = dict(zip(everything["msg_id"], everything["resolution"], strict=True))
    assert marks["DLQ-000"].startswith("resolved by alice at ") and marks["DLQ-000"].endswith(
        ": orders cancelled upstream"
    )
    assert marks["DLQ-001"] is None
    history = dlq.history(config, "ORIGIN-000")
    assert "resolved" in list(history["event"]) and "orders cancelled upstream" in " ".join(
        map(str, history["detail"])
    )

    # Again: nothing more is marked.
    again = resolve.resolve(config, timeouts, reason="again", operator="bob")
    assert (again.resolved, again.already_resolved) == (0, 6)
    # Re-drives never take them, even forced.
    for force in (False, True):
        moved = redrive.redrive(config, Selection(group="billing"), target="topic", force=force)
        assert moved.resolved == 6
    messages = DeltaTable(config.table_path("messages")).to_pyarrow_table().to_pylist()
    sources = sorted(dict(m["properties"])[dlq.PROP_REDRIVE_FROM] for m in messages)
    assert sources == sorted(
        [f"DLQ-{i:03d}" for i in range(1, DEAD, 2)] * 2
    )  # the odd ones, once plus once forced


def test_stats_without_bodies_count_what_the_listing_shows(config: EngineConfig) -> None:
    """`dlq stats` reads no body (it built the whole listing): resolved, re-driven and a selection's
    filter count as in the listing; ``read_dlq`` reads what a selection needs beside the asked columns."""
    resolve.resolve(config, Selection(group="billing", ids=("DLQ-000", "DLQ-001")), reason="gone", operator="alice")
    redrive.redrive(config, Selection(group="billing", ids=("DLQ-002",)), target="topic")
    odd = Selection(error_pattern="BadJson")
    assert dlq.read_dlq(config, odd, columns=("msg_id",)).to_pylist() == [
        {"msg_id": f"DLQ-{i:03d}"} for i in range(1, DEAD, 2)
    ]
    for selection in (None, odd):
        for include in (False, True):
            listing = dlq.dead_letters(config, selection, include_resolved=include)
            stats = dlq.summary(config, selection, by=["group", "error_class"], include_resolved=include)
            assert isinstance(listing, pd.DataFrame) and isinstance(stats, pd.DataFrame)
            want = {
                (g, e): (len(rows), int(rows["redriven_by"].notna().sum()))
                for (g, e), rows in listing.groupby(["consumer_group", "error_class"])
            }
            got = {(r.consumer_group, r.error_class): (r.dead_letters, r.redriven) for r in stats.itertuples()}
            assert got == want and sum(n for n, _ in got.values()) == len(listing) > 0


def test_resolve_leaves_redriven_unless_asked_and_refuses_unfinished(config: EngineConfig) -> None:
    """#13 part 5 item 2: a dead letter a re-drive moved is skipped (--include-redriven marks it); one a
    re-drive claimed but has not moved is refused with REDRIVE_UNFINISHED naming the re-drive."""
    redrive.redrive(
        config, Selection(ids=("DLQ-000", "DLQ-001")), target="topic", redrive_id="done-1"
    )

    class Stop(Exception):
        pass

    def stop(p: redrive.ChunkProgress) -> None:
        if p.phase == "planned":
            raise Stop

    with pytest.raises(Stop):
        redrive.redrive(
            config,
            Selection(ids=("DLQ-002",)),
            target="topic",
            redrive_id="half-1",
            on_progress=stop,
        )
    before = table_version(config.table_path("redrive_audit"))
    with pytest.raises(RedriveError, match=r"REDRIVE_UNFINISHED.*half-1"):
        resolve.resolve(config, Selection(), reason="all of it")
    assert table_version(config.table_path("redrive_audit")) == before
    skip = resolve.resolve(config, Selection(ids=("DLQ-000", "DLQ-001", "DLQ-003")), reason="done")
    assert (skip.resolved, skip.redriven) == (1, 2)
    both = resolve.resolve(
        config, Selection(ids=("DLQ-000", "DLQ-001")), reason="done", include_redriven=True
    )
    assert (both.resolved, both.redriven) == (2, 0)


@pytest.mark.parametrize("reason", ["", "   ", "\n\t", None, 42, "x" * 2001])
def test_a_reason_is_required(config: EngineConfig, reason: Any) -> None:
    """#13 part 5 item 2, hostile values: no reason, a blank one, a non-string or a huge one is INVALID_REASON."""
    with pytest.raises(ConfigError, match="INVALID_REASON"):
        resolve.resolve(config, Selection(), reason=reason)
    assert table_version(config.table_path("redrive_audit")) is None


def test_cli_resolve_purge_list_and_usage(
    config: EngineConfig, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """#13 part 5 item 2: the commands, their required --reason and filter, and dlq list --include-resolved."""
    with pytest.raises(SystemExit) as usage:
        main(["dlq", "resolve", "--config", config_file, "--all"])
    assert usage.value.code == 2 and "--reason" in capsys.readouterr().err
    assert main(["dlq", "resolve", "--config", config_file, "--reason", "x"]) == 2
    assert "needs a filter" in capsys.readouterr().err
    assert main(["dlq", "resolve", "--config", config_file, "--all", "--reason", " "]) == 1
    assert "INVALID_REASON" in capsys.readouterr().err

    assert (
        main(
            [
                "dlq",
                "purge",
                "--config",
                config_file,
                "--id",
                "DLQ-003",
                "--reason",
                "dup",
                "--dry-run",
            ]
        )
        == EXIT_OK
    )
    out = capsys.readouterr().out
    assert "dry run: nothing changed" in out and "would be purged 1" in out and "DLQ-003" in out
    assert table_version(config.table_path("redrive_audit")) is None
    assert (
        main(
            [
                "dlq",
                "purge",
                "--config",
                config_file,
                "--id",
                "DLQ-003",
                "--reason-code",
                "MAX_RECONSUME_TIMES",
                "--reason",
                "duplicate order",
                "--operator",
                "carol",
            ]
        )
        == EXIT_OK
    )
    assert "purged 1" in capsys.readouterr().out
    assert main(["dlq", "list", "--config", config_file, "--format", "json"]) == EXIT_OK
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    assert len(rows) == DEAD - 1 and "DLQ-003" not in {r["msg_id"] for r in rows}
    assert (
        main(["dlq", "list", "--config", config_file, "--include-resolved", "--id", "DLQ-003"])
        == EXIT_OK
    )
    out = capsys.readouterr().out
    assert "resolution" in out and "purged by carol" in out
    assert (
        main(["dlq", "stats", "--config", config_file, "--by", "group", "--format", "csv"])
        == EXIT_OK
    )
    assert capsys.readouterr().out.splitlines()[1].startswith(f"billing,{DEAD - 1},")


def test_retention_removes_purged_at_once_and_resolved_when_old(tmp_path: Path) -> None:
    """#13 part 5 item 2: expire deletes purged dead letters at once and resolved ones older than the
    retention from the DLQ table; the audit rows stay; ids with odd characters delete exactly themselves."""
    rows = [dead_letter(i) for i in range(DEAD)] + [
        dead_letter(100 + n, msg_id=i) for n, i in enumerate(ODD_IDS)
    ]
    config = dlq_lake(str(tmp_path / "lake"), rows)
    config = parse_config(
        {"engine": {"lake": config.engine.lake}, "dlq": {"resolved_retention": "7d"}}
    )
    purged = resolve.resolve(
        config, Selection(ids=tuple(ODD_IDS[:4])), reason="junk", action="purge"
    )
    resolved = resolve.resolve(config, Selection(ids=(*ODD_IDS[4:6], "DLQ-000")), reason="handled")
    assert (purged.resolved, resolved.resolved) == (4, 3)
    audit_rows = read_audit(config).num_rows

    dry = resolve.expire(config, dry_run=True)
    assert (dry.removed, dry.purged) == (4, 4) and len(_dlq_ids(config)) == len(rows)
    now = dt.datetime.now(dt.UTC)
    first = resolve.expire(config, now=now + dt.timedelta(days=6))
    assert (first.removed, first.purged, first.retention) == (4, 4, "7d")
    assert _dlq_ids(config) == sorted(set(r["msg_id"] for r in rows) - set(ODD_IDS[:4]))
    assert (resolve.expire(config, now=now + dt.timedelta(days=6)).removed) == 0  # nothing twice
    late = resolve.expire(config, now=now + dt.timedelta(days=8))
    assert (late.removed, late.purged) == (3, 0)
    assert _dlq_ids(config) == sorted(
        set(r["msg_id"] for r in rows) - set(ODD_IDS[:6]) - {"DLQ-000"}
    )
    assert (
        read_audit(config).num_rows == audit_rows
    )  # the audit keeps who resolved what, when and why
    history = dlq.history(config, "ORIGIN-000")
    assert list(history["event"]) == ["resolved"]
    # The listing reads the table that is left; an explicit retention overrides the config.
    assert len(_listed(config, include_resolved=True)) == len(rows) - 7
    assert resolve.expire(config, retention="1d").removed == 0


def test_expire_cli(
    config: EngineConfig, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """#13 part 5 item 2: dlq expire says what it removed; a bad --retention is a clear error."""
    resolve.resolve(config, Selection(ids=("DLQ-005",)), reason="dup", action="purge")
    assert main(["dlq", "expire", "--config", config_file, "--dry-run"]) == EXIT_OK
    assert "would remove 1 dead letters" in capsys.readouterr().out and "DLQ-005" in _dlq_ids(
        config
    )
    assert main(["dlq", "expire", "--config", config_file]) == EXIT_OK
    assert "removed 1 dead letters from the DLQ table (1 purged" in capsys.readouterr().out
    assert "DLQ-005" not in _dlq_ids(config)
    assert main(["dlq", "expire", "--config", config_file, "--retention", "soon"]) == 1
    assert "[INVALID_DURATION] bad duration 'soon'" in capsys.readouterr().err
    # Hostile: a retention past what a time can go back (an OverflowError traceback before).
    for retention in ("1000000d", "9" * 30 + "d"):
        assert main(["dlq", "expire", "--config", config_file, "--retention", retention]) == 1
        assert "is longer than 36500d" in capsys.readouterr().err
    # An empty --retention is no retention (it was the config's 30d, silently; found by review).
    for retention in ("", " "):
        assert main(["dlq", "expire", "--config", config_file, "--retention", retention]) == 1
        assert "retry-engine: [" in capsys.readouterr().err


def test_a_resolve_committed_while_a_redrive_runs_makes_it_skip(config: EngineConfig) -> None:
    """#13 part 5 item 2 (B8): a re-drive that planned before a resolve committed does not move the
    resolved dead letters: its next claim fails (the audit table moved), and its new plan skips them."""
    rest = tuple(f"DLQ-{i:03d}" for i in range(1, DEAD))
    resolved: list[resolve.ResolveReport] = []

    def resolve_the_rest(p: redrive.ChunkProgress) -> None:
        if p.phase == "moved" and p.chunk == 0:
            resolved.append(resolve.resolve(config, Selection(ids=rest), reason="handled by hand"))

    report = redrive.redrive(
        config,
        Selection(group="billing"),
        target="topic",
        chunk_size=1,
        on_progress=resolve_the_rest,
    )
    assert resolved[0].resolved == DEAD - 1 and (report.moved, report.resolved) == (1, DEAD - 1)
    messages = DeltaTable(config.table_path("messages")).to_pyarrow_table().to_pylist()
    assert [dict(m["properties"])[dlq.PROP_REDRIVE_FROM] for m in messages] == ["DLQ-000"]


def test_a_redrive_committed_while_a_resolve_plans_wins(config: EngineConfig) -> None:
    """#13 part 5 item 2 (B8): a resolve whose plan is overtaken by a re-drive's claim of the same dead
    letters does not mark them: its claim fails (the audit table moved), and its new plan skips them."""
    plans: list[list[str]] = []

    def redrive_first(plan: resolve.ResolveReport) -> None:
        plans.append(list(plan.rows["msg_id"]))
        if len(plans) == 1:
            redrive.redrive(
                config, Selection(ids=("DLQ-000", "DLQ-001")), target="topic", redrive_id="quick-1"
            )

    report = resolve.resolve(
        config, Selection(group="billing"), reason="handled", on_planned=redrive_first
    )
    assert plans[0] == [f"DLQ-{i:03d}" for i in range(DEAD)]
    assert plans[1] == [
        f"DLQ-{i:03d}" for i in range(2, DEAD)
    ]  # planned again, without the re-driven two
    assert (report.resolved, report.redriven) == (DEAD - 2, 2)
    audit = read_audit(config).to_pylist()
    redriven = {a["dlq_msg_id"] for a in audit if a["target"] == "topic"}
    resolved = {a["dlq_msg_id"] for a in audit if a["target"] == "resolve"}
    assert (
        redriven == {"DLQ-000", "DLQ-001"} and not redriven & resolved and len(resolved) == DEAD - 2
    )


def _race_worker(root: str, who: str, barrier: Any, out: Any) -> None:
    try:
        config = parse_config({"engine": {"lake": root}})
        barrier.wait(timeout=120)
        if who == "redrive":
            report = redrive.redrive(
                config, Selection(group="billing"), target="topic", chunk_size=1
            )
            out.put((who, "ok", report.moved))
        else:
            result = resolve.resolve(config, Selection(group="billing"), reason="race")
            out.put((who, "ok", result.resolved))
    except RedriveError as exc:
        out.put((who, exc.code, str(exc)))
    except BaseException as exc:  # anything else fails the test, in the parent
        out.put((who, "crash", repr(exc)))
        barrier.abort()


@pytest.mark.parametrize("round_", range(2))
def test_resolve_racing_a_redrive_at_most_one_wins(tmp_path: Path, round_: int) -> None:
    """#13 part 5 item 2 (B5, B8): a resolve and a re-drive of the same dead letters start at the same
    moment in two processes: no dead letter is both re-driven and resolved, and the audit matches."""
    config = dlq_lake(str(tmp_path / "lake"), [dead_letter(i) for i in range(DEAD)])
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_race_worker, args=(config.engine.lake, who, barrier, out))
        for who in ("redrive", "resolve")
    ]
    for p in procs:
        p.start()
    try:
        results = {r[0]: r for r in (out.get(timeout=300) for _ in procs)}
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    assert not [r for r in results.values() if r[1] == "crash"], results
    # The loser of a claim either plans again or, meeting the other's unfinished claim, says so.
    assert {r[1] for r in results.values()} <= {"ok", "REDRIVE_UNFINISHED"}, results
    audit = read_audit(config).to_pylist()
    redriven = {a["dlq_msg_id"] for a in audit if a["target"] == "topic" and a["moved"]}
    resolved = {a["dlq_msg_id"] for a in audit if a["target"] == "resolve"}
    assert not redriven & resolved, "a dead letter was both re-driven and resolved"
    assert all(a["moved"] for a in audit if a["target"] == "topic") or results["redrive"][1] != "ok"
    if table_version(config.table_path("messages")) is not None:
        messages = DeltaTable(config.table_path("messages")).to_pyarrow_table().to_pylist()
        assert sorted(dict(m["properties"])[dlq.PROP_REDRIVE_FROM] for m in messages) == sorted(
            redriven
        )
    # Whatever each got, the counts they report are what the audit shows.
    if results["resolve"][1] == "ok":
        assert results["resolve"][2] == len(resolved)
    if results["redrive"][1] == "ok":
        assert results["redrive"][2] == len(redriven)


@pytest.mark.parametrize("kind", ["text", "no zone", "text, one file"])
def test_resolve_and_expire_on_a_dlq_another_writer_changed(tmp_path: Path, kind: str) -> None:
    """Bad input (SPEC, bad input; #13 part 5 item 2): a DLQ another writer rewrote with
    `dead_lettered_at` as text or without a zone, partitioned by group or not. A resolve selected by
    time marks the same dead letters as on the engine's own DLQ, and expire removes exactly the purged
    ones: every other dead letter stays, with the other writer's column type (no rewrite of the schema)."""
    rows = pa.Table.from_pylist(
        [dead_letter(i) for i in range(DEAD)] + [dead_letter(50 + i, group="other") for i in range(3)],
        schema=DLQ.arrow_schema,
    )
    at = rows.column("dead_lettered_at")
    at = (pa.array([t.isoformat() for t in at.to_pylist()], pa.string()) if kind.startswith("text")
          else at.cast(pa.timestamp("us")))
    rows = rows.set_column(rows.schema.get_field_index("dead_lettered_at"), "dead_lettered_at", at)
    root = tmp_path / "lake"
    write_deltalake(str(root / "dlq"), rows, partition_by=None if "one file" in kind else ["consumer_group"])
    config = parse_config({"engine": {"lake": str(root)}})
    before = DeltaTable(str(root / "dlq")).schema().to_arrow()

    since = T0 + dt.timedelta(seconds=DEAD - 4)  # the last four of billing, none of "other" (50 s on)
    window = Selection(group="billing", since=since)
    dry = resolve.resolve(config, window, reason="dup", action="purge", dry_run=True)
    assert list(dry.rows["msg_id"]) == [f"DLQ-{i:03d}" for i in range(DEAD - 4, DEAD)]
    purged = resolve.resolve(config, window, reason="dup", action="purge")
    assert purged.resolved == 4
    assert resolve.resolve(config, Selection(ids=("DLQ-000",)), reason="handled").resolved == 1
    assert sorted(_listed(config)) == sorted(
        {f"DLQ-{i:03d}" for i in range(1, DEAD - 4)} | {f"DLQ-{50 + i:03d}" for i in range(3)}
    )

    removed = resolve.expire(config)
    assert (removed.removed, removed.purged) == (4, 4)
    assert _dlq_ids(config) == sorted(
        {f"DLQ-{i:03d}" for i in range(DEAD - 4)} | {f"DLQ-{50 + i:03d}" for i in range(3)}
    )
    after = DeltaTable(str(root / "dlq"))
    assert after.schema().to_arrow() == before  # the other writer's types, kept
    kept = after.to_pyarrow_table()
    assert sorted(zip(kept.column("msg_id").to_pylist(), kept.column("dead_lettered_at").to_pylist(),
                      strict=True)) == sorted(
        (m, t) for m, t in zip(rows.column("msg_id").to_pylist(), at.to_pylist(), strict=True)
        if m not in {f"DLQ-{i:03d}" for i in range(DEAD - 4, DEAD)}
    )
    assert resolve.expire(config).removed == 0
