"""CLI output into a pipe whose reader has gone (`retry-engine dlq list | head`): a quiet exit (#13 part 2).

Each command runs as a real process writing into a real pipe whose read end
is closed before the command writes: the write fails with EPIPE, as it does
when `head` has read its lines and exited. Without handling, Python prints a
BrokenPipeError traceback (or "Exception ignored ... BrokenPipeError" at its
final flush) and exits 1 or 120.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import write_deltalake

from retry_engine.ops.cli import EXIT_BROKEN_PIPE
from retry_engine.schemas import DLQ, PROGRESS
from tests.unit.test_dlq_selection import _dlq_rows as dlq_rows

CONF = "{conf}"
COMMANDS = [
    ["check-config", "--config", CONF],
    ["status", "--config", CONF],
    ["status", "--config", CONF, "--json"],
    ["dlq", "list", "--config", CONF],
]


@pytest.fixture(scope="module")
def conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pipes")
    lake = root / "lake"
    write_deltalake(str(lake / "progress"), PROGRESS.arrow_schema.empty_table())
    write_deltalake(str(lake / "dlq"), dlq_rows(), partition_by=list(DLQ.partition_by))
    path = root / "c.toml"
    path.write_text(f'[engine]\nlake = "{lake}"\n')
    return path


def run_into_closed_pipe(args: list[str]) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes a byte
    try:
        return subprocess.run(
            [sys.executable, "-m", "retry_engine.ops.cli", *args],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(a for a in c if a not in ("--config", CONF)))
def test_a_closed_pipe_ends_the_command_quietly(conf: Path, command: list[str]) -> None:
    proc = run_into_closed_pipe([str(conf) if a == CONF else a for a in command])
    assert proc.returncode == EXIT_BROKEN_PIPE, proc.stderr
    for noise in ("Traceback", "BrokenPipeError", "Exception ignored"):
        assert noise not in proc.stderr, proc.stderr


def test_the_same_commands_print_normally_into_an_open_pipe(conf: Path) -> None:
    """The handling does not swallow output: a reader that stays gets every line."""
    proc = subprocess.run(
        [sys.executable, "-m", "retry_engine.ops.cli", "check-config", "--config", str(conf)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"{conf.parent}/lake/dlq" in proc.stdout and "checkpoint" in proc.stdout
