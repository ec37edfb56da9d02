"""Issue 6: the engine unchanged on a real Spark standalone cluster, submitted with spark-submit.

A master and a worker run from the pip-installed pyspark on 127.0.0.1 (free
ports, temp folders). The executors run an interpreter that cannot see the
editable install of ``retry_engine``: the only way they can import the package
is the ``--py-files`` zip, so a passing run shows the zip is complete.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from retry_engine.ops.cluster import StandaloneCluster, build_py_files
from tests.builders import Result
from tests.integration.test_engine import redeliver
from tests.lakehouse import FAST_LEVELS, Lake, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MAX_TIMES = 2

# Executors run this instead of the venv's python: same interpreter and
# site-packages, minus the editable install's import hook.
_NO_EDITABLE = '''\
import os, runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
args = sys.argv[1:]
while args and args[0] in ("-u", "-B"):
    args.pop(0)
if args[:1] != ["-m"]:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
sys.argv = [args[1], *args[2:]]
runpy.run_module(args[1], run_name="__main__", alter_sys=True)
'''


def _executor_python(folder: Path) -> Path:
    script = folder / "no_editable.py"
    script.write_text(_NO_EDITABLE)
    wrapper = folder / "python-no-editable"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM spark-submit (its JVM stops the context and the Python driver), then SIGKILL what is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def test_issue6_engine_on_standalone_cluster_with_py_files_zip(tmp_path: Path) -> None:
    python = _executor_python(tmp_path)
    hidden = subprocess.run([str(python), "-m", "retry_engine.ops.cli", "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert "No module named 'retry_engine'" in hidden.stderr, "executors could import the package without the zip"

    py_files = build_py_files(tmp_path / "dist" / "retry_engine.zip")
    lake = Lake.make(tmp_path / "lake", group_defaults={"retry_max_times": MAX_TIMES})
    conf = tmp_path / "engine.toml"
    conf.write_text(
        f'[engine]\nlake = "{tmp_path / "lake"}"\ntrigger_interval = "200ms"\nstate_bucket = "1s"\n'
        f'message_delay_level = "{FAST_LEVELS}"\n[group_defaults]\nretry_max_times = {MAX_TIMES}\n'
    )
    lake.write_results([Result.of("FAIL").failed(), Result.of("OK").ok(), Result.of("BAD").with_(status="MAYBE")])
    log = tmp_path / "spark-submit.log"
    cluster = StandaloneCluster(tmp_path / "cluster", cores=1, memory="1g", python=str(python))
    with cluster:
        app = cluster.submit(
            [str(REPO / "jobs" / "run_engine.py"), "--config", str(conf)],
            py_files=py_files,
            env={"PYSPARK_DRIVER_PYTHON": sys.executable},
            log_file=log,
        )
        try:
            handled: set[str] = set()

            def ladder_done() -> bool:
                if app.poll() is not None:
                    raise AssertionError(f"spark-submit exited {app.returncode}:\n{log.read_text()[-4000:]}")
                fresh = [r for r in lake.rows("retry") if r["msg_id"] not in handled]
                if fresh:
                    handled.update(r["msg_id"] for r in fresh)
                    lake.write_results([redeliver(r) for r in fresh])
                return len(lake.rows("dlq")) == 1 and len(lake.rows("outcomes")) == 3 + MAX_TIMES

            wait_for(ladder_done, timeout=300, what=f"the ladder on the cluster (log: {log})")
        finally:
            _stop(app)
        shipped = list(cluster.worker_dir.glob("app-*/*/retry_engine.zip"))

    assert shipped, f"no executor received the zip under {cluster.worker_dir}"
    outcomes = Counter(o["outcome"] for o in lake.rows("outcomes"))
    assert outcomes == {"retry": MAX_TIMES, "acknowledged": 1, "quarantined": 1, "dead_letter": 1}
    retries = sorted(lake.rows("retry"), key=lambda r: r["reconsume_times"])
    assert [r["reconsume_times"] for r in retries] == list(range(1, MAX_TIMES + 1))
    assert all(r["delivered_at"] >= r["due_at"] for r in retries)
    (dead,) = lake.rows("dlq")
    assert dead["origin_msg_id"] == "FAIL" and dead["reason_code"] == "MAX_RECONSUME_TIMES"
    (bad,) = lake.rows("quarantine")
    assert bad["reason_code"] == "UNKNOWN_STATUS"
