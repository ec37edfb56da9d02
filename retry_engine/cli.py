"""``retry-engine``: the command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence

from retry_engine.config import load_config
from retry_engine.errors import RetryEngineError

log = logging.getLogger("retry_engine")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retry-engine", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the engine as a streaming job until stopped")
    run.add_argument("--config", help="TOML config file (default: conf/retry-engine.toml if present)")
    run.add_argument(
        "--once",
        action="store_true",
        help="process the consume results already in the table, then stop (pending retries wait for the next run)",
    )
    zip_ = sub.add_parser("zip", help="build the --py-files zip that spark-submit ships to executors")
    zip_.add_argument("--output", default="dist/retry_engine.zip")
    check = sub.add_parser("check-config", help="validate a config file and print the resolved paths")
    check.add_argument("--config")
    return parser


def _run(args: argparse.Namespace) -> int:
    from retry_engine import engine
    from retry_engine.session import build_session

    config = load_config(args.config)
    # Under spark-submit the JVM (and its --master) already exists; don't override it.
    master = None if "PYSPARK_GATEWAY_PORT" in os.environ else config.engine.master
    spark = build_session(
        master=master,
        shuffle_partitions=config.engine.shuffle_partitions,
        extra_conf=config.engine.spark_conf,
    )
    if args.once:
        engine.run_once(spark, config)
        return EXIT_OK
    query = engine.start(spark, config)
    # SIGTERM takes the Ctrl-C path. Calling query.stop() inside the handler re-enters
    # the py4j call that awaitTermination is blocked in ("reentrant call" RuntimeError).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    log.info("retry engine running; tables under %s; Ctrl-C to stop", config.engine.lake)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        log.info("stopping")
        query.stop()
    return EXIT_OK


def _check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    for table in ("consume_results", "retry", "dlq", "quarantine", "outcomes"):
        print(f"{table:16} {config.table_path(table)}")
    print(f"{'checkpoint':16} {config.checkpoint_path}")
    return EXIT_OK


def _zip(args: argparse.Namespace) -> int:
    from retry_engine.cluster import build_py_files

    print(build_py_files(args.output))
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        return {"run": _run, "check-config": _check, "zip": _zip}[args.command](args)
    except RetryEngineError as exc:
        print(f"retry-engine: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
