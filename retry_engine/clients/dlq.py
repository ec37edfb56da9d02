"""Dead letters in notebooks: list, summarise, trace and time-travel the DLQ (B4, B6, R9).

Reading the DLQ is the deliberate operator path of R9: ordinary consumers never
subscribe to ``%DLQ%G``; people use these functions (or ``retry-engine dlq``).

Every function works without Spark (pandas, read through delta-rs on the
driver) and :func:`dead_letters` and :func:`summary` return a Spark DataFrame
instead when given ``spark=``, for DLQs too big for the driver.

>>> from retry_engine.config import load_config
>>> from retry_engine import dlq
>>> config = load_config("conf/retry-engine.toml")
>>> dlq.dead_letters(config, dlq.Selection(group="billing", error_pattern="Timeout"))
>>> dlq.summary(config, by=("topic", "error_class", "day"))
>>> dlq.history(config, "7F00...")           # every attempt of one message (B6)
>>> dlq.dead_letters(config, version=3)      # the DLQ as it was at table version 3
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import DeltaError

from retry_engine.config import EngineConfig
from retry_engine.core.decide import cast_columns, drifted_columns
from retry_engine.core.names import (
    PROP_REDRIVE_COUNT,
    REDRIVE_COUNT_PATTERN,
    is_whole,
    redrive_count,
    validate_group,
    validate_topic,
)
from retry_engine.delta import storage
from retry_engine.delta._log import DeltaLog
from retry_engine.delta.storage import open_delta, spark_options
from retry_engine.delta.tables import (
    cast_not_null,
    open_table,
    pyarrow_dataset,
    read_columns,
    stats_from,
    stats_until,
    table_arrow_schema,
    table_version,
)
from retry_engine.errors import SelectionError
from retry_engine.ops.audit import (
    AUDIT_TABLE,
    MOVED,
    RESOLVE_ACTIONS,
    read_audit,
    redrive_rows,
    resolution_rows,
)
from retry_engine.ops.terms import DEFAULT_SUMMARY, SUMMARY_KEYS, SummaryKey
from retry_engine.schemas import CONSUME_RESULTS, DLQ, MESSAGES, OUTCOMES, RETRY

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

# Properties a re-drive puts on the message it writes (B5); they survive later retries (R7).
PROP_REDRIVE_ID = "REDRIVE_ID"
PROP_REDRIVE_FROM = "REDRIVE_FROM_MSG_ID"

def redrive_count_column() -> Column:
    """:func:`retry_engine.core.names.redrive_count` as a Spark expression over a ``properties`` map column."""
    from pyspark.sql import functions as F

    value = F.col("properties")[PROP_REDRIVE_COUNT]
    return F.when(value.rlike(REDRIVE_COUNT_PATTERN), value.cast("int")).otherwise(F.lit(0))


# The highest max_redrives: Spark compares it with the count read as an int (redrive_count_column),
# a count has at most 9 digits anyway, and pyarrow has no literal for a number past int64.
MAX_REDRIVES_LIMIT = 2**31 - 1

# The listing a notebook shows first: why it died, then what it was.
LISTING_COLUMNS = (
    "dead_lettered_at",
    "consumer_group",
    "retry_topic",
    "msg_id",
    "origin_msg_id",
    "reconsume_times",
    "reason_code",
    "reason",
    "error_class",
    "error_message",
    "last_consumer_id",
    "attempt_count",
    "body_text",
    "tags",
    "keys",
    "properties",
    "born_timestamp",
    "redrive_count",
    "redriven_by",
    "resolution",
    "body",
)


@dataclass(frozen=True, kw_only=True)
class Selection:
    """Which dead letters: every given filter must match (all ``None`` = the whole DLQ).

    ``topic`` is the original topic (``retry_topic``); ``error_pattern`` is a
    regular expression searched in the error class and message; ``since`` /
    ``until`` bound ``dead_lettered_at`` (``until`` exclusive); ``ids`` match
    the dead letter's ``msg_id`` or its ``origin_msg_id``; ``max_redrives``
    keeps only messages re-driven fewer times than that before they died again
    (their ``REDRIVE_COUNT`` property), so a poison message is not re-driven forever.
    """

    group: str | None = None
    topic: str | None = None
    error_pattern: str | None = None
    reason_code: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    ids: tuple[str, ...] | None = None
    max_redrives: int | None = None

    def __post_init__(self) -> None:
        if self.max_redrives is not None and (
            isinstance(self.max_redrives, bool)
            or not isinstance(self.max_redrives, int)
            or not 1 <= self.max_redrives <= MAX_REDRIVES_LIMIT
        ):
            raise SelectionError(
                f"max_redrives must be a whole number from 1 to {MAX_REDRIVES_LIMIT}, got {self.max_redrives!r}",
                code="INVALID_MAX_REDRIVES",
            )
        if self.group is not None:
            validate_group(self.group)
        if self.topic is not None:
            validate_topic(self.topic)
        if self.error_pattern is not None:
            try:
                re.compile(self.error_pattern)
            except re.error as exc:
                raise SelectionError(
                    f"error pattern {self.error_pattern!r} is not a valid regular expression: {exc}",
                    code="INVALID_ERROR_PATTERN",
                ) from None
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, dt.datetime):
                    raise SelectionError(f"{name} must be a datetime, got {value!r}", code="INVALID_TIME_RANGE")
                if value.tzinfo is None:
                    object.__setattr__(self, name, value.replace(tzinfo=dt.UTC))
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise SelectionError(
                f"since {self.since.isoformat()} is not before until {self.until.isoformat()}",
                code="INVALID_TIME_RANGE",
            )
        if self.ids is not None:
            if isinstance(self.ids, str):
                raise SelectionError(f"ids must be a list of ids, not the string {self.ids!r}", code="INVALID_IDS")
            ids = tuple(self.ids)
            if not ids or any(not isinstance(i, str) or not i for i in ids):
                raise SelectionError(f"ids must be non-empty strings, got {list(ids)!r}", code="INVALID_IDS")
            object.__setattr__(self, "ids", ids)

    def describe(self) -> str:
        """The selection as canonical JSON (recorded in the audit table; names a re-drive)."""
        values = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(values, default=_json_value, sort_keys=True)

    def mask(self, rows: pa.Table) -> pa.Array:
        """Which rows of a DLQ-shaped Arrow table match (Python ``re`` for the pattern)."""
        keep = pa.array([True] * rows.num_rows, pa.bool_())

        def both(condition: pa.Array) -> pa.Array:
            return pc.and_(keep, pc.fill_null(condition, False))

        if self.group is not None:
            keep = both(pc.equal(rows.column("consumer_group"), self.group))
        if self.topic is not None:
            keep = both(pc.equal(rows.column("retry_topic"), self.topic))
        if self.reason_code is not None:
            keep = both(pc.equal(rows.column("reason_code"), self.reason_code))
        if self.since is not None:
            keep = both(pc.greater_equal(rows.column("dead_lettered_at"), pa.scalar(self.since, DLQ["dead_lettered_at"].type)))
        if self.until is not None:
            keep = both(pc.less(rows.column("dead_lettered_at"), pa.scalar(self.until, DLQ["dead_lettered_at"].type)))
        if self.ids is not None:
            wanted = pa.array(self.ids, pa.string())
            keep = both(pc.or_(pc.is_in(rows.column("msg_id"), wanted), pc.is_in(rows.column("origin_msg_id"), wanted)))
        if self.max_redrives is not None:
            counts = [redrive_count(dict(p or [])) for p in rows.column("properties").to_pylist()]
            keep = both(pc.less(pa.array(counts, pa.int64()), self.max_redrives))
        if self.error_pattern is not None:
            pattern = re.compile(self.error_pattern)
            texts = zip(rows.column("error_class").to_pylist(), rows.column("error_message").to_pylist(), strict=True)
            hits = [any(t is not None and pattern.search(t) for t in pair) for pair in texts]
            keep = both(pa.array(hits, pa.bool_()))
        return keep

    def spark_filter(self, df: DataFrame) -> DataFrame:
        """The same filter in Spark (the pattern is a Java regex there: ``rlike``)."""
        from pyspark.sql import functions as F

        if self.group is not None:
            df = df.filter(F.col("consumer_group") == self.group)
        if self.topic is not None:
            df = df.filter(F.col("retry_topic") == self.topic)
        if self.reason_code is not None:
            df = df.filter(F.col("reason_code") == self.reason_code)
        if self.since is not None:
            df = df.filter(F.col("dead_lettered_at") >= F.lit(self.since))
        if self.until is not None:
            df = df.filter(F.col("dead_lettered_at") < F.lit(self.until))
        if self.ids is not None:
            ids = list(self.ids)
            df = df.filter(F.col("msg_id").isin(ids) | F.col("origin_msg_id").isin(ids))
        if self.max_redrives is not None:
            df = df.filter(redrive_count_column() < self.max_redrives)
        if self.error_pattern is not None:
            df = df.filter(
                F.coalesce(F.col("error_class").rlike(self.error_pattern), F.lit(False))
                | F.coalesce(F.col("error_message").rlike(self.error_pattern), F.lit(False))
            )
        return df


def selection_consumer(selection: str | None) -> str | None:
    """The consumer instance a resend's audit selection names (``dlq resend``); None for a re-drive."""
    try:
        value = json.loads(selection or "{}").get("consumer_id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {value!r}")


# -- time travel -------------------------------------------------------------------


def resolve_version(path: str, *, version: int | None = None, as_of: dt.datetime | str | None = None) -> int | None:
    """The table version to read: ``version``, the one current at ``as_of``, or None (= latest).

    Raises :class:`SelectionError` naming the valid versions when the table
    has no such version.
    """
    if version is not None and as_of is not None:
        raise SelectionError("give version or as_of, not both", code="INVALID_VERSION")
    if version is None and as_of is None:
        return None
    if version is not None and not is_whole(version):
        raise SelectionError(f"version must be a whole number, got {version!r}", code="INVALID_VERSION")
    when = _as_of_time(as_of)
    table = open_table(path)
    if table is None:
        raise SelectionError(f"there is no table at {path} to time-travel", code="INVALID_VERSION")
    latest = table.version()
    # The oldest commit the log still holds (one listing): maintenance removes older ones
    # (delta.logRetentionDuration, 30 days), and versions before it can no longer be read.
    log = DeltaLog(storage.location(path))
    earliest = log.earliest_commit() or 0
    cleaned = f" (the log before version {earliest} was cleaned)" if earliest > 0 else ""
    if version is not None:
        if not earliest <= version <= latest:
            raise SelectionError(
                f"version {version} of {path} cannot be read; versions are {earliest}..{latest}{cleaned}",
                code="INVALID_VERSION",
            )
        return version
    assert when is not None  # one of the two was given; not an input check
    stamp = log.commit_timestamp_ms(earliest)
    since = dt.datetime.fromtimestamp(stamp / 1000, dt.UTC) if stamp is not None else dt.datetime.min.replace(tzinfo=dt.UTC)
    if when < since:
        raise SelectionError(
            f"{path} did not exist at {when.isoformat()}; its first version is from {since.isoformat()}"
            if not cleaned
            else f"{path} cannot be read as of {when.isoformat()}: the log before version {earliest} "
            f"({since.isoformat()}) was cleaned",
            code="INVALID_VERSION",
        )
    try:
        table.load_as_version(when)
    except (ValueError, DeltaError) as exc:
        raise SelectionError(f"cannot read {path} as of {when.isoformat()}: {exc}", code="INVALID_VERSION") from exc
    return int(table.version())


def _as_of_time(as_of: dt.datetime | str | None) -> dt.datetime | None:
    """``as_of`` as an aware time (ISO 8601 text too; no zone means UTC); ``INVALID_VERSION`` for anything else."""
    if as_of is None or isinstance(as_of, dt.datetime):
        return None if as_of is None else as_of if as_of.tzinfo is not None else as_of.replace(tzinfo=dt.UTC)
    if isinstance(as_of, str):
        try:
            return _as_of_time(dt.datetime.fromisoformat(as_of.strip()))
        except ValueError:
            pass
    raise SelectionError(f"as_of must be a time (a datetime or ISO 8601 text), got {as_of!r}", code="INVALID_VERSION")


def versions(config: EngineConfig, table: str = "dlq") -> pd.DataFrame:
    """The commit history of ``table`` (newest first): version, timestamp, operation, parameters."""
    found = open_table(config.table_path(table))
    if found is None:
        return pd.DataFrame(columns=["version", "timestamp", "operation", "operationParameters"])
    frame = pd.DataFrame(found.history())
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], unit="ms", utc=True)
    keep = [c for c in ("version", "timestamp", "operation", "operationParameters") if c in frame.columns]
    return frame[keep]


# -- dead letters ------------------------------------------------------------------


# Every DLQ column but the payload and the delivery attempts, which are most of a dead letter's bytes:
# what counting, a selection and an id lookup need (``dlq stats`` read and decoded every body).
LIGHT_COLUMNS: tuple[str, ...] = tuple(n for n in DLQ.names if n not in ("body", "attempts"))


def read_dlq(
    config: EngineConfig,
    selection: Selection | None = None,
    *,
    version: int | None = None,
    as_of: dt.datetime | str | None = None,
    columns: Sequence[str] = tuple(DLQ.names),
) -> pa.Table:
    """``columns`` of the DLQ rows matching ``selection``, as Arrow; empty if no DLQ yet. The columns
    the selection looks at (:data:`LIGHT_COLUMNS`) are read too when it is given."""
    columns = list(columns)
    read = list(dict.fromkeys([*columns, *(LIGHT_COLUMNS if selection is not None else ())]))
    schema = pa.schema([DLQ.arrow_schema.field(c) for c in read])
    path = config.table_path("dlq")
    resolved = resolve_version(path, version=version, as_of=as_of)
    if open_table(path) is None:
        return schema.empty_table().select(columns)
    # Only the files the selection may match: the group's (the partition column), and those whose
    # dead_lettered_at statistics overlap since/until (kept to the millisecond: stats_from, stats_until); within
    # them, Parquet's row-group statistics. The selection's mask decides on the rows.
    files: list[tuple[str, str, Any]] = []
    bounds = pc.scalar(True)
    if selection is not None and selection.group is not None:
        files.append(("consumer_group", "=", selection.group))
    if selection is not None and selection.since is not None:
        files.append(("dead_lettered_at", ">=", stats_from(selection.since)))
        bounds = bounds & (pc.field("dead_lettered_at") >= pa.scalar(selection.since, DLQ["dead_lettered_at"].type))
    if selection is not None and selection.until is not None:
        files.append(("dead_lettered_at", "<=", stats_until(selection.until)))
        bounds = bounds & (pc.field("dead_lettered_at") < pa.scalar(selection.until, DLQ["dead_lettered_at"].type))
    delta = open_delta(path, version=resolved)
    rows = cast_not_null(
        read_columns(delta, DLQ.arrow_schema, read, files=files or None, rows=bounds).select(read), schema,
        f"the DLQ table at {path}",
    )
    if selection is not None:
        rows = rows.filter(selection.mask(rows))
    return rows.select(columns)


def dead_letters_named(config: EngineConfig, named: pa.Table, *, version: int | None) -> pa.Table:
    """Every column of the dead letters ``named`` lists (``msg_id``, ``consumer_group`` and
    ``dead_lettered_at`` of rows read at ``version``), reading only the files their groups and
    times may be in and keeping only their rows: a re-drive's bodies, not the whole DLQ's."""
    schema = DLQ.arrow_schema
    if named.num_rows == 0 or version is None:
        return schema.empty_table()
    at = named.column("dead_lettered_at")
    groups = [g for g in set(named.column("consumer_group").to_pylist()) if g is not None]
    files: list[tuple[str, str, Any]] = []
    if at.null_count == 0:
        files += [
            ("dead_lettered_at", ">=", stats_from(pc.min(at).as_py())),
            ("dead_lettered_at", "<=", stats_until(pc.max(at).as_py())),
        ]
    if groups and named.column("consumer_group").null_count == 0:
        files.append(("consumer_group", "in", groups))
    ids = named.column("msg_id").combine_chunks()
    delta = open_delta(config.table_path("dlq"), version=version)
    return cast_not_null(
        read_columns(delta, schema, schema.names, files=files or None, rows=pc.field("msg_id").isin(ids)), schema,
        f"the DLQ table at {config.table_path('dlq')}",
    )


def dead_letters(
    config: EngineConfig,
    selection: Selection | None = None,
    *,
    version: int | None = None,
    as_of: dt.datetime | str | None = None,
    spark: SparkSession | None = None,
    include_resolved: bool = False,
) -> pd.DataFrame | DataFrame:
    """Dead letters with decoded bodies and error context, oldest first.

    Columns: :data:`LISTING_COLUMNS`. ``body_text`` is the body decoded as
    UTF-8 (undecodable bytes replaced); ``redrive_count`` comes from the
    message's ``REDRIVE_COUNT`` property (how often it was re-driven before it
    died this time); ``redriven_by`` is the re-drive that moved this dead
    letter, or null. With ``spark`` the result is a Spark DataFrame.

    Resolved and purged dead letters (:mod:`retry_engine.ops.resolve`) are left
    out unless ``include_resolved``; ``resolution`` then says who resolved
    them and why (null for the others).
    """
    if spark is not None:
        return _dead_letters_spark(spark, config, selection, version=version, as_of=as_of, include_resolved=include_resolved)
    rows = read_dlq(config, selection, version=version, as_of=as_of)
    return _listing(config, rows, include_resolved=include_resolved)


def dead_letter_page(
    config: EngineConfig,
    selection: Selection | None = None,
    *,
    limit: int,
    version: int | None = None,
    as_of: dt.datetime | str | None = None,
    include_resolved: bool = False,
) -> tuple[pd.DataFrame, int]:
    """The first ``limit`` rows of :func:`dead_letters` (oldest first), and how many there are in all
    (``dlq list``). Bodies and attempts are read only for the page: the rest is decided on the light
    columns, so listing a few dead letters of a DLQ of months does not read every body."""
    if not is_whole(limit) or limit < 0:
        # pandas' head(-1) is every row but the last.
        raise SelectionError(f"limit must be a whole number of rows, 0 or more, got {limit!r}", code="INVALID_LIMIT")
    path = config.table_path("dlq")
    at = resolve_version(path, version=version, as_of=as_of)
    at = at if at is not None else table_version(path)
    light = read_dlq(config, selection, version=at, columns=LIGHT_COLUMNS)
    frame = _with_fates(
        config, light.select(["msg_id", "consumer_group", "dead_lettered_at"]).to_pandas(), include_resolved=include_resolved
    )
    page = frame.sort_values(["dead_lettered_at", "msg_id"], ignore_index=True).head(limit)
    named = light.filter(pc.is_in(light.column("msg_id"), pa.array(page["msg_id"].tolist(), pa.string())))
    rows = dead_letters_named(config, named, version=at)
    # .head again: a msg_id dead-lettered twice (re-driven, failed again) names its later row too.
    return _listing(config, rows, include_resolved=include_resolved).head(limit), len(frame)


def _listing(config: EngineConfig, rows: pa.Table, *, include_resolved: bool) -> pd.DataFrame:
    """:data:`LISTING_COLUMNS` of DLQ ``rows``, oldest first (see :func:`dead_letters`)."""
    frame = rows.to_pandas()
    frame["body_text"] = [None if b is None else bytes(b).decode("utf-8", errors="replace") for b in frame["body"]]
    frame["attempt_count"] = [0 if a is None else len(a) for a in frame["attempts"]]
    frame["last_consumer_id"] = [None if a is None or len(a) == 0 else a[-1]["consumer_id"] for a in frame["attempts"]]
    frame["properties"] = [dict(p) if p is not None else {} for p in frame["properties"]]
    frame["redrive_count"] = [redrive_count(p) for p in frame["properties"]]
    frame = _with_fates(config, frame, include_resolved=include_resolved)
    return frame[list(LISTING_COLUMNS)].sort_values(["dead_lettered_at", "msg_id"], ignore_index=True)


def _with_fates(config: EngineConfig, frame: pd.DataFrame, *, include_resolved: bool) -> pd.DataFrame:
    """``frame`` with ``redriven_by`` and ``resolution``; without the resolved unless ``include_resolved``."""
    audit = read_audit(config)
    moved = _moved_by(audit)
    frame["redriven_by"] = [moved.get(m) for m in frame["msg_id"]]
    resolved = _resolved(audit)
    frame["resolution"] = [resolved.get(m) for m in frame["msg_id"]]
    return frame if include_resolved else frame[frame["resolution"].isna()]


def _moved_by(audit: pa.Table) -> dict[str, str]:
    """dlq msg_id -> id of the (latest) re-drive that moved it, from the audit table's rows."""
    audit = redrive_rows(audit)
    audit = audit.filter(audit.column(MOVED)).sort_by([("redriven_at", "ascending")])
    return dict(zip(audit.column("dlq_msg_id").to_pylist(), audit.column("redrive_id").to_pylist(), strict=True))


def _resolved(audit: pa.Table) -> dict[str, str]:
    """dlq msg_id -> "resolved by <operator> at <time>: <reason>" (or "purged ..."), for resolved dead letters."""
    marks = resolution_rows(audit).sort_by([("redriven_at", "ascending")])
    return {
        m["dlq_msg_id"]: f"{_PAST[m['target']]} by {m['operator']} at {_minute(m['redriven_at'])}: {m['note']}"
        for m in marks.select(["dlq_msg_id", "target", "operator", "redriven_at", "note"]).to_pylist()
    }


def _minute(at: dt.datetime | None) -> str:
    """A time as a listing shows it; "-" for none (an audit row another writer left without one)."""
    return "-" if at is None else f"{at:%Y-%m-%d %H:%M}"


# How a listing or a history names each resolve action.
_PAST = dict(zip(RESOLVE_ACTIONS, ("resolved", "purged"), strict=True))


def _dead_letters_spark(
    spark: SparkSession,
    config: EngineConfig,
    selection: Selection | None,
    *,
    version: int | None,
    as_of: dt.datetime | str | None,
    include_resolved: bool,
) -> DataFrame:
    from pyspark.sql import functions as F

    from retry_engine.delta import FORMAT_NAME, register
    from retry_engine.delta.session import read_parallelism

    path = config.table_path("dlq")
    resolved = resolve_version(path, version=version, as_of=as_of)
    if open_table(path) is None:
        df = spark.createDataFrame([], DLQ.spark_schema)
    else:
        register(spark)
        reader = (
            spark.read.format(FORMAT_NAME)
            .option("path", path)
            .options(**spark_options(path))
            # A dead-letter table of many small files: about one read task per core, not one per file.
            .option("readPartitions", read_parallelism(spark))
        )
        if resolved is not None:
            reader = reader.option("versionAsOf", str(resolved))
        df = reader.load()
    if selection is not None:
        df = selection.spark_filter(df)
    audit = read_audit(config)
    moved = spark.createDataFrame(
        list(_moved_by(audit).items()), "dlq_msg_id string, redriven_by string"
    )
    df = df.join(moved, df["msg_id"] == moved["dlq_msg_id"], "left").drop("dlq_msg_id")
    marks = spark.createDataFrame(list(_resolved(audit).items()), "resolved_id string, resolution string")
    df = df.join(marks, df["msg_id"] == marks["resolved_id"], "left").drop("resolved_id")
    if not include_resolved:
        df = df.filter(F.col("resolution").isNull())
    last = F.element_at("attempts", -1)
    derived = {
        "body_text": F.col("body").cast("string"),
        "attempt_count": F.coalesce(F.size("attempts"), F.lit(0)),
        "last_consumer_id": F.when(F.size("attempts") > 0, last["consumer_id"]),
        "redrive_count": redrive_count_column(),
    }
    cols = [derived[c].alias(c) if c in derived else F.col(c) for c in LISTING_COLUMNS]
    return df.select(*cols).orderBy("dead_lettered_at", "msg_id")


_DAY_US = 86_400_000_000


def summary(
    config: EngineConfig,
    selection: Selection | None = None,
    *,
    by: Sequence[SummaryKey] = DEFAULT_SUMMARY,
    version: int | None = None,
    as_of: dt.datetime | str | None = None,
    spark: SparkSession | None = None,
    include_resolved: bool = False,
) -> pd.DataFrame | DataFrame:
    """Dead letters counted by ``by`` (group, topic, error_class, reason_code, day), largest first.

    Columns: the ``by`` columns (``day`` is the UTC date of ``dead_lettered_at``),
    ``dead_letters``, ``redriven`` (how many of them a re-drive moved),
    ``first_at`` and ``last_at``.
    """
    keys = _summary_columns(by)
    if spark is not None:
        from pyspark.sql import DataFrame as SparkFrame
        from pyspark.sql import functions as F

        listing = dead_letters(config, selection, version=version, as_of=as_of, spark=spark, include_resolved=include_resolved)
        assert isinstance(listing, SparkFrame)  # narrowed: spark was given
        return (
            # The UTC date whatever the session's time zone (to_date takes the session's).
            # In whole numbers (a division in doubles put the last microseconds of a day after 2255 on the next).
            listing.withColumn("day", F.expr(
                f"date_from_unix_date(CAST((unix_micros(dead_lettered_at) - pmod(unix_micros(dead_lettered_at), "
                f"{_DAY_US})) div {_DAY_US} AS INT))"))
            .groupBy(*keys)
            .agg(
                F.count("*").alias("dead_letters"),
                F.count("redriven_by").alias("redriven"),
                F.min("dead_lettered_at").alias("first_at"),
                F.max("dead_lettered_at").alias("last_at"),
            )
            .orderBy(F.desc("dead_letters"), *keys)
        )
    # Counting reads no body (200,000 dead letters of 1 KB: 1.4-1.7 s and 1.7 GB through the listing).
    counted = list(dict.fromkeys(["msg_id", "dead_lettered_at", *(k for k in keys if k != "day")]))
    rows = read_dlq(config, selection, version=version, as_of=as_of, columns=counted)
    listing = _with_fates(config, rows.to_pandas(), include_resolved=include_resolved)
    frame = listing.assign(day=listing["dead_lettered_at"].dt.date)
    if frame.empty:
        return pd.DataFrame(columns=[*keys, "dead_letters", "redriven", "first_at", "last_at"])
    grouped = frame.groupby(keys, dropna=False).agg(
        dead_letters=("msg_id", "size"),
        redriven=("redriven_by", "count"),
        first_at=("dead_lettered_at", "min"),
        last_at=("dead_lettered_at", "max"),
    )
    return grouped.reset_index().sort_values(["dead_letters", *keys], ascending=[False, *[True] * len(keys)], ignore_index=True)


def _summary_columns(by: Sequence[str]) -> list[str]:
    if isinstance(by, str) or not by:
        raise SelectionError(f"by must be a non-empty list of {', '.join(SUMMARY_KEYS)}; got {by!r}", code="INVALID_SUMMARY")
    unknown = [k for k in by if k not in SUMMARY_KEYS]
    if unknown:
        raise SelectionError(
            f"cannot summarise by {unknown[0]!r}; choose from {', '.join(SUMMARY_KEYS)}", code="INVALID_SUMMARY"
        )
    repeated = [k for i, k in enumerate(by) if k in by[:i]]
    if repeated:
        raise SelectionError(
            f"cannot summarise by {repeated[0]!r} twice; give each of {', '.join(SUMMARY_KEYS)} at most once",
            code="INVALID_SUMMARY",
        )
    return [SUMMARY_KEYS[k] for k in by]


# -- one message's history (B6) --------------------------------------------------------

HISTORY_COLUMNS = (
    "at",
    "table",
    "event",
    "msg_id",
    "topic",
    "consumer_group",
    "consumer_id",
    "reconsume_times",
    "delay_level",
    "reason_code",
    "error_class",
    "error_message",
    "detail",
)
# Sort key of history rows with equal times (not shown).
_ORDER = "_order"
# The type of the history's ``at``: any time a table holds (years 1-9999), to the microsecond.
HISTORY_TIME = "datetime64[us, UTC]"
# The tables a history reads, whose types it reads them in (_read_where).
_HISTORY_TABLES = {t.name: t for t in (CONSUME_RESULTS, OUTCOMES, RETRY, DLQ, MESSAGES)}


def origin_of(config: EngineConfig, msg_id: str) -> str:
    """The origin id of any message id seen by the engine (itself when it is an origin)."""
    for table in ("dlq", "retry", "messages", "outcomes", "consume_results"):
        rows = _read_where(config, table, pc.field("msg_id") == msg_id, ["origin_msg_id"])
        origins = [o for o in rows.column("origin_msg_id").to_pylist() if o]
        if origins:
            return str(origins[0])
    return msg_id


def deliveries_of(config: EngineConfig, msg_id: str) -> list[tuple[str, str | None]]:
    """(origin id, group) of each delivery the id ``msg_id`` names (a retry, a decided or consumed
    message): a dead letter of that origin *and group* is the one such an id leads to."""
    found: set[tuple[str, str | None]] = set()
    for table in ("retry", "outcomes", "consume_results"):
        rows = _read_where(config, table, pc.field("msg_id") == msg_id, ["origin_msg_id", "consumer_group"])
        for origin, group in zip(rows.column("origin_msg_id").to_pylist(), rows.column("consumer_group").to_pylist(), strict=True):
            if origin:
                found.add((str(origin), None if group is None else str(group)))
    return sorted(found, key=lambda pair: (pair[0], pair[1] or ""))


def history(config: EngineConfig, msg_id: str) -> pd.DataFrame:
    """Every row about one message, oldest first: consumed, decided, retried, dead-lettered, re-driven.

    ``msg_id`` may be the origin id or the id of any retry, dead letter or
    re-driven copy. Columns: :data:`HISTORY_COLUMNS`; ``table`` says where the
    row lives, ``event`` what happened. Each delivery shows twice: the
    consumer's own result (``consumed: <status>``, with its ``consumer_id``
    and the error it reported) and the engine's decision about it
    (``decided: <outcome>``). An error is shown on the consumption that
    raised it only: the retry and dead letter it led to carry a copy of it
    (B4), which is not repeated here. One message's rows are few, so this
    reads through delta-rs on the driver (with or without Spark around).
    """
    if not isinstance(msg_id, str) or not msg_id:
        raise SelectionError(f"msg_id must be a non-empty string, got {msg_id!r}", code="INVALID_IDS")
    origin = origin_of(config, msg_id)
    mine = (pc.field("origin_msg_id") == origin) | (pc.field("msg_id") == origin)
    events: list[dict[str, Any]] = []
    for row in _read_where(config, "consume_results", mine).to_pylist():
        asked = row.get("delay_level_when_next_consume")
        events.append(
            {
                **row,
                "at": row.get("consumed_at"),
                "event": f"consumed: {row.get('status') or 'no status (a failure)'}",
                "detail": f"asked for delay level {asked}" if asked else None,
                _ORDER: 0,
            }
        )
    for row in _read_where(config, "outcomes", mine).to_pylist():
        events.append(
            {
                **row,
                "at": row["decided_at"],
                "event": f"decided: {row['outcome']}",
                "topic": row["retry_topic"],
                "detail": row["output_msg_id"] and f"output {row['output_msg_id']}",
                _ORDER: 1,
            }
        )
    # The retry and the dead letter copy the failed consumption's error (B4): not their own.
    no_error = {"error_class": None, "error_message": None}
    for row in _read_where(config, "retry", mine).to_pylist():
        at, detail = row["delivered_at"], f"due {row['due_at']}"
        events.append({**row, **no_error, "at": at, "event": "retry delivered", "detail": detail, _ORDER: 2})
    for row in _read_where(config, "dlq", mine).to_pylist():
        at, detail = row["dead_lettered_at"], row["reason"]
        events.append({**row, **no_error, "at": at, "event": "dead-lettered", "detail": detail, _ORDER: 2})
    for row in _read_where(config, "messages", mine).to_pylist():
        props = dict(row["properties"] or [])
        redrive = props.get(PROP_REDRIVE_ID)
        events.append(
            {
                **row,
                "at": row["store_timestamp"],
                "event": "re-driven to topic" if redrive else "published",
                "detail": redrive and f"re-drive {redrive} of {props.get(PROP_REDRIVE_FROM)}",
                _ORDER: 2,
            }
        )
    audit = read_audit(config)
    audit = audit.filter(pc.equal(audit.column("origin_msg_id"), origin))
    for row in audit.to_pylist():
        if row["target"] in RESOLVE_ACTIONS:
            events.append(
                {
                    **row,
                    "at": row["redriven_at"],
                    "table": AUDIT_TABLE,
                    "event": _PAST[row["target"]],
                    "msg_id": row["dlq_msg_id"],
                    "detail": f"{row['redrive_id']} by {row['operator']}: {row['note']}",
                }
            )
            continue
        events.append(
            {
                **row,
                "at": row["redriven_at"],
                "table": AUDIT_TABLE,
                "event": f"re-drive {'moved' if row[MOVED] else 'planned (not moved yet)'} to {row['target']}",
                "msg_id": row["dlq_msg_id"],
                "detail": f"re-drive {row['redrive_id']} by {row['operator']}: new message {row['redriven_msg_id']}",
            }
        )
        instance = selection_consumer(row["selection"])
        if instance is not None:  # a resend: say to which instance
            events[-1]["event"] = f"resend {'moved' if row[MOVED] else 'planned (not moved yet)'} to one consumer"
            events[-1]["consumer_id"] = instance
    columns = [*HISTORY_COLUMNS, _ORDER]
    frame = pd.DataFrame([{c: e.get(c, 3) if c == _ORDER else e.get(c) for c in columns} for e in events], columns=columns)
    if frame.empty:
        return frame.drop(columns=[_ORDER])
    # Microseconds, as the tables hold them: pandas' default nanoseconds end in 1677 and 2262.
    frame["at"] = frame["at"].astype(HISTORY_TIME)
    # A decision shares its micro-batch time with the dead letter it wrote: consumed, decided, then the rest.
    frame = frame.sort_values(["at", "reconsume_times", _ORDER], kind="stable", ignore_index=True, na_position="first")
    # Counts as whole numbers where some rows have none (pandas made them floats: 16.0, NaN).
    for column in ("reconsume_times", "delay_level"):
        with contextlib.suppress(TypeError, ValueError):  # another writer's fractions stay as they are
            frame[column] = frame[column].astype("Int64")
    return frame.drop(columns=[_ORDER])


def _read_where(config: EngineConfig, table: str, where: Any, columns: list[str] | None = None) -> pa.Table:
    """Rows of ``table`` matching a pyarrow expression on its ids, tagged with ``table``; empty if no table.

    A column another writer gave another type (an id as a number) is read in the
    engine's type (:func:`~retry_engine.delta.tables.read_columns`) before the rows are picked.
    """
    found = open_table(config.table_path(table))
    if found is None:
        return pa.table({c: pa.array([], pa.string()) for c in columns or ["msg_id"]})
    schema = table_arrow_schema(found)
    names = schema.names
    if not {"origin_msg_id", "msg_id"} <= set(names):  # a drifted consume_results table may lack either
        return pa.table({c: pa.array([], pa.string()) for c in columns or ["msg_id"]})
    # The filter prunes files on their stats (the deltars sink writes them for every
    # primitive column), so a history lookup reads only files that can hold the id.
    wanted = columns or names
    read = list(dict.fromkeys([*wanted, "msg_id", "origin_msg_id"]))  # the ids the filter picks by
    expected = _HISTORY_TABLES[table].arrow_schema
    if drifted_columns(schema, expected, ["msg_id", "origin_msg_id"]) or not set(read) <= set(names):
        # The ids of another type prune nothing: read whole and cast before picking (read_columns).
        rows = read_columns(found, expected, read, rows=where).select(wanted)
    else:
        # Picked by the ids as read (their statistics prune files); a column of another type is cast after.
        rows = pyarrow_dataset(found).to_table(columns=read, filter=where)
        rows = cast_columns(rows, expected, drifted_columns(schema, expected, read)).select(wanted)
    if columns is None:
        rows = rows.append_column("table", pa.array([table] * rows.num_rows, pa.string()))
    return rows
