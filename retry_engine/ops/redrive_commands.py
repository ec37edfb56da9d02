"""``retry-engine redrive list/status/cancel``: the re-drive tasks of :mod:`retry_engine.ops.redrive_tasks`.

Re-drives are started with ``retry-engine dlq redrive``; these commands
watch and stop them, from any machine that can read the lake. CLI code, so
it prints.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import pandas as pd

from retry_engine.config import EngineConfig
from retry_engine.ops import redrive_tasks
from retry_engine.ops.dlq_commands import _emit as emit
from retry_engine.ops.redrive import whoami

EXIT_OK = 0


def run(
    args: argparse.Namespace,
    config: EngineConfig,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run one ``redrive`` subcommand; errors propagate as :class:`RetryEngineError`."""
    out, err = out or sys.stdout, err or sys.stderr
    if args.redrive_command == "list":
        frame = redrive_tasks.tasks(config)
        if args.state:
            frame = frame[frame["state"] == args.state]
        if frame.empty:
            print("no re-drives" + (f" {args.state}" if args.state else ""), file=err)
            return EXIT_OK
        emit(_shown(frame) if args.format == "table" else frame, args.format, out)
        return EXIT_OK
    if args.redrive_command == "status":
        row = redrive_tasks.task(config, args.redrive_id)
        if args.format != "table":
            emit(pd.DataFrame([row]), args.format, out)
            return EXIT_OK
        for key in redrive_tasks.TASK_COLUMNS:
            value = f"{row['moved']}/{row['total']}" if key == "moved" else row[key]
            if key != "total":
                print(f"{key:11} {'-' if value is None or value is pd.NaT else value}", file=out)
        return EXIT_OK
    result = redrive_tasks.cancel(
        config, args.redrive_id, operator=args.operator or whoami(), reason=args.reason
    )
    if result.state == "cancelling":
        print(
            f"re-drive {result.redrive_id}: cancel sent to {result.runs} running run(s); it stops at its next chunk "
            f"(watch: retry-engine redrive status {result.redrive_id})",
            file=out,
        )
    else:
        print(f"re-drive {result.redrive_id} was not running: marked cancelled", file=out)
    return EXIT_OK


def _shown(frame: pd.DataFrame) -> pd.DataFrame:
    shown = frame.assign(
        moved=[f"{m}/{t}" for m, t in zip(frame["moved"], frame["total"], strict=True)]
    )
    return shown[
        [
            "redrive_id",
            "state",
            "target",
            "moved",
            "operator",
            "started_at",
            "ended_at",
            "selection",
        ]
    ]
