"""``retry-engine dlq list/show/stats/redrive``: running the DLQ commands and their output.

The work is done by :mod:`retry_engine.clients.dlq` and :mod:`retry_engine.ops.redrive`;
this module turns parsed arguments (:mod:`retry_engine.ops.dlq_arguments`) into a
:class:`~retry_engine.clients.dlq.Selection` and results into text. It is CLI code,
so it prints.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import pandas as pd

from retry_engine.clients import dlq
from retry_engine.config import EngineConfig
from retry_engine.errors import SelectionError
from retry_engine.ops import redrive
from retry_engine.ops.status import printable

EXIT_OK = 0
EXIT_NOT_CONFIRMED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

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
    shown, total = dlq.dead_letter_page(
        config, _selection(args), limit=args.limit, version=args.version, as_of=args.as_of,
        include_resolved=args.include_resolved,
    )
    if total == 0:
        print("no dead letters match", file=err)
        return EXIT_OK
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
        print(f"history of origin message {printable(origin)} ({len(frame)} rows)", file=out)
    _emit(frame, args.format, out)
    if args.format == "table":
        _print_attempts(config, dlq.origin_of(config, args.msg_id), out)
    return EXIT_OK


ATTEMPT_COLUMNS = ("reconsume_times", "consumer_id", "status", "error_class", "error_message", "consumed_at", "delay_level")


def _print_attempts(config: EngineConfig, origin: str, out: TextIO) -> None:
    """The attempt history each dead letter of ``origin`` carries (its error context, kept with the message)."""
    for dead in dlq.read_dlq(config, dlq.Selection(ids=(origin,))).to_pylist():
        attempts = dead["attempts"] or []
        print(f"\nattempts carried by dead letter {printable(dead['msg_id'])} ({len(attempts)})", file=out)
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

    moving: str | None = None  # the re-drive that may have moved messages when Ctrl-C comes
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
                moving = args.resume
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
                # The confirmed count is of this id (a forced re-drive gets a fresh one per call) and of
                # the DLQ as the dry run read it: dead letters written since are not moved unseen.
                options["redrive_id"] = moving = dry.redrive_id
                options["dlq_version"] = dry.dlq_version
            report = redrive.redrive(
                config, _selection(args), dry_run=args.dry_run, rate=args.rate, on_progress=progress, **options
            )
    except KeyboardInterrupt:
        print(_interrupted(args, moving), file=err)
        return EXIT_INTERRUPTED
    _print_report(report, args.format, out)
    return EXIT_OK


def _interrupted(args: argparse.Namespace, redrive_id: str | None) -> str:
    """What Ctrl-C during ``dlq redrive`` tells the operator: the re-drive it stopped, and the command that
    finishes it (``redrive_id`` None: stopped before it could move anything)."""
    if redrive_id is None:
        return "interrupted: nothing moved"
    if args.force and not args.redrive_id and not args.resume:
        # A forced re-drive gets a fresh id per run: the same command again would be another re-drive.
        return (
            f"interrupted re-drive {redrive_id}: finish it with the same command plus --redrive-id {redrive_id} "
            "(without it, --force starts a new re-drive that moves again what this one moved)"
        )
    return f"interrupted re-drive {redrive_id}: run the same command again to finish it (nothing will move twice)"


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
    # For the terminal: the instance and ids are text from tables (a consumer's results, the DLQ).
    where = f"instance {printable(report.instance)} of group {printable(report.consumer_group)}"
    dead = printable(report.dlq_msg_id)
    if moved:
        verb = "would resend" if report.redrive.dry_run else "resent"
        print(f"{verb} dead letter {dead} to {where} as message {report.resent_msg_id} "
              f"(resend {report.redrive.redrive_id}{', dry run: nothing changed' if report.redrive.dry_run else ''})", file=out)
    else:
        print(f"dead letter {dead} was already moved (by this resend or a re-drive, see 'dlq show'): "
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


# -- arguments to a selection, frames to text -------------------------------------


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


def _emit(frame: pd.DataFrame, fmt: str, out: TextIO) -> None:
    """``frame`` as JSON lines or CSV (the values as they are, for programs), or as a table for a person."""
    if fmt == "json":
        out.write(frame.to_json(orient="records", lines=True, date_format="iso", default_handler=str))
        out.write("\n")
    elif fmt == "csv":
        frame.to_csv(out, index=False)
    else:
        shown = frame.copy()
        for col in shown.columns:
            if shown[col].dtype == object or isinstance(shown[col].dtype, pd.StringDtype):
                shown[col] = [_cell(v) for v in shown[col]]
        out.write(shown.to_string(index=False))
        out.write("\n")


def _cell(value: Any) -> Any:
    """A table cell as the terminal gets it: text (a mapping or list as its text) escaped by
    :func:`~retry_engine.ops.status.printable` and cut to :data:`TEXT_WIDTH`; anything else as pandas shows it."""
    if isinstance(value, (dict, list, tuple)):
        value = str(value)
    if not isinstance(value, str):
        return value
    text = printable(value)
    return text[: TEXT_WIDTH - 3] + "..." if len(text) > TEXT_WIDTH else text
