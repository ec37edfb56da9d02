"""Any sequence of starts, stops, `run --once` runs, pauses, appends and config changes (B1, R6, R8).

A Hypothesis state machine drives one lake the way operators and schedulers do: consume results
arrive (first failures due in 1 s, second failures due in 2 s, failures out of retries, successes,
and failures sent again with a new result id), the engine is started and stopped cleanly (a stop may
land inside or between batches), `run --once` runs between them, time passes with the engine down,
and `engine.state_bucket` is edited between runs. The three faults this session found each break it:
a restart without new input that released nothing, a `--once` that replayed the last run's batch
at its old time and stopped, and a bucket change after which a duplicate became a second retry.

Checked after every `run --once`: every retry due when it started was released. At the end of every
sequence the engine decides what is left and is stopped between batches, and a `run --once` after
everything fell due must release it with no new input. Then (an engine run until all is out) every result has
exactly one outcome; a result sent again while its first is remembered is a ``duplicate``; every
``retry`` outcome has exactly one retry row, never delivered before its due time; every
``dead_letter`` outcome exactly one DLQ row; nothing else in those tables.

CI runs one scripted sequence that goes through every rule (:data:`SCRIPT`, about 45 s);
``HYPOTHESIS_PROFILE=soak`` runs 25 random sequences of 20 steps with new seeds instead
(``make soak-property`` runs it with the engine property test).
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from retry_engine.core import engine, resume
from tests.builders import Result
from tests.lakehouse import Lake, wait_for

pytestmark = pytest.mark.slow

# A first retry (level 3) after 1 s, a second (level 4) after 2 s; the rest never falls due here.
LEVELS = "100ms 110ms 1s 2s " + " ".join(["1h"] * 14)
SOAK = os.environ.get("HYPOTHESIS_PROFILE") == "soak"
MACHINE_SETTINGS = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    database=None,
    print_blob=True,
    phases=[Phase.generate, Phase.shrink],
    suppress_health_check=list(HealthCheck),
)


class EngineRestarts(RuleBasedStateMachine):
    """One lake; the engine down or up; what was written, and when, for the final accounting."""

    def __init__(self, spark: Any, root: Path) -> None:
        super().__init__()
        self.spark = spark
        self.root = root
        self.bucket = "1s"
        self.query: Any = None
        self.written: list[Result] = []
        self.failures: list[Result] = []
        self.resent: set[str] = set()
        self.ids = itertools.count()

    def lake(self, trigger: str = "200ms") -> Lake:
        return Lake.make(
            self.root, engine={"message_delay_level": LEVELS, "state_bucket": self.bucket, "trigger_interval": trigger}
        )

    # -- what arrives ---------------------------------------------------------------
    @rule(
        kinds=st.lists(st.sampled_from(["first", "second", "dead", "ok"]), min_size=1, max_size=6),
        resend=st.integers(min_value=0, max_value=2),
    )
    def append(self, kinds: list[str], resend: int) -> None:
        batch: list[Result] = []
        for kind in kinds:
            n = next(self.ids)
            result = Result.of(f"m{n}", group="G")
            if kind == "ok":
                batch.append(result.ok())
                continue
            failed = result.failed(reconsume_times={"first": 0, "second": 1, "dead": 16}[kind])
            batch.append(failed)
            self.failures.append(failed)
        for earlier in self.failures[-resend:] if resend else []:
            again = earlier.with_(result_id=f"again-{next(self.ids)}")
            batch.append(again)
            self.resent.add(again.values["result_id"])
        self.lake().write_results(batch)
        self.written += batch

    # -- what operators and schedulers do -------------------------------------------------
    @precondition(lambda self: self.query is None)
    @rule(trigger=st.sampled_from(["200ms", "5s"]))
    def start(self, trigger: str) -> None:
        """At a 5 s trigger the query idles between batches: a stop then finds every batch committed."""
        self.query = engine.start(self.spark, self.lake(trigger).config)

    @precondition(lambda self: self.query is not None)
    @rule(run_for=st.sampled_from([0.0, 0.5, 2.0]))
    def stop(self, run_for: float) -> None:
        time.sleep(run_for)
        engine.stop(self.query)
        self.query = None

    @precondition(lambda self: self.query is None)
    @rule()
    def run_once(self) -> None:
        started = dt.datetime.now(dt.UTC)
        lake = self.lake()
        engine.run_once(self.spark, lake.config)
        released = {r["msg_id"] for r in lake.rows("retry")}
        due = [o for o in lake.rows("outcomes") if o["outcome"] == "retry" and o["due_at"] <= started]
        assert [o["result_id"] for o in due if o["output_msg_id"] not in released] == [], "due before run --once"

    @rule(seconds=st.sampled_from([0.5, 2.5]))
    def time_passes(self, seconds: float) -> None:
        time.sleep(seconds)

    @precondition(lambda self: self.query is None)
    @rule(bucket=st.sampled_from(["1s", "10s", "1h"]))
    def edit_state_bucket(self, bucket: str) -> None:
        self.bucket = bucket

    # -- the accounting ------------------------------------------------------------------
    def teardown(self) -> None:
        """The end of every sequence: the engine decides everything at a 5 s trigger and is stopped
        between batches (its checkpoint fully committed), stays down until all it decided is due, then
        a scheduler's `run --once` with no new input must release all of it (it ran no batch at all
        before the source's wake-up); a last engine run settles what a sequence left and is checked."""
        if self.query is not None:
            engine.stop(self.query)
            self.query = None
        self.append(["first", "second"], resend=0)  # retries that fall due while the engine is down
        lake = self.lake("5s")
        checkpoint = lake.config.checkpoint_path
        self.query = engine.start(self.spark, lake.config)
        try:
            wait_for(
                lambda: len(lake.rows("outcomes")) >= len(self.written) and _committed(checkpoint),
                timeout=90, what="every result decided, between batches",
            )
        finally:
            engine.stop(self.query)
            self.query = None
        due = [o["due_at"] for o in lake.rows("outcomes") if o["outcome"] == "retry"]
        time.sleep(max([0.0, *((d - dt.datetime.now(dt.UTC)).total_seconds() + 0.1 for d in due)]))
        self.run_once()
        self.query = engine.start(self.spark, self.lake().config)
        try:
            wait_for(lambda: self._settled(lake), timeout=90, what="every result decided and every retry released")
        finally:
            engine.stop(self.query)
            self.query = None
        self._check(lake)

    def _settled(self, lake: Lake) -> bool:
        outcomes = lake.rows("outcomes")
        retries = [o for o in outcomes if o["outcome"] == "retry"]
        return len(outcomes) >= len(self.written) and len(lake.rows("retry")) >= len(retries)

    def _check(self, lake: Lake) -> None:
        outcomes = lake.rows("outcomes")
        decided = Counter(o["result_id"] for o in outcomes)
        assert sorted(decided) == sorted(r.values["result_id"] for r in self.written)
        assert [rid for rid, n in decided.items() if n != 1] == []
        by_id = {o["result_id"]: o for o in outcomes}
        # Every failure sent again within the dedup window (10 minutes: the whole sequence).
        assert {rid: by_id[rid]["outcome"] for rid in self.resent} == {rid: "duplicate" for rid in self.resent}
        retries = {o["output_msg_id"]: o for o in outcomes if o["outcome"] == "retry"}
        released = lake.rows("retry")
        assert sorted(r["msg_id"] for r in released) == sorted(retries)
        assert all(r["delivered_at"] >= r["due_at"] == retries[r["msg_id"]]["due_at"] for r in released)
        dead = [o for o in outcomes if o["outcome"] == "dead_letter"]
        assert len(lake.rows("dlq")) == len(dead) == sum(1 for r in self.written if r.values["reconsume_times"] == 16
                                                           and r.values["result_id"] not in self.resent)


def _committed(checkpoint: str) -> bool:
    """Whether Spark committed every batch it planned in ``checkpoint``."""
    commits = [int(p.name) for p in (Path(checkpoint) / "commits").iterdir() if p.name.isdigit()]
    return bool(commits) and resume.last_planned(checkpoint) == max(commits)


# CI's sequence: every rule, in an order that reaches each fault this session fixed.
SCRIPT: list[tuple[str, dict[str, Any]]] = [
    ("append", {"kinds": ["first", "second", "dead", "ok"], "resend": 0}),
    ("start", {"trigger": "200ms"}),
    ("stop", {"run_for": 2.0}),
    ("append", {"kinds": ["first"], "resend": 1}),
    ("run_once", {}),  # decides; its stop leaves a planned batch
    ("time_passes", {"seconds": 2.5}),
    ("run_once", {}),  # replays that batch at its old time first: what fell due since must still go out
    ("edit_state_bucket", {"bucket": "1h"}),
    ("append", {"kinds": ["first"], "resend": 2}),  # sent again after the edit: duplicates, not retries
    ("start", {"trigger": "5s"}),
    ("stop", {"run_for": 2.0}),
    ("time_passes", {"seconds": 2.5}),
]


def test_restarts_runs_and_edits_lose_and_repeat_nothing(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    """CI: the scripted sequence, then the end every sequence has (see ``teardown``). Under the soak
    profile: random sequences (``MACHINE_SETTINGS``) instead."""
    lakes = itertools.count()
    if SOAK:
        run_state_machine_as_test(
            lambda: EngineRestarts(spark, tmp_path_factory.mktemp(f"machine{next(lakes)}")), settings=MACHINE_SETTINGS
        )
        return
    machine = EngineRestarts(spark, tmp_path_factory.mktemp("scripted"))
    try:
        for name, arguments in SCRIPT:
            getattr(machine, name)(**arguments)
    except BaseException:
        if machine.query is not None:
            engine.stop(machine.query)
        raise
    machine.teardown()
