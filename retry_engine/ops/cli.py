"""``retry-engine``: the command line."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import re
import sys
import tomllib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from retry_engine.core.names import MAINTAINED_TABLES, TABLE_NAMES
from retry_engine.errors import LakeNotFoundError, RetryEngineError
from retry_engine.ops import dlq_arguments
from retry_engine.ops.stopping import EXIT_STOPPED_BY_SIGINT
from retry_engine.ops.terms import SCHEMA_FORMATS

if TYPE_CHECKING:
    from retry_engine.config import EngineConfig
    from retry_engine.core.standby import Standby
    from retry_engine.core.startup import Startup
    from retry_engine.ops.stopping import StopSignals

log = logging.getLogger("retry_engine")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
# `plots`' default window (--since).
PLOTS_SINCE = "7d"
# `status` when the engine query is not running and did not stop cleanly (failed, stale,
# never started), like `systemctl status` for an inactive unit.
EXIT_NOT_RUNNING = 3
# Output went to a pipe whose reader left (`retry-engine dlq list | head`): 128 + SIGPIPE,
# what a shell reports for a tool that the broken pipe ended.
EXIT_BROKEN_PIPE = 141
# Interrupted by Ctrl-C: 128 + SIGINT, as shells report it (also after a clean stop on Ctrl-C).
EXIT_INTERRUPTED = EXIT_STOPPED_BY_SIGINT


def _shown(lake: str) -> str:
    # Imported here, not at import: the command line builds its parsers without the work's modules.
    from retry_engine.delta.storage import shown_path

    return shown_path(lake)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="retry-engine", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the engine as a streaming job until stopped")
    run.add_argument(
        "--config", help="TOML config file (default: conf/retry-engine.toml if present)"
    )
    run.add_argument(
        "--once",
        action="store_true",
        help="process the consume results already in the table, then stop (pending retries wait for the next run)",
    )
    owner = run.add_mutually_exclusive_group()
    owner.add_argument(
        "--take-over",
        action="store_true",
        help="start even if another live engine owns the lake; it is fenced (its next commit is refused) and stops",
    )
    owner.add_argument(
        "--standby",
        action="store_true",
        help="while another live engine owns the lake, wait; start as soon as it stops or its lease expires "
        "(a hot standby; not with --once)",
    )
    run.add_argument(
        "--discard-pending",
        action="store_true",
        help="let a new checkpoint start on a lake whose previous checkpoint holds pending retries "
        "(those retries are never delivered)",
    )
    demo = sub.add_parser(
        "demo",
        help="run engine, producer and a flaky consumer on a local folder for about a minute",
    )
    demo.add_argument(
        "--lake", default="./data/demo", help="folder for the demo's tables (default: ./data/demo)"
    )
    demo.add_argument("--messages", type=int, default=20, help="messages to produce (default: 20)")
    zip_ = sub.add_parser(
        "zip", help="build the --py-files zip that spark-submit ships to executors"
    )
    zip_.add_argument("--output", default="dist/retry_engine.zip")
    prepare = sub.add_parser(
        "prepare",
        help="write the JVM class archive that halves a local engine's start-up (once after install; "
        "make runs it; about a minute)",
    )
    prepare.add_argument(
        "--if-missing", action="store_true", help="keep a whole archive already written for this installation"
    )
    check = sub.add_parser(
        "check-config", help="validate a config file and print the resolved paths"
    )
    check.add_argument("--config")
    dlq_arguments.add_dlq_parser(sub)
    dlq_arguments.add_redrive_parser(sub)
    status = sub.add_parser(
        "status",
        help="is the engine running, last batch, backlog by level, oldest due time, lateness, dead letters "
        f"(exit {EXIT_OK} running or stopped cleanly, {EXIT_NOT_RUNNING} failed, stale or never started, "
        f"{EXIT_ERROR} error, {EXIT_USAGE} no lake where it looked: [LAKE_NOT_FOUND])",
    )
    status.add_argument("--config")
    status.add_argument("--json", action="store_true", help="print JSON instead of the table")
    plots = sub.add_parser(
        "plots", help="write PNG charts: backlog by level, lateness, dead letters by error class"
    )
    plots.add_argument("--config")
    plots.add_argument(
        "--out", required=True, help="folder to write the PNG files to (created if missing)"
    )
    plots.add_argument(
        "--since",
        type=_plot_window,
        default=_plot_window(PLOTS_SINCE),
        help=f"draw from this long ago (e.g. 24h, 30d), from an ISO 8601 time, or 'all' (default {PLOTS_SINCE})",
    )
    _add_schema_parser(sub)
    _add_catalog_ddl(sub)
    _add_maintain_parser(sub)
    _add_lake_options(parser)
    return parser


# -- schema: what every table holds ----------------------------------------------


def _add_schema_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    schema = sub.add_parser(
        "schema",
        help="print the tables' columns and types (what a writer of consume_results must give)",
        description="Print every table's schema, or one table's. consume_results lists its required columns.",
    )
    schema.add_argument(
        "table",
        nargs="?",
        choices=TABLE_NAMES,
        metavar="TABLE",
        help=f"one of {', '.join(TABLE_NAMES)}",
    )
    schema.add_argument(
        "--format",
        choices=SCHEMA_FORMATS,
        default="arrow",
        help="arrow (default), spark-ddl or json",
    )


def _schema(args: argparse.Namespace) -> int:
    from retry_engine.ops.schema_text import TABLES, format_schemas

    sys.stdout.write(format_schemas([args.table] if args.table else list(TABLES), args.format))
    return EXIT_OK


# -- maintain: compaction, log checkpoints, log cleanup, vacuum ---------------------


def _add_maintain_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    maintain = sub.add_parser(
        "maintain",
        help="compact small files, checkpoint and clean the Delta log, and vacuum old files of the lake's tables",
        description="For every table the engine writes and for consume_results (or only --table): compact small "
        "files (readers and streams see no change), write a log checkpoint, remove expired log files (where the "
        "table's writers do not: delta.enableExpiredLogCleanup = false), and delete "
        "data files no version within the retention references. Prints what it did per table and records it in "
        "the lake's _maintenance table. Safe while the engine runs.",
    )
    maintain.add_argument("--config")
    maintain.add_argument(
        "--table",
        action="append",
        choices=list(MAINTAINED_TABLES),
        metavar="NAME",
        help=f"only this table (repeatable); one of {', '.join(MAINTAINED_TABLES)}",
    )
    maintain.add_argument(
        "--retention",
        metavar="DURATION",
        help="keep files replaced within this long, in hours or days (default: [maintenance] retention, 7d)",
    )
    maintain.add_argument(
        "--dry-run", action="store_true", help="change nothing; say what would be removed"
    )
    maintain.add_argument(
        "--force",
        action="store_true",
        help="allow a retention shorter than the config's trigger plus maintenance interval "
        "(only when no engine or stream reads these tables)",
    )


def _maintain(args: argparse.Namespace) -> int:
    from retry_engine.ops.maintenance import format_report, run_maintenance

    reports = run_maintenance(
        _reading_config(args),
        tables=args.table,
        retention=args.retention,
        dry_run=args.dry_run,
        force=args.force,
    )
    print(format_report(reports, dry_run=args.dry_run), end="")
    return EXIT_ERROR if any(r.error for r in reports) else EXIT_OK


# -- --lake: on every command that takes --config ----------------------------------


def _lake_arg(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "the lake path is empty; give the folder (or s3://... URI) that holds the tables"
        )
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
    from retry_engine.config import load_config

    return load_config(args.config, lake=getattr(args, "lake", None))


def _lake_origin(args: argparse.Namespace) -> str:
    """Where the lake setting of this command came from, for error messages."""
    from retry_engine.config import DEFAULT_LAKE, ENV_LAKE

    if getattr(args, "lake", None):
        return f"--lake {args.lake!r}"
    if os.environ.get(ENV_LAKE):
        return f"{ENV_LAKE}={os.environ[ENV_LAKE]!r}"
    found = _file_lake(args)
    if found is not None:
        path, lake = found
        relative = "" if os.path.isabs(os.path.expanduser(lake)) else ", relative to that file's folder"
        return f"engine.lake = {lake!r} in {path}{relative}"
    return f"the default engine.lake ({DEFAULT_LAKE!r}, relative to the working directory)"


def _file_lake(args: argparse.Namespace) -> tuple[str, str] | None:
    """The config file and its ``engine.lake`` as written, when that is where the command's lake comes from."""
    from retry_engine.config import ENV_LAKE, config_file

    path = None if getattr(args, "lake", None) or os.environ.get(ENV_LAKE) else config_file(args.config)
    if path is None:
        return None
    with open(path, "rb") as handle:
        lake = tomllib.load(handle).get("engine", {}).get("lake")
    return (str(path), lake) if isinstance(lake, str) else None


def _file_lake_read_before(args: argparse.Namespace) -> str | None:
    """A config file's relative ``engine.lake`` as releases before 2026-11-23 read it (from the working
    directory), when the file is where the lake comes from; else None."""
    from retry_engine.delta.lake import is_local

    found = _file_lake(args)
    if found is None or not is_local(found[1]) or os.path.isabs(os.path.expanduser(found[1])):
        return None
    return os.path.abspath(found[1])


def _reading_config(args: argparse.Namespace) -> EngineConfig:
    """:func:`_config` for a command that reads a lake: a lake that is not there is an error (exit 2)."""
    from retry_engine.delta.lake import require_lake

    config = _config(args)
    require_lake(config, origin=_lake_origin(args))
    return config


def _add_catalog_ddl(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ddl = sub.add_parser(
        "catalog-ddl",
        help="print CREATE TABLE ... USING DELTA LOCATION ... for every table, to register them in a metastore "
        "or Unity Catalog (nothing is executed)",
    )
    ddl.add_argument("--config")
    ddl.add_argument("--catalog", help="catalog of the tables (Unity Catalog); needs --schema")
    ddl.add_argument("--schema", help="schema (database) of the tables")
    ddl.add_argument(
        "--table-prefix", default="", help="put this before every table name, e.g. retry_engine_"
    )


def _catalog_ddl(args: argparse.Namespace) -> int:
    from retry_engine.ops.catalog import catalog_ddl

    config = _config(args)
    for statement in catalog_ddl(
        config, catalog=args.catalog, schema=args.schema, table_prefix=args.table_prefix
    ):
        print(statement)
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    from retry_engine.core.startup import Startup
    from retry_engine.delta.lake import require_lake_folder
    from retry_engine.delta.session import build_session, warm_python_workers, warming_workers

    if args.once and args.standby:
        print("retry-engine run: error: --standby waits to run on, --once stops when the input is processed; "
              "give one", file=sys.stderr)
        return EXIT_USAGE
    config = _config(args)
    require_lake_folder(config, origin=_lake_origin(args), read_before=_file_lake_read_before(args))
    startup = Startup()
    # Under spark-submit the JVM (and its --master) already exists; don't override it.
    master = None if "PYSPARK_GATEWAY_PORT" in os.environ else config.engine.master
    with startup.step("spark session"):
        spark = build_session(
            master=master,
            shuffle_partitions=config.engine.shuffle_partitions,
            # Spark turns adaptive execution off for a stateful query anyway, with two WARN lines
            # at every start; engine.spark_conf can still set it.
            extra_conf={"spark.sql.adaptive.enabled": "false", **config.engine.spark_conf},
            quick_jit=True,
        )
    if master is not None and master.startswith("local") and warming_workers():
        warm_python_workers(spark)
    if args.once:
        return _run_once(spark, config, args, startup)
    return _run_until_stopped(spark, config, args, startup)


# How long a stop waits for the running micro-batch before abandoning it (safe either way).
STOP_FINISH_BATCH_SECONDS = 20.0
# How often the main thread checks on the query while it waits for a stop signal.
RUN_POLL_SECONDS = 0.5


def _run_once(spark: Any, config: EngineConfig, args: argparse.Namespace, startup: Startup) -> int:
    """``run --once``: exit 0 when the input is processed; on SIGINT/SIGTERM a clean stop (exit 130/0);
    a failed query (never restarted: the scheduler decides) exits 1 with one line saying why.

    As in :func:`_run_until_stopped`, the signal handler only sets a flag and
    this thread stops the query (:func:`retry_engine.core.engine.run_once` polls
    the flag between its checks), so the terminated event and the lease
    release are written either way.
    """
    from pyspark.errors import StreamingQueryException

    from retry_engine.ops.status import failure_reason

    try:
        return _run_once_until_done(spark, config, args, startup)
    except StreamingQueryException as exc:
        # The query failed (the query's own stop already recorded it): one line, as `run` prints.
        print(_failed_line("the engine stopped", failure_reason(str(exc)), config), file=sys.stderr)
        return EXIT_ERROR


def _run_once_until_done(spark: Any, config: EngineConfig, args: argparse.Namespace, startup: Startup) -> int:
    from retry_engine.core import engine
    from retry_engine.ops.stopping import StopSignals, drain_tasks, exit_code, quiet_stop_logs

    with StopSignals() as signals:

        try:
            finished = engine.run_once(
                spark,
                config,
                take_over=args.take_over,
                discard_pending=args.discard_pending,
                wait=signals.wait,
                finish_batch_s=STOP_FINISH_BATCH_SECONDS,
                startup=startup,
                # The command ends after the stop, requested or not: these loggers would only report
                # its interruption of the planned batch (WARN "Failed to cancel job group", ERROR
                # "Store broadcast ... fail" after every run that processed its input, before).
                quiet=lambda: quiet_stop_logs(spark),
            )
        finally:
            if signals.requested:
                # The process ends next and the JVM's shutdown hook stops Spark: not under a task of
                # the batch the stop abandoned.
                drain_tasks(spark)
    if finished or signals.received is None:
        # One line says it is done (the log says how: a newcomer saw nothing on stdout).
        print(f"retry-engine: done: every consume result of the table decided; tables under "
              f"{_shown(config.engine.lake)} (`retry-engine status` for the backlog)", flush=True)
        return EXIT_OK
    print(_stopped_line(signals.received, config), flush=True)
    return exit_code(signals.received)


def _failed_line(what: str, reason: str, config: EngineConfig) -> str:
    """The last line of a run that ends on a failure: what happened, why, where the tables are."""
    return f"retry-engine: {what}: {reason}; tables under {_shown(config.engine.lake)}"


def _stopped_line(signum: int, config: EngineConfig) -> str:
    """The one line a command prints after a clean stop on a signal."""
    from retry_engine.ops.stopping import signal_name

    return f"retry-engine: stopped on {signal_name(signum)}; tables under {_shown(config.engine.lake)}"


def _run_until_stopped(
    spark: Any, config: EngineConfig, args: argparse.Namespace, startup: Startup
) -> int:
    """Run the engine until SIGINT/SIGTERM (clean stop, exit 130/0), restarting a failed query.

    A query that fails (a storage outage, a lost executor) is stopped, its lease
    released, and started again from its checkpoint after ``engine.restart_delay``,
    doubled for each restart in a row; after ``engine.restart_attempts`` restarts
    in a row without a completed micro-batch between them the command exits 1, as
    it does at once when another engine took the lake over or a start fails other
    than on storage. The signal handler only sets a flag; this thread stops the
    query, so the stop never interrupts a py4j call (see :mod:`retry_engine.ops.stopping`).
    """
    from retry_engine.ops.stopping import StopSignals, stop_session

    with StopSignals() as signals:
        try:
            code, last_words = _run_restarting(spark, config, args, startup, signals)
        finally:
            stop_session(spark)
    for line, stream in last_words:
        print(line, file=stream, flush=True)
    return code


_OWN_ERROR = re.compile(r"^retry_engine\.errors\.\w+: \[([A-Z][A-Z0-9_]*)\]")


def restartable_codes() -> frozenset[str]:
    """Codes of the package's own errors that a restart may mend: the store failing (every
    StorageError code, and the source's and sink's reports of it) and writers racing.

    Every other code the engine raises in a query waits for an operator (a vacuumed data file or
    cleaned commit, a damaged state file, a checkpoint that cannot resume): restarting would only
    fail the same way for `engine.restart_attempts` rounds. A failure without one of the package's
    codes (a lost executor, Spark's own errors) is restarted.
    """
    from retry_engine.delta.storage import STORAGE_CODES
    from retry_engine.errors import ConcurrentWriteError, DeltaSinkError, EngineStoppedError

    racing = {ConcurrentWriteError.code, DeltaSinkError.code, EngineStoppedError.code, "LEASE_CONTENDED"}
    return STORAGE_CODES | racing | {"DELTA_TABLE_UNREADABLE", "DELTA_COMMIT_FAILED"}


def needs_operator(reason: str) -> str | None:
    """The code of the package's error that failed the query if restarting cannot mend it, else None."""
    found = _OWN_ERROR.match(reason)
    return found[1] if found and found[1] not in restartable_codes() else None


def standby_poll_s(config: EngineConfig) -> float:
    """How often a standby engine tries the lake's lease: a tenth of ``engine.lease_timeout``, 1-5 s."""
    return min(max(config.lease_timeout_ms / 10_000, 1.0), 5.0)


def _run_restarting(
    spark: Any, config: EngineConfig, args: argparse.Namespace, startup: Startup, signals: StopSignals
) -> tuple[int, list[tuple[str, Any]]]:
    """:func:`_run_until_stopped`'s loop: its exit code and the lines to print once the session is stopped.
    A standby's note on the lake (:mod:`retry_engine.core.standby`) is deleted whichever way it ends."""
    from retry_engine.core.standby import Standby

    note = Standby(config.engine.lake, config.checkpoint_path, standby_poll_s(config)) if args.standby else None
    try:
        return _restarting(spark, config, args, startup, signals, note)
    finally:
        if note is not None:
            note.gone()


def _restarting(
    spark: Any, config: EngineConfig, args: argparse.Namespace, startup: Startup, signals: StopSignals,
    note: Standby | None,
) -> tuple[int, list[tuple[str, Any]]]:
    from retry_engine.core import engine
    from retry_engine.errors import LakeOwnedError, StorageError
    from retry_engine.ops.status import failure_reason

    attempts = config.engine.restart_attempts
    in_a_row = 0
    started = False
    standing_by = False
    while True:
        try:
            query = engine.start(
                spark,
                config,
                take_over=args.take_over and not started,
                discard_pending=args.discard_pending and not started,
                startup=startup if not started else None,
            )
        except LakeOwnedError as exc:
            if not args.standby:
                raise
            if not standing_by:
                print(f"retry-engine: standing by: {exc}", file=sys.stderr, flush=True)
                standing_by = True
            if note is not None:
                note.seen()  # `status` lists the standby while it polls
            in_a_row = 0  # the store answered
            if signals.wait(standby_poll_s(config)):
                return _stopped_by(signals, config)
            continue
        except StorageError as exc:
            if not started and not standing_by:
                raise  # the first start: a store that is misconfigured, not one that went away
            reason = str(exc)
        else:
            if note is not None:
                note.gone()
            if not started:
                print(_running_line(config, args.config, query_id=str(query.id)), flush=True)
                started = True
            else:
                print(f"retry-engine: restarted (query {query.id})", file=sys.stderr, flush=True)
            lost = _watch(spark, query, signals)
            if lost is not None:
                return EXIT_ERROR, [(f"retry-engine: {lost}", sys.stderr)]
            if signals.requested:
                return _stopped_by(signals, config)
            failure = query.exception()
            reason = failure_reason(str(failure)) if failure is not None else "the query stopped"
            code = needs_operator(reason)
            if code is not None:
                return EXIT_ERROR, [
                    (_failed_line("the engine stopped", reason, config), sys.stderr),
                    (f"retry-engine: not restarted: [{code}] needs an operator (see above)", sys.stderr),
                ]
            if query.recentProgress:  # it completed a micro-batch: this failure starts a new row
                in_a_row = 0
        in_a_row += 1
        what = "the engine stopped" if started else "the standby could not reach the lake"
        if in_a_row > attempts:
            said = [(_failed_line(what, reason, config), sys.stderr)]
            if attempts:
                said.append((
                    f"retry-engine: gave up after {attempts} restarts in a row without a completed "
                    "micro-batch (engine.restart_attempts)", sys.stderr,
                ))
            return EXIT_ERROR, said
        delay = config.restart_delay_s(in_a_row)
        print(
            f"retry-engine: {what}: {reason}; {'restarting' if started else 'trying again'} in {delay:g} s "
            f"(restart {in_a_row} of {attempts} in a row, engine.restart_attempts)",
            file=sys.stderr, flush=True,
        )
        if signals.wait(delay):
            return _stopped_by(signals, config)


def _watch(spark: Any, query: Any, signals: StopSignals) -> Exception | None:
    """Wait until ``query`` ends or a stop is requested, then stop it (letting its batch finish on a
    request); the error if it had stopped because another engine took the lake over."""
    from retry_engine.core import engine
    from retry_engine.ops.stopping import quiet_stop_logs

    try:
        while not signals.wait(RUN_POLL_SECONDS) and query.isActive:
            pass
    finally:
        if signals.requested:
            quiet_stop_logs(spark)
        lost = engine.stop(query, finish_batch_s=STOP_FINISH_BATCH_SECONDS if signals.requested else 0.0)
    return lost


def _stopped_by(signals: StopSignals, config: EngineConfig) -> tuple[int, list[tuple[str, Any]]]:
    """The exit code of a stop on a signal and its one line."""
    from retry_engine.ops.stopping import exit_code

    assert signals.received is not None
    return exit_code(signals.received), [(_stopped_line(signals.received, config), sys.stdout)]


def _running_line(config: EngineConfig, config_file: str | None, *, query_id: str) -> str:
    """The one line that ends start-up: what runs, where its tables are, how to watch it and stop it."""
    option = f" --config {config_file}" if config_file else ""
    return (
        f"retry-engine: running (query {query_id}): consume results from "
        f"{config.table_path('consume_results')} into retry, dlq and outcomes tables under "
        f"{_shown(config.engine.lake)}; watch with `retry-engine status{option}` or "
        f"`retry-engine plots{option} --out DIR`; stop with Ctrl-C or `kill {os.getpid()}`"
    )


def _demo(args: argparse.Namespace) -> int:
    from retry_engine.delta.session import build_session
    from retry_engine.ops.demo import check_messages, run_demo
    from retry_engine.ops.stopping import StopSignals, exit_code, signal_name, stop_session

    check_messages(args.messages)

    # The Python workers inherit this: keep pandas' FutureWarnings out of the demo's output.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    spark = build_session(app_name="retry-engine-demo", log_level="ERROR", quick_jit=True)
    try:
        with StopSignals() as signals:
            report = run_demo(
                args.lake,
                spark=spark,
                messages=args.messages,
                echo=lambda line: print(line, flush=True),
                signals=signals,
            )
    finally:
        stop_session(spark)
    if report.stopped_by is not None:
        print(
            f"demo: stopped on {signal_name(report.stopped_by)}; tables under {os.path.abspath(args.lake)}",
            flush=True,
        )
        return exit_code(report.stopped_by)
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
    from retry_engine.delta.storage import redacted

    for key, value in sorted(redacted({k: str(v) for k, v in config.storage.items()}).items()):
        print(f"{'storage':16} {key} = {value}")


def _dlq(args: argparse.Namespace) -> int:
    from retry_engine.ops import dlq_commands

    return dlq_commands.run(args, _reading_config(args))


def _redrive_tasks(args: argparse.Namespace) -> int:
    from retry_engine.ops import redrive_commands

    return redrive_commands.run(args, _reading_config(args))


def _status(args: argparse.Namespace) -> int:
    import json

    from retry_engine.ops.status import format_status, status, status_json

    result = status(_reading_config(args))
    if args.json:
        print(json.dumps(status_json(result), indent=2))
    else:
        print(format_status(result), end="")
    # A clean stop is a normal state to report; stale, failed and never started are not.
    return EXIT_OK if result.state in ("running", "stopped") else EXIT_NOT_RUNNING


def _plot_window(text: str) -> dt.timedelta | dt.datetime | None:
    """``plots --since``: a duration back from now, a time (UTC if no zone), or ``all`` (None)."""
    if text == "all":
        return None
    match = re.fullmatch(r"([1-9][0-9]{0,8})(m|h|d)", text)
    if match is not None:
        unit = {"m": "minutes", "h": "hours", "d": "days"}[match[2]]
        return dt.timedelta(**{unit: int(match[1])})
    try:
        value = dt.datetime.fromisoformat(text)
        return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
    except (ValueError, OverflowError):  # OverflowError: a zone that moves it past year 1 or 9999
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (a whole number of m, h or d: 24h, 30d), an ISO 8601 time "
            "(within years 1-9999 in UTC), nor 'all'"
        ) from None


def _plots(args: argparse.Namespace) -> int:
    from retry_engine.ops.plots import write_plots

    since = args.since
    if isinstance(since, dt.timedelta):
        try:
            since = dt.datetime.now(dt.UTC) - since
        except OverflowError:  # further back than datetime goes: the whole lake
            since = None
    for plot in write_plots(_reading_config(args), args.out, since=since):
        print(f"{plot.name:13} {plot.path}  ({plot.elements} elements, from {plot.source})")
    return EXIT_OK


def _zip(args: argparse.Namespace) -> int:
    from retry_engine.ops.cluster import build_py_files

    print(build_py_files(args.output))
    return EXIT_OK


def _prepare(args: argparse.Namespace) -> int:
    from retry_engine.delta._class_archive import current_archive, write_archive

    archive = current_archive() if args.if_missing else None
    kept = archive is not None
    archive = archive or write_archive()
    print(f"class archive: {archive} ({archive.stat().st_size / 2**20:.0f} MB{', kept' if kept else ''})")
    return EXIT_OK


def _main(argv: Sequence[str] | None = None) -> int:
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
            "prepare": _prepare,
            "schema": _schema,
            "catalog-ddl": _catalog_ddl,
            "maintain": _maintain,
        }
        return commands[args.command](args)
    except LakeNotFoundError as exc:
        # Pointed at the wrong place: a usage error, like a missing argument.
        print(f"retry-engine: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RetryEngineError as exc:
        print(f"retry-engine: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:
        # delta-rs's own errors (a damaged commit of a table another writer changed): one line, not its
        # Rust backtrace. Only once delta-rs is loaded can an error be one of its; the parsers do not load it.
        delta = sys.modules.get("deltalake.exceptions")
        if delta is None or not isinstance(exc, delta.DeltaError):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"retry-engine: [DELTA_TABLE_UNREADABLE] a table of the lake cannot be read: {first}", file=sys.stderr)
        return EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """The ``retry-engine`` command: exit codes as documented per command.

    Also ends quietly when stdout's reader goes away (``retry-engine dlq list | head``)
    and on a Ctrl-C that arrives before a long-running command handles it itself.
    """
    try:
        try:
            return _main(argv)
        finally:
            # Flushed here, not at interpreter exit, so a closed pipe is caught below (also
            # after --help, which argparse ends with SystemExit).
            sys.stdout.flush()
    except BrokenPipeError:
        _broken_pipe()
    except KeyboardInterrupt:
        # E.g. while Spark starts, before `run` installs its own handler.
        print("retry-engine: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _broken_pipe() -> NoReturn:
    """The reader of stdout has gone: stop quietly.

    What Python's docs advise: point stdout at /dev/null so the interpreter's
    final flush does not raise BrokenPipeError again at exit. Then the process
    ends here, without the interpreter's finalization: with nothing left to
    say, a native library's thread torn down at exit could still abort it
    ("terminate called without an active exception", SIGABRT instead of 141;
    seen once in `status | head` in CI).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(EXIT_BROKEN_PIPE)


if __name__ == "__main__":
    sys.exit(main())
