"""The suite's own guard (#16 item 4): a hung test fails with the stacks of its threads, and the run goes on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_hung_test_fails_with_a_stack_and_the_next_test_still_runs(tmp_path: Path) -> None:
    hung = tmp_path / "test_hung.py"
    hung.write_text(
        "import threading, time\n"
        "def test_waits_forever():\n"
        "    threading.Event().wait()\n"
        "def test_after():\n"
        "    assert True\n"
    )
    # The project's own pytest settings (setup.cfg) with only the limit lowered.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(REPO),
            "-c",
            str(REPO / "setup.cfg"),
            "--timeout=2",
            str(hung),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "Timeout" in out and "test_waits_forever" in out, out
    assert "1 failed, 1 passed" in out, out


def test_the_suite_has_a_per_test_timeout() -> None:
    """setup.cfg sets one; without it a hung streaming query would eat the whole CI budget."""
    config = (REPO / "setup.cfg").read_text()
    assert any(
        line.strip().startswith("timeout = ") and int(line.split("=")[1]) > 0
        for line in config.splitlines()
    )
