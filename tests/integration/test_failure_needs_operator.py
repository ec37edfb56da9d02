"""A query that fails on something only an operator can mend ends `run` at once, in one line (B1, #14 part 1).

The realistic case: an operator compacts consume_results and vacuums it with no retention while the
engine is stopped and behind, so data files of commits the engine has not read yet are gone
(DELTA_FILE_MISSING: the source says which file, why, and how to go on). `run --once` used to end
with a Python traceback of Spark's whole error text; `run` would restart the query for
`engine.restart_attempts` rounds (about 25 minutes) failing the same way each time. Both now exit 1
with the engine's own message on one line, `run` at once and saying it did not restart.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from retry_engine.ops.cli import EXIT_ERROR, EXIT_OK, main
from tests.builders import Result
from tests.lakehouse import Lake

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STOPPED = "retry-engine: the engine stopped: retry_engine.errors.DeltaSourceError: [DELTA_FILE_MISSING] data file "


def test_a_vacuumed_file_the_engine_still_needs_ends_run_and_run_once_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = Lake.make(tmp_path / "lake")
    conf = lake.engine_toml(tmp_path / "engine.toml", restart_delay='"1s"')
    lake.write_results([Result.of(f"a-{i}").ok() for i in range(3)])
    assert main(["run", "--once", "--config", str(conf)]) == EXIT_OK
    for tag in "bcd":  # three commits the engine has not read
        lake.write_results([Result.of(f"{tag}-{i}").ok() for i in range(3)])
    table = DeltaTable(lake.path("consume_results"))
    table.optimize.compact()
    assert table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    capsys.readouterr()

    assert main(["run", "--once", "--config", str(conf)]) == EXIT_ERROR

    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(STOPPED) and err[-1].endswith(f"; tables under {lake.root}"), err[-3:]
    assert "Traceback" not in err[-1] and "=== Streaming Query ===" not in "\n".join(err), err[-3:]

    done = subprocess.run(
        [sys.executable, "-m", "retry_engine.ops.cli", "run", "--config", str(conf)],
        capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == EXIT_ERROR, done.stderr[-4000:]
    assert lines[-2].startswith(STOPPED), lines[-3:]
    assert lines[-1] == "retry-engine: not restarted: [DELTA_FILE_MISSING] needs an operator (see above)"
    assert "restarting in" not in done.stderr
