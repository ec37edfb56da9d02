"""The whole lake on object storage (#14 part 4): moto's S3 server, real Spark (local[2]), one shared run.

The config puts every table on ``s3://<bucket>/lake`` and the Spark
checkpoints on local disk; the server is reached only through the ``[storage]``
options (nothing in the environment), so whatever works here got the options
from the config: the driver's delta-rs calls, the deltars source and sink on
the executors, the engine's write tasks, the lease, the consumer's heartbeats.

One run: the producer sends ``ok`` and ``poison`` messages; a CLUSTERING
consumer G1 succeeds on ``ok`` and raises on ``poison`` with
max_reconsume_times 1 (R6: one retry, then the DLQ); the engine runs until
every ``ok`` result is acknowledged and every poison message is dead. While it
runs, ``status``; after, ``dlq list``, ``dlq show``, a re-drive to the topic
and the notebook API. The secret key given in the options must appear in no
log, output, table object or checkpoint file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import io
import json
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.query import StreamingQuery

from retry_engine.clients import dlq
from retry_engine.clients.consumer import CONSUME_SUCCESS, ConsumeContext, Consumer, ReceivedMessage
from retry_engine.clients.producer import Message, Producer
from retry_engine.config import EngineConfig, load_config
from retry_engine.core import engine
from retry_engine.core.delays import parse_duration_ms
from retry_engine.core.lease import STATE_TABLE_PROPERTIES, read_state, state_path
from retry_engine.delta import storage
from retry_engine.delta.tables import read_table
from retry_engine.errors import ConfigError, StorageError
from retry_engine.ops import plots
from retry_engine.ops import status as status_of
from retry_engine.ops.cli import EXIT_OK, main
from tests.lakehouse import FAST_LEVELS, wait_for
from tests.s3 import S3Server

pytestmark = pytest.mark.slow

SECRET = "s3cr3t-" + uuid.uuid4().hex
OK, POISON = 3, 2
TIMEOUT = 240.0


def _toml(server: S3Server, lake: str, checkpoint: str | None) -> str:
    engine_lines = [
        f'lake = "{lake}"',
        'trigger_interval = "200ms"',
        f'message_delay_level = "{FAST_LEVELS}"',
        'state_bucket = "1s"',
    ]
    if checkpoint is not None:
        engine_lines.append(f'checkpoint = "{checkpoint}"')
    storage_lines = [f"{k} = {json.dumps(v)}" for k, v in server.storage_options(SECRET).items()]
    return "\n".join(["[engine]", *engine_lines, "", "[storage]", *storage_lines]) + "\n"


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@dataclass
class Run:
    server: S3Server
    bucket: str
    conf: str
    config: EngineConfig
    root: Path
    ids: dict[str, list[str]]
    # command -> (exit code, stdout, stderr)
    outputs: dict[str, tuple[int, str, str]] = field(default_factory=dict)
    logs: list[str] = field(default_factory=list)
    # (this consumer instance, the instances whose heartbeats were on S3 while it ran)
    heartbeats: tuple[str, list[str]] = ("", [])

    def rows(self, table: str) -> list[dict[str, Any]]:
        return read_table(self.config.table_path(table)).to_pylist()

    def cli(self, name: str, *argv: str) -> None:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
        self.outputs[name] = (code, out.getvalue(), err.getvalue())


def _poison_listener() -> Any:
    def listener(message: ReceivedMessage, context: ConsumeContext) -> Any:
        if message.keys == "poison":
            context.max_reconsume_times = 1
            raise RuntimeError(f"cannot process {message.origin_msg_id}")
        return CONSUME_SUCCESS

    return listener


def _settled(run: Run, queries: list[StreamingQuery]) -> bool:
    for q in queries:
        if q.exception() is not None:
            raise AssertionError(f"query {q.name} failed") from q.exception()
    outcomes = (
        run.rows("outcomes") if storage.is_delta_table(run.config.table_path("outcomes")) else []
    )
    acked = {o["msg_id"] for o in outcomes if o["outcome"] == "acknowledged"}
    dead = run.rows("dlq") if storage.is_delta_table(run.config.table_path("dlq")) else []
    return set(run.ids["ok"]) <= acked and sorted(d["origin_msg_id"] for d in dead) == sorted(
        run.ids["poison"]
    )


@pytest.fixture(scope="module")
def run(spark: Any, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("s3lake")
    bucket = s3_server.new_bucket()
    conf = root / "engine.toml"
    conf.write_text(_toml(s3_server, f"s3://{bucket}/lake", str(root / "checkpoints" / "engine")))
    collect = _Collect()
    collect.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root_logger = logging.getLogger()
    old_level = root_logger.level
    root_logger.addHandler(collect)
    root_logger.setLevel(logging.DEBUG)
    queries: list[StreamingQuery] = []
    consumer: Consumer | None = None
    try:
        config = load_config(conf)
        producer = Producer(config.table_path("messages"))
        ids = {
            kind: list(
                producer.send_batch(
                    [Message("orders", f"{kind}-{i}", keys=kind) for i in range(n)]
                ).msg_ids
            )
            for kind, n in (("ok", OK), ("poison", POISON))
        }
        result = Run(s3_server, bucket, str(conf), config, root, ids)
        queries.append(engine.start(spark, config))
        wait_for(
            lambda: queries[0].exception() or queries[0].lastProgress,
            timeout=TIMEOUT,
            what="the engine to start",
        )
        consumer = Consumer(
            spark,
            config,
            group="G1",
            trigger_interval="200 milliseconds",
            write_backoff_seconds=0.05,
        )
        queries.append(
            consumer.subscribe("orders").register_message_listener(_poison_listener()).start()
        )
        wait_for(
            lambda: _settled(result, queries),
            timeout=TIMEOUT,
            what="every message to succeed or reach the DLQ",
        )
        result.cli("status", "status", "--config", str(conf), "--json")
        result.heartbeats = (
            consumer.membership.member,
            [b.member for b in consumer.membership.heartbeats()],
        )
    finally:
        for q in queries[:1]:
            engine.stop(q)  # records its end and releases its lease while the S3 server still runs
        if consumer is not None:
            # Stops its query and leaves the group: its heartbeat object is deleted from S3.
            consumer.shutdown(queries[1] if len(queries) > 1 else None)
        root_logger.removeHandler(collect)
        root_logger.setLevel(old_level)
    result.cli("check", "check-config", "--config", str(conf))
    result.cli("list", "dlq", "list", "--config", str(conf), "--format", "json")
    result.cli("show", "dlq", "show", "--config", str(conf), ids["poison"][0])
    result.cli(
        "redrive",
        "dlq",
        "redrive",
        "--config",
        str(conf),
        "--group",
        "G1",
        "--to",
        "topic",
        "--yes",
    )
    result.logs = collect.lines
    yield result


def test_engine_producer_and_consumer_run_with_every_table_on_s3(run: Run) -> None:
    """#14 part 4: R6 on an S3 lake: ok messages acknowledged, poison ones dead after one retry; tables on S3."""
    dead = [d for d in run.rows("dlq") if d["consumer_group"] == "G1"]
    assert sorted(d["origin_msg_id"] for d in dead) == sorted(run.ids["poison"])
    assert {(d["topic"], d["reconsume_times"], d["reason_code"]) for d in dead} == {
        ("%DLQ%G1", 2, "MAX_RECONSUME_TIMES")
    }
    retried = [r for r in run.rows("retry") if r["consumer_group"] == "G1"]
    assert sorted(r["origin_msg_id"] for r in retried) == sorted(run.ids["poison"])
    objects = run.server.objects(run.bucket)
    for table in (
        "messages",
        "consume_results",
        "retry",
        "dlq",
        "outcomes",
        "metrics",
        "progress",
        "_engine_state",
    ):
        assert any(k.startswith(f"lake/{table}/_delta_log/") for k in objects), table
    # The CLUSTERING heartbeat was on S3 while the consumer ran, and left with it (graceful close);
    # its consumer offsets stay there, for the next instance that gains its queues.
    me, seen = run.heartbeats
    assert seen == [me]
    left = [k for k in objects if k.startswith("lake/_consumers/")]
    assert left and all("/offsets/" in k for k in left), left
    state = read_state(run.config.engine.lake)
    assert state is not None and state.last_batch is not None
    # Nothing went to a local folder named after the URI.
    assert not Path("s3:").exists() and not any(
        p.name.startswith("s3:") for p in run.root.rglob("*")
    )


def test_status_dlq_and_redrive_commands_work_against_s3(run: Run) -> None:
    """#14 part 4: `status`, `dlq list`, `dlq show` and a re-drive (R9) read and write the S3 lake."""
    code, status, _ = run.outputs["status"]
    assert code == EXIT_OK and json.loads(status)["state"] == "running"
    code, listing, _ = run.outputs["list"]
    assert code == EXIT_OK
    rows = [json.loads(line) for line in listing.splitlines() if line.strip()]
    assert sorted(r["origin_msg_id"] for r in rows) == sorted(run.ids["poison"])
    code, shown, _ = run.outputs["show"]
    assert code == EXIT_OK and run.ids["poison"][0] in shown and "cannot process" in shown
    code, _, err = run.outputs["redrive"]
    assert code == EXIT_OK, err
    again = [
        m
        for m in run.rows("messages")
        if m["topic"] == "orders" and m["msg_id"] not in run.ids["ok"] + run.ids["poison"]
    ]
    assert len(again) == POISON
    assert len(run.rows("redrive_audit")) == POISON
    # The notebook API over the same lake.
    frame = dlq.dead_letters(run.config)
    assert sorted(frame["origin_msg_id"]) == sorted(run.ids["poison"])
    assert frame["redriven_by"].notna().all()
    # Status's counts from the lake's batch record, its window read from the S3 tables' statistics (#14).
    now = dt.datetime.now(dt.UTC)
    assert status_of._recorded_tables(run.config, now) is not None
    everything = status_of.summarise(
        status_of.read_tables(run.config, now=now, names=status_of.STATUS_TABLES), now=now,
        trigger_interval_ms=run.config.trigger_interval_ms, flush_interval_ms=parse_duration_ms(run.config.engine.progress_flush_interval),
    )
    assert dataclasses.replace(status_of.status(run.config, now=now), checked_at=now) == dataclasses.replace(everything, checked_at=now)
    # `plots`' window (#14): METRICS read at the recorded batch from S3, the same lines as every row's.
    since = now - dt.timedelta(hours=1)
    window = plots.read_plot_data(run.config, since=since, now=now)
    assert window.backlog_source == "metrics, from the lake's batch record"
    every = plots.plot_data(status_of.read_tables(run.config, names=plots.PLOT_TABLES), since)
    assert (window.backlog, window.dead_letters) == (every.backlog, every.dead_letters) and window.backlog
    assert sorted(window.lateness_ms) == sorted(every.lateness_ms)


def test_the_secret_key_is_in_no_log_output_table_or_checkpoint(run: Run) -> None:
    """#14 part 4: the secret in [storage] reached S3 (the run worked) but was written nowhere."""
    assert run.logs and not [line for line in run.logs if SECRET in line]
    for name, (_, out, err) in run.outputs.items():
        assert SECRET not in out + err, name
    assert "aws_secret_access_key = ***" in run.outputs["check"][1]
    for key, body in run.server.objects(run.bucket).items():
        assert SECRET.encode() not in body, key
    # The engine's checkpoint and, next to it, the consumer's (the default for a lake on object storage).
    checkpoints = run.root / "checkpoints"
    assert sorted(p.name.split("-")[0] for p in checkpoints.iterdir()) == ["consumer", "engine"]
    checkpoint_files = [p for p in checkpoints.rglob("*") if p.is_file()]
    assert len(checkpoint_files) > 10
    for path in checkpoint_files:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in os.environ.get("AWS_SECRET_ACCESS_KEY", "")


def test_a_checkpoint_on_s3_without_the_hadoop_jars_is_refused(
    spark: Any, s3_server: S3Server, tmp_path: Path
) -> None:
    """#14 part 4: the default checkpoint of an S3 lake is on S3, which Spark cannot write here: a clear error first."""
    bucket = s3_server.new_bucket()
    conf = tmp_path / "engine.toml"
    conf.write_text(_toml(s3_server, f"s3://{bucket}/lake", None))
    config = load_config(conf)
    with pytest.raises(
        ConfigError, match=r"CHECKPOINT_FILESYSTEM_MISSING.*s3://.*engine\.checkpoint"
    ) as caught:
        engine.start(spark, config)
    assert SECRET not in str(caught.value)
    assert s3_server.objects(bucket) == {}  # refused before the lease or any table was written
    with pytest.raises(ConfigError, match="CHECKPOINT_FILESYSTEM_MISSING"):
        storage.require_checkpoint_filesystem(spark, "s3a://bucket/checkpoints/engine")
    storage.require_checkpoint_filesystem(spark, str(tmp_path / "local"))


def test_an_engine_on_a_missing_bucket_stops_at_start_naming_it(
    spark: Any, s3_server: S3Server, tmp_path: Path
) -> None:
    """Bad-input rule, #14 part 4: `run` on a lake whose bucket does not exist ends with a StorageError naming
    the bucket and what to check (the CLI prints it as its one line), not delta-rs's multi-line OSError."""
    bucket = f"gone-{uuid.uuid4().hex[:8]}"
    conf = tmp_path / "engine.toml"
    conf.write_text(_toml(s3_server, f"s3://{bucket}/lake", str(tmp_path / "checkpoints")))
    with pytest.raises(StorageError, match=rf"^\[NO_SUCH_BUCKET\] cannot reach s3://{bucket}/lake/") as caught:
        engine.start(spark, load_config(conf))
    assert "\n" not in str(caught.value) and SECRET not in str(caught.value)
    assert not spark.streams.active


def test_the_engines_tables_get_their_checkpoint_intervals_and_others_tables_keep_their_defaults(run: Run) -> None:
    """#14 part 4: a reader on S3 replays at most 10 commits of an engine table a batch does not write (one GET
    each), not delta-rs's 100, and 100 of one a batch writes (a checkpoint there carries a week of removes, run
    BC); the engine's writers leave the log's cleanup (a listing of the whole log) to maintenance."""
    own = {
        name: run.config.table_path(name)
        for name in ("retry", "dlq", "outcomes", "metrics", "progress", "redrive_audit")
    }
    own["_engine_state"] = state_path(run.config.engine.lake)
    configurations = {name: dict(storage.open_delta(path).metadata().configuration) for name, path in own.items()}
    marked = {storage.ENGINE_INTERVAL: storage.TABLE_PROPERTIES[storage.CHECKPOINT_INTERVAL]}
    expected = dict.fromkeys(own, {**storage.TABLE_PROPERTIES, **marked})
    for name in ("retry", "dlq", "outcomes", "metrics", "progress"):
        expected[name] = {**storage.BATCH_TABLE_PROPERTIES, storage.ENGINE_INTERVAL: "100"}
    expected["_engine_state"] = {**STATE_TABLE_PROPERTIES, **marked}  # its removes kept 2 hours (run BC)
    assert configurations == expected
    # Written by producers and consumers: created by them with delta-rs's defaults.
    for name in ("messages", "consume_results"):
        assert storage.open_delta(run.config.table_path(name)).metadata().configuration == {}, name
