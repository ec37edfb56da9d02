"""Running the engine on a Spark cluster: the ``--py-files`` zip and a standalone cluster on one machine.

:func:`build_py_files` writes ``dist/retry_engine.zip``, the package as
``spark-submit --py-files`` ships it to executors (``retry_engine`` with its
``schemas`` subpackage, sources only).

:class:`StandaloneCluster` starts a Spark standalone master and one worker on
127.0.0.1 from the pip-installed pyspark (``sbin/spark-daemon.sh``), on free
ports and with its own log, pid and work folders, so several can run side by
side; :meth:`StandaloneCluster.stop` stops only the daemons it started (by the
pid files in its own pid folder).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from retry_engine.delta.session import DRIVER_JAVA_OPTIONS
from retry_engine.errors import EnvironmentProblem

log = logging.getLogger(__name__)

DEFAULT_ZIP = Path("dist/retry_engine.zip")
PACKAGE = "retry_engine"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# A fixed timestamp keeps the zip byte-identical for identical sources.
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)


def build_py_files(dest: str | os.PathLike[str] = DEFAULT_ZIP) -> Path:
    """Write the package's Python sources to the zip at ``dest``; return its path.

    The layout is the installed one (``retry_engine/``, ``retry_engine/schemas/``),
    taken from wherever the package is imported from, so an editable checkout and
    an installed wheel give the same zip.
    """
    import retry_engine
    import retry_engine.schemas

    roots = {
        PACKAGE: Path(retry_engine.__file__).parent,
        f"{PACKAGE}/schemas": Path(retry_engine.schemas.__file__).parent,
    }
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for prefix, root in roots.items():
            for source in sorted(root.rglob("*.py")):
                relative = source.relative_to(root)
                if "__pycache__" in relative.parts or (prefix == PACKAGE and relative.parts[0] == "schemas"):
                    continue
                info = zipfile.ZipInfo(f"{prefix}/{relative.as_posix()}", date_time=_ZIP_DATE)
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, source.read_bytes())
    tmp.replace(target)
    log.info("wrote %s", target)
    return target


def spark_home() -> Path:
    """The pip-installed pyspark's SPARK_HOME (it has ``bin/`` and ``sbin/``)."""
    import pyspark

    return Path(pyspark.__file__).parent


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class StandaloneCluster:
    """A standalone master and one worker on ``host``; use as a context manager.

    Everything the daemons write (logs, pid files, executor folders) goes under
    ``work_dir``. ``python`` is the interpreter executors run (``PYSPARK_PYTHON``).
    """

    work_dir: Path
    cores: int = 1
    memory: str = "1g"
    host: str = "127.0.0.1"
    python: str = sys.executable
    start_timeout: float = 90.0
    master_port: int = field(default_factory=free_port)
    master_ui_port: int = field(default_factory=free_port)
    worker_port: int = field(default_factory=free_port)
    worker_ui_port: int = field(default_factory=free_port)

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "logs"

    @property
    def pid_dir(self) -> Path:
        return self.work_dir / "pids"

    @property
    def worker_dir(self) -> Path:
        """Where the worker puts each application's executor folder (and the shipped files)."""
        return self.work_dir / "work"

    def env(self) -> dict[str, str]:
        """The environment for the daemons and for ``spark-submit`` against this cluster."""
        conf_dir = self.work_dir / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_CONF_DIR": str(conf_dir),
            "SPARK_LOG_DIR": str(self.log_dir),
            "SPARK_PID_DIR": str(self.pid_dir),
            "SPARK_WORKER_DIR": str(self.worker_dir),
            "SPARK_IDENT_STRING": "retry-engine",
            "PYSPARK_PYTHON": self.python,
        }

    def _daemon(self, action: str, cls: str, *args: str) -> None:
        script = spark_home() / "sbin" / "spark-daemon.sh"
        done = subprocess.run(
            ["bash", str(script), action, cls, "1", *args],
            env=self.env(), capture_output=True, text=True, check=False,
        )
        if done.returncode != 0:
            raise EnvironmentProblem(
                f"spark-daemon.sh {action} {cls} failed ({done.returncode}): {done.stdout}{done.stderr}",
                code="CLUSTER_DAEMON_FAILED",
            )

    def start(self) -> StandaloneCluster:
        """Start master and worker; return once the worker has registered with the master."""
        for folder in (self.log_dir, self.pid_dir, self.worker_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._daemon("start", MASTER_CLASS, "--host", self.host, "--port", str(self.master_port),
                     "--webui-port", str(self.master_ui_port))
        self._daemon("start", WORKER_CLASS, "--host", self.host, "--port", str(self.worker_port),
                     "--webui-port", str(self.worker_ui_port), "--cores", str(self.cores),
                     "--memory", self.memory, "--work-dir", str(self.worker_dir), self.master_url)
        self._wait_for_worker()
        log.info("standalone cluster up: %s (worker: %d cores, %s)", self.master_url, self.cores, self.memory)
        return self

    def _wait_for_worker(self) -> None:
        url = f"http://{self.host}:{self.master_ui_port}/json/"
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    state = json.load(response)
                if any(w.get("state") == "ALIVE" for w in state.get("workers", [])):
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass  # the master's web UI is not up yet
            time.sleep(0.5)
        raise EnvironmentProblem(
            f"no worker registered with {self.master_url} within {self.start_timeout}s; "
            f"see the daemon logs in {self.log_dir}",
            code="CLUSTER_NOT_READY",
        )

    def stop(self) -> None:
        """Stop the worker, then the master, by their pid files; errors are logged, not raised."""
        for cls in (WORKER_CLASS, MASTER_CLASS):
            try:
                self._daemon("stop", cls)
            except EnvironmentProblem as exc:
                log.warning("stopping %s: %s", cls, exc)

    def submit(
        self,
        app: Sequence[str],
        *,
        py_files: str | os.PathLike[str],
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        log_file: Path,
    ) -> subprocess.Popen[bytes]:
        """Start ``spark-submit`` of ``app`` (script and its arguments) in client mode.

        ``py_files`` goes to the executors (``--py-files``) and onto the driver
        JVM's ``PYTHONPATH``: Spark plans Python data sources (``deltars``) in
        Python workers that the driver JVM starts, and those do not see
        ``--py-files``. The process runs in its own process group so the
        caller can stop all of it (driver and its JVM) at once.
        """
        zip_path = str(Path(py_files).resolve())
        base_env = {**self.env(), **(env or {})}
        python_path = os.pathsep.join(p for p in (zip_path, base_env.get("PYTHONPATH", "")) if p)
        command = [
            str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url,
            "--py-files", zip_path,
            "--driver-java-options", DRIVER_JAVA_OPTIONS,
            "--conf", f"spark.cores.max={self.cores}",
            "--conf", "spark.executor.memory=512m",
        ]
        for key, value in (conf or {}).items():
            command += ["--conf", f"{key}={value}"]
        with log_file.open("ab") as out:
            return subprocess.Popen(
                [*command, *app], env={**base_env, "PYTHONPATH": python_path},
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def __enter__(self) -> StandaloneCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
