"""``retry-engine``: the command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tomllib
from collections.abc import Sequence

from retry_engine import dlq_commands, redrive_commands
from retry_engine.config import (
    DEFAULT_LAKE,
    ENV_LAKE,
    TABLE_NAMES,
    EngineConfig,
    config_file,
    load_config,
)
from retry_engine.errors import LakeNotFoundError, RetryEngineError

log = logging.getLogger("retry_engine")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
# `status` when the engine query is not running (stopped, failed, stale, never started),
# like `systemctl status` for an inactive unit.
EXIT_NOT_RUNNING = 3


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
    run.add_argument(
        "--take-over",
        action="store_true",
        help="start even if another live engine owns the lake; it is fenced (its next commit is refused) and stops",
    )
    run.add_argument(
        "--discard-pending",
        action="store_true",
        help="let a new checkpoint start on a lake whose previous checkpoint holds pending retries "
        "(those retries are never delivered)",
    )
    demo = sub.add_parser("demo", help="run engine, producer and a flaky consumer on a local folder for about a minute")
    demo.add_argument("--lake", default="./data/demo", help="folder for the demo's tables (default: ./data/demo)")
    demo.add_argument("--messages", type=int, default=20, help="messages to produce (default: 20)")
    zip_ = sub.add_parser("zip", help="build the --py-files zip that spark-submit ships to executors")
    zip_.add_argument("--output", default="dist/retry_engine.zip")
    check = sub.add_parser("check-config", help="validate a config file and print the resolved paths")
    check.add_argument("--config")
    dlq_commands.add_parser(sub)
    redrive_commands.add_parser(sub)
    status = sub.add_parser(
        "status",
        help="is the engine running, last batch, backlog by level, oldest due time, lateness, dead letters "
        f"(exit {EXIT_OK} running, {EXIT_NOT_RUNNING} not running, {EXIT_ERROR} error)",
    )
    status.add_argument("--config")
    status.add_argument("--json", action="store_true", help="print JSON instead of the table")
    plots = sub.add_parser("plots", help="write PNG charts: backlog by level, lateness, dead letters by error class")
    plots.add_argument("--config")
    plots.add_argument("--out", required=True, help="folder to write the PNG files to (created if missing)")
    _add_schema_parser(sub)
    _add_lake_options(parser)
    return parser


# -- schema: what every table holds ----------------------------------------------


def _add_schema_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from retry_engine.schema_text import SCHEMA_FORMATS, TABLES

    schema = sub.add_parser(
        "schema",
        help="print the tables' columns and types (what a writer of consume_results must give)",
        description="Print every table's schema, or one table's. consume_results lists its required columns.",
    )
    schema.add_argument("table", nargs="?", choices=list(TABLES), metavar="TABLE", help=f"one of {', '.join(TABLES)}")
    schema.add_argument(
        "--format", choices=SCHEMA_FORMATS, default="arrow", help="arrow (default), spark-ddl or json"
    )


def _schema(args: argparse.Namespace) -> int:
    from retry_engine.schema_text import TABLES, format_schemas

    sys.stdout.write(format_schemas([args.table] if args.table else list(TABLES), args.format))
    return EXIT_OK


# -- --lake: on every command that takes --config ----------------------------------


def _lake_arg(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the lake path is empty; give the folder (or s3://... URI) that holds the tables")
    return text


def _add_lake_options(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)command that reads a config file a ``--lake`` that overrides its lake.

    Walks the parser tree rather than listing commands, so a command added
    later with ``--config`` gets ``--lake`` too.
    """
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _add_lake_options(child)
    options = {option for action in parser._actions for option in action.option_strings}
    if "--config" in options and "--lake" not in options:
        parser.add_argument(
            "--lake",
            type=_lake_arg,
            metavar="PATH",
            help="folder (or URI) holding the tables; overrides engine.lake and RETRY_ENGINE_LAKE "
            "(a relative path is relative to the working directory)",
        )


def _config(args: argparse.Namespace) -> EngineConfig:
    """The command's config: ``--config`` (or the default file), then RETRY_ENGINE_*, then ``--lake``."""
    return load_config(args.config, lake=getattr(args, "lake", None))


def _lake_origin(args: argparse.Namespace) -> str:
    """Where the lake setting of this command came from, for error messages."""
    if getattr(args, "lake", None):
        return f"--lake {args.lake!r}"
    if os.environ.get(ENV_LAKE):
        return f"{ENV_LAKE}={os.environ[ENV_LAKE]!r}"
    path = config_file(args.config)
    if path is not None:
        with open(path, "rb") as handle:
            lake = tomllib.load(handle).get("engine", {}).get("lake")
        if isinstance(lake, str):
            relative = "" if os.path.isabs(os.path.expanduser(lake)) else ", relative to that file's folder"
            return f"engine.lake = {lake!r} in {path}{relative}"
    return f"the default engine.lake ({DEFAULT_LAKE!r}, relative to the working directory)"


def _reading_config(args: argparse.Namespace) -> EngineConfig:
    """:func:`_config` for a command that reads a lake: a lake that is not there is an error (exit 2)."""
    from retry_engine.lake import require_lake

    config = _config(args)
    require_lake(config, origin=_lake_origin(args))
    return config


def _run(args: argparse.Namespace) -> int:
    from retry_engine import engine
    from retry_engine.lake import require_lake_folder
    from retry_engine.session import build_session

    config = _config(args)
    require_lake_folder(config, origin=_lake_origin(args))
    # Under spark-submit the JVM (and its --master) already exists; don't override it.
    master = None if "PYSPARK_GATEWAY_PORT" in os.environ else config.engine.master
    spark = build_session(
        master=master,
        shuffle_partitions=config.engine.shuffle_partitions,
        extra_conf=config.engine.spark_conf,
    )
    if args.once:
        engine.run_once(spark, config, take_over=args.take_over, discard_pending=args.discard_pending)
        return EXIT_OK
    query = engine.start(spark, config, take_over=args.take_over, discard_pending=args.discard_pending)
    # SIGTERM takes the Ctrl-C path. Calling query.stop() inside the handler re-enters
    # the py4j call that awaitTermination is blocked in ("reentrant call" RuntimeError).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    log.info("retry engine running; tables under %s; Ctrl-C to stop", config.engine.lake)
    lost = None
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        log.info("stopping")
    finally:
        # Releases the lake's lease, so the next engine starts without --take-over.
        lost = engine.stop(query)
    if lost is not None:
        print(f"retry-engine: {lost}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from retry_engine.demo import check_messages, run_demo
    from retry_engine.session import build_session

    check_messages(args.messages)

    # The Python workers inherit this: keep pandas' FutureWarnings out of the demo's output.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    spark = build_session(app_name="retry-engine-demo", log_level="ERROR")
    try:
        report = run_demo(args.lake, spark=spark, messages=args.messages, echo=lambda line: print(line, flush=True))
    finally:
        spark.stop()
    return EXIT_OK if report.settled else EXIT_ERROR


def _check(args: argparse.Namespace) -> int:
    config = _config(args)
    for table in TABLE_NAMES:
        print(f"{table:16} {config.table_path(table)}")
    print(f"{'checkpoint':16} {config.checkpoint_path}")
    _print_storage(config)
    return EXIT_OK


def _print_storage(config: EngineConfig) -> None:
    """The ``[storage]`` options, secrets shown as ``***`` (check-config output is pasted into tickets)."""
    from retry_engine.storage import redacted

    for key, value in sorted(redacted({k: str(v) for k, v in config.storage.items()}).items()):
        print(f"{'storage':16} {key} = {value}")


def _dlq(args: argparse.Namespace) -> int:
    return dlq_commands.run(args, _reading_config(args))


def _redrive_tasks(args: argparse.Namespace) -> int:
    return redrive_commands.run(args, _reading_config(args))


def _status(args: argparse.Namespace) -> int:
    import json

    from retry_engine.status import format_status, status, status_json

    result = status(_reading_config(args))
    if args.json:
        print(json.dumps(status_json(result), indent=2))
    else:
        print(format_status(result), end="")
    return EXIT_OK if result.state == "running" else EXIT_NOT_RUNNING


def _plots(args: argparse.Namespace) -> int:
    from retry_engine.plots import write_plots

    for plot in write_plots(_reading_config(args), args.out):
        print(f"{plot.name:13} {plot.path}  ({plot.elements} elements, from {plot.source})")
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
        commands = {
            "run": _run,
            "demo": _demo,
            "check-config": _check,
            "dlq": _dlq,
            "redrive": _redrive_tasks,
            "status": _status,
            "plots": _plots,
            "zip": _zip,
            "schema": _schema,
        }
        return commands[args.command](args)
    except LakeNotFoundError as exc:
        # Pointed at the wrong place: a usage error, like a missing argument.
        print(f"retry-engine: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RetryEngineError as exc:
        print(f"retry-engine: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
