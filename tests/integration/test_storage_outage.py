"""`retry-engine run` rides out a storage outage (#14 part 4, B1): a real engine process, a real S3 API.

The engine reaches moto's S3 server through a TCP relay this test can cut (every connection reset,
as a network partition or a store restarting does); the test itself writes and reads the tables
directly. delta-rs retries each request only once here (``max_retries = "1"`` in ``[storage]``), so
the query fails within a second of the cut instead of after ten retries.

One engine process: results A are decided; results B (3,000) are appended and the relay is cut
while the engine works on them, until the engine reports its query failed and a few seconds more
(its restarts fail, each counted); the relay comes back, the engine restarts from its checkpoint,
decides B and then C, and every result has exactly one outcome. Then
the relay is cut for good: after ``engine.restart_attempts`` restarts in a row without a completed
micro-batch the command gives up with exit code 1, its last lines saying why in one line each.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retry_engine import append_consume_results
from retry_engine.config import EngineConfig, parse_config
from retry_engine.delta.tables import read_table
from tests.lakehouse import FAST_LEVELS, wait_for
from tests.s3 import S3Server

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RESTARTS = 3
A, B = 6, 3000
# B's append returns once its commit is on the store; the engine's next batch starts within its
# 200 ms trigger and reads, decides and commits B over about a second on this machine.
CUT_AFTER_S = 0.4


class Relay:
    """A TCP relay to ``target_port`` on 127.0.0.1 whose connections can be cut (reset, and refused while cut)."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.cut = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self._target))
            with self._lock:
                self._open |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                if self.cut.is_set():
                    break
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def set_cut(self, cut: bool) -> None:
        if cut:
            self.cut.set()
            with self._lock:
                for s in self._open:
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                self._open.clear()
        else:
            self.cut.clear()

    def close(self) -> None:
        self._server.close()


@pytest.fixture()
def relay(s3_server: S3Server) -> Iterator[Relay]:
    port = int(s3_server.endpoint.rsplit(":", 1)[1])
    relay = Relay(port)
    yield relay
    relay.close()


def _engine_toml(relay: Relay, server: S3Server, lake: str, checkpoint: Path) -> str:
    storage = {**server.storage_options(), "aws_endpoint_url": f"http://127.0.0.1:{relay.port}", "max_retries": "1"}
    return "\n".join([
        "[engine]",
        f'lake = "{lake}"',
        f'checkpoint = "{checkpoint}"',
        'trigger_interval = "200ms"',
        'state_bucket = "1s"',
        f'message_delay_level = "{FAST_LEVELS}"',
        f"restart_attempts = {RESTARTS}",
        'restart_delay = "1s"',
        "",
        "[storage]",
        *(f"{k} = {json.dumps(v)}" for k, v in storage.items()),
    ]) + "\n"


def _results(tag: str, count: int) -> list[dict[str, Any]]:
    return [
        {"consumer_group": "G", "msg_id": f"{tag}-{i}", "topic": "orders", "body": b"x",
         "status": "CONSUME_SUCCESS" if i % 2 else "RECONSUME_LATER"}
        for i in range(count)
    ]


def _outcomes(config: EngineConfig) -> Counter[str]:
    try:
        return Counter(read_table(config.table_path("outcomes")).column("msg_id").to_pylist())
    except Exception:  # not created yet
        return Counter()


def test_the_engine_restarts_after_a_storage_outage_and_gives_up_when_it_lasts(
    s3_server: S3Server, relay: Relay, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    lake = f"s3://{bucket}/lake"
    direct = parse_config({"engine": {"lake": lake}, "storage": s3_server.storage_options()})
    conf = tmp_path / "engine.toml"
    conf.write_text(_engine_toml(relay, s3_server, lake, tmp_path / "checkpoints"))
    err_path = tmp_path / "engine.err"
    append_consume_results(direct, _results("a", A))

    with err_path.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "retry_engine.ops.cli", "run", "--config", str(conf)],
            stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    context = lambda: f"engine stderr:\n{err_path.read_text()[-8000:]}"  # noqa: E731
    try:
        wait_for(lambda: len(_outcomes(direct)) == A, timeout=180, what=f"results A decided\n{context()}")

        # B arrives and the store goes away while the engine reads, decides or commits it.
        append_consume_results(direct, _results("b", B))
        time.sleep(CUT_AFTER_S)
        relay.set_cut(True)
        wait_for(lambda: "restarting in" in err_path.read_text(), timeout=60, what=f"the failure\n{context()}")
        time.sleep(3)  # a restart or two fails on the cut store, each counted
        assert proc.poll() is None, context()
        relay.set_cut(False)
        append_consume_results(direct, _results("c", A))
        wait_for(lambda: len(_outcomes(direct)) == A + B + A, timeout=120, what=f"results B, C decided\n{context()}")

        # B1: each result decided exactly once across the failure and the restarts.
        want = Counter({f"{t}-{i}": 1 for t, n in (("a", A), ("b", B), ("c", A)) for i in range(n)})
        assert _outcomes(direct) == want, context()
        text = err_path.read_text()
        assert "retry-engine: restarted (query " in text, context()
        failed = [line for line in text.splitlines() if line.startswith("retry-engine: the engine stopped:")]
        assert failed and all("restarting in" in line for line in failed), context()
        assert all("Traceback" not in line and "\x1b[" not in line for line in failed), context()

        # B7: the failed run's terminated event (with its exception), buffered while the store was gone,
        # reaches the progress table through the restarted query's recorder.
        def failed_runs() -> int:
            try:
                events = read_table(direct.table_path("progress")).select(["event", "exception"]).to_pylist()
            except Exception:
                return 0
            return sum(1 for e in events if e["event"] == "terminated" and e["exception"])

        wait_for(lambda: failed_runs() >= 1, timeout=60, what=f"the failed run recorded\n{context()}")

        relay.set_cut(True)  # for good: the restarts run out
        assert proc.wait(timeout=180) == 1, context()
        last = err_path.read_text().splitlines()[-2:]
        assert last[0].startswith("retry-engine: the engine stopped: ") and "cannot reach" in last[0], context()
        assert last[1] == (
            f"retry-engine: gave up after {RESTARTS} restarts in a row without a completed micro-batch "
            "(engine.restart_attempts)"
        ), context()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
