"""A class-data-sharing archive of the classes the engine's driver JVM loads, so a local session starts sooner.

A local session's JVM loads and verifies about 15,000 classes (Spark SQL,
streaming, RocksDB state, the Python data source) before its first batch.
JDK 17's dynamic CDS archive (``-XX:ArchiveClassesAtExit``) records them once,
parsed and verified; a JVM started with ``-XX:SharedArchiveFile`` maps it
instead. Measured on this 2-core machine, three interleaved rounds: session
11.1 s -> 6.2 s, a first pandas/aggregate job 8.1 s -> 4.4 s, JVM+Python CPU
33 s -> 19 s (bench/RESULTS.md, "Run M").

The archive is written by :func:`write_archive` (``retry-engine prepare``;
``make venv`` runs it): a child process runs the engine once on a small
temporary lake and its JVM writes the archive when it exits. It lives in the
cache folder (``RETRY_ENGINE_CACHE_DIR``, else ``$XDG_CACHE_HOME/retry-engine``,
else ``~/.cache/retry-engine``) next to a JSON record of its size and SHA-256.

A JVM given a truncated archive dies at start (measured: a fatal error, even
with ``-XX:+VerifySharedSpaces``), so :func:`jvm_options` offers an archive only
when its size and SHA-256 match that record (0.15 s for the 160 MB file, once
per process). An archive from another Java or Spark class path is refused by
the JVM itself, silently (``-Xlog:cds=off``): it starts the slow way. With
``RETRY_ENGINE_CLASS_ARCHIVE=off``, or without a verified archive, nothing
changes. Only local sessions this package launches get the option; under
``spark-submit`` the JVM exists before any Python runs.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from retry_engine.errors import EnvironmentProblem

log = logging.getLogger(__name__)

CACHE_ENV = "RETRY_ENGINE_CACHE_DIR"
SWITCH_ENV = "RETRY_ENGINE_CLASS_ARCHIVE"
# Set only in the child that writes an archive: its JVM dumps to this path at exit.
_DUMP_ENV = "RETRY_ENGINE_CLASS_ARCHIVE_DUMP"
RECORD_FORMAT = 1
# The JVM's own CDS messages: a refused archive (another Java, another class path) is not an
# error, the JVM just loads classes the usual way.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
TRAINING_TIMEOUT_S = 600.0
_HASH_CHUNK = 1 << 22


def cache_dir() -> Path:
    """The folder for this package's caches (the Spark home links, the class archive)."""
    named = os.environ.get(CACHE_ENV, "").strip()
    if named:
        return Path(named).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".cache"
    return base / "retry-engine"


def switched_on(env: str) -> bool:
    """Whether the switch ``env`` is on: unset or anything but off, 0, false, no (any case)."""
    return os.environ.get(env, "on").strip().lower() not in ("off", "0", "false", "no")


def enabled() -> bool:
    return switched_on(SWITCH_ENV)


def archive_path(spark_home: str, java_version: str) -> Path:
    """Where the archive for this Spark home, its jars and this Java lives (another pyspark: another file)."""
    key = hashlib.sha256(f"{spark_home}\0{java_version}\0{_jars_signature(spark_home)}".encode())
    return cache_dir() / f"spark-classes-{key.hexdigest()[:16]}.jsa"


def _jars_signature(spark_home: str) -> str:
    try:
        jars = []
        for entry in os.scandir(os.path.join(spark_home, "jars")):
            st = entry.stat()
            jars.append((entry.name, st.st_size, st.st_mtime_ns))
        jars.sort()
    except OSError:
        return ""
    return hashlib.sha256(repr(jars).encode()).hexdigest()


def _record_path(archive: Path) -> Path:
    return archive.with_suffix(".json")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _read_record(archive: Path) -> Mapping[str, Any] | None:
    try:
        record = json.loads(_record_path(archive).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


@functools.lru_cache(maxsize=8)
def _verified(path: str, size: int, mtime_ns: int) -> bool:
    archive = Path(path)
    record = _read_record(archive)
    if record is None or record.get("format") != RECORD_FORMAT:
        return False
    if record.get("size") != size or not isinstance(record.get("sha256"), str):
        return False
    try:
        return bool(_sha256(archive) == record["sha256"])
    except OSError:
        return False


def verified_archive(spark_home: str, java_version: str) -> Path | None:
    """The archive for this Spark home and Java if it is whole (size and SHA-256 as recorded), else None."""
    archive = archive_path(spark_home, java_version)
    try:
        stat = archive.stat()
    except OSError:
        return None
    if _verified(str(archive), stat.st_size, stat.st_mtime_ns):
        return archive
    log.warning("ignoring the class archive %s: it does not match its record (%s); run `retry-engine prepare` "
                "to write it again", archive, _record_path(archive))
    return None


def jvm_options(spark_home: str | None, java_version: str | None) -> str:
    """The driver JVM options for a local session launched with ``spark_home`` ("" for none)."""
    dump = os.environ.get(_DUMP_ENV)
    if dump:
        return f"-XX:ArchiveClassesAtExit={dump} {_QUIET}"
    if not enabled() or spark_home is None or java_version is None:
        return ""
    archive = verified_archive(spark_home, java_version)
    return f"-XX:SharedArchiveFile={archive} {_QUIET}" if archive is not None else ""


def _installation() -> tuple[str, str]:
    """The Spark home a local session launches from and the Java it runs on."""
    from retry_engine.delta.session import (
        forget_gone_worker_home,
        java_version_text,
        worker_spark_home,
    )

    forget_gone_worker_home()  # as build_session does: a home inherited from an exited engine is gone
    java = java_version_text()
    home = os.environ.get("SPARK_HOME") or worker_spark_home()
    if java is None or home is None:
        raise EnvironmentProblem(
            "no class archive for this installation: " + ("no Java found" if java is None else "no Spark home"),
            code="CLASS_ARCHIVE_UNAVAILABLE",
        )
    return home, java


def current_archive() -> Path | None:
    """This installation's archive, if one is there and whole."""
    return verified_archive(*_installation())


def write_archive(*, timeout_s: float = TRAINING_TIMEOUT_S) -> Path:
    """Write (or replace) the class archive for this installation; returns its path.

    A child process runs the engine once on a small temporary lake and stops
    its JVM, which writes the archive to a temporary name as it exits; the
    archive and then its record are renamed into place, so a reader sees a
    whole archive or the previous one (whose record then no longer matches).
    Raises :class:`~retry_engine.errors.EnvironmentProblem` when that fails.
    """
    home, java = _installation()
    target = archive_path(home, java)
    log.info("writing the JVM class archive %s (once per installation, about a minute)", target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".spark-classes-", suffix=".jsa", dir=target.parent)
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot write a class archive under {target.parent}: {exc} (set {CACHE_ENV} to a writable folder)",
            code="CLASS_ARCHIVE_UNWRITABLE",
        ) from exc
    os.close(fd)
    dump = Path(name)
    dump.unlink()  # the JVM creates it; an empty file left here would look like a dump
    try:
        env = {**os.environ, _DUMP_ENV: str(dump), "SPARK_HOME": home}
        child = subprocess.run(
            [sys.executable, "-m", "retry_engine.delta._class_archive"],
            env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
        )
        if child.returncode != 0 or not dump.is_file() or dump.stat().st_size == 0:
            raise EnvironmentProblem(
                f"the class archive was not written (training run exit code {child.returncode}): "
                f"{child.stderr.strip()[-2000:]}",
                code="CLASS_ARCHIVE_FAILED",
            )
        record = {"format": RECORD_FORMAT, "size": dump.stat().st_size, "sha256": _sha256(dump),
                  "spark_home": home, "java": java, "written": dt.datetime.now(dt.UTC).isoformat()}
        staged = dump.with_suffix(".json")
        staged.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(dump, target)
        os.replace(staged, _record_path(target))
    except subprocess.TimeoutExpired as exc:
        raise EnvironmentProblem(
            f"the class archive training run did not finish in {timeout_s:.0f} s", code="CLASS_ARCHIVE_FAILED"
        ) from exc
    finally:
        for left in (dump, dump.with_suffix(".json")):
            left.unlink(missing_ok=True)
    log.info("class archive written: %s (%.0f MB)", target, target.stat().st_size / 2**20)
    prune_archives(keep=target)
    return target


def prune_archives(*, keep: Path) -> list[Path]:
    """Remove the other archives of ``keep``'s Spark home, and those of homes that are gone; returns them.

    Each reinstall of pyspark (new jars) gets an archive of its own, 170 MB,
    so the one written last replaces the earlier ones of the same home.
    Archives of other homes that still exist (another virtualenv) are kept.
    """
    record = _read_record(keep) or {}
    removed = []
    for other in sorted(keep.parent.glob("spark-classes-*.jsa")):
        if other == keep:
            continue
        home = (_read_record(other) or {}).get("spark_home")
        if not isinstance(home, str) or (home != record.get("spark_home") and os.path.isdir(home)):
            continue
        for path in (other, _record_path(other)):
            path.unlink(missing_ok=True)
        removed.append(other)
    return removed


def _train() -> None:
    """The child of :func:`write_archive`: load what an engine run loads, then let the JVM exit and dump."""
    from pyspark import SparkContext

    from retry_engine.clients.consume_results import append_consume_results
    from retry_engine.core import engine
    from retry_engine.delta.session import build_session
    from retry_engine.ops.demo import demo_config

    with tempfile.TemporaryDirectory(prefix="retry-engine-train-") as work:
        config = demo_config(os.path.join(work, "lake"))
        spark = build_session(shuffle_partitions=config.engine.shuffle_partitions, log_level="ERROR",
                              extra_conf={"spark.sql.adaptive.enabled": "false"})
        for run in range(2):  # the second run restores the checkpoint and the state store
            append_consume_results(config, [
                {"consumer_group": "train", "topic": "t", "msg_id": f"m{run}-{i}",
                 "status": "CONSUME_SUCCESS" if i % 2 else "RECONSUME_LATER"}
                for i in range(8)
            ])
            engine.run_once(spark, config)
        gateway = SparkContext._gateway
        spark.stop()
        proc = getattr(gateway, "proc", None)
        if gateway is not None:
            gateway.shutdown()
        if proc is not None:
            # The gateway JVM exits when its stdin closes (PythonGatewayServer); it dumps on exit.
            proc.stdin.close()
            proc.wait(timeout=TRAINING_TIMEOUT_S)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    _train()
