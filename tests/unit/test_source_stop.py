"""The deltars stream reader's stop() when its query stops (#13 part 2: no traceback at a clean stop).

PySpark runs a stream reader's planning in a runner process whose loop reads
the next call from the JVM; when the query stops, the JVM hangs up, the read
raises EOFError, the runner calls ``reader.stop()`` in a ``finally`` and then
tries to report the EOFError over the closed socket, dying with a
BrokenPipeError traceback on stderr (seen at the demo's Ctrl-C). The script
below follows that control flow (pyspark/sql/streaming/python_streaming_source_runner.py)
over a real socket whose peer has closed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from retry_engine.delta import ensure_table
from retry_engine.schemas import CONSUME_RESULTS

RUNNER = """
import socket, struct, sys
from pyspark.serializers import read_int
from retry_engine.delta.source import DeltaStreamReader, SourceOptions
from retry_engine.schemas import CONSUME_RESULTS

reader = DeltaStreamReader(SourceOptions.parse({"path": sys.argv[1]}), CONSUME_RESULTS.spark_schema)
if sys.argv[2] == "reset":
    # Over TCP, a peer that closes with SO_LINGER 0 resets the connection: the read raises
    # ConnectionResetError instead of EOFError (what the demo's Ctrl-C met in CI).
    server = socket.create_server(("127.0.0.1", 0))
    ours = socket.create_connection(server.getsockname())
    jvm, _ = server.accept()
    jvm.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
else:
    ours, jvm = socket.socketpair()
stream = ours.makefile("rwb")
jvm.close()  # the query stopped: the JVM hung up
try:
    try:
        if sys.argv[2] in ("hangup", "reset"):
            read_int(stream)  # EOFError, or ConnectionResetError after a reset
        else:
            raise ValueError("a real planning error")
    finally:
        reader.stop()
except BaseException:
    stream.write(b"error report" * 10_000)  # the runner reports it over the closed socket
    stream.flush()
"""


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("src") / "consume_results")
    ensure_table(path, CONSUME_RESULTS.arrow_schema)
    return path


def _runner(table: str, how: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUNNER, table, how], capture_output=True, text=True, timeout=120,
                          check=False, cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("how", ["hangup", "reset"])
def test_a_hang_up_at_stop_prints_nothing(table: str, how: str) -> None:
    proc = _runner(table, how)
    assert proc.returncode != 0  # the runner still ends as PySpark makes it end
    assert proc.stderr == ""


def test_any_other_error_is_still_printed(table: str) -> None:
    proc = _runner(table, "error")
    assert "Traceback" in proc.stderr and "a real planning error" in proc.stderr
