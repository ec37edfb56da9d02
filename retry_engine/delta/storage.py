"""Where the lake's tables live and how every delta-rs call reaches them (local folders or object storage).

A table is a path or a URI (``s3://bucket/lake/dlq``). Object stores need
storage options (endpoint, region, ``allow_http``, the commit mechanism,
maybe credentials): the ``[storage]`` table of the config. Every table and
file the package opens goes through this module, which finds the options of
a URI in a process-wide registry filled when a config is validated
(:func:`register`, called for the lake and every ``[tables]`` path).

Code on Spark executors cannot see that registry (another process): the
driver passes the options along, as ``storage.<key>`` options of the
``deltars`` source and sink (:func:`spark_options`) or inside the pickled
write task.

Secrets (keys, tokens, passwords) are kept out of ``repr``, logs, error
messages and ``check-config``: :func:`redacted` is the only form ever shown.

Commit safety (:func:`check_commit_safety`): two writers must never both
commit one table version. delta-rs commits on S3 with a conditional put
(``If-None-Match: *``, what AWS S3, MinIO, R2 and moto's server support) or,
when ``aws_s3_locking_provider = "dynamodb"``, through a DynamoDB lock;
configurations that turn both off are refused before anything is written.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from retry_engine.errors import ConfigError, StorageError

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

    from retry_engine.delta._log import TableLocation

log = logging.getLogger(__name__)

# A URI with a scheme other than file: (s3://, s3a://, gs://, abfss://, az://, memory://).
_REMOTE = re.compile(r"^(?!file:)[A-Za-z][A-Za-z0-9+.-]*://")
# Option keys whose values are never shown: AWS/Azure/GCS keys, tokens, passwords, SAS.
_SECRET_WORDS = "secret|token|password|passwd|key|sas|credential|signature"
_SECRET = re.compile(_SECRET_WORDS, re.IGNORECASE)
REDACTED = "***"
# Prefix of storage options among the ``deltars`` source and sink options.
SPARK_OPTION_PREFIX = "storage."
# ``spark.sql.redaction.options.regex`` of the engine's sessions: Spark's default (URLs) and every storage
# option of a secret, as :func:`redacted` hides them (Spark's own rule misses Azure's and GCS's keys).
SPARK_REDACTED_OPTIONS = rf"(?i)url|^{re.escape(SPARK_OPTION_PREFIX)}.*({_SECRET_WORDS})"

# delta-rs settings that decide how a commit is made on S3 (case-insensitive, with or without ``aws_``).
UNSAFE_RENAME = "aws_s3_allow_unsafe_rename"
CONDITIONAL_PUT = "aws_conditional_put"
COPY_IF_NOT_EXISTS = "aws_copy_if_not_exists"
LOCKING_PROVIDER = "aws_s3_locking_provider"
SAFE_LOCKING_PROVIDERS = ("dynamodb",)
S3_SCHEMES = ("s3", "s3a")


def is_remote(uri: str) -> bool:
    """Whether ``uri`` names object storage (any scheme but ``file:``), not a local path."""
    return _REMOTE.match(uri) is not None


def shown_path(uri: str) -> str:
    """A lake or table as messages name it: a URI (``s3://``, ``file:``) as given, a local path absolute."""
    return uri if is_remote(uri) or uri.startswith("file:") else os.path.abspath(uri)


def scheme(uri: str) -> str:
    """The URI's scheme, lower case; ``""`` for a local path."""
    return uri.split("://", 1)[0].lower() if is_remote(uri) else ""


def is_secret(key: str) -> bool:
    """Whether the value of storage option ``key`` must never be shown."""
    return _SECRET.search(key) is not None


def setting_text(value: Any) -> Any:
    """A TOML scalar as the string a delta-rs or Spark setting takes (``true``/``false``, a number as
    written, a string as it is); anything else is returned unchanged for the caller to refuse."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


def normalize(options: Mapping[str, Any]) -> dict[str, str]:
    """Options with lower-case keys and string values (delta-rs keys are case-insensitive)."""
    out: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(
                f"storage option name {key!r} must be a non-empty string",
                code="INVALID_STORAGE_OPTION",
            )
        text = setting_text(value)
        if not isinstance(text, str):
            shown = REDACTED if is_secret(key) else repr(value)
            raise ConfigError(
                f"storage option {key} = {shown} must be a string, number or boolean",
                code="INVALID_STORAGE_OPTION",
            )
        out[key.strip().lower()] = text
    return out


def redacted(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` fit to print: every secret value replaced by ``***``."""
    return {key: REDACTED if is_secret(key) else value for key, value in options.items()}


def _setting(options: Mapping[str, str], env: Mapping[str, str], name: str) -> str | None:
    """A delta-rs S3 setting from the options (``aws_x`` or ``x``), else the environment (``AWS_X``)."""
    short = name.removeprefix("aws_")
    for key in (name, short):
        if key in options:
            return options[key]
    return env.get(name.upper())


def check_commit_safety(
    uri: str, options: Mapping[str, str], env: Mapping[str, str] | None = None
) -> None:
    """Refuse S3 settings under which two writers could both commit one table version.

    delta-rs makes a commit by creating ``_delta_log/<version>.json`` only if
    absent. On S3 that needs a conditional put (the default) or a DynamoDB
    lock; unsafe renames or a disabled conditional put without a lock let a
    second writer overwrite the first one's commit, silently losing it.
    Raises :class:`~retry_engine.errors.ConfigError` (code
    ``UNSAFE_OBJECT_STORE_COMMITS``) naming the setting and the fix.
    """
    if scheme(uri) not in S3_SCHEMES:
        return
    env = os.environ if env is None else env
    fixes = (
        f'Remove it; delta-rs then commits with S3 conditional writes (set {CONDITIONAL_PUT} = "etag" for stores '
        f'that need it), or set {LOCKING_PROVIDER} = "dynamodb" to commit through a DynamoDB lock'
    )
    unsafe = _setting(options, env, UNSAFE_RENAME)
    if unsafe is not None and unsafe.strip().lower() not in ("false", "0", ""):
        raise ConfigError(
            f"{uri}: {UNSAFE_RENAME} = {unsafe!r} lets two writers commit the same table version on S3 "
            f"(one commit is lost). {fixes}",
            code="UNSAFE_OBJECT_STORE_COMMITS",
        )
    locking = _setting(options, env, LOCKING_PROVIDER)
    if locking is not None and locking.strip().lower() not in SAFE_LOCKING_PROVIDERS:
        raise ConfigError(
            f"{uri}: {LOCKING_PROVIDER} = {locking!r} is not a locking provider delta-rs knows "
            f"(valid: {', '.join(SAFE_LOCKING_PROVIDERS)}); without one, commits rely on conditional writes. {fixes}",
            code="UNSAFE_OBJECT_STORE_COMMITS",
        )
    conditional = _setting(options, env, CONDITIONAL_PUT)
    copy = _setting(options, env, COPY_IF_NOT_EXISTS)
    if (
        conditional is not None
        and conditional.strip().lower() == "disabled"
        and locking is None
        and copy is None
    ):
        raise ConfigError(
            f"{uri}: {CONDITIONAL_PUT} = 'disabled' with no {LOCKING_PROVIDER} leaves no way to commit a table "
            f"version only once on S3. {fixes}",
            code="UNSAFE_OBJECT_STORE_COMMITS",
        )


# --------------------------------------------------------------------------- the registry

_REGISTRY: dict[str, dict[str, str]] = {}
_REGISTRY_LOCK = threading.Lock()


def _root(uri: str) -> str:
    return uri.rstrip("/") + "/"


def register(uri: str, options: Mapping[str, str]) -> None:
    """Use ``options`` for every table at or under ``uri`` in this process (a later call for ``uri`` wins).

    Local paths need no options and are not registered. Raises
    :class:`~retry_engine.errors.ConfigError` if the options are unsafe for
    commits (:func:`check_commit_safety`).
    """
    if not is_remote(uri):
        return
    clean = normalize(options)
    check_commit_safety(uri, clean)
    with _REGISTRY_LOCK:
        _REGISTRY[_root(uri)] = clean


def options_for(uri: str) -> dict[str, str] | None:
    """The storage options registered for ``uri`` (the longest registered prefix), or None."""
    if not is_remote(uri):
        return None
    target = _root(uri)
    with _REGISTRY_LOCK:
        matches = [root for root in _REGISTRY if target.startswith(root)]
        return dict(_REGISTRY[max(matches, key=len)]) if matches else None


# --------------------------------------------------------------------------- delta-rs, through here

# Table properties of the engine's own tables: set when the engine creates one, added where
# absent when it starts on an earlier release's (a value a table has is kept).
# * delta-rs checkpoints the log every 100 commits unless told otherwise (Delta Spark: 10), and
#   every open of a table (each micro-batch's commits, `status`, `dlq`, a notebook) reads every
#   commit since the last checkpoint, one object-store GET each: on S3 the engine made 648
#   requests per batch over 120 batches with 100, 217 with 10 (bench/RESULTS.md, run Z).
# * A delta-rs writer that writes a checkpoint also removes expired log files, and to find them
#   it lists the whole ``_delta_log`` (30 days of commits by default: millions of objects for a
#   table committed every second), so with checkpoints every 10 commits that listing would come
#   every 10 commits. The engine's writers leave it to maintenance (``[maintenance]``, hourly
#   by default, and `retry-engine maintain`), which also avoids two cleaners racing.
CHECKPOINT_INTERVAL = "delta.checkpointInterval"
TABLE_PROPERTIES: Mapping[str, str] = {
    CHECKPOINT_INTERVAL: "10",
    "delta.enableExpiredLogCleanup": "false",  # tables.EXPIRED_LOG_CLEANUP
}
# The tables every micro-batch writes (retry, dlq, quarantine, outcomes, metrics, progress)
# replace a small file a batch (compaction removes it), and a checkpoint carries every remove
# of the last `delta.deletedFileRetentionDuration` (7 days): ~600,000 after a week at a 1 s
# trigger, a 52 MB checkpoint that takes 1.8 s to write (run BC), every 10 commits. Every 100,
# the engine's S3 requests a batch grow 1.10x with its tables kept open, and its batch time
# is 0.91x (run BB); a cold open (`status`, `dlq`, a notebook) reads up to 100 small commits.
# * Their logs keep 3 days of commits (RocketMQ's commit log keeps messages 72 hours), not Delta's
#   30 days: every commit of a table on a local disk or HDFS lists its whole ``_delta_log`` (delta-rs,
#   ~1 us an entry: a commit took 0.28 s at 150,000 entries, ~20 days of one table at a 1 s trigger,
#   and 10 ms at a few hundred), so 30 days of one commit a batch made each batch seconds slower
#   after a month. A stream of one of them that stops longer (a consumer of %RETRY%G) must skip
#   what it missed (DELTA_COMMIT_MISSING says how); a table that has the property keeps its value.
LOG_RETENTION = "delta.logRetentionDuration"
BATCH_TABLE_PROPERTIES: Mapping[str, str] = {
    **TABLE_PROPERTIES, CHECKPOINT_INTERVAL: "100", LOG_RETENTION: "interval 3 days",
}
# The checkpoint interval the engine last set on a table: an interval equal to it is the
# engine's and follows a release's new default; any other is an operator's and is kept.
# Tables of earlier releases lack it, and their "10" was the engine's. delta-rs refuses
# unknown properties in a new table's configuration, so it is set by a later commit.
ENGINE_INTERVAL = "retryEngine.checkpointInterval"
EARLIER_INTERVAL = "10"


# --------------------------------------------------------------------------- storage failures

# delta-rs reports a store it cannot reach as a bare OSError whose text is a chain of causes,
# one per line, each behind a coloured "↳", an S3 error body as XML among them.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The body between the tags holds no other <Error> tag: a text of many unclosed ones is no slow match.
_S3_ERROR = re.compile(r"(?:<\?xml[^>]*>\s*)?<Error>(?:(?!</?Error>).)*</Error>", re.DOTALL)
_S3_PART = re.compile(r"<(Code|Message)>([^<]*)</\1>")
# Secret values shorter than this are not searched for in messages (they would blank ordinary words).
_SHORTEST_SECRET = 4
# What a cause says -> (the error's code, what to check); the first match wins.
_DIAGNOSES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"NoSuchBucket"),
        "NO_SUCH_BUCKET",
        "the bucket does not exist: check the URI (engine.lake or [tables]) and the endpoint",
    ),
    (
        re.compile(r"169\.254\.169\.254|IMDS|loading credentials|no credentials|CredentialsNotLoaded", re.IGNORECASE),
        "NO_CREDENTIALS",
        "no credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, "
        "or an instance role), or aws_access_key_id and aws_secret_access_key in [storage]",
    ),
    (
        re.compile(r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|ExpiredToken|403 Forbidden"),
        "ACCESS_DENIED",
        "the store refused the credentials or the request: check the key pair, its permissions and aws_region",
    ),
    (
        re.compile(r"connect error|Connection refused|dns error|failed to lookup address|timed out|error sending request", re.IGNORECASE),
        "STORAGE_UNREACHABLE",
        "the store did not answer: check aws_endpoint_url (and aws_allow_http for http://), "
        "the network, and that the store is up",
    ),
)


# Every code a StorageError can carry.
STORAGE_CODES = frozenset({StorageError.code, *(name for _, name, _ in _DIAGNOSES)})


def _cut_s3_bodies(text: str) -> str:
    """``text`` with each S3 error body (XML) cut to its code and message."""
    return _S3_ERROR.sub(lambda m: ": ".join(part for _, part in _S3_PART.findall(m[0])), text)


def causes(text: str) -> list[str]:
    """delta-rs's chain of causes as plain lines: colours, arrows, repeats and S3's XML wrapping gone."""
    found: list[str] = []
    text = _cut_s3_bodies(_ANSI.sub("", text))
    for line in text.splitlines():
        line = line.strip().lstrip("↳").strip()
        if line and line not in found:
            found.append(line)
    return found


def log_failure(logger: logging.Logger, message: str, exc: BaseException) -> None:
    """Log that something a later round retries failed (housekeeping, a heartbeat) with ``exc``.

    The store failing (an ``OSError``: a :class:`StorageError` says it in one line, delta-rs's own in
    several) is one warning line with its causes, as often as the store is down; anything else is an
    error with its traceback (a bug wants its stack).
    """
    if isinstance(exc, OSError):
        logger.warning("%s: %s", message, ": ".join(causes(str(exc))) or type(exc).__name__)
    else:
        logger.error("%s", message, exc_info=exc)


# What :func:`scrubbed` replaces in any text: the values of credentials proper, among the storage options
# and the environment's object-store settings (read by delta-rs when no option gives them). Not a key id,
# a flag such as ``aws_skip_signature``, or a short value: replacing "test" or "true" everywhere blanked
# ordinary words and bucket names.
_CREDENTIAL = re.compile(
    r"secret|token|password|passwd|sas|credential|account_key|private_key|access_key(?!_id)|master_key", re.IGNORECASE
)
_CREDENTIAL_ENV = re.compile(
    r"^(AWS|AZURE|GOOGLE)_\w*(SECRET|TOKEN|PASSWORD|SAS|CREDENTIAL|ACCOUNT_KEY|PRIVATE_KEY|ACCESS_KEY(?!_ID)|MASTER_KEY)"
)
_SHORTEST_CREDENTIAL = 8


def _secret_values() -> set[str]:
    """Every credential this process knows: the registered storage options' and the environment's."""
    with _REGISTRY_LOCK:
        values = {v for options in _REGISTRY.values() for k, v in options.items() if _CREDENTIAL.search(k)}
    values |= {v for k, v in os.environ.items() if _CREDENTIAL_ENV.match(k.upper())}
    return {v for v in values if len(v) >= _SHORTEST_CREDENTIAL}


def scrubbed(text: str) -> str:
    """``text`` (an error's, a traceback) fit to show or store: S3 error bodies cut to their code and
    message (a body echoes parts of the request: an expired session token, the signed headers) and every
    credential this process knows replaced by ``***``."""
    text = _cut_s3_bodies(text)
    for value in sorted(_secret_values(), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def storage_error(uri: str, exc: BaseException) -> StorageError:
    """A :class:`StorageError` for delta-rs's failure ``exc`` on ``uri``: the causes in one line and what to check.

    Secret option values of ``uri`` never appear in it, even if the store echoed one.
    """
    reason = ": ".join(causes(str(exc)) or [type(exc).__name__])
    code, advice = StorageError.code, ""
    for pattern, name, what in _DIAGNOSES:
        if pattern.search(reason):
            code, advice = name, f"; {what}"
            break
    message = scrubbed(f"cannot reach {uri}: {reason}{advice}")
    for key, value in (options_for(uri) or {}).items():
        if _SECRET.search(key) and len(value) >= _SHORTEST_SECRET:
            message = message.replace(value, REDACTED)
    return StorageError(message, code=code)


@contextmanager
def reaching(uri: str) -> Iterator[None]:
    """Turn delta-rs's failure to reach the storage of ``uri`` (a bare ``OSError``) into :func:`storage_error`.

    Only a bare ``OSError``: its subclasses (``FileNotFoundError`` and the like) and
    delta-rs's own errors (``TableNotFoundError``, ``CommitFailedError``) pass as they are.
    """
    try:
        yield
    except OSError as exc:
        if type(exc) is not OSError:
            raise
        # Chained to a scrubbed copy: delta-rs's own text may hold what the store echoed (a session
        # token), and every traceback (Spark's log, the progress table) prints the cause.
        raise storage_error(uri, exc) from OSError(scrubbed(str(exc)))


# --------------------------------------------------------------------------- reads at exit

# delta-rs reads a table through a Python file handler that Arrow's I/O threads call; a few are
# still finishing just after a read returns, and one that wants the GIL once the interpreter is
# finalizing ends the process with "terminate called without an active exception" (SIGABRT, exit
# 134; delta-io/delta-rs#2184, apache/arrow#34314). A script whose last line read a 60-file table
# (``open_delta(path).to_pyarrow_table(columns=...)``) aborted in 8 of 12 runs, 0 of 12 with a 20 ms
# pause at exit. So a process that opened a table through this module pauses this long at exit.
READ_SETTLE_S = 0.05
_settling = threading.Lock()
_settle_registered = False


def _settle_reads() -> None:
    time.sleep(READ_SETTLE_S)


def settle_reads_at_exit() -> None:
    """Have this process pause :data:`READ_SETTLE_S` at exit, for reads still finishing (once per process).

    Called at every table open: after the first, only a flag is read (no lock).
    """
    global _settle_registered
    if _settle_registered:
        return
    with _settling:
        if not _settle_registered:
            atexit.register(_settle_reads)
            _settle_registered = True


def location(uri: str, options: Mapping[str, str] | None = None) -> TableLocation:
    """The table at ``uri`` with its storage options: ``options`` if given, else the registered ones."""
    from retry_engine.delta._log import TableLocation

    return TableLocation(uri, options if options is not None else options_for(uri))


def open_delta(uri: str, *, version: int | None = None) -> DeltaTable:
    """``DeltaTable(uri)`` with the storage options of ``uri``.

    Raises delta-rs's ``TableNotFoundError`` if there is no table, and
    :class:`~retry_engine.errors.StorageError` if the storage cannot be reached.
    """
    from deltalake import DeltaTable

    settle_reads_at_exit()
    with reaching(uri):
        return DeltaTable(uri, version=version, storage_options=options_for(uri))


def is_delta_table(uri: str) -> bool:
    """Whether a Delta table exists at ``uri`` (:class:`~retry_engine.errors.StorageError` if the storage cannot say)."""
    from deltalake import DeltaTable

    with reaching(uri):
        return DeltaTable.is_deltatable(uri, storage_options=options_for(uri))


def create_delta(uri: str, schema: pa.Schema, **kwargs: Any) -> DeltaTable:
    """``DeltaTable.create`` with the storage options of ``uri``.

    ``mode="ignore"`` means "create unless it exists" even when two processes
    create the same table at once. delta-rs alone does not keep that promise:
    its check for an existing table comes before the commit, and the creator
    that loses the race to version 0 rebases its create onto version 1, a
    second metadata commit (measured on 1.6.6: 18 of 20 races) which fails
    every writer still on version 0 with "Metadata changed since last commit"
    and, were the schemas different, would replace the winner's. So the create
    is committed without retries; the loser gets the winner's table.
    """
    from deltalake import CommitProperties, DeltaTable
    from deltalake.exceptions import CommitFailedError

    options = options_for(uri)
    if kwargs.get("mode") != "ignore":
        with reaching(uri):
            return DeltaTable.create(uri, schema, storage_options=options, **kwargs)
    kwargs.setdefault("commit_properties", CommitProperties(max_commit_retries=0))
    try:
        with reaching(uri):
            return DeltaTable.create(uri, schema, storage_options=options, **kwargs)
    except CommitFailedError:
        if not is_delta_table(uri):
            raise
        log.info("%s was created by another writer meanwhile; using that table", uri)
        return open_delta(uri)


def add_columns(uri: str, fields: Sequence[pa.Field], *, version: int) -> None:
    """Add nullable ``fields`` to the table at ``uri`` as of ``version`` (with the storage options of ``uri``).

    The commit is made against that version: if anyone committed since, delta-rs
    raises ``CommitFailedError`` ("Metadata changed") instead of rebasing, so
    the caller re-reads the schema and decides again.
    """
    from deltalake.schema import Field

    open_delta(uri, version=version).alter.add_columns([Field.from_arrow(f) for f in fields])


def set_properties(uri: str, properties: Mapping[str, str], *, version: int) -> None:
    """Set table ``properties`` on the table at ``uri`` as of ``version`` (a metadata commit; see :func:`add_columns`).

    Keys Delta does not define are allowed (:data:`ENGINE_INTERVAL`).
    """
    open_delta(uri, version=version).alter.set_table_properties(dict(properties), raise_if_not_exists=False)


def write_delta(target: str | DeltaTable, data: Any, **kwargs: Any) -> None:
    """``write_deltalake`` with the storage options of ``target`` (a handle already carries its own)."""
    from deltalake import write_deltalake

    if isinstance(target, str):
        with reaching(target):
            write_deltalake(target, data, storage_options=options_for(target), **kwargs)
    else:
        with reaching(target.table_uri):
            write_deltalake(target, data, **kwargs)


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem over ``uri`` and the root within it (see :meth:`TableLocation.filesystem`)."""
    return location(uri).filesystem()


# --------------------------------------------------------------------------- Spark


def spark_options(uri: str) -> dict[str, str]:
    """The storage options of ``uri`` as ``deltars`` reader/writer options (``storage.<key>``)."""
    return {f"{SPARK_OPTION_PREFIX}{key}": value for key, value in (options_for(uri) or {}).items()}


def from_spark_options(options: Mapping[str, str]) -> dict[str, str] | None:
    """The ``storage.<key>`` options among a ``deltars`` source's or sink's (lower-case keys), or None."""
    found = {
        key[len(SPARK_OPTION_PREFIX) :]: value
        for key, value in options.items()
        if key.lower().startswith(SPARK_OPTION_PREFIX) and len(key) > len(SPARK_OPTION_PREFIX)
    }
    return normalize(found) if found else None


def require_checkpoint_filesystem(spark: SparkSession, checkpoint: str) -> None:
    """Raise :class:`~retry_engine.errors.ConfigError` unless Spark's Hadoop can write the checkpoint's scheme.

    The Spark checkpoint is written by Spark itself through Hadoop's file
    systems, not by delta-rs: an ``s3://`` / ``s3a://`` checkpoint needs the
    hadoop-aws jars on Spark's class path. Without them Spark fails deep in the
    first batch; this says so before the query starts.
    """
    if not is_remote(checkpoint):
        return
    jvm: Any = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    wanted = scheme(checkpoint)
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(wanted, conf)
    except Exception as exc:  # py4j wraps Hadoop's UnsupportedFileSystemException
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"the Spark checkpoint {checkpoint} is on {wanted}://, which this Spark cannot write ({first[:200]}). "
            "The checkpoint stays on a file system Spark has: set engine.checkpoint (or the consumer's checkpoint) "
            "to a local or HDFS path, or add the Hadoop connector for it (for s3a://: the hadoop-aws and AWS SDK "
            "jars) to Spark",
            code="CHECKPOINT_FILESYSTEM_MISSING",
        ) from None


CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
FILESYSTEM_CHECKPOINT_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def use_filesystem_checkpoints_on_local_disk(spark: SparkSession, checkpoint: str) -> bool:
    """On a local-disk checkpoint, have Spark write it through Hadoop's FileSystem API; True when this set it.

    Spark's default checkpoint file manager goes through Hadoop's FileContext,
    whose local file system (without Hadoop's native library, as with a pip
    install) starts a ``readlink`` or ``chmod`` process for nearly every call:
    about 26 processes, 40-50 ms a file, for the offsets, commit and state
    changelog files of one micro-batch, a third of an idle batch on 2 cores
    (#15). The FileSystem-based manager Spark ships writes the same temporary
    file and renames it into place, which is atomic on a local disk. Where the
    checkpoint resolves to anything else (HDFS, whose atomic no-overwrite
    rename needs FileContext, an object store) Spark's default stays, and so
    does any manager set on the session.
    """
    if spark.conf.get(CHECKPOINT_FILE_MANAGER, None):
        return False
    jvm: Any = spark._jvm
    try:
        fs = jvm.org.apache.hadoop.fs.Path(checkpoint).getFileSystem(spark._jsc.hadoopConfiguration())
        local = str(fs.getScheme()) == "file"
    except Exception as exc:  # py4j: a path Hadoop cannot resolve keeps Spark's default manager
        log.debug("checkpoint %s: file system not resolved (%s); Spark's default checkpoint manager", checkpoint, exc)
        return False
    if local:
        spark.conf.set(CHECKPOINT_FILE_MANAGER, FILESYSTEM_CHECKPOINT_MANAGER)
    return bool(local)


__all__ = [
    "BATCH_TABLE_PROPERTIES",
    "LOG_RETENTION",
    "CHECKPOINT_INTERVAL",
    "EARLIER_INTERVAL",
    "ENGINE_INTERVAL",
    "REDACTED",
    "SPARK_OPTION_PREFIX",
    "TABLE_PROPERTIES",
    "scrubbed",
    "shown_path",
    "add_columns",
    "check_commit_safety",
    "create_delta",
    "filesystem",
    "from_spark_options",
    "is_delta_table",
    "is_remote",
    "is_secret",
    "location",
    "normalize",
    "open_delta",
    "options_for",
    "redacted",
    "register",
    "require_checkpoint_filesystem",
    "set_properties",
    "use_filesystem_checkpoints_on_local_disk",
    "spark_options",
    "write_delta",
]
