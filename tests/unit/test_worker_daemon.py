"""The preloading worker daemon (retry_engine.delta._daemon, #14 part 3): it forks only when alone.

PySpark's own daemon imports pandas and pyarrow after each fork because they may start threads;
this one imports them before, so it must never fork with a second thread. These run the daemon
as Spark does (``python -m <module> pyspark.worker``, its port on stdout, stop by closing stdin).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from retry_engine.delta import _daemon, session

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc")

# Starts a thread, then runs the daemon module as `python -m` would.
WITH_A_THREAD = (
    "import threading, time, runpy, sys\n"
    "threading.Thread(target=time.sleep, args=(120,), daemon=True).start()\n"
    "sys.argv = [sys.argv[0], 'pyspark.worker']\n"
    "runpy.run_module('retry_engine.delta._daemon', run_name='__main__', alter_sys=True)\n"
)


def _env(*, thread_free: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _daemon.THREAD_FREE_ENV}
    return {**env, **(_daemon.THREAD_FREE_ENV if thread_free else {})}


def _started(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str, int]:
    """Start a daemon; once it wrote its port, its command line and thread count."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    port_bytes = proc.stdout.read(4)
    assert len(port_bytes) == 4, proc.stderr.read() if proc.stderr else b""
    assert 0 < struct.unpack("!i", port_bytes)[0] < 65536
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode().replace("\0", " ")
    threads = len(os.listdir(f"/proc/{proc.pid}/task"))
    return proc, cmdline, threads


def _stop(proc: subprocess.Popen[bytes]) -> str:
    """Close its stdin, as Spark stops a daemon; it exits (1, as PySpark's own does), printing nothing."""
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.close()
    proc.wait(timeout=30)
    return proc.stderr.read().decode()


def test_the_daemon_preloads_and_serves_single_threaded() -> None:
    proc, cmdline, threads = _started(
        [sys.executable, "-m", "retry_engine.delta._daemon", "pyspark.worker"], _env(thread_free=True))
    try:
        assert "-m retry_engine.delta._daemon" in cmdline
        assert threads == 1
    finally:
        assert _stop(proc) == ""


def test_a_daemon_that_is_not_alone_after_importing_becomes_pyspark_s_own() -> None:
    """A thread when the imports are done (here started before them): exec PySpark's daemon, same pid."""
    proc, cmdline, _ = _started([sys.executable, "-c", WITH_A_THREAD, "x"], _env(thread_free=True))
    try:
        assert f"-m {_daemon.PYSPARK_DAEMON} pyspark.worker" in cmdline, cmdline
    finally:
        assert _stop(proc) == ""


def test_without_the_environment_the_libraries_start_threads_so_it_falls_back() -> None:
    """What THREAD_FREE_ENV is for: without it a preload is not alone (pyarrow's or deltalake's
    jemalloc thread, numpy's OpenBLAS pool), and the daemon must not fork from it."""
    code = "from retry_engine.delta import _daemon; print(_daemon.preload())"
    out = subprocess.run([sys.executable, "-c", code], env=_env(thread_free=False),
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
    proc, cmdline, _ = _started(
        [sys.executable, "-m", "retry_engine.delta._daemon", "pyspark.worker"], _env(thread_free=False))
    try:
        assert f"-m {_daemon.PYSPARK_DAEMON} pyspark.worker" in cmdline, cmdline
    finally:
        assert _stop(proc) == ""


def test_preload_reports_a_module_that_starts_a_thread(tmp_path: Path) -> None:
    (tmp_path / "starts_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from retry_engine.delta import _daemon; "
            "print(_daemon.preload(('json',)), _daemon.preload(('starts_a_thread',)))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=_env(thread_free=True),
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "True False", out


class _StoppedSession:
    def range(self, *args: object, **kwargs: object) -> object:
        raise RuntimeError("Cannot call methods on a stopped SparkContext.")


def test_warming_on_a_stopped_session_ends_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    thread = session.warm_python_workers(_StoppedSession())  # type: ignore[arg-type]
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("value", ["off", "OFF", " 0 ", "false", "no"])
def test_warming_turned_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(session.WARM_WORKERS_ENV, value)
    assert not session.warming_workers()


@pytest.mark.parametrize("value", ["on", "", "1", "yes", "garbage"])
def test_warming_on_unless_turned_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(session.WARM_WORKERS_ENV, value)
    assert session.warming_workers()


def _jar(path: Path, names: list[str]) -> str:
    with zipfile.ZipFile(path, "w") as jar:
        for name in names:
            jar.writestr(name, b"")
    return str(path)


def test_only_jars_without_python_leave_the_path(tmp_path: Path) -> None:
    classes = _jar(tmp_path / "classes.jar", ["org/Foo.class", "META-INF/MANIFEST.MF"])
    with_py = _jar(tmp_path / "with_py.jar", ["org/Foo.class", "pkg/__init__.py"])
    with_pyc = _jar(tmp_path / "with_pyc.jar", ["pkg/__init__.pyc"])
    empty = _jar(tmp_path / "empty.jar", [])
    garbage = tmp_path / "garbage.jar"
    garbage.write_bytes(b"not a zip at all")
    folder = tmp_path / "folder.jar"
    folder.mkdir()
    path = [str(tmp_path), classes, with_py, str(tmp_path / "missing.jar"), with_pyc, empty, str(garbage),
            str(folder), "", "/a/b.zip"]
    assert _daemon.without_pythonless_jars(path) == [
        str(tmp_path), with_py, str(tmp_path / "missing.jar"), with_pyc, str(garbage), str(folder), "", "/a/b.zip"]


def test_a_module_that_fails_to_import_means_pyspark_s_daemon() -> None:
    """A broken or missing dependency must not kill the daemon (Spark would fail every Python task)."""
    code = ("from retry_engine.delta import _daemon; "
            "print(_daemon.preload(('json', 'no_such_module_here')))")
    done = subprocess.run([sys.executable, "-c", code], env=_env(thread_free=True),
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    assert "importing no_such_module_here failed" in done.stderr and "pyspark.daemon" in done.stderr
