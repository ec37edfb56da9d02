"""The engine's configuration: a TOML file a Spark user edits by hand.

Validated on load with pydantic; unknown keys are rejected with the list of
valid ones; paths and the Spark master can be overridden from the
environment (``RETRY_ENGINE_LAKE``, ``RETRY_ENGINE_CHECKPOINT``,
``RETRY_ENGINE_MASTER``).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from retry_engine.core.delays import (
    DEFAULT_DELAY_LEVELS,
    ROCKETMQ_FIRST_RETRY_LEVEL,
    BackoffPolicy,
    ExponentialPolicy,
    LevelPolicy,
    bounded_duration_ms,
    parse_delay_levels,
    parse_duration_ms,
)
from retry_engine.core.names import (
    DLQ_GROUP_TOPIC_PREFIX,
    GROUP_MAX_LENGTH,
    RETRY_GROUP_TOPIC_PREFIX,
    name_problem,
    named_like_a_topic,
)
from retry_engine.core.names import TABLE_NAMES as TABLE_NAMES  # re-exported: the lake's tables
from retry_engine.errors import ConfigError, DurationError

DEFAULT_CONFIG_FILE = Path("conf/retry-engine.toml")
DEFAULT_LAKE = "./data/lake"
DEFAULT_MASTER = "local[2]"
DEFAULT_TRIGGER_INTERVAL = "1s"
DEFAULT_SHUFFLE_PARTITIONS = 2
DEFAULT_MAX_FILES_PER_TRIGGER = 1000
# Consume results per micro-batch at most (by the files' numRecords): what one batch can add to
# one state key, and the Python workers' peak memory, are bounded by it when catching up a backlog.
DEFAULT_MAX_ROWS_PER_TRIGGER = 250_000
# Parquet bytes of consume results per micro-batch at most (Delta's maxBytesPerTrigger): the same
# bound for rows with large bodies, which the row count alone does not bound.
DEFAULT_MAX_BYTES_PER_TRIGGER = 64 * 1024 * 1024
# RocketMQ's broker default maxMessageSize.
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_DEDUP_WINDOW = "10m"
DEFAULT_STATE_BUCKET = "10s"
# 1: no fixed split of a (group, bucket) key, so normal loads run as fast as one key per bucket;
# a mass failure is bounded by size instead (state_key_max_bytes). Existing checkpoints keep theirs.
DEFAULT_STATE_SUBKEYS = 1
MAX_STATE_SUBKEYS = 1024
# A state key whose value passes this at the end of a batch seals and splits in two for new msg ids.
# 64 MiB is a few percent of Arrow's 2 GiB cap on one value; the bounds keep a key from sealing with
# next to nothing in it (an empty value is ~3.5 KiB) and leave room under the cap for one batch.
DEFAULT_STATE_KEY_MAX_BYTES = 64 * 1024 * 1024
MIN_STATE_KEY_MAX_BYTES = 16 * 1024
MAX_STATE_KEY_MAX_BYTES = 1024 * 1024 * 1024
# A state key's pending retries (Arrow bytes) past which it parks them in a file in the checkpoint
# and keeps a reference (0: park every retry). Small keys stay inline: one file per spill, not per retry.
DEFAULT_STATE_PARK_BYTES = 1024 * 1024
# A decide task that holds this many rows needing no state writes them to their tables itself
# instead of sending them through the shuffle (core.outputs.StatelessWrites); fewer go the old way,
# so small input files make no small output files.
DEFAULT_DIRECT_WRITE_ROWS = 8192
# The progress listener appends its buffered events at most this often (one small commit each).
DEFAULT_PROGRESS_FLUSH_INTERVAL = "5s"
# The lake lease (B8) expires this long after its owner's last heartbeat (every quarter of it).
DEFAULT_LEASE_TIMEOUT = "60s"
MIN_LEASE_TIMEOUT_MS = 5_000
# `retry-engine run` restarts a query that failed (a storage outage, a lost executor) after
# restart_delay, doubled after each restart in a row up to 5 min; after
# restart_attempts restarts in a row without a completed micro-batch it exits 1. The defaults
# ride out about 25 minutes of failing storage.
DEFAULT_RESTART_ATTEMPTS = 10
DEFAULT_RESTART_DELAY = "5s"
MAX_RESTART_DELAY_MS = 5 * 60 * 1000
# A longer restart_delay is refused: no restart at all (restart_attempts = 0) says that better.
MAX_RESTART_DELAY_SETTING_MS = 24 * 3600 * 1000
DEFAULT_RETRY_QUEUE_NUMS = 1
DEFAULT_RETRY_MAX_TIMES = 16
# "deltars": the delta-rs bridge (no jars); "delta": Spark's own Delta format (needs the jars).
TableFormat = Literal["deltars", "delta"]
DEFAULT_TABLE_FORMAT: TableFormat = "deltars"

ENV_LAKE = "RETRY_ENGINE_LAKE"
ENV_CHECKPOINT = "RETRY_ENGINE_CHECKPOINT"
ENV_MASTER = "RETRY_ENGINE_MASTER"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Duration = Annotated[str, Field(description="e.g. '500ms', '10s', '5m', '1h'")]


def _check_duration(value: str) -> str:
    bounded_duration_ms(value)
    return value


class LevelsBackoff(_Strict):
    """RocketMQ 4 levels; ``levels`` unset means the engine's ``message_delay_level``."""

    policy: Literal["levels"] = "levels"
    levels: str | None = None
    first_level: int = Field(default=ROCKETMQ_FIRST_RETRY_LEVEL, ge=1)

    @field_validator("levels")
    @classmethod
    def _levels(cls, value: str | None) -> str | None:
        if value is not None:
            parse_delay_levels(value)
        return value


class ExponentialBackoff(_Strict):
    """``min(initial * multiplier**(level-1), max)``."""

    policy: Literal["exponential"]
    initial: Duration = "1s"
    multiplier: float = Field(default=2.0, gt=1.0, allow_inf_nan=False)
    max: Duration = "1h"

    # Delays, as delay levels: unbounded (a due time past the calendar quarantines its row,
    # DUE_AT_OUT_OF_RANGE), so a "max" of many years still means "no cap".
    _dur = field_validator("initial", "max")(classmethod(lambda cls, v: _check_delay(v)))


def _check_delay(value: str) -> str:
    parse_duration_ms(value, delay=True)
    return value


# Python's own exceptions are named without their module (as the consumer records them:
# ``ValueError``, not ``builtins.ValueError``); so are classes of a script run as __main__.
_BARE_MODULES = ("builtins.", "__main__.")


def error_class_name(name: str) -> str:
    """The spelling of an error class that ``non_retryable.error_classes`` matches on.

    ``builtins.ValueError`` and ``ValueError`` are one class (so are
    ``__main__.X`` and ``X``); any other class keeps its module
    (``myapp.errors.Invalid``, ``com.acme.InvalidOrder``).
    """
    for prefix in _BARE_MODULES:
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix) :]
    return name


class NonRetryable(_Strict):
    """Failures that go straight to the DLQ (B3): exact error classes or regexes."""

    error_classes: list[str] = Field(default_factory=list)
    error_patterns: list[str] = Field(default_factory=list)

    @field_validator("error_classes")
    @classmethod
    def _classes(cls, names: list[str]) -> list[str]:
        for name in names:
            if not name.strip():
                raise ValueError(
                    "an error class is empty; give a class name such as ValueError or myapp.errors.InvalidOrder"
                )
        return [error_class_name(name) for name in names]

    @field_validator("error_patterns")
    @classmethod
    def _compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"error pattern {pattern!r} is not a valid regex: {exc}") from None
        return patterns


class GroupConfig(_Strict):
    """RocketMQ's ``SubscriptionGroupConfig`` (the parts retry depends on) plus B2/B3."""

    # RocketMQ's retryQueueNums is a Java int; the retry's queue_id column is int32.
    retry_queue_nums: int = Field(default=DEFAULT_RETRY_QUEUE_NUMS, ge=-(2**31), le=2**31 - 1)
    retry_max_times: int = Field(default=DEFAULT_RETRY_MAX_TIMES, ge=0)
    backoff: LevelsBackoff | ExponentialBackoff = Field(
        default_factory=LevelsBackoff, discriminator="policy"
    )
    non_retryable: NonRetryable = Field(default_factory=NonRetryable)

    @field_validator("backoff", mode="before")
    @classmethod
    def _default_policy(cls, value: Any) -> Any:
        # ``backoff = { levels = "1s 5s" }`` means the levels policy.
        if isinstance(value, dict) and "policy" not in value:
            return {**value, "policy": "levels"}
        return value


class EngineSection(_Strict):
    master: str = DEFAULT_MASTER
    lake: str = DEFAULT_LAKE
    checkpoint: str | None = None
    trigger_interval: Duration = DEFAULT_TRIGGER_INTERVAL
    shuffle_partitions: int = Field(default=DEFAULT_SHUFFLE_PARTITIONS, ge=1)
    max_files_per_trigger: int = Field(default=DEFAULT_MAX_FILES_PER_TRIGGER, ge=1)
    max_rows_per_trigger: StrictInt = Field(default=DEFAULT_MAX_ROWS_PER_TRIGGER, ge=1, le=2**31 - 1)
    max_bytes_per_trigger: StrictInt = Field(default=DEFAULT_MAX_BYTES_PER_TRIGGER, ge=1, le=2**63 - 1)
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1)
    dedup_window: Duration = DEFAULT_DEDUP_WINDOW
    state_bucket: Duration = DEFAULT_STATE_BUCKET
    # Sub-keys per (group, bucket) for a NEW checkpoint (an existing one keeps its count).
    state_subkeys: StrictInt = Field(default=DEFAULT_STATE_SUBKEYS, ge=1, le=MAX_STATE_SUBKEYS)
    # Bytes of one state key's value past which it splits further (any checkpoint, any time).
    state_key_max_bytes: StrictInt = Field(
        default=DEFAULT_STATE_KEY_MAX_BYTES, ge=MIN_STATE_KEY_MAX_BYTES, le=MAX_STATE_KEY_MAX_BYTES
    )
    # Pending retries' bytes past which a key parks them outside Spark's state (in the checkpoint).
    state_park_bytes: StrictInt = Field(default=DEFAULT_STATE_PARK_BYTES, ge=0, le=MAX_STATE_KEY_MAX_BYTES)
    # Rows without state (acknowledgements...) a decide task holds before it writes them itself.
    direct_write_rows: StrictInt = Field(default=DEFAULT_DIRECT_WRITE_ROWS, ge=1, le=2**31 - 1)
    auto_create_groups: bool = True
    progress_flush_interval: Duration = DEFAULT_PROGRESS_FLUSH_INTERVAL
    lease_timeout: Duration = DEFAULT_LEASE_TIMEOUT
    restart_attempts: StrictInt = Field(default=DEFAULT_RESTART_ATTEMPTS, ge=0, le=1_000_000)
    restart_delay: Duration = DEFAULT_RESTART_DELAY
    table_format: TableFormat = DEFAULT_TABLE_FORMAT
    spark_conf: dict[str, str] = Field(default_factory=dict)

    _dur = field_validator(
        "trigger_interval", "dedup_window", "state_bucket", "progress_flush_interval", "lease_timeout",
        "restart_delay",
    )(
        classmethod(lambda cls, v: _check_duration(v))
    )

    @field_validator("message_delay_level")
    @classmethod
    def _levels(cls, value: str) -> str:
        parse_delay_levels(value)
        return value

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _spark_values(cls, value: Any) -> Any:
        # TOML has numbers and booleans; Spark's settings are strings ("4040", "true"), as
        # SparkSession.builder.config turns them (the same rule as [storage]). A blank key would
        # set nothing Spark knows.
        from retry_engine.delta.storage import setting_text

        if not isinstance(value, dict):
            return value
        for key in value:
            if not isinstance(key, str) or not key.strip():
                raise ValueError(f"a Spark setting needs a name, got {key!r}")
        return {key: setting_text(item) for key, item in value.items()}

    @field_validator("restart_delay")
    @classmethod
    def _restart_delay(cls, value: str) -> str:
        if parse_duration_ms(value) > MAX_RESTART_DELAY_SETTING_MS:
            raise ValueError(f"{value!r} is longer than a day; a failed engine would wait that long to restart")
        return value

    @field_validator("lake")
    @classmethod
    def _lake(cls, value: str) -> str:
        # An empty lake would put every table in the working directory under its bare name.
        if not value.strip():
            raise ValueError("lake is empty; give the folder (or s3://... URI) that holds the tables")
        return value

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint(cls, value: str | None) -> str | None:
        # A blank one was a folder named by its spaces in the working directory.
        if value is not None and not value.strip():
            raise ValueError("checkpoint is blank; give a folder (or leave it out: <lake>/_checkpoints/engine)")
        return value

    @field_validator("lease_timeout")
    @classmethod
    def _lease_timeout(cls, value: str) -> str:
        # The owner heartbeats every quarter of it, a Delta commit each: much shorter and a live
        # owner's heartbeat comes late, so a second engine takes its lake without --take-over.
        if parse_duration_ms(value) < MIN_LEASE_TIMEOUT_MS:
            raise ValueError(f"{value!r} is shorter than {MIN_LEASE_TIMEOUT_MS // 1000}s; a live owner's heartbeats "
                             "(a commit each) would not keep its lease")
        return value


class SourceSection(_Strict):
    """How the engine streams consume_results: Delta's streaming source options, same meaning.

    ``starting_version`` / ``starting_timestamp`` take effect only for a new
    checkpoint (a running stream resumes where its checkpoint says, as in
    Delta); ``skip_change_commits`` / ``ignore_deletes`` apply on every start.
    """

    starting_version: Annotated[StrictInt, Field(ge=0)] | Literal["latest"] | None = None
    """Read the changes of this commit and later ones instead of the latest snapshot; "latest": only new commits."""
    starting_timestamp: str | None = None
    """Like ``starting_version``, from the first commit at or after this date or UTC timestamp."""
    skip_change_commits: StrictBool = False
    """Skip commits that remove data (DELETE, UPDATE, MERGE, overwrite), the rows they add too."""
    ignore_deletes: StrictBool = False
    """Skip commits that only delete whole files (and add none)."""

    @field_validator("starting_timestamp")
    @classmethod
    def _timestamp(cls, value: str | None) -> str | None:
        if value is not None:
            from retry_engine.delta._options import parse_timestamp_ms

            try:
                parse_timestamp_ms(value, name="starting_timestamp")
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _one_start(self) -> SourceSection:
        if self.starting_version is not None and self.starting_timestamp is not None:
            raise ValueError(
                f"starting_version ({self.starting_version!r}) and starting_timestamp "
                f"({self.starting_timestamp!r}) are both set; a stream starts at one place: give only one"
            )
        return self

    def stream_options(self) -> dict[str, str]:
        """These settings as the options of Delta's (and ``deltars``'s) stream reader."""
        options: dict[str, str] = {}
        if self.starting_version is not None:
            options["startingVersion"] = str(self.starting_version)
        if self.starting_timestamp is not None:
            options["startingTimestamp"] = self.starting_timestamp
        if self.skip_change_commits:
            options["skipChangeCommits"] = "true"
        if self.ignore_deletes:
            options["ignoreDeletes"] = "true"
        return options


class TablesSection(_Strict):
    """Per-table path overrides; unset tables live under ``engine.lake``."""

    consume_results: str | None = None
    messages: str | None = None
    retry: str | None = None
    dlq: str | None = None
    quarantine: str | None = None
    outcomes: str | None = None
    redrive_audit: str | None = None
    redrive_tasks: str | None = None
    metrics: str | None = None
    progress: str | None = None


# `dlq redrive` asks before moving more dead letters than this (unless --yes).
DEFAULT_REDRIVE_CONFIRM_ABOVE = 100
# Resolved dead letters are removed from the DLQ table (their audit rows stay) this long after.
DEFAULT_RESOLVED_RETENTION = "30d"


class DlqSection(_Strict):
    """Operator tools on the DLQ: the re-drive confirmation and the retention of resolved dead letters."""

    redrive_confirm_above: int = Field(default=DEFAULT_REDRIVE_CONFIRM_ABOVE, ge=0)
    resolved_retention: Duration = DEFAULT_RESOLVED_RETENTION

    _dur = field_validator("resolved_retention")(classmethod(lambda cls, v: _check_duration(v)))



# -- [maintenance]: compaction, log checkpoints, log cleanup and vacuum (#14) ----------

# Delta's own default for keeping files a newer version no longer references.
DEFAULT_MAINTENANCE_RETENTION = "7d"
DEFAULT_MAINTENANCE_INTERVAL = "1h"
# How long the progress and metrics tables keep their rows (progress: one a micro-batch, 2.6 million a
# month at a 1 s trigger; metrics: a few per group and level of every batch that decided something).
DEFAULT_PROGRESS_RETENTION = "30d"
DEFAULT_METRICS_RETENTION = "30d"
# `status` reads the progress table's last day (the running rule, the failures of the day).
MIN_ROW_RETENTION_MS = 86_400_000
# No more than a century: delta-rs counts the retention in whole hours.
MAX_RETENTION_HOURS = 100 * 365 * 24
_RETENTION = re.compile(r"([0-9]+)(h|d)")
_HOUR_MS = 3_600_000


def parse_retention_hours(value: object, *, name: str = "retention") -> int:
    """A vacuum retention (``"7d"``, ``"168h"``, ``"0h"`` or ``"0"``) in whole hours.

    delta-rs vacuums with a whole number of hours, so only ``h`` and ``d`` are
    units; anything else (negative, fractional, minutes, garbage) is a
    :class:`~retry_engine.errors.ConfigError` naming the value.
    """
    text = value.strip() if isinstance(value, str) else None
    match = _RETENTION.fullmatch(text) if text is not None else None
    if text == "0":
        return 0
    if match is None:
        raise ConfigError(
            f"{name} {value!r} is not a retention: give a whole number of hours or days such as '7d' or "
            "'168h' (Delta vacuums in whole hours; no minutes, fractions or signs)",
            code="INVALID_RETENTION",
        )
    hours = int(match.group(1)) * (24 if match.group(2) == "d" else 1)
    if hours > MAX_RETENTION_HOURS:
        raise ConfigError(
            f"{name} {value!r} is {hours} hours, more than the {MAX_RETENTION_HOURS} (100 years) allowed",
            code="INVALID_RETENTION",
        )
    return hours


class MaintenanceSection(_Strict):
    """``[maintenance]``: the engine's own table maintenance, and `retry-engine maintain`'s retention.

    ``engine_tables`` / ``consume_results`` / ``messages`` turn in-engine
    maintenance on per table class (the tables the engine writes; the input
    consumers write; the topics' messages producers write). It runs
    every ``interval`` ("off" to disable) or every ``every_batches`` batches (0
    to disable), whichever comes first.
    """

    engine_tables: StrictBool = True
    consume_results: StrictBool = False
    messages: StrictBool = False
    interval: str = DEFAULT_MAINTENANCE_INTERVAL
    every_batches: StrictInt = Field(default=0, ge=0)
    retention: str = DEFAULT_MAINTENANCE_RETENTION
    progress_retention: str = DEFAULT_PROGRESS_RETENTION
    """How long the progress table keeps its rows ("off": every row, for good). Maintenance removes
    the files whose rows are all older (by ``recorded_at``); a file with a newer row waits for it."""
    metrics_retention: str = DEFAULT_METRICS_RETENTION
    """The same for the metrics table (by ``batch_time``)."""
    outcomes_retention: str = "off"
    """The same for the outcomes table, the ledger (by ``decided_at``, and ``due_at``: a retry still
    waiting keeps its outcome row, by which the lake counts it pending). Off by default: `status`,
    `plots` and `dlq show` read it, and each deployment keeps its ledger its own time."""
    retry_retention: str = "off"
    """The same for ``%RETRY%G``'s table (by ``delivered_at``), as RocketMQ's commit log keeps its
    messages 72 hours. Off by default: a stream of it needs ``ignoreDeletes`` (the consumer client
    sets it), and a consumer stopped for longer misses what it held."""
    messages_retention: str = "off"
    """The same for the producers' ``messages`` table (by ``store_timestamp``), as RocketMQ's commit log
    keeps every topic's messages 72 hours; off by default, as ``retry_retention``."""

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        if value != "off":
            try:
                parse_duration_ms(value)
            except DurationError:
                raise ValueError(
                    f"interval {value!r} is not a duration: give e.g. '30m' or '1h', or 'off'"
                ) from None
        return value

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str) -> str:
        try:
            parse_retention_hours(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator(
        "progress_retention", "metrics_retention", "outcomes_retention", "retry_retention", "messages_retention"
    )
    @classmethod
    def _row_retention(cls, value: str, info: ValidationInfo) -> str:
        if value == "off":
            return value
        name = info.field_name
        try:
            ms = parse_duration_ms(value)
        except DurationError:
            raise ValueError(f"{name} {value!r} is not a duration: give e.g. '30d' or '720h', or 'off'") from None
        if ms < MIN_ROW_RETENTION_MS:
            raise ValueError(f"{name} {value!r} is shorter than a day: `status` and `plots` read the last day")
        if ms > MAX_RETENTION_HOURS * _HOUR_MS:
            raise ValueError(f"{name} {value!r} is more than 100 years; give 'off' to keep every row")
        return value

    @model_validator(mode="after")
    def _scheduled(self) -> MaintenanceSection:
        if self.enabled and self.interval == "off" and self.every_batches == 0:
            raise ValueError(
                "maintenance is on (engine_tables, consume_results or messages) but interval = 'off' and "
                "every_batches = 0 never trigger it: set one of them, or turn every table class off"
            )
        return self

    @property
    def interval_ms(self) -> int | None:
        return None if self.interval == "off" else parse_duration_ms(self.interval)

    def row_retention_ms(self, table: str) -> int | None:
        """How long ``table`` (one with a ``<table>_retention`` key) keeps its rows; None: for good."""
        value = getattr(self, f"{table}_retention")
        return None if value == "off" else parse_duration_ms(value)

    @property
    def enabled(self) -> bool:
        return self.engine_tables or self.consume_results or self.messages


def minimum_retention_ms(engine: EngineSection, maintenance: MaintenanceSection) -> int:
    """The shortest vacuum retention that is safe for this config.

    A file compaction replaced must outlive the longest trigger interval the
    config knows (a batch planned before the compaction reads it afterwards)
    plus the time between two maintenance runs (the next run may vacuum right
    after a compaction). Without in-engine maintenance only the trigger counts.
    """
    trigger = max(parse_duration_ms(engine.trigger_interval), parse_duration_ms(engine.progress_flush_interval))
    if not maintenance.enabled:
        return trigger
    every = [
        ms for ms in (
            maintenance.interval_ms,
            maintenance.every_batches * parse_duration_ms(engine.trigger_interval) if maintenance.every_batches else None,
        ) if ms is not None
    ]
    return trigger + min(every)


def minimum_retention_hours(engine: EngineSection, maintenance: MaintenanceSection) -> int:
    """:func:`minimum_retention_ms` rounded up to the whole hours Delta vacuums with."""
    return -(-minimum_retention_ms(engine, maintenance) // _HOUR_MS)


class EngineConfig(_Strict):
    """The whole configuration file."""

    engine: EngineSection = Field(default_factory=EngineSection)
    source: SourceSection = Field(default_factory=SourceSection)
    tables: TablesSection = Field(default_factory=TablesSection)
    dlq: DlqSection = Field(default_factory=DlqSection)
    maintenance: MaintenanceSection = Field(default_factory=MaintenanceSection)
    group_defaults: GroupConfig = Field(default_factory=GroupConfig)
    groups: dict[str, GroupConfig] = Field(default_factory=dict)
    # delta-rs storage options for a lake on object storage (see retry_engine.delta.storage); never shown (credentials).
    # Values are checked by storage.normalize, whose errors never show a secret (pydantic's would).
    storage: dict[str, Any] = Field(default_factory=dict, repr=False)

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("storage", mode="before")
    @classmethod
    def _storage(cls, value: Any) -> dict[str, Any]:
        from retry_engine.delta.storage import normalize

        if not isinstance(value, Mapping):
            # Not echoed: it may be a credential pasted in the wrong place.
            raise ConfigError(
                f"[storage] must be a table of delta-rs storage options (key = value), got a {type(value).__name__}",
                code="INVALID_STORAGE_OPTION",
            )
        return dict(normalize(value))

    @model_validator(mode="after")
    def _register_storage(self) -> EngineConfig:
        # Every delta-rs call of this process finds the options by path (retry_engine.delta.storage);
        # unsafe commit settings are refused here, before anything opens a table.
        from retry_engine.delta.storage import register

        options = {key: str(value) for key, value in self.storage.items()}
        for path in {self.engine.lake, *(p for p in self.tables.model_dump().values() if p)}:
            register(path, options)
        return self

    @model_validator(mode="after")
    def _maintenance_retention(self) -> EngineConfig:
        hours = parse_retention_hours(self.maintenance.retention)
        floor = minimum_retention_hours(self.engine, self.maintenance)
        if hours < floor:
            raise ValueError(
                f"[maintenance] retention {self.maintenance.retention!r} is shorter than the {floor}h this config "
                "needs (longest trigger interval plus the maintenance interval, in whole hours): a stream could "
                f"still need a file vacuum deletes. Use '{floor}h' or more"
            )
        return self

    @model_validator(mode="after")
    def _group_names(self) -> EngineConfig:
        for name in self.groups:
            problem = name_problem(name, kind="group", max_length=GROUP_MAX_LENGTH)
            if problem is None and named_like_a_topic(name):
                problem = (
                    f"group name {name!r} may not start with {RETRY_GROUP_TOPIC_PREFIX} or {DLQ_GROUP_TOPIC_PREFIX} "
                    "(its retry topic would be no consumer's; the engine quarantines its results as "
                    "INVALID_GROUP_NAME): remove the section; re-drive its dead letters with --to topic or resolve them"
                )
            if problem:
                raise ValueError(f"[groups.{name}]: {problem}")
        return self

    # -- derived views ---------------------------------------------------------
    def table_path(self, table: str) -> str:
        """Where table ``table`` (one of :data:`TABLE_NAMES`) lives."""
        if table not in TABLE_NAMES:
            raise ConfigError(f"unknown table {table!r}; tables are {', '.join(TABLE_NAMES)}")
        override = getattr(self.tables, table)
        return override if override else os.path.join(self.engine.lake, table)

    @property
    def checkpoint_path(self) -> str:
        return self.engine.checkpoint or os.path.join(self.engine.lake, "_checkpoints", "engine")

    @property
    def state_bucket_ms(self) -> int:
        return parse_duration_ms(self.engine.state_bucket)

    @property
    def trigger_interval_ms(self) -> int:
        return parse_duration_ms(self.engine.trigger_interval)

    @property
    def lease_timeout_ms(self) -> int:
        return parse_duration_ms(self.engine.lease_timeout)

    def restart_delay_s(self, attempt: int) -> float:
        """Seconds before restart ``attempt`` (1, 2, ...) in a row: ``restart_delay`` doubled each time, at most 5 min."""
        first = parse_duration_ms(self.engine.restart_delay)
        return float(min(first * 2 ** min(max(attempt, 1) - 1, 32), max(first, MAX_RESTART_DELAY_MS))) / 1000

    def group(self, name: str) -> GroupConfig | None:
        """The group's config; defaults for an unknown group when groups are auto-created."""
        found = self.groups.get(name)
        if found is not None:
            return found
        return self.group_defaults if self.engine.auto_create_groups else None

    def decision_settings(self) -> dict[str, Any]:
        """The settings that decide what a consume result becomes (its outcome, level, due time, whether
        it is a duplicate, its state key), as JSON values: a recorded batch is replayed only with these."""
        # Durations and delays in milliseconds: "60s" rewritten as "1m" decides the same.
        engine = {
            "message_delay_level": list(parse_delay_levels(self.engine.message_delay_level)),
            "max_body_bytes": self.engine.max_body_bytes,
            "dedup_window": parse_duration_ms(self.engine.dedup_window),
            # Not state_bucket: a checkpoint keeps the width it started with (schedule.state_key_split).
            "auto_create_groups": self.engine.auto_create_groups,
        }

        def group(config: GroupConfig) -> dict[str, Any]:
            policy = self.policy(config)
            return {**config.model_dump(mode="json"), "backoff": {"policy": type(policy).__name__, **vars(policy)}}

        return {
            "engine": engine,
            "group_defaults": group(self.group_defaults),
            "groups": {name: group(config) for name, config in sorted(self.groups.items())},
        }

    def policy(self, group: GroupConfig) -> BackoffPolicy:
        backoff = group.backoff
        if isinstance(backoff, ExponentialBackoff):
            return ExponentialPolicy(
                parse_duration_ms(backoff.initial), backoff.multiplier, parse_duration_ms(backoff.max)
            )
        return LevelPolicy.parse(
            backoff.levels or self.engine.message_delay_level, first_level=backoff.first_level
        )



def _format_validation_error(exc: ValidationError, model: type[BaseModel], source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"])
        if err["type"] == "extra_forbidden":
            valid = _valid_keys(model, err["loc"][:-1])
            lines.append(f"unknown key {loc!r}; valid keys here: {', '.join(valid)}")
        else:
            got = f" (got {err.get('input')!r})" if loc else ""
            lines.append(f"{loc or 'config'}: {err['msg']}{got}")
    return f"{source}: " + "; ".join(lines)


def _valid_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys of the section at ``loc`` (a pydantic error location without the unknown key)."""
    # The models the location can be in so far: a union (backoff) is several until pydantic's
    # location names the member by its tag (groups.g.backoff.exponential.x); a dict of models
    # (groups) has its key, the group name, in the location.
    current: list[type[BaseModel]] = [model]
    for part in loc:
        inner = [m for c in current if part in c.model_fields for m in _models(c.model_fields[part].annotation)]
        if inner:
            current = inner
            continue
        tagged = [c for c in current if any(part in get_args(f.annotation) for f in c.model_fields.values())]
        current = tagged or current
    return sorted(current[0].model_fields)


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation is or holds (``X``, ``X | Y``, ``dict[str, X]``)."""
    return [a for a in (annotation, *get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel)]


def parse_config(data: Mapping[str, Any], *, source: str = "<config>") -> EngineConfig:
    """Validate a config mapping (as read from TOML)."""
    try:
        return EngineConfig.model_validate(dict(data))
    except ValidationError as exc:
        for err in exc.errors():
            # A validator's own ConfigError (e.g. UNSAFE_OBJECT_STORE_COMMITS) keeps its code.
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, ConfigError):
                raise ConfigError(f"{source}: {str(cause).split('] ', 1)[-1]}", code=cause.code) from None
        raise ConfigError(_format_validation_error(exc, EngineConfig, source)) from None
    except DurationError:
        raise


def config_file(path: str | os.PathLike[str] | None = None) -> Path | None:
    """The config file :func:`load_config` reads for ``path``: it, else ``conf/retry-engine.toml`` if present."""
    if path is not None:
        return Path(path)
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.exists() else None


# A URI (s3://bucket/lake, file:///x, abfss://...) is never resolved against a folder.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def resolve_path(value: str, base: str | os.PathLike[str] | None = None) -> str:
    """``value`` with ``~`` expanded and, when relative, joined to ``base`` (a folder).

    URIs and blank values are returned unchanged (an empty lake is a config
    error of its own); ``base=None`` leaves a relative path relative, i.e. to
    the working directory.
    """
    if not value.strip() or _URI.match(value):
        return value
    expanded = os.path.expanduser(value)
    if base is None or os.path.isabs(expanded):
        return expanded
    return os.path.normpath(os.path.join(os.path.abspath(base), expanded))


def _resolve_file_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """``data`` with the file's relative paths (lake, checkpoint, [tables]) resolved against ``base``.

    A path in a file means the same wherever the command runs from; paths from
    the environment or the command line keep meaning the working directory.
    """
    resolved = dict(data)
    engine = data.get("engine")
    if isinstance(engine, dict):
        resolved["engine"] = {
            key: resolve_path(value, base) if key in ("lake", "checkpoint") and isinstance(value, str) else value
            for key, value in engine.items()
        }
    tables = data.get("tables")
    if isinstance(tables, dict):
        resolved["tables"] = {
            key: resolve_path(value, base) if isinstance(value, str) else value for key, value in tables.items()
        }
    return resolved


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    lake: str | None = None,
) -> EngineConfig:
    """Read and validate the config file, then apply environment and ``lake`` overrides.

    ``path=None`` reads ``conf/retry-engine.toml`` if it exists, else uses defaults.
    Relative paths in the file (``engine.lake``, ``engine.checkpoint``, ``[tables]``)
    are resolved against the file's folder, ``~`` expanded; the embedded defaults
    and ``RETRY_ENGINE_*`` values stay relative to the working directory. ``lake``
    (the command line's ``--lake``) wins over ``RETRY_ENGINE_LAKE`` and the file.
    """
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    source = "<defaults>"
    path = config_file(path)
    if path is not None:
        source = str(path)
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        except FileNotFoundError:
            raise ConfigError(f"config file {source} does not exist", code="CONFIG_NOT_FOUND") from None
        except IsADirectoryError:
            raise ConfigError(f"config file {source} is a folder; give the TOML file", code="CONFIG_NOT_FOUND") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source} is not valid TOML: {exc}", code="CONFIG_NOT_TOML") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{source} is not valid TOML: not UTF-8 text ({exc})", code="CONFIG_NOT_TOML") from None
        data = _resolve_file_paths(data, path.parent)
    engine_section = data.get("engine", {})
    if not isinstance(engine_section, dict):
        raise ConfigError(
            f"{source}: engine must be a table ([engine] with keys), got {type(engine_section).__name__} "
            f"{engine_section!r}",
            code="INVALID_CONFIG",
        )
    engine = dict(engine_section)
    for key, var in (("lake", ENV_LAKE), ("checkpoint", ENV_CHECKPOINT), ("master", ENV_MASTER)):
        if env.get(var):
            engine[key] = resolve_path(env[var]) if key != "master" else env[var]
    if lake is not None:
        engine["lake"] = resolve_path(lake)
    if engine:
        data = {**data, "engine": engine}
    return parse_config(data, source=source)
