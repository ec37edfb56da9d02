"""Where an engine's stream starts, given the lake's last batch and the checkpoint (B8).

The lake, not the checkpoint, is the source of truth. Its engine-state row
(:mod:`retry_engine.core.lease`) records the consume_results offset the last
committed batch read through. A checkpoint that has planned no batch yet
("fresh") starts right after that offset: ``startingVersion`` at its version
and, when the batch ended inside a commit (``maxFilesPerTrigger``), a
position floor that drops the rows of that commit's files already read
(positions sort in stream order). The decision is stored in the checkpoint
(:data:`RESUME_FILE`), so every later run of that checkpoint, including a
replay of its batch 0, applies the same floor. It is written aside and renamed,
and a file that is not one the engine wrote is refused (``RESUME_FILE_INVALID``)
rather than ignored: without its floor a replay decides those rows again.

Spark-free.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Final

import pyarrow.fs as pafs

from retry_engine.core.lease import BatchRecord, EngineState
from retry_engine.delta._checkpoint import checkpoint_filesystem, write_bytes_atomically
from retry_engine.delta._files import position_prefix
from retry_engine.delta._offsets import Offset
from retry_engine.errors import LakeResumeError

log = logging.getLogger(__name__)

RESUME_FILE = "retry_engine_resume.json"
OFFSETS_DIR = "offsets"
# What the engine writes is about 150 bytes; a longer file is no resume point.
_MAX_TEXT: Final = 4_096
_MAX_VERSION: Final = 2**63 - 1
# The floor :func:`plan` writes: position_prefix(startingVersion, file index, False).
_FLOOR: Final = re.compile(r"v([0-9]{20})/[0-9]{6,}/")
_RESUME_FILE_SHAPE: Final = (
    '{"startingVersion": <a commit version, a whole number 0..2^63-1>, "positionFloor": <null, or '
    '"v<startingVersion as 20 digits>/<file index, 6 or more digits>/">, "afterBatch": "<query id>/<batch id>"}'
)


@dataclass(frozen=True)
class ResumePoint:
    """Start the source at commit ``starting_version``; keep rows whose position is >= ``position_floor``."""

    starting_version: int
    position_floor: str | None
    # The batch this resumes after, for logs: "<query id>/<batch id>".
    after_batch: str

    def to_json(self) -> dict[str, Any]:
        return {"startingVersion": self.starting_version, "positionFloor": self.position_floor, "afterBatch": self.after_batch}

    @classmethod
    def from_json(cls, data: object) -> ResumePoint:
        """The point :meth:`to_json` wrote; :class:`ValueError` for anything else (each field checked, no
        conversion: a damaged file must not move where the stream starts)."""
        if not isinstance(data, dict):
            raise ValueError(f"not a JSON object: {type(data).__name__}")
        missing = [k for k in ("startingVersion", "positionFloor", "afterBatch") if k not in data]
        if missing:
            raise ValueError(f"no {', '.join(missing)}")
        version, floor, after = data["startingVersion"], data["positionFloor"], data["afterBatch"]
        if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= _MAX_VERSION:
            raise ValueError(f"startingVersion {version!r} is no commit version")
        if floor is not None:
            matched = _FLOOR.fullmatch(floor) if isinstance(floor, str) else None
            if matched is None or int(matched.group(1)) != version:
                raise ValueError(f"positionFloor {floor!r} is no position of commit {version}")
        if not isinstance(after, str) or not after:
            raise ValueError(f"afterBatch {after!r} is no batch")
        return cls(version, floor, after)


def is_fresh(checkpoint: str) -> bool:
    """True if Spark has planned no batch in ``checkpoint`` (no offset log yet)."""
    return last_planned(checkpoint) is None


def last_planned(checkpoint: str) -> int | None:
    """The id of the last batch Spark planned in ``checkpoint`` (its newest ``offsets`` file), None if none."""
    return _newest(checkpoint, OFFSETS_DIR)


def _newest(checkpoint: str, log_dir: str) -> int | None:
    """The newest batch id of Spark's ``log_dir`` log (``offsets``, ``commits``) in ``checkpoint``, None if none."""
    fs, root = checkpoint_filesystem(checkpoint)
    info = fs.get_file_info(pafs.FileSelector(f"{root}/{log_dir}", allow_not_found=True))
    return max((int(i.base_name) for i in info if i.type == pafs.FileType.File and i.base_name.isdigit()), default=None)


def planned_end(checkpoint: str, batch_id: int) -> dict[str, Any] | None:
    """The source end offset Spark logged for ``batch_id`` (``offsets/<batch_id>``), if any (the
    engine has one source)."""
    ends = planned_ends(checkpoint, batch_id)
    return ends[0] if ends else None


def planned_ends(checkpoint: str, batch_id: int) -> list[dict[str, Any] | None]:
    """The end offset of each source Spark logged for ``batch_id`` (``offsets/<batch_id>``), in its
    order; None for a source without one (or a line that is no JSON object); [] without the file.

    The file is ``v1``, the batch metadata, then one offset per source.
    """
    fs, root = checkpoint_filesystem(checkpoint)
    try:
        with fs.open_input_stream(f"{root}/{OFFSETS_DIR}/{batch_id}") as stream:
            lines = stream.read().decode("utf-8").split("\n")
    except FileNotFoundError:
        return []
    ends: list[dict[str, Any] | None] = []
    for line in lines[2:]:
        try:
            offset = json.loads(line) if line not in ("", "-") else None
        except ValueError:
            offset = None
        ends.append(offset if isinstance(offset, dict) else None)
    return ends


def stored(checkpoint: str) -> ResumePoint | None:
    """The resume point this checkpoint started from, if it started after another's batch.

    A file that is not one :func:`store` wrote (damaged, truncated, edited) is refused with
    :class:`LakeResumeError` ``RESUME_FILE_INVALID``: without its floor a replayed batch would
    decide again the consume results the previous checkpoint decided.
    """
    fs, root = checkpoint_filesystem(checkpoint)
    path = f"{root}/{RESUME_FILE}"
    try:
        with fs.open_input_stream(path) as stream:
            raw = stream.read(_MAX_TEXT + 1)
    except FileNotFoundError:
        return None
    try:
        if len(raw) > _MAX_TEXT:
            raise ValueError(f"longer than {_MAX_TEXT} bytes")
        # UnicodeDecodeError and JSONDecodeError are ValueErrors; deeply nested arrays, RecursionError.
        return ResumePoint.from_json(json.loads(raw.decode("utf-8")))
    except (ValueError, RecursionError) as exc:
        raise LakeResumeError(
            f"{path} holds {raw[:200]!r} ({exc}); expected {_RESUME_FILE_SHAPE}. It says where this checkpoint's "
            "stream started after another checkpoint's last batch, so that a replayed batch does not decide those "
            "consume results again: restore it from a backup of the checkpoint, or start with a new (empty) "
            "engine.checkpoint, which resumes after the lake's last batch",
            code="RESUME_FILE_INVALID",
        ) from exc


def store(checkpoint: str, point: ResumePoint) -> None:
    """Record ``point`` in ``checkpoint``: written aside and renamed over the file, so a start killed or
    failing mid-write leaves the file whole or absent, never a part that stops every later start."""
    fs, root = checkpoint_filesystem(checkpoint)
    write_bytes_atomically(fs, f"{root}/{RESUME_FILE}", (json.dumps(point.to_json()) + "\n").encode("utf-8"))


def plan(
    state: EngineState | None,
    *,
    query_id: str,
    checkpoint: str,
    fresh: bool,
    source_table_id: str | None,
    discard_pending: bool = False,
    pending_in_lake: int | None = None,
) -> ResumePoint | None:
    """Where a checkpoint's stream must start so no consume result is decided twice or skipped.

    None: Spark's own rule (a checkpoint continues from its offset log; a
    fresh one on a lake without recorded batches reads the whole table).
    Raises :class:`LakeResumeError` when starting would duplicate or lose:
    an old checkpoint behind the lake, pending retries only the previous
    checkpoint holds (unless ``discard_pending``), or a previous batch that
    ended inside the initial snapshot. ``pending_in_lake``: the retries the
    lake's tables show as decided but not released (default: the last
    batch's own count).
    """
    batch = state.last_batch if state is not None else None
    if batch is None:
        return None
    where = f"{batch.query_id}/{batch.batch_id}"
    if batch.query_id == query_id:
        _check_wrote(checkpoint, batch)
        return None
    # The checkpoint that wrote the batch, when the lease still names it.
    holder = (
        state.owner.checkpoint
        if state is not None and state.owner is not None and state.owner.query_id == batch.query_id
        else f"of query id {batch.query_id}"
    )
    if not fresh:
        started = stored(checkpoint)
        if started is not None and started.after_batch == where:
            # This checkpoint started after that very batch and has recorded none since: its batches
            # read nothing (an idle run), or it stopped before recording its first one.
            return None
        raise LakeResumeError(
            f"the lake's last batch ({where}, from checkpoint {holder}) was written by another checkpoint than "
            f"{checkpoint} (query id {query_id}); running this older checkpoint would decide those consume results "
            f"again. Run with the checkpoint {holder}, or with a new (empty) checkpoint, which resumes after the lake",
            code="LAKE_AHEAD_OF_CHECKPOINT",
        )
    pending = batch.pending_retries if pending_in_lake is None else pending_in_lake
    if state is not None and state.discarded_before is not None:
        # Since a discard, records count only what their checkpoints hold (they started at 0), and the
        # tables may miss one decided on a clock behind the discard's mark: the larger count holds.
        pending = max(pending, batch.pending_retries)
    if pending > 0 and not discard_pending:
        raise LakeResumeError(
            f"{pending} retries are pending in the schedule stage of checkpoint {holder} (query id "
            f"{batch.query_id}); a new checkpoint {checkpoint} cannot release them. Run with the checkpoint {holder}, "
            "or pass `retry-engine run --discard-pending` to start anyway (those retries are then never delivered)",
            code="LAKE_PENDING_RETRIES",
        )
    end = batch.source_end
    if end is None:
        raise LakeResumeError(
            f"the lake's last batch {where} does not record its consume_results offset; run with checkpoint {holder}",
            code="LAKE_RESUME_UNKNOWN",
        )
    # A row in the lake, so anything: Offset.from_json refuses what is no deltars offset (DELTA_OFFSET_INVALID).
    offset = Offset.from_json(end)
    recorded_table = offset.reservoir_id
    if recorded_table is not None and source_table_id is not None and recorded_table != source_table_id:
        log.warning(
            "consume_results is now table %s, the lake's last batch %s read table %s: it was re-created; "
            "reading the new table from its beginning",
            source_table_id, where, recorded_table,
        )
        return None
    version, index = offset.version, offset.index
    if offset.is_starting_version:
        raise LakeResumeError(
            f"the lake's last batch {where} ended inside the initial snapshot of consume_results version {version} "
            f"(file {index}); a new checkpoint can only resume at a commit. Run with checkpoint {holder} until it has "
            "read the snapshot",
            code="LAKE_RESUME_MID_SNAPSHOT",
        )
    floor = position_prefix(version, index + 1, False) if index >= 0 else None
    point = ResumePoint(version, floor, where)
    log.info("new checkpoint %s resumes after the lake's last batch %s: %s", checkpoint, where, point.to_json())
    return point


# The settings a batch was decided with, as this checkpoint's last start stored them (see check_replay).
DECISIONS_FILE = "retry_engine_decisions.json"
COMMITS_DIR = "commits"


def spark_committed(checkpoint: str, batch_id: int) -> bool:
    """Whether Spark committed ``batch_id`` in ``checkpoint`` (else its next start replays it): its commit
    log holds that batch or a later one. Not the batch's own file: Spark keeps only the last 100, and an
    idle engine commits a batch every trigger (its timeouts), so an old one's file is soon gone."""
    newest = _newest(checkpoint, COMMITS_DIR)
    return newest is not None and newest >= batch_id


def check_replay(checkpoint: str, state: EngineState | None, *, query_id: str, settings: dict[str, Any]) -> None:
    """Refuse a start whose replay of a recorded batch would decide it with other settings than it had.

    A batch the lake records but Spark never committed (a crash, a stop that abandoned it) is replayed
    from the state before it; its outputs are dropped (the lake's record, rolled forward, stands), but
    the state it leaves is the replay's. Decided with other groups or delays, that state holds retries
    the record does not (released twice) or lacks the ones it does (never released). ``settings`` (what
    decides: :func:`~retry_engine.config.EngineConfig.decision_settings`) are stored in the checkpoint
    at every start that has no such replay to make, and compared at one that has
    (``REPLAY_SETTINGS_CHANGED``, naming what changed). A checkpoint of an earlier release has none
    stored: not checked.
    """
    last = state.last_batch if state is not None else None
    pending = last is not None and last.query_id == query_id and not spark_committed(checkpoint, last.batch_id)
    fs, root = checkpoint_filesystem(checkpoint)
    path = f"{root}/{DECISIONS_FILE}"
    text = json.dumps(settings, sort_keys=True)
    if not pending:
        write_bytes_atomically(fs, path, (text + "\n").encode("utf-8"))
        return
    try:
        with fs.open_input_stream(path) as stream:
            stored = json.loads(stream.read().decode("utf-8"))
    except FileNotFoundError:
        return
    except (ValueError, RecursionError) as exc:
        log.warning("%s is not the settings a start stored (%s); batch %s is replayed unchecked", path, exc, last)
        return
    current = json.loads(text)
    was, now = _flat(stored), _flat(current)
    # A setting one side lacks is a release's new (or dropped) one, not the operator's change; a group
    # one side lacks was added or removed, which is one.
    groups = [stored.get("groups") if isinstance(stored, dict) else None, current["groups"]]
    added_or_removed = set(groups[0] or {}) ^ set(groups[1]) if isinstance(groups[0], dict) else set()
    changed = sorted(
        [k for k in now.keys() & was.keys() if was[k] != now[k]] + [f"groups.{g}" for g in added_or_removed]
    )
    if not changed:
        return
    assert last is not None  # pending says so; not an input check
    raise LakeResumeError(
        f"batch {last.batch_id} of checkpoint {checkpoint} is recorded in the lake but Spark did not commit it, so "
        f"this start replays it, and its replay must decide as it did; the settings that decide changed since "
        f"({', '.join(changed)} in {path}). Start once with the previous configuration "
        "(`retry-engine run --once` finishes the batch), then with the new one",
        code="REPLAY_SETTINGS_CHANGED",
    )


def _flat(value: object, prefix: str = "") -> dict[str, object]:
    """Nested settings as ``a.b.c`` -> value (to name what changed)."""
    if not isinstance(value, dict):
        return {prefix or "settings": value}
    flat: dict[str, object] = {}
    for key, item in value.items():
        flat.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _check_wrote(checkpoint: str, batch: BatchRecord) -> None:
    """Refuse ``checkpoint`` (whose query id wrote ``batch``) when it cannot be the one that wrote it:
    a copy restored from an older backup, or one whose offset log was deleted. Spark would plan batch
    ids the lake already records (their output dropped as replays: the rows lost) or read from the
    start (every row decided again). Batches after the recorded one read nothing (a batch with input
    is recorded), so an offset Spark purged (it keeps the last 100) is not needed."""
    planned = last_planned(checkpoint)
    behind = planned is None or planned < batch.batch_id
    end = None if behind else planned_end(checkpoint, batch.batch_id)
    if not behind and (end is None or batch.source_end is None or end == batch.source_end):
        return
    has = "no batch" if planned is None else f"batches up to {planned}" if behind else f"batch {batch.batch_id} ending at {end}"
    raise LakeResumeError(
        f"the lake's last batch {batch.query_id}/{batch.batch_id} (read through {batch.source_end}) was written by "
        f"this checkpoint's query, but {checkpoint} has planned {has}: it is not the checkpoint that wrote the lake "
        "(restored from an older backup, or its offsets deleted), and running it would skip or decide again consume "
        "results the lake holds. Restore the checkpoint as it was, or start with a new (empty) engine.checkpoint, "
        "which resumes after the lake's last batch (with --discard-pending if it reports retries pending)",
        code="LAKE_AHEAD_OF_CHECKPOINT",
    )


__all__ = [
    "DECISIONS_FILE",
    "RESUME_FILE",
    "ResumePoint",
    "check_replay",
    "is_fresh",
    "last_planned",
    "plan",
    "planned_end",
    "planned_ends",
    "spark_committed",
    "store",
    "stored",
]
