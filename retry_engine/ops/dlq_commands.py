"""``retry-engine dlq list/show/stats/redrive``: argument parsing and output for the DLQ commands.

The work is done by :mod:`retry_engine.clients.dlq` and :mod:`retry_engine.ops.redrive`;
this module turns arguments into a :class:`~retry_engine.clients.dlq.Selection` and
results into text. It is CLI code, so it prints.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any, TextIO

import pandas as pd

from retry_engine.clients import dlq
from retry_engine.config import EngineConfig
from retry_engine.errors import SelectionError
from retry_engine.ops import redrive

EXIT_OK = 0
EXIT_NOT_CONFIRMED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

FORMATS = ("table", "json", "csv")
LIST_COLUMNS = (
    "dead_lettered_at",
    "consumer_group",
    "retry_topic",
    "msg_id",
    "origin_msg_id",
    "reconsume_times",
    "reason_code",
    "error_class",
    "error_message",
    "body_text",
    "redriven_by",
)
TEXT_WIDTH = 48
# A dry run's table shows this many of the selected dead letters, then the count of the rest.
DRY_RUN_ROWS = 20


def add_parser(sub: Any) -> None:
    """Add ``dlq`` and its subcommands to the CLI's subparsers."""
    parser = sub.add_parser("dlq", help="inspect the dead-letter queue and re-drive from it (an operator's tool: consumers never read it)")
    commands = parser.add_subparsers(dest="dlq_command", required=True)

    listing = commands.add_parser("list", help="list dead letters, oldest first")
    _common(listing)
    _filters(listing)
    _time_travel(listing)
    listing.add_argument("--limit", type=_positive_int, default=50, help="at most this many rows (default 50)")
    _include_resolved(listing)
    _format(listing)

    show = commands.add_parser("show", help="the full history of one message, every attempt: by origin id or any msg id")
    _common(show)
    show.add_argument("msg_id")
    _format(show)

    stats = commands.add_parser("stats", help="dead letters counted by group, topic, error class, reason or day")
    _common(stats)
    _filters(stats)
    _time_travel(stats)
    stats.add_argument(
        "--by",
        default=",".join(dlq.DEFAULT_SUMMARY),
        help=f"comma-separated, from {', '.join(dlq.SUMMARY_KEYS)} (default: %(default)s)",
    )
    _include_resolved(stats)
    _format(stats)

    move = commands.add_parser(
        "redrive",
        help="send dead letters back to their original topic or the retry path (audited, exactly once)",
        description="Re-drive the selected dead letters. Exactly once: running the same command again after an "
        "interruption finishes the interrupted chunks and moves nothing twice.",
    )
    _common(move)
    _filters(move)
    move.add_argument("--all", action="store_true", help="select the whole DLQ (needed when no filter is given)")
    move.add_argument("--to", choices=redrive.TARGETS, help="topic: the original topic; retry: %%RETRY%%G of the group")
    move.add_argument(
        "--keep-reconsume-times",
        action="store_true",
        help="keep the reconsume count (default: reset to 0, a full retry ladder again)",
    )
    move.add_argument("--dry-run", action="store_true", help="show what would move; change nothing")
    move.add_argument("--rate", type=float, help="at most this many messages per second")
    move.add_argument("--chunk-size", type=_positive_int, default=redrive.DEFAULT_CHUNK_SIZE)
    move.add_argument("--max-chunks", type=_positive_int, help="stop after this many chunks (re-run to continue)")
    move.add_argument("--redrive-id", help="name the re-drive (default: derived from the selection and target)")
    move.add_argument("--resume", metavar="REDRIVE_ID", help="only finish the interrupted chunks of this re-drive")
    move.add_argument("--force", action="store_true", help="also re-drive dead letters an earlier re-drive moved")
    move.add_argument("--operator", help="who is re-driving (default: the OS user)")
    move.add_argument("--note", help="why (recorded in the audit table)")
    move.add_argument("-y", "--yes", action="store_true", help="do not ask before a large re-drive")
    move.add_argument(
        "--confirm-above",
        type=int,
        metavar="N",
        help="ask before moving more than N messages (default: dlq.redrive_confirm_above in the config, 100)",
    )
    _format(move)
    add_resolve_parsers(commands)
    _add_resend(commands)


def _include_resolved(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--include-resolved", action="store_true", help="also dead letters marked resolved or purged (dlq resolve/purge)"
    )


def add_resolve_parsers(commands: Any) -> None:
    """``dlq resolve``, ``dlq purge`` and ``dlq expire`` (see :mod:`retry_engine.ops.resolve`)."""
    for action, text in (
        ("resolve", "mark dead letters as handled, with a reason: hidden from dlq list, never re-driven"),
        ("purge", "resolve dead letters and let dlq expire remove them from the DLQ table at once"),
    ):
        parser = commands.add_parser(action, help=text, description=f"{text[0].upper()}{text[1:]}. Recorded in the audit table.")
        _common(parser)
        # --reason is the operator's why here, so the reason-code filter is spelled --reason-code.
        _filters(parser, reason_code_flag="--reason-code")
        parser.add_argument("--all", action="store_true", help="select the whole DLQ (needed when no filter is given)")
        parser.add_argument("--reason", dest="why", required=True, help="why (required; recorded with who and when)")
        parser.add_argument("--operator", help="who (default: the OS user)")
        parser.add_argument(
            "--include-redriven", action="store_true", help="also dead letters a re-drive already moved (skipped by default)"
        )
        parser.add_argument("--dry-run", action="store_true", help="show what would be marked; change nothing")
        _format(parser)
    expire = commands.add_parser(
        "expire",
        help="remove purged dead letters, and resolved ones past dlq.resolved_retention, from the DLQ table",
        description="Delete purged dead letters, and resolved ones whose resolution is older than the retention, from "
        "the DLQ table (a Delta delete; the audit rows stay).",
    )
    _common(expire)
    expire.add_argument("--retention", help="e.g. 7d, 12h (default: dlq.resolved_retention in the config, 30d)")
    expire.add_argument("--dry-run", action="store_true", help="show what would be removed; change nothing")
    _format(expire)


def _add_resend(commands: Any) -> None:
    resend = commands.add_parser(
        "resend",
        help="resend one dead letter to one running consumer instance of its group (as RocketMQ's console does)",
        description="Write the dead letter to the group's retry topic for one consumer instance only: that "
        "instance delivers it, whoever owns its queue. Audited like a re-drive and moved at most once: running "
        "the same command again resends nothing.",
    )
    _common(resend)
    resend.add_argument("msg_id", help="the dead letter's msg_id or origin id")
    resend.add_argument(
        "--consumer-id",
        required=True,
        help="the instance: its consumer_id as 'dlq show' prints it, or consumer_id@instance_name",
    )
    resend.add_argument(
        "--keep-reconsume-times",
        action="store_true",
        help="keep the reconsume count (default: reset to 0, a full retry ladder again if it fails)",
    )
    resend.add_argument("--force", action="store_true", help="resend even if a re-drive or resend moved it before")
    resend.add_argument("--dry-run", action="store_true", help="show what would be resent; change nothing")
    resend.add_argument("--operator", help="who is resending (default: the OS user)")
    resend.add_argument("--note", help="why (recorded in the audit table)")
    _format(resend)


def run(
    args: argparse.Namespace,
    config: EngineConfig,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    inp: TextIO | None = None,
) -> int:
    """Run one ``dlq`` subcommand; errors propagate as :class:`RetryEngineError`.

    ``inp`` answers the confirmation of a large re-drive (default: stdin).
    """
    if args.dlq_command == "redrive":
        return _redrive(args, config, out or sys.stdout, err or sys.stderr, inp or sys.stdin)
    if args.dlq_command in ("resolve", "purge"):
        return _resolve(args, config, out or sys.stdout, err or sys.stderr)
    if args.dlq_command == "expire":
        return _expire(args, config, out or sys.stdout)
    command = {"list": _list, "show": _show, "stats": _stats, "resend": _resend}[args.dlq_command]
    return command(args, config, out or sys.stdout, err or sys.stderr)


# -- commands -------------------------------------------------------------------


def _list(args: argparse.Namespace, config: EngineConfig, out: TextIO, err: TextIO) -> int:
    frame = dlq.dead_letters(
        config, _selection(args), version=args.version, as_of=args.as_of, include_resolved=args.include_resolved
    )
    assert isinstance(frame, pd.DataFrame)  # no spark given
    total = len(frame)
    if total == 0:
        print("no dead letters match", file=err)
        return EXIT_OK
    shown = frame.head(args.limit)
    columns = [*LIST_COLUMNS, "resolution"] if args.include_resolved else list(LIST_COLUMNS)
    _emit(shown[columns] if args.format == "table" else shown.drop(columns=["body"]), args.format, out)
    if total > args.limit:
        print(f"{args.limit} of {total} dead letters shown (--limit)", file=err)
    return EXIT_OK


def _show(args: argparse.Namespace, config: EngineConfig, out: TextIO, err: TextIO) -> int:
    """Every row of one message (consumer_id and error of each delivery), then the dead letters' attempts."""
    frame = dlq.history(config, args.msg_id)
    if frame.empty:
        raise SelectionError(f"no message {args.msg_id!r} in any table (dlq, retry, messages, outcomes)", code="MESSAGE_NOT_FOUND")
    if args.format == "table":
        origin = dlq.origin_of(config, args.msg_id)
        print(f"history of origin message {origin} ({len(frame)} rows)", file=out)
    _emit(frame, args.format, out)
    if args.format == "table":
        _print_attempts(config, dlq.origin_of(config, args.msg_id), out)
    return EXIT_OK


ATTEMPT_COLUMNS = ("reconsume_times", "consumer_id", "status", "error_class", "error_message", "consumed_at", "delay_level")


def _print_attempts(config: EngineConfig, origin: str, out: TextIO) -> None:
    """The attempt history each dead letter of ``origin`` carries (its error context, kept with the message)."""
    for dead in dlq.read_dlq(config, dlq.Selection(ids=(origin,))).to_pylist():
        attempts = dead["attempts"] or []
        print(f"\nattempts carried by dead letter {dead['msg_id']} ({len(attempts)})", file=out)
        if attempts:
            _emit(pd.DataFrame(attempts, columns=list(ATTEMPT_COLUMNS)), "table", out)


def _stats(args: argparse.Namespace, config: EngineConfig, out: TextIO, err: TextIO) -> int:
    keys = [k.strip() for k in args.by.split(",") if k.strip()]
    frame = dlq.summary(
        config, _selection(args), by=keys, version=args.version, as_of=args.as_of, include_resolved=args.include_resolved
    )
    assert isinstance(frame, pd.DataFrame)
    if frame.empty:
        print("no dead letters match", file=err)
        return EXIT_OK
    _emit(frame, args.format, out)
    return EXIT_OK


def _confirmed(
    args: argparse.Namespace, config: EngineConfig, dry: redrive.RedriveReport, err: TextIO, inp: TextIO
) -> bool | None:
    """Whether the operator agrees to move what ``dry`` (a dry run) would; None: cannot ask (no terminal)."""
    count = dry.plan.shape[0]
    limit = args.confirm_above if args.confirm_above is not None else config.dlq.redrive_confirm_above
    if args.yes or count <= limit:
        return True
    if not inp.isatty():
        print(
            f"retry-engine: this re-drive would move {count} messages (more than {limit}) and there is no terminal "
            f"to confirm it: check it with --dry-run, then add --yes (or raise --confirm-above)",
            file=err,
        )
        return None
    print(f"re-drive {dry.redrive_id}: move {count} messages to {dry.target}? [y/N] ", end="", file=err, flush=True)
    return inp.readline().strip().lower() in ("y", "yes")


def _redrive(args: argparse.Namespace, config: EngineConfig, out: TextIO, err: TextIO, inp: TextIO) -> int:
    def progress(p: redrive.ChunkProgress) -> None:
        if p.phase == "moved":
            share = f"{100 * p.moved_so_far // p.total}%" if p.total else "-"
            print(f"re-drive {p.redrive_id}: chunk {p.chunk} moved {p.messages} ({p.moved_so_far}/{p.total}, {share})", file=err, flush=True)

    try:
        if args.resume:
            if args.to or args.redrive_id or _has_filter(args) or args.all:
                print("retry-engine: --resume takes no filters, --to or --redrive-id: the re-drive's audit rows say what to move", file=err)
                return EXIT_USAGE
            if not args.dry_run:
                dry = redrive.resume(config, args.resume, max_chunks=args.max_chunks, dry_run=True)
                answer = _confirmed(args, config, dry, err, inp)
                if not answer:
                    return _not_confirmed(answer, err)
            report = redrive.resume(
                config, args.resume, max_chunks=args.max_chunks, rate=args.rate, dry_run=args.dry_run, on_progress=progress
            )
        else:
            if args.to is None:
                print("retry-engine: dlq redrive needs --to topic or --to retry", file=err)
                return EXIT_USAGE
            if not _has_filter(args) and not args.all:
                print("retry-engine: dlq redrive needs a filter (--group, --topic, --error, --reason, --since, --until, --id) or --all", file=err)
                return EXIT_USAGE
            options: dict[str, Any] = {
                "target": args.to,
                "reset_reconsume_times": not args.keep_reconsume_times,
                "chunk_size": args.chunk_size,
                "max_chunks": args.max_chunks,
                "force": args.force,
                "redrive_id": args.redrive_id,
                "operator": args.operator,
                "note": args.note,
            }
            if not args.dry_run:
                dry = redrive.redrive(config, _selection(args), dry_run=True, **options)
                answer = _confirmed(args, config, dry, err, inp)
                if not answer:
                    return _not_confirmed(answer, err)
                # The confirmed count is of this id (a forced re-drive gets a fresh one per call).
                options["redrive_id"] = dry.redrive_id
            report = redrive.redrive(
                config, _selection(args), dry_run=args.dry_run, rate=args.rate, on_progress=progress, **options
            )
    except KeyboardInterrupt:
        print("interrupted: run the same command again to finish (nothing will move twice)", file=err)
        return EXIT_INTERRUPTED
    _print_report(report, args.format, out)
    return EXIT_OK


def _resolve(args: argparse.Namespace, config: EngineConfig, out: TextIO, err: TextIO) -> int:
    from retry_engine.ops import resolve

    if not _has_filter(args) and not args.all:
        print(f"retry-engine: dlq {args.dlq_command} needs a filter (--group, --topic, --error, --reason-code, "
              "--since, --until, --id) or --all", file=err)
        return EXIT_USAGE
    report = resolve.resolve(
        config, _selection(args), reason=args.why, action=args.dlq_command, operator=args.operator,
        include_redriven=args.include_redriven, dry_run=args.dry_run,
    )
    if args.format != "table":
        _emit(report.rows, args.format, out)
        return EXIT_OK
    verb = {"resolve": "resolved", "purge": "purged"}[report.action]
    print(
        f"{report.action} {report.resolution_id}{' (dry run: nothing changed)' if report.dry_run else ''}: "
        f"{report.matched} matched, {report.already_resolved} already resolved, {report.redriven} re-driven "
        f"(skipped{'' if args.include_redriven else '; --include-redriven to mark them too'}), "
        f"{'would be ' if report.dry_run else ''}{verb} {report.resolved}",
        file=out,
    )
    if report.dry_run and not report.rows.empty:
        _emit(report.rows.head(DRY_RUN_ROWS), "table", out)
        if len(report.rows) > DRY_RUN_ROWS:
            print(f"... and {len(report.rows) - DRY_RUN_ROWS} more", file=out)
    return EXIT_OK


def _expire(args: argparse.Namespace, config: EngineConfig, out: TextIO) -> int:
    from retry_engine.ops import resolve

    report = resolve.expire(config, retention=args.retention, dry_run=args.dry_run)
    if args.format != "table":
        _emit(report.rows, args.format, out)
        return EXIT_OK
    print(
        f"{'would remove' if report.dry_run else 'removed'} {report.removed} dead letters from the DLQ table "
        f"({report.purged} purged, {report.removed - report.purged} resolved more than {report.retention} ago); "
        "their audit rows stay",
        file=out,
    )
    return EXIT_OK


def _not_confirmed(answer: bool | None, err: TextIO) -> int:
    if answer is None:
        return EXIT_USAGE
    print("not confirmed: nothing moved", file=err)
    return EXIT_NOT_CONFIRMED


def _resend(args: argparse.Namespace, config: EngineConfig, out: TextIO, err: TextIO) -> int:
    from retry_engine.ops.resend import resend

    report = resend(
        config,
        args.msg_id,
        consumer_id=args.consumer_id,
        reset_reconsume_times=not args.keep_reconsume_times,
        force=args.force,
        dry_run=args.dry_run,
        operator=args.operator,
        note=args.note,
    )
    moved = report.redrive.plan.shape[0] if report.redrive.dry_run else report.redrive.moved
    if args.format != "table":
        summary = {
            "resend_id": report.redrive.redrive_id,
            "dlq_msg_id": report.dlq_msg_id,
            "consumer_group": report.consumer_group,
            "consumer_instance": report.instance,
            "resent_msg_id": report.resent_msg_id,
            "dry_run": report.redrive.dry_run,
            "moved": moved,
        }
        _emit(pd.DataFrame([summary]), args.format, out)
        return EXIT_OK
    where = f"instance {report.instance} of group {report.consumer_group}"
    if moved:
        verb = "would resend" if report.redrive.dry_run else "resent"
        print(f"{verb} dead letter {report.dlq_msg_id} to {where} as message {report.resent_msg_id} "
              f"(resend {report.redrive.redrive_id}{', dry run: nothing changed' if report.redrive.dry_run else ''})", file=out)
    else:
        print(f"dead letter {report.dlq_msg_id} was already moved (by this resend or a re-drive, see 'dlq show'): "
              f"nothing resent to {where}; --force resends it again", file=out)
    return EXIT_OK


def _print_report(report: redrive.RedriveReport, fmt: str, out: TextIO) -> None:
    plan = report.plan[
        ["chunk", "dlq_msg_id", "origin_msg_id", "consumer_group", "retry_topic", "reason_code", "redriven_msg_id", "topic",
         "reconsume_times"]
    ]
    if fmt != "table":
        _emit(plan, fmt, out)
        return
    verb = "would move" if report.dry_run else "moved"
    count = plan.shape[0] if report.dry_run else report.moved
    print(
        f"re-drive {report.redrive_id} to {report.target}{' (dry run: nothing changed)' if report.dry_run else ''}: "
        f"{report.matched} matched, {report.skipped} already re-driven (skipped), "
        f"{f'{report.resolved} resolved (skipped), ' if report.resolved else ''}{verb} {count}"
        f"{f' ({report.resumed} from an interrupted run)' if report.resumed else ''}",
        file=out,
    )
    if report.dry_run and not plan.empty:
        _emit(plan.head(DRY_RUN_ROWS), "table", out)
        if len(plan) > DRY_RUN_ROWS:
            print(f"... and {len(plan) - DRY_RUN_ROWS} more ({len(plan)} in all; --format csv or json lists every one)", file=out)
    if report.cancelled:
        print(f"stopped early: {report.cancelled}; what moved stays moved", file=out)
    if report.remaining:
        print(f"{report.remaining} {'would be left' if report.dry_run else 'not moved yet'} (--max-chunks): "
              "run the same command again to continue", file=out)
    if count == 0 and not report.remaining:
        print("nothing to re-drive", file=out)


# -- arguments ------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="TOML config file (default: conf/retry-engine.toml if present)")


def _filters(parser: argparse.ArgumentParser, *, reason_code_flag: str = "--reason") -> None:
    group = parser.add_argument_group("selection (every given filter must match)")
    group.add_argument("--group", help="consumer group")
    group.add_argument("--topic", help="original topic")
    group.add_argument("--error", metavar="REGEX", help="regex searched in the error class and message")
    group.add_argument(reason_code_flag, dest="reason", help="reason code, e.g. MAX_RECONSUME_TIMES")
    group.add_argument("--since", type=_timestamp, help="dead-lettered at or after (ISO 8601, UTC if no zone)")
    group.add_argument("--until", type=_timestamp, help="dead-lettered before (ISO 8601)")
    group.add_argument(
        "--max-redrives", type=_positive_int, metavar="N", help="only messages re-driven fewer than N times before"
    )
    group.add_argument("--id", action="append", dest="ids", metavar="MSG_ID", help="dead letter msg_id or origin id (repeatable)")


def _time_travel(parser: argparse.ArgumentParser) -> None:
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--version", type=int, help="read the DLQ as of this table version")
    when.add_argument("--as-of", type=_timestamp, help="read the DLQ as of this time (ISO 8601)")


def _format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="table")


def _has_filter(args: argparse.Namespace) -> bool:
    return any(getattr(args, name) is not None for name in ("group", "topic", "error", "reason", "since", "until", "ids", "max_redrives"))


def _selection(args: argparse.Namespace) -> dlq.Selection:
    return dlq.Selection(
        group=args.group,
        topic=args.topic,
        error_pattern=args.error,
        reason_code=args.reason,
        since=args.since,
        until=args.until,
        ids=tuple(args.ids) if args.ids else None,
        max_redrives=args.max_redrives,
    )


def _timestamp(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time (e.g. 2026-11-22T12:00:00Z)") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _emit(frame: pd.DataFrame, fmt: str, out: TextIO) -> None:
    if fmt == "json":
        out.write(frame.to_json(orient="records", lines=True, date_format="iso", default_handler=str))
        out.write("\n")
    elif fmt == "csv":
        frame.to_csv(out, index=False)
    else:
        shown = frame.copy()
        for col in shown.columns:
            if shown[col].dtype == object:
                shown[col] = [_clip(v) for v in shown[col]]
        out.write(shown.to_string(index=False))
        out.write("\n")


def _clip(value: Any) -> Any:
    if isinstance(value, str) and len(value) > TEXT_WIDTH:
        return value[: TEXT_WIDTH - 3] + "..."
    return value
