"""The lake's owner lease and the engine's last batch, in one tiny Delta table (B8).

``<lake>/_engine_state`` holds exactly one row (:data:`~retry_engine.schemas.ENGINE_STATE`):
who owns the lake (host, pid, query id, since, last heartbeat, an epoch) and the
last micro-batch the lake records (query id, batch id, the consume_results
offset it read through, its data files per output table, and how many retries
are pending after it).

Every change is a compare-and-swap: the row is overwritten from the snapshot
that was checked, with a Delta app transaction ``(LEASE_APP_ID, epoch)``.
delta-rs refuses a commit whose snapshot is stale when another commit removed
the row it read or carries the same app id (``CommitFailedError``), on local
disks and on object stores with conditional writes alike. So a take-over
(which bumps the epoch) fences the old owner: its next batch record or
heartbeat finds the new epoch, or conflicts with it, and raises
:class:`~retry_engine.errors.LeaseLostError` instead of committing.

Spark-free: plain delta-rs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction

from retry_engine.core.names import FUTURE_EVENTS
from retry_engine.core.totals import Totals
from retry_engine.delta._files import WrittenFile
from retry_engine.delta._handles import Handle, keep, open_or_create
from retry_engine.delta.storage import (
    LOG_RETENTION,
    TABLE_PROPERTIES,
    create_delta,
    location,
    log_failure,
    open_delta,
    write_delta,
)
from retry_engine.delta.tables import (
    COMMIT_TOKEN_KEY,
    add_missing_properties,
    ensure_table,
    is_own_commit,
    table_arrow_schema,
    writers_clean_log,
)
from retry_engine.errors import EngineStateError, LakeOwnedError, LeaseLostError
from retry_engine.schemas import ENGINE_STATE

log = logging.getLogger(__name__)

STATE_DIR = "_engine_state"
LEASE_APP_ID = "retry-engine-lease"
DEFAULT_LEASE_TIMEOUT_MS = 60_000
# A CAS that lost to a commit which did not change the owner (e.g. our own earlier
# write seen through a stale handle) is retried this many times.
_CAS_ATTEMPTS = 5
# Every row change is a commit with one tiny file (heartbeats, batches): every this many
# versions the table gets a log checkpoint, expired log files are removed (its writers leave
# them, see storage.TABLE_PROPERTIES) and replaced files are vacuumed.
MAINTAIN_EVERY = 100
# Readers only ever need the latest row; an hour covers any reader still on an old snapshot.
VACUUM_RETENTION_HOURS = 1
# The table's properties: the engine tables', and its checkpoints keep a replaced row's remove two hours,
# not Delta's 7 days (every record and heartbeat replaces the row: a week of removes at a 1 s trigger,
# 600,000, made each checkpoint, written every 10 commits, 52 MB and 1.8 s). The vacuum (an hour)
# deletes a file while its remove is still held.
# Its log keeps two hours of commits, not Delta's 30 days: every commit lists the whole log on a local
# disk (a record each batch took 0.28 s at 150,000 entries, three weeks at a 1 s trigger), and only the
# latest row is ever read.
STATE_TABLE_PROPERTIES: Mapping[str, str] = {
    **TABLE_PROPERTIES,
    "delta.deletedFileRetentionDuration": "interval 2 hours",
    LOG_RETENTION: "interval 2 hours",
}


def state_path(lake: str) -> str:
    """Where the engine-state table of ``lake`` lives."""
    return os.path.join(lake, STATE_DIR) if "://" not in lake else f"{lake.rstrip('/')}/{STATE_DIR}"


@dataclass(frozen=True)
class Owner:
    """The engine that holds (or asks for) the lease."""

    host: str
    pid: int
    query_id: str
    checkpoint: str
    since: dt.datetime

    @classmethod
    def this_process(cls, *, query_id: str, checkpoint: str) -> Owner:
        return cls(process_space(), os.getpid(), query_id, checkpoint, dt.datetime.now(dt.UTC))

    def describe(self) -> str:
        return (
            f"host {self.host}, pid {self.pid}, query id {self.query_id}, checkpoint {self.checkpoint}, "
            f"since {self.since.isoformat(timespec='seconds')}"
        )


@dataclass(frozen=True)
class BatchRecord:
    """The last batch the lake records: committed first, then its output tables (roll-forward)."""

    query_id: str
    batch_id: int
    # The consume_results offset (deltars/Delta JSON) the batch read through; None if unknown.
    source_end: Mapping[str, Any] | None
    # Output table name -> the batch's files (``WrittenFile`` fields) in that table.
    files: Mapping[str, list[dict[str, Any]]]
    pending_retries: int
    # The lake's counts through this batch (None: recorded by a release that did not count them).
    totals: Totals | None = None
    # When the lake recorded it (the lease's clock; None: an earlier release's record). The batch ran
    # its schedule stage before: every retry due by its batch time, a batch's duration earlier, was
    # released (the ledger's row retention cuts at least a day before it).
    recorded_at: dt.datetime | None = field(default=None, compare=False)


@dataclass(frozen=True)
class EngineState:
    """The row of the engine-state table."""

    epoch: int
    owner: Owner | None
    heartbeat: dt.datetime | None
    released: bool
    last_batch: BatchRecord | None
    # When a new checkpoint last gave up the retries left waiting (`run --discard-pending`): a retry
    # decided before it and never released is no longer pending (None: never).
    discarded_before: dt.datetime | None = None

    def live(self, now: dt.datetime, timeout_ms: int) -> bool:
        """Whether the lease still binds others: held, not released, heartbeat within the timeout.

        A heartbeat dated more than :data:`~retry_engine.core.names.FUTURE_EVENTS` ahead of ``now``
        is no sign of life (a clock far ahead, or another writer): it would bind every other engine,
        a standby included, until its time.
        """
        if self.owner is None or self.released or self.heartbeat is None:
            return False
        if self.heartbeat_ahead(now):
            return False
        return (now - self.heartbeat) <= dt.timedelta(milliseconds=timeout_ms)

    def heartbeat_ahead(self, now: dt.datetime) -> bool:
        """Whether the heartbeat is dated further ahead of ``now`` than :meth:`live` believes."""
        return self.heartbeat is not None and self.heartbeat > now + FUTURE_EVENTS

    def to_arrow(self) -> pa.Table:
        owner, batch = self.owner, self.last_batch
        row = {
            "epoch": self.epoch,
            "owner_host": owner.host if owner else None,
            "owner_pid": owner.pid if owner else None,
            "owner_query_id": owner.query_id if owner else None,
            "owner_checkpoint": owner.checkpoint if owner else None,
            "since": owner.since if owner else None,
            "heartbeat": self.heartbeat,
            "released": self.released,
            "batch_query_id": batch.query_id if batch else None,
            "batch_id": batch.batch_id if batch else None,
            "source_end": json.dumps(dict(batch.source_end)) if batch and batch.source_end is not None else None,
            "batch_files": json.dumps(dict(batch.files)) if batch else None,
            "pending_retries": batch.pending_retries if batch else None,
            "totals": batch.totals.to_json() if batch and batch.totals is not None else None,
            "discarded_before": self.discarded_before,
            "batch_recorded_at": batch.recorded_at if batch else None,
        }
        return pa.Table.from_pylist([row], schema=ENGINE_STATE.arrow_schema)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> EngineState:
        """The state a row of the table holds; :class:`ValueError` naming what is wrong when it holds none
        (the engine writes every row, so another writer or a damaged file made it)."""
        owner = None
        if row["owner_query_id"] is not None:
            owner = Owner(
                _text(row, "owner_host"), _whole(row, "owner_pid"), _text(row, "owner_query_id"),
                _text(row, "owner_checkpoint"), _time(row, "since"),
            )
        batch = None
        if row["batch_query_id"] is not None:
            source_end = _json(row, "source_end", dict) if row["source_end"] is not None else None
            batch = BatchRecord(
                query_id=_text(row, "batch_query_id"),
                batch_id=_whole(row, "batch_id"),
                source_end=source_end,
                files=_batch_files(_json(row, "batch_files", dict) if row["batch_files"] is not None else {}),
                pending_retries=_whole(row, "pending_retries") if row["pending_retries"] is not None else 0,
                # Absent from a table written by an earlier release until its next start adds it.
                totals=Totals.from_json(row.get("totals")),
                recorded_at=row.get("batch_recorded_at"),
            )
        heartbeat = _time(row, "heartbeat") if row["heartbeat"] is not None else None
        return cls(_whole(row, "epoch"), owner, heartbeat, bool(row["released"]), batch, row.get("discarded_before"))


def _text(row: Mapping[str, Any], name: str) -> str:
    value = row[name]
    if not isinstance(value, str):
        raise ValueError(f"{name} is {value!r}, not text")
    return value


def _whole(row: Mapping[str, Any], name: str) -> int:
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} is {value!r}, not a whole number")
    return value


def _time(row: Mapping[str, Any], name: str) -> dt.datetime:
    value = row[name]
    if not isinstance(value, dt.datetime):
        raise ValueError(f"{name} is {value!r}, not a time")
    return value


def _json(row: Mapping[str, Any], name: str, kind: type) -> Any:
    try:
        value = json.loads(row[name])
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{name} is not JSON ({exc})") from None
    if not isinstance(value, kind):
        raise ValueError(f"{name} is JSON {type(value).__name__}, not {kind.__name__}")
    return value


def _batch_files(files: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """``batch_files``: table -> the batch's files, each with a ``path`` and the other fields of a
    ``WrittenFile`` (roll-forward commits them: :func:`written_files` checks they are all there)."""
    fields = {f.name for f in dataclasses.fields(WrittenFile)}
    for table, entries in files.items():
        if not isinstance(entries, list):
            raise ValueError(f"batch_files of {table!r} is {entries!r}, not a list of files")
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or set(entry) - fields:
                raise ValueError(f"batch_files of {table!r} holds {entry!r}, not a file ({', '.join(sorted(fields))})")
            for name, kind in (("stats", str), ("partition_values", dict)):
                if name in entry and not isinstance(entry[name], kind):
                    raise ValueError(f"batch_files of {table!r}: {name} {entry[name]!r} is not {kind.__name__}")
            for name in ("size", "modification_time", "num_records"):
                value = entry.get(name, 0)
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"batch_files of {table!r}: {name} {value!r} is not a count")
    return dict(files)


def written_files(table: str, entries: list[dict[str, Any]]) -> tuple[WrittenFile, ...]:
    """The recorded files of ``table`` a roll-forward commits; ENGINE_STATE_DAMAGED if one lacks a field."""
    fields = [f.name for f in dataclasses.fields(WrittenFile)]
    for entry in entries:
        missing = [name for name in fields if name not in entry]
        if missing:
            raise EngineStateError(
                f"the lake's last batch records a file of {table} without {', '.join(missing)} ({entry!r}): it "
                "cannot be committed. Restore the engine state's last good version and start again",
                code="ENGINE_STATE_DAMAGED",
            )
    return tuple(WrittenFile(**e) for e in entries)


def _load(path: str) -> tuple[DeltaTable | None, EngineState | None]:
    try:
        table = open_delta(path)
    except TableNotFoundError:
        return None, None
    return table, _row(table)


def _row(table: DeltaTable) -> EngineState | None:
    rows = table.to_pyarrow_table().to_pylist()
    if not rows:
        return None
    try:
        return EngineState.from_row(rows[0])
    except (ValueError, TypeError, KeyError) as exc:
        version = table.version()
        raise EngineStateError(
            f"the lake's engine state {table.table_uri} (version {version}) cannot be read: {exc}. It holds the "
            "lake's owner and its last batch, and only the engine writes it: another writer or a damaged file "
            "changed it. Restore its last good version (from Python: deltalake.DeltaTable("
            f"{table.table_uri!r}).restore({max(version - 1, 0)}), an earlier one if that fails too) and start "
            "again; without it no engine can tell where the lake's last batch ended",
            code="ENGINE_STATE_DAMAGED",
        ) from exc


def read_state(lake: str) -> EngineState | None:
    """The lake's engine state, or None if no engine has run on it yet."""
    return _load(state_path(lake))[1]


@functools.cache
def process_space() -> str:
    """Where this process's pid means something, as an owner records it: the host name and, on Linux,
    the boot and the pid namespace. Containers that share a host name but not their pids (host-network
    pods, ``--uts=host``) are not one process space: a live owner there looked gone (its pid missing
    here, or this very pid), and its lease was taken at once without ``--take-over``."""
    name = socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        return name
    return f"{name} ({namespace}, boot {boot[:8]})"


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# Liveness of the engines this process started, by (state path, query id): an owner
# in this very process is dead once its query stopped, whatever its heartbeat says.
_LOCAL_OWNERS: dict[tuple[str, str], Callable[[], bool]] = {}
_LOCAL_LOCK = threading.Lock()


def _abandoned(path: str, state: EngineState) -> bool:
    """The owner ran on this host and is gone (its process died, or its query in this process stopped)."""
    owner = state.owner
    if owner is None or owner.host != process_space():
        return False
    if owner.pid == os.getpid():
        with _LOCAL_LOCK:
            alive = _LOCAL_OWNERS.get((path, owner.query_id))
        return alive is None or not alive()
    return not _pid_running(owner.pid)


@dataclass
class LakeLease:
    """This engine's hold on a lake: acquire, heartbeat, record batches, release.

    Thread-safe: the heartbeat thread and the batch writer share one lease.
    """

    lake: str
    owner: Owner
    timeout_ms: int = DEFAULT_LEASE_TIMEOUT_MS
    clock: Callable[[], dt.datetime] = field(default=lambda: dt.datetime.now(dt.UTC))
    epoch: int | None = field(default=None, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def path(self) -> str:
        return state_path(self.lake)

    def acquire(self, *, take_over: bool = False) -> EngineState | None:
        """Take the lease (epoch + 1); return the state found before, for resuming.

        A live lease held by another engine is refused with
        :class:`LakeOwnedError` naming the owner, unless ``take_over``. A
        released or expired lease, or one whose owner process on this host is
        gone (or, in this process, whose query has stopped), is taken over
        without asking: a restart after a crash needs no flag.
        """
        with self._lock:
            for _ in range(_CAS_ATTEMPTS):
                handle, before = self._open()
                now = self.clock()
                holder = before.owner if before is not None else None
                if before is not None and holder is not None and not before.released and before.heartbeat_ahead(now):
                    log.warning(
                        "the lake %s's owner (%s) last beat at %s, more than %s ahead of this clock: taken as no "
                        "sign of life (a clock ahead, or another writer); this engine takes the lake over",
                        self.lake, holder.describe(), _iso(before.heartbeat), FUTURE_EVENTS,
                    )
                if (
                    before is not None
                    and holder is not None
                    and before.live(now, self.timeout_ms)
                    and not take_over
                    and not _abandoned(self.path, before)
                ):
                    keep(handle)
                    raise LakeOwnedError(
                        f"the lake {self.lake} is owned by another engine ({holder.describe()}, "
                        f"epoch {before.epoch}, last heartbeat {_iso(before.heartbeat)}); this engine "
                        f"(query id {self.owner.query_id}) will not start. Stop the other engine, wait "
                        f"{self.timeout_ms // 1000}s after its last heartbeat, or take over with "
                        "`retry-engine run --take-over` (the other engine's next commit is then refused and it stops)",
                        code="LAKE_OWNED",
                    )
                if not set(ENGINE_STATE.names) <= set(table_arrow_schema(handle.table).names):
                    # A table of an earlier release, now this engine's: the row it writes next has the
                    # release's new columns, so they are added first.
                    ensure_table(self.path, ENGINE_STATE.arrow_schema, add_missing=True)
                    continue
                epoch = (before.epoch if before is not None else 0) + 1
                after = EngineState(
                    epoch, self.owner, now, False, before.last_batch if before else None,
                    before.discarded_before if before else None,
                )
                if self._swap(handle, after, epoch):
                    self.epoch = epoch
                    if before is not None and before.owner is not None and before.owner.query_id != self.owner.query_id:
                        log.warning(
                            "took over the lake %s from %s (epoch %d -> %d)",
                            self.lake, before.owner.describe(), before.epoch, epoch,
                        )
                    log.info("lake %s: lease acquired, epoch %d, %s", self.lake, epoch, self.owner.describe())
                    # An engine-state table of an earlier release gets this release's properties.
                    add_missing_properties(self.path, properties=STATE_TABLE_PROPERTIES)
                    return before
        raise LeaseLostError(
            f"could not acquire the lease of {self.lake}: other engines kept committing", code="LEASE_CONTENDED"
        )

    def heartbeat(self) -> None:
        """Refresh the lease; :class:`LeaseLostError` if another engine took it over."""
        self._update(lambda s: replace(s, heartbeat=self.clock()), what="heartbeat")

    def record_batch(self, batch: BatchRecord, *, discarded_before: dt.datetime | None = None) -> bool:
        """Make ``batch`` the lake's last batch (and heartbeat); fenced like :meth:`heartbeat`.
        ``discarded_before``: also record that this engine gave up, then, the retries earlier
        checkpoints left waiting (:attr:`EngineState.discarded_before`), with its first batch.

        Replay: when the lake already records this query's batch ``batch.batch_id``
        or a later one, nothing is written and the answer is False (one read of
        the row either way).
        """

        ours = False

        def change(state: EngineState) -> EngineState | None:
            nonlocal ours
            last = state.last_batch
            if last is not None and last.query_id == batch.query_id and last.batch_id >= batch.batch_id:
                # This very record (its files' names are unique to the attempt; a record of none cannot
                # be told from a replay's): an earlier round of this call committed it, though delta-rs
                # reported a conflict (see _swap).
                ours = last.batch_id == batch.batch_id and any(batch.files.values()) and last.files == batch.files
                return None
            now = self.clock()
            marks = [m for m in (discarded_before, state.discarded_before) if m is not None]
            discarded = max(marks) if marks else None  # never moved back
            return replace(
                state, heartbeat=now, last_batch=replace(batch, recorded_at=now), discarded_before=discarded
            )

        return self._update(change, what=f"batch {batch.batch_id}") or ours

    def forget_totals(self) -> None:
        """Drop the last batch record's totals (:mod:`retry_engine.core.totals`); fenced like :meth:`heartbeat`.

        For an engine that commits without recording its batches (``table_format = "delta"``): its
        outcomes are in no record's totals, so a later engine that records counts the tables again.
        """

        def change(state: EngineState) -> EngineState | None:
            last = state.last_batch
            if last is None or last.totals is None:
                return None
            return replace(state, heartbeat=self.clock(), last_batch=replace(last, totals=None))

        self._update(change, what="forgetting the lake's totals")

    def release(self) -> None:
        """Give the lease up (graceful stop): the next engine starts without ``--take-over``.

        Storage that cannot be written (an outage: what may have failed the query) leaves
        the lease as a crash would, with a warning: an engine on this host takes it back at
        once, one elsewhere after ``lease_timeout``.
        """
        try:
            self._update(lambda s: replace(s, released=True, heartbeat=self.clock()), what="release")
            log.info("lake %s: lease released (epoch %s)", self.lake, self.epoch)
        except LeaseLostError as exc:
            log.info("lake %s: nothing to release: %s", self.lake, exc)
        except OSError as exc:
            log.warning(
                "lake %s: could not release the lease (%s); an engine on this host takes it back at once, "
                "one on another host after %d s", self.lake, exc, self.timeout_ms // 1000,
            )

    # ------------------------------------------------------------------ internals

    def _open(self) -> tuple[Handle, EngineState | None]:
        """The table at its latest version and its row. The handle is the one this process's last
        change or read of the table left when the table is still the same (kept between batches:
        on object storage a fresh open reads the last checkpoint and every commit since, each
        micro-batch), else a fresh one; whoever takes it gives it back with ``keep`` once it is
        known good, never after a failed commit."""
        handle = open_or_create(
            location(self.path),
            lambda: create_delta(
                self.path, ENGINE_STATE.arrow_schema, mode="ignore", configuration=dict(STATE_TABLE_PROPERTIES)
            ),
        )
        return handle, _row(handle.table)

    def _owned(self, state: EngineState | None, *, what: str) -> EngineState:
        if self.epoch is None:
            raise LeaseLostError(f"{what}: this engine never acquired the lease of {self.lake}", code="LEASE_LOST")
        if state is None or state.epoch != self.epoch or state.owner is None or state.owner.query_id != self.owner.query_id:
            holder = state.owner.describe() if state is not None and state.owner is not None else "nobody"
            raise LeaseLostError(
                f"{what} refused: this engine (query id {self.owner.query_id}, epoch {self.epoch}) no longer owns "
                f"the lake {self.lake}; it was taken over by {holder} (epoch {state.epoch if state else '?'}). "
                "This engine stops without committing; nothing it had not committed is written",
                code="LEASE_LOST",
            )
        if state.released:
            raise LeaseLostError(f"{what} refused: this engine released the lease of {self.lake}", code="LEASE_LOST")
        return state

    def _update(self, change: Callable[[EngineState], EngineState | None], *, what: str) -> bool:
        """Compare-and-swap the row through ``change``; False if ``change`` wanted no write."""
        with self._lock:
            for _ in range(_CAS_ATTEMPTS):
                handle, state = self._open()
                current = self._owned(state, what=what)
                wanted = change(current)
                if wanted is None:
                    keep(handle)
                    return False
                if self._swap(handle, wanted, current.epoch):
                    return True
            raise LeaseLostError(f"{what}: the lease of {self.lake} kept changing under this engine", code="LEASE_LOST")

    def _swap(self, handle: Handle, state: EngineState, epoch: int) -> bool:
        """Overwrite the row from ``handle``'s snapshot; False if another commit got there first.

        delta-rs can raise for a commit that landed: its post-commit checkpoint (every 10th
        version of this table) failed on a storage error, or on object storage a retried put met
        its own first attempt. The commit's token tells: then the row is written (True), and a
        batch's record must not be taken for one that failed (its files would be deleted).
        """
        table = handle.table
        version = table.version() + 1
        token = uuid.uuid4().hex
        try:
            write_delta(
                table,
                state.to_arrow(),
                mode="overwrite",
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(LEASE_APP_ID, epoch)], custom_metadata={COMMIT_TOKEN_KEY: token}
                ),
            )
        except Exception as exc:
            if is_own_commit(self.path, version, token):
                log.warning(
                    "lake %s: engine-state version %d is committed, but delta-rs failed after the commit: %s",
                    self.lake, version, exc,
                )
                return True  # the handle is not kept: the next change reads the table anew
            if isinstance(exc, CommitFailedError):
                log.info("lake %s: engine-state commit conflicted (%s); re-reading", self.lake, exc)
                return False
            raise
        keep(handle)
        # The write moved ``table`` to its commit (the overwrite conflicts with any commit since the
        # snapshot, so it landed right after it).
        if (table.version() + 1) % MAINTAIN_EVERY == 0:
            self._maintain()
        return True

    def _maintain(self) -> None:
        table = open_delta(self.path)
        try:
            table.create_checkpoint()
            if not writers_clean_log(table):
                # This table's writers (this lease) leave expired log files to the one who maintains it.
                table.cleanup_metadata()
            table.vacuum(retention_hours=VACUUM_RETENTION_HOURS, enforce_retention_duration=False, dry_run=False)
        except Exception as exc:  # housekeeping only: the row is committed; the next round retries
            log_failure(log, f"lake {self.lake}: engine-state maintenance failed, the next round retries", exc)


def _iso(value: dt.datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "never"


class Heartbeat:
    """A daemon thread that heartbeats ``lease`` every ``interval_s`` while ``alive()`` is true.

    When ``alive()`` turns false it releases the lease; when the lease is lost it
    calls ``on_lost`` (the engine stops its query) and ends.
    """

    def __init__(
        self, lease: LakeLease, *, interval_s: float, alive: Callable[[], bool], on_lost: Callable[[LeaseLostError], None]
    ) -> None:
        self._lease, self._interval, self._alive, self._on_lost = lease, interval_s, alive, on_lost
        # Set when a heartbeat found the lease taken over.
        self.lost: LeaseLostError | None = None
        # Set once this thread released the lease (the query stopped without engine.stop()).
        self.released = False
        # Set by hold(): a stop is under way (see there).
        self._held = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retry-engine-lease", daemon=True)

    def start(self) -> None:
        with _LOCAL_LOCK:
            _LOCAL_OWNERS[(self._lease.path, self._lease.owner.query_id)] = self.owning
        self._thread.start()

    def owning(self) -> bool:
        """Whether this engine still holds its lake: its query runs, or its stop is under way (:meth:`hold`)."""
        return self._held.is_set() or self._living()

    def hold(self) -> None:
        """Keep heartbeating, whatever ``alive()`` says, until :meth:`stop`: the engine's stop is under way.

        Spark marks a stopping query inactive at once and then waits for its running batch, whose
        commits may take minutes on a slow store: released then, the lease let a standby take the
        lake while this owner still committed, unfenced. The stop releases it once the query ended.
        """
        self._held.set()

    def stop(self) -> None:
        self._stop.set()
        with _LOCAL_LOCK:
            _LOCAL_OWNERS.pop((self._lease.path, self._lease.owner.query_id), None)
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=self._interval + 30)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if not self.owning():
                # The query stopped without engine.stop() (failure, or query.stop()).
                self._lease.release()
                self.released = True
                return
            try:
                self._lease.heartbeat()
            except LeaseLostError as exc:
                log.error("%s", exc)
                self.lost = exc
                self._on_lost(exc)
                return
            except Exception as exc:  # the next beat retries; expiry is the backstop
                log_failure(log, f"lake {self._lease.lake}: heartbeat failed, the next one retries", exc)

    def _living(self) -> bool:
        """``alive()``; False when it cannot be asked (the Spark driver's JVM is gone: its query is too)."""
        try:
            return bool(self._alive())
        except Exception as exc:
            log.warning("lake %s: the engine's query cannot be asked whether it runs (%s); it is taken for stopped",
                        self._lease.lake, exc)
            return False


__all__ = [
    "DEFAULT_LEASE_TIMEOUT_MS",
    "LEASE_APP_ID",
    "BatchRecord",
    "EngineState",
    "Heartbeat",
    "LakeLease",
    "Owner",
    "read_state",
    "state_path",
]
