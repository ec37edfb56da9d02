"""The arguments of ``retry-engine dlq ...`` and ``retry-engine redrive ...``.

Every command builds every parser, so this module imports no more than argparse
and :mod:`retry_engine.ops.terms`; the commands themselves
(:mod:`retry_engine.ops.dlq_commands`, :mod:`retry_engine.ops.redrive_commands`)
import pandas and the DLQ client when one of them runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from retry_engine.ops.terms import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_SUMMARY,
    REDRIVE_TARGETS,
    SUMMARY_KEYS,
    TASK_STATES,
)

FORMATS = ("table", "json", "csv")


def add_dlq_parser(sub: Any) -> None:
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
        default=",".join(DEFAULT_SUMMARY),
        help=f"comma-separated, from {', '.join(SUMMARY_KEYS)} (default: %(default)s)",
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
    move.add_argument("--to", choices=REDRIVE_TARGETS, help="topic: the original topic; retry: %%RETRY%%G of the group")
    move.add_argument(
        "--keep-reconsume-times",
        action="store_true",
        help="keep the reconsume count (default: reset to 0, a full retry ladder again)",
    )
    move.add_argument("--dry-run", action="store_true", help="show what would move; change nothing")
    move.add_argument("--rate", type=float, help="at most this many messages per second")
    move.add_argument("--chunk-size", type=_positive_int, default=DEFAULT_CHUNK_SIZE)
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


def _timestamp(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text)
        return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
    except (ValueError, OverflowError):  # OverflowError: a zone that moves it past year 1 or 9999
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time within years 1-9999 in UTC (e.g. 2026-11-22T12:00:00Z)"
        ) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def add_redrive_parser(sub: Any) -> None:
    """Add ``redrive`` and its subcommands to the CLI's subparsers."""
    parser = sub.add_parser(
        "redrive",
        help="list, watch and cancel re-drives (start one with: retry-engine dlq redrive)",
        description="Re-drive tasks. State is running, cancelling, finished, interrupted (stopped by an error or "
        "Ctrl-C, or silent for two minutes) or cancelled; moved/total counts messages.",
    )
    commands = parser.add_subparsers(dest="redrive_command", required=True)
    listing = commands.add_parser("list", help="every re-drive, newest first")
    _common(listing)
    _format(listing)
    listing.add_argument(
        "--state", choices=TASK_STATES, help="only re-drives in this state"
    )
    status = commands.add_parser("status", help="one re-drive: state, moved/total, who, when")
    _common(status)
    _format(status)
    status.add_argument("redrive_id")
    cancel = commands.add_parser(
        "cancel",
        help="stop a running re-drive at its next chunk (what moved stays moved; who and why are recorded)",
    )
    _common(cancel)
    cancel.add_argument("redrive_id")
    cancel.add_argument("--reason", help="why (recorded with the cancel)")
    cancel.add_argument("--operator", help="who is cancelling (default: the OS user)")
