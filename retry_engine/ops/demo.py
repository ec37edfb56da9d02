"""``retry-engine demo``: the whole loop on the embedded default, in about a minute.

Starts the engine and one CLUSTERING consumer with a flaky listener on local
Spark over a local folder, with fast delay levels; produces traffic; reports
progress until every message has succeeded or reached the DLQ; shows
retries and dead letters; stops cleanly.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from retry_engine.clients.consumer import (
    CONSUME_SUCCESS,
    RECONSUME_LATER,
    ConsumeContext,
    Consumer,
    ReceivedMessage,
)
from retry_engine.clients.producer import Message, Producer
from retry_engine.config import EngineConfig, parse_config
from retry_engine.delta.tables import open_table
from retry_engine.errors import ConfigError
from retry_engine.ops.stopping import StopSignals, quiet_stop_logs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEMO_GROUP = "demo-group"
DEMO_TOPIC = "demo-orders"
# Fast levels: level 3 (the first retry) waits 300 ms instead of RocketMQ's 10 s.
DEMO_DELAY_LEVELS = "100ms 200ms 300ms 400ms 500ms 600ms 700ms 800ms 900ms 1s 1s 1s 1s 1s 1s 1s 1s 1s"
DEMO_MAX_RECONSUME_TIMES = 3
DEFAULT_MESSAGES = 20
DEFAULT_TIMEOUT_SECONDS = 300.0
PROGRESS_EVERY_SECONDS = 2.0
# How long a stop waits for each query's running micro-batch before abandoning it (safe either way).
STOP_FINISH_BATCH_SECONDS = 20.0
# Every n-th message is poison (always fails), every m-th flaky (fails twice), the rest succeed.
POISON_EVERY = 5
FLAKY_EVERY = 3
TABLES = ("messages", "consume_results", "retry", "dlq", "outcomes", "quarantine")


def kind_of(index: int) -> str:
    if index % POISON_EVERY == POISON_EVERY - 1:
        return "poison"
    if index % FLAKY_EVERY == FLAKY_EVERY - 1:
        return "flaky"
    return "ok"


def flaky_listener(message: ReceivedMessage, context: ConsumeContext) -> str:
    """``ok`` succeeds; ``flaky`` fails twice (RECONSUME_LATER, then an exception); ``poison`` always raises."""
    if message.keys == "poison":
        raise ValueError(f"malformed payload {message.body[:20]!r}")
    if message.keys == "flaky" and message.reconsume_times < 2:
        if message.reconsume_times == 0:
            return RECONSUME_LATER
        raise TimeoutError("downstream service timed out")
    return CONSUME_SUCCESS


def check_messages(messages: object) -> int:
    """``messages`` if it is a positive int; :class:`ConfigError` naming it otherwise."""
    if isinstance(messages, bool) or not isinstance(messages, int) or messages < 1:
        raise ConfigError(f"demo messages={messages!r} must be a positive int", code="INVALID_OPTION")
    return messages


def demo_config(lake: str) -> EngineConfig:
    return parse_config({
        "engine": {
            "lake": lake,
            "trigger_interval": "200ms",
            "state_bucket": "1s",
            "message_delay_level": DEMO_DELAY_LEVELS,
        },
        "group_defaults": {"retry_max_times": DEMO_MAX_RECONSUME_TIMES},
    })


@dataclass
class DemoReport:
    """What the demo wrote: table paths and row counts, and whether every message settled."""

    lake: str
    paths: dict[str, str]
    counts: dict[str, int] = field(default_factory=dict)
    settled: bool = False
    seconds: float = 0.0
    # The signal that stopped the demo early (SIGINT, SIGTERM), if one did.
    stopped_by: int | None = None


def _rows(path: str) -> list[dict[str, Any]]:
    table = open_table(path)
    return [] if table is None else list(table.to_pyarrow_table().to_pylist())


def _progress(config: EngineConfig, sent: dict[str, str]) -> tuple[dict[str, int], bool]:
    """Counts per table, and whether every sent message succeeded or was dead-lettered."""
    counts = {t: len(_rows(config.table_path(t))) for t in TABLES}
    results = _rows(config.table_path("consume_results"))
    succeeded = {r["origin_msg_id"] or r["msg_id"] for r in results if r["status"] == CONSUME_SUCCESS}
    dead = {d["origin_msg_id"] for d in _rows(config.table_path("dlq"))}
    settled = all(m in (dead if kind == "poison" else succeeded) for m, kind in sent.items())
    return counts, settled


def run_demo(
    lake: str | Path,
    *,
    spark: SparkSession | None = None,
    messages: int = DEFAULT_MESSAGES,
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
    echo: Callable[[str], None] = log.info,
    signals: StopSignals | None = None,
) -> DemoReport:
    """Run the demo on tables under ``lake``; ``echo`` receives the progress lines.

    ``spark=None`` builds the embedded local session (and leaves it running for
    the caller to stop). Queries are always stopped before returning, each
    after its running batch (up to :data:`STOP_FINISH_BATCH_SECONDS`); the
    engine's lease is released and the consumer leaves its group. With
    ``signals`` (entered by the caller), SIGINT/SIGTERM end the demo early:
    ``report.stopped_by`` says which.
    """
    from retry_engine.core import engine
    from retry_engine.delta.session import build_session

    check_messages(messages)
    config = demo_config(str(lake))
    spark = spark or build_session(shuffle_partitions=config.engine.shuffle_partitions, log_level="ERROR")
    paths = {t: config.table_path(t) for t in TABLES}
    echo(f"demo: tables under {lake}; delay levels {DEMO_DELAY_LEVELS.split()[:4]}...; "
         f"max reconsume times {DEMO_MAX_RECONSUME_TIMES}")
    started = time.monotonic()
    producer = Producer(paths["messages"], producer_group="demo-producer")
    consumer = Consumer(spark, config, group=DEMO_GROUP, trigger_interval="200 milliseconds", write_backoff_seconds=0.2)
    consumer.subscribe(DEMO_TOPIC).register_message_listener(flaky_listener)
    queries = []
    report = DemoReport(str(lake), paths)
    engine_query = consumer_query = None
    try:
        engine_query = engine.start(spark, config)
        queries.append(engine_query)
        consumer_query = consumer.start()
        queries.append(consumer_query)
        echo(f"demo: engine and consumer of group {DEMO_GROUP!r} started; producing {messages} messages to {DEMO_TOPIC!r}")
        sent: dict[str, str] = {}
        waves = [range(i, min(i + 10, messages)) for i in range(0, messages, 10)]
        for wave in waves:
            batch = [Message(DEMO_TOPIC, f"order-{i}".encode(), tags="created", keys=kind_of(i)) for i in wave]
            result = producer.send_batch(batch)
            sent.update(zip(result.msg_ids, (kind_of(i) for i in wave), strict=True))
        kinds = {k: sum(1 for v in sent.values() if v == k) for k in ("ok", "flaky", "poison")}
        echo(f"demo: sent {len(sent)} ({kinds['ok']} succeed at once, {kinds['flaky']} fail twice, "
             f"{kinds['poison']} always fail)")
        deadline = started + timeout_seconds
        while time.monotonic() < deadline:
            for q in queries:
                if q.exception() is not None:
                    raise q.exception()  # type: ignore[misc]
            counts, settled = _progress(config, sent)
            echo(f"demo: {time.monotonic() - started:5.1f}s  consumed {counts['consume_results']:3d}  "
                 f"retries {counts['retry']:3d}  dead letters {counts['dlq']:2d}")
            if settled:
                report.settled = True
                break
            if signals is None:
                time.sleep(PROGRESS_EVERY_SECONDS)
            elif signals.wait(PROGRESS_EVERY_SECONDS):
                report.stopped_by = signals.received
                break
    finally:
        if signals is not None:
            # The CLI demo ends after this stop: what these loggers say now is the stop's own interrupt.
            quiet_stop_logs(spark)
        try:
            if consumer_query is not None:
                engine.finish_current_batch(consumer_query, timeout_s=STOP_FINISH_BATCH_SECONDS)
            consumer.shutdown(consumer_query)
        finally:
            if engine_query is not None:
                engine.stop(engine_query, finish_batch_s=STOP_FINISH_BATCH_SECONDS)
    if report.stopped_by is not None:
        report.seconds = time.monotonic() - started
        return report
    report.counts, report.settled = _progress(config, sent)
    report.seconds = time.monotonic() - started
    _summary(report, echo)
    return report


def _fmt_time(value: dt.datetime | None) -> str:
    return value.strftime("%H:%M:%S.%f")[:-3] if value else "-"


def _summary(report: DemoReport, echo: Callable[[str], None]) -> None:
    state = "every message succeeded or was dead-lettered" if report.settled else "NOT settled before the timeout"
    echo(f"demo: done in {report.seconds:.1f}s, {state}")
    echo("demo: rows per table: " + ", ".join(f"{t} {n}" for t, n in report.counts.items()))
    retries = sorted(_rows(report.paths["retry"]), key=lambda r: (r["origin_msg_id"], r["reconsume_times"]))
    echo("demo: example retries (%RETRY% rows): origin_msg_id, reconsume_times, delay_level, due_at, delivered_at")
    for r in retries[:4]:
        echo(f"  {r['origin_msg_id']}  {r['reconsume_times']}  level {r['delay_level']}  "
             f"{_fmt_time(r['due_at'])}  {_fmt_time(r['delivered_at'])}")
    echo("demo: example dead letters (%DLQ% rows): origin_msg_id, reconsume_times, reason_code, error")
    for d in _rows(report.paths["dlq"])[:3]:
        echo(f"  {d['origin_msg_id']}  {d['reconsume_times']}  {d['reason_code']}  "
             f"{d['error_class']}: {d['error_message']}")
    echo(f"demo: query them with deltalake, e.g. DeltaTable({report.paths['dlq']!r}).to_pandas()")
