"""Exactly once per lake, the owner lease, and ``run --once`` (SPEC B1/B8, #12 items 8 and 20), on real Spark and Delta."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame

from retry_engine.core import engine
from retry_engine.core.lease import LakeLease, Owner, read_state
from retry_engine.core.outputs import BatchWriter
from retry_engine.delta import ensure_query_id
from retry_engine.errors import LakeOwnedError, LakeResumeError
from retry_engine.ops import status
from tests.builders import Result
from tests.lakehouse import Lake, wait_for

pytestmark = pytest.mark.slow

# Group "slow" retries after an hour: its failures stay pending in the schedule stage.
SLOW = {"slow": {"backoff": {"levels": "1h"}}}


def lake_with(tmp_path: Path, checkpoint: str, **engine_conf: Any) -> Lake:
    """One lake (``tmp_path/lake``) seen through the checkpoint ``tmp_path/<checkpoint>``."""
    return Lake.make(
        tmp_path / "lake",
        engine={"checkpoint": str(tmp_path / checkpoint), **engine_conf},
        groups=SLOW,
    )


def phase(tag: str, *, slow_failure: bool = False) -> list[Result]:
    """Results that settle at once: acknowledged, dead-lettered (R5: level < 0), quarantined (unknown status)."""
    results = [
        Result.of(f"{tag}-ok").ok(),
        Result.of(f"{tag}-dlq").failed(delay_level_when_next_consume=-1),
        Result.of(f"{tag}-bad").with_(status="WHATEVER"),
    ]
    if slow_failure:
        results.append(Result.of(f"{tag}-slow", group="slow").failed())
    return results


def per_result(lake: Lake, table: str, column: str) -> Counter[str]:
    return Counter(r[column] for r in lake.rows(table))


def test_new_checkpoint_resumes_after_the_lake_and_writes_nothing_twice(
    spark: Any, tmp_path: Path
) -> None:
    """B8 / #12 item 8: a new checkpoint decides no consume result the lake already decided, and skips none.

    Checkpoint c1 decides phase 1; c2 (new) then decides phase 2 only. Phase 2
    leaves a retry pending (1h) in c2's state, so c3 (new) refuses to start
    (LAKE_PENDING_RETRIES) until told to discard it, then decides phase 3 only;
    c4 (new) then starts without being told again (the lake records the discard, also when c3's first run
    recorded no batch and its second was not told again).
    Every result ends with one outcome (SPEC bad-input rule), every dead
    letter exists once (B1), and the refused start left the lake free.
    """
    first, second, third = phase("p1"), phase("p2", slow_failure=True), phase("p3")
    lake = lake_with(tmp_path, "c1")
    lake.write_results(first)
    engine.run_once(spark, lake.config)

    lake.write_results(second)
    engine.run_once(spark, lake_with(tmp_path, "c2").config)
    state = read_state(str(tmp_path / "lake"))
    assert (
        state is not None and state.last_batch is not None and state.last_batch.pending_retries == 1
    )

    c3 = lake_with(tmp_path, "c3").config
    with pytest.raises(
        LakeResumeError, match=r"LAKE_PENDING_RETRIES.*1 retries.*--discard-pending"
    ):
        engine.start(spark, c3)
    # Its first run has nothing new to read, so it records no batch (found by a review): its restart, without
    # the flag, still records the discard with its first batch (it was lost, and c4 was refused for it).
    engine.run_once(spark, c3, discard_pending=True)
    lake.write_results(third)
    engine.run_once(spark, c3)
    # The lake says the retry was given up (#14): not pending in c3's record nor in the tables, and the
    # next new checkpoint starts without being told to discard it again.
    state = read_state(str(tmp_path / "lake"))
    assert state is not None and state.discarded_before is not None
    assert state.last_batch is not None and state.last_batch.pending_retries == 0
    assert status.lake_counts(c3)[1] == 0
    fourth = phase("p4")
    lake.write_results(fourth)
    engine.run_once(spark, lake_with(tmp_path, "c4").config)

    results = [r.values["result_id"] for r in first + second + third + fourth]
    outcomes = per_result(lake, "outcomes", "result_id")
    assert {rid: outcomes[rid] for rid in results} == {rid: 1 for rid in results}
    assert sum(outcomes.values()) == len(results)
    dead = per_result(lake, "dlq", "source_result_id")
    assert sorted(dead.values()) == [1, 1, 1, 1] and len(dead) == 4
    assert sum(per_result(lake, "quarantine", "result_id").values()) == 4
    assert (
        lake.rows("retry") == []
    )  # the slow retry was discarded with c2's state, never delivered early


def test_second_engine_refuses_and_a_take_over_fences_the_first(spark: Any, tmp_path: Path) -> None:
    """B8 / #12 item 8: engine B refuses while A runs; after B takes over, A's next batch is refused and A stops.

    Nothing of the batch A could not commit is written (its results have no
    outcome), and what A committed before stays exactly once.
    """
    # A long lease: no heartbeat lands during the test, so it is A's next commit that finds the take-over.
    lake = lake_with(tmp_path, "a", lease_timeout="1h")
    before, after = phase("before"), phase("after")
    lake.write_results(before)
    query = engine.start(spark, lake.config)
    try:
        ids = {r.values["result_id"] for r in before}
        wait_for(
            lambda: ids <= set(per_result(lake, "outcomes", "result_id")),
            what="engine A's first outcomes",
        )
        with pytest.raises(LakeOwnedError, match="LAKE_OWNED") as refused:
            engine.start(spark, lake_with(tmp_path, "b").config)
        for part in (
            f"query id {query.id}",
            f"pid {Owner.this_process(query_id='', checkpoint='').pid}",
            "--take-over",
        ):
            assert part in str(refused.value)

        taker = LakeLease(
            str(tmp_path / "lake"),
            Owner.this_process(query_id="engine-B", checkpoint=str(tmp_path / "b")),
        )
        taker.acquire(take_over=True)
        lake.write_results(after)
        wait_for(
            lambda: not query.isActive, timeout=120, what="engine A to stop after the take-over"
        )
        error = query.exception()
        assert error is not None and "LEASE_LOST" in str(error)
    finally:
        engine.stop(query)
    outcomes = per_result(lake, "outcomes", "result_id")
    assert {r.values["result_id"]: outcomes[r.values["result_id"]] for r in before + after} == {
        **{r.values["result_id"]: 1 for r in before},
        **{r.values["result_id"]: 0 for r in after},
    }
    state = read_state(str(tmp_path / "lake"))
    assert state is not None and state.epoch == 2 and state.owner is not None
    assert state.owner.query_id == "engine-B" and not state.released


def test_once_processes_new_input_after_a_stop_mid_batch(spark: Any, tmp_path: Path) -> None:
    """#12 item 20: ``--once`` after a stop that left a planned, uncommitted (empty) batch still decides new input.

    The first run commits batch 0 and fails inside batch 1 (a no-data batch the
    schedule stage's timeout asks for): its offset log is written, its commit
    log is not. ``run_once`` replays that empty batch first, and must go on
    until it has read the table version it saw at its start.
    """
    lake = lake_with(tmp_path, "once")
    lake.write_results(phase("early", slow_failure=True))
    checkpoint = lake.config.checkpoint_path
    inner = BatchWriter(lake.config, ensure_query_id(checkpoint))

    def stop_in_batch_1(batch: DataFrame, batch_id: int) -> None:
        if batch_id >= 1:
            raise RuntimeError("stopped mid-batch")
        inner(batch, batch_id)

    query = engine.start(spark, lake.config, writer=stop_in_batch_1)
    try:
        wait_for(
            lambda: query.exception() is not None,
            timeout=120,
            what="the first run to stop in batch 1",
        )
    finally:
        engine.stop(query)
    assert (Path(checkpoint) / "offsets" / "1").exists() and not (
        Path(checkpoint) / "commits" / "1"
    ).exists()

    late = Result.of("late-ok").ok()
    lake.write_results([late])
    engine.run_once(spark, lake.config)

    outcomes = {r["result_id"]: r["outcome"] for r in lake.rows("outcomes")}
    assert outcomes.get(late.values["result_id"]) == "acknowledged"
    assert len(lake.rows("outcomes")) == 5  # 4 early results + the late one, each once


def test_cli_run_refuses_an_owned_lake_until_take_over(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """B8 / #12 item 8 through the command line: `run` names the owner; `run --take-over` proceeds.

    The owner is an engine on another host, so only its lease's expiry or a
    take-over can free the lake.
    """
    import datetime as dt

    from retry_engine.ops.cli import EXIT_ERROR, EXIT_OK, main
    from tests.lakehouse import FAST_LEVELS

    lake = lake_with(tmp_path, "cli")
    conf = tmp_path / "engine.toml"
    conf.write_text(
        f'[engine]\nlake = "{tmp_path / "lake"}"\ncheckpoint = "{tmp_path / "cli"}"\ntrigger_interval = "200ms"\n'
        f'message_delay_level = "{FAST_LEVELS}"\nstate_bucket = "1s"\n'
    )
    since = dt.datetime(2026, 11, 23, 9, 30, tzinfo=dt.UTC)
    other = LakeLease(
        str(tmp_path / "lake"), Owner("other-host.example", 4242, "engine-X", "/elsewhere", since)
    )
    other.acquire()
    results = phase("cli")
    lake.write_results(results)

    assert main(["run", "--once", "--config", str(conf)]) == EXIT_ERROR
    err = capsys.readouterr().err
    for part in (
        "LAKE_OWNED",
        "host other-host.example",
        "pid 4242",
        "query id engine-X",
        "2026-11-23T09:30:00",
        "--take-over",
    ):
        assert part in err
    assert lake.rows("outcomes") == []

    assert main(["run", "--once", "--take-over", "--config", str(conf)]) == EXIT_OK
    assert sorted(r["result_id"] for r in lake.rows("outcomes")) == sorted(
        r.values["result_id"] for r in results
    )
    state = read_state(str(tmp_path / "lake"))
    assert state is not None and state.epoch == 2 and state.released
    # #13 part 2: the run ended because its input was processed, and says so.
    terminated = [r for r in lake.rows("progress") if r["event"] == "terminated"]
    assert [(r["reason"], r["exception"]) for r in terminated] == [("finished", None)]


def test_new_checkpoint_resumes_inside_a_commit_the_last_batch_read_in_part(
    spark: Any, tmp_path: Path
) -> None:
    """B8 / #12 item 8: the lake's last batch read file 0 of a 2-file commit; a new checkpoint reads file 1 only.

    ``max_files_per_trigger = 1`` ends a batch inside a commit. The first
    engine stops after that batch (its next batch fails before recording);
    the new checkpoint starts at that commit and drops the rows of the files
    already read (position floor), so every result has exactly one outcome.
    """
    from deltalake import WriterProperties, write_deltalake

    from tests.builders import results_table

    lake = lake_with(tmp_path, "c1", max_files_per_trigger=1)
    first = Result.of("v0-ok").ok()
    lake.write_results([first])
    split = [Result.of(f"v1-{i}").ok() for i in range(4)]
    split_ids = {r.values["result_id"] for r in split}
    inner: list[BatchWriter] = []

    def until_split_started(batch: DataFrame, batch_id: int) -> None:
        if split_ids & set(per_result(lake, "outcomes", "result_id")):
            raise RuntimeError("stopped after the first file of the split commit")
        if not inner:  # the engine's own writer, with the lease start() took
            lease = engine._HELD[lake_query_id].lease
            inner.append(
                BatchWriter(
                    lake.config, lake_query_id, lease=lease, checkpoint=lake.config.checkpoint_path
                )
            )
        inner[0](batch, batch_id)

    lake_query_id = ensure_query_id(lake.config.checkpoint_path)
    query = engine.start(spark, lake.config, writer=until_split_started)
    try:
        wait_for(
            lambda: per_result(lake, "outcomes", "result_id")[first.values["result_id"]],
            timeout=180,
            what="commit 0 decided",
        )
        # One commit, two files (two Arrow batches, each its own file).
        write_deltalake(
            lake.path("consume_results"),
            results_table(split).to_batches(max_chunksize=2),
            mode="append",
            target_file_size=1,
            writer_properties=WriterProperties(write_batch_size=2, max_row_group_size=2),
        )
        wait_for(
            lambda: query.exception() is not None, timeout=120, what="the first engine to stop"
        )
    finally:
        engine.stop(query)
    state = read_state(str(tmp_path / "lake"))
    assert (
        state is not None
        and state.last_batch is not None
        and state.last_batch.source_end is not None
    )
    end = state.last_batch.source_end
    assert (end["reservoirVersion"], end["index"], end["isStartingVersion"]) == (
        1,
        0,
        False,
    )  # inside commit 1
    decided_by_first = split_ids & set(per_result(lake, "outcomes", "result_id"))
    assert 0 < len(decided_by_first) < len(split_ids)

    engine.run_once(spark, lake_with(tmp_path, "c2", max_files_per_trigger=1).config)
    outcomes = per_result(lake, "outcomes", "result_id")
    expected = {rid: 1 for rid in split_ids | {first.values["result_id"]}}
    assert dict(outcomes) == expected


def test_a_kill_while_writing_the_first_offset_does_not_brick_the_checkpoint(
    spark: Any, tmp_path: Path
) -> None:
    """B1, R8: SIGKILL between Spark writing ``offsets/.0.<uuid>.tmp`` and renaming it left the temp file;
    Spark 4 then failed batch 0 on every restart (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). Found by the
    crash test (seed 3307081397); the engine now removes such temp files before its query starts."""
    lake = Lake.make(tmp_path)
    checkpoint = Path(lake.config.checkpoint_path)
    ensure_query_id(str(checkpoint))
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    orphan = checkpoint / "offsets" / ".0.f78cd5e1-a500-4f4a-9bb4-d556aba01259.tmp"
    orphan.write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}\n{"reservoirVersion":0}\n'
    )
    (checkpoint / "offsets" / f".{orphan.name}.crc").write_bytes(b"crc\x00")
    lake.write_results([Result.of("K1").failed()])
    query = engine.start(spark, lake.config)
    try:
        outcomes = wait_for(
            lambda: query.exception() or lake.rows("outcomes"), timeout=180, what="K1's outcome"
        )
        assert query.exception() is None, query.exception()
    finally:
        engine.stop(query)
    assert [(o["msg_id"], o["outcome"]) for o in outcomes] == [("K1", "retry")]
    assert not orphan.exists()
