"""Streaming offsets over a Delta log, modeled on Delta's own source.

An offset ``(reservoirVersion, index, isStartingVersion)`` means "everything
up to and including file ``index`` of version ``reservoirVersion`` has been
read"; ``index = -1`` means nothing of that version yet. With
``isStartingVersion`` the files are those of the snapshot at that version,
otherwise those its commit added. A range ``(start, end]`` is a pure function
of the two offsets and the (immutable) log, so a replayed micro-batch reads
the same files in the same order.

Spark-free: the data source maps Spark's ``ReadLimit`` onto :class:`Admission`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from retry_engine.delta._log import Commit, FileEntry, commit_entries
from retry_engine.errors import DeltaSourceError

SOURCE_VERSION = 1
BASE_INDEX = -1


def _whole(value: Any, name: str, least: int) -> int:
    """A whole number of an offset (JSON: an integer), at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} {value!r} is not a whole number >= {least}")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"isStartingVersion {value!r} is not true or false")
    return value


@dataclass(frozen=True)
class Offset:
    """A position in the stream of a table's data files."""

    version: int
    index: int
    is_starting_version: bool
    reservoir_id: str | None = None
    # Only on the end of a query's first batch: where that batch started (see ``replay_start``).
    batch_start: Offset | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.version, self.index)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sourceVersion": SOURCE_VERSION,
            "reservoirId": self.reservoir_id,
            "reservoirVersion": self.version,
            "index": self.index,
            "isStartingVersion": self.is_starting_version,
        }
        if self.batch_start is not None:
            out["batchStart"] = {
                "reservoirVersion": self.batch_start.version,
                "index": self.batch_start.index,
                "isStartingVersion": self.batch_start.is_starting_version,
            }
        return out

    def starting_from(self, start: Offset) -> Offset:
        """This end offset, recording that its batch started at ``start``."""
        return Offset(self.version, self.index, self.is_starting_version, self.reservoir_id,
                      Offset(start.version, start.index, start.is_starting_version, start.reservoir_id))

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Offset:
        try:
            source_version = _whole(data.get("sourceVersion", SOURCE_VERSION), "sourceVersion", 0)
            recorded = data.get("batchStart")
            reservoir = data.get("reservoirId")
            if reservoir is not None and not isinstance(reservoir, str):
                raise TypeError(f"reservoirId {reservoir!r} is not text")
            offset = cls(
                version=_whole(data["reservoirVersion"], "reservoirVersion", 0),
                index=_whole(data["index"], "index", BASE_INDEX),
                is_starting_version=_flag(data["isStartingVersion"]),
                reservoir_id=reservoir,
                batch_start=None if recorded is None else cls(
                    _whole(recorded["reservoirVersion"], "reservoirVersion", 0),
                    _whole(recorded["index"], "index", BASE_INDEX), _flag(recorded["isStartingVersion"]), reservoir,
                ),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DeltaSourceError(f"not a deltars offset: {dict(data)!r}", code="DELTA_OFFSET_INVALID") from exc
        if source_version > SOURCE_VERSION:
            raise DeltaSourceError(
                f"offset {dict(data)!r} was written by a newer deltars (sourceVersion {source_version}, "
                f"this one reads <= {SOURCE_VERSION})",
                code="DELTA_OFFSET_INVALID",
            )
        return offset

    @classmethod
    def after_version(cls, version: int, reservoir_id: str | None) -> Offset:
        """Everything through ``version`` read; next comes commit ``version + 1``."""
        return cls(version + 1, BASE_INDEX, False, reservoir_id)

    @classmethod
    def after_file(cls, entry: FileEntry, reservoir_id: str | None) -> Offset:
        # Moving past a finished version (as Delta does) means the next batch never
        # has to list that version again, which matters most for a large snapshot.
        if entry.is_last:
            return cls.after_version(entry.version, reservoir_id)
        return cls(entry.version, entry.index, entry.is_starting_version, reservoir_id)


def within_table(offset: Offset, latest: int) -> bool:
    """Whether a table whose latest version is ``latest`` can have ``offset`` (and its ``batch_start``).

    A snapshot offset is of a snapshot the table has, and an offset inside a
    commit (``index >= 0``) of a commit it has: version ``<= latest``. Only
    "before commit v" (``index == -1``, not a snapshot) may be one past:
    ``(latest + 1, -1)`` is where a stream that read every commit waits for
    the next (and where ``startingVersion=latest`` starts). The log only grows,
    so an offset past that was not made from this table's log.
    """
    greatest = (
        latest + 1 if offset.index == BASE_INDEX and not offset.is_starting_version else latest
    )
    if offset.version > greatest:
        return False
    return offset.batch_start is None or within_table(offset.batch_start, latest)


def require_within_table(offset: Offset, latest: int, *, table: str) -> None:
    """``DELTA_OFFSET_INVALID`` unless :func:`within_table`: a stream would wait there forever,
    reading nothing while the table gains commits."""
    if within_table(offset, latest):
        return
    own = replace(offset, batch_start=None)
    past = (
        own if offset.batch_start is None or not within_table(own, latest) else offset.batch_start
    )
    raise DeltaSourceError(
        f"the checkpoint's offset is at version {past.version} of {table} (index {past.index}"
        f"{', in its snapshot' if past.is_starting_version else ''}), but the table's latest version is "
        f"{latest}: the table was restored or replaced (same table id, a shorter log) under the checkpoint, "
        "so the stream would wait there forever, reading none of the table's new commits. Start the stream "
        "from a new checkpoint, or restore the table's log that the checkpoint read",
        code="DELTA_OFFSET_INVALID",
    )


@dataclass(frozen=True)
class Admission:
    """How much one micro-batch may take; at least one file is always admitted."""

    max_files: int | None = None
    max_bytes: int | None = None
    max_rows: int | None = None
    """Rows by the files' ``numRecords`` statistics (a file without them counts as none)."""

    def __post_init__(self) -> None:
        for name in ("max_files", "max_bytes", "max_rows"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value}")


@dataclass(frozen=True)
class ChangeRules:
    """What to do with commits that remove data (Delta's ``ignoreDeletes`` / ``skipChangeCommits``)."""

    ignore_deletes: bool = False
    skip_change_commits: bool = False


class LogReader(Protocol):
    """What offset arithmetic needs from a log (``DeltaLog`` in production)."""

    @property
    def uri(self) -> str: ...

    def snapshot(self, version: int) -> list[FileEntry]: ...

    def require_commit(self, version: int) -> Commit: ...


def files_after(
    log: LogReader,
    start: Offset,
    *,
    through_version: int,
    rules: ChangeRules,
    on_commit: Callable[[Commit], None] | None = None,
) -> Iterator[FileEntry]:
    """Files after ``start``, up to and including commit ``through_version``, in stream order.

    With a starting-version ``start`` the rest of that snapshot comes first,
    whatever ``through_version`` is. Commits are read lazily, so a caller that
    stops early never reads (or fails on) later commits.
    """
    version, index = start.key
    if start.is_starting_version:
        for entry in log.snapshot(version):
            if entry.index > index:
                yield entry
        version, index = version + 1, BASE_INDEX
    while version <= through_version:
        commit = log.require_commit(version)
        if on_commit is not None:
            on_commit(commit)
        entries = commit_entries(
            commit, uri=log.uri, ignore_deletes=rules.ignore_deletes, skip_change_commits=rules.skip_change_commits
        )
        for entry in entries:
            if entry.index > index:
                yield entry
        version, index = version + 1, BASE_INDEX


def end_offset(files: Iterator[FileEntry], start: Offset, *, until_version: int, admission: Admission) -> Offset:
    """The end of the next micro-batch starting at ``start``.

    Admits files in order until ``admission`` is reached (but always one). If
    everything up to ``until_version`` fits, the end moves past that version,
    so commits that add nothing (metadata, txn, skipped changes) are passed
    over too. Returns ``start`` when there is nothing new.
    """
    last: FileEntry | None = None
    count = size = rows = 0
    for entry in files:
        records = entry.num_records or 0
        if last is not None and (
            (admission.max_bytes is not None and size + entry.size > admission.max_bytes)
            or (admission.max_rows is not None and rows + records > admission.max_rows)
        ):
            return Offset.after_file(last, start.reservoir_id)
        last, count, size, rows = entry, count + 1, size + entry.size, rows + records
        # Stop as soon as the batch is full: later commits are not read yet, so a
        # commit the stream cannot follow fails the batch that reaches it, not earlier ones.
        if (
            (admission.max_files is not None and count >= admission.max_files)
            or (admission.max_bytes is not None and size >= admission.max_bytes)
            or (admission.max_rows is not None and rows >= admission.max_rows)
        ):
            return Offset.after_file(last, start.reservoir_id)
    caught_up = Offset.after_version(until_version, start.reservoir_id)
    return caught_up if caught_up.key > start.key else start


def through_version_of(end: Offset) -> int:
    """The last commit a range ending at ``end`` may need (later ones are never read)."""
    if end.is_starting_version or end.index == BASE_INDEX:
        return end.version - 1
    return end.version


def replay_start(start: Offset, end: Offset) -> Offset:
    """The start of the range ``(start, end]`` to read, when ``start`` may be a recomputed initial offset.

    Spark does not log where batch 0 started: when batch 0 is run again after a
    restart, its start is ``initialOffset()`` asked anew: the snapshot at the
    table's latest version *now*, or with ``startingVersion=latest`` the commit
    after it. Either can lie past or inside the logged batch (its input would
    be lost). So the end of a query's first batch records where that batch
    started (``batchStart``), and that start is used: the replay reads the
    same files, rows and positions.

    Ends logged without ``batchStart`` (by older versions): a recomputed
    snapshot start past ``end`` is re-read, like Delta's own source does, as
    the snapshot just before ``end``; for an append-only stream that is the
    same rows. Any other ``start`` is returned unchanged.
    """
    if end.batch_start is not None:
        return end.batch_start
    if not (start.is_starting_version and start.index == BASE_INDEX):
        return start
    consistent = end.version == start.version if end.is_starting_version else end.version > start.version
    if consistent:
        return start
    version = end.version if end.is_starting_version else end.version - 1
    return Offset(version, BASE_INDEX, True, start.reservoir_id)


def files_between(
    log: LogReader,
    start: Offset,
    end: Offset,
    *,
    rules: ChangeRules,
    on_commit: Callable[[Commit], None] | None = None,
) -> list[FileEntry]:
    """The files of the range ``(start, end]``, in stream order."""
    if end.key <= start.key:
        return []
    files = []
    for entry in files_after(log, start, through_version=through_version_of(end), rules=rules, on_commit=on_commit):
        if entry.key > end.key:
            break
        files.append(entry)
    return files
